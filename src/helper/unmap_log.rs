//! The unmaps in progress through the patched libc entries, for the helper thread's `prefetch`.
//!
//! Why: a patched `munmap` first invalidates, then unmaps. A caller that registers memory while
//! another of its threads frees it is using memory after free (the application's bug), but the
//! helper pins memory nobody asked for at that moment: if its pin lands between a hook's
//! invalidation and the system call (the hook's filter found nothing cached, then the helper
//! inserted and pinned), it holds the old pages and the next registration of the new memory at
//! that address would hit it. So every patched unmap is logged from before its invalidation
//! until after its system call, and the helper's prefetch (`Cache::prefetch` through
//! `helper`) checks the log: it does not pin a range that an unmap in flight overlaps, and after
//! pinning it drops the region again if an overlapping unmap began meanwhile.
//!
//! Hook-safe: a fixed ring of 64 slots written with atomics only. A slot that was overwritten
//! (more than 64 unmaps since) or is being written counts as overlapping: the answers err on
//! "raced", which costs a caller a synchronous pin, never a stale registration.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::SeqCst};

use crate::rt::fork::{self, ForkHook};

const SLOTS: usize = 64;

struct Slot {
    /// seq + 1 of the unmap written here (0: none yet).
    begun: AtomicU64,
    start: AtomicUsize,
    end: AtomicUsize,
    /// seq + 1 once that unmap's system call returned.
    ended: AtomicU64,
}

#[allow(clippy::declare_interior_mutable_const)]
const EMPTY: Slot = Slot {
    begun: AtomicU64::new(0),
    start: AtomicUsize::new(0),
    end: AtomicUsize::new(0),
    ended: AtomicU64::new(0),
};

static LOG: [Slot; SLOTS] = [EMPTY; SLOTS];
static NEXT: AtomicU64 = AtomicU64::new(0);
static IN_FLIGHT: AtomicUsize = AtomicUsize::new(0);

/// An unmap of `[start, end)` is about to be announced and carried out.
pub fn begin(start: usize, end: usize) -> u64 {
    IN_FLIGHT.fetch_add(1, SeqCst);
    let seq = NEXT.fetch_add(1, SeqCst);
    let s = &LOG[seq as usize % SLOTS];
    s.begun.store(0, SeqCst);
    s.start.store(start, SeqCst);
    s.end.store(end, SeqCst);
    s.begun.store(seq + 1, SeqCst);
    seq
}

/// The system call of unmap `seq` returned.
pub fn end(seq: u64) {
    LOG[seq as usize % SLOTS].ended.store(seq + 1, SeqCst);
    IN_FLIGHT.fetch_sub(1, SeqCst);
}

/// Place 60 of `rt::fork`'s order (after the locks, with none of its own): the child ends the
/// unmaps of the parent's other threads. Registered with the hooks' windows
/// (`pins_ahead::install_unmap_windows`).
pub(crate) static FORK_HOOK: ForkHook = ForkHook {
    order: 60,
    prepare: fork::nothing,
    parent: fork::nothing,
    child: fork_child,
};

/// In a forked child (the atfork child handler, one thread left): the unmaps that other parent
/// threads had in flight will never end here. Left counted, they made every range look raced to
/// the child's helper for good, so it never pinned ahead (`tests/fork_unmap_log.rs`). No lock, no
/// allocation.
fn fork_child() {
    for s in &LOG {
        let begun = s.begun.load(SeqCst);
        if begun != 0 {
            s.ended.store(begun, SeqCst);
        }
    }
    IN_FLIGHT.store(0, SeqCst);
}

/// A point in the log to check against later (`begun_since`).
#[cfg(any(test, feature = "test-support"))]
pub fn mark() -> u64 {
    NEXT.load(SeqCst)
}

/// The slot of `seq` as it stands: `Some((start, end, ended))`, or `None` when it holds another
/// unmap or is being written.
fn read(seq: u64) -> Option<(usize, usize, bool)> {
    let s = &LOG[seq as usize % SLOTS];
    if s.begun.load(SeqCst) != seq + 1 {
        return None;
    }
    let (a, b) = (s.start.load(SeqCst), s.end.load(SeqCst));
    let ended = s.ended.load(SeqCst) == seq + 1;
    // Still the same unmap after reading its range (a writer clears `begun` first).
    (s.begun.load(SeqCst) == seq + 1).then_some((a, b, ended))
}

