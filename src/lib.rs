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
//! The C API (`ffi`, `include/firehose.h`) is the interface. The layer modules are public only
//! with the feature `test-support`, for the white-box tests (`tests/`), and crate-private in the
//! shipped library (so rustc reports dead code); the shim, the benchmarks and the real-verbs
//! test programs go through the hidden facade `internals`, which lists exactly what they use.

#![warn(unreachable_pub)]
// Without `test-support` the layer modules are crate-private, so the `pub` items inside them
// (public to the white-box tests) are unreachable by design; with it, the lint applies.
#![cfg_attr(not(feature = "test-support"), allow(unreachable_pub))]

/// One assembly of a cache, for the C API and the shim.
#[cfg(feature = "test-support")]
#[doc(hidden)]
pub mod assembly;
#[cfg(not(feature = "test-support"))]
pub(crate) mod assembly;
#[cfg(feature = "test-support")]
pub mod cache;
#[cfg(not(feature = "test-support"))]
pub(crate) mod cache;
#[cfg(feature = "test-support")]
pub mod config;
#[cfg(not(feature = "test-support"))]
pub(crate) mod config;
pub mod ffi;
#[cfg(feature = "test-support")]
pub mod helper;
#[cfg(not(feature = "test-support"))]
pub(crate) mod helper;
#[doc(hidden)]
pub mod internals;
#[cfg(feature = "test-support")]
pub mod monitor;
#[cfg(not(feature = "test-support"))]
pub(crate) mod monitor;
#[cfg(feature = "test-support")]
pub mod net;
#[cfg(not(feature = "test-support"))]
pub(crate) mod net;
#[cfg(feature = "test-support")]
pub mod pin;
#[cfg(not(feature = "test-support"))]
pub(crate) mod pin;
#[cfg(feature = "test-support")]
pub mod rma;
#[cfg(not(feature = "test-support"))]
pub(crate) mod rma;
#[cfg(feature = "test-support")]
pub mod rt;
#[cfg(not(feature = "test-support"))]
pub(crate) mod rt;

// The runtime layer's public modules, also at the crate root where callers have always found
// them (`firehose::inside`, ...), and the C API's status codes (`firehose::status::fh_status`).
pub use ffi::status;
#[doc(hidden)]
pub use rt::race_once;
pub use rt::{inside, log, seam};
