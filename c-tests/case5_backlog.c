/* Case 5: bounded backlog. With registrations in the cache, 40 000 mmap/munmap cycles happen with
 * no cache call in between, so nothing drains what the hooks queue:
 *   A. cycles on fresh memory that no registration covers: nothing may be queued at all
 *      (invalidations stay 0, every cached registration is still a hit afterwards);
 *   B. cycles that unmap and re-map a registered, cached range at the same address: each one is a
 *      real invalidation the hooks must record without allocating. The queue is a fixed ring (64
 *      entries, src/cache/inval_queue.rs); when full it falls back to "invalidate everything", so
 *      afterwards the churned range AND the unrelated registrations must be misses.
 * Both phases must leave RSS growth under 512 KiB, and the cache still works. The queue length is
 * not in fh_stats; the "everything is a miss" fallback is how its bound shows from C. */
#include "case_util.h"

#define CYCLES 40000
#define NREG 16

static char *bufs[NREG];

/* Register every buffer once (idle afterwards); returns how many were hits. */
static uint64_t touch_all(fh_cache *c, size_t len) {
    uint64_t h0 = fh_test_stats(c).hits;
    for (int i = 0; i < NREG; i++) {
        fh_mr mr;
        CHECK_OK(fh_register(c, bufs[i], len, FH_ACCESS_LOCAL_WRITE, &mr));
        CHECK_OK(fh_deregister(c, mr.handle));
    }
    return fh_test_stats(c).hits - h0;
}

static void check_rss(const char *what, long before) {
    long after = case_rss_kib();
    CHECK(before > 0 && after > 0);
    printf("  %s: RSS %ld KiB -> %ld KiB (%+ld KiB)\n", what, before, after, after - before);
    if (after - before >= 512) {
        fprintf(stderr, "%s: RSS grew by %ld KiB (limit 512)\n", what, after - before);
        exit(1);
    }
}

int main(void) {
    case_skip_under_asan("asserts synchronous invalidation of munmap; ASan's munmap interceptor bypasses libc");
    case_watchdog(100);
    fh_cache *c = case_cache((size_t)256 << 20, 1024);
    size_t pg = fh_test_page();
    size_t len = 4 * pg;
    for (int i = 0; i < NREG; i++) bufs[i] = fh_test_map(len);
    CHECK_EQ_U64(touch_all(c, len), 0);
    CHECK_EQ_U64(touch_all(c, len), NREG);
    /* One registration held through everything. */
    fh_mr held;
    CHECK_OK(fh_register(c, bufs[0], len, FH_ACCESS_LOCAL_WRITE, &held));
    char *victim = fh_test_map(len);
    fh_mr v;
    CHECK_OK(fh_register(c, victim, len, FH_ACCESS_LOCAL_WRITE, &v));
    CHECK_OK(fh_deregister(c, v.handle));

    /* Warm up (first-touch page tables, libc state) before measuring. */
    for (int i = 0; i < 200; i++) {
        void *m = mmap(NULL, 64 << 10, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        CHECK(m != MAP_FAILED);
        CHECK(munmap(m, 64 << 10) == 0);
    }

    /* A: unrelated memory. */
    uint64_t inv0 = fh_test_stats(c).invalidations;
    long rss0 = case_rss_kib();
    for (int i = 0; i < CYCLES; i++) {
        char *m = mmap(NULL, 64 << 10, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        CHECK(m != MAP_FAILED);
        m[0] = 1;
        CHECK(munmap(m, 64 << 10) == 0);
    }
    check_rss("A: 40000 unrelated mmap/munmap", rss0);
    CHECK_EQ_U64(fh_test_stats(c).invalidations, inv0);
    CHECK_EQ_U64(touch_all(c, len), NREG); /* nothing was dropped */

    /* B: the cached `victim` range, unmapped and re-mapped 40 000 times, no cache call between. */
    rss0 = case_rss_kib();
    for (int i = 0; i < CYCLES; i++) {
        CHECK(munmap(victim, len) == 0);
        char *m = mmap(victim, len, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
        CHECK(m == victim);
        m[0] = 1;
    }
    check_rss("B: 40000 munmap/mmap of a cached range", rss0);
    fh_stats s0 = fh_test_stats(c);
    CHECK(s0.invalidations > inv0);
    fh_mr v2;
    CHECK_OK(fh_register(c, victim, len, FH_ACCESS_LOCAL_WRITE, &v2));
    CHECK(v2.lkey != v.lkey);
    fh_stats s1 = fh_test_stats(c);
    CHECK_EQ_U64(s1.hits, s0.hits); /* the churned range is a miss */
    CHECK_OK(fh_deregister(c, v2.handle));
    uint64_t hits = touch_all(c, len);
    printf("  after B: %llu invalidations, %llu of %d unrelated registrations still hits\n",
           (unsigned long long)s0.invalidations, (unsigned long long)hits, NREG);
    /* The ring overflowed long ago, so the fallback dropped everything: all misses again. */
    CHECK_EQ_U64(hits, 0);
    CHECK_EQ_U64(touch_all(c, len), NREG); /* and the cache works normally afterwards */

    /* The held handle survived both phases and is released normally. */
    CHECK_OK(fh_deregister(c, held.handle));
    CHECK_EQ_U64(fh_test_stats(c).in_use, 0);
    CHECK_OK(fh_cache_finalize(c));
    puts("case5_backlog: ok");
    return 0;
}
