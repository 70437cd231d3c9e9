//! The libibverbs backend for pinning: thin RAII wrappers, one file per verbs object (device list,
//! context, protection domain, memory region, memory window), and `VerbsPinner`. Queue pairs, completion queues,
//! completion channels and addressing are messaging, not pinning: they live in `net::verbs`.
//!
//! Ownership mirrors the verbs object tree: an `Mr` holds an `Arc<Pd>`, a `Pd` holds an
//! `Arc<Context>` (and so do `net::verbs`' CQs and QPs). So dropping in any order frees children
//! before parents, and a parent's destroy call never fails with EBUSY because of a live child we own.
//!
//! Only this module and `net/verbs` touch libibverbs.

mod context;
mod device;
pub(crate) mod direct;
mod error;
mod mr;
mod mw;
mod pd;
mod pinner;

pub use context::{Context, Gid};
pub use device::{open_device, DeviceList};
pub use error::{VerbsError, VerbsResult};
pub use mr::Mr;
pub use mw::Mw;
pub use pd::Pd;
pub use pinner::VerbsPinner;
