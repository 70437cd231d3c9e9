/* See verbs_loopback.h. Kept independent of firehose so a C test can check firehose's keys with a
 * transfer that firehose itself did not set up. */
#define _GNU_SOURCE
#include "verbs_loopback.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define VL_PSN0 0x1234u
#define VL_PSN1 0x5678u

static int vl_fail(struct vl_loop *vl, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(vl->err, sizeof vl->err, fmt, ap);
    va_end(ap);
    return -1;
}

static int env_int(const char *name, int dflt)
{
    const char *v = getenv(name);
    char *end;
    long x;
    if (!v || !*v)
        return dflt;
    x = strtol(v, &end, 10);
    return (*end || x < 0 || x > 255) ? -2 : (int)x;
}

static int gid_is_zero(const union ibv_gid *g)
{
    static const uint8_t zero[16];
    return memcmp(g->raw, zero, sizeof zero) == 0;
}

/* Choose port attributes and the source GID (see the header for the GID index rule). */
static int vl_path(struct vl_loop *vl)
{
    struct ibv_port_attr pa;
    int want = env_int("FH_GID_INDEX", -1);
    int port = env_int("FH_IB_PORT", 1);
    union ibv_gid g1;

    if (want == -2 || port <= 0)
        return vl_fail(vl, "bad FH_GID_INDEX or FH_IB_PORT");
    vl->port = (uint8_t)port;
    memset(&pa, 0, sizeof pa);
    if (ibv_query_port(vl->ctx, vl->port, &pa))
        return vl_fail(vl, "ibv_query_port(%d): %s", port, strerror(errno));
    if (pa.state != IBV_PORT_ACTIVE)
        return vl_fail(vl, "port %d is not active (state %d)", port, (int)pa.state);
    vl->mtu = pa.active_mtu;
    vl->lid = pa.lid;
    if (want >= 0)
        vl->gid_index = want;
    else if (pa.link_layer == IBV_LINK_LAYER_ETHERNET)
        vl->gid_index = (pa.gid_tbl_len > 1 && ibv_query_gid(vl->ctx, vl->port, 1, &g1) == 0 &&
                         !gid_is_zero(&g1)) ? 1 : 0;
    else
        vl->gid_index = -1;
    if (vl->gid_index >= 0) {
        if (ibv_query_gid(vl->ctx, vl->port, vl->gid_index, &vl->gid))
            return vl_fail(vl, "ibv_query_gid(%d): %s", vl->gid_index, strerror(errno));
        if (gid_is_zero(&vl->gid))
            return vl_fail(vl, "GID index %d is empty", vl->gid_index);
    }
    return 0;
}

/* RESET -> INIT -> RTR -> RTS for qp[i], pointed at qp[1 - i]. */
static int vl_connect_one(struct vl_loop *vl, int i)
{
    struct ibv_qp_attr a;
    struct ibv_qp *qp = vl->qp[i];
    uint32_t my_psn = i ? VL_PSN1 : VL_PSN0, peer_psn = i ? VL_PSN0 : VL_PSN1;
    int rc;

    memset(&a, 0, sizeof a);
    a.qp_state = IBV_QPS_INIT;
    a.port_num = vl->port;
    a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
    rc = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
    if (rc)
        return vl_fail(vl, "ibv_modify_qp(INIT) qp %d: %s", i, strerror(rc));

    memset(&a, 0, sizeof a);
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = vl->mtu;
    a.dest_qp_num = vl->qp[1 - i]->qp_num;
    a.rq_psn = peer_psn;
    a.max_dest_rd_atomic = 1;
    a.min_rnr_timer = 12;
    a.ah_attr.dlid = vl->lid;
    a.ah_attr.port_num = vl->port;
    if (vl->gid_index >= 0) {
        a.ah_attr.is_global = 1;
        a.ah_attr.grh.dgid = vl->gid; /* same port: the peer's GID is ours */
        a.ah_attr.grh.sgid_index = (uint8_t)vl->gid_index;
        a.ah_attr.grh.hop_limit = 64;
    }
    rc = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                                   IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
    if (rc)
        return vl_fail(vl, "ibv_modify_qp(RTR) qp %d: %s", i, strerror(rc));

    memset(&a, 0, sizeof a);
    a.qp_state = IBV_QPS_RTS;
    a.timeout = 14; /* ~67 ms per retry: Soft-RoCE under TCG is slow */
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.sq_psn = my_psn;
    a.max_rd_atomic = 1;
    rc = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                                   IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
    if (rc)
        return vl_fail(vl, "ibv_modify_qp(RTS) qp %d: %s", i, strerror(rc));
    return 0;
}

