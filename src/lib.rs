//! firehose: an RDMA registration cache (pin-down cache with invalidation) behind a C ABI.
//!
//! Layers (data flows down, events flow up):
//! `ffi` (C exports) -> `cache` (index, refcounts, LRU, limits) -> `pin` (verbs | mlock | counting);
//! `monitor` (userfaultfd + libc entry hooks + `fh_notify_unmapped`) -> `cache::Cache::invalidate`.

/// One assembly of a cache, for the C API and the shim.
#[doc(hidden)]
pub mod assembly;
pub mod cache;
pub mod config;
mod counted;
pub mod ffi;
pub mod firehose;
mod fork;
pub mod helper;
pub mod inside;
pub mod log;
pub mod monitor;
mod monotonic;
pub mod net;
pub mod pin;
/// A first-use initialiser that never makes a thread wait (fork-safe); shared with the shim.
#[doc(hidden)]
pub mod race_once;
mod range_counts;
pub(crate) mod raw_thread;
pub mod rma;
pub mod seam;
pub mod status;
