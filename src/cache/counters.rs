//! The cache's slow-path counters, with as few locked instructions as the miss path allows.
//!
//! * `Locked`: changed only by writers holding the cache mutex (misses, evictions, invalidations,
//!   pin retries/failures, uncached registrations), so a bump is a plain load + store; readers
//!   (`stats`) load them atomically, without the mutex.
//! * `PinCount`: pinned pages and regions packed in a word (regions in the low 24 bits: at most
//!   ~4 Mi regions exist, see slab.rs). Two words: what changes under the mutex (every pin, and the
//!   unpins of misses, evictions and drains) is a plain load + store like `Locked`; only the last
//!   holder of a detached region, which unpins without the mutex, pays an atomic add, to a second
//!   word of unpinned units. The miss path runs between system calls, where each locked
//!   instruction is slow (it waits for the stores the kernel left behind): an evicting miss
//!   saved two of them this way. A bounds check reads both words (one line).

use std::sync::atomic::{AtomicU64, Ordering};

/// A counter written only under the cache mutex (`bump` takes the mutex guard's lifetime as a
/// witness through `&impl HoldsMutex`).
#[derive(Default)]
pub(super) struct Locked(AtomicU64);

/// Implemented by the proof that the cache mutex is held.
pub(super) trait HoldsMutex {}

impl Locked {
    #[inline]
    pub(super) fn bump(&self, _held: &impl HoldsMutex, n: u64) {
        // Single writer (the mutex holder): no lost updates without a locked instruction.
        self.0
            .store(self.0.load(Ordering::Relaxed) + n, Ordering::Relaxed);
    }

    pub(super) fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

const REGION_BITS: u32 = 24;
const REGION_MASK: u64 = (1 << REGION_BITS) - 1;
// Every region is a slab record: the region count cannot carry into the page bits.
const _: () = assert!((super::slab::MAX_IDS as u64) < REGION_MASK);

/// Pinned pages and regions of one kind (cached or uncached): `held` (pinned minus unpinned
/// under the mutex) minus `loose` (unpinned without it), both packed as units.
#[derive(Default)]
pub(super) struct PinCount {
    held: AtomicU64,
    loose: AtomicU64,
}

impl PinCount {
    #[inline]
    fn unit(pages: u64) -> u64 {
        (pages << REGION_BITS) | 1
    }

    /// A pin, under the mutex.
    pub(super) fn add(&self, _held: &impl HoldsMutex, pages: u64) {
        // Single writer (the mutex holder): no lost updates without a locked instruction.
        let v = self.held.load(Ordering::Relaxed);
        self.held
            .store(v.wrapping_add(Self::unit(pages)), Ordering::Relaxed);
    }

    /// An unpin, under the mutex.
    pub(super) fn sub_held(&self, _held: &impl HoldsMutex, pages: u64) {
        let v = self.held.load(Ordering::Relaxed);
        self.held
            .store(v.wrapping_sub(Self::unit(pages)), Ordering::Relaxed);
    }

    /// An unpin without the mutex (the last holder of a detached region).
    pub(super) fn sub(&self, pages: u64) {
        // Release, with `get`'s Acquire: whoever sees this unpin sees its pin in `held` too.
        self.loose.fetch_add(Self::unit(pages), Ordering::Release);
    }

    /// (pages, regions). `loose` first: every unpin seen there has its pin visible in `held`
    /// (the pin happened before the region was handed out), so neither field goes below zero.
    #[inline]
    pub(super) fn get(&self) -> (u64, u64) {
        let l = self.loose.load(Ordering::Acquire);
        let v = self.held.load(Ordering::Relaxed).wrapping_sub(l);
        (v >> REGION_BITS, v & REGION_MASK)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Held;
    impl HoldsMutex for Held {}

    #[test]
    fn packed_pages_and_regions() {
        let c = PinCount::default();
        c.add(&Held, 1);
        c.add(&Held, 1 << 30); // 4 TiB of 4 KiB pages
        c.add(&Held, 7);
        assert_eq!(c.get(), ((1 << 30) + 8, 3));
        c.sub(1 << 30);
        assert_eq!(c.get(), (8, 2));
        c.sub_held(&Held, 7);
        assert_eq!(c.get(), (1, 1));
        c.sub(1);
        assert_eq!(c.get(), (0, 0));
        // Unpinned without the mutex more than under it, balanced overall.
        c.add(&Held, 3);
        c.sub(3);
        c.add(&Held, 2);
        assert_eq!(c.get(), (2, 1));
        c.sub_held(&Held, 2);
        assert_eq!(c.get(), (0, 0));
    }
}
