//! "This thread is inside the library": a per-thread depth, raised by every C entry point
//! (`ffi_guard!`), by the remote-pinning driver's own calls (`rma::Rma`), and for good by the
//! library's own threads (progress, revoke worker).
//!
//! Why: a memory listener that may *wait* in hook context (the revoke listener of
//! `rma::revoke`, after an unmap) waits for a helper thread that takes the library's locks (the
//! Firehose engine, the active-message endpoint and its receive stash, the pin-down cache). A
//! thread inside the library may hold one of them while it frees memory; if it waited there, it
//! would wait for itself. So a listener never waits on a thread that `is_inside`: it only
//! queues its work.
//!
//! Why the depth lives in a table and not in a thread-local: `is_inside` runs in hook context,
//! possibly inside glibc's heap trimming with a malloc arena's mutex held. In a library loaded
//! with `dlopen` a thread-local is reached through `__tls_get_addr`, which allocates on a thread's
//! first access (and may reallocate the thread's vector after another `dlopen`): a deadlock on
//! that mutex. So each thread that enters the library claims a slot keyed by `pthread_self` (as
//! `monitor/guard.rs` does), and the hook side reads only the table. The thread-local here holds
//! the slot's index for the entering side, which never runs in hook context; a second
//! thread-local with a destructor frees the slot when the thread exits.
//!
//! A thread that finds no free slot in its window is counted in that window's overflow; while
//! the count is not zero, `is_inside` answers "inside" for every thread of that window it
//! cannot find (never waiting is always safe; waiting on oneself is not). The same holds for the
//! duration of an entry made after the thread's release ran (from another thread-local's
//! destructor at thread exit): then the slot is gone, and the entry is counted there instead.

use std::cell::Cell;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering::Acquire, Ordering::Relaxed};

const SLOTS: usize = 4096;
/// Slots a thread may claim, and where its claim is looked for: an aligned group.
const WINDOW: usize = 8;
const WINDOWS: usize = SLOTS / WINDOW;

/// States of `MINE` besides a slot index (`< SLOTS`): `UNTRACKED + w` (no slot, counted in
/// `OVERFLOW[w]` for the thread's life), and `TEARDOWN + w`, which only an `Inside` holds (an
/// entry after the release, counted in `OVERFLOW[w]` while the guard lives).
const UNTRACKED: usize = SLOTS;
const TEARDOWN: usize = SLOTS + WINDOWS;
const GONE: usize = usize::MAX - 1;
const NOT_YET: usize = usize::MAX;

/// One thread's depth. A cache line each: entering threads write their own slot on every entry,
/// and neighbours must not share its line.
#[repr(align(64))]
struct Slot {
    /// `pthread_self()` of the thread; 0: free.
    owner: AtomicUsize,
    /// Written only by the owner (and its signal handlers), read by its hooks.
    depth: AtomicU32,
}

#[allow(clippy::declare_interior_mutable_const)]
const FREE: Slot = Slot {
    owner: AtomicUsize::new(0),
    depth: AtomicU32::new(0),
};
#[allow(clippy::declare_interior_mutable_const)]
const ZERO: AtomicU32 = AtomicU32::new(0);

static TABLE: [Slot; SLOTS] = [FREE; SLOTS];
/// Per window: live threads that entered without a slot there, plus entries made after a
/// thread's release.
static OVERFLOW: [AtomicU32; WINDOWS] = [ZERO; WINDOWS];

thread_local! {
    /// This thread's slot index or state. Const-initialised, no destructor.
    static MINE: Cell<usize> = const { Cell::new(NOT_YET) };
    /// The depth word of this thread's slot while `MINE` is a slot index (else null): what
    /// `enter` and its guard's drop touch, with no index arithmetic. Set from `MINE` by
    /// `enter_slow`; const-initialised, no destructor.
    static DEPTH: Cell<*const AtomicU32> = const { Cell::new(std::ptr::null()) };
    /// Touched once, at the first entry: its destructor gives the slot back at thread exit.
    static RELEASE: Release = const { Release };
}

