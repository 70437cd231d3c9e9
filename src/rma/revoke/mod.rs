//! Remote invalidation, wired: when this rank unmaps memory that peers hold firehoses on, the
//! firehoses are revoked (and the memory unpinned) before the application's `munmap`/`free`
//! returns, so no put issued after that lands in the old pages, and a later put to new memory
//! at the same address pins and reaches the new pages.
//!
//! Pieces (the monitor holds no rma state: it only calls the listener through the seam):
//! - `pinned.rs`: the ranges pinned for peers, kept by `TargetPins` (inserted before each
//!   registration, removed after each deregistration), checked by the hook without a lock.
//! - `listener.rs`: the `MemoryListener`: after a hooked unmap (`UnmapEvent::Done`), if the
//!   range overlaps, queue it and wait (bounded by `FH_REVOKE_TIMEOUT`; in a call libc made
//!   itself, also by `FH_REVOKE_STALL` without progress of the worker).
//! - `queue.rs` (+ `rt::futex`): preallocated hook -> worker slots, futex sleeps.
//! - `worker.rs`: the `fh-revoke` thread: `Firehose::invalidate`, progress until
//!   `invalidation_done`, wake the waiter.
//! - `shared.rs`: what the listener, the worker and the target's pins share, and the counters.
//! - `settings.rs`: `FH_REMOTE_INVALIDATION`, `FH_REVOKE_TIMEOUT`, `FH_REVOKE_STALL`.
//!
//! Owns: the table, the queue, the worker thread, the subscription. May call: `monitor`
//! (subscribe), `inside`, `firehose::InvalId`; reaches the `Rma` only through `worker::Driver`.
//! Teardown order (`Revocation::stop`): close the queue (waiters return, the worker ends), drop
//! the subscription (waits for listener calls in flight), join the worker.

mod listener;
pub(crate) mod pinned;
pub(crate) mod queue;
pub(crate) mod settings;
mod shared;
pub(crate) mod worker;

#[cfg(any(test, feature = "test-support"))]
pub use pinned::Overlap;
pub use pinned::PinnedRanges;
pub use settings::RevokeSettings;
pub use shared::RevokeStats;
pub use worker::Driver;

use crate::monitor::{self, MemoryListener, Subscription};
use crate::rma::RmaError;
use shared::Shared;
use std::sync::Arc;

/// The mechanism of one context: the table its target pins keep, the listener and the worker.
/// Dropping it stops everything.
pub struct Revocation {
    shared: Arc<Shared>,
    subscription: Option<Subscription>,
    worker: Option<crate::rt::raw_thread::RawThread>,
}

impl Revocation {
    /// Nothing runs yet: hand [`Revocation::pinned`] to the pins, then [`Revocation::start`].
    /// `slots`: queue slots (`queue::DEFAULT_SLOTS`; more concurrent waiters start sweeps).
    pub fn new(settings: RevokeSettings, slots: usize) -> Revocation {
        Revocation {
            shared: Shared::new(settings, slots),
            subscription: None,
            worker: None,
        }
    }

    /// The table of ranges pinned for peers (the target's pins insert and remove).
    pub fn pinned(&self) -> Arc<PinnedRanges> {
        self.shared.pinned.clone()
    }

    /// Subscribes the listener and starts the `fh-revoke` worker on `driver`.
    /// `RmaError::TooManyCaches` when no listener slot is left (a context whose unmaps nobody
    /// sees must not pin for peers). Call once.
    pub fn start(&mut self, driver: Box<dyn worker::Driver>) -> Result<(), RmaError> {
        let listener = Arc::new(listener::RevokeListener(self.shared.clone()));
        let subscription = monitor::subscribe(listener as Arc<dyn MemoryListener>);
        if !subscription.is_active() {
            return Err(RmaError::TooManyCaches);
        }
        let sh = self.shared.clone();
        // A plain pthread: see `raw_thread.rs`.
        let worker = crate::rt::raw_thread::spawn(c"fh-revoke", move || worker::run(sh, driver))
            .map_err(|_| RmaError::NoMemory)?;
        self.subscription = Some(subscription);
        self.worker = Some(worker);
        Ok(())
    }

    pub fn stats(&self) -> RevokeStats {
        self.shared.snapshot()
    }

    /// Stops: waiters return, the listener is unsubscribed, the worker is joined (unless this
    /// is the worker itself, dropping the last reference to its context). Idempotent.
    pub fn stop(&mut self) {
        self.shared.queue.close();
        drop(self.subscription.take());
        if let Some(h) = self.worker.take() {
            if !h.is_current() {
                h.join();
            }
        }
    }
}

impl Drop for Revocation {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests;
