/* Case 12 on real verbs: a registration held across munmap + mmap at the same address; the new
 * registration there must miss; releasing the OLD handle must not drop (deregister) the new MR:
 * after the release, the new registration is a hit with the same keys and RDMA through it still
 * reaches the current pages. */
#include "verbs_case_util.h"

#define LEN ((size_t)1 << 20)

int main(void) {
    struct vc v;
    vc_open(&v);
    char *a = fh_test_map(LEN);
    fh_mr old_mr = vc_register_new(&v, "first registration (held)", a, LEN, 1);
    CHECK(munmap(a, LEN) == 0);
    void *p = mmap(a, LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE,
                   -1, 0);
    CHECK(p == a);
    fh_mr new_mr = vc_register_new(&v, "munmap + mmap, old handle still held", a, LEN, 2);
    CHECK(new_mr.rkey != old_mr.rkey);
    CHECK_OK(fh_deregister(v.c, old_mr.handle));
    CHECK_OK(fh_deregister(v.c, new_mr.handle));
    fh_stats s0 = fh_test_stats(v.c);
    CHECK_EQ_U64(s0.in_use, 0);
    CHECK_EQ_U64(s0.regions, 1); /* the old region is gone, the new one cached */

    fh_mr again;
    CHECK_OK(fh_register(v.c, a, LEN, VC_ACCESS, &again));
    fh_stats s1 = fh_test_stats(v.c);
    CHECK_EQ_U64(s1.hits, s0.hits + 1);
    CHECK_EQ_U64(again.rkey, new_mr.rkey);
    CHECK_EQ_U64(again.lkey, new_mr.lkey);
    if (vc_check(&v, "hit on the new entry after the old release", a, LEN, &again, 3)) return 1;
    CHECK_STATUS(fh_deregister(v.c, old_mr.handle), FH_ERR_UNKNOWN_HANDLE);
    CHECK_OK(fh_deregister(v.c, again.handle));
    CHECK(munmap(a, LEN) == 0);
    vc_close(&v);
    puts("verbs_case12_old_handle: ok");
    return 0;
}
