//! What the helper thread (`crate::helper`; Li et al., "Scalable Memory Registration for High
//! Performance Networks Using Helper Threads" (CF 2011)) asks of the cache: pin a range ahead of
//! its predicted use (`prefetch`), unpin the idle regions of a range (`evict_range`), and take over
//! the unpins that the last holder of a detached region would otherwise do on the caller's thread
//! (`defer_unpins` / `unpin_deferred`).
//!
//! Correctness does not depend on the helper: `prefetch` is the miss path itself (the region is
//! in the index, PENDING, before the backend is called, so an invalidation during the pin is
//! queued and drained before any later lookup: a region the helper pinned is invalidated exactly
//! like one a caller pinned), plus the helper's own check, run before the region is published,
//! for unmaps whose invalidation ran before the region was in the index (the cache knows nothing
//! of how: the check is the helper's), and `evict_range` never touches a region someone holds.

use std::sync::atomic::Ordering;

use crossbeam_queue::ArrayQueue;

use super::core::Cache;
use super::index::RegionPtr;
use super::miss::MissBy;
use super::readers::my_slot;
use super::region::Region;
use std::sync::Arc;

use super::error::CacheError;
use crate::pin::{Access, Pinner};
use crate::rt::counted::Counted;

/// Detached regions queued for the helper at most; past that the releasing caller unpins
/// itself (as without a helper).
const DEFERRED_CAPACITY: usize = 1024;

impl Cache {
    /// Page-aligned bounds of a request, with `register`'s checks and errors (`register` and
    /// `pin_ahead` both start here).
    #[inline]
    pub(super) fn bounds(
        &self,
        addr: usize,
        len: usize,
        access: Access,
    ) -> Result<(usize, usize), CacheError> {
        if len == 0 {
            return Err(CacheError::ZeroLength);
        }
        let end = addr.checked_add(len).ok_or(CacheError::Overflow)?;
        if !access.is_valid() {
            return Err(CacheError::BadAccess);
        }
        let start = addr & !(self.page - 1);
        let end = end.checked_add(self.page - 1).ok_or(CacheError::Overflow)? & !(self.page - 1);
        if end - start > self.max_request.load(Ordering::Relaxed) {
            return Err(CacheError::TooLarge);
        }
        Ok((start, end))
    }

    /// Pin `[addr, addr + len)` into the cache without handing out a registration, so that the
    /// next `register` of it hits. `Ok(true)`: a region was pinned now; `Ok(false)`: it was
    /// cached already. `CacheError::NoMemory` when the bounds leave no room for it (nothing stays
    /// pinned), `CacheError::Busy` when `still_valid` (called after the pin, before any reader can
    /// see the region, with the cache mutex held: it must not call into the cache) answered
    /// false (the pin is undone), and the backend's errors as `register` returns them. Counted
    /// as `prefetched`, never as a hit or a miss.
    pub fn prefetch(
        &self,
        addr: usize,
        len: usize,
        access: Access,
        still_valid: &dyn Fn() -> bool,
    ) -> Result<bool, CacheError> {
        let (start, end) = self.bounds(addr, len, access)?;
        let sid = my_slot();
        let (region, fresh) = self.miss(sid, start, end, access, MissBy::Helper(still_valid))?;
        // SAFETY: we hold one reference on it (taken by the miss).
        let uncached = unsafe { region.as_ref() }.uncached;
        self.release_region(sid, region);
        if uncached {
            return Err(CacheError::NoMemory);
        }
        Ok(fresh)
    }

    /// Unpin every idle cached region overlapping `[addr, addr + len)` (regions in use are left
    /// alone: their holders release them lazily as usual). Returns the bytes unpinned.
    pub fn evict_range(&self, addr: usize, len: usize) -> usize {
        if len == 0 || self.is_forked() {
            return 0;
        }
        let start = addr & !(self.page - 1);
        let end = addr.saturating_add(len).saturating_add(self.page - 1) & !(self.page - 1);
        let mut w = self.lock();
        let mut unpins = std::mem::take(&mut w.state.spare);
        self.drain(&w, &mut unpins);
        let drained = unpins.len();
        if w.index().any_overlapping(&self.slab, start, end) {
            let x = w.exclude();
            for p in x.index().overlapping(&self.slab, start, end) {
                // SAFETY: indexed regions are live; readers are excluded, so no holder appears.
                if unsafe { p.as_ref() }.holders() == 0 {
                    self.detach(&x, p, &mut unpins);
                }
            }
        }
        let bytes: usize = unpins[drained..]
            .iter()
            // SAFETY: queued for unpin, still allocated.
            .map(|p| self.len_of(unsafe { p.as_ref() }))
            .sum();
        self.c
            .released_ahead
            .bump(&w, (unpins.len() - drained) as u64);
        self.unpin_drain(&w, &mut unpins);
        w.state.spare = unpins;
        bytes
    }

    /// From now on, the last holder of a detached region queues it for `unpin_deferred` instead
    /// of unpinning it (the helper thread calls that), and `deregister` leaves queued
    /// invalidations to the next register or to the helper. Idempotent.
    pub(crate) fn defer_unpins(&self) {
        let _ = self
            .deferred
            .get_or_init(|| ArrayQueue::new(DEFERRED_CAPACITY));
    }

    /// Unpin the regions queued by `release_detached`. Returns how many.
    pub(crate) fn unpin_deferred(&self) -> usize {
        let Some(q) = self.deferred.get() else {
            return 0;
        };
        // Counted in before the pop: a fork's release waits until no region is between the queue
        // and its unpin (`across_fork.rs`).
        let _in = Counted::enter(&self.deferred_busy);
        let mut n = 0;
        while let Some(p) = q.pop() {
            // The queue holds pointers of detached regions with no holder left, pushed once each.
            if let Some(p) = RegionPtr::new(p as *mut Region) {
                self.unpin_free(p);
                n += 1;
            }
        }
        n
    }

    /// The last holder let go of a detached region: unpin it, or leave it to the helper.
    #[cold]
    #[inline(never)]
    pub(super) fn release_detached(&self, p: RegionPtr) {
        if let Some(q) = self.deferred.get() {
            if q.push(p.as_ptr() as usize).is_ok() {
                return;
            }
        }
        self.unpin_free(p);
    }

    /// Bytes pinned now, cached or not (two loads; for the helper's time-averaged figure).
    pub fn pinned_bytes(&self) -> u64 {
        (self.c.cached.get().0 + self.c.uncached.get().0) << self.shift
    }

    /// Whether `handle` is registered and not yet deregistered (any value is fine: made up or
    /// released, false). The helper polls the handles it saw used instead of being told of each
    /// release (`helper/releases.rs`).
    pub(crate) fn is_live(&self, handle: u64) -> bool {
        self.handles.is_live(handle)
    }

    /// High-water mark of pinned bytes.
    pub fn pinned_peak(&self) -> u64 {
        self.c.pinned_peak.load(Ordering::Relaxed)
    }

    /// The backend (the helper calibrates its cost model on it).
    pub fn backend(&self) -> Arc<dyn Pinner> {
        self.pinner.clone()
    }
}
