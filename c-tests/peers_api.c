/* The peers C API in a job of one (no launcher, no device needed): fh_init(NULL) outside mpirun
 * is rank 0 of 1; barrier, progress and stats work; bad input gets its documented status and
 * writes nothing; a host bootstrap (fh_bootstrap_ops) is validated and its collectives are used;
 * fh_finalize(NULL) is fine. */
#include "fh_test.h"
#include <string.h>

static int calls;

static int one_rank_allgather(void *ctx, const void *send, size_t len, void *recv) {
    (void)ctx;
    calls++;
    memcpy(recv, send, len);
    return 0;
}

int main(void) {
    unsetenv("PMIX_RANK");
    unsetenv("FH_BOOTSTRAP");
    fh_ctx *sentinel = (fh_ctx *)0x1, *ctx = sentinel;

    CHECK(fh_init(NULL, NULL) == FH_ERR_NULL);

    /* A bad setting is a configuration error, and *out stays untouched. */
    setenv("FH_BOOTSTRAP", "carrier-pigeon", 1);
    CHECK(fh_init(NULL, &ctx) == FH_ERR_BAD_CONFIG);
    CHECK(ctx == sentinel);
    unsetenv("FH_BOOTSTRAP");
    setenv("FH_AM_RECV_DEPTH", "2", 1); /* below the credit reserve */
    CHECK(fh_init(NULL, &ctx) == FH_ERR_BAD_CONFIG);
    CHECK(ctx == sentinel);
    unsetenv("FH_AM_RECV_DEPTH");

    /* PMIx asked for outside a launcher: an error, never a silent job of one. */
    setenv("FH_BOOTSTRAP", "pmix", 1);
    fh_status s = fh_init(NULL, &ctx);
    CHECK(s == FH_ERR_BOOTSTRAP);
    CHECK(ctx == sentinel);
    unsetenv("FH_BOOTSTRAP");

    CHECK_OK(fh_init(NULL, &ctx));
    CHECK(ctx != sentinel && ctx != NULL);
    CHECK_EQ_U64(fh_rank(ctx), 0);
    CHECK_EQ_U64(fh_size(ctx), 1);
    CHECK_OK(fh_barrier(ctx));
    CHECK_OK(fh_progress(ctx));
    fh_net_stats st;
    memset(&st, 0xAB, sizeof st);
    CHECK(fh_get_net_stats(ctx, NULL) == FH_ERR_NULL);
    CHECK_OK(fh_get_net_stats(ctx, &st));
    CHECK_EQ_U64(st.rejected, 0);
    CHECK_EQ_U64(st.peers_lost, 0);
    CHECK_EQ_U64(st.peers_given_up, 0);
    CHECK_EQ_U64(st.queue_overflows, 0);
    CHECK_OK(fh_finalize(ctx));

    /* NULL contexts. */
    CHECK_EQ_U64(fh_rank(NULL), UINT32_MAX);
    CHECK_EQ_U64(fh_size(NULL), 0);
    CHECK(fh_barrier(NULL) == FH_ERR_NULL);
    CHECK(fh_progress(NULL) == FH_ERR_NULL);
    CHECK(fh_get_net_stats(NULL, &st) == FH_ERR_NULL);
    CHECK_OK(fh_finalize(NULL));

    /* Host bootstrap: validated, then its collectives are the ones used. */
    fh_bootstrap_ops ops = {.rank = 0, .size = 1, .ctx = NULL,
                            .allgather = one_rank_allgather, .barrier = NULL};
    fh_init_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.bootstrap = &ops;
    ops.size = 0;
    ctx = sentinel;
    CHECK(fh_init(&cfg, &ctx) == FH_ERR_BAD_CONFIG);
    ops.size = 1;
    ops.rank = 1;
    CHECK(fh_init(&cfg, &ctx) == FH_ERR_BAD_CONFIG);
    ops.rank = 0;
    ops.allgather = NULL;
    CHECK(fh_init(&cfg, &ctx) == FH_ERR_BAD_CONFIG);
    CHECK(ctx == sentinel);
    ops.allgather = one_rank_allgather;
    CHECK_OK(fh_init(&cfg, &ctx));
    CHECK_EQ_U64(fh_size(ctx), 1);
    CHECK_OK(fh_barrier(ctx));
    CHECK_OK(fh_finalize(ctx));
    /* A job of one needs no collective: the host's allgather was never called. */
    CHECK_EQ_U64(calls, 0);
    printf("peers_api: ok\n");
    return 0;
}
