/* Loopback RC connection for C tests that need real verbs: opens a device, allocates a PD and one
 * CQ, creates two RC QPs on the same port and connects them to each other, then posts RDMA WRITE /
 * RDMA READ / SEND / RECV and polls with a timeout (never hangs). Self-contained: only libibverbs.
 *
 * Typical use:
 *     struct vl_loop vl;
 *     int rc = vl_open(&vl, NULL);            // NULL: $FH_DEVICE, $FH_RDMA_DEV, else first device
 *     if (rc == VL_SKIP) { printf("SKIP: %s\n", vl.err); return 77; }
 *     if (rc) { fprintf(stderr, "%s\n", vl.err); return 1; }
 *     ... register memory on vl.pd (e.g. through firehose with cfg.ibv_pd = vl.pd) ...
 *     vl_post_write(&vl, 0, src, len, lkey, (uint64_t)dst, rkey, 1);
 *     if (vl_wait(&vl, 1, 30.0)) { fprintf(stderr, "%s\n", vl.err); return 1; }
 *     vl_close(&vl);
 *
 * Environment: FH_DEVICE / FH_RDMA_DEV (device name), FH_IB_PORT (default 1), FH_GID_INDEX (RoCE
 * GID index; default 1 if populated, else 0; the verbs suite always sets it). Link with -libverbs.
 * The shim's tests (c-tests/preload) use the same helper through vl_open_main and vl_rdma. */
#ifndef FH_VERBS_LOOPBACK_H
#define FH_VERBS_LOOPBACK_H

#include <stddef.h>
#include <stdint.h>

#include <infiniband/verbs.h>

/* vl_open's return value when there is no RDMA device at all (the test should skip). */
#define VL_SKIP 77

struct vl_loop {
    struct ibv_context *ctx;
    struct ibv_pd *pd;
    struct ibv_cq *cq;   /* shared by both QPs, send and receive */
    struct ibv_qp *qp[2]; /* qp[0] and qp[1] are connected to each other */
    uint8_t port;
    int gid_index;       /* -1: no GRH (InfiniBand, LID routed) */
    union ibv_gid gid;
    enum ibv_mtu mtu;
    uint16_t lid;
    int borrowed;        /* ctx and pd are another loop's (vl_open_in): vl_close leaves them */
    char err[256];       /* why the last failing call failed */
};

/* Open and connect. Returns 0, VL_SKIP (no device; reason in vl->err) or -1 (error in vl->err).
 * On failure everything already created is released. */
int vl_open(struct vl_loop *vl, const char *dev_name);

/* Another loop (its own CQ and QPs) in `parent`'s device context and protection domain, as the
 * threads of one program share a PD. Close it before the parent. Returns 0 or -1 (vl->err). */
int vl_open_in(struct vl_loop *vl, const struct vl_loop *parent);

/* vl_open(vl, NULL) for a test's main: the reason goes to stderr; returns 0, VL_SKIP or 1. */
int vl_open_main(struct vl_loop *vl);

/* Post one signalled work request on qp[from] with one SGE. Return 0 or -1 (vl->err). */
int vl_post_write(struct vl_loop *vl, int from, void *local, uint32_t len, uint32_t lkey,
                  uint64_t remote_addr, uint32_t rkey, uint64_t wr_id);
int vl_post_read(struct vl_loop *vl, int from, void *local, uint32_t len, uint32_t lkey,
                 uint64_t remote_addr, uint32_t rkey, uint64_t wr_id);
int vl_post_send(struct vl_loop *vl, int from, void *local, uint32_t len, uint32_t lkey,
                 uint64_t wr_id);
int vl_post_recv(struct vl_loop *vl, int on, void *local, uint32_t len, uint32_t lkey,
                 uint64_t wr_id);

/* Poll until n completions are in wc[0..n) or timeout_s passes. Returns 0, or -1 on timeout or a
 * poll error (vl->err). Completions with an error status are returned, not judged. */
int vl_poll(struct vl_loop *vl, struct ibv_wc *wc, int n, double timeout_s);

/* Like vl_poll, but every completion must have IBV_WC_SUCCESS; else -1 with the status in err. */
int vl_wait(struct vl_loop *vl, int n, double timeout_s);

/* One RDMA READ or WRITE (op) of len bytes on qp[0] between the local buffer (local, lkey) and
 * the remote one (remote_addr, rkey), waited for (60 s at most). Returns the completion's status
 * (IBV_WC_SUCCESS == 0), or -1 when posting or polling failed (the reason on stderr). */
int vl_rdma(struct vl_loop *vl, enum ibv_wr_opcode op, void *local, uint32_t lkey,
            uint64_t remote_addr, uint32_t rkey, uint32_t len);

/* Destroy QPs, CQ, PD and close the device (MRs on vl->pd must be deregistered before); a loop
 * from vl_open_in leaves its parent's PD and context alone. */
void vl_close(struct vl_loop *vl);

#endif
