/* Lazy release bounded by max_regions and max_pinned: idle regions beyond the bounds are evicted
 * least-recently-used first, in-use regions never are, and shrinking the limits evicts at once. */
#include "fh_test.h"

#define N 8

static void reg_release(fh_cache *c, char *p, size_t len, fh_mr *mr) {
    CHECK_OK(fh_register(c, p, len, FH_ACCESS_LOCAL_WRITE, mr));
    CHECK_OK(fh_deregister(c, mr->handle));
}

int main(void) {
    size_t page = fh_test_page();
    char *bufs[N];
    for (int i = 0; i < N; i++) bufs[i] = fh_test_map(4 * page); /* separate mappings */

    /* --- max_regions = 4 --------------------------------------------------------------- */
    fh_cache *c = fh_test_cache(64 << 20, 4, 0);
    fh_mr mr;
    for (int i = 0; i < N; i++) {
        reg_release(c, bufs[i], 4 * page, &mr);
        fh_stats s = fh_test_stats(c);
        CHECK(s.regions <= 4);
    }
    fh_stats s = fh_test_stats(c);
    CHECK_EQ_U64(s.regions, 4);
    CHECK_EQ_U64(s.evictions, N - 4);
    CHECK_EQ_U64(s.pinned_bytes, 4 * 4 * page);
    /* The last four are cached (hits), the first four were evicted (misses). */
    uint64_t hits0 = s.hits, misses0 = s.misses;
    reg_release(c, bufs[N - 1], 4 * page, &mr);
    s = fh_test_stats(c);
    CHECK_EQ_U64(s.hits, hits0 + 1);
    reg_release(c, bufs[0], 4 * page, &mr);
    s = fh_test_stats(c);
    CHECK_EQ_U64(s.misses, misses0 + 1);

    /* Replacement order. The cache uses CLOCK (second chance), an LRU approximation whose exact
     * victim depends on the hand position, so this checks what any sane policy must give: a
     * working set that fits the bound never misses again (no thrashing inside capacity), and one
     * that exceeds it keeps the count at the bound with evictions == misses - regions. */
    CHECK_OK(fh_set_limits(c, 64 << 20, 3));
    s = fh_test_stats(c);
    CHECK(s.regions <= 3);
    for (int i = 2; i <= 4; i++) reg_release(c, bufs[i], 4 * page, &mr);
    s = fh_test_stats(c);
    uint64_t h = s.hits, m = s.misses;
    for (int round = 0; round < 5; round++)
        for (int i = 2; i <= 4; i++) reg_release(c, bufs[i], 4 * page, &mr);
    s = fh_test_stats(c);
    CHECK_EQ_U64(s.misses, m);
    CHECK_EQ_U64(s.hits, h + 15);
    for (int round = 0; round < 3; round++)
        for (int i = 0; i < N; i++) {
            reg_release(c, bufs[i], 4 * page, &mr);
            s = fh_test_stats(c);
            CHECK(s.regions <= 3);
        }
    s = fh_test_stats(c);
    CHECK_EQ_U64(s.regions, 3);
    CHECK_EQ_U64(s.evictions, s.misses - s.regions);
    CHECK_EQ_U64(s.pinned_bytes, 3 * 4 * page);

    /* In-use regions are never evicted, even beyond the bound. */
    fh_mr held[N];
    for (int i = 0; i < N; i++) CHECK_OK(fh_register(c, bufs[i], 4 * page, 0, &held[i]));
    s = fh_test_stats(c);
    CHECK_EQ_U64(s.in_use, N);
    CHECK(s.regions >= N);
    for (int i = 0; i < N; i++) CHECK_OK(fh_deregister(c, held[i].handle));
    s = fh_test_stats(c);
    CHECK(s.regions <= 3);

    /* Shrinking the limit evicts idle regions right away; flush drops the rest. */
    CHECK_OK(fh_set_limits(c, 64 << 20, 1));
    s = fh_test_stats(c);
    CHECK_EQ_U64(s.regions, 1);
    size_t unpinned = 99;
    CHECK_OK(fh_flush(c, &unpinned));
    CHECK_EQ_U64(unpinned, 1);
    s = fh_test_stats(c);
    CHECK_EQ_U64(s.regions, 0);
    CHECK_EQ_U64(s.pinned_bytes, 0);
    fh_cache_free(c);

    /* --- max_pinned = 3 buffers' worth ---------------------------------------------------- */
    c = fh_test_cache(3 * 4 * page, 1000, 0);
    for (int i = 0; i < N; i++) {
        reg_release(c, bufs[i], 4 * page, &mr);
        s = fh_test_stats(c);
        CHECK(s.pinned_bytes <= 3 * 4 * page);
    }
    s = fh_test_stats(c);
    CHECK_EQ_U64(s.regions, 3);
    CHECK_EQ_U64(s.evictions, N - 3);
    /* The peak may briefly include the new region before the victim goes, never more. */
    CHECK(s.pinned_peak >= 3 * 4 * page && s.pinned_peak <= 4 * 4 * page);
    /* A request bigger than max_pinned is refused outright. */
    CHECK_STATUS(fh_register(c, bufs[0], 4 * 4 * page, 0, &mr), FH_ERR_TOO_LARGE);
    fh_cache_free(c);

    puts("lru_limits: ok");
    return 0;
}
