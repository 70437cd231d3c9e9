#define _GNU_SOURCE
#include "rdma_loop.h"

#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int env_int(const char *name, int dflt)
{
    const char *v = getenv(name);
    return v && *v ? atoi(v) : dflt;
}

static int loop_connect(struct loop *l);

int loop_open(struct loop *l)
{
    memset(l, 0, sizeof(*l));
    int n = 0;
    struct ibv_device **list = ibv_get_device_list(&n);
    if (!list || n == 0) {
        fprintf(stderr, "no RDMA device (%s)\n", strerror(errno));
        if (list)
            ibv_free_device_list(list);
        return 77;
    }
    const char *want = getenv("FH_RDMA_DEV");
    struct ibv_device *dev = list[0];
    for (int i = 0; want && *want && i < n; i++)
        if (strcmp(ibv_get_device_name(list[i]), want) == 0)
            dev = list[i];
    l->ctx = ibv_open_device(dev);
    ibv_free_device_list(list);
    if (!l->ctx) {
        perror("ibv_open_device");
        return 1;
    }
    l->pd = ibv_alloc_pd(l->ctx);
    if (!l->pd) {
        perror("ibv_alloc_pd");
        return 1;
    }
    return loop_connect(l);
}

int loop_open_in(struct loop *l, const struct loop *parent)
{
    memset(l, 0, sizeof(*l));
    l->ctx = parent->ctx;
    l->pd = parent->pd;
    l->borrowed = 1;
    return loop_connect(l);
}

/* A CQ and a QP in l's domain, the QP connected to itself. */
static int loop_connect(struct loop *l)
{
    uint8_t port = (uint8_t)env_int("FH_IB_PORT", 1);
    int gid_index = env_int("FH_GID_INDEX", 0);
    struct ibv_port_attr pattr;
    union ibv_gid gid;
    if (ibv_query_port(l->ctx, port, &pattr) || ibv_query_gid(l->ctx, port, gid_index, &gid)) {
        perror("ibv_query_port/gid");
        return 1;
    }
    l->cq = ibv_create_cq(l->ctx, 16, NULL, NULL, 0);
    if (!l->cq) {
        perror("ibv_create_cq");
        return 1;
    }
    struct ibv_qp_init_attr qia = {
        .send_cq = l->cq,
        .recv_cq = l->cq,
        .cap = {.max_send_wr = 8, .max_recv_wr = 1, .max_send_sge = 1, .max_recv_sge = 1},
        .qp_type = IBV_QPT_RC,
    };
    l->qp = ibv_create_qp(l->pd, &qia);
    if (!l->qp) {
        perror("ibv_create_qp");
        return 1;
    }
    struct ibv_qp_attr a = {
        .qp_state = IBV_QPS_INIT,
        .port_num = port,
        .qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ |
                           IBV_ACCESS_REMOTE_WRITE,
    };
    if (ibv_modify_qp(l->qp, &a,
                      IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS)) {
        perror("modify INIT");
        return 1;
    }
    memset(&a, 0, sizeof(a));
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = pattr.active_mtu;
    a.dest_qp_num = l->qp->qp_num; /* connected to itself */
    a.rq_psn = 0;
    a.max_dest_rd_atomic = 1;
    a.min_rnr_timer = 12;
    a.ah_attr.is_global = 1;
    a.ah_attr.grh.dgid = gid;
    a.ah_attr.grh.sgid_index = (uint8_t)gid_index;
    a.ah_attr.grh.hop_limit = 1;
    a.ah_attr.dlid = pattr.lid;
    a.ah_attr.port_num = port;
    if (ibv_modify_qp(l->qp, &a,
                      IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                          IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER)) {
        perror("modify RTR");
        return 1;
    }
    memset(&a, 0, sizeof(a));
    a.qp_state = IBV_QPS_RTS;
    a.timeout = 14;
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.sq_psn = 0;
    a.max_rd_atomic = 1;
    if (ibv_modify_qp(l->qp, &a,
                      IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                          IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC)) {
        perror("modify RTS");
        return 1;
    }
    return 0;
}

void loop_close(struct loop *l)
{
    if (l->qp)
        ibv_destroy_qp(l->qp);
    if (l->cq)
        ibv_destroy_cq(l->cq);
    if (l->borrowed)
        return;
    if (l->pd && ibv_dealloc_pd(l->pd))
        fprintf(stderr, "warning: ibv_dealloc_pd failed\n");
    if (l->ctx)
        ibv_close_device(l->ctx);
}

int loop_rdma(struct loop *l, enum ibv_wr_opcode op, void *laddr, uint32_t lkey, uint64_t raddr,
              uint32_t rkey, uint32_t len)
{
    struct ibv_sge sge = {.addr = (uintptr_t)laddr, .length = len, .lkey = lkey};
    struct ibv_send_wr wr = {
        .wr_id = 1,
        .sg_list = &sge,
        .num_sge = 1,
        .opcode = op,
        .send_flags = IBV_SEND_SIGNALED,
        .wr.rdma = {.remote_addr = raddr, .rkey = rkey},
    }, *bad;
    if (ibv_post_send(l->qp, &wr, &bad)) {
        perror("ibv_post_send");
        return -1;
    }
    struct ibv_wc wc;
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        int n = ibv_poll_cq(l->cq, 1, &wc);
        if (n < 0)
            return -1;
        if (n == 1)
            return wc.status;
        clock_gettime(CLOCK_MONOTONIC, &t);
        if (t.tv_sec - t0.tv_sec > 60) {
            fprintf(stderr, "no completion in 60 s\n");
            return -1;
        }
    }
}

int (*loop_stats_fn(void))(struct fh_preload_stats *, size_t)
{
    return (int (*)(struct fh_preload_stats *, size_t))dlsym(RTLD_DEFAULT, "fh_preload_stats");
}
