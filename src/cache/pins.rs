//! Unpinning detached regions nobody holds, and the pinned pages/regions accounting that the
//! bounds and the stats read.

use std::sync::atomic::Ordering;

use super::core::Cache;
use super::counters::PinCount;
use super::exclusion::Writer;
use super::index::RegionPtr;
use super::region::Region;

impl Cache {
    pub(super) fn unpin_all(&self, w: &Writer, mut unpins: Vec<RegionPtr>) {
        self.unpin_drain(w, &mut unpins);
    }

    /// Unpin everything in `unpins`, leaving it empty (its capacity is kept for reuse). The mutex
    /// is held: the counts are updated without a locked instruction.
    pub(super) fn unpin_drain(&self, w: &Writer, unpins: &mut Vec<RegionPtr>) {
        for p in unpins.drain(..) {
            let (len, cached) = self.unpin_record(p);
            self.pin_count(cached).sub_held(w, len >> self.shift);
        }
    }

    /// Unpin and free a detached region nobody holds, without the mutex (its last holder).
    #[inline(never)]
    pub(super) fn unpin_free(&self, p: RegionPtr) {
        let (len, cached) = self.unpin_record(p);
        self.pin_count(cached).sub(len >> self.shift);
    }

    /// Unpin, unwatch and free a detached region nobody holds; returns its length and kind for the
    /// caller to count.
    fn unpin_record(&self, p: RegionPtr) -> (u64, bool) {
        // SAFETY: `p` is detached with zero holders, so we hold the only reference.
        let r = unsafe { p.as_ref() };
        let len = self.len_of(r);
        let cached = !r.uncached;
        self.pinner.unpin(r.pinned(), r.start, len);
        self.unwatch(r);
        self.slab.free(p);
        (len as u64, cached)
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

    pub(super) fn count_pin(&self, w: &Writer, len: u64, cached: bool) {
        self.pin_count(cached).add(w, len >> self.shift);
        let total = (self.c.cached.get().0 + self.c.uncached.get().0) << self.shift;
        // Usually below the peak: a load, no locked instruction.
        if total > self.c.pinned_peak.load(Ordering::Relaxed) {
            self.c.pinned_peak.fetch_max(total, Ordering::Relaxed);
        }
    }
}
