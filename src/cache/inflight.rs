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

    /// Writer only (cache mutex held).
    pub fn set(&self, start: usize, end: usize) {
        self.seq.fetch_add(1, Ordering::SeqCst); // odd: writing
        self.start.store(start, Ordering::SeqCst);
        self.end.store(end, Ordering::SeqCst);
        self.seq.fetch_add(1, Ordering::SeqCst);
    }

    pub fn clear(&self) {
        self.set(0, 0);
    }

    /// Hook-safe. True if `[start, end)` overlaps the in-flight range, or on a torn read.
    pub fn overlaps(&self, start: usize, end: usize) -> bool {
        let s1 = self.seq.load(Ordering::SeqCst);
        if s1 & 1 == 1 {
            return true;
        }
        let (a, b) = (
            self.start.load(Ordering::SeqCst),
            self.end.load(Ordering::SeqCst),
        );
        fence(Ordering::SeqCst);
        if self.seq.load(Ordering::SeqCst) != s1 {
            return true;
        }
        a < end && start < b
    }
}
