/* Case 3: a partial unmap of a merged region invalidates only what overlaps it. Two registrations
 * inside one mapping are merged by a third that spans both (the cache pins the union); a fourth
 * registration elsewhere in the same mapping does not overlap. Unmapping a few pages under the
 * merged region must make it a miss, keep the other a hit, and leave the in-use handle valid (its
 * region still counted, pinned) until it is released, after which its pinned bytes are gone. */
#include "case_util.h"

int main(void) {
    case_skip_under_asan("asserts synchronous invalidation of munmap; ASan's munmap interceptor bypasses libc");
    case_watchdog(60);
    fh_cache *c = case_cache((size_t)256 << 20, 64);
    size_t pg = fh_test_page();
    char *m = fh_test_map(64 * pg);

    /* A = pages [0,8), B = [8,16); AB = [4,12) overlaps both, so it becomes the union [0,16). */
    fh_mr a, b, ab, other;
    CHECK_OK(fh_register(c, m, 8 * pg, FH_ACCESS_LOCAL_WRITE, &a));
    CHECK_OK(fh_register(c, m + 8 * pg, 8 * pg, FH_ACCESS_LOCAL_WRITE, &b));
    CHECK_OK(fh_register(c, m + 4 * pg, 8 * pg, FH_ACCESS_LOCAL_WRITE, &ab));
    CHECK_OK(fh_deregister(c, a.handle));
    CHECK_OK(fh_deregister(c, b.handle));
    /* OTHER = [40,48): same mapping, no overlap. */
    CHECK_OK(fh_register(c, m + 40 * pg, 8 * pg, FH_ACCESS_LOCAL_WRITE, &other));
    CHECK_OK(fh_deregister(c, other.handle));
    fh_stats s = fh_test_stats(c);
    CHECK_EQ_U64(s.misses, 4);
    CHECK_EQ_U64(s.regions, 2); /* the union [0,16) (A and B were replaced by it) and OTHER */
    CHECK_EQ_U64(s.pinned_bytes, 24 * pg);
    CHECK_EQ_U64(s.in_use, 1);  /* AB is held */

    /* The union serves A and B alone now (hits, same key as AB). */
    fh_mr a2;
    CHECK_OK(fh_register(c, m, 8 * pg, FH_ACCESS_LOCAL_WRITE, &a2));
    CHECK_EQ_U64(a2.lkey, ab.lkey);
    CHECK_OK(fh_deregister(c, a2.handle));
    s = fh_test_stats(c);
    CHECK_EQ_U64(s.hits, 1);

    /* Unmap pages [14,16) (only under the union's B half) and map fresh pages there. */
    uint64_t inv0 = s.invalidations;
    CHECK(munmap(m + 14 * pg, 2 * pg) == 0);
    case_map_at(m + 14 * pg, 2 * pg, 0x77);
    s = fh_test_stats(c);
    CHECK_EQ_U64(s.invalidations, inv0 + 1); /* exactly one region: the union */
    CHECK_EQ_U64(s.regions, 2);              /* still pinned: AB holds it */
    CHECK_EQ_U64(s.in_use, 1);

    /* OTHER is still a hit with its old key. */
    uint64_t hits0 = s.hits, misses0 = s.misses;
    fh_mr o2;
    CHECK_OK(fh_register(c, m + 40 * pg, 8 * pg, FH_ACCESS_LOCAL_WRITE, &o2));
    CHECK_EQ_U64(o2.lkey, other.lkey);
    CHECK_OK(fh_deregister(c, o2.handle));
    /* Even the untouched A half is a miss now: it was part of the stale union. */
    fh_mr a3, b3;
    CHECK_OK(fh_register(c, m, 8 * pg, FH_ACCESS_LOCAL_WRITE, &a3));
    CHECK(a3.lkey != ab.lkey);
    CHECK_OK(fh_register(c, m + 8 * pg, 8 * pg, FH_ACCESS_LOCAL_WRITE, &b3));
    CHECK(b3.lkey != ab.lkey);
    s = fh_test_stats(c);
    CHECK_EQ_U64(s.hits, hits0 + 1);
    CHECK_EQ_U64(s.misses, misses0 + 2);

    /* AB's handle is still live: releasing it unpins the stale union's 16 pages. */
    uint64_t pinned0 = s.pinned_bytes, regions0 = s.regions;
    CHECK_OK(fh_deregister(c, ab.handle));
    s = fh_test_stats(c);
    CHECK_EQ_U64(s.pinned_bytes, pinned0 - 16 * pg);
    CHECK_EQ_U64(s.regions, regions0 - 1);
    CHECK_STATUS(fh_deregister(c, ab.handle), FH_ERR_UNKNOWN_HANDLE);

    CHECK_OK(fh_deregister(c, a3.handle));
    CHECK_OK(fh_deregister(c, b3.handle));
    CHECK_OK(fh_cache_finalize(c));
    CHECK(munmap(m, 64 * pg) == 0);
    puts("case3_partial: ok");
    return 0;
}
