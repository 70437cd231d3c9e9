/* Case 13 on real verbs: a working set 4x larger than max_pinned (16 buffers of 256 KiB, limit
 * 1 MiB), so the cache keeps evicting, i.e. really deregistering MRs. Every operation registers one
 * buffer through the cache and proves with RDMA READ + WRITE of every byte that the keys it got
 * address that buffer's current pages (an MR deregistered by an eviction but still handed out fails
 * the RDMA with a remote access error; one of another buffer fails the byte compare). Checks:
 *   - bounded cost: each operation pins at most once, pinned_bytes never exceeds the limit;
 *   - a hit returns the keys of the last pin of that same buffer;
 *   - no thrashing collapse: with 80 % of the operations on a hot set that fits, most of those are
 *     hits; and a hit (no ibv_reg_mr) costs less than a miss on average. */
#include <time.h>

#include "verbs_case_util.h"

#define LIMIT ((size_t)1 << 20)
#define NBUF 16
#define BUF ((size_t)256 << 10)

static char *buf[NBUF];
static uint32_t last_rkey[NBUF], last_lkey[NBUF];
static int pinned_once[NBUF];
static uint64_t seed = 4242;
static double hit_s, miss_s;
static int hits, misses;

static unsigned rnd(void) {
    return (unsigned)fh_rand(&seed);
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* One operation on buffer i, `len` bytes. Returns 1 on a hit. */
static int op(struct vc *v, int i, size_t len, unsigned pattern) {
    fh_stats s0 = fh_test_stats(v->c);
    fh_mr mr;
    double t0 = now_s();
    CHECK_OK(fh_register(v->c, buf[i], len, VC_ACCESS, &mr));
    double dt = now_s() - t0;
    fh_stats s1 = fh_test_stats(v->c);
    CHECK((s1.misses - s0.misses) + (s1.pin_retries - s0.pin_retries) <= 1);
    CHECK(s1.pinned_bytes <= LIMIT);
    int hit = s1.hits == s0.hits + 1;
    if (hit) {
        CHECK(pinned_once[i]);
        CHECK_EQ_U64(mr.rkey, last_rkey[i]); /* a hit is the last pin of this buffer */
        CHECK_EQ_U64(mr.lkey, last_lkey[i]);
        hit_s += dt;
        hits++;
    } else {
        CHECK_EQ_U64(s1.misses, s0.misses + 1);
        last_rkey[i] = mr.rkey;
        last_lkey[i] = mr.lkey;
        pinned_once[i] = 1;
        miss_s += dt;
        misses++;
    }
    char what[64];
    snprintf(what, sizeof what, "buffer %d, %zu KiB, %s", i, len >> 10, hit ? "hit" : "miss");
    if (vc_check(v, what, buf[i], len, &mr, pattern)) exit(1);
    CHECK_OK(fh_deregister(v->c, mr.handle));
    return hit;
}

int main(void) {
    struct vc v;
    vc_open(&v);
    for (int i = 0; i < NBUF; i++) buf[i] = fh_test_map(BUF);
    /* vc_open's cache is roomy; this test needs its own, with the small limit (same PD). */
    CHECK_OK(fh_cache_finalize(v.c));
    fh_config cfg;
    CHECK_OK(fh_config_init(&cfg));
    cfg.backend = FH_BACKEND_VERBS;
    cfg.ibv_pd = v.vl.pd;
    cfg.max_pinned = LIMIT;
    cfg.max_regions = 1024;
    CHECK_OK(fh_cache_new(&cfg, &v.c));

    /* Cyclic over 4 MiB with room for 1 MiB: an LRU gets no hits, each op one pin + one unpin. */
    unsigned pat = 1;
    int cyc_hits = 0;
    for (int r = 0; r < 2; r++)
        for (int i = 0; i < NBUF; i++) cyc_hits += op(&v, i, BUF, pat++ % 900);
    fh_stats s = fh_test_stats(v.c);
    printf("  cyclic: %d hits of %d, %llu evictions\n", cyc_hits, 2 * NBUF,
           (unsigned long long)s.evictions);
    CHECK(s.evictions >= 2 * NBUF - 4);

    /* Hot set of 2 buffers (fits) gets 80 % of the traffic; the rest is cold, random sizes. */
    int hot_hits = 0, hot_ops = 0;
    for (int k = 0; k < 200; k++) {
        if (rnd() % 10 < 8) {
            hot_hits += op(&v, (int)(rnd() % 2), BUF, pat++ % 900);
            hot_ops++;
        } else {
            size_t len = (size_t)(1 + rnd() % 4) * (BUF / 4); /* 64 .. 256 KiB */
            op(&v, 2 + (int)(rnd() % (NBUF - 2)), len, pat++ % 900);
        }
    }
    printf("  hot/cold: %d of %d hot operations were hits\n", hot_hits, hot_ops);
    CHECK(hot_hits * 10 >= hot_ops * 6);

    s = fh_test_stats(v.c);
    printf("  %d hits (mean register %.1f us), %d misses (mean %.1f us), %llu evictions\n", hits,
           hit_s / hits * 1e6, misses, miss_s / misses * 1e6, (unsigned long long)s.evictions);
    CHECK(hits > 0 && misses > 0);
    CHECK(hit_s / hits < miss_s / misses); /* a hit never calls ibv_reg_mr */
    CHECK(s.pinned_peak <= LIMIT + BUF);   /* the new region may briefly overlap the victim */
    CHECK_EQ_U64(s.pin_failures, 0);
    CHECK_EQ_U64(s.in_use, 0);
    for (int i = 0; i < NBUF; i++) CHECK(munmap(buf[i], BUF) == 0);
    vc_close(&v);
    puts("verbs_case13_working_set: ok");
    return 0;
}
