//! Single-producer (the userfaultfd reader) / single-consumer (`watch`/`unwatch`, under the
//! watcher's mutex) ring of ranges the reader saw go away (UNMAP, REMAP source): the watches over
//! them are stale, whatever `unwatch` calls are still to come for them.
//!
//! Why not a mutex: the reader must never wait for anything a thread that unmaps registered
//! memory could hold, and the watch path allocates (malloc may trim a registered heap and wait
//! for the reader).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};

const CAP: usize = 1024;

pub(super) struct PruneRing {
    start: [AtomicUsize; CAP],
    end: [AtomicUsize; CAP],
    head: AtomicUsize, // next write (producer)
    tail: AtomicUsize, // next read (consumer)
    /// Set when the producer found the ring full and dropped a range.
    overflow: AtomicBool,
}

#[allow(clippy::declare_interior_mutable_const)]
const Z: AtomicUsize = AtomicUsize::new(0);

impl PruneRing {
    pub(super) const fn new() -> Self {
        PruneRing {
            start: [Z; CAP],
            end: [Z; CAP],
            head: AtomicUsize::new(0),
            tail: AtomicUsize::new(0),
            overflow: AtomicBool::new(false),
        }
    }

    /// Producer. Never blocks: a full ring drops the range (and says so at the next drain).
    pub(super) fn push(&self, start: usize, end: usize) {
        let h = self.head.load(SeqCst);
        if h.wrapping_sub(self.tail.load(SeqCst)) >= CAP {
            self.overflow.store(true, SeqCst);
            return;
        }
        self.start[h % CAP].store(start, SeqCst);
        self.end[h % CAP].store(end, SeqCst);
        self.head.store(h.wrapping_add(1), SeqCst);
    }

    /// Consumer: hand every published range to `f`, oldest first. Returns true if ranges were
    /// dropped since the last drain.
    pub(super) fn drain(&self, mut f: impl FnMut(usize, usize)) -> bool {
        let h = self.head.load(SeqCst);
        let mut t = self.tail.load(SeqCst);
        while t != h {
            f(
                self.start[t % CAP].load(SeqCst),
                self.end[t % CAP].load(SeqCst),
            );
            t = t.wrapping_add(1);
            // Free the slot at once: a long drain must not make the producer drop ranges.
            self.tail.store(t, SeqCst);
        }
        self.overflow.swap(false, SeqCst)
    }

    /// Consumer: forget everything published so far (a forked child: the ranges are the
    /// parent's).
    pub(super) fn forget(&self) {
        self.tail.store(self.head.load(SeqCst), SeqCst);
        self.overflow.store(false, SeqCst);
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
        r.push(7, 8);
        r.forget();
        assert!(!r.drain(|_, _| n += 1));
        assert_eq!(n, CAP);
    }
}