/// A mark for `begun_since` at or before every unmap still in flight now. An unmap that ended
/// before this call ran its listeners before it ended, so a consumer of their reports that takes
/// this mark first and then empties its report queue has seen every unmap before the mark, and
/// `begun_since` covers every other one (one still in flight may not have reported yet). Unknown
/// slots give a mark so old that `begun_since` answers "raced".
pub fn mark_before_unfinished() -> u64 {
    let next = NEXT.load(SeqCst);
    let pending = IN_FLIGHT.load(SeqCst);
    if pending == 0 {
        return next;
    }
    let lo = next.saturating_sub(SLOTS as u64);
    let unknown = lo.saturating_sub(1);
    let mut oldest = next;
    let mut seen = 0;
    for seq in lo..next {
        match read(seq) {
            None => return unknown,
            Some((_, _, true)) => {}
            Some((_, _, false)) => {
                oldest = oldest.min(seq);
                seen += 1;
            }
        }
    }
    // One older than the ring is still running.
    if seen < pending {
        unknown
    } else {
        oldest
    }
}

/// Whether an unmap overlapping `[start, end)` is in flight now (or might be: unknown slots).
pub fn in_flight_overlapping(start: usize, end: usize) -> bool {
    let pending = IN_FLIGHT.load(SeqCst);
    if pending == 0 {
        return false;
    }
    let next = NEXT.load(SeqCst);
    let mut seen = 0;
    for seq in next.saturating_sub(SLOTS as u64)..next {
        match read(seq) {
            None => return true,
            Some((_, _, true)) => {}
            Some((a, b, false)) => {
                if a < end && start < b {
                    return true;
                }
                seen += 1;
            }
        }
    }
    // An unmap older than the ring is still running: unknown range.
    seen < pending
}

/// Whether an unmap overlapping `[start, end)` began since `mark` (or might have).
pub fn begun_since(mark: u64, start: usize, end: usize) -> bool {
    let next = NEXT.load(SeqCst);
    if next.saturating_sub(mark) > SLOTS as u64 {
        return true;
    }
    (mark..next).any(|seq| match read(seq) {
        None => true,
        Some((a, b, _)) => a < end && start < b,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    // The log is process-wide and other tests unmap memory through the hooks meanwhile: use
    // ranges no one else has (high, made-up addresses) and only assert what they cannot change.
    const BASE: usize = 0x7eee_0000_0000;

    /// An unmap in flight at the mark (its report may come after the consumer emptied its queue)
    /// stays after the mark even once it has ended; one that ended before does not.
    #[test]
    fn a_mark_before_unfinished_covers_what_was_in_flight() {
        let (a, b) = (BASE + 0x100000, BASE + 0x110000);
        let done = begin(a, b);
        end(done);
        let seq = begin(a, b);
        let m = mark_before_unfinished();
        assert!(m <= seq, "mark {m}, unfinished {seq}");
        end(seq);
        assert!(begun_since(m, a, b));
        // Nothing of ours in flight: the mark is past both (another test's unmap in flight
        // elsewhere can only make it older).
        let m2 = mark_before_unfinished();
        assert!(m2 <= mark());
        if m2 > seq {
            assert!(!begun_since(m2, a, b));
        }
    }

    #[test]
    fn in_flight_and_since() {
        let (a, b) = (BASE, BASE + 0x10000);
        let m = mark();
        let seq = begin(a, b);
        assert!(in_flight_overlapping(a + 0x1000, a + 0x2000));
        assert!(begun_since(m, a, a + 0x1000));
        end(seq);
        assert!(
            begun_since(m, a, a + 0x1000),
            "began since the mark, ended or not"
        );
        let m2 = mark();
        // Ours is no longer in flight, and nothing began since m2 in our range (others' unmaps
        // elsewhere may be logged, but only an unknown slot could answer true here).
        if !in_flight_overlapping(b, b + 0x1000) {
            assert!(!in_flight_overlapping(a, b) || IN_FLIGHT.load(SeqCst) > 0);
        }
        let _ = begun_since(m2, a, b);
    }

    #[test]
    fn a_flood_of_unmaps_answers_raced() {
        let m = mark();
        for i in 0..SLOTS + 1 {
            let s = begin(
                BASE + 0x100_0000 + i * 4096,
                BASE + 0x100_0000 + (i + 1) * 4096,
            );
            end(s);
        }
        assert!(begun_since(m, 0, 4096), "overwritten: unknown, so raced");
    }
}
