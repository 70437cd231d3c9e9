//! `fork` and the library's process-wide locks.
//!
//! A child of `fork` has one thread. A lock that another thread of the parent held at that instant
//! stays locked forever in the child, so the child's first registration would hang (seen with
//! the monitor's install mutex: `tests/fork_threads.rs`). The prepare handler takes every
//! process-wide lock, in one order; the parent and child handlers release them. Then, in the
//! child, every subscribed listener is told `MemoryListener::forked`: a cache does not cross fork
//! (its own locks may be held by threads that are gone, and its registrations are the parent's:
//! the child shares the parent's verbs objects), so an inherited cache quarantines itself and the
//! child builds new ones.
//!
//! This file names none of those locks: each owner registers a [`ForkHook`] (a static of plain
//! function pointers) with its place in the order, and the handlers walk the table. Nothing is
//! allocated in the handlers, nothing is locked to read the table (one atomic pointer per place).
//!
//! - `prepare` runs every registered hook's `prepare` in ascending order: the order is the lock
//!   order, so the first ones may still take whatever the later ones hold (the listeners'
//!   `before_fork` comes first, with no lock of ours held yet);
//! - `parent` runs the `parent` hooks in descending order (the listeners' `after_fork_in_parent`
//!   comes last, after every lock is released);
//! - `child` runs the `child` hooks in ascending order: each repairs what the threads that are gone
//!   left behind under its own lock, then releases it. (The child has one thread, so releasing
//!   one before the next is repaired changes nothing.)
//!
//! The order (see [`order`]; every path that holds two of these locks takes them in this order):
//!
//! | order | owner | prepare | child |
//! |---|---|---|---|
//! | 0 `INSIDE` | `rt/inside.rs` | - | free the gone threads' slots |
//! | 1 `LISTENERS` | `monitor/registry.rs` | `before_fork` of every listener | - |
//! | 10 `MONITOR_INSTALL` | `monitor/mod.rs` | `INSTALL` (`install` takes 20 under it) | |
//! | 20 `UFFD_STATE` | `monitor/uffd/hooks.rs` | the userfaultfd `STATE` | |
//! | 30 `LISTENER_WRITERS` | `monitor/registry.rs` | `WRITERS` (nothing under it) | `forked` of every listener |
//! | 40 `READER_IDS` | `cache/readers.rs` | `FREE_IDS` (nothing under it) | free the gone threads' ids |
//! | 50 `MLOCK_COUNTS` | `pin/mlock.rs` | `LOCKED` (nothing under it) | no page is locked: no count |
//! | 60 `UNMAP_LOG` | `helper/unmap_log.rs` | - | end the gone threads' unmaps |
//! | 61 `PINS_AHEAD` | `helper/pins_ahead.rs` | - | withdraw the gone helpers' pins |
//!
//! Per-cache locks (the writer mutex, the slab's spin lock, the handle tables) are not taken:
//! only the quarantined inherited caches have them, and they never touch them again.
//!
//! Owners register before they first take their lock, and never while holding one of the locks
//! above: the first registration calls `pthread_atfork`, which takes glibc's atfork lock, which a
//! concurrent `fork` holds while its prepare handler waits for our locks. The lock a hook takes
//! in `prepare` stays held until its `parent` or `child`: the owner keeps the guard in a
//! [`HeldAcrossFork`].

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering::Relaxed, Ordering::SeqCst};

/// One owner's part in the atfork handlers. Each function must not allocate (the child's
/// may free: glibc's malloc is usable in a child's atfork handler), and must not take a lock of a
/// later place in the order but its own. A panic is caught (and only spares this hook).
pub(crate) struct ForkHook {
    /// The place in the order (the table above): the key of the table, so unique, below
    /// [`PLACES`].
    pub order: u8,
    /// In the parent, before `fork`: take the lock (keep the guard in a [`HeldAcrossFork`]).
    pub prepare: fn(),
    /// In the parent, after `fork`: release it.
    pub parent: fn(),
    /// In the child (one thread): repair what the threads that are gone left, and release.
    pub child: fn(),
}

/// For a [`ForkHook`] with nothing to do at one of the three points.
pub(crate) fn nothing() {}

/// Places in the order (one hook each).
const PLACES: usize = 64;

/// The registered hooks by place; null where none.
static TABLE: [AtomicPtr<ForkHook>; PLACES] =
    [const { AtomicPtr::new(std::ptr::null_mut()) }; PLACES];

/// Register `h` at its place (idempotent), and the atfork handlers if they are not yet. Call it
/// before first taking the lock it protects, never with one of the order's locks held.
pub(crate) fn register(h: &'static ForkHook) {
    let place = &TABLE[usize::from(h.order)];
    let p = h as *const ForkHook as *mut ForkHook;
    if place.load(SeqCst) != p {
        let was = place.swap(p, SeqCst);
        debug_assert!(
            was.is_null() || was == p,
            "two fork hooks at place {}",
            h.order
        );
    }
    ensure_handlers();
}

