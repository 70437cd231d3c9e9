//! The memory listener: runs inside `munmap` & co. (hook context) and decides, with no
//! allocation and no lock, whether the unmapped range touches memory pinned for peers; if it
//! does, it queues the range for the worker and, when allowed, waits until the revoke is over.
//!
//! When it may wait ([`UnmapEvent::Done`] and [`UnmapEvent::DoneInLibcTrim`] only: after the
//! system call, before the application sees it return): never on a thread inside the library
//! (`crate::rt::inside`: it may hold a lock the worker needs), never in a forked child (no worker
//! there), never with a zero timeout. When libc trims a heap (`DoneInLibcTrim`, from `free` or
//! `malloc_trim`) it holds the arena's mutex, which the worker's next allocation may need, so
//! there the wait also ends once the worker has shown no progress for `FH_REVOKE_STALL`
//! (`tests/hook_revoke_malloc_lock.rs`). Whether the thread is inside the library is read from
//! `crate::rt::inside`'s table, not from a thread-local (a first touch would allocate, possibly under
//! that mutex).
//! `Before` is ignored (the check after the call also catches a pin made during the call);
//! `Late` (userfaultfd: the unmapping thread is already released) and `Told`
//! (`fh_notify_unmapped`, documented as never blocking) only queue.

use super::pinned::Overlap;
use super::queue::Waited;
use super::shared::Shared;
use crate::rt::seam::{MemoryListener, UnmapEvent};
use std::sync::atomic::Ordering::{Relaxed, SeqCst};
use std::sync::Arc;
use std::time::Instant;

/// Tries at a read hold of the pinned table: a thread that may wait can afford to spin longer
/// than one that must not (the uffd reader, the library's own threads).
const TRIES_WAITING: u32 = 4096;
const TRIES_QUICK: u32 = 64;

pub(crate) struct RevokeListener(pub Arc<Shared>);

impl MemoryListener for RevokeListener {
    fn on_unmap(&self, _addr: usize, _len: usize) {
        // Only `on_event` is used: see the module docs.
    }

    fn on_event(&self, addr: usize, len: usize, ev: UnmapEvent) {
        let how = match ev {
            UnmapEvent::Before => return,
            // Whether this thread is inside the library is asked only once the range is known
            // to overlap memory pinned for peers (in `unmapped`): a scan of the table of
            // `crate::rt::inside`, not needed in every hook.
            UnmapEvent::Done => Wait::Full,
            UnmapEvent::DoneInLibcTrim => Wait::WhileWorking,
            UnmapEvent::Late | UnmapEvent::Told | UnmapEvent::Fresh => Wait::Never,
        };
        self.0.unmapped(addr as u64, len as u64, how);
    }

    fn wants_done(&self) -> bool {
        true
    }

    fn forked(&self) {
        // In the child: the worker and the connections are the parent's.
        self.0.forked.store(true, SeqCst);
    }
}

/// Whether the unmapping thread may wait for its revoke.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wait {
    /// No (queue it and return).
    Never,
    /// Until it is done or `FH_REVOKE_TIMEOUT`.
    Full,
    /// As `Full`, but no longer than `FH_REVOKE_STALL` without progress of the worker.
    WhileWorking,
}

impl Shared {
    /// `[addr, addr + len)` lost its pages. Hook-safe.
    pub(crate) fn unmapped(&self, addr: u64, len: u64, how: Wait) {
        let may_wait = how != Wait::Never;
        if self.forked.load(SeqCst) || self.queue.is_closed() {
            return;
        }
        // Quick tries first; a thread that may wait (asked only now: see `on_event`) spins
        // longer for a contended table.
        let mut seen = self.pinned.overlaps(addr, len, TRIES_QUICK);
        let may_wait = may_wait && seen != Overlap::No && !crate::rt::inside::is_inside();
        if seen == Overlap::Busy && may_wait {
            seen = self.pinned.overlaps(addr, len, TRIES_WAITING);
        }
        if seen == Overlap::No {
            self.stats.fast_returns.fetch_add(1, Relaxed);
            return;
        }
        // `FH_REVOKE_STALL=0`: never wait in a trim (queued like a library thread's unmap).
        let wait = may_wait
            && !self.settings.timeout.is_zero()
            && !(how == Wait::WhileWorking && self.settings.stall.is_zero());
        let ticket = self.queue.push(addr, len, !wait);
        if !wait {
            self.stats.detached.fetch_add(1, Relaxed);
            return;
        }
        self.stats.waits.fetch_add(1, Relaxed);
        let t0 = Instant::now(); // clock_gettime through the vDSO: no allocation
        let stall = (how == Wait::WhileWorking).then_some(self.settings.stall);
        match self
            .queue
            .wait_watching(ticket, self.settings.timeout, stall)
        {
            Waited::TimedOut => self.stats.timeouts.fetch_add(1, Relaxed),
            Waited::Stalled => self.stats.stalls.fetch_add(1, Relaxed),
            Waited::Done | Waited::Closed => 0,
        };
        let ns = t0.elapsed().as_nanos().min(u64::MAX as u128) as u64;
        self.stats.wait_ns.fetch_add(ns, Relaxed);
        self.stats.wait_ns_max.fetch_max(ns, Relaxed);
    }
}
