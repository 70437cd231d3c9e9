/* Case 10 on real verbs: a cached registration with remote READ only must not satisfy a request
 * for remote WRITE, and a cached write-enabled one must not satisfy a request for remote READ
 * only (its rkey would let the peer write). The read-only keys handed out over a cached
 * write-enabled region really refuse an RDMA WRITE (checked last: the error puts the QP in the
 * error state), and the registration asked with write rights gets keys that accept it. */
#include "verbs_case_util.h"

#define LEN ((size_t)256 << 10)

int main(void) {
    struct vc v;
    vc_open(&v);
    char *a = fh_test_map(LEN);

    fh_mr ro;
    CHECK_OK(fh_register(v.c, a, LEN, FH_ACCESS_REMOTE_READ, &ro));
    CHECK_OK(fh_deregister(v.c, ro.handle)); /* cached, read-only */
    fh_stats s0 = fh_test_stats(v.c);
    fh_mr rw;
    CHECK_OK(fh_register(v.c, a, LEN, FH_ACCESS_LOCAL_WRITE | FH_ACCESS_REMOTE_WRITE, &rw));
    fh_stats s1 = fh_test_stats(v.c);
    if (s1.hits != s0.hits || rw.rkey == ro.rkey) {
        fprintf(stderr, "read-only registration served a remote-write request (rkey %#x)\n", rw.rkey);
        return 1;
    }
    /* Remote rights are never merged: read+write is a registration of its own. */
    fh_mr rwr;
    CHECK_OK(fh_register(v.c, a, LEN, VC_ACCESS, &rwr));
    if (vc_check(&v, "remote write through the write-enabled keys", a, LEN, &rwr, 1)) return 1;
    CHECK_OK(fh_deregister(v.c, rwr.handle));
    CHECK_OK(fh_deregister(v.c, rw.handle));

    /* A read-only request over a cached write-enabled region gets its own read-only keys: an
     * RDMA WRITE through them must complete with an error. */
    fh_cache *c2 = v.c;
    char *b = fh_test_map(LEN);
    fh_mr wr;
    CHECK_OK(fh_register(c2, b, LEN, VC_ACCESS, &wr));
    CHECK_OK(fh_deregister(c2, wr.handle)); /* cached, remote write enabled */
    fh_mr ro2;
    CHECK_OK(fh_register(c2, b, LEN, FH_ACCESS_REMOTE_READ, &ro2));
    CHECK(ro2.rkey != wr.rkey);
    memset(b, 0x5a, LEN);
    memset(v.scratch, 0x77, LEN);
    CHECK(vl_post_write(&v.vl, 0, v.scratch, (uint32_t)LEN, v.scratch_mr->lkey,
                        (uint64_t)(uintptr_t)b, ro2.rkey, 9) == 0);
    struct ibv_wc wc;
    CHECK(vl_poll(&v.vl, &wc, 1, 60.0) == 0);
    printf("  RDMA WRITE through read-only rkey %#x: completion status %d (%s)\n", ro2.rkey,
           (int)wc.status, ibv_wc_status_str(wc.status));
    CHECK(wc.status != IBV_WC_SUCCESS);
    CHECK(b[0] == 0x5a && b[LEN - 1] == 0x5a); /* nothing was written */
    CHECK_OK(fh_deregister(c2, ro2.handle));
    CHECK(munmap(a, LEN) == 0);
    CHECK(munmap(b, LEN) == 0);
    vc_close(&v);
    puts("verbs_case10_access: ok");
    return 0;
}
