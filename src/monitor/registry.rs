//! Listener registry: slots that hook context reads without locks, in chunks allocated on demand.
//!
//! Why no lock and no allocation on the read side: `notify_unmapped` runs inside patched libc
//! functions (possibly inside malloc) and on the userfaultfd reader thread. Each slot holds a thin
//! pointer to a boxed `Arc<dyn MemoryListener>` plus an in-flight counter; unsubscribe clears the
//! pointer, then waits for the counter to reach zero so the listener is never called after
//! `Subscription::drop` returns.
//!
//! Capacity: there is one listener per cache, and the shim makes one cache per (protection domain,
//! rights class), so the number is the application's, not ours. Slots come in chunks of [`CHUNK`]
//! allocated by `subscribe` the first time one of their slots is needed and never freed (a
//! notifier may be reading one at any time), up to [`MAX_LISTENERS`]. `HIGH` is one past the
//! highest slot in use: `subscribe` raises it after the chunk and the slot are published, and
//! unsubscribing the top slots lowers it again, so `notify_all` reads `HIGH` slots: its cost
//! follows the listeners in use (free slots below the top are reused lowest first), not the
//! capacity. A subscription that finds no slot (all taken, or no memory for a chunk) is inactive,
//! and the caller must not hand out a cache that nobody invalidates (`fh_cache_new` fails with
//! `FH_ERR_TOO_MANY_CACHES`, the shim passes that domain's registrations through).
//!
//! fork: `WRITERS` is one of the process-wide locks the atfork handlers hold across `fork` (order
//! in `crate::rt::fork`). It is a leaf: nothing else is locked under it (a listener's last reference
//! is dropped after it is released, since dropping a cache may reach other locks).

use std::alloc::{alloc_zeroed, Layout};
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex, MutexGuard};

use super::MemoryListener;
use crate::rt::counted::Counted;
use crate::rt::fork::{self, ForkHook, HeldAcrossFork};
use crate::rt::seam::UnmapEvent;

/// Slots per chunk (a chunk is 4 KiB).
pub(super) const CHUNK: usize = 256;
const MAX_CHUNKS: usize = 256;
/// How many listeners can be subscribed at once (one per cache, plus tests).
pub const MAX_LISTENERS: usize = CHUNK * MAX_CHUNKS;

type Boxed = Arc<dyn MemoryListener>;

struct Slot {
    listener: AtomicPtr<Boxed>,
    in_flight: AtomicUsize,
}

/// All zero bytes is a valid chunk: null pointers, zero counters (it is allocated zeroed).
struct Chunk([Slot; CHUNK]);

#[allow(clippy::declare_interior_mutable_const)]
const NO_CHUNK: AtomicPtr<Chunk> = AtomicPtr::new(std::ptr::null_mut());
/// Chunk `k` holds slots `k * CHUNK ..`; published (SeqCst) before `HIGH` covers any of them.
static CHUNKS: [AtomicPtr<Chunk>; MAX_CHUNKS] = [NO_CHUNK; MAX_CHUNKS];
/// One past the highest slot in use.
static HIGH: AtomicUsize = AtomicUsize::new(0);
/// Subscribed listeners that want [`UnmapEvent::Done`] (the hooks skip that round at zero).
static DONE_WANTED: AtomicUsize = AtomicUsize::new(0);

/// Writer-side bookkeeping, under `WRITERS` (never taken on the hook path).
pub(super) struct Writers {
    /// Free slots below `HIGH`.
    free: BTreeSet<usize>,
    /// Slots in use.
    used: usize,
    /// At most this many in use (`MAX_LISTENERS`; lowered by tests).
    limit: usize,
}

static WRITERS: Mutex<Writers> = Mutex::new(Writers {
    free: BTreeSet::new(),
    used: 0,
    limit: MAX_LISTENERS,
});

fn writers() -> MutexGuard<'static, Writers> {
    WRITERS.lock().unwrap_or_else(|e| e.into_inner())
}

/// Place 1 of `rt::fork`'s order: the listeners hear of the fork on both sides of it, in the
/// parent: `before_fork` first thing in `prepare`, with none of the order's locks held yet (a
/// cache may deregister there: its backend calls may reach the hooks, the userfaultfd state and
/// the registry's readers), and `after_fork_in_parent` last thing in `parent`. What caches do
/// there: `pin/fork_mode.rs`.
static LISTENERS_FORK_HOOK: ForkHook = ForkHook {
    order: 1,
    prepare: || {
        each_listener(|l| {
            // Each on its own: a panic in one cache's backend must not spare the others.
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| l.before_fork()));
        })
    },
    parent: || {
        each_listener(|l| {
            let _ =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| l.after_fork_in_parent()));
        })
    },
    child: fork::nothing,
};

