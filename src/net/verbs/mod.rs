//! The verbs RC transport: RAII wrappers for the messaging objects (queue pair, completion queue,
//! completion channel, addressing), one file each, and later `VerbsLink`, the `net::Link` over
//! them.
//!
//! Owns: QPs, CQs, completion channels, paths/endpoints.
//! May call: libibverbs (rdma-sys), libc, `pin::verbs` (context, protection domain, memory region,
//! errors), `net::link`/`net::bootstrap` (the seams it implements and uses).
//! Ownership mirrors the verbs object tree: a `Qp` holds an `Arc` of its PD and CQs, a `Cq` of its
//! context and completion channel. Dropping in any order frees children before parents.

mod comp_channel;
mod cq;
mod path;
mod qp;

pub use comp_channel::CompChannel;
pub use cq::{Completion, Cq, POLL_BATCH};
pub use path::{gid_index_from_env, Endpoint, Path, GID_INDEX_ENV};
pub use qp::{Qp, QpCaps, QpTiming, SendFlags, Sge};

/// Raw `ibv_qp_state` values returned by `Qp::state`.
pub use rdma_sys::ibv_qp_state as qp_state;
/// Raw `ibv_wc_opcode` values callers compare `Completion::opcode` against.
pub use rdma_sys::ibv_wc_opcode as wc_opcode;
/// Raw `ibv_wc_status` values callers compare `Completion::status` against.
pub use rdma_sys::ibv_wc_status as wc_status;
