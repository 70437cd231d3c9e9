/* Helpers for the native "cases that broke real caches" tests (c-tests/case*.c, mlock backend;
 * FH_CASE_BACKEND=verbs switches case_cache() to the verbs backend).
 *
 * The caches here take their monitor bits from the environment (fh_config_init reads FH_MONITOR,
 * default: patch + userfaultfd), so one binary can be run with a path turned off to prove that
 * path matters, e.g. FH_MONITOR=none, or FH_TEST_DISABLE_HOOKS=munmap,madvise (see
 * src/monitor/switches.rs). The main pattern, for every way memory can go away:
 *
 *     fh_mr held;
 *     uint64_t inv0 = case_prime(c, buf, len, &held);   // cached idle + one holder
 *     ... the unmap path under test, then map the same addresses again ...
 *     case_expect_miss(c, "what", buf, len, &held, inv0); // miss, new key, old handle still OK
 */
#ifndef FH_CASE_UTIL_H
#define FH_CASE_UTIL_H

#include "fh_test.h" /* first: it defines _GNU_SOURCE */

#include <errno.h>
#include <signal.h>

/* Under AddressSanitizer the allocator is ASan's (mallopt does nothing) and ASan's munmap/mremap
 * interceptors enter the kernel with raw system calls, so libc's entry points -- where the
 * synchronous hooks sit -- are never reached; only the asynchronous userfaultfd path sees those
 * unmaps. Tests that assert glibc allocator behaviour or synchronous invalidation skip (77) in
 * the sanitizer build, saying why; they run in the plain build. */
#if defined(__SANITIZE_ADDRESS__)
#define FH_CASE_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define FH_CASE_ASAN 1
#endif
#endif
static inline void case_skip_under_asan(const char *why) {
#ifdef FH_CASE_ASAN
    printf("SKIP: AddressSanitizer build: %s\n", why);
    exit(77);
#else
    (void)why;
#endif
}

/* A cache on the mlock backend, or on the verbs backend (first device, private PD) if
 * FH_CASE_BACKEND=verbs: the counter-based checks of these tests then run against real ibv_reg_mr
 * in the Soft-RoCE VM (tests/verbs-suite.d/31-ctest-native-on-verbs.sh). A variable of its own,
 * because ctest pins FH_BACKEND=mlock for native tests. Without a device that skips (77). Monitor
 * bits from the environment (default: every path). */
static inline fh_cache *case_cache(size_t max_pinned, size_t max_regions) {
    fh_config cfg;
    CHECK_OK(fh_config_init(&cfg));
    const char *want = getenv("FH_CASE_BACKEND");
    cfg.backend = FH_BACKEND_MLOCK;
    if (want && strcmp(want, "verbs") == 0) {
        cfg.backend = FH_BACKEND_VERBS;
    } else if (want && *want && strcmp(want, "mlock") != 0) {
        fprintf(stderr, "FH_CASE_BACKEND=%s: expected mlock or verbs\n", want);
        exit(1);
    }
    cfg.max_pinned = max_pinned;
    cfg.max_regions = max_regions;
    fh_cache *c = NULL;
    fh_status rc = fh_cache_new(&cfg, &c);
    if (rc == FH_ERR_NO_DEVICE && cfg.backend == FH_BACKEND_VERBS) {
        printf("SKIP: FH_CASE_BACKEND=verbs but no RDMA device can be opened\n");
        exit(77);
    }
    CHECK_OK(rc);
    if (cfg.backend == FH_BACKEND_VERBS) printf("  (case_cache: verbs backend)\n");
    return c;
}

