/* Tiny assertion helpers for the shim's C tests: report every failed check, exit 1 at the end. */
#ifndef FH_PRELOAD_CHECK_H
#define FH_PRELOAD_CHECK_H
#include <stdio.h>

static int check_failures;
#define CHECK(cond, ...)                                                                     \
    do {                                                                                     \
        if (!(cond)) {                                                                       \
            check_failures++;                                                                \
            fprintf(stderr, "FAILED %s:%d: %s: ", __FILE__, __LINE__, #cond);                \
            fprintf(stderr, __VA_ARGS__);                                                    \
            fprintf(stderr, "\n");                                                           \
        }                                                                                    \
    } while (0)
#endif
