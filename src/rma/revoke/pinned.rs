//! The ranges this rank has pinned for peers, as the memory hook sees them: "does this unmap
//! touch memory a peer may hold a firehose on?" must be answered inside `munmap`, where nothing
//! may allocate or block on a lock an allocating path holds.
//!
//! A sorted `Vec` of `[start, end)` (duplicates allowed) behind a spin reader-writer word:
//! readers (hooks) take a shared hold with a bounded number of tries and never allocate; writers
//! (the target's pin and unpin, under the Firehose engine lock, never in hook context) are
//! serialised by a mutex, grow the buffer *outside* the exclusive hold (copy into a larger one,
//! swap it in under the hold, free the old one after), and hold it only for an in-place insert or
//! remove. A reader that cannot get a hold (a writer busy, or the hook fired on the writer's own
//! thread, e.g. from a signal handler) answers [`Overlap::Busy`] and the caller acts as if it
//! overlapped, which is always safe.
//!
//! Order that makes the hook's check race-free with a pin made at the same time: the entry is
//! inserted *before* the memory is registered (and removed if that fails), and removed only
//! *after* it is deregistered. A hook that checks after its `munmap` returned either sees the
//! entry, or the registration started after the unmap and pinned the new pages (the kernel's
//! mmap lock orders the two).

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{Mutex, MutexGuard};

/// Set while a writer holds (or waits for) the table; the low bits count readers.
const WRITER: u32 = 1 << 31;

/// Answer of [`PinnedRanges::overlaps`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Overlap {
    No,
    Yes,
    /// No read hold within the tries: treat as `Yes`.
    Busy,
}

pub struct PinnedRanges {
    lock: AtomicU32,
    /// Entries now: an empty table is one load for the hook.
    len: AtomicUsize,
    /// Longest entry ever inserted: a lookup scans back at most this far.
    longest: AtomicU64,
    /// Sorted by (start, end). Read under a shared hold, changed only under the exclusive one.
    ranges: UnsafeCell<Vec<(u64, u64)>>,
    /// Serialises writers (never taken in hook context).
    writers: Mutex<()>,
}

// SAFETY: `ranges` is read only under a shared hold of `lock` (or by the one writer, who holds
// `writers`) and changed only under the exclusive hold, which excludes every reader.
unsafe impl Sync for PinnedRanges {}

impl Default for PinnedRanges {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for PinnedRanges {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PinnedRanges({} ranges)", self.len())
    }
}

impl PinnedRanges {
    pub fn new() -> Self {
        PinnedRanges {
            lock: AtomicU32::new(0),
            len: AtomicUsize::new(0),
            longest: AtomicU64::new(0),
            ranges: UnsafeCell::new(Vec::new()),
            writers: Mutex::new(()),
        }
    }

    pub fn len(&self) -> usize {
        self.len.load(SeqCst)
    }

