//! The range the writer is pinning right now, readable from hooks without a lock (a tiny seqlock).
//!
//! While a miss pins, the new region is not yet in the index, so the hook-side overlap filter
//! would drop an invalidation of exactly that memory; the writer publishes the range here first,
//! and hooks treat overlap with it (or a torn read) as "may be cached".

use std::sync::atomic::{fence, AtomicUsize, Ordering};

pub struct Inflight {
    seq: AtomicUsize,
    start: AtomicUsize,
    end: AtomicUsize,
}

impl Inflight {
    pub fn new() -> Self {
        Inflight {
            seq: AtomicUsize::new(0),
            start: AtomicUsize::new(0),
            end: AtomicUsize::new(0),
        }
    }

    /// Writer only (cache mutex held, so `seq` has one writer and plain stores suffice). A
    /// seqlock write, then one full fence: the range is visible to every hook before the caller
    /// goes on to pin (or, for `clear`, to publish the pinned region in the index).
    pub fn set(&self, start: usize, end: usize) {
        let seq = self.seq.load(Ordering::Relaxed);
        self.seq.store(seq.wrapping_add(1), Ordering::Relaxed); // odd: writing
        fence(Ordering::Release); // the odd value is visible before either bound changes
        self.start.store(start, Ordering::Relaxed);
        self.end.store(end, Ordering::Relaxed);
        self.seq.store(seq.wrapping_add(2), Ordering::Release);
        fence(Ordering::SeqCst);
    }

    pub fn clear(&self) {
        self.set(0, 0);
    }

    /// Hook-safe. True if `[start, end)` overlaps the in-flight range, or on a torn read.
    pub fn overlaps(&self, start: usize, end: usize) -> bool {
        fence(Ordering::SeqCst); // pairs with the fence in `set` (the caller's unmap came first)
        let s1 = self.seq.load(Ordering::Acquire);
        if s1 & 1 == 1 {
            return true;
        }
        let (a, b) = (
            self.start.load(Ordering::Relaxed),
            self.end.load(Ordering::Relaxed),
        );
        fence(Ordering::Acquire);
        if self.seq.load(Ordering::Relaxed) != s1 {
            return true;
        }
        a < end && start < b
    }
}
