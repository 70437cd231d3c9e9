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
pub mod ffi;
pub mod helper;
pub mod log;
pub mod monitor;
pub mod net;
pub mod pin;
pub mod rma;
pub mod rt;

// The runtime layer's public modules, also at the crate root where callers have always found
// them (`firehose::status::FhResult`, ...).
#[doc(hidden)]
pub use rt::race_once;
pub use rt::{inside, seam, status};