struct Release;

impl Drop for Release {
    fn drop(&mut self) {
        // GONE for good: an entry after this (from a later destructor) claims nothing.
        let _ = DEPTH.try_with(|d| d.set(std::ptr::null()));
        let i = MINE.try_with(|m| m.replace(GONE)).unwrap_or(GONE);
        give_back(i);
    }
}

/// Frees what `MINE` state `i` holds (a slot, or an overflow count).
fn give_back(i: usize) {
    if i < SLOTS {
        TABLE[i].depth.store(0, Relaxed);
        TABLE[i]
            .owner
            .store(0, std::sync::atomic::Ordering::Release);
    } else if (UNTRACKED..TEARDOWN).contains(&i) {
        sub_overflow(i - UNTRACKED);
    }
}

/// One overflow count less in window `w`, never below zero (a fork may have reset it while a
/// count was held).
fn sub_overflow(w: usize) {
    let _ = OVERFLOW[w].fetch_update(Relaxed, Relaxed, |v| Some(v.saturating_sub(1)));
}

/// This thread's key in the slot tables (here and `monitor/guard.rs`): `pthread_self`, a read of
/// the thread pointer, usable in a hook (no thread-local, no allocation). Never 0.
#[inline]
pub(crate) fn me() -> usize {
    // SAFETY: pthread_self has no preconditions (it reads the thread pointer).
    (unsafe { libc::pthread_self() }) as usize
}

/// Where a slot table looks for `id`'s slots: thread ids are aligned addresses, so their bits are
/// mixed first (Fibonacci hashing); the high bits, for the table to reduce to its windows.
#[inline]
pub(crate) fn spread(id: usize) -> usize {
    id.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40
}

/// `id`'s window.
fn window(id: usize) -> usize {
    spread(id) % WINDOWS
}

/// The index of `id`'s slot, if it has one.
fn find(id: usize) -> Option<usize> {
    let b = window(id) * WINDOW;
    (b..b + WINDOW).find(|&i| TABLE[i].owner.load(Acquire) == id)
}

/// First entry of this thread: claim a slot (or adopt one left with this id by a thread that
/// exited without its release, or claimed by a signal handler of this thread meanwhile), and
/// arm the release at exit. A handler that claims between our look and our claim is settled
/// in `mine`.
#[cold]
#[inline(never)]
fn claim() -> usize {
    // The atfork child handler frees the slots of the threads a fork leaves behind.
    super::fork::register(&FORK_HOOK);
    let id = me();
    let w = window(id);
    let b = w * WINDOW;
    let i = match find(id) {
        Some(i) => i,
        None => match (b..b + WINDOW).find(|&i| {
            TABLE[i]
                .owner
                .compare_exchange(0, id, Acquire, Relaxed)
                .is_ok()
        }) {
            Some(k) => k,
            None => {
                OVERFLOW[w].fetch_add(1, Relaxed);
                UNTRACKED + w
            }
        },
    };
    if i < SLOTS {
        TABLE[i].depth.store(0, Relaxed);
    }
    // Registers the destructor (may allocate: we are on an entry path, not in a hook).
    let _ = RELEASE.try_with(|_| ());
    i
}

/// This thread's slot index or state, claimed on first use.
#[inline]
fn mine() -> usize {
    MINE.try_with(|m| {
        let i = m.get();
        if i != NOT_YET {
            return i;
        }
        let c = claim();
        // A signal handler of this thread may have finished a claim of its own meanwhile (a
        // different slot if it ran between `claim`'s look and its claim): keep the handler's.
        let now = m.get();
        if now != NOT_YET {
            if now != c {
                give_back(c);
            }
            return now;
        }
        m.set(c);
        c
    })
    .unwrap_or(GONE)
}

