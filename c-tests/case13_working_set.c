/* Case 13: a working set 4x larger than max_pinned (8 MiB), with large messages (1 MiB, then 256 KiB
 * to 2 MiB). Every operation registers one buffer, writes to it and releases it. Checks:
 *   - bounded cost: each operation pins at most once (misses + pin retries grow by <= 1) and
 *     evicts no more than it needs to make room;
 *   - pinned_bytes never exceeds the limit (only one registration is in use at a time);
 *   - correct: a hit returns the key of the last pin of that same buffer; a miss a new key;
 *   - no thrashing collapse: with 80 % of the operations on a hot set that fits, most of those
 *     are hits (cold traffic must not keep flushing the hot set), and uniform random traffic still
 *     gets a hit rate near limit / working set. */
#include "case_util.h"

#define LIMIT ((size_t)8 << 20)
#define NBUF 32
#define BIG ((size_t)2 << 20)

static char *buf[NBUF];
static uint32_t last_key[NBUF]; /* key of the last pin of each buffer (0 = never) */
static uint64_t seed = 12345;

static unsigned rnd(void) {
    return (unsigned)fh_rand(&seed);
}

/* One operation on buffer i, `len` bytes. Returns 1 on a hit. */
static int op(fh_cache *c, int i, size_t len) {
    fh_stats s0 = fh_test_stats(c);
    fh_mr mr;
    CHECK_OK(fh_register(c, buf[i], len, FH_ACCESS_LOCAL_WRITE | FH_ACCESS_REMOTE_WRITE, &mr));
    memset(buf[i], i, len);
    fh_stats s1 = fh_test_stats(c);
    uint64_t pins = (s1.misses - s0.misses) + (s1.pin_retries - s0.pin_retries);
    CHECK(pins <= 1);
    CHECK(s1.pinned_bytes <= LIMIT);
    /* Room for `len` needs at most len / smallest-message evictions (+1 for the region bound). */
    CHECK(s1.evictions - s0.evictions <= len / (256 << 10) + 1);
    int hit = s1.hits == s0.hits + 1;
    if (hit) {
        CHECK_EQ_U64(mr.lkey, last_key[i]); /* a hit is the last pin of this buffer */
    } else {
        CHECK(mr.lkey != last_key[i]);
        last_key[i] = mr.lkey;
    }
    CHECK_OK(fh_deregister(c, mr.handle));
    return hit;
}

int main(void) {
    case_watchdog(110);
    for (int i = 0; i < NBUF; i++) buf[i] = fh_test_map(BIG);
    fh_cache *c = case_cache(LIMIT, 1024);

    /* Cyclic 1 MiB over 32 MiB: an LRU gets no hits, but each op costs one pin and one unpin. */
    int hits = 0, ops = 0;
    for (int r = 0; r < 3; r++)
        for (int i = 0; i < NBUF; i++, ops++) hits += op(c, i, (size_t)1 << 20);
    fh_stats s = fh_test_stats(c);
    printf("  cyclic 1 MiB x %d: %d hits, %llu evictions, peak %llu KiB\n", ops, hits,
           (unsigned long long)s.evictions, (unsigned long long)s.pinned_peak >> 10);
    CHECK(s.evictions >= (uint64_t)ops - 8);
    CHECK(s.pinned_peak <= LIMIT + ((size_t)1 << 20)); /* the new region may briefly overlap the victim */

    /* Hot set of 4 x 1 MiB (fits) gets 80 % of the traffic; the rest is cold, random sizes. */
    int hot_hits = 0, hot_ops = 0;
    for (int k = 0; k < 2000; k++) {
        if (rnd() % 10 < 8) {
            hot_hits += op(c, (int)(rnd() % 4), (size_t)1 << 20);
            hot_ops++;
        } else {
            size_t len = (256 << 10) + (rnd() % 7) * (256 << 10); /* 256 KiB .. 1.75 MiB */
            op(c, 4 + (int)(rnd() % (NBUF - 4)), len);
        }
    }
    printf("  hot/cold: %d of %d hot operations were hits\n", hot_hits, hot_ops);
    CHECK(hot_hits * 10 >= hot_ops * 6); /* no collapse: the hot set mostly stays pinned */

    /* Uniform random 1 MiB over 32 buffers with room for 8: expect ~25 % hits. */
    int rnd_hits = 0;
    for (int k = 0; k < 1000; k++) rnd_hits += op(c, (int)(rnd() % NBUF), (size_t)1 << 20);
    printf("  uniform random: %d of 1000 hits\n", rnd_hits);
    CHECK(rnd_hits >= 150);

    s = fh_test_stats(c);
    CHECK(s.pinned_bytes <= LIMIT);
    CHECK(s.pinned_peak <= LIMIT + BIG);
    CHECK_EQ_U64(s.pin_failures, 0);
    CHECK_EQ_U64(s.in_use, 0);
    CHECK_OK(fh_cache_finalize(c));
    puts("case13_working_set: ok");
    return 0;
}