/// Place 30 of `rt::fork`'s order: `WRITERS` held across `fork` (nothing is locked under it); in
/// the child, with it held, every listener is told it was forked ([`fork_child`]).
static WRITERS_FORK_HOOK: ForkHook = ForkHook {
    order: 30,
    prepare: || {
        // SAFETY: this hook's prepare, the lock just taken.
        unsafe { HELD.put(writers()) }
    },
    parent: || {
        // SAFETY: this hook's parent.
        drop(unsafe { HELD.take() })
    },
    child: || {
        // SAFETY: this hook's child.
        if let Some(mut g) = unsafe { HELD.take() } {
            fork_child(&mut g);
        }
    },
};
static HELD: HeldAcrossFork<MutexGuard<'static, Writers>> = HeldAcrossFork::new();

/// The registry's places in `rt::fork`'s order (1 and 30). Never with one of its locks held.
pub(super) fn register_fork_hooks() {
    fork::register(&LISTENERS_FORK_HOOK);
    fork::register(&WRITERS_FORK_HOOK);
}

/// The slot with index `i`, whose chunk must be published.
fn slot(i: usize) -> &'static Slot {
    let chunk = CHUNKS[i / CHUNK].load(SeqCst);
    debug_assert!(!chunk.is_null());
    // SAFETY: chunks are never freed, and `i`'s chunk was published before `i` was handed out.
    unsafe { &(*chunk).0[i % CHUNK] }
}

/// Publish the chunk of slot `i` if it is not yet. False when out of memory.
fn ensure_chunk(i: usize) -> bool {
    let k = i / CHUNK;
    if !CHUNKS[k].load(SeqCst).is_null() {
        return true;
    }
    // SAFETY: non-zero-sized layout; zeroed bytes are a valid `Chunk` (see its doc).
    let p = unsafe { alloc_zeroed(Layout::new::<Chunk>()) } as *mut Chunk;
    if p.is_null() {
        return false;
    }
    CHUNKS[k].store(p, SeqCst);
    true
}

