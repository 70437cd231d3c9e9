//! The miss path: under the mutex, drain, look again, detach overlaps and evict in one reader
//! exclusion that also inserts the new region PENDING, tell the watcher, then pin with readers
//! running and publish. Without room the registration is handed out uncached.
//!
//! Why the watcher hears of the range before the pin: an unmap that only the watcher reports (a raw system call, for userfaultfd) and
//! that lands between the pin and a later `watch` is never reported, and the new region may cover
//! memory its caller did not ask for (the union with overlapping regions, or the helper's pin
//! ahead): those pages would stay pinned and cached after they went away. Seen once in 2400
//! rounds of `case6_stale_threads_helper` (raw_munmap) when the watch came after the publish.

use std::ptr::NonNull;
use std::sync::atomic::Ordering;

use super::core::Cache;
use super::error::CacheError;
use super::exclusion::{Exclusive, Writer};
use super::index::RegionPtr;
use super::region::{COUNT_MASK, DETACHED, PENDING};
use crate::pin::{Access, PinError};

/// Who is missing: a caller (counted as a miss or a hit) or the helper pinning ahead of a
/// predicted use (`Cache::prefetch`, counted apart), with its check that the memory it just
/// pinned is still the memory it meant (run after the pin, before the region is published).
#[derive(Clone, Copy)]
pub(super) enum MissBy<'a> {
    Caller,
    Helper(&'a dyn Fn() -> bool),
}

/// A PENDING region between its insert and its publish. Dropped with the region still inside
/// only while unwinding from a panic: then the region leaves the index and is freed.
pub(super) struct PendingGuard<'a, 'w> {
    w: &'a Writer<'w>,
    region: Option<RegionPtr>,
}

impl Drop for PendingGuard<'_, '_> {
    fn drop(&mut self) {
        if let Some(p) = self.region.take() {
            self.w.cache.drop_pending(self.w, Some(p));
        }
    }
}

impl Cache {
    /// Miss path: drain, re-check, make room, pin (readers running), insert. Kept out of line so
    /// the hit path in `register` stays a small leaf (no spills, short prologue).
    #[cold]
    #[inline(never)]
    pub(super) fn register_slow(
        &self,
        sid: usize,
        start: usize,
        end: usize,
        access: Access,
    ) -> Result<RegionPtr, CacheError> {
        self.miss(sid, start, end, access, MissBy::Caller)
            .map(|(region, _)| region)
    }

    /// `register_slow` for a caller or for the helper's `prefetch`. Also returns whether a new
    /// region entered the index.
    pub(super) fn miss(
        &self,
        sid: usize,
        start: usize,
        end: usize,
        access: Access,
        by: MissBy,
    ) -> Result<(RegionPtr, bool), CacheError> {
        if self.is_forked() {
            return Err(CacheError::Forked);
        }
        let mut w = self.lock();
        if matches!(by, MissBy::Helper(_)) && self.forking.load(Ordering::SeqCst) {
            // A fork is releasing: a pin ahead now would cross it (`across_fork.rs`).
            return Err(CacheError::Busy);
        }
        // Scratch lists kept in the writer state: a miss then pays no malloc/free pair.
        let mut unpins = std::mem::take(&mut w.state.spare);
        let mut overlaps = std::mem::take(&mut w.state.overlaps);
        let res = self.miss_locked(&w, sid, start, end, access, by, &mut unpins, &mut overlaps);
        self.unpin_drain(&w, &mut unpins);
        overlaps.clear();
        w.state.spare = unpins;
        w.state.overlaps = overlaps;
        drop(w);
        let (region, fresh) = res?;
        Ok((region, fresh))
    }

    /// Tell the watcher about a PENDING region's range (undone by `drop_pending`, or at unpin).
    fn watch_pending(&self, p: RegionPtr) {
        if let Some(watcher) = &self.watcher {
            // SAFETY: a PENDING region is ours (one holder: this miss) and live.
            let r = unsafe { p.as_ref() };
            watcher.watch(r.start, self.len_of(r));
        }
    }

