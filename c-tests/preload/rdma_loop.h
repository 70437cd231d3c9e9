/* A loopback RC queue pair on one RDMA device, for the shim's C tests: the QP is connected to
 * itself, so RDMA READ/WRITE through any (lkey, rkey) of this process exercise the real HCA path
 * (on Soft-RoCE: the kernel's rxe copy through the pinned pages). */
#ifndef FH_RDMA_LOOP_H
#define FH_RDMA_LOOP_H

#include <infiniband/verbs.h>
#include <stddef.h>
#include <stdint.h>

struct loop {
    struct ibv_context *ctx;
    struct ibv_pd *pd;
    struct ibv_cq *cq;
    struct ibv_qp *qp;
    int borrowed; /* ctx and pd are another loop's (loop_open_in) */
};

/* Open $FH_RDMA_DEV (or the first device), port $FH_IB_PORT (1), GID $FH_GID_INDEX (0).
 * Returns 0, or 77 when there is no device (the suite's "skip"), or 1 on any other failure. */
int loop_open(struct loop *l);
/* Another loop (its own CQ and QP) in `parent`'s device context and protection domain, as the
 * threads of one program share a PD. Close it before the parent. Returns 0 or 1. */
int loop_open_in(struct loop *l, const struct loop *parent);
void loop_close(struct loop *l);

/* One signalled RDMA READ (opcode IBV_WR_RDMA_READ) or WRITE of len bytes between the local
 * buffer (laddr, lkey) and the remote one (raddr, rkey), waited for. Returns the work completion
 * status (IBV_WC_SUCCESS == 0) or -1 when posting/polling failed. */
int loop_rdma(struct loop *l, enum ibv_wr_opcode op, void *laddr, uint32_t lkey, uint64_t raddr,
              uint32_t rkey, uint32_t len);

/* The shim's counters (ld-preload/include/firehose_preload.h); NULL without the shim. */
struct fh_preload_stats;
int (*loop_stats_fn(void))(struct fh_preload_stats *, size_t);

#endif
