//! What the watch side and the reader share: the watch-side state under [`STATE`]'s mutex, the
//! ring of ranges the reader saw go, and the counters and flags both read (atomics).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::Mutex;

use libc::c_int;

use super::super::options::MonitorStatus;
use super::super::prune_ring::PruneRing;
use crate::rt::range_counts::RangeCounts;

/// Watch-side state (the reader only ever `try_lock`s it, when it retires).
pub(super) struct State {
    /// Process that opened `fd` (a forked child must not use its parent's context).
    pub(super) pid: libc::pid_t,
    /// -1 once the reader retired and closed it: nothing is registered, nothing will be.
    pub(super) fd: c_int,
    pub(super) reader_started: bool,
    /// Live watches per address: what must stay registered.
    pub(super) counts: RangeCounts,
    /// Every watch not yet unwatched, by [`WatchKey`].
    pub(super) watches: BTreeMap<WatchKey, Watch>,
    /// Widest extent (asked or counted) of any watch so far: bounds the scan in
    /// [`forget_unmapped`].
    pub(super) widest: usize,
}

/// (start, end) of the page span asked for, (start, end) of the span counted for it: the same
/// normally, wider for hugetlb (see [`register_by_vma`]), (0, 0) when nothing could be registered.
pub(super) type WatchKey = (usize, usize, usize, usize);

/// How many watches with one key are live (counted in [`State::counts`]) or stale: some of their
/// memory was unmapped or moved away since (the reader saw it), so their registration has done its
/// job, and only their `unwatch` is still to come.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Watch {
    pub(super) live: u32,
    pub(super) stale: u32,
}

pub(super) static STATE: Mutex<Option<State>> = Mutex::new(None);
/// Ranges the reader saw unmapped or moved away, for [`sync_events`].
pub(super) static RING: PruneRing = PruneRing::new();

pub(super) static ACTIVE: AtomicBool = AtomicBool::new(false);
/// Set by the reader once its start-up (which may allocate: TLS) is over.
pub(super) static READER_READY: AtomicBool = AtomicBool::new(false);
pub(super) static FEATURES: AtomicU64 = AtomicU64::new(0);
pub(super) static ERRNO: AtomicI32 = AtomicI32::new(0);
pub(super) static REGISTERED: AtomicU64 = AtomicU64::new(0);
pub(super) static UNSUPPORTED: AtomicU64 = AtomicU64::new(0);
pub(super) static EVENTS: AtomicU64 = AtomicU64::new(0);
/// Time spent in [`watch`](super::watch::watch) and [`unwatch`](super::watch::unwatch) (the lock,
/// the ioctls and the event sync), and how many calls: what userfaultfd adds to a cache miss and
/// to an unpin. Relaxed statistics, read by [`watch_costs`].
pub(super) static WATCH_CALLS: AtomicU64 = AtomicU64::new(0);
pub(super) static WATCH_NS: AtomicU64 = AtomicU64::new(0);
pub(super) static UNWATCH_CALLS: AtomicU64 = AtomicU64::new(0);
pub(super) static UNWATCH_NS: AtomicU64 = AtomicU64::new(0);
/// Reader progress, for [`quiesce`]: high 32 bits = batches started (raised before `read`), low
/// 32 bits = batches whose events were all dispatched. One word, so "idle" is one load.
pub(super) static BATCHES: AtomicU64 = AtomicU64::new(0);
/// Pid of the process whose reader is running, 0 when none. A forked child (no reader) sees its
/// parent's pid here and never waits.
pub(super) static READER_PID: AtomicI32 = AtomicI32::new(0);
/// Test hook: the reader treats its next wake-up as a failed `read` (see
/// [`test_fail_reader`]).
pub(super) static FAIL_NEXT_READ: AtomicBool = AtomicBool::new(false);
pub(super) static PAGE: AtomicUsize = AtomicUsize::new(0);

pub(super) fn pack(started: u32, finished: u32) -> u64 {
    (started as u64) << 32 | finished as u64
}

pub(crate) fn fill_status(s: &mut MonitorStatus) {
    s.uffd = ACTIVE.load(SeqCst);
    s.uffd_features = FEATURES.load(SeqCst);
    s.uffd_errno = ERRNO.load(SeqCst);
    s.uffd_registered = REGISTERED.load(SeqCst);
    s.uffd_unsupported = UNSUPPORTED.load(SeqCst);
    s.uffd_events = EVENTS.load(SeqCst);
}

/// What watching cost so far, process-wide: `WatchCosts`.
pub fn watch_costs() -> WatchCosts {
    use std::sync::atomic::Ordering::Relaxed;
    WatchCosts {
        watches: WATCH_CALLS.load(Relaxed),
        watch_ns: WATCH_NS.load(Relaxed),
        unwatches: UNWATCH_CALLS.load(Relaxed),
        unwatch_ns: UNWATCH_NS.load(Relaxed),
    }
}

/// Calls of the userfaultfd watcher that did work (userfaultfd on) and their total time.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WatchCosts {
    pub watches: u64,
    pub watch_ns: u64,
    pub unwatches: u64,
    pub unwatch_ns: u64,
}

pub(super) fn lock_state() -> std::sync::MutexGuard<'static, Option<State>> {
    STATE.lock().unwrap_or_else(|e| e.into_inner())
}
