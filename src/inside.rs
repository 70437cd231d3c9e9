//! "This thread is inside the library": a per-thread depth, raised by every C entry point
//! (`ffi_guard!`), by the remote-pinning driver's own calls (`rma::Rma`), and for good by the
//! library's own threads (progress, revoke worker).
//!
//! Why: a memory listener that may *wait* in hook context (the revoke listener of
//! `rma::revoke`, after an unmap) waits for a helper thread that takes the library's locks (the
//! Firehose engine, the active-message endpoint and its receive stash, the pin-down cache). A
//! thread inside the library may hold one of them while it frees memory; if it waited there, it
//! would wait for itself. So a listener never waits on a thread that [`is_inside`]: it only
//! queues its work.
//!
//! Why the depth lives in a table and not in a thread-local: [`is_inside`] runs in hook context,
//! possibly inside glibc's heap trimming with a malloc arena's mutex held. In a library loaded
//! with `dlopen` a thread-local is reached through `__tls_get_addr`, which allocates on a thread's
//! first access (and may reallocate the thread's vector after another `dlopen`): a deadlock on
//! that mutex. So each thread that enters the library claims a slot keyed by `pthread_self` (as
//! `monitor/guard.rs` does), and the hook side reads only the table. The thread-local here holds
//! the slot's index for the entering side, which never runs in hook context; a second
//! thread-local with a destructor frees the slot when the thread exits.
//!
//! A thread that finds no free slot in its window is counted as untracked; while any is alive,
//! [`is_inside`] answers "inside" for every thread it cannot find (never waiting is always
//! safe; waiting on oneself is not).

use std::cell::Cell;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering::Acquire, Ordering::Relaxed};

const SLOTS: usize = 1024;
/// Slots a thread may claim, and where its claim is looked for: an aligned group.
const WINDOW: usize = 8;
/// `MINE` before the thread's first entry, and when it found no slot.
const NOT_YET: usize = usize::MAX;
const UNTRACKED: usize = usize::MAX - 1;

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

static TABLE: [Slot; SLOTS] = [FREE; SLOTS];
/// Live threads that entered the library without a slot.
static UNTRACKED_LIVE: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// This thread's slot index (or `NOT_YET`, `UNTRACKED`). Const-initialised, no destructor.
    static MINE: Cell<usize> = const { Cell::new(NOT_YET) };
    /// Touched once, at the first entry: its destructor gives the slot back at thread exit.
    static RELEASE: Release = const { Release };
}

struct Release;

impl Drop for Release {
    fn drop(&mut self) {
        let i = MINE.try_with(|m| m.replace(NOT_YET)).unwrap_or(NOT_YET);
        if i < SLOTS {
            TABLE[i].depth.store(0, Relaxed);
            TABLE[i]
                .owner
                .store(0, std::sync::atomic::Ordering::Release);
        } else if i == UNTRACKED {
            UNTRACKED_LIVE.fetch_sub(1, Relaxed);
        }
    }
}

fn me() -> usize {
    // SAFETY: pthread_self has no preconditions (it reads the thread pointer).
    (unsafe { libc::pthread_self() }) as usize
}

/// Where `id`'s window starts (thread ids are aligned addresses: mix the bits first).
fn base(id: usize) -> usize {
    (id.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40) & (SLOTS - WINDOW)
}

/// The index of `id`'s slot, if it has one.
fn find(id: usize) -> Option<usize> {
    let b = base(id);
    (b..b + WINDOW).find(|&i| TABLE[i].owner.load(Acquire) == id)
}

/// First entry of this thread: claim a slot (or adopt one left with this id by a thread that
/// exited without its destructor running), and arm the release at exit.
#[cold]
#[inline(never)]
fn claim() -> usize {
    let id = me();
    let b = base(id);
    let found = find(id).or_else(|| {
        (b..b + WINDOW).find(|&i| {
            TABLE[i]
                .owner
                .compare_exchange(0, id, Acquire, Relaxed)
                .is_ok()
        })
    });
    let i = match found {
        Some(i) => {
            TABLE[i].depth.store(0, Relaxed);
            i
        }
        None => {
            UNTRACKED_LIVE.fetch_add(1, Relaxed);
            UNTRACKED
        }
    };
    // Registers the destructor (may allocate: we are on an entry path, not in a hook).
    let _ = RELEASE.try_with(|_| ());
    i
}

/// This thread's slot index, claimed on first use.
#[inline]
fn mine() -> usize {
    MINE.try_with(|m| {
        let i = m.get();
        if i != NOT_YET {
            return i;
        }
        let i = claim();
        m.set(i);
        i
    })
    // Thread teardown: no slot (the release already ran or is running).
    .unwrap_or(UNTRACKED)
}

/// Keeps this thread marked as inside the library until dropped (nests).
#[must_use = "the thread counts as inside only while the guard lives"]
pub struct Inside {
    slot: usize,
    /// Not `Send`: it must be dropped on the thread that made it.
    _thread: PhantomData<*const ()>,
}

/// Marks this thread as inside the library until the guard is dropped.
#[inline]
pub fn enter() -> Inside {
    let slot = mine();
    if slot < SLOTS {
        let d = &TABLE[slot].depth;
        // Only this thread writes its slot: a load and a store, no locked instruction.
        d.store(d.load(Relaxed).saturating_add(1), Relaxed);
    }
    Inside {
        slot,
        _thread: PhantomData,
    }
}

impl Drop for Inside {
    #[inline]
    fn drop(&mut self) {
        if self.slot < SLOTS {
            let d = &TABLE[self.slot].depth;
            d.store(d.load(Relaxed).saturating_sub(1), Relaxed);
        }
    }
}

/// Marks the calling thread as the library's own, for the rest of its life.
pub fn mark_thread() {
    std::mem::forget(enter());
}

/// Whether this thread is inside the library (or is one of its threads). Hook-safe: no
/// thread-local, no allocation, no lock (a scan of 8 slots). A thread it cannot find counts as
/// inside while some thread entered without a slot.
pub fn is_inside() -> bool {
    match find(me()) {
        Some(i) => TABLE[i].depth.load(Relaxed) != 0,
        None => UNTRACKED_LIVE.load(Relaxed) != 0,
    }
}

/// In the child of a fork (atfork child handler, one thread): the other threads are gone, so
/// their slots are freed; the calling thread keeps its own.
pub fn fork_child() {
    let id = me();
    for s in TABLE.iter() {
        let o = s.owner.load(Relaxed);
        if o != 0 && o != id {
            s.depth.store(0, Relaxed);
            s.owner.store(0, Relaxed);
        }
    }
    let mine_untracked = MINE.try_with(|m| m.get() == UNTRACKED).unwrap_or(false);
    UNTRACKED_LIVE.store(mine_untracked as usize, Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nests_and_is_per_thread() {
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
        for _round in 0..(3 * SLOTS / 16) {
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
        assert_eq!(UNTRACKED_LIVE.load(Relaxed), 0);
    }
}
