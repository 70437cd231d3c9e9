//! Re-entrancy guard for the hook path, without thread-local storage.
//!
//! A listener may itself free or unmap memory (which enters our hooks again on the same thread),
//! and a signal handler may unmap memory while its thread is running listeners. Nested calls
//! must not run the listeners again (we would recurse without end), but what they report must
//! not be lost either: a nested unmap that nobody hears of leaves a stale registration cached.
//! So a nested notification is merged into its thread's pending range, and the outer one
//! notifies that range when its own listeners are done (later than the nested call's system
//! call, but never dropped; a merged range may be wider than what went, which only costs cache
//! entries).
//!
//! Why no `thread_local!`: in a library loaded with `dlopen` (an MPI component, say) a thread's
//! first touch of the library's thread-locals allocates them with `malloc`. A hook runs inside
//! glibc's `free`/`malloc_trim` with an arena lock held, so that first touch deadlocked the
//! thread against itself (`tests/hook_dlopen_tls.rs`). The guard is a fixed table of slots
//! instead, claimed by thread id (`pthread_self`, a register read) within a window of
//! `WINDOW` slots from the id's hash: atomics only, no allocation, no lock.

use std::sync::atomic::{
    AtomicUsize, Ordering::Acquire, Ordering::Relaxed, Ordering::Release, Ordering::SeqCst,
};

use crate::seam::UnmapEvent;

const SLOTS: usize = 1024;
/// Slots a thread may claim (and where its own claim is looked for): an aligned group, so a
/// hook scans 8 slots without wrapping (about 40 instructions; 16 cost 160).
const WINDOW: usize = 8;

struct Slot {
    /// `pthread_self()` of the thread running listeners here; 0: free.
    owner: AtomicUsize,
    /// Merged range of nested notifications to deliver at the outer one's end (`usize::MAX`, 0:
    /// none). Only the owner thread (and its signal handlers) touch it while it is claimed.
    pend_start: AtomicUsize,
    pend_end: AtomicUsize,
}

#[allow(clippy::declare_interior_mutable_const)]
const FREE: Slot = Slot {
    owner: AtomicUsize::new(0),
    pend_start: AtomicUsize::new(usize::MAX),
    pend_end: AtomicUsize::new(0),
};

static TABLE: [Slot; SLOTS] = [FREE; SLOTS];

fn me() -> usize {
    // SAFETY: pthread_self has no preconditions (it reads the thread pointer).
    (unsafe { libc::pthread_self() }) as usize
}

/// Where `id`'s window starts. Thread ids are aligned addresses: mix the bits first.
fn base(id: usize) -> usize {
    (id.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40) & (SLOTS - WINDOW)
}

fn slot(base: usize, i: usize) -> &'static Slot {
    &TABLE[base + i]
}

/// This thread's claimed slot, if it is running listeners now. (Relaxed: a thread's own claim
/// is seen by itself and its signal handlers in program order; others never hold its id.)
fn own_slot(id: usize) -> Option<&'static Slot> {
    let b = base(id);
    (0..WINDOW)
        .map(|i| slot(b, i))
        .find(|s| s.owner.load(Relaxed) == id)
}

