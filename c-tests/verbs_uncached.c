/* Uncached registrations on real verbs. When the bounds leave no room (every cached region is in
 * use, or max_regions is 0), fh_register still returns a registration, pinned for that caller
 * only. This test checks on real MRs that:
 *   - such keys really work: RDMA READ and WRITE through them reach the memory;
 *   - nobody else is handed them: a second request for the same range pins again;
 *   - each one is released on its own: the other stays usable, and the MR count drops at once;
 *   - once there is room again, the same range is cached normally and hit. */
#include "verbs_case_util.h"

#define LEN ((size_t)256 << 10)

int main(void) {
    struct vc v;
    vc_open(&v);
    char *a = fh_test_map(LEN);
    char *b = fh_test_map(LEN);

    /* Room for one region, and `a` holds it. */
    CHECK_OK(fh_set_limits(v.c, (size_t)256 << 20, 1));
    fh_mr ra;
    CHECK_OK(fh_register(v.c, a, LEN, VC_ACCESS, &ra));

    fh_stats s0 = fh_test_stats(v.c);
    fh_mr b1, b2;
    CHECK_OK(fh_register(v.c, b, LEN, VC_ACCESS, &b1));
    CHECK_OK(fh_register(v.c, b, LEN, VC_ACCESS, &b2));
    fh_stats s1 = fh_test_stats(v.c);
    if (s1.hits != s0.hits || s1.misses != s0.misses + 2 || b1.rkey == b2.rkey) {
        fprintf(stderr, "a registration made without room was handed out twice (rkeys %#x %#x, "
                "hits %llu -> %llu)\n", b1.rkey, b2.rkey, (unsigned long long)s0.hits,
                (unsigned long long)s1.hits);
        return 1;
    }
    CHECK_EQ_U64(s1.regions, 3);
    CHECK_EQ_U64(s1.evictions, 0); /* `a` is in use: never evicted */
    if (vc_check(&v, "uncached registration, first", b, LEN, &b1, 1)) return 1;
    if (vc_check(&v, "uncached registration, second", b, LEN, &b2, 2)) return 1;

    /* Released one by one: the MR goes at once, the other one keeps working. */
    CHECK_OK(fh_deregister(v.c, b1.handle));
    CHECK_EQ_U64(fh_test_stats(v.c).regions, 2);
    if (vc_check(&v, "second one after the first's release", b, LEN, &b2, 3)) return 1;
    CHECK_OK(fh_deregister(v.c, b2.handle));
    fh_stats s2 = fh_test_stats(v.c);
    CHECK_EQ_U64(s2.regions, 1);
    CHECK_EQ_U64(s2.pinned_bytes, LEN);
    if (vc_check(&v, "the cached region meanwhile", a, LEN, &ra, 4)) return 1;

    /* Room again (`a` idle, evicted for `b`): cached and hit. */
    CHECK_OK(fh_deregister(v.c, ra.handle));
    fh_mr c1, c2;
    CHECK_OK(fh_register(v.c, b, LEN, VC_ACCESS, &c1));
    CHECK_OK(fh_deregister(v.c, c1.handle));
    fh_stats s3 = fh_test_stats(v.c);
    CHECK_OK(fh_register(v.c, b, LEN, VC_ACCESS, &c2));
    CHECK_EQ_U64(fh_test_stats(v.c).hits, s3.hits + 1);
    CHECK(c2.rkey == c1.rkey);
    if (vc_check(&v, "cached again once there is room", b, LEN, &c2, 5)) return 1;
    CHECK_OK(fh_deregister(v.c, c2.handle));

    /* max_regions = 0: nothing is kept at all, every registration is its own MR. */
    CHECK_OK(fh_set_limits(v.c, (size_t)256 << 20, 0));
    CHECK_EQ_U64(fh_test_stats(v.c).regions, 0);
    fh_mr z;
    CHECK_OK(fh_register(v.c, a, LEN, VC_ACCESS, &z));
    if (vc_check(&v, "max_regions 0", a, LEN, &z, 6)) return 1;
    CHECK_OK(fh_deregister(v.c, z.handle));
    fh_stats s4 = fh_test_stats(v.c);
    CHECK_EQ_U64(s4.regions, 0);
    CHECK_EQ_U64(s4.pinned_bytes, 0);

    CHECK(munmap(a, LEN) == 0);
    CHECK(munmap(b, LEN) == 0);
    vc_close(&v);
    puts("verbs_uncached: ok");
    return 0;
}