    #[cfg(any(test, feature = "test-support"))]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn writers(&self) -> MutexGuard<'_, ()> {
        self.writers.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `f` on the vector with every reader excluded. The caller holds `writers`.
    fn exclusive<R>(&self, f: impl FnOnce(&mut Vec<(u64, u64)>) -> R) -> R {
        // Writers are serialised, so the bit is ours; new readers back off from here on.
        self.lock.fetch_or(WRITER, SeqCst);
        let mut spins = 0u32;
        while self.lock.load(SeqCst) != WRITER {
            spins += 1;
            if spins < 200 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now(); // a reader was preempted inside its (short) hold
            }
        }
        // SAFETY: the WRITER bit with no reader: nobody else reads or writes `ranges`.
        let r = f(unsafe { &mut *self.ranges.get() });
        self.len
            .store(unsafe { (*self.ranges.get()).len() }, SeqCst);
        self.lock.store(0, SeqCst);
        r
    }

    /// Records `[start, start + len)`. Allocates (outside the exclusive hold) when full.
    pub fn insert(&self, start: u64, len: usize) {
        let end = start.saturating_add(len as u64);
        let _w = self.writers();
        // Before the entry is visible: a lookup never misses it by scanning too short.
        self.longest.fetch_max(end - start, SeqCst);
        // SAFETY: we are the only writer (`writers` held); readers only read, so a shared
        // borrow here is fine.
        let cur = unsafe { &*self.ranges.get() };
        let grown = (cur.len() == cur.capacity()).then(|| {
            let mut v = Vec::with_capacity((cur.len() * 2).max(64));
            v.extend_from_slice(cur);
            v
        });
        let old = self.exclusive(|v| {
            let old = grown.map(|g| std::mem::replace(v, g));
            let i = v.partition_point(|r| *r < (start, end));
            v.insert(i, (start, end)); // within capacity: no allocation under the hold
            old
        });
        drop(old); // freed with no hold: a hook in `free` on this thread finds the table free
    }

    /// Forgets one `[start, start + len)` recorded by `insert`; false if there is none.
    pub fn remove(&self, start: u64, len: usize) -> bool {
        let end = start.saturating_add(len as u64);
        let _w = self.writers();
        self.exclusive(|v| match v.binary_search(&(start, end)) {
            Ok(i) => {
                v.remove(i);
                true
            }
            Err(_) => false,
        })
    }

    /// Whether `[addr, addr + len)` overlaps a recorded range. Hook-safe: no allocation, no
    /// lock, at most `tries` attempts at a shared hold (then `Busy`).
    pub fn overlaps(&self, addr: u64, len: u64, tries: u32) -> Overlap {
        if len == 0 || self.len.load(SeqCst) == 0 {
            return Overlap::No;
        }
        let mut got = false;
        for _ in 0..tries.max(1) {
            let s = self.lock.load(SeqCst);
            if s & WRITER == 0
                && self
                    .lock
                    .compare_exchange_weak(s, s + 1, SeqCst, SeqCst)
                    .is_ok()
            {
                got = true;
                break;
            }
            std::hint::spin_loop();
        }
        if !got {
            return Overlap::Busy;
        }
        let end = addr.saturating_add(len);
        let lo = addr.saturating_sub(self.longest.load(SeqCst));
        // SAFETY: shared hold: no writer changes the vector until we release it.
        let v = unsafe { &*self.ranges.get() };
        let mut i = v.partition_point(|r| r.0 < lo);
        let mut hit = false;
        while i < v.len() && v[i].0 < end {
            if v[i].1 > addr {
                hit = true;
                break;
            }
            i += 1;
        }
        self.lock.fetch_sub(1, SeqCst);
        if hit {
            Overlap::Yes
        } else {
            Overlap::No
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;

    #[test]
    fn overlap_edges() {
        let t = PinnedRanges::new();
        assert_eq!(t.overlaps(0, u64::MAX, 1), Overlap::No, "empty");
        t.insert(0x10000, 0x1000);
        t.insert(0x40000, 0x20000);
        assert_eq!(t.len(), 2);
        for (a, l, want) in [
            (0x10000, 0x1000, true),
            (0xF000, 0x1000, false), // ends where it starts
            (0xF000, 0x1001, true),
            (0x11000, 0x1000, false), // starts where it ends
            (0x10FFF, 1, true),
            (0x50000, 1, true), // inside the long one, far from its start
            (0x5FFFF, 100, true),
            (0x60000, 0x10000, false),
            (0, 0x10001, true),
            (0x20000, 0x20000, false),
            (0, u64::MAX, true),
            (0x10000, 0, false), // empty range
        ] {
            let got = t.overlaps(a, l, 8) == Overlap::Yes;
            assert_eq!(got, want, "[{a:#x}, +{l:#x})");
        }
        assert!(t.remove(0x40000, 0x20000));
        assert!(!t.remove(0x40000, 0x20000), "removed once");
        assert_eq!(t.overlaps(0x50000, 1, 8), Overlap::No);
        assert!(t.remove(0x10000, 0x1000));
        assert!(t.is_empty());
    }

    #[test]
    fn duplicates_count_separately() {
        let t = PinnedRanges::new();
        t.insert(0x1000, 0x1000);
        t.insert(0x1000, 0x1000);
        assert!(t.remove(0x1000, 0x1000));
        assert_eq!(t.overlaps(0x1000, 1, 8), Overlap::Yes, "one copy left");
        assert!(t.remove(0x1000, 0x1000));
        assert_eq!(t.overlaps(0x1000, 1, 8), Overlap::No);
    }

    #[test]
    fn writer_held_reads_busy() {
        let t = PinnedRanges::new();
        t.insert(0x1000, 0x1000);
        let _w = t.writers();
        let r = t.exclusive(|_| t.overlaps(0x1000, 1, 100));
        assert_eq!(
            r,
            Overlap::Busy,
            "a hook on the writer's own thread never spins forever"
        );
    }

    /// Growth (many swaps) while 16 threads look up: a range that is always in the table is
    /// always found, one that never is never found (Busy allowed), nobody crashes.
    #[test]
    fn sixteen_readers_during_growth_and_churn() {
        let t = Arc::new(PinnedRanges::new());
        t.insert(1 << 40, 4096); // always there
        let stop = Arc::new(AtomicBool::new(false));
        let readers: Vec<_> = (0..16)
            .map(|_| {
                let (t, stop) = (t.clone(), stop.clone());
                std::thread::spawn(move || {
                    let mut n = 0u64;
                    while !stop.load(SeqCst) || n < 100 {
                        assert_ne!(t.overlaps((1 << 40) + 100, 8, 1000), Overlap::No);
                        assert_ne!(t.overlaps(1 << 41, 4096, 1000), Overlap::Yes);
                        n += 1;
                    }
                    n
                })
            })
            .collect();
        for round in 0..20u64 {
            for i in 0..500u64 {
                t.insert((round << 24) + i * 8192, 4096);
            }
            for i in 0..500u64 {
                assert!(t.remove((round << 24) + i * 8192, 4096));
            }
        }
        stop.store(true, SeqCst);
        let total: u64 = readers.into_iter().map(|h| h.join().unwrap()).sum();
        assert!(total > 0);
        assert_eq!(t.len(), 1);
    }
}