/// The hooks in ascending order.
fn each_hook(f: impl Fn(&'static ForkHook)) {
    for place in TABLE.iter() {
        // SAFETY: null or from a `&'static` in `register`.
        if let Some(h) = unsafe { place.load(SeqCst).as_ref() } {
            f(h);
        }
    }
}

/// A guard a [`ForkHook`] holds from its `prepare` to its `parent` or `child`.
///
/// Only touched by the thread that runs the handlers of one `fork` call: `prepare` fills it after
/// taking the lock, and parent/child empty it before releasing it, so concurrent forks are
/// serialised by that lock (and by glibc's atfork lock).
pub(crate) struct HeldAcrossFork<G>(UnsafeCell<Option<G>>);

// SAFETY: see `HeldAcrossFork`.
unsafe impl<G> Sync for HeldAcrossFork<G> {}

impl<G> HeldAcrossFork<G> {
    pub(crate) const fn new() -> Self {
        Self(UnsafeCell::new(None))
    }

    /// Keep the guard taken in a `prepare` handler.
    ///
    /// # Safety
    /// Only from the `prepare` of the hook that owns this, with its lock just taken.
    pub(crate) unsafe fn put(&self, g: G) {
        *self.0.get() = Some(g);
    }

    /// The guard kept by `prepare`, in the `parent` or `child` handler.
    ///
    /// # Safety
    /// Only from the `parent` or `child` of the hook that owns this.
    pub(crate) unsafe fn take(&self) -> Option<G> {
        (*self.0.get()).take()
    }
}

extern "C" fn prepare() {
    each_hook(|h| {
        let _ = std::panic::catch_unwind(h.prepare);
    });
}

extern "C" fn parent() {
    for place in TABLE.iter().rev() {
        // SAFETY: null or from a `&'static` in `register`.
        if let Some(h) = unsafe { place.load(SeqCst).as_ref() } {
            let _ = std::panic::catch_unwind(h.parent);
        }
    }
}

/// How many forks this process's line has gone through (this process and its ancestors since
/// the handlers were registered): an object that recorded it when it was made knows it was
/// inherited when the number has changed (one relaxed load, no system call).
static GENERATION: AtomicU64 = AtomicU64::new(0);

/// See [`GENERATION`]. Call [`ensure_handlers`] before recording it.
pub(crate) fn generation() -> u64 {
    GENERATION.load(Relaxed)
}

extern "C" fn child() {
    GENERATION.fetch_add(1, Relaxed);
    // This handler ran, so the handlers are registered in this process, whatever state a parent
    // thread that was registering them left behind.
    STATE.store(REGISTERED, SeqCst);
    each_hook(|h| {
        let _ = std::panic::catch_unwind(h.child);
    });
}

const UNREGISTERED: u64 = 0;
const REGISTERING: u64 = 1;
const REGISTERED: u64 = 2;
/// The registration's state in the low byte, and above it the pid of the process that moved it
/// to REGISTERING: a child forked while a parent thread was registering inherits REGISTERING with
/// no thread left to finish, and must be able to tell that from a registration of its own.
static STATE: AtomicU64 = AtomicU64::new(UNREGISTERED);

/// What `ensure_handlers` does, given the state word and this process's pid.
#[derive(Debug, PartialEq, Eq)]
enum Step {
    /// Registered, or being registered by a thread of this process.
    Nothing,
    /// Try to take the registration over from this word.
    Take,
}

fn step(word: u64, pid: u32) -> Step {
    match word & 0xff {
        REGISTERED => Step::Nothing,
        // A parent thread was registering when this process was forked. Had its
        // `pthread_atfork` taken effect, `child` would have run here and set REGISTERED: no
        // handler is registered in this process.
        REGISTERING if word >> 8 != u64::from(pid) => Step::Take,
        REGISTERING => Step::Nothing,
        _ => Step::Take,
    }
}

/// Register the atfork handlers, once per process. Never call with one of the locks above held.
///
/// Never waits: a thread that loses the race goes on while the winner registers (a `fork` in that
/// instant is unprotected, as before the first use). A waiting `Once` would be worse: a child
/// forked while the winner was inside would wait for it forever.
pub(crate) fn ensure_handlers() {
    let word = STATE.load(SeqCst);
    if word & 0xff == REGISTERED {
        return; // the usual case: no system call
    }
    let pid = std::process::id();
    if step(word, pid) == Step::Nothing
        || STATE
            .compare_exchange(word, (u64::from(pid) << 8) | REGISTERING, SeqCst, SeqCst)
            .is_err()
    {
        return;
    }
    // SAFETY: plain functions that never unwind (each catches panics).
    unsafe { libc::pthread_atfork(Some(prepare), Some(parent), Some(child)) };
    STATE.store(REGISTERED, SeqCst);
}

#[cfg(test)]
mod tests {
    use super::{step, Step, REGISTERED, REGISTERING, UNREGISTERED};

    #[test]
    fn a_registration_left_half_done_by_a_parent_is_taken_over() {
        let (me, parent) = (4242u32, 17u32);
        assert_eq!(step(UNREGISTERED, me), Step::Take);
        assert_eq!(step(REGISTERED, me), Step::Nothing);
        assert_eq!(step((u64::from(me) << 8) | REGISTERING, me), Step::Nothing);
        assert_eq!(step((u64::from(parent) << 8) | REGISTERING, me), Step::Take);
    }
}
