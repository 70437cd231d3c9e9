/* Case 12: deregistering an old handle after its address range was invalidated and registered
 * again must not drop the new entry; the old handle is then spent like any other. */
#include "fh_test.h"

int main(void) {
    fh_cache *c = fh_test_cache(64 << 20, 64, 0);
    size_t page = fh_test_page();
    char *buf = fh_test_map(4 * page);

    fh_mr old_mr, new_mr, again;
    CHECK_OK(fh_register(c, buf, 4 * page, FH_ACCESS_LOCAL_WRITE, &old_mr));
    /* The memory goes away while the old registration is still held (as a runtime's own
     * munmap hook would report it). */
    CHECK_OK(fh_notify_unmapped(buf, 4 * page));

    /* Same address again: must be a miss (new region), never the invalidated one. (The cache
     * counts an invalidation when it processes it, at the latest on this next call.) */
    CHECK_OK(fh_register(c, buf, 4 * page, FH_ACCESS_LOCAL_WRITE, &new_mr));
    fh_stats s = fh_test_stats(c);
    CHECK_EQ_U64(s.invalidations, 1);
    CHECK_EQ_U64(s.misses, 2);
    CHECK_EQ_U64(s.hits, 0);
    CHECK(new_mr.handle != old_mr.handle);

    /* Releasing the old handle releases the old region only. */
    CHECK_OK(fh_deregister(c, old_mr.handle));
    CHECK_OK(fh_deregister(c, new_mr.handle));
    s = fh_test_stats(c);
    CHECK_EQ_U64(s.in_use, 0);
    CHECK_EQ_U64(s.regions, 1); /* the invalidated region is unpinned, the new one cached */
    CHECK_EQ_U64(s.pinned_bytes, 4 * page);

    /* The new entry is still cached: a hit with the new keys. */
    CHECK_OK(fh_register(c, buf, 4 * page, FH_ACCESS_LOCAL_WRITE, &again));
    s = fh_test_stats(c);
    CHECK_EQ_U64(s.hits, 1);
    CHECK_EQ_U64(again.lkey, new_mr.lkey);

    /* The old handle is spent, and using it again must not touch the live registration. */
    CHECK_STATUS(fh_deregister(c, old_mr.handle), FH_ERR_UNKNOWN_HANDLE);
    CHECK_STATUS(fh_deregister(c, new_mr.handle), FH_ERR_UNKNOWN_HANDLE);
    s = fh_test_stats(c);
    CHECK_EQ_U64(s.in_use, 1);
    CHECK_OK(fh_deregister(c, again.handle));

    /* The same story through a real munmap + mmap at the same address, with the libc hooks on. */
    fh_cache_free(c);
    c = fh_test_cache(64 << 20, 64, FH_MONITOR_PATCH_LIBC);
    CHECK_OK(fh_register(c, buf, 4 * page, FH_ACCESS_LOCAL_WRITE, &old_mr));
    CHECK(munmap(buf, 4 * page) == 0);
    char *p = mmap(buf, 4 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    CHECK(p == buf);
    CHECK_OK(fh_register(c, buf, 4 * page, FH_ACCESS_LOCAL_WRITE, &new_mr));
    s = fh_test_stats(c);
    CHECK_EQ_U64(s.misses, 2);
    CHECK_OK(fh_deregister(c, old_mr.handle));
    CHECK_OK(fh_register(c, buf, 4 * page, FH_ACCESS_LOCAL_WRITE, &again));
    s = fh_test_stats(c);
    CHECK_EQ_U64(s.hits, 1);
    CHECK_OK(fh_deregister(c, again.handle));
    CHECK_OK(fh_deregister(c, new_mr.handle));
    CHECK_OK(fh_cache_finalize(c));
    puts("stale_handle: ok");
    return 0;
}
