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
//! - `queue.rs` (+ `futex.rs`): preallocated hook -> worker slots, futex sleeps.
//! - `worker.rs`: the `fh-revoke` thread: `Firehose::invalidate`, progress until
//!   `invalidation_done`, wake the waiter.
//! - `settings.rs`: `FH_REMOTE_INVALIDATION`, `FH_REVOKE_TIMEOUT`, `FH_REVOKE_STALL`.
//!
//! Owns: the table, the queue, the worker thread, the subscription. May call: `monitor`
//! (subscribe), `inside`, `firehose::InvalId`; reaches the `Rma` only through `worker::Driver`.
//! Teardown order (`Revocation::stop`): close the queue (waiters return, the worker ends), drop
//! the subscription (waits for listener calls in flight), join the worker.

mod futex;
mod listener;
pub mod pinned;
pub mod queue;
pub mod settings;
pub mod worker;

pub use pinned::{Overlap, PinnedRanges};
pub use settings::RevokeSettings;
pub use worker::Driver;

use crate::monitor::{self, MemoryListener, Subscription};
use crate::rt::status::{fh_status, FhResult};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

/// Counters (hook side and worker side).
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub started: AtomicU64,
    pub completed: AtomicU64,
    pub timeouts: AtomicU64,
    pub stalls: AtomicU64,
    pub waits: AtomicU64,
    pub detached: AtomicU64,
    pub fast_returns: AtomicU64,
    pub sweeps: AtomicU64,
    pub written_off: AtomicU64,
    pub holders_given_up: AtomicU64,
    pub wait_ns: AtomicU64,
    pub wait_ns_max: AtomicU64,
}

/// A snapshot of the remote-invalidation counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RevokeStats {
    /// Revocations the worker started (one per queued range or sweep).
    pub started: u64,
    /// ... and saw finished (every holder acked, the memory unpinned).
    pub completed: u64,
    /// Unmapping threads that stopped waiting after `FH_REVOKE_TIMEOUT`.
    pub timeouts: u64,
    /// ... and those in libc's heap trimming that stopped waiting because the worker showed no
    /// progress for `FH_REVOKE_STALL` (blocked, likely on a lock that libc call holds).
    pub stalls: u64,
    /// Unmapping threads that waited for a revocation.
    pub waits: u64,
    /// Ranges queued with nobody waiting (library threads, userfaultfd, `fh_notify_unmapped`).
    pub detached: u64,
    /// Unmaps that touched nothing pinned for peers (the hook returned at once).
    pub fast_returns: u64,
    /// Sweeps (everything revoked) because every queue slot was busy.
    pub sweeps: u64,
    /// Revocations ended by giving up on holders that had not acked within
    /// [`Driver::holder_bound`] (`FH_AM_TIMEOUT_MS`), and how many holders that was (each
    /// declared lost: it counts as having acked).
    pub written_off: u64,
    pub holders_given_up: u64,
    /// Time unmapping threads spent waiting, in total and the longest one (ns).
    pub wait_ns: u64,
    pub wait_ns_max: u64,
}

/// What the listener, the worker and the target's pins share.
pub(crate) struct Shared {
    pub pinned: Arc<PinnedRanges>,
    pub queue: queue::RevokeQueue,
    pub settings: RevokeSettings,
    pub stats: Counters,
    /// Set in the child of a fork: nothing here may be used there.
    pub forked: AtomicBool,
}

impl Shared {
    pub fn new(settings: RevokeSettings, slots: usize) -> Arc<Shared> {
        Arc::new(Shared {
            pinned: Arc::new(PinnedRanges::new()),
            queue: queue::RevokeQueue::new(slots),
            settings,
            stats: Counters::default(),
            forked: AtomicBool::new(false),
        })
    }

    pub fn snapshot(&self) -> RevokeStats {
        let s = &self.stats;
        RevokeStats {
            started: s.started.load(Relaxed),
            completed: s.completed.load(Relaxed),
            timeouts: s.timeouts.load(Relaxed),
            stalls: s.stalls.load(Relaxed),
            waits: s.waits.load(Relaxed),
            detached: s.detached.load(Relaxed),
            fast_returns: s.fast_returns.load(Relaxed),
            sweeps: s.sweeps.load(Relaxed),
            written_off: s.written_off.load(Relaxed),
            holders_given_up: s.holders_given_up.load(Relaxed),
            wait_ns: s.wait_ns.load(Relaxed),
            wait_ns_max: s.wait_ns_max.load(Relaxed),
        }
    }
}

/// The mechanism of one context: the table its target pins keep, the listener and the worker.
/// Dropping it stops everything.
pub struct Revocation {
    shared: Arc<Shared>,
    subscription: Option<Subscription>,
    worker: Option<crate::rt::raw_thread::RawThread>,
}

impl Revocation {
    /// Nothing runs yet: hand [`Revocation::pinned`] to the pins, then [`Revocation::start`].
    /// `slots`: queue slots ([`queue::DEFAULT_SLOTS`]; more concurrent waiters start sweeps).
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
    /// `FH_ERR_TOO_MANY_CACHES` when no listener slot is left (a context whose unmaps nobody
    /// sees must not pin for peers). Call once.
    pub fn start(&mut self, driver: Box<dyn worker::Driver>) -> FhResult<()> {
        let listener = Arc::new(listener::RevokeListener(self.shared.clone()));
        let subscription = monitor::subscribe(listener as Arc<dyn MemoryListener>);
        if !subscription.is_active() {
            return Err(fh_status::FH_ERR_TOO_MANY_CACHES);
        }
        let sh = self.shared.clone();
        // A plain pthread: see `raw_thread.rs`.
        let worker = crate::rt::raw_thread::spawn(c"fh-revoke", move || worker::run(sh, driver))
            .map_err(|_| fh_status::FH_ERR_NO_MEMORY)?;
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
