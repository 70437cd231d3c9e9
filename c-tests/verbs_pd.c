/* The verbs backend in a caller-supplied PD (label `verbs`: needs an RDMA device, else exit 77).
 * Registrations come back with real keys, are cached (hit = same keys), and a cache without a PD
 * opens the first device itself. */
#include <infiniband/verbs.h>

#include "fh_test.h"

int main(void) {
    int n = 0;
    struct ibv_device **devs = ibv_get_device_list(&n);
    if (!devs || n == 0) {
        printf("SKIP: no RDMA device\n");
        return FH_SKIP;
    }
    struct ibv_context *ctx = ibv_open_device(devs[0]);
    CHECK(ctx != NULL);
    struct ibv_pd *pd = ibv_alloc_pd(ctx);
    CHECK(pd != NULL);

    fh_config cfg;
    CHECK_OK(fh_config_init(&cfg));
    cfg.backend = FH_BACKEND_VERBS;
    cfg.ibv_pd = pd;
    fh_cache *c = NULL;
    CHECK_OK(fh_cache_new(&cfg, &c));

    size_t len = (size_t)1 << 20;
    char *buf = fh_test_map(len);
    int access = FH_ACCESS_LOCAL_WRITE | FH_ACCESS_REMOTE_WRITE | FH_ACCESS_REMOTE_READ;
    fh_mr a, b;
    CHECK_OK(fh_register(c, buf, len, (uint32_t)access, &a));
    CHECK_OK(fh_deregister(c, a.handle));
    CHECK_OK(fh_register(c, buf, len, (uint32_t)access, &b));
    CHECK_EQ_U64(b.lkey, a.lkey);
    CHECK_EQ_U64(b.rkey, a.rkey);
    fh_stats s = fh_test_stats(c);
    CHECK_EQ_U64(s.hits, 1);
    CHECK_EQ_U64(s.misses, 1);
    CHECK_OK(fh_deregister(c, b.handle));
    CHECK_OK(fh_print_info(c, 1));
    /* FH_FORK_MODE=auto follows what libibverbs says of fork (docs/fork.md, "Cached
     * registrations across fork"). */
    char info[4096];
    CHECK_OK(fh_info(c, info, sizeof info, NULL));
    enum ibv_fork_status fs = ibv_is_fork_initialized();
    const char *want = fs == IBV_FORK_UNNEEDED  ? "fork:          keep"
                       : fs == IBV_FORK_ENABLED ? "fork:          release"
                                                : "fork:          retire";
    printf("verbs_pd: ibv_is_fork_initialized() = %d, expecting \"%s\"\n", (int)fs, want);
    CHECK(strstr(info, want) != NULL);
    CHECK_OK(fh_cache_finalize(c));

    /* No PD given: the library opens a device and a PD of its own. */
    cfg.ibv_pd = NULL;
    CHECK_OK(fh_cache_new(&cfg, &c));
    CHECK_OK(fh_register(c, buf, len, (uint32_t)access, &a));
    CHECK_OK(fh_deregister(c, a.handle));
    fh_cache_free(c);

    CHECK(ibv_dealloc_pd(pd) == 0);
    CHECK(ibv_close_device(ctx) == 0);
    ibv_free_device_list(devs);
    puts("verbs_pd: ok");
    return 0;
}
