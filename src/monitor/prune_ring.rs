//! Single-producer (uffd reader thread) / single-consumer (watch path, under its mutex) ring of
//! ranges that stopped being registered (UNMAP, REMAP source).
//!
//! Why not a mutex: the reader must never block on anything a munmapping thread could hold, and
//! the watch path allocates (malloc may trim a registered heap and wait for the reader).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};

const CAP: usize = 256;

pub struct PruneRing {
    start: [AtomicUsize; CAP],
    end: [AtomicUsize; CAP],
    head: AtomicUsize, // next write (producer)
    tail: AtomicUsize, // next read (consumer)
    /// Set when the producer found the ring full: the consumer must forget everything.
    overflow: AtomicBool,
    /// Non-zero while the producer is between reading events and publishing their ranges.
    busy: AtomicUsize,
}

#[allow(clippy::declare_interior_mutable_const)]
const Z: AtomicUsize = AtomicUsize::new(0);

impl PruneRing {
    pub const fn new() -> Self {
        PruneRing {
            start: [Z; CAP],
            end: [Z; CAP],
            head: AtomicUsize::new(0),
            tail: AtomicUsize::new(0),
            overflow: AtomicBool::new(false),
            busy: AtomicUsize::new(0),
        }
    }

    /// Producer: bracket "read events + push their ranges" so a consumer can wait it out.
    pub fn begin(&self) {
        self.busy.fetch_add(1, SeqCst);
    }
    pub fn end(&self) {
        self.busy.fetch_sub(1, SeqCst);
    }

    pub fn push(&self, start: usize, end: usize) {
        let h = self.head.load(SeqCst);
        if h.wrapping_sub(self.tail.load(SeqCst)) >= CAP {
            self.overflow.store(true, SeqCst);
            return;
        }
        self.start[h % CAP].store(start, SeqCst);
        self.end[h % CAP].store(end, SeqCst);
        self.head.store(h.wrapping_add(1), SeqCst);
    }

    /// Consumer: wait until the producer is not mid-batch (it never blocks there), then hand every
    /// published range to `f`. Returns true if ranges were lost (caller forgets everything).
    pub fn drain(&self, mut f: impl FnMut(usize, usize)) -> bool {
        while self.busy.load(SeqCst) != 0 {
            std::thread::yield_now();
        }
        let h = self.head.load(SeqCst);
        let mut t = self.tail.load(SeqCst);
        while t != h {
            f(
                self.start[t % CAP].load(SeqCst),
                self.end[t % CAP].load(SeqCst),
            );
            t = t.wrapping_add(1);
        }
        self.tail.store(t, SeqCst);
        self.overflow.swap(false, SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn push_drain_and_overflow() {
        let r = PruneRing::new();
        r.push(1, 2);
        r.push(3, 4);
        let mut got = vec![];
        assert!(!r.drain(|s, e| got.push((s, e))));
        assert_eq!(got, [(1, 2), (3, 4)]);
        for i in 0..CAP + 5 {
            r.push(i, i + 1);
        }
        let mut n = 0;
        assert!(r.drain(|_, _| n += 1), "overflow reported");
        assert_eq!(n, CAP);
        assert!(!r.drain(|_, _| n += 1));
    }
}
