//! The helper thread of Li, Cameron, Nikolopoulos, de Supinski, Schulz, "Scalable Memory
//! Registration for High Performance Networks Using Helper Threads" (CF 2011):
//! registration and deregistration moved off the callers' critical path, with a predictor that
//! pins a region again shortly before its next use and unpins idle regions in between, so less
//! memory stays pinned than with a lazy cache at no cost to communication.
//!
//! May call: `cache` (its prefetch/unpin API), `monitor` (subscribe as a listener, install the
//! hooks' `UnmapWindows`), `pin`, `rt`. Nothing calls it but `ffi`, `config` (its settings
//! types) and the preload shim.
//!
//! What this folder owns: the predictor (`signature.rs`, `predictor.rs`), the cost model
//! (`cost.rs`), the registration queue (`rq.rs`), the event queue fed by the callers
//! (`events.rs`), the handles it watches for their release (`releases.rs`), and the decisions
//! (`planner.rs`). All of them are sans-IO: no thread, no clock (times are arguments; `clock.rs`
//! is the one place that reads it), no cache, so they are tested on a simulated clock (`sim.rs`,
//! a model of the cache and of the helper's time, used by `sim_tests.rs` and by the benchmark's
//! modelled rows).
//!
//! Around them: the thread and the callers' front (`thread.rs`), where it may run
//! (`placement.rs`), and the backend wrapper that tells a caller's pin from a hit
//! (`pin_flag.rs`).
//!
//! What it may call: the cache's public API (`register`/`deregister` for the callers,
//! `prefetch`/`evict_range`/`unpin_deferred`/`process_invalidations`/`is_live` on the thread),
//! `crate::pin::Pinner` (calibration and the flagging wrapper), the monitor's unmap log and
//! pins-ahead table (`helper::unmap_log`, `helper::pins_ahead`: what keeps a pin ahead off
//! memory being unmapped), and libc (clock, affinity, /proc). Correctness never depends on anything here: a wrong prediction only means a caller
//! pins synchronously, as without a helper; a region the helper pins goes through the cache's
//! miss path, so the invalidation guarantee covers it.

pub mod clock;
pub mod cost;
pub mod events;
pub mod pin_flag;
pub mod pins_ahead;
pub mod placement;
pub mod planner;
pub(crate) mod predictor;
pub(crate) mod releases;
pub(crate) mod rq;
pub(crate) mod signature;
#[cfg(any(test, feature = "test-support"))]
pub mod sim;
mod thread;
pub mod unmap_log;

use std::sync::Arc;

pub use pin_flag::FlaggingPinner;
pub use pins_ahead::install_unmap_windows;
pub use placement::Placement;
#[cfg(any(test, feature = "test-support"))]
pub use thread::prefetch_checked;
pub use thread::{Helper, HelperConfig, HelperState, HelperStats};

use crate::pin::Pinner;

/// The backend wrapped for a cache that gets a helper (see `pin_flag.rs`).
pub fn wrap_backend(pinner: Arc<dyn Pinner>) -> Arc<dyn Pinner> {
    Arc::new(FlaggingPinner(pinner))
}

#[cfg(test)]
mod sim_tests;
