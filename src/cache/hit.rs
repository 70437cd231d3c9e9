//! The hit path: register (validate, look up as a reader, bump the refcount, issue a handle),
//! and its mirror, deregister (release the handle, drop the reference; the last holder of a
//! detached region unpins it). Everything else is out of line.

use std::ptr::NonNull;
use std::sync::atomic::Ordering;

use super::core::Cache;
use super::error::CacheError;
use super::gate::Seen;
use super::index::RegionPtr;
use super::membarrier;
use super::readers::my_slot;
use super::region::{COUNT_MASK, DETACHED, PENDING};
use super::spinlock::wait_while;
use super::Registration;
use crate::pin::Access;

pub(super) enum Fast {
    Hit(RegionPtr),
    Miss,
    Busy,
}

impl Cache {
    /// Validates, page-aligns, hits or pins. Returns the caller's exact addr/len plus keys.
    pub fn register(
        &self,
        addr: usize,
        len: usize,
        access: Access,
    ) -> Result<Registration, CacheError> {
        let (start, end) = self.bounds(addr, len, access)?;
        let sid = my_slot();
        let region = match self.try_hit(sid, start, end, access) {
            Fast::Hit(r) => {
                self.slots[sid].add_hit(sid);
                r
            }
            Fast::Busy => self.register_busy(sid, start, end, access)?,
            Fast::Miss => self.register_slow(sid, start, end, access)?,
        };
        self.issue(sid, region, addr, len)
    }

    /// A hit or nothing: the registration when `[addr, addr + len)` is already cached with these
    /// rights (the hit `register` would make), else `Ok(None)` with nothing pinned or changed.
    /// For a caller that would not cache a miss anyway (the shim while it bypasses: a miss there
    /// costs more than the plain registration it stands for). A writer mid-update also answers
    /// `None`: the caller registers without the cache, which is never wrong.
    pub fn register_if_cached(
        &self,
        addr: usize,
        len: usize,
        access: Access,
    ) -> Result<Option<Registration>, CacheError> {
        let (start, end) = self.bounds(addr, len, access)?;
        let sid = my_slot();
        match self.try_hit(sid, start, end, access) {
            Fast::Hit(r) => {
                self.slots[sid].add_hit(sid);
                self.issue(sid, r, addr, len).map(Some)
            }
            Fast::Busy | Fast::Miss => Ok(None),
        }
    }

    /// A writer was mutating the index (briefly; never across a backend call): wait for it and
    /// retry the hit, up to 100 times, then take the slow path. Out of line so the hit path in
    /// `register` keeps few live values (no spills).
    #[cold]
    #[inline(never)]
    pub(super) fn register_busy(
        &self,
        sid: usize,
        start: usize,
        end: usize,
        access: Access,
    ) -> Result<RegionPtr, CacheError> {
        for _ in 0..100 {
            wait_while(|| self.gate.writer_active());
            match self.try_hit(sid, start, end, access) {
                Fast::Hit(r) => {
                    self.slots[sid].add_hit(sid);
                    return Ok(r);
                }
                Fast::Busy => {}
                Fast::Miss => break,
            }
        }
        self.register_slow(sid, start, end, access)
    }

    /// Reader section: one lookup, refcount bump on success.
    #[inline(always)]
    pub(super) fn try_hit(&self, sid: usize, start: usize, end: usize, access: Access) -> Fast {
        let slot = &self.slots[sid];
        if sid != 0 && !slot.joined.load(Ordering::Relaxed) {
            self.join(sid);
        }
        slot.enter(sid, membarrier::available());
        // One load for the writer flag, queued invalidations and overflow (gate.rs says why no
        // invalidation whose `invalidate` returned can be missed here).
        match self.gate.check() {
            Seen::Open => {}
            Seen::Writer => {
                slot.exit(sid);
                return Fast::Busy;
            }
            Seen::Pending => {
                slot.exit(sid);
                return Fast::Miss;
            }
        }
        // SAFETY: inside a reader section with no writer active: the index is not mutated and its
        // regions are not freed until we exit.
        let index = unsafe { &*self.index.get() };
        let res = match index.lookup(&self.slab, start, end, access) {
            Some(r) => {
                // Acquire: pairs with `publish`, so the keys stored before it are visible.
                let prev = r.state.fetch_add(1, Ordering::Acquire);
                if prev & PENDING != 0 {
                    // A miss is still pinning it (and holds the mutex the slow path waits on).
                    r.state.fetch_sub(1, Ordering::Relaxed);
                    slot.exit(sid);
                    return Fast::Miss;
                }
                if prev & COUNT_MASK == 0 {
                    slot.add_in_use(sid, 1);
                }
                r.touch();
                Fast::Hit(NonNull::from(r))
            }
            None => Fast::Miss,
        };
        slot.exit(sid);
        res
    }

    /// Inlined into both callers (`register`, `register_if_cached`): with two, the compiler
    /// had stopped inlining it into `register`'s hit path.
    #[inline(always)]
    pub(super) fn issue(
        &self,
        sid: usize,
        r: RegionPtr,
        addr: usize,
        len: usize,
    ) -> Result<Registration, CacheError> {
        match self.handles.acquire(sid, r) {
            Some(handle) => {
                // SAFETY: we hold a reference count on `r`, so it is live.
                let p = unsafe { r.as_ref() }.pinned();
                Ok(Registration {
                    handle,
                    addr,
                    len,
                    lkey: p.lkey,
                    rkey: p.rkey,
                })
            }
            None => {
                self.release_region(sid, r);
                Err(CacheError::NoMemory)
            }
        }
    }

    /// Drop one reference; the last holder of a detached region unpins it.
    #[inline(always)]
    pub(super) fn release_region(&self, sid: usize, p: RegionPtr) {
        // SAFETY: the caller owned one reference, so the region is live until we drop it here.
        let prev = unsafe { p.as_ref() }.state.fetch_sub(1, Ordering::AcqRel);
        debug_assert!(prev & COUNT_MASK != 0, "refcount underflow");
        if prev & COUNT_MASK == 1 {
            // Every hit of an otherwise idle region ends here: keep this part inline.
            self.slots[sid].add_in_use(sid, -1);
            if prev & DETACHED != 0 {
                self.release_detached(p);
            } else if self.over_limits() {
                self.trim();
            }
        }
    }

    /// Unknown / already released handle -> `CacheError::UnknownHandle` and nothing changes.
    pub fn deregister(&self, handle: u64) -> Result<(), CacheError> {
        if self.pending() {
            return self.deregister_pending(handle);
        }
        self.release(handle)
    }

    /// Invalidations are queued, or the cache is quarantined after fork (which raises `overflow`
    /// too): out of line, so the common release checks one flag.
    #[cold]
    #[inline(never)]
    fn deregister_pending(&self, handle: u64) -> Result<(), CacheError> {
        if self.is_forked() {
            return Err(CacheError::Forked);
        }
        self.release(handle)?;
        if self.deferred.get().is_none() {
            // (With a helper, the helper drains: `deregister` never calls the backend.)
            self.drain_now();
        }
        Ok(())
    }

    #[inline(always)]
    fn release(&self, handle: u64) -> Result<(), CacheError> {
        let sid = my_slot();
        let r = self
            .handles
            .release(sid, handle)
            .ok_or(CacheError::UnknownHandle)?;
        self.release_region(sid, r);
        Ok(())
    }
}