static struct ibv_device *vl_pick(struct ibv_device **devs, int n, const char *name)
{
    int i;
    if (!name)
        return n > 0 ? devs[0] : NULL;
    for (i = 0; i < n; i++)
        if (strcmp(ibv_get_device_name(devs[i]), name) == 0)
            return devs[i];
    return NULL;
}

/* The CQ and the two QPs, connected to each other, in vl's context and PD. */
static int vl_qps(struct vl_loop *vl)
{
    struct ibv_qp_init_attr init;
    int i;

    vl->cq = ibv_create_cq(vl->ctx, 64, NULL, NULL, 0);
    if (!vl->cq)
        return vl_fail(vl, "ibv_create_cq: %s", strerror(errno));
    for (i = 0; i < 2; i++) {
        memset(&init, 0, sizeof init);
        init.send_cq = vl->cq;
        init.recv_cq = vl->cq;
        init.cap.max_send_wr = 32;
        init.cap.max_recv_wr = 32;
        init.cap.max_send_sge = 1;
        init.cap.max_recv_sge = 1;
        init.qp_type = IBV_QPT_RC;
        init.sq_sig_all = 1;
        vl->qp[i] = ibv_create_qp(vl->pd, &init);
        if (!vl->qp[i])
            return vl_fail(vl, "ibv_create_qp: %s", strerror(errno));
    }
    for (i = 0; i < 2; i++)
        if (vl_connect_one(vl, i))
            return -1;
    return 0;
}

/* vl_close after a failed open, keeping the reason. */
static void vl_close_keep_err(struct vl_loop *vl)
{
    char saved[sizeof vl->err];
    memcpy(saved, vl->err, sizeof saved);
    vl_close(vl);
    memcpy(vl->err, saved, sizeof saved);
}

int vl_open(struct vl_loop *vl, const char *dev_name)
{
    struct ibv_device **devs;
    struct ibv_device *dev;
    int n = 0;

    memset(vl, 0, sizeof *vl);
    if (!dev_name)
        dev_name = getenv("FH_DEVICE");
    if (!dev_name || !*dev_name)
        dev_name = getenv("FH_RDMA_DEV");
    if (dev_name && !*dev_name)
        dev_name = NULL;

    devs = ibv_get_device_list(&n);
    if (!devs) {
        snprintf(vl->err, sizeof vl->err, "no RDMA device (ibv_get_device_list: %s)", strerror(errno));
        return VL_SKIP;
    }
    if (n == 0) {
        ibv_free_device_list(devs);
        snprintf(vl->err, sizeof vl->err, "no RDMA device (empty device list)");
        return VL_SKIP;
    }
    dev = vl_pick(devs, n, dev_name);
    if (!dev) {
        ibv_free_device_list(devs);
        return vl_fail(vl, "no device named %s", dev_name);
    }
    vl->ctx = ibv_open_device(dev);
    ibv_free_device_list(devs); /* an opened context stays valid */
    if (!vl->ctx)
        return vl_fail(vl, "ibv_open_device: %s", strerror(errno));
    if (vl_path(vl))
        goto fail;
    vl->pd = ibv_alloc_pd(vl->ctx);
    if (!vl->pd) {
        vl_fail(vl, "ibv_alloc_pd: %s", strerror(errno));
        goto fail;
    }
    if (vl_qps(vl))
        goto fail;
    return 0;
fail:
    vl_close_keep_err(vl);
    return -1;
}

int vl_open_in(struct vl_loop *vl, const struct vl_loop *parent)
{
    memset(vl, 0, sizeof *vl);
    vl->ctx = parent->ctx;
    vl->pd = parent->pd;
    vl->port = parent->port;
    vl->gid_index = parent->gid_index;
    vl->gid = parent->gid;
    vl->mtu = parent->mtu;
    vl->lid = parent->lid;
    vl->borrowed = 1;
    if (vl_qps(vl)) {
        vl_close_keep_err(vl);
        return -1;
    }
    return 0;
}

int vl_open_main(struct vl_loop *vl)
{
    int rc = vl_open(vl, NULL);
    if (rc)
        fprintf(stderr, "%s\n", vl->err);
    return rc == 0 ? 0 : rc == VL_SKIP ? VL_SKIP : 1;
}

