/* The C tests' checks, in one header with one behaviour each:
 *   CHECK(cond)            stop at the first failure: print where, exit 1 (the library tests);
 *   EXPECT(cond, fmt, ...) report a failure with a message and go on, counting it in
 *                          check_failures; the test exits 1 at its end when any failed (the
 *                          shim's tests, which report every failed check of a run). */
#ifndef FH_CHECK_H
#define FH_CHECK_H

#include <stdio.h>
#include <stdlib.h>

#define CHECK(cond)                                                                          \
    do {                                                                                     \
        if (!(cond)) {                                                                       \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);         \
            exit(1);                                                                         \
        }                                                                                    \
    } while (0)

static int check_failures __attribute__((unused));
#define EXPECT(cond, ...)                                                                    \
    do {                                                                                     \
        if (!(cond)) {                                                                       \
            check_failures++;                                                                \
            fprintf(stderr, "FAILED %s:%d: %s: ", __FILE__, __LINE__, #cond);                \
            fprintf(stderr, __VA_ARGS__);                                                    \
            fprintf(stderr, "\n");                                                           \
        }                                                                                    \
    } while (0)

#endif
