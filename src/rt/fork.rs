//! `fork` and the library's process-wide locks.
//!
//! A child of `fork` has one thread. A lock that another thread of the parent held at that instant
//! stays locked forever in the child, so the child's first registration would hang (seen with
//! the monitor's install mutex: `tests/fork_threads.rs`). The prepare handler takes every
//! process-wide lock, in the one order below; the parent and child handlers release them. Then,
//! in the child, every subscribed listener is told [`MemoryListener::forked`]: a cache does not
//! cross fork (its own locks may be held by threads that are gone, and its registrations are the
//! parent's: the child shares the parent's verbs objects), so an inherited cache quarantines
//! itself and the child builds new ones.
//!
//! In the parent, listeners hear of the fork on both sides of it: [`MemoryListener::before_fork`]
//! first thing in `prepare`, with none of these locks held yet (a cache may deregister there), and
//! [`MemoryListener::after_fork_in_parent`] last thing in `parent`. What caches do there:
//! `pin/fork_mode.rs`.
//!
//! Lock order. Every path that holds two of these takes them in this order, and `prepare` takes
//! all of them in it:
//!
//! 1. `monitor::INSTALL` (`monitor/mod.rs`): `install` holds it while patching libc and opening
//!    the userfaultfd, which takes 2;
//! 2. the userfaultfd `STATE` (`monitor/uffd.rs`);
//! 3. the listener registry's `WRITERS` (`monitor/registry.rs`): nothing is locked under it;
//! 4. the reader-slot id pool `FREE_IDS` (`cache/readers.rs`): nothing is locked under it. The
//!    cache module keeps that file private, so it hands its lock over at its first use
//!    ([`set_ids_hooks`]);
//! 5. the mlock pinner's count of locked pages `LOCKED` (`pin/mlock.rs`): nothing is locked under
//!    it. The child starts with no page locked (mlock is not inherited), so it starts with no
//!    count either.
//!
//! Per-cache locks (the writer mutex, the slab's spin lock, the handle tables) are not taken:
//! only the quarantined inherited caches have them, and they never touch them again.
//!
//! The handlers are registered once, at the first monitor install, listener subscription or
//! reader-slot id, and never while one of the locks above is held: `pthread_atfork` takes glibc's
//! atfork lock, which a concurrent `fork` holds while its prepare handler waits for our locks.
//!
//! [`MemoryListener::forked`]: crate::rt::seam::MemoryListener::forked
//! [`MemoryListener::before_fork`]: crate::rt::seam::MemoryListener::before_fork
//! [`MemoryListener::after_fork_in_parent`]: crate::rt::seam::MemoryListener::after_fork_in_parent

use std::any::Any;
use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering::Relaxed, Ordering::SeqCst};
use std::sync::MutexGuard;

use crate::monitor;

/// A leaf lock of another module, as the handlers see it.
pub(crate) struct LeafHooks {
    /// Take the lock; the guard is held across `fork`.
    pub lock: fn() -> Box<dyn Any>,
    /// In the child, with the guard (still locked): repair what the threads that are gone left
    /// behind. No allocation, no lock.
    pub child: fn(&mut dyn Any),
}

/// Lock 4 (the reader-slot id pool), once `cache/readers.rs` has handed it over.
static IDS_HOOKS: AtomicPtr<LeafHooks> = AtomicPtr::new(std::ptr::null_mut());

/// Called by `cache/readers.rs` before it first takes its lock (never with a lock held).
pub(crate) fn set_ids_hooks(h: &'static LeafHooks) {
    IDS_HOOKS.store(h as *const LeafHooks as *mut LeafHooks, SeqCst);
    ensure_handlers();
}

fn ids_hooks() -> Option<&'static LeafHooks> {
    // SAFETY: null or from a `&'static` in `set_ids_hooks`.
    unsafe { IDS_HOOKS.load(SeqCst).as_ref() }
}

/// The locks held between prepare and parent/child, in acquisition order (dropped in this order
/// too, which does not matter for releasing).
struct Guards {
    _install: MutexGuard<'static, ()>,
    /// The userfaultfd state's guard (its type is private to `uffd.rs`).
    _uffd: Box<dyn Any>,
    writers: MutexGuard<'static, monitor::RegistryWriters>,
    ids: Option<Box<dyn Any>>,
    mlock: MutexGuard<'static, crate::rt::range_counts::RangeCounts>,
}

/// Only touched by the thread that runs the handlers of one `fork` call: `prepare` fills it after
/// taking `INSTALL`, and parent/child empty it before releasing it, so concurrent forks are
/// serialised by that mutex (and by glibc's atfork lock).
struct Held(UnsafeCell<Option<Guards>>);

// SAFETY: see `Held`.
unsafe impl Sync for Held {}

static HELD: Held = Held(UnsafeCell::new(None));

extern "C" fn prepare() {
    // First, with none of our locks held: caches release what must not cross the fork (their
    // backend calls may reach the hooks, the userfaultfd state and the registry's readers).
    monitor::each_listener(|l| {
        // Each on its own: a panic in one cache's backend must not spare the others.
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| l.before_fork()));
    });
    let _ = std::panic::catch_unwind(|| {
        let install = monitor::fork_lock_install();
        let uffd = monitor::fork_lock_uffd();
        let writers = monitor::fork_lock_registry();
        let ids = ids_hooks().map(|h| (h.lock)());
        let mlock = crate::pin::mlock::fork_lock();
        // SAFETY: see `Held`.
        unsafe {
            *HELD.0.get() = Some(Guards {
                _install: install,
                _uffd: uffd,
                writers,
                ids,
                mlock,
            })
        };
    });
}

extern "C" fn parent() {
    let _ = std::panic::catch_unwind(|| {
        // SAFETY: see `Held`; dropping the guards unlocks.
        drop(unsafe { (*HELD.0.get()).take() });
    });
    monitor::each_listener(|l| {
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| l.after_fork_in_parent()));
    });
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
    // The other threads' slots of "inside the library" go with them (atomics only).
    crate::rt::inside::fork_child();
    // This handler ran, so the handlers are registered in this process, whatever state a parent
    // thread that was registering them left behind.
    STATE.store(REGISTERED, SeqCst);
    let _ = std::panic::catch_unwind(|| {
        // SAFETY: see `Held`. This process has one thread now.
        let Some(mut g) = (unsafe { (*HELD.0.get()).take() }) else {
            return;
        };
        monitor::fork_child_listeners(&mut g.writers);
        if let (Some(h), Some(ids)) = (ids_hooks(), g.ids.as_mut()) {
            (h.child)(&mut **ids);
        }
        *g.mlock = crate::rt::range_counts::RangeCounts::new();
        crate::helper::unmap_log::fork_child();
        crate::helper::pins_ahead::fork_child();
        // Unlock this process's copies of the mutexes. (Freeing the uffd guard's box is fine:
        // glibc's malloc is usable in a child's atfork handler.)
        drop(g);
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
