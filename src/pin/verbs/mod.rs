//! The libibverbs backend: thin RAII wrappers, one file per verbs object, and `VerbsPinner`.
//!
//! Ownership mirrors the verbs object tree: an `Mr`/`Qp` holds an `Arc<Pd>`, a `Pd`/`Cq` holds an
//! `Arc<Context>`, a `Qp` holds its CQs. So dropping in any order frees children before parents,
//! and a parent's destroy call never fails with EBUSY because of a live child we own.
//!
//! Only this module and `net/verbs` touch libibverbs (see ARCHITECTURE.md).

mod context;
mod cq;
mod device;
mod error;
mod mr;
mod path;
mod pd;
mod pinner;
mod qp;

pub use context::{Context, Gid, PortInfo};
pub use cq::{Completion, Cq};
pub use device::{open_device, Device, DeviceList};
pub use error::{VerbsError, VerbsResult};
pub use mr::Mr;
pub use path::{gid_index_from_env, Endpoint, Path, GID_INDEX_ENV};
pub use pd::Pd;
pub use pinner::{device_available, map_reg_errno, verbs_access, VerbsPinner};
pub use qp::{Qp, QpCaps, Sge};

/// Raw `ibv_qp_state` values returned by `Qp::state`.
pub use rdma_sys::ibv_qp_state as qp_state;
/// Raw `ibv_wc_opcode` values callers compare `Completion::opcode` against.
pub use rdma_sys::ibv_wc_opcode as wc_opcode;
