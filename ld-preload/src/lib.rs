//! `libfirehose_preload.so`: an LD_PRELOAD shim that gives unmodified verbs programs (perftest,
//! Open MPI/UCX, ...) the firehose registration cache.
//!
//! Hooks: `ibv_reg_mr`, `ibv_reg_mr_iova`, `ibv_reg_mr_iova2`, `ibv_dereg_mr`, `ibv_rereg_mr`,
//! `ibv_dealloc_pd`, `ibv_close_device` (`verbs_hooks.rs`) and the libc unmap family
//! (`unmap_hooks.rs`).
//! Flow: depth guard (`guard.rs`) -> dispatch -> per-pd cache (`pd_cache.rs`) whose backend calls
//! the real functions (`real_verbs.rs`, `real_pinner.rs`) -> a wrapper MR (`wrapper.rs`).
//! Settings in `settings.rs`, counters in `counters.rs`, `fh_preload_stats` and `FH_STATS` in
//! `stats.rs`, `fork` in `fork.rs` (the child flag in `process.rs`).
//!
//! Exports: exactly the hooks above and `fh_preload_stats` (`exports.list`); the library's own
//! `fh_*` C ABI is linked in but not exported, and the SONAME is `libfirehose_preload.so`
//! (`build.rs`).

#![warn(unreachable_pub)]

mod bypass;
mod coexist;
mod cost_model;
mod counters;
#[cfg(test)]
mod dispatch_tests;
mod ffi_types;
mod foreign_events;
mod fork;
mod guard;
mod init;
#[cfg(test)]
mod miss_bench;
mod miss_cost;
mod pd_cache;
mod real_libc;
mod real_pinner;
mod real_verbs;
#[cfg(test)]
mod serial;
mod settings;
mod stats;
mod unmap_hooks;
mod verbs_hooks;
mod wrapper;
