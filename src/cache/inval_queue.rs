//! Fixed-size, preallocated, lock-free queue of invalidated ranges.
//!
//! Producers are memory hooks (any thread, possibly re-entered from inside the cache), so a push
//! never allocates and never takes a lock: it claims a cell or reports that the ring is full. The
//! single consumer is the cache's writer, which drains under its mutex. On overflow the caller
//! sets a flag that makes the next drain invalidate everything, which is always safe.
//!
//! The ring is crossbeam's `ArrayQueue` (allocated once, here): its `pop` waits for a cell that a
//! producer has claimed but not yet written instead of reporting "empty". A hand-written ring here
//! once stopped at such a cell, so a drain could finish while a *later*, completed push (whose
//! `invalidate` had returned) sat behind it: a stale hit. The wait is bounded: a producer between
//! its claim and its write runs no code that can block.

use crossbeam_queue::ArrayQueue;

/// Ring capacity. The queue must hold fewer than 100 entries whatever happens (see docs/guarantees.md, "The
/// invalidation guarantee"), so the ring itself is the bound (a full ring falls back to "invalidate
/// all").
pub const QUEUE_CAPACITY: usize = 64;

pub(super) struct InvalQueue {
    ring: ArrayQueue<(usize, usize)>,
}

impl InvalQueue {
    pub(super) fn new() -> Self {
        InvalQueue {
            ring: ArrayQueue::new(QUEUE_CAPACITY),
        }
    }

    /// Push `[start, end)`. Returns false when the ring is full. Hook-safe: no allocation, no lock.
    #[inline]
    pub(super) fn push(&self, start: usize, end: usize) -> bool {
        self.ring.push((start, end)).is_ok()
    }

    /// Pop one entry, waiting for one that is claimed but not yet written. Called by the single
    /// consumer (the cache's writer, which holds the cache mutex). `None` once every push that
    /// started before this call is taken.
    #[inline]
    pub(super) fn pop(&self) -> Option<(usize, usize)> {
        self.ring.pop()
    }

    /// True when nothing is queued. Tests only: the hit path checks the cache's gate (one word,
    /// gate.rs), not the ring's head and tail (two lines).
    #[cfg(test)]
    pub(super) fn is_empty(&self) -> bool {
        self.ring.is_empty()
    }

    /// Entries pushed and not yet popped (approximate under concurrent pushes).
    pub(super) fn len(&self) -> usize {
        self.ring.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::Arc;

    #[test]
    fn fifo_and_full() {
        let q = InvalQueue::new();
        for i in 0..QUEUE_CAPACITY {
            assert!(q.push(i, i + 1));
        }
        assert!(!q.push(99, 100), "ring must report full");
        assert_eq!(q.len(), QUEUE_CAPACITY);
        for i in 0..QUEUE_CAPACITY {
            assert_eq!(q.pop(), Some((i, i + 1)));
        }
        assert_eq!(q.pop(), None);
        assert!(q.is_empty());
        assert!(q.push(5, 6));
        assert!(!q.is_empty());
        assert_eq!(q.pop(), Some((5, 6)));
    }

    /// Every push that *returned* before a drain started is taken by that drain, even while other
    /// producers are between claiming a cell and writing it. (The hand-written ring this replaced
    /// stopped at a claimed-but-unwritten cell and failed this within a second.)
    #[test]
    fn a_drain_takes_every_completed_push() {
        const PRODUCERS: usize = 8;
        let q = Arc::new(InvalQueue::new());
        let done: Arc<Vec<AtomicUsize>> = Arc::new((0..PRODUCERS).map(|_| 0.into()).collect());
        let stop = Arc::new(AtomicBool::new(false));
        let hs: Vec<_> = (0..PRODUCERS)
            .map(|p| {
                let (q, done, stop) = (q.clone(), done.clone(), stop.clone());
                std::thread::spawn(move || {
                    let mut i = 0;
                    while !stop.load(Ordering::Relaxed) {
                        if q.push(p, i + 1) {
                            i += 1;
                            done[p].store(i, Ordering::Release);
                        } else {
                            std::thread::yield_now();
                        }
                    }
                })
            })
            .collect();
        let mut seen = [0usize; PRODUCERS];
        let t0 = std::time::Instant::now();
        let mut drains = 0u64;
        while t0.elapsed() < std::time::Duration::from_millis(1500) {
            let want: Vec<usize> = done.iter().map(|d| d.load(Ordering::Acquire)).collect();
            while let Some((p, i)) = q.pop() {
                assert_eq!(i, seen[p] + 1, "per-producer order");
                seen[p] = i;
            }
            drains += 1;
            for p in 0..PRODUCERS {
                assert!(
                    seen[p] >= want[p],
                    "drain {drains}: producer {p}'s push #{} had returned, drain saw only #{}",
                    want[p],
                    seen[p]
                );
            }
        }
        stop.store(true, Ordering::Relaxed);
        for h in hs {
            h.join().unwrap();
        }
    }
}