/// Call `f` on every slot below `high` (stopping at the first chunk not published yet).
fn for_each_slot(high: usize, mut f: impl FnMut(&'static Slot)) {
    let mut base = 0;
    for c in CHUNKS.iter() {
        if base >= high {
            break;
        }
        let chunk = c.load(SeqCst);
        if chunk.is_null() {
            break; // past the chunks published so far (below `HIGH` every chunk is published)
        }
        // SAFETY: chunks are never freed.
        let slots = unsafe { &(*chunk).0 };
        for s in &slots[..(high - base).min(CHUNK)] {
            f(s);
        }
        base += CHUNK;
    }
}

/// Keeps a listener subscribed; dropping it unsubscribes and waits for in-flight calls to finish.
///
/// Do not drop a `Subscription` from inside its own listener's `on_unmap` (it would wait for
/// itself forever).
#[derive(Debug)]
#[must_use = "dropping the Subscription unsubscribes the listener"]
pub struct Subscription {
    slot: Option<usize>,
    /// Counted in `DONE_WANTED`.
    wants_done: bool,
}

impl Subscription {
    /// False when the listener could not be subscribed ([`MAX_LISTENERS`] in use, or no memory
    /// for another chunk of slots): it will never be called.
    pub fn is_active(&self) -> bool {
        self.slot.is_some()
    }
}

/// Subscribe a listener; see [`Subscription`]. When no slot can be had the returned
/// subscription is inactive (check [`Subscription::is_active`]).
pub fn subscribe(l: Arc<dyn MemoryListener>) -> Subscription {
    // Before the lock: registering the atfork handlers must not happen under one of our locks.
    register_fork_hooks();
    let mut w = writers();
    let none = Subscription {
        slot: None,
        wants_done: false,
    };
    if w.used >= w.limit {
        return none;
    }
    let high = HIGH.load(SeqCst);
    let i = match w.free.pop_first() {
        Some(i) => i,
        None if high < MAX_LISTENERS && ensure_chunk(high) => high,
        None => return none,
    };
    let wants_done = l.wants_done();
    if wants_done {
        DONE_WANTED.fetch_add(1, SeqCst);
    }
    let raw = Box::into_raw(Box::new(l));
    slot(i).listener.store(raw, SeqCst);
    if i >= high {
        HIGH.store(i + 1, SeqCst);
    }
    w.used += 1;
    Subscription {
        slot: Some(i),
        wants_done,
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let Some(i) = self.slot else { return };
        let raw = {
            let mut w = writers();
            let s = slot(i);
            let raw = s.listener.swap(std::ptr::null_mut(), SeqCst);
            // A notifier that loaded the pointer incremented `in_flight` before (SeqCst), so once
            // we see zero here, nobody holds `raw` any more and nobody new can load it.
            let mut spins = 0u32;
            while s.in_flight.load(SeqCst) != 0 {
                spins += 1;
                if spins < 100 {
                    std::hint::spin_loop();
                } else {
                    std::thread::yield_now();
                }
            }
            w.used -= 1;
            w.free.insert(i);
            // Lower the high-water mark past every free slot at the top.
            let mut high = HIGH.load(SeqCst);
            while high > 0 && w.free.remove(&(high - 1)) {
                high -= 1;
            }
            HIGH.store(high, SeqCst);
            if self.wants_done {
                DONE_WANTED.fetch_sub(1, SeqCst);
            }
            raw
        };
        if !raw.is_null() {
            // SAFETY: `raw` came from Box::into_raw in `subscribe`, was removed from the slot by the
            // swap above (so it is freed exactly once), and no notifier still uses it. Dropped
            // outside `WRITERS`: this may be the cache's last reference.
            drop(unsafe { Box::from_raw(raw) });
        }
    }
}

/// Whether some subscribed listener wants [`UnmapEvent::Done`] events. One load.
pub(super) fn done_wanted() -> bool {
    DONE_WANTED.load(SeqCst) != 0
}

/// Fan an event out to every subscribed listener. No allocation, no lock: hook-safe.
pub(super) fn notify_all(addr: usize, len: usize, ev: UnmapEvent) {
    each_listener(|l| l.on_event(addr, len, ev));
}

/// Call `f` on every subscribed listener (no allocation, no lock: hook-safe). For the hooks'
/// events and the atfork prepare and parent handlers (`crate::rt::fork`).
#[inline(always)]
pub(crate) fn each_listener(f: impl Fn(&dyn MemoryListener)) {
    for_each_slot(HIGH.load(SeqCst), |s| {
        // Cheap pre-check so a free slot costs one load, not two RMWs.
        if s.listener.load(SeqCst).is_null() {
            return;
        }
        // Counted out even if `f` unwinds (a fork handler's listener may call a backend, which
        // may panic): a count left raised would make the listener's unsubscribe wait forever.
        let _in = Counted::enter(&s.in_flight);
        let raw = s.listener.load(SeqCst);
        if !raw.is_null() {
            // SAFETY: the pointer stays valid while `in_flight` > 0 (see Drop above).
            f(unsafe { &**raw });
        }
    });
}

/// In a child of `fork`, from the atfork child handler (one thread, `WRITERS` held by it): every
/// subscribed listener is told [`MemoryListener::forked`]. The in-flight counts of notifications
/// that were running on other threads of the parent are cleared, in every slot ever used (a
/// notifier may have counted itself in on a slot above `HIGH` that it found emptied): those threads
/// do not exist here, and unsubscribing in the child must not wait for them forever. No
/// allocation, no lock.
fn fork_child(_held: &mut Writers) {
    for_each_slot(MAX_LISTENERS, |s| s.in_flight.store(0, SeqCst));
    for_each_slot(HIGH.load(SeqCst), |s| {
        let raw = s.listener.load(SeqCst);
        if !raw.is_null() {
            // SAFETY: the pointer stays valid until its Subscription is dropped, which takes
            // `WRITERS`, held by this thread (the only one).
            unsafe { (*raw).forked() };
        }
    });
}

/// Number of subscribed listeners (for the tests).
#[cfg(any(test, feature = "test-support"))]
pub fn listener_count() -> usize {
    let mut n = 0;
    for_each_slot(HIGH.load(SeqCst), |s| {
        n += usize::from(!s.listener.load(SeqCst).is_null());
    });
    n
}

/// Tests only: allow at most `limit` listeners at once (clamped to [`MAX_LISTENERS`]), to
/// exercise what happens when no slot is left without subscribing tens of thousands. Subscriptions
/// already made are kept.
#[cfg(any(test, feature = "test-support"))]
#[doc(hidden)]
pub fn set_listener_limit_for_tests(limit: usize) {
    writers().limit = limit.min(MAX_LISTENERS);
}
