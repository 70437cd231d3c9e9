//! firehose: an RDMA registration cache (pin-down cache with invalidation) behind a C ABI.
//!
//! Layers, one folder each, top to bottom (a layer imports only layers below it; the map, the
//! seams, the lock order and the threads are in ARCHITECTURE.md):
//! `ffi` (C exports) -> `assembly` (a cache and its helper, also for the shim) and `rma`
//! (puts/gets, drives `firehose_proto`) -> `net` -> `config` ->
//! `helper` -> `cache` (index, refcounts, LRU, limits) and `monitor` (userfaultfd + libc entry
//! hooks + `fh_notify_unmapped`), which meet only at `rt::seam` -> `pin` (verbs | mlock |
//! counting) -> `rt` (runtime leaves: fork, inside, threads).
//!
//! The C API (`ffi`, `include/firehose.h`) is the interface. The layer modules are public for
//! the white-box tests (`tests/`) only; the shim and the benchmarks go through the hidden facade
//! `internals`, which lists exactly what they use.

#![warn(unreachable_pub)]

/// One assembly of a cache, for the C API and the shim.
#[doc(hidden)]
pub mod assembly;
pub mod cache;
pub mod config;
pub mod ffi;
pub mod helper;
#[doc(hidden)]
pub mod internals;
pub mod monitor;
pub mod net;
pub mod pin;
pub mod rma;
pub mod rt;

// The runtime layer's public modules, also at the crate root where callers have always found
// them (`firehose::inside`, ...), and the C API's status codes (`firehose::status::fh_status`).
pub use ffi::status;
#[doc(hidden)]
pub use rt::race_once;
pub use rt::{inside, log, seam};