/// Keeps this thread marked as inside the library until dropped (nests).
#[must_use = "the thread counts as inside only while the guard lives"]
pub struct Inside {
    /// The depth word raised (null: none, see `slot`).
    depth: *const AtomicU32,
    /// Without a depth word: the `MINE` state the entry was counted under.
    slot: usize,
    /// Not `Send`: it must be dropped on the thread that made it (the raw pointer sees to it).
    _thread: PhantomData<*const ()>,
}

/// Marks this thread as inside the library until the guard is dropped.
#[inline]
pub fn enter() -> Inside {
    let d = DEPTH.try_with(|d| d.get()).unwrap_or(std::ptr::null());
    if d.is_null() {
        return enter_slow();
    }
    // SAFETY: `DEPTH` points into the static `TABLE`, at this thread's own slot.
    raise(unsafe { &*d });
    Inside {
        depth: d,
        slot: 0,
        _thread: PhantomData,
    }
}

/// Only this thread writes its slot: a load and a store, no locked instruction. (Depths
/// balance: every entry's guard drops once.)
#[inline(always)]
fn raise(d: &AtomicU32) {
    d.store(d.load(Relaxed).wrapping_add(1), Relaxed);
}

/// `enter` before `DEPTH` is set: the first entry of a thread (its claim), a thread with no
/// slot, or an entry after the thread's release.
#[cold]
#[inline(never)]
fn enter_slow() -> Inside {
    let mut slot = mine();
    let mut depth = std::ptr::null();
    if let Some(s) = TABLE.get(slot) {
        depth = &s.depth as *const AtomicU32;
        // A signal handler of this thread that entered meanwhile set the same word.
        let _ = DEPTH.try_with(|d| d.set(depth));
        raise(&s.depth);
    } else if slot == GONE {
        slot = teardown_entry();
    }
    Inside {
        depth,
        slot,
        _thread: PhantomData,
    }
}

/// An entry after this thread's release: counted in its window's overflow while it lasts.
#[cold]
#[inline(never)]
fn teardown_entry() -> usize {
    let w = window(me());
    OVERFLOW[w].fetch_add(1, Relaxed);
    TEARDOWN + w
}

impl Drop for Inside {
    #[inline]
    fn drop(&mut self) {
        if self.depth.is_null() {
            teardown_exit(self.slot);
            return;
        }
        // SAFETY: set by `enter` from `DEPTH`: a word of the static `TABLE`.
        let d = unsafe { &*self.depth };
        d.store(d.load(Relaxed).wrapping_sub(1), Relaxed);
    }
}

/// The end of an entry that had no slot (see `teardown_entry`).
#[cold]
#[inline(never)]
fn teardown_exit(slot: usize) {
    if (TEARDOWN..TEARDOWN + WINDOWS).contains(&slot) {
        sub_overflow(slot - TEARDOWN);
    }
}

/// Marks the calling thread as the library's own, for the rest of its life.
pub(crate) fn mark_thread() {
    std::mem::forget(enter());
}

/// Whether this thread is inside the library (or is one of its threads). Hook-safe: no
/// thread-local, no allocation, no lock (a scan of 8 slots). A thread it cannot find counts as
/// inside while its window has overflowed.
pub(crate) fn is_inside() -> bool {
    let id = me();
    match find(id) {
        Some(i) => TABLE[i].depth.load(Relaxed) != 0,
        None => OVERFLOW[window(id)].load(Relaxed) != 0,
    }
}

/// Place 0 of the fork order (`fork.rs`): no lock; the child's slots are repaired first.
static FORK_HOOK: super::fork::ForkHook = super::fork::ForkHook {
    order: 0,
    prepare: super::fork::nothing,
    parent: super::fork::nothing,
    child: fork_child,
};

