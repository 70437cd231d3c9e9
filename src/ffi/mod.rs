//! The C ABI (`include/firehose.h` is generated from this module by cbindgen, see `build.rs`).
//!
//! The top layer. Owns: the C types and exports, the context (`fh_init`), the wiring of the
//! layers below (a cache's backend, its monitor subscription and watcher, the helper's unmap
//! windows, the helper thread). May call: every layer.
//!
//! Rules every export follows (style of rustls-ffi):
//! - thin: validate pointers, call into `cache`/`monitor`, convert the result; no logic here;
//! - one panic boundary, `guard::ffi_guard!`, around every body: a panic is `FH_ERR_PANIC`;
//! - every `Arc` <-> raw pointer conversion lives in [`handle`];
//! - output parameters are written only on success; `_free`-style functions accept NULL;
//! - NULL, zero length, overflow, bad access bits and unknown handles return a status and change
//!   nothing.

// C names (fh_cache, fh_mr...) are the ABI; Rust naming rules do not apply to them.
#![allow(non_camel_case_types)]

pub mod backend;
pub mod bootstrap_ops;
pub mod cache_object;
pub mod config;
pub mod ctx;
mod errors;
pub mod expose;
pub mod guard;
pub mod handle;
pub mod info;
pub mod lifecycle;
pub mod log;
pub mod notify;
pub mod ops;
pub mod rma;
pub mod status;
pub mod types;

pub use bootstrap_ops::{fh_allgather_fn, fh_barrier_fn, fh_bootstrap_ops};
pub use cache_object::fh_cache;
pub use config::fh_config_init;
pub use ctx::{
    fh_barrier, fh_ctx, fh_finalize, fh_get_net_stats, fh_init, fh_init_config, fh_net_stats,
    fh_progress, fh_rank, fh_size,
};
pub use info::{
    fh_get_helper_stats, fh_get_stats, fh_info, fh_print_info, fh_status_str, fh_version,
};
pub use lifecycle::{fh_cache_finalize, fh_cache_free, fh_cache_new};
pub use log::{fh_log_callback, fh_log_level, fh_set_log_callback, fh_set_log_level};
pub use notify::fh_notify_unmapped;
pub use ops::{fh_deregister, fh_flush, fh_get_limits, fh_register, fh_set_limits};
pub use types::*;

#[cfg(test)]
mod tests;
