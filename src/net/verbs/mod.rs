//! The verbs RC transport: RAII wrappers for the messaging objects (queue pair, completion queue,
//! completion channel, addressing), one file each, and `VerbsLink`, the `net::Link` over them
//! (link.rs: data path; connect.rs: construction; peer.rs: per-peer state; reg_buf.rs: its
//! registered buffers; endpoint_blob.rs, wr_id.rs, settings.rs: pure encodings, unit-tested
//! without a device).
//!
//! Owns: QPs, CQs, completion channels, paths/endpoints, the link's receive slots and send ring.
//! May call: libibverbs (rdma-sys), libc, `pin::verbs` (context, protection domain, memory region,
//! errors), `net::link`/`net::bootstrap` (the seams it implements and uses).
//! Ownership mirrors the verbs object tree: a `Qp` holds an `Arc` of its PD and CQs, a `Cq` of its
//! context and completion channel. Dropping in any order frees children before parents.

mod comp_channel;
mod connect;
mod cq;
pub(crate) mod endpoint_blob;
mod link;
mod path;
mod peer;
mod qp;
mod reg_buf;
pub(crate) mod settings;
pub(crate) mod windows;
pub(crate) mod wr_id;

pub use connect::VerbsLinkConfig;
pub use cq::{Completion, Cq};
pub use link::VerbsLink;
pub use path::{gid_index_from_env, Path};
pub use qp::{Qp, QpCaps, SendFlags, Sge};
pub use settings::LinkSettings;

/// Raw `ibv_qp_state` values returned by `Qp::state`.
pub use rdma_sys::ibv_qp_state as qp_state;
/// Raw `ibv_wc_opcode` values callers compare `Completion::opcode` against.
pub use rdma_sys::ibv_wc_opcode as wc_opcode;
