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

use crate::rt::inside::{me, spread};
use crate::rt::seam::UnmapEvent;

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

/// Where `id`'s window starts.
fn base(id: usize) -> usize {
    spread(id) & (SLOTS - WINDOW)
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

/// Notify what nested calls left in `s`, until nothing is left (a signal may add more while
/// this runs). A range whose start was taken by an earlier round reuses that start: wider,
/// never narrower.
///
/// Why no bound on the rounds: each round is there because something was unmapped on this
/// thread during the previous one (a signal handler's `munmap`, or a listener's own), and
/// dropping it leaves a registration of those pages cached: a stale hit. This stopped after 4
/// rounds and dropped the rest, so a fifth nested unmap in a row (a handler that unmaps, run
/// once per round) was never reported (`tests::nested_notifications_are_delivered_however_deep`).
/// The loop ends when a round adds nothing; only a listener that unmaps on every call it gets
/// would keep it going, and `seam::MemoryListener` forbids that.
fn deliver_pending(s: &Slot) {
    if s.pend_end.load(Relaxed) == 0 {
        return; // the usual case: nothing nested
    }
    let mut last_start = usize::MAX;
    loop {
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
}

/// Run the listeners for [addr, addr+len) unless this thread is already inside a notification
/// (then the range is delivered when that one ends). Returns whether they ran now.
pub(super) fn notify_guarded(addr: usize, len: usize, ev: UnmapEvent) -> bool {
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
pub(super) fn in_hook() -> bool {
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

    use crate::rt::seam::MemoryListener;
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;

    const PAGE: usize = 4096;
    const LINKS: usize = 12;

    /// A listener that, told of link `k` of its chain (made-up pages no one else reports), makes
    /// the unmap of link `k + 1` on the same thread, as a signal handler's `munmap` (or a
    /// listener's own) does: a nested notification. Records which links it was told of, what
    /// each nested call returned, and how deep its calls nested.
    struct Chain {
        base: usize,
        links: usize,
        seen: [AtomicBool; LINKS],
        ran_now: [AtomicBool; LINKS],
        depth: AtomicUsize,
        max_depth: AtomicUsize,
    }

    impl Chain {
        fn new(base: usize, links: usize) -> Arc<Chain> {
            assert!(links <= LINKS);
            Arc::new(Chain {
                base,
                links,
                seen: std::array::from_fn(|_| AtomicBool::new(false)),
                ran_now: std::array::from_fn(|_| AtomicBool::new(false)),
                depth: AtomicUsize::new(0),
                max_depth: AtomicUsize::new(0),
            })
        }

        fn link(&self, k: usize) -> usize {
            self.base + k * PAGE
        }

        fn seen(&self) -> Vec<usize> {
            (0..self.links)
                .filter(|&k| self.seen[k].load(SeqCst))
                .collect()
        }
    }

    impl MemoryListener for Chain {
        fn on_unmap(&self, addr: usize, len: usize) {
            if len != PAGE || addr < self.base || addr >= self.link(self.links) {
                return; // another test's notification
            }
            let k = (addr - self.base) / PAGE;
            let d = self.depth.fetch_add(1, SeqCst) + 1;
            self.max_depth.fetch_max(d, SeqCst);
            self.seen[k].store(true, SeqCst);
            if k + 1 < self.links {
                let now = notify_guarded(self.link(k + 1), PAGE, UnmapEvent::Before);
                self.ran_now[k + 1].store(now, SeqCst);
            }
            self.depth.fetch_sub(1, SeqCst);
        }
    }

    /// Nested notifications are deferred (never run inside the listeners that caused them) and
    /// all delivered before the outer call returns, however long the chain. The rounds were
    /// capped at 4: links 5.. of this chain were dropped, so a fifth nested unmap in a row was
    /// never reported to any cache.
    #[test]
    fn nested_notifications_are_delivered_however_deep() {
        let chain = Chain::new(0x7ccc_1000_0000, LINKS);
        let sub = super::super::registry::subscribe(chain.clone());
        assert!(sub.is_active());
        let (ran, claimed_before) = std::thread::spawn({
            let chain = chain.clone();
            move || {
                let free = (0..WINDOW).any(|i| slot(base(me()), i).owner.load(SeqCst) == 0);
                (
                    notify_guarded(chain.link(0), PAGE, UnmapEvent::Before),
                    free,
                )
            }
        })
        .join()
        .unwrap();
        drop(sub);
        assert!(ran, "the outer call ran its listeners");
        assert_eq!(
            chain.seen(),
            (0..LINKS).collect::<Vec<_>>(),
            "every link of the chain reported before the outer call returned"
        );
        if claimed_before {
            assert_eq!(
                chain.max_depth.load(SeqCst),
                1,
                "nested calls were deferred"
            );
            assert!((1..LINKS).all(|k| !chain.ran_now[k].load(SeqCst)));
        }
    }

    /// A thread whose whole window is taken by other threads' claims (here: made-up owner
    /// words) cannot be guarded: its notification still reaches the listeners, at once, and so
    /// do nested ones made while they run (unguarded, so they nest), before the outer returns.
    #[test]
    fn a_full_window_still_notifies() {
        let chain = Chain::new(0x7ccc_2000_0000, 3);
        let sub = super::super::registry::subscribe(chain.clone());
        assert!(sub.is_active());
        let (full, ran) = std::thread::spawn({
            let chain = chain.clone();
            move || {
                let b = base(me());
                // Never a `pthread_self` (a TCB address: aligned, far above).
                let fakes: Vec<usize> = (0..WINDOW)
                    .filter(|&i| {
                        let s = slot(b, i);
                        s.owner
                            .compare_exchange(0, 0x11 + 2 * i, SeqCst, SeqCst)
                            .is_ok()
                    })
                    .collect();
                let full = matches!(find_or_claim(me()), Found::Full);
                let ran = notify_guarded(chain.link(0), PAGE, UnmapEvent::Before);
                for i in fakes {
                    slot(b, i).owner.store(0, SeqCst);
                }
                (full, ran)
            }
        })
        .join()
        .unwrap();
        drop(sub);
        assert!(full, "the window was full");
        assert!(ran, "told at once");
        assert_eq!(chain.seen(), vec![0, 1, 2], "every link reported");
        assert!(chain.ran_now[1].load(SeqCst) && chain.ran_now[2].load(SeqCst));
        assert_eq!(
            chain.max_depth.load(SeqCst),
            3,
            "unguarded: nested calls nest"
        );
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