/* Map `len` fresh bytes exactly at `addr` (which must be free now) and fill them with `fill`. */
static inline void case_map_at(void *addr, size_t len, int fill) {
    void *p = mmap(addr, len, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    if (p != addr) {
        fprintf(stderr, "case_map_at(%p, %zu): got %p (errno %d)\n", addr, len, p, errno);
        exit(1);
    }
    memset(addr, fill, len);
}

/* Register + release (so the region is cached idle), then register again: that must be a hit
 * (the cache works at all), and that holder is returned in *held. Returns the invalidation count
 * before the caller's unmap, for case_expect_miss. */
static inline uint64_t case_prime(fh_cache *c, void *addr, size_t len, fh_mr *held) {
    fh_mr first;
    CHECK_OK(fh_register(c, addr, len, FH_ACCESS_LOCAL_WRITE, &first));
    CHECK_OK(fh_deregister(c, first.handle));
    fh_stats s0 = fh_test_stats(c);
    CHECK_OK(fh_register(c, addr, len, FH_ACCESS_LOCAL_WRITE, held));
    fh_stats s1 = fh_test_stats(c);
    CHECK_EQ_U64(s1.hits, s0.hits + 1);
    CHECK_EQ_U64(held->lkey, first.lkey);
    return s1.invalidations;
}

/* After the memory under [addr, addr+len) went away (and was mapped again): registering it must be
 * a miss with a new key (mlock keys are a fresh cookie per pin), invalidations must have grown
 * since `inv0`, and `held` (taken before the unmap) must still be a live handle: releasing it
 * works once and drops exactly one in-use region and its pinned bytes. Exits on failure. */
static inline void case_expect_miss(fh_cache *c, const char *what, void *addr, size_t len,
                                    const fh_mr *held, uint64_t inv0) {
    fh_stats s0 = fh_test_stats(c);
    fh_mr m;
    CHECK_OK(fh_register(c, addr, len, FH_ACCESS_LOCAL_WRITE, &m));
    fh_stats s1 = fh_test_stats(c);
    if (s1.hits != s0.hits || m.lkey == held->lkey) {
        fprintf(stderr, "STALE HIT after %s: [%p, +%zu) served from the cache (lkey %u, old %u)\n",
                what, addr, len, m.lkey, held->lkey);
        exit(1);
    }
    CHECK_EQ_U64(s1.misses, s0.misses + 1);
    if (s1.invalidations <= inv0) {
        fprintf(stderr, "%s: no invalidation counted (%llu before, %llu after)\n", what,
                (unsigned long long)inv0, (unsigned long long)s1.invalidations);
        exit(1);
    }
    /* Old and new holders are both live; the old region was detached, not freed under us. */
    CHECK(s1.in_use >= 2);
    CHECK_OK(fh_deregister(c, held->handle));
    fh_stats s2 = fh_test_stats(c);
    CHECK_EQ_U64(s2.in_use, s1.in_use - 1);
    CHECK_EQ_U64(s2.regions, s1.regions - 1); /* the invalidated region is unpinned on release */
    CHECK(s2.pinned_bytes < s1.pinned_bytes);
    CHECK_STATUS(fh_deregister(c, held->handle), FH_ERR_UNKNOWN_HANDLE);
    CHECK_OK(fh_deregister(c, m.handle));
    printf("  %-40s miss, lkey %u -> %u, invalidations %llu -> %llu\n", what, held->lkey, m.lkey,
           (unsigned long long)inv0, (unsigned long long)s1.invalidations);
}

/* Fails the test (instead of hanging ctest until its timeout) if it runs longer than `secs`. */
static inline void case_watchdog_fired(int sig) {
    (void)sig;
    static const char msg[] = "WATCHDOG: test hung (deadlock?)\n";
    ssize_t rc = write(2, msg, sizeof msg - 1);
    (void)rc;
    _exit(1);
}

static inline void case_watchdog(unsigned secs) {
    signal(SIGALRM, case_watchdog_fired);
    alarm(secs);
}

/* Resident set size of this process in KiB (VmRSS), or -1. */
static inline long case_rss_kib(void) { return fh_test_status_kib("VmRSS"); }

#endif /* FH_CASE_UTIL_H */
