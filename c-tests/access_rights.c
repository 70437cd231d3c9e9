/* Case 10: a cached read-only registration must not satisfy a request for remote write, and a
 * cached write-enabled one must not satisfy a request for remote read only (an rkey never grants
 * more than was asked); more local rights than asked are fine. */
#include "fh_test.h"

int main(void) {
    fh_cache *c = fh_test_cache(64 << 20, 64, 0);
    size_t page = fh_test_page();
    char *buf = fh_test_map(8 * page);

    fh_mr ro, rw, ro2, rw2;
    CHECK_OK(fh_register(c, buf, 8 * page, FH_ACCESS_REMOTE_READ, &ro));
    CHECK_OK(fh_deregister(c, ro.handle));

    CHECK_OK(fh_register(c, buf, 8 * page, FH_ACCESS_LOCAL_WRITE | FH_ACCESS_REMOTE_WRITE, &rw));
    fh_stats s = fh_test_stats(c);
    CHECK_EQ_U64(s.hits, 0); /* read-only region did not serve a write request */
    CHECK_EQ_U64(s.misses, 2);
    CHECK_OK(fh_deregister(c, rw.handle));

    /* The write region does not serve a read-only request: its rkey would allow remote write. */
    CHECK_OK(fh_register(c, buf, 8 * page, FH_ACCESS_REMOTE_READ, &ro2));
    CHECK(ro2.rkey != rw.rkey);
    /* The index holds one registration per page: the read-only one replaced the write one, so
     * a write request is a miss again, with keys of its own. */
    CHECK_OK(fh_register(c, buf, 8 * page, FH_ACCESS_REMOTE_WRITE, &rw2));
    CHECK(rw2.rkey != ro2.rkey);
    s = fh_test_stats(c);
    CHECK_EQ_U64(s.misses, 4);
    CHECK_EQ_U64(s.hits, 0);
    CHECK_OK(fh_deregister(c, rw2.handle));
    /* More local rights than the cached region has: a miss. A request with fewer local rights
     * and the same remote rights than that new region then hits it. */
    CHECK_OK(fh_register(c, buf, 8 * page, FH_ACCESS_REMOTE_WRITE | FH_ACCESS_LOCAL_WRITE, &rw2));
    CHECK_EQ_U64(fh_test_stats(c).misses, 5);
    CHECK_OK(fh_deregister(c, rw2.handle));
    CHECK_OK(fh_register(c, buf, 8 * page, FH_ACCESS_REMOTE_WRITE, &rw2));
    s = fh_test_stats(c);
    CHECK_EQ_U64(s.misses, 5);
    CHECK_EQ_U64(s.hits, 1);
    CHECK_OK(fh_deregister(c, ro2.handle));
    CHECK_OK(fh_deregister(c, rw2.handle));

    /* Atomic rights were never asked for: a miss again. */
    fh_mr at;
    CHECK_OK(fh_register(c, buf, page, FH_ACCESS_REMOTE_ATOMIC, &at));
    s = fh_test_stats(c);
    CHECK_EQ_U64(s.misses, 6);
    CHECK_OK(fh_deregister(c, at.handle));

    CHECK_OK(fh_cache_finalize(c));
    puts("access_rights: ok");
    return 0;
}