static int vl_post(struct vl_loop *vl, int from, enum ibv_wr_opcode op, void *local, uint32_t len,
                   uint32_t lkey, uint64_t remote_addr, uint32_t rkey, uint64_t wr_id)
{
    struct ibv_sge sge = { .addr = (uintptr_t)local, .length = len, .lkey = lkey };
    struct ibv_send_wr wr, *bad = NULL;
    int rc;

    if (from < 0 || from > 1)
        return vl_fail(vl, "bad QP index %d", from);
    memset(&wr, 0, sizeof wr);
    wr.wr_id = wr_id;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = op;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.rdma.remote_addr = remote_addr;
    wr.wr.rdma.rkey = rkey;
    rc = ibv_post_send(vl->qp[from], &wr, &bad);
    if (rc)
        return vl_fail(vl, "ibv_post_send: %s", strerror(rc));
    return 0;
}

int vl_post_write(struct vl_loop *vl, int from, void *local, uint32_t len, uint32_t lkey,
                  uint64_t remote_addr, uint32_t rkey, uint64_t wr_id)
{
    return vl_post(vl, from, IBV_WR_RDMA_WRITE, local, len, lkey, remote_addr, rkey, wr_id);
}

int vl_post_read(struct vl_loop *vl, int from, void *local, uint32_t len, uint32_t lkey,
                 uint64_t remote_addr, uint32_t rkey, uint64_t wr_id)
{
    return vl_post(vl, from, IBV_WR_RDMA_READ, local, len, lkey, remote_addr, rkey, wr_id);
}

int vl_post_send(struct vl_loop *vl, int from, void *local, uint32_t len, uint32_t lkey,
                 uint64_t wr_id)
{
    return vl_post(vl, from, IBV_WR_SEND, local, len, lkey, 0, 0, wr_id);
}

int vl_post_recv(struct vl_loop *vl, int on, void *local, uint32_t len, uint32_t lkey,
                 uint64_t wr_id)
{
    struct ibv_sge sge = { .addr = (uintptr_t)local, .length = len, .lkey = lkey };
    struct ibv_recv_wr wr = { .wr_id = wr_id, .next = NULL, .sg_list = &sge, .num_sge = 1 };
    struct ibv_recv_wr *bad = NULL;
    int rc;

    if (on < 0 || on > 1)
        return vl_fail(vl, "bad QP index %d", on);
    rc = ibv_post_recv(vl->qp[on], &wr, &bad);
    if (rc)
        return vl_fail(vl, "ibv_post_recv: %s", strerror(rc));
    return 0;
}

static double vl_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int vl_poll(struct vl_loop *vl, struct ibv_wc *wc, int n, double timeout_s)
{
    double deadline = vl_now() + timeout_s;
    int got = 0, r;

    while (got < n) {
        r = ibv_poll_cq(vl->cq, n - got, wc + got);
        if (r < 0)
            return vl_fail(vl, "ibv_poll_cq returned %d", r);
        got += r;
        if (r == 0 && vl_now() > deadline)
            return vl_fail(vl, "timed out after %.1f s with %d of %d completions", timeout_s, got, n);
    }
    return 0;
}

int vl_wait(struct vl_loop *vl, int n, double timeout_s)
{
    struct ibv_wc wc[64];
    int i;

    if (n < 1 || n > 64)
        return vl_fail(vl, "vl_wait: n=%d out of range", n);
    if (vl_poll(vl, wc, n, timeout_s))
        return -1;
    for (i = 0; i < n; i++)
        if (wc[i].status != IBV_WC_SUCCESS)
            return vl_fail(vl, "wr_id %llu completed with %s (vendor_err %#x)",
                           (unsigned long long)wc[i].wr_id, ibv_wc_status_str(wc[i].status),
                           wc[i].vendor_err);
    return 0;
}

int vl_rdma(struct vl_loop *vl, enum ibv_wr_opcode op, void *local, uint32_t lkey,
            uint64_t remote_addr, uint32_t rkey, uint32_t len)
{
    struct ibv_wc wc;

    if (vl_post(vl, 0, op, local, len, lkey, remote_addr, rkey, 1) || vl_poll(vl, &wc, 1, 60.0)) {
        fprintf(stderr, "%s\n", vl->err);
        return -1;
    }
    return (int)wc.status;
}

void vl_close(struct vl_loop *vl)
{
    int i;
    for (i = 0; i < 2; i++)
        if (vl->qp[i])
            ibv_destroy_qp(vl->qp[i]);
    if (vl->cq)
        ibv_destroy_cq(vl->cq);
    if (vl->borrowed) {
        memset(vl, 0, sizeof *vl);
        return;
    }
    if (vl->pd)
        ibv_dealloc_pd(vl->pd);
    if (vl->ctx)
        ibv_close_device(vl->ctx);
    memset(vl, 0, sizeof *vl);
}
