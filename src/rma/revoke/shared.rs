//! What the listener, the worker and the target's pins share (a leaf of `revoke`: `mod.rs`
//! starts the pieces, they meet here).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use super::pinned::PinnedRanges;
use super::queue;
use super::settings::RevokeSettings;

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
    /// [`Driver::holder_bound`](super::Driver::holder_bound) (`FH_AM_TIMEOUT_MS`), and how many holders that was (each
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
    pub(crate) fn new(settings: RevokeSettings, slots: usize) -> Arc<Shared> {
        Arc::new(Shared {
            pinned: Arc::new(PinnedRanges::new()),
            queue: queue::RevokeQueue::new(slots),
            settings,
            stats: Counters::default(),
            forked: AtomicBool::new(false),
        })
    }

    pub(crate) fn snapshot(&self) -> RevokeStats {
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
