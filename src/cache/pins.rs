//! Unpinning detached regions nobody holds, and the pinned pages/regions accounting that the
//! bounds and the stats read.

use std::sync::atomic::Ordering;

use super::core::Cache;
use super::counters::PinCount;
use super::index::RegionPtr;
use super::region::Region;

impl Cache {
    pub(super) fn unpin_all(&self, mut unpins: Vec<RegionPtr>) {
        self.unpin_drain(&mut unpins);
    }

    /// Unpin everything in `unpins`, leaving it empty (its capacity is kept for reuse).
    pub(super) fn unpin_drain(&self, unpins: &mut Vec<RegionPtr>) {
        for p in unpins.drain(..) {
            self.unpin_free(p);
        }
    }

    /// Unpin and free a detached region nobody holds.
    #[inline(never)]
    pub(super) fn unpin_free(&self, p: RegionPtr) {
        // SAFETY: `p` is detached with zero holders, so we hold the only reference.
        let r = unsafe { p.as_ref() };
        let len = self.len_of(r);
        let cached = !r.uncached;
        self.pinner.unpin(r.pinned(), r.start, len);
        self.unwatch(r);
        self.slab.free(p);
        self.count_unpin(len as u64, cached);
    }

    /// Tell the watcher a region it was told about (every cached one: see `register_slow`) is
    /// unpinned. Uncached regions were never watched.
    pub(super) fn unwatch(&self, r: &Region) {
        if let (Some(w), false) = (&self.watcher, r.uncached) {
            w.unwatch(r.start, self.len_of(r));
        }
    }

    /// The counter a region of this kind is charged to.
    pub(super) fn pin_count(&self, cached: bool) -> &PinCount {
        if cached {
            &self.c.cached
        } else {
            &self.c.uncached
        }
    }

    pub(super) fn count_pin(&self, len: u64, cached: bool) {
        self.pin_count(cached).add(len >> self.shift);
        let total = (self.c.cached.get().0 + self.c.uncached.get().0) << self.shift;
        // Usually below the peak: a load, no locked instruction.
        if total > self.c.pinned_peak.load(Ordering::Relaxed) {
            self.c.pinned_peak.fetch_max(total, Ordering::Relaxed);
        }
    }

    pub(super) fn count_unpin(&self, len: u64, cached: bool) {
        self.pin_count(cached).sub(len >> self.shift);
    }
}
