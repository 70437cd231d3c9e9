//! The gate: the one cache line that every hit reads of the writer and the invalidation queue.
//! A hit may proceed only when both of its words are 0:
//!
//! * `writer`: a writer has excluded (or is excluding) readers from the index;
//! * `count`: its `OVERFLOW` bit (a hook found the ring full, or the cache was quarantined after
//!   fork: the next drain invalidates everything) and, below it, invalidations *announced* and
//!   not yet drained. `invalidate` adds 1 before it pushes its range into the ring; the drain
//!   subtracts what it popped once those ranges are detached.
//!
//! Why hand-written, for the hit path: the hit used to read the writer flag, the ring's head and
//! tail (crossbeam pads them onto two lines) and the overflow flag, four lines; one line now, and
//! the release reads one word. The writer flag is a word of its own (not a bit of `count`) so a
//! writer lowers it with a plain store, not a locked instruction: every miss raises and lowers it
//! once, right after system calls, where a locked instruction is slow.
//!
//! Why no invalidation is missed. Let `invalidate(r)` return before a hit starts. Its `announce`
//! (a SeqCst RMW on `count`) precedes the hit's SeqCst load of `count`, so the hit sees that +1
//! unless a drain has subtracted it since. A drain subtracts only what it popped, and it pops an
//! entry only after that entry's +1 (announce comes before push): at every point of the word's
//! modification order the count is at least the number of announced entries not yet popped and
//! accounted for (each subtraction stands for a distinct earlier +1). So a 0 means `r` was popped
//! by a drain that detached every region overlapping it, under the reader exclusion, before
//! subtracting. A push that finds the ring full turns its +1 into `OVERFLOW` (set before the +1
//! goes, so the word is never 0 in between); a drain clears `OVERFLOW` while readers are excluded
//! and then invalidates every region, so a later overflow stays visible to the next hit. The
//! `writer` word keeps the reader/writer protocol of `exclusion.rs` unchanged: raised with a
//! SeqCst store before the writer looks at the reader slots; a reader enters its slot, then loads
//! it.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

const OVERFLOW: usize = 1 << 63;
const COUNT: usize = OVERFLOW - 1;

pub(super) struct Gate {
    writer: AtomicBool,
    count: AtomicUsize,
    /// Not part of the gate's protocol: the cache's count of exclusive reader slots that ever
    /// entered it and the highest such id (`Cache::join`, `Writer::exclude`). Kept in the gate's
    /// line because every writer reads it right after raising `writer`: one line fewer per miss.
    /// Written once per joining thread, so the hits reading this line see no extra traffic.
    pub(super) joined: (AtomicUsize, AtomicUsize),
}

/// What a reader found.
pub(super) enum Seen {
    Open,
    /// A writer is active: wait for it, retry.
    Writer,
    /// Invalidations wait: drain first (the slow path).
    Pending,
}

impl Gate {
    pub(super) const fn new() -> Self {
        Gate {
            writer: AtomicBool::new(false),
            count: AtomicUsize::new(0),
            joined: (AtomicUsize::new(0), AtomicUsize::new(0)),
        }
    }

    /// The reader's check (after entering its slot).
    #[inline(always)]
    pub(super) fn check(&self) -> Seen {
        // Both loads (writer first, the protocol's order), then one branch for the common case.
        let w = self.writer.load(Ordering::SeqCst);
        let c = self.count.load(Ordering::SeqCst);
        if !w && c == 0 {
            Seen::Open
        } else if w {
            Seen::Writer
        } else {
            Seen::Pending
        }
    }

    /// A writer is active (relaxed: for spinning only; decisions use `check`).
    #[inline]
    pub(super) fn writer_active(&self) -> bool {
        self.writer.load(Ordering::Relaxed)
    }

    /// The hook filter's check: a writer may be mutating the index (SeqCst, as `check`).
    #[inline]
    pub(super) fn writer_seen(&self) -> bool {
        self.writer.load(Ordering::SeqCst)
    }

    /// Invalidations (or an overflow) wait to be drained.
    #[inline(always)]
    pub(super) fn pending(&self) -> bool {
        self.count.load(Ordering::SeqCst) != 0
    }

    /// SeqCst: the store-load barrier before the writer reads the reader slots (Dekker).
    pub(super) fn raise_writer(&self) {
        self.writer.store(true, Ordering::SeqCst);
    }

    /// Release: a reader that sees the flag down sees the index as the writer left it.
    pub(super) fn lower_writer(&self) {
        self.writer.store(false, Ordering::Release);
    }

    /// Hook side, before pushing a range: from here on every hit misses until a drain took it.
    #[inline]
    pub(super) fn announce(&self) {
        self.count.fetch_add(1, Ordering::SeqCst);
    }

    /// Hook side, the push of an announced range failed (ring full).
    pub(super) fn overflowed(&self) {
        self.count.fetch_or(OVERFLOW, Ordering::SeqCst);
        self.count.fetch_sub(1, Ordering::SeqCst);
    }

    /// After fork (child, one thread): every call takes the slow path, no writer is left raised.
    pub(super) fn quarantine(&self) {
        self.count.fetch_or(OVERFLOW, Ordering::SeqCst);
        self.writer.store(false, Ordering::SeqCst);
    }

    /// Drain, readers excluded: clear and return the overflow bit.
    pub(super) fn take_overflow(&self) -> bool {
        self.count.fetch_and(!OVERFLOW, Ordering::SeqCst) & OVERFLOW != 0
    }

    /// Drain, readers excluded: `n` popped ranges are detached.
    pub(super) fn drained(&self, n: usize) {
        if n != 0 {
            let prev = self.count.fetch_sub(n, Ordering::SeqCst);
            debug_assert!(prev & COUNT >= n, "gate count underflow");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bits_and_count() {
        let g = Gate::new();
        assert!(matches!(g.check(), Seen::Open));
        g.announce();
        assert!(g.pending() && matches!(g.check(), Seen::Pending));
        g.raise_writer();
        assert!(matches!(g.check(), Seen::Writer) && g.writer_active() && g.pending());
        g.drained(1);
        assert!(!g.pending());
        g.lower_writer();
        assert!(matches!(g.check(), Seen::Open));
        g.announce();
        g.overflowed();
        assert!(g.pending());
        assert!(g.take_overflow());
        assert!(!g.take_overflow());
        assert!(matches!(g.check(), Seen::Open));
        g.raise_writer();
        g.quarantine();
        assert!(!g.writer_active() && g.pending());
    }
}