    /// The miss proper, cache mutex held. Returns the region and whether it entered the index
    /// (and was watched). Leaves regions to unpin in `unpins` (the caller unpins them).
    ///
    /// A cached miss excludes readers once: to detach overlapping regions, evict, and insert the
    /// new region as PENDING, all before pinning. While it pins, hooks find the range in the index
    /// (so an invalidation of it is queued, and drained before any later lookup) and readers that
    /// find it treat it as a miss. Storing the keys and clearing PENDING needs no exclusion.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn miss_locked(
        &self,
        w: &Writer,
        sid: usize,
        start: usize,
        end: usize,
        access: Access,
        by: MissBy,
        unpins: &mut Vec<RegionPtr>,
        overlaps: &mut Vec<RegionPtr>,
    ) -> Result<(RegionPtr, bool), CacheError> {
        self.drain(w, unpins);
        let found = w
            .index()
            .lookup_or_overlapping(&self.slab, start, end, access, overlaps);
        if let Some(r) = found {
            // Only we mutate the index, so the region cannot be detached under us (and only a
            // miss holding the mutex leaves a region PENDING).
            if r.state.fetch_add(1, Ordering::Relaxed) & COUNT_MASK == 0 {
                self.slots[sid].add_in_use(sid, 1);
            }
            r.touch();
            if matches!(by, MissBy::Caller) {
                self.slots[sid].add_hit(sid);
            }
            return Ok((NonNull::from(r), false));
        }
        match by {
            MissBy::Caller => self.c.misses.bump(w, 1),
            MissBy::Helper(_) => self.c.prefetched.bump(w, 1),
        }

        // Target: the union with every overlapping region of the same remote rights (their local
        // rights too), unless too big. Overlapping regions with other remote rights are detached
        // below but not merged: a key never grants remote rights that were not asked for.
        let max_pinned = w.state.limits.max_pinned;
        let (mut ts, mut te, mut ta) = (start, end, access);
        for p in overlaps.iter() {
            // SAFETY: indexed regions are live while we hold the mutex.
            let r = unsafe { p.as_ref() };
            if r.access().same_remote(access) {
                ts = ts.min(r.start);
                te = te.max(r.end(self.shift));
                ta = ta.union(r.access());
            }
        }
        if te - ts > max_pinned || !self.fits(ts, te) {
            (ts, te, ta) = (start, end, access);
        }
        // With no overlap, no room and an empty index (e.g. `max_regions = 0`) nothing can be
        // detached, evicted or inserted: no exclusion.
        let pending =
            if overlaps.is_empty() && w.index().is_empty() && !self.has_room(w, te - ts, unpins) {
                None
            } else {
                let x = w.exclude();
                // The index stays non-overlapping: old regions leave it (holders keep them).
                for p in overlaps.drain(..) {
                    self.detach(&x, p, unpins);
                }
                if !self.make_room(w, &x, te - ts, unpins) {
                    None
                } else if let Some(p) = self.insert_pending(&x, ts, te, ta) {
                    Some(p)
                } else {
                    self.c.pin_failures.bump(w, 1); // ~4 Mi region records exist
                    return Err(CacheError::NoMemory);
                }
            };
        // No room even after evicting every idle region (the rest is in use, or the bounds are
        // zero): the registration is handed out uncached (never indexed, unpinned at its last
        // release), so the cache itself never exceeds its bounds. Pin only what was asked.
        let cached = pending.is_some();
        if !cached {
            (ts, te, ta) = (start, end, access);
        }
        // From here until `publish`, a panic (in the backend, say) must not leave the PENDING
        // region indexed: a later miss would find it under the mutex and hand out its placeholder
        // keys (lkey 0) as a hit. The guard takes it out again while unwinding.
        let mut pending = PendingGuard { w, region: pending };
        // Watched from before the pin (see the file's head): no moment in which pages pinned for
        // this range go unwatched.
        if let Some(p) = pending.region {
            self.watch_pending(p);
        }
        // Evicted regions go before the new pin (the backend may be at its limit).
        self.unpin_drain(w, unpins);

        let pinned = loop {
            match self.pinner.pin(ts, te - ts, ta) {
                Ok(p) => break p,
                Err(PinError::NoMemory(_)) => {
                    let victim = {
                        let x = w.exclude();
                        // A PENDING region has a holder (this miss): never a victim.
                        x.index().clock_victim(&self.slab).inspect(|&p| {
                            self.detach(&x, p, unpins);
                        })
                    };
                    if victim.is_none() {
                        self.drop_pending(w, pending.region.take());
                        self.c.pin_failures.bump(w, 1);
                        return Err(CacheError::NoMemory);
                    }
                    self.c.evictions.bump(w, 1);
                    self.c.pin_retries.bump(w, 1);
                    self.unpin_drain(w, unpins);
                }
                Err(PinError::Failed(_)) if (ts, te, ta) != (start, end, access) => {
                    // The union may cover memory that is gone; the request alone may still pin.
                    (ts, te, ta) = (start, end, access);
                    if let Some(old) = pending.region.take() {
                        // SAFETY: ours and live (one holder: this miss).
                        let union = unsafe { old.as_ref() };
                        let (us, ul) = (union.start, self.len_of(union));
                        self.unindex_pending(w, old);
                        pending.region = {
                            let x = w.exclude();
                            // The record just freed is reused: this cannot run out.
                            self.insert_pending(&x, ts, te, ta)
                        };
                        // The request's range is watched before the union's watch goes.
                        if let Some(p) = pending.region {
                            self.watch_pending(p);
                        }
                        if let Some(watcher) = &self.watcher {
                            watcher.unwatch(us, ul);
                        }
                        if pending.region.is_none() {
                            self.c.pin_failures.bump(w, 1);
                            return Err(CacheError::NoMemory);
                        }
                    }
                }
                Err(PinError::Failed(_)) => {
                    self.drop_pending(w, pending.region.take());
                    self.c.pin_failures.bump(w, 1);
                    return Err(CacheError::PinFailed);
                }
            }
        };
        if let MissBy::Helper(still_valid) = by {
            // Still PENDING: no reader can have it yet, so a pin that raced with an unmap is
            // dropped before anyone sees it (a check after publishing left a window in which a
            // caller hit the old pages: seen in tests/helper_thread.rs under load).
            if !still_valid() {
                self.pinner.unpin(pinned, ts, te - ts);
                self.drop_pending(w, pending.region.take());
                return Err(CacheError::Busy);
            }
        }
        let len = (te - ts) as u64;
        self.slots[sid].add_in_use(sid, 1);
        let Some(region) = pending.region.take() else {
            // Uncached: nobody else can find it, so invalidations need not reach it; its
            // holder's keys stay valid until the release unpins it.
            let pages = ((te - ts) >> self.shift) as u32;
            let Some(region) = self.slab.alloc(ts, pages, pinned, ta, 1 | DETACHED, true) else {
                self.slots[sid].add_in_use(sid, -1);
                self.pinner.unpin(pinned, ts, te - ts);
                self.c.pin_failures.bump(w, 1);
                return Err(CacheError::NoMemory);
            };
            self.count_pin(w, len, false);
            self.c.uncached_total.bump(w, 1);
            return Ok((region, false));
        };
        self.count_pin(w, len, true);
        // SAFETY: the pending region is ours (one holder: this miss) and live.
        let r = unsafe { region.as_ref() };
        r.set_pinned(pinned);
        // An invalidation that arrived while pinning found the range in the index and is queued:
        // the drain before the next lookup (every lookup drains first) detaches the region. This
        // caller's keys stay valid until its release either way.
        r.publish();
        Ok((region, true))
    }

    /// Allocate a region record for `[ts, te)` (one holder, PENDING, placeholder keys) and put it
    /// in the index. `None` when ~4 Mi region records exist.
    pub(super) fn insert_pending(
        &self,
        x: &Exclusive,
        ts: usize,
        te: usize,
        ta: Access,
    ) -> Option<RegionPtr> {
        let none = crate::pin::Pinned {
            token: 0,
            lkey: 0,
            rkey: 0,
        };
        let pages = ((te - ts) >> self.shift) as u32;
        let region = self.slab.alloc(ts, pages, none, ta, 1 | PENDING, false)?;
        x.index().insert(&self.slab, region);
        Some(region)
    }

    /// Undo `insert_pending` (and its `watch_pending`) after a failed pin. No drain runs between
    /// the insert and the pin, so the region is still indexed; checked anyway, since removing an
    /// unindexed one would be wrong.
    pub(super) fn drop_pending(&self, w: &Writer, pending: Option<RegionPtr>) {
        let Some(p) = pending else { return };
        // SAFETY: ours and live (one holder: this miss).
        self.unwatch(unsafe { p.as_ref() });
        self.unindex_pending(w, p);
    }

    /// Take a PENDING region out of the index and free its record (its watch is the caller's).
    fn unindex_pending(&self, w: &Writer, p: RegionPtr) {
        {
            let x = w.exclude();
            // SAFETY: ours and live; readers are excluded.
            if unsafe { p.as_ref() }.is_indexed() {
                x.index().remove(&self.slab, p);
            }
        }
        // Nobody else holds it: readers never acquire a PENDING region.
        self.slab.free(p);
    }
}