/// In the child of a fork (atfork child handler, one thread): the other threads are gone, so
/// their slots and overflow counts are freed; the calling thread keeps its own.
pub(crate) fn fork_child() {
    let id = me();
    for s in TABLE.iter() {
        let o = s.owner.load(Relaxed);
        if o != 0 && o != id {
            s.depth.store(0, Relaxed);
            s.owner.store(0, Relaxed);
        }
    }
    for o in OVERFLOW.iter() {
        o.store(0, Relaxed);
    }
    let mine = MINE.try_with(|m| m.get()).unwrap_or(GONE);
    if (UNTRACKED..TEARDOWN).contains(&mine) {
        OVERFLOW[mine - UNTRACKED].store(1, Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// The tests below fill windows on purpose: one at a time.
    static SERIAL: Mutex<()> = Mutex::new(());

    fn serial() -> std::sync::MutexGuard<'static, ()> {
        SERIAL.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn no_overflow() -> bool {
        OVERFLOW.iter().all(|o| o.load(Relaxed) == 0)
    }

    #[test]
    fn nests_and_is_per_thread() {
        let _s = serial();
        assert!(!is_inside());
        {
            let _a = enter();
            assert!(is_inside());
            {
                let _b = enter();
                assert!(is_inside());
            }
            assert!(is_inside(), "the outer guard still holds");
            std::thread::spawn(|| assert!(!is_inside(), "another thread is not inside"))
                .join()
                .unwrap();
        }
        assert!(!is_inside());
        std::thread::spawn(|| {
            mark_thread();
            assert!(is_inside());
        })
        .join()
        .unwrap();
        assert!(!is_inside());
    }

    /// Slots come back at thread exit: far more threads than slots enter one after another (and
    /// 16 at a time) and every one of them is tracked.
    #[test]
    fn slots_are_released_at_thread_exit() {
        let _s = serial();
        for _round in 0..(2 * SLOTS / 16) {
            let hs: Vec<_> = (0..16)
                .map(|_| {
                    std::thread::spawn(|| {
                        let _in = enter();
                        let i = MINE.with(|m| m.get());
                        assert!(i < SLOTS, "tracked");
                        assert!(is_inside());
                        assert_eq!(find(me()), Some(i));
                        assert_eq!(TABLE[i].depth.load(Relaxed), 1);
                    })
                })
                .collect();
            for h in hs {
                h.join().unwrap();
            }
        }
        assert!(no_overflow());
    }

    /// Calls into the library from its destructor, which runs after the slot's release when it
    /// was registered before the thread's first entry.
    struct EntersAtExit;
    impl Drop for EntersAtExit {
        fn drop(&mut self) {
            let _in = enter();
            assert!(is_inside(), "an entry during teardown counts as inside");
        }
    }
    thread_local! {
        static ENTERS_AT_EXIT: EntersAtExit = const { EntersAtExit };
    }

    /// An entry from a destructor that runs after the release claims no slot and leaves no
    /// count behind (it leaked a slot, and then the overflow count for good).
    #[test]
    fn an_entry_during_thread_teardown_leaks_nothing() {
        let _s = serial();
        for untracked in [false, true] {
            let (id, fakes) = std::thread::spawn(move || {
                ENTERS_AT_EXIT.with(|_| ()); // registered first: destroyed after RELEASE
                let id = me();
                let b = window(id) * WINDOW;
                // Untracked: the window is full of other (fake) owners before the first entry.
                let fakes: Vec<usize> = if untracked {
                    (b..b + WINDOW)
                        .filter(|&i| {
                            let fake = 0x10 + 0x20 * i; // never a pthread_self (a TCB address)
                            TABLE[i]
                                .owner
                                .compare_exchange(0, fake, Acquire, Relaxed)
                                .is_ok()
                        })
                        .collect()
                } else {
                    Vec::new()
                };
                {
                    let _in = enter();
                    assert!(is_inside());
                }
                (id, fakes)
            })
            .join()
            .unwrap();
            for i in &fakes {
                TABLE[*i].owner.store(0, Relaxed);
            }
            assert_eq!(find(id), None, "untracked {untracked}: no slot left behind");
            assert!(
                no_overflow(),
                "untracked {untracked}: no overflow count left behind"
            );
        }
    }

    /// A thread whose window is full counts as inside while inside (and so does every unknown
    /// thread of that window, conservatively); the count goes when it exits.
    #[test]
    fn a_full_window_counts_unknown_threads_as_inside() {
        let _s = serial();
        std::thread::spawn(|| {
            let id = me();
            let w = window(id);
            let b = w * WINDOW;
            let fakes: Vec<usize> = (b..b + WINDOW)
                .filter(|&i| {
                    TABLE[i]
                        .owner
                        .compare_exchange(0, 0x10 + 0x20 * i, Acquire, Relaxed)
                        .is_ok()
                })
                .collect();
            {
                let _in = enter();
                assert_eq!(MINE.with(|m| m.get()), UNTRACKED + w);
                assert!(is_inside());
            }
            assert!(
                is_inside(),
                "unknown in an overflowed window: inside, conservatively"
            );
            for i in fakes {
                TABLE[i].owner.store(0, Relaxed);
            }
        })
        .join()
        .unwrap();
        assert!(no_overflow(), "the untracked thread's count went with it");
    }

    extern "C" fn enter_from_handler(_: libc::c_int) {
        drop(enter()); // an fh_* call from a signal handler
    }

    /// A signal handler that makes this thread's first entry while the thread is in its own
    /// first entry (between looking for its slot and claiming one) made the thread own two
    /// slots, one of them with a depth nobody raised (found by review: 155 in 2 million).
    #[test]
    fn a_signal_during_the_first_claim_leaves_one_slot() {
        let _s = serial();
        use std::sync::atomic::AtomicBool;
        use std::sync::Arc;
        // SAFETY: installs a handler that only enters and leaves (no allocation after the
        // thread's first entry; the first one may register the release, as an fh_* would).
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = enter_from_handler as *const () as usize;
            sa.sa_flags = libc::SA_RESTART;
            libc::sigaction(libc::SIGUSR2, &sa, std::ptr::null_mut());
        }
        let stop = Arc::new(AtomicBool::new(false));
        let target = Arc::new(AtomicUsize::new(0));
        let (s2, t2) = (stop.clone(), target.clone());
        let spam = std::thread::spawn(move || {
            while !s2.load(Relaxed) {
                let t = t2.load(Relaxed);
                if t != 0 {
                    // SAFETY: the target thread is alive until `target` is cleared and we stop.
                    unsafe { libc::pthread_kill(t as libc::pthread_t, libc::SIGUSR2) };
                }
            }
        });
        let (bad, rounds) = std::thread::spawn(move || {
            let id = me();
            let b = window(id) * WINDOW;
            let _ = RELEASE.try_with(|_| ());
            target.store(id, Relaxed);
            let mut bad = 0u64;
            let rounds = 300_000;
            for _ in 0..rounds {
                // Back to "never entered", as a fresh thread with this id would be (with the
                // signal blocked: a handler's entry half-way through the reset is the test's).
                // SAFETY: plain signal-mask calls on this thread with valid sets.
                unsafe {
                    let mut set: libc::sigset_t = std::mem::zeroed();
                    libc::sigemptyset(&mut set);
                    libc::sigaddset(&mut set, libc::SIGUSR2);
                    libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
                    MINE.with(|m| m.set(NOT_YET));
                    DEPTH.with(|d| d.set(std::ptr::null()));
                    for s in &TABLE[b..b + WINDOW] {
                        if s.owner.load(Relaxed) == id {
                            s.depth.store(0, Relaxed);
                            s.owner.store(0, Relaxed);
                        }
                    }
                    libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
                }
                let g = enter();
                let owned = TABLE[b..b + WINDOW]
                    .iter()
                    .filter(|s| s.owner.load(Relaxed) == id)
                    .count();
                if owned != 1 || !is_inside() {
                    bad += 1;
                }
                drop(g);
            }
            target.store(0, Relaxed);
            (bad, rounds)
        })
        .join()
        .unwrap();
        stop.store(true, Relaxed);
        spam.join().unwrap();
        assert_eq!(
            bad, 0,
            "{bad} of {rounds} first entries owned two slots or read as outside"
        );
    }
}