/// One pass over the window: this thread's own slot (nested), or else a slot it claimed.
enum Found {
    Nested(&'static Slot),
    Claimed(&'static Slot),
    Full,
}

fn find_or_claim(id: usize) -> Found {
    let b = base(id);
    let mut first_free = WINDOW;
    for i in 0..WINDOW {
        match slot(b, i).owner.load(Relaxed) {
            o if o == id => return Found::Nested(slot(b, i)),
            0 if first_free == WINDOW => first_free = i,
            _ => {}
        }
    }
    // Acquire on the claim: the previous owner's last writes to the pending range (Release at
    // its release) are seen.
    (first_free..WINDOW)
        .map(|i| slot(b, i))
        .find(|s| {
            s.owner.load(Relaxed) == 0 && s.owner.compare_exchange(0, id, Acquire, Relaxed).is_ok()
        })
        .map_or(Found::Full, Found::Claimed)
}

/// Merge `[start, end)` into the slot's pending range. Signal-safe against its own thread: each
/// end is one atomic read-modify-write, start first (see `deliver_pending`).
fn defer(s: &Slot, start: usize, end: usize) {
    s.pend_start.fetch_min(start, SeqCst);
    s.pend_end.fetch_max(end, SeqCst);
}

/// Rounds of `deliver_pending`: a listener that unmaps something on every notification would
/// otherwise keep it going for ever (what is still pending after them is dropped, as every
/// nested notification was before: listeners are hook-safe and do not unmap, so only such a
/// broken listener gets there).
const ROUNDS: usize = 4;

/// Notify what nested calls left in `s`, until nothing is left (a signal may add more while
/// this runs) or `ROUNDS` have run. A range whose start was taken by an earlier round reuses
/// that start: wider, never narrower.
fn deliver_pending(s: &Slot) {
    if s.pend_end.load(Relaxed) == 0 {
        return; // the usual case: nothing nested
    }
    let mut last_start = usize::MAX;
    for _ in 0..ROUNDS {
        let end = s.pend_end.swap(0, SeqCst);
        if end == 0 {
            return;
        }
        let start = match s.pend_start.swap(usize::MAX, SeqCst) {
            usize::MAX => last_start,
            a => a,
        };
        last_start = start;
        if start < end {
            super::registry::notify_all(start, end - start, UnmapEvent::Before);
        }
    }
    s.pend_end.store(0, SeqCst);
    s.pend_start.store(usize::MAX, SeqCst);
}

/// Run the listeners for [addr, addr+len) unless this thread is already inside a notification
/// (then the range is delivered when that one ends). Returns whether they ran now.
pub fn notify_guarded(addr: usize, len: usize, ev: UnmapEvent) -> bool {
    if len == 0 {
        return false;
    }
    let s = match find_or_claim(me()) {
        Found::Nested(s) => {
            // A `Done` only lets listeners wait for their own work: nothing to deliver.
            if !ev.is_done() {
                defer(s, addr, addr.saturating_add(len));
            }
            return false;
        }
        Found::Full => {
            // WINDOW other threads whose ids share this window are running listeners right
            // now: notify unguarded (listeners are hook-safe and do not unmap, so this cannot
            // recurse without end; the guard is the belt to that).
            super::registry::notify_all(addr, len, ev);
            return true;
        }
        Found::Claimed(s) => s,
    };
    super::registry::notify_all(addr, len, ev);
    deliver_pending(s);
    s.owner.store(0, Release);
    // A signal between the last delivery and the release deferred into the slot as nested:
    // deliver it as an outer call of our own (the slot is free, so nested calls in there are
    // told apart again).
    if s.pend_end.load(Relaxed) != 0 {
        let (start, end) = (
            s.pend_start.swap(usize::MAX, SeqCst),
            s.pend_end.swap(0, SeqCst),
        );
        if start < end {
            notify_guarded(start, end - start, UnmapEvent::Before);
        }
    }
    true
}

/// True while this thread is running listeners (lets the uffd reader mark itself too).
pub fn in_hook() -> bool {
    own_slot(me()).is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_finds_its_own_claim_and_no_other() {
        let id = me();
        assert!(own_slot(id).is_none());
        let Found::Claimed(s) = find_or_claim(id) else {
            panic!("a free slot, and no claim of ours yet")
        };
        assert!(matches!(find_or_claim(id), Found::Nested(n) if std::ptr::eq(n, s)));
        assert!(std::ptr::eq(own_slot(id).unwrap(), s));
        let other = std::thread::spawn(|| own_slot(me()).is_none())
            .join()
            .unwrap();
        assert!(other, "another thread does not see this thread's claim");
        s.owner.store(0, SeqCst);
        assert!(own_slot(id).is_none());
    }

    #[test]
    fn nested_ranges_merge_wider_never_narrower() {
        let s = Slot {
            owner: AtomicUsize::new(0),
            pend_start: AtomicUsize::new(usize::MAX),
            pend_end: AtomicUsize::new(0),
        };
        defer(&s, 0x5000, 0x6000);
        defer(&s, 0x2000, 0x3000);
        assert_eq!(s.pend_start.load(SeqCst), 0x2000);
        assert_eq!(s.pend_end.load(SeqCst), 0x6000);
    }
}
