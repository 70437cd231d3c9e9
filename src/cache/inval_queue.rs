//! Fixed-size, preallocated, lock-free queue of invalidated ranges.
//!
//! Producers are memory hooks (any thread, possibly re-entered from inside the cache), so a push
//! never allocates and never waits: it claims a cell with one CAS (bounded multi-producer ring
//! with per-cell sequence numbers, the classic "sequence = position when free, position + 1 when
//! full" scheme) or reports that the ring is full. The single consumer is the cache's writer,
//! which drains under its mutex. On overflow the caller sets a flag that makes the next drain
//! invalidate everything, which is always safe.

use std::sync::atomic::{AtomicUsize, Ordering};

/// Ring capacity. Case 5 of ARCHITECTURE.md wants fewer than 100 queued entries whatever happens,
/// so the ring itself is the bound (a full ring falls back to "invalidate all").
pub const QUEUE_CAPACITY: usize = 64;

struct Cell {
    seq: AtomicUsize,
    start: AtomicUsize,
    end: AtomicUsize,
}

pub struct InvalQueue {
    cells: [Cell; QUEUE_CAPACITY],
    head: AtomicUsize, // next position to push
    tail: AtomicUsize, // next position to pop (consumer only)
}

impl InvalQueue {
    pub fn new() -> Self {
        InvalQueue {
            cells: std::array::from_fn(|i| Cell {
                seq: AtomicUsize::new(i),
                start: AtomicUsize::new(0),
                end: AtomicUsize::new(0),
            }),
            head: AtomicUsize::new(0),
            tail: AtomicUsize::new(0),
        }
    }

    /// Push `[start, end)`. Returns false when the ring is full. Hook-safe: no allocation, no lock.
    pub fn push(&self, start: usize, end: usize) -> bool {
        let mut pos = self.head.load(Ordering::Relaxed);
        loop {
            let cell = &self.cells[pos % QUEUE_CAPACITY];
            let seq = cell.seq.load(Ordering::Acquire);
            let dif = seq.wrapping_sub(pos) as isize;
            if dif == 0 {
                match self.head.compare_exchange_weak(
                    pos,
                    pos.wrapping_add(1),
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => {
                        cell.start.store(start, Ordering::Relaxed);
                        cell.end.store(end, Ordering::Relaxed);
                        // Publishes the data to the consumer.
                        cell.seq.store(pos.wrapping_add(1), Ordering::Release);
                        return true;
                    }
                    Err(now) => pos = now,
                }
            } else if dif < 0 {
                return false; // full: the consumer has not freed this cell yet
            } else {
                pos = self.head.load(Ordering::Relaxed);
            }
        }
    }

    /// Pop one completed entry. Must only be called by the single consumer (the cache's writer,
    /// which holds the cache mutex). Stops at a cell whose producer has not finished writing.
    pub fn pop(&self) -> Option<(usize, usize)> {
        let pos = self.tail.load(Ordering::Relaxed);
        let cell = &self.cells[pos % QUEUE_CAPACITY];
        let seq = cell.seq.load(Ordering::Acquire);
        if seq != pos.wrapping_add(1) {
            return None;
        }
        let range = (
            cell.start.load(Ordering::Relaxed),
            cell.end.load(Ordering::Relaxed),
        );
        self.tail.store(pos.wrapping_add(1), Ordering::Relaxed);
        cell.seq
            .store(pos.wrapping_add(QUEUE_CAPACITY), Ordering::Release);
        Some(range)
    }

    /// Entries pushed and not yet popped (approximate under concurrent pushes).
    pub fn len(&self) -> usize {
        self.head
            .load(Ordering::Acquire)
            .wrapping_sub(self.tail.load(Ordering::Acquire))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert!(q.push(5, 6));
        assert_eq!(q.pop(), Some((5, 6)));
    }

    #[test]
    fn concurrent_producers_lose_nothing_until_full() {
        let q = std::sync::Arc::new(InvalQueue::new());
        let per = QUEUE_CAPACITY / 4;
        let hs: Vec<_> = (0..4)
            .map(|t| {
                let q = q.clone();
                std::thread::spawn(move || {
                    for i in 0..per {
                        assert!(q.push(t * 1000 + i, 1));
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        let mut got = Vec::new();
        while let Some((s, _)) = q.pop() {
            got.push(s);
        }
        got.sort();
        let mut want: Vec<usize> = (0..4)
            .flat_map(|t| (0..per).map(move |i| t * 1000 + i))
            .collect();
        want.sort();
        assert_eq!(got, want);
    }
}
