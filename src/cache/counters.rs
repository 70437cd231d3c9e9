//! The cache's slow-path counters, with as few locked instructions as the miss path allows.
//!
//! * `Locked`: changed only by writers holding the cache mutex (misses, evictions, invalidations,
//!   pin retries/failures, uncached registrations), so a bump is a plain load + store; readers
//!   (`stats`) load them atomically, without the mutex.
//! * `PinCount`: pinned pages and regions packed in one word (regions in the low 24 bits: at most
//!   ~4 Mi regions exist, see slab.rs), because the last holder of a detached region unpins it
//!   without the mutex: one atomic add or sub per pin or unpin, and one load for a bounds check.

use std::sync::atomic::{AtomicU64, Ordering};

/// A counter written only under the cache mutex (`bump` takes the mutex guard's lifetime as a
/// witness through `&impl HoldsMutex`).
#[derive(Default)]
pub struct Locked(AtomicU64);

/// Implemented by the proof that the cache mutex is held.
pub trait HoldsMutex {}

impl Locked {
    #[inline]
    pub fn bump(&self, _held: &impl HoldsMutex, n: u64) {
        // Single writer (the mutex holder): no lost updates without a locked instruction.
        self.0
            .store(self.0.load(Ordering::Relaxed) + n, Ordering::Relaxed);
    }

    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

const REGION_BITS: u32 = 24;
const REGION_MASK: u64 = (1 << REGION_BITS) - 1;
// Every region is a slab record: the region count cannot carry into the page bits.
const _: () = assert!((super::slab::MAX_IDS as u64) < REGION_MASK);

/// Pinned pages and regions of one kind (cached or uncached).
#[derive(Default)]
pub struct PinCount(AtomicU64);

impl PinCount {
    #[inline]
    fn unit(pages: u64) -> u64 {
        (pages << REGION_BITS) | 1
    }

    pub fn add(&self, pages: u64) {
        self.0.fetch_add(Self::unit(pages), Ordering::Relaxed);
    }

    pub fn sub(&self, pages: u64) {
        self.0.fetch_sub(Self::unit(pages), Ordering::Relaxed);
    }

    /// (pages, regions).
    #[inline]
    pub fn get(&self) -> (u64, u64) {
        let v = self.0.load(Ordering::Relaxed);
        (v >> REGION_BITS, v & REGION_MASK)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packed_pages_and_regions() {
        let c = PinCount::default();
        c.add(1);
        c.add(1 << 30); // 4 TiB of 4 KiB pages
        c.add(7);
        assert_eq!(c.get(), ((1 << 30) + 8, 3));
        c.sub(1 << 30);
        assert_eq!(c.get(), (8, 2));
        c.sub(7);
        c.sub(1);
        assert_eq!(c.get(), (0, 0));
    }
}
