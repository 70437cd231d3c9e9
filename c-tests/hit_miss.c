/* Basic lazy release: the second registration of the same buffer (or of a range inside it) is a
 * hit with the same keys; the pinned bytes are accounted and released on free. */
#include "fh_test.h"

int main(void) {
    /* VmLck shows the mlock backend really pinned (not under ASan, where mlock is a no-op). */
    long lck0 = FH_TEST_ASAN ? -1 : fh_test_vmlck_kib();
    fh_cache *c = fh_test_cache(64 << 20, 64, 0);
    size_t page = fh_test_page();
    size_t len = 16 * page;
    char *buf = fh_test_map(len);

    fh_mr a, b, inner;
    CHECK_OK(fh_register(c, buf, len, FH_ACCESS_LOCAL_WRITE | FH_ACCESS_REMOTE_READ, &a));
    CHECK(a.addr == buf);
    CHECK_EQ_U64(a.length, len);
    fh_stats s = fh_test_stats(c);
    CHECK_EQ_U64(s.misses, 1);
    CHECK_EQ_U64(s.hits, 0);
    CHECK_EQ_U64(s.in_use, 1);
    CHECK_EQ_U64(s.regions, 1);
    CHECK_EQ_U64(s.pinned_bytes, len);
    long lck1 = fh_test_vmlck_kib();
    if (lck0 >= 0) CHECK(lck1 - lck0 >= (long)(len / 1024));
    CHECK_OK(fh_deregister(c, a.handle));

    /* Lazy release: still pinned, and the same buffer again is a hit with equal keys. */
    s = fh_test_stats(c);
    CHECK_EQ_U64(s.in_use, 0);
    CHECK_EQ_U64(s.pinned_bytes, len);
    CHECK_OK(fh_register(c, buf, len, FH_ACCESS_LOCAL_WRITE | FH_ACCESS_REMOTE_READ, &b));
    s = fh_test_stats(c);
    CHECK_EQ_U64(s.hits, 1);
    CHECK_EQ_U64(s.misses, 1);
    CHECK_EQ_U64(b.lkey, a.lkey);
    CHECK_EQ_U64(b.rkey, a.rkey);
    CHECK(b.handle != a.handle);

    /* A sub-range with fewer local rights (the same remote ones) is contained: a hit too,
     * reporting the caller's range. */
    CHECK_OK(fh_register(c, buf + 3 * page + 17, 2 * page, FH_ACCESS_REMOTE_READ, &inner));
    s = fh_test_stats(c);
    CHECK_EQ_U64(s.hits, 2);
    CHECK_EQ_U64(s.regions, 1);
    CHECK(inner.addr == buf + 3 * page + 17);
    CHECK_EQ_U64(inner.length, 2 * page);
    CHECK_EQ_U64(inner.lkey, a.lkey);

    /* A range reaching past the region is a miss. */
    fh_mr beyond;
    char *other = fh_test_map(2 * page);
    CHECK_OK(fh_register(c, other, 2 * page, FH_ACCESS_LOCAL_WRITE, &beyond));
    s = fh_test_stats(c);
    CHECK_EQ_U64(s.misses, 2);

    /* finalize refuses while in use, and changes nothing. */
    CHECK_STATUS(fh_cache_finalize(c), FH_ERR_BUSY);
    CHECK_OK(fh_deregister(c, b.handle));
    CHECK_OK(fh_deregister(c, inner.handle));
    CHECK_OK(fh_deregister(c, beyond.handle));

    char info[2048];
    size_t needed = 0;
    CHECK_OK(fh_info(c, info, sizeof info, &needed));
    CHECK(needed > 0 && needed < sizeof info);
    CHECK(strlen(info) == needed);
    CHECK(strstr(info, "mlock") != NULL);
    CHECK(strstr(info, "2 hits") != NULL);
    fputs(info, stdout);

    CHECK_OK(fh_cache_finalize(c));
    /* Freeing the cache unpinned everything. */
    if (lck0 >= 0) CHECK_EQ_U64(fh_test_vmlck_kib(), lck0);
    puts("hit_miss: ok");
    return 0;
}
