/* Tiny helpers shared by the C tests: checks that print where they failed, a cache factory, and
 * readers for process state the tests assert on. Header-only so a test is one .c file.
 *
 * Exit codes: 0 pass, 1 fail, 77 skip (ctest SKIP_RETURN_CODE). */
#ifndef FH_TEST_H
#define FH_TEST_H

#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fh_check.h"
#include "fh_rand.h"
#include "firehose.h"

#define FH_SKIP 77

/* ASan replaces malloc (quarantine: freed addresses are not reused at once) and turns mlock into a
 * no-op, so tests that depend on either check this. */
#if defined(__SANITIZE_ADDRESS__)
#define FH_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define FH_TEST_ASAN 1
#endif
#endif
#ifndef FH_TEST_ASAN
#define FH_TEST_ASAN 0
#endif

/* `call` must return `want` (an fh_status). */
#define CHECK_STATUS(call, want)                                                             \
    do {                                                                                     \
        fh_status got_ = (call);                                                             \
        if (got_ != (want)) {                                                                \
            fprintf(stderr, "%s:%d: %s returned %d (%s), expected %d (%s)\n", __FILE__,      \
                    __LINE__, #call, (int)got_, fh_status_str((int)got_), (int)(want),       \
                    fh_status_str((int)(want)));                                             \
            exit(1);                                                                         \
        }                                                                                    \
    } while (0)

#define CHECK_OK(call) CHECK_STATUS(call, FH_OK)

#define CHECK_EQ_U64(a, b)                                                                   \
    do {                                                                                     \
        uint64_t a_ = (uint64_t)(a), b_ = (uint64_t)(b);                                     \
        if (a_ != b_) {                                                                      \
            fprintf(stderr, "%s:%d: %s == %llu, expected %s == %llu\n", __FILE__, __LINE__,  \
                    #a, (unsigned long long)a_, #b, (unsigned long long)b_);                 \
            exit(1);                                                                         \
        }                                                                                    \
    } while (0)

static inline fh_stats fh_test_stats(const fh_cache *c) {
    fh_stats s;
    CHECK_OK(fh_get_stats(c, &s));
    return s;
}

/* A cache on the mlock backend with the given limits and FH_MONITOR_* bits. */
static inline fh_cache *fh_test_cache(size_t max_pinned, size_t max_regions, uint32_t monitor) {
    fh_config cfg;
    CHECK_OK(fh_config_init(&cfg));
    cfg.backend = FH_BACKEND_MLOCK;
    cfg.max_pinned = max_pinned;
    cfg.max_regions = max_regions;
    cfg.monitor = monitor;
    fh_cache *c = NULL;
    CHECK_OK(fh_cache_new(&cfg, &c));
    CHECK(c != NULL);
    return c;
}

static inline size_t fh_test_page(void) { return (size_t)sysconf(_SC_PAGESIZE); }

/* `n` fresh, page-aligned, touched bytes from mmap (so the test controls the address space). */
static inline void *fh_test_map(size_t n) {
    void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(p != MAP_FAILED);
    memset(p, 0x5a, n);
    return p;
}

/* The field `name` ("VmLck", "VmRSS"...: a "name: N kB" line) of /proc/self/status in KiB, or -1. */
static inline long fh_test_status_kib(const char *name) {
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return -1;
    char line[256];
    size_t n = strlen(name);
    long kib = -1;
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, name, n) == 0 && line[n] == ':' && sscanf(line + n + 1, "%ld", &kib) == 1)
            break;
    }
    fclose(f);
    return kib;
}

/* Calls `f(ctx, head, value)` for each mapping of /proc/self/smaps that overlaps [a, a + len)
 * and has a line starting with `field` (e.g. "VmFlags:", "AnonHugePages:"): `head` is the
 * mapping's first line (range, perms, ..., no newline), `value` the rest of that field's line.
 * Returns -1 if smaps cannot be read, else the number of such mappings. */
static inline int fh_test_smaps_field(const void *a, size_t len, const char *field,
                                      void (*f)(void *ctx, const char *head, const char *value),
                                      void *ctx) {
    FILE *fp = fopen("/proc/self/smaps", "r");
    if (!fp) return -1;
    uintptr_t lo = (uintptr_t)a, hi = lo + len;
    size_t flen = strlen(field);
    char line[512], head[512] = "";
    int in = 0, n = 0;
    while (fgets(line, sizeof line, fp)) {
        unsigned long s, e;
        if (sscanf(line, "%lx-%lx ", &s, &e) == 2) { /* no field line reads as "hex-hex " */
            in = s < hi && e > lo;
            if (in) {
                snprintf(head, sizeof head, "%s", line);
                head[strcspn(head, "\n")] = 0;
            }
        } else if (in && strncmp(line, field, flen) == 0) {
            f(ctx, head, line + flen);
            n++;
        }
    }
    fclose(fp);
    return n;
}

static inline void fh_test_smaps_add_kib(void *ctx, const char *head, const char *value) {
    (void)head;
    long kib;
    if (sscanf(value, " %ld kB", &kib) == 1) *(long *)ctx += kib;
}

/* Sum of a "<field> N kB" line of smaps (e.g. "AnonHugePages:") over the mappings that overlap
 * [a, a + len); -1 if smaps cannot be read or no mapping overlaps. */
static inline long fh_test_smaps_kib(const void *a, size_t len, const char *field) {
    long sum = 0;
    return fh_test_smaps_field(a, len, field, fh_test_smaps_add_kib, &sum) > 0 ? sum : -1;
}

/* Locked memory of this process in KiB (VmLck), or -1. */
static inline long fh_test_vmlck_kib(void) { return fh_test_status_kib("VmLck"); }

/* True when transparent huge pages are off ("[never]") or the setting cannot be read. */
static inline int fh_test_thp_never(void) {
    FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
    if (!f) return 1;
    char buf[128] = "";
    char *got = fgets(buf, sizeof buf, f);
    fclose(f);
    return !got || strstr(buf, "[never]") != NULL;
}

/* Prints a FAIL line, and appends it to $FH_TEST_FAIL_LOG when set: mpirun can kill the job
 * before it has forwarded the failing rank's last stderr line, and the break check must see it. */
static inline void fh_test_report_fail(const char *line) {
    fputs(line, stderr);
    const char *path = getenv("FH_TEST_FAIL_LOG");
    FILE *f = path && *path ? fopen(path, "a") : NULL;
    if (f) {
        fputs(line, f);
        fclose(f);
    }
}

#endif /* FH_TEST_H */
