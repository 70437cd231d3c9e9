//! Eviction and limits: what fits the bounds, CLOCK eviction of idle regions, detaching regions
//! from the index, trimming after lazy release, `set_limits` and `flush`.

use std::sync::atomic::Ordering;

use super::core::{max_request, Cache};
use super::exclusion::{Exclusive, Writer};
use super::index::RegionPtr;
use super::region::{COUNT_MASK, DETACHED};
use super::Limits;

impl Cache {
    /// Cached bytes and regions that stay pinned once the regions in `unpins` are gone.
    pub(super) fn staying(&self, unpins: &[RegionPtr]) -> (usize, usize) {
        let going: usize = unpins
            .iter()
            // SAFETY: regions queued for unpin are still allocated.
            .map(|p| self.len_of(unsafe { p.as_ref() }))
            .sum();
        let (pages, regions) = self.c.cached.get();
        (
            ((pages as usize) << self.shift) - going,
            regions as usize - unpins.len(),
        )
    }

    /// Whether `extra` more bytes (and, if `extra > 0`, one more region) fit `limits` on top of
    /// `bytes` and `regions`.
    pub(super) fn fits_limits(limits: Limits, bytes: usize, regions: usize, extra: usize) -> bool {
        bytes.saturating_add(extra) <= limits.max_pinned
            && regions.saturating_add((extra > 0) as usize) <= limits.max_regions
    }

    /// Whether `extra` more bytes (and one more region) fit without evicting.
    pub(super) fn has_room(&self, w: &Writer, extra: usize, unpins: &[RegionPtr]) -> bool {
        let (bytes, regions) = self.staying(unpins);
        Self::fits_limits(w.state.limits, bytes, regions, extra)
    }

    /// Evict idle regions (CLOCK order) until `extra` more bytes and one more region fit.
    /// Returns whether they fit (false: everything left is in use).
    pub(super) fn make_room(
        &self,
        w: &Writer,
        x: &Exclusive,
        extra: usize,
        unpins: &mut Vec<RegionPtr>,
    ) -> bool {
        let limits = w.state.limits;
        let (mut bytes, mut regions) = self.staying(unpins);
        while !Self::fits_limits(limits, bytes, regions, extra) {
            let Some(p) = x.index().clock_victim(&self.slab) else {
                return false; // everything left is in use: never evicted
            };
            let n = unpins.len();
            self.detach(x, p, unpins);
            debug_assert_eq!(unpins.len(), n + 1, "a clock victim is idle");
            // SAFETY: just queued for unpin, still allocated.
            bytes -= self.len_of(unsafe { p.as_ref() });
            regions -= 1;
            self.c.evictions.bump(w, 1);
        }
        true
    }

    /// Remove `p` from the index; if idle, queue it for unpinning (else its last holder unpins).
    pub(super) fn detach(&self, x: &Exclusive, p: RegionPtr, unpins: &mut Vec<RegionPtr>) {
        x.index().remove(&self.slab, p);
        // SAFETY: `p` was indexed, hence live; readers are excluded, so its count cannot rise.
        let state = &unsafe { p.as_ref() }.state;
        // An idle region (every eviction): with readers excluded nobody can acquire it, and with
        // no holder nobody can release it, so the word cannot change under us and a plain store
        // sets DETACHED (no locked instruction: slow on the miss path, right after system calls).
        // Acquire: the last holder's release (its AcqRel decrement) happens before our unpin.
        // (A PENDING region has a holder, the miss pinning it, so it never takes this branch.)
        let now = state.load(Ordering::Acquire);
        if now & COUNT_MASK == 0 {
            state.store(now | DETACHED, Ordering::Release);
            unpins.push(p);
            return;
        }
        // Held: a holder may release meanwhile, and whichever of us comes last unpins.
        let prev = state.fetch_or(DETACHED, Ordering::AcqRel);
        if prev & COUNT_MASK == 0 {
            unpins.push(p);
        }
    }

    /// Lazy release left the cache above its bounds (it was full of in-use regions).
    #[cold]
    #[inline(never)]
    pub(super) fn trim(&self) {
        let mut w = self.lock();
        let mut unpins = std::mem::take(&mut w.state.spare);
        self.drain(&w, &mut unpins);
        {
            let x = w.exclude();
            self.make_room(&w, &x, 0, &mut unpins);
        }
        self.unpin_drain(&w, &mut unpins);
        w.state.spare = unpins;
    }

    #[inline]
    pub(super) fn over_limits(&self) -> bool {
        let (pages, regions) = self.c.cached.get();
        (pages as usize) << self.shift > self.max_pinned.load(Ordering::Relaxed)
            || regions as usize > self.max_regions.load(Ordering::Relaxed)
    }

    /// Shrinking evicts idle regions down to the new bounds.
    pub fn set_limits(&self, limits: Limits) {
        if self.is_forked() {
            return;
        }
        let mut w = self.lock();
        w.state.limits = limits;
        self.max_pinned.store(limits.max_pinned, Ordering::Relaxed);
        self.max_request
            .store(max_request(limits.max_pinned, self.page), Ordering::Relaxed);
        self.max_regions
            .store(limits.max_regions, Ordering::Relaxed);
        let mut unpins = Vec::new();
        self.drain(&w, &mut unpins);
        {
            let x = w.exclude();
            self.make_room(&w, &x, 0, &mut unpins);
        }
        self.unpin_all(&w, unpins);
    }

    /// Unpin every idle region (also processes pending invalidations, and the regions released
    /// for the helper thread to unpin: `defer_unpins`). Returns how many.
    pub fn flush(&self) -> usize {
        if self.is_forked() {
            return 0;
        }
        let w = self.lock();
        let mut unpins = Vec::new();
        self.drain(&w, &mut unpins);
        let drained = unpins.len();
        {
            let x = w.exclude();
            for p in x.index().all(&self.slab) {
                // SAFETY: indexed regions are live; readers are excluded.
                if unsafe { p.as_ref() }.holders() == 0 {
                    self.detach(&x, p, &mut unpins);
                }
            }
        }
        self.c.evictions.bump(&w, (unpins.len() - drained) as u64);
        let n = unpins.len();
        self.unpin_all(&w, unpins);
        drop(w);
        // Without the mutex, as the helper does (the queue is multi-consumer).
        n + self.unpin_deferred()
    }
}
