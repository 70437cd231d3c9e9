/* Case 10 on real verbs: a cached registration with remote READ only must not satisfy a request
 * for remote WRITE. The read-only keys really refuse an RDMA WRITE (checked last: the error puts
 * the QP in the error state), and the registration asked with write rights gets keys that accept
 * it. */
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
    /* Rights are unions now: REMOTE_READ is added so vc_check can read through the same keys. */
    fh_mr rwr;
    CHECK_OK(fh_register(v.c, a, LEN, VC_ACCESS, &rwr));
    if (vc_check(&v, "remote write through the write-enabled keys", a, LEN, &rwr, 1)) return 1;
    CHECK_OK(fh_deregister(v.c, rwr.handle));
    CHECK_OK(fh_deregister(v.c, rw.handle));

    /* The read-only MR itself refuses a write: registered again read-only in a fresh cache of the
     * same PD, then an RDMA WRITE through its rkey must complete with an error. */
    fh_cache *c2 = NULL;
    fh_config cfg;
    CHECK_OK(fh_config_init(&cfg));
    cfg.backend = FH_BACKEND_VERBS;
    cfg.ibv_pd = v.vl.pd;
    CHECK_OK(fh_cache_new(&cfg, &c2));
    char *b = fh_test_map(LEN);
    fh_mr ro2;
    CHECK_OK(fh_register(c2, b, LEN, FH_ACCESS_REMOTE_READ, &ro2));
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
    CHECK_OK(fh_cache_finalize(c2));
    CHECK(munmap(a, LEN) == 0);
    CHECK(munmap(b, LEN) == 0);
    vc_close(&v);
    puts("verbs_case10_access: ok");
    return 0;
}
