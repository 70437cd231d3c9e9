//! Remote memory access: `fh_put` / `fh_get` to any address of any rank. The I/O half of
//! Firehose: it feeds the sans-IO algorithm (`firehose_proto`) with requests, messages and
//! completions, and carries out what it asks for (active messages, RDMA, pins at the target).
//!
//! Owns: the operation table (non-blocking handles), the target's remote-pinned regions, the
//! local registrations of the caller's buffers (through the pin-down cache).
//! May call: `firehose_proto` (the algorithm, a crate of its own), `net` (peers, active messages, one-sided link ops;
//! `net::sim` only in `sim_pins`, the simulated target pins for tests and benchmarks),
//! `cache` (local registration), `pin::verbs` (memory regions for remote pins), `monitor`
//! (subscribe the revoke listener, userfaultfd watches of remote pins), `rt`.
//!
//! `agree`: the settings every rank must share, compared at `fh_init`.
//!
//! `bounce`: registered slots that short gets read into (copied to the caller's buffer when
//! they end), so a short get, like a short inline put, needs no local registration.
//!
//! `expose`: what peers may pin, read and write here (`FH_EXPOSE`, `fh_expose`), checked
//! before every pin and every put written by the target itself.
//!
//! `revoke/`: remote invalidation wired to the memory monitor (memory this rank unmaps is
//! revoked from every peer's firehoses before the unmap returns).
//!
//! `windows`: memory windows (`FH_MW`): each holder of a region gets a key of its own, bound
//! through its queue pair, that dies when it lets go of the region.
//!
//! `sim_pins`: for simulation and tests, the target's pins over `net::sim` (`Rma::with_pins`),
//! so the whole driver runs natively with ranks as threads and no device.

pub mod agree;
mod bounce;
mod done_board;
pub(crate) mod engine;
mod error;
pub mod expose;
mod ops;
mod probe;
pub mod revoke;
pub(crate) mod self_copy;
#[cfg(any(test, feature = "test-support"))]
pub mod sim_pins;
mod slab;
pub(crate) mod target_pins;
pub(crate) mod windows;

#[cfg(any(test, feature = "test-support"))]
pub use engine::FIREHOSE_AM;
pub use engine::{Rma, RmaStats};
pub use error::RmaError;
