//! `Cache`: the pin-down cache proper (seed 003) with hook-safe invalidation.
//!
//! Concurrency design (why the hit path scales):
//! * The index (non-overlapping regions) is mutated only by a *writer*: a thread holding `mutex`
//!   that has raised `writer` and waited until every reader slot is empty. Readers (hits, and the
//!   hook-side overlap filter) enter their own per-thread slot, check `writer` and the
//!   invalidation queue, look up, bump the region's refcount and leave. A hit therefore writes only
//!   its slot line, the region's refcount and its handle record.
//! * The writer holds readers off only around index mutations, never around backend calls: a miss
//!   inserts its region PENDING (one exclusion, together with detaching overlaps and evicting),
//!   then pins with the mutex held but readers running, so hits on other regions continue
//!   meanwhile; readers that find a PENDING region take the slow path and wait for the mutex.
//! * `invalidate` (hooks) never blocks: it checks for overlap as a reader (PENDING regions count,
//!   so an unmap during a pin is not lost; it conservatively assumes overlap if a writer is
//!   active) and pushes the range into a fixed ring. Every register sees a non-empty ring and
//!   drains it (as writer) before looking up, so after `invalidate` returns no lookup can hit an
//!   overlapping region.
//! * No room within the bounds (the rest in use, or zero bounds): the registration is handed out
//!   uncached (detached from the start) and unpinned at its release.
//! * Regions leave the index by being *detached* (`DETACHED` bit). Whoever brings the count of a
//!   detached region to zero unpins and frees it; readers can no longer find it, and any reader
//!   that found it earlier finished before the writer detached it.

use std::cell::UnsafeCell;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use super::counters::{HoldsMutex, Locked, PinCount};
use super::handles::Handles;
use super::index::{Index, RegionPtr};
use super::inval_queue::InvalQueue;
use super::membarrier;
use super::readers::{my_slot, ReaderSlot, SLOTS};
use super::region::{Region, COUNT_MASK, DETACHED, PENDING};
use super::slab::Slab;
use super::spinlock::wait_while;
use super::{Limits, RangeWatcher, Registration, Stats};
use crate::pin::{Access, PinError, Pinner};
use crate::status::{fh_status, FhResult};

#[repr(align(128))]
struct Padded<T>(T);

/// Counters changed only on slow paths (misses, evictions, releases of detached regions); see
/// counters.rs for why most need no locked instruction.
#[derive(Default)]
struct SlowCounters {
    misses: Locked,
    evictions: Locked,
    invalidations: Locked,
    /// Pinned pages and regions that count against the bounds: everything that was cached
    /// (indexed now, or detached and still held).
    cached: PinCount,
    /// Registrations handed out uncached (no room in the cache) and still held.
    uncached: PinCount,
    /// High-water mark of all pinned bytes.
    pinned_peak: AtomicU64,
    /// Registrations ever handed out uncached.
    uncached_total: Locked,
    pin_retries: Locked,
    pin_failures: Locked,
}

/// The pin-down cache. `Send + Sync`; share it as `Arc<Cache>`.
pub struct Cache {
    pinner: Arc<dyn Pinner>,
    watcher: Option<Arc<dyn RangeWatcher>>,
    page: usize,
    shift: u32,
    slots: Box<[ReaderSlot; SLOTS]>,
    writer: Padded<AtomicBool>,
    /// Exclusive slots that ever entered this cache, and the highest such id (writers scan
    /// slots 0..=max only, and skip the membarrier when the only joined slot is their own).
    joined: Padded<(AtomicUsize, AtomicUsize)>,
    queue: Padded<InvalQueue>,
    /// Set when a hook found the ring full: the next drain invalidates everything.
    overflow: Padded<AtomicBool>,
    /// Set in a child process after `fork` (see `quarantine`): every call fails with
    /// `FH_ERR_FORKED` before touching a lock, and drop leaves the parent's pins alone.
    forked: AtomicBool,
    index: UnsafeCell<Index>,
    /// Region records (ids are what the index stores).
    slab: Slab,
    /// Serialises writers (misses, drains, evictions); guards the limits.
    ///
    /// Lock order: `mutex`, then the reader exclusion (`Writer::exclude`), then the leaf locks
    /// (the slab's spin lock, the handle table's `grow`/`shared` mutexes, the reader-id pool),
    /// which never call out while held. The backend is called with `mutex` held (never with
    /// readers excluded). Hooks take no lock at all (`invalidate`).
    mutex: Mutex<WriterState>,
    max_pinned: AtomicUsize,
    /// Largest page-aligned request `register` accepts: `max_pinned`, capped so that the length
    /// in pages fits the region's u32 (one compare on the hit path covers both).
    max_request: AtomicUsize,
    max_regions: AtomicUsize,
    handles: Handles,
    c: SlowCounters,
}

// SAFETY: `index` is mutated only by the writer (mutex held + readers excluded, see
// `Writer::exclude`) and read by readers only inside reader sections; regions are Sync; the rest
// is atomics or locks.
unsafe impl Sync for Cache {}
// SAFETY: nothing in Cache is tied to a thread.
unsafe impl Send for Cache {}

enum Fast {
    Hit(RegionPtr),
    Miss,
    Busy,
}

/// A PENDING region between its insert and its publish. Dropped with the region still inside
/// only while unwinding from a panic: then the region leaves the index and is freed.
struct PendingGuard<'a, 'w> {
    cache: &'a Cache,
    w: &'a Writer<'w>,
    region: Option<RegionPtr>,
}

impl Drop for PendingGuard<'_, '_> {
    fn drop(&mut self) {
        if let Some(p) = self.region.take() {
            self.cache.drop_pending(self.w, Some(p));
        }
    }
}

/// What the cache mutex guards.
struct WriterState {
    limits: Limits,
    /// Storage for the unpin lists of misses and `trim`, kept between calls: a miss or a release
    /// that trims (every miss under tight bounds) then pays no malloc/free pair.
    spare: Vec<RegionPtr>,
    /// Storage for a miss's list of overlapping regions.
    overlaps: Vec<RegionPtr>,
}

/// Proof that the cache mutex is held.
struct Writer<'a> {
    cache: &'a Cache,
    state: MutexGuard<'a, WriterState>,
}

impl HoldsMutex for Writer<'_> {}

/// Proof that readers are excluded; lowers the writer flag on drop.
struct Exclusive<'a> {
    cache: &'a Cache,
}

impl Drop for Exclusive<'_> {
    fn drop(&mut self) {
        // Release: a reader that sees the flag down sees the index as we left it. (Raising the
        // flag is the store that needs SeqCst: see `Writer::exclude`.)
        self.cache.writer.0.store(false, Ordering::Release);
    }
}

impl Exclusive<'_> {
    #[allow(clippy::mut_from_ref)]
    fn index(&self) -> &mut Index {
        // SAFETY: readers are excluded and the mutex serialises writers, so this is the only
        // reference to the index while `self` lives (callers never hold two at once).
        unsafe { &mut *self.cache.index.get() }
    }
}

impl Writer<'_> {
    fn exclude(&self) -> Exclusive<'_> {
        let c = self.cache;
        c.writer.0.store(true, Ordering::SeqCst);
        // A slot joining after these loads sees the flag (its join RMWs precede its flag load).
        let n = c.joined.0 .0.load(Ordering::SeqCst);
        let max = c.joined.0 .1.load(Ordering::SeqCst);
        if membarrier::available() {
            let me = my_slot();
            let alone = n == 0 || (n == 1 && me != 0 && c.slots[me].joined.load(Ordering::Relaxed));
            if !alone {
                // Make every exclusive reader's plain "entered" store visible (or let it see our
                // flag): see membarrier.rs.
                membarrier::heavy();
            }
        }
        for s in c.slots[..=max].iter() {
            wait_while(|| s.readers.load(Ordering::SeqCst) != 0);
        }
        Exclusive { cache: c }
    }

    fn index(&self) -> &Index {
        // SAFETY: we hold the mutex, so no writer mutates the index concurrently; shared reads are
        // fine alongside readers.
        unsafe { &*self.cache.index.get() }
    }
}

impl Cache {
    /// A cache over `pinner`, bounded by `limits`, telling `watcher` about every new pin.
    pub fn new(
        pinner: Arc<dyn Pinner>,
        limits: Limits,
        watcher: Option<Arc<dyn RangeWatcher>>,
    ) -> Arc<Cache> {
        // SAFETY: sysconf has no memory-safety preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        let page = if page > 0 { page as usize } else { 4096 };
        membarrier::init();
        Arc::new(Cache {
            pinner,
            watcher,
            page,
            shift: page.trailing_zeros(),
            slots: Box::new(std::array::from_fn(|_| ReaderSlot::default())),
            writer: Padded(AtomicBool::new(false)),
            joined: Padded((AtomicUsize::new(0), AtomicUsize::new(0))),
            queue: Padded(InvalQueue::new()),
            overflow: Padded(AtomicBool::new(false)),
            forked: AtomicBool::new(false),
            index: UnsafeCell::new(Index::new(page.trailing_zeros())),
            slab: Slab::new(),
            mutex: Mutex::new(WriterState {
                limits,
                spare: Vec::new(),
                overlaps: Vec::new(),
            }),
            max_pinned: AtomicUsize::new(limits.max_pinned),
            max_request: AtomicUsize::new(max_request(limits.max_pinned, page)),
            max_regions: AtomicUsize::new(limits.max_regions),
            handles: Handles::new(),
            c: SlowCounters::default(),
        })
    }

    pub fn backend_name(&self) -> &'static str {
        self.pinner.name()
    }

    pub fn limits(&self) -> Limits {
        Limits {
            max_pinned: self.max_pinned.load(Ordering::Relaxed),
            max_regions: self.max_regions.load(Ordering::Relaxed),
        }
    }

    /// A region's length is kept in pages as a u32.
    #[inline]
    fn fits(&self, start: usize, end: usize) -> bool {
        (end - start) >> self.shift <= u32::MAX as usize
    }

    #[inline]
    fn len_of(&self, r: &Region) -> usize {
        (r.pages as usize) << self.shift
    }

    /// Invalidations are waiting in the ring (one read-mostly line).
    #[inline]
    fn pending(&self) -> bool {
        !self.queue.0.is_empty() || self.overflow.0.load(Ordering::SeqCst)
    }

    fn lock(&self) -> Writer<'_> {
        Writer {
            cache: self,
            state: self.mutex.lock().unwrap_or_else(|e| e.into_inner()),
        }
    }

    /// Validates, page-aligns, hits or pins. Returns the caller's exact addr/len plus keys.
    pub fn register(&self, addr: usize, len: usize, access: Access) -> FhResult<Registration> {
        if len == 0 {
            return Err(fh_status::FH_ERR_ZERO_LENGTH);
        }
        let end = addr.checked_add(len).ok_or(fh_status::FH_ERR_OVERFLOW)?;
        if !access.is_valid() {
            return Err(fh_status::FH_ERR_BAD_ACCESS);
        }
        let start = addr & !(self.page - 1);
        let end = end
            .checked_add(self.page - 1)
            .ok_or(fh_status::FH_ERR_OVERFLOW)?
            & !(self.page - 1);
        if end - start > self.max_request.load(Ordering::Relaxed) {
            return Err(fh_status::FH_ERR_TOO_LARGE);
        }
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

    /// A writer was mutating the index (briefly; never across a backend call): wait for it and
    /// retry the hit, up to 100 times, then take the slow path. Out of line so the hit path in
    /// `register` keeps few live values (no spills).
    #[cold]
    #[inline(never)]
    fn register_busy(
        &self,
        sid: usize,
        start: usize,
        end: usize,
        access: Access,
    ) -> FhResult<RegionPtr> {
        for _ in 0..100 {
            wait_while(|| self.writer.0.load(Ordering::Relaxed));
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
    fn try_hit(&self, sid: usize, start: usize, end: usize, access: Access) -> Fast {
        let slot = &self.slots[sid];
        if sid != 0 && !slot.joined.load(Ordering::Relaxed) {
            self.join(sid);
        }
        slot.enter(sid, membarrier::available());
        if self.writer.0.load(Ordering::SeqCst) {
            slot.exit(sid);
            return Fast::Busy;
        }
        if self.pending() {
            slot.exit(sid);
            return Fast::Miss;
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

    /// First entry of slot `sid` into this cache: counted before its first reader section, so a
    /// writer either sees the slot or the slot sees the writer's flag.
    #[cold]
    fn join(&self, sid: usize) {
        self.slots[sid].joined.store(true, Ordering::Relaxed);
        self.joined.0 .1.fetch_max(sid, Ordering::SeqCst);
        self.joined.0 .0.fetch_add(1, Ordering::SeqCst);
    }

    #[inline]
    fn issue(&self, sid: usize, r: RegionPtr, addr: usize, len: usize) -> FhResult<Registration> {
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
                Err(fh_status::FH_ERR_NO_MEMORY)
            }
        }
    }

    /// Miss path: drain, re-check, make room, pin (readers running), insert. Kept out of line so
    /// the hit path in `register` stays a small leaf (no spills, short prologue).
    #[cold]
    #[inline(never)]
    fn register_slow(
        &self,
        sid: usize,
        start: usize,
        end: usize,
        access: Access,
    ) -> FhResult<RegionPtr> {
        if self.is_forked() {
            return Err(fh_status::FH_ERR_FORKED);
        }
        let mut w = self.lock();
        // Scratch lists kept in the writer state: a miss then pays no malloc/free pair.
        let mut unpins = std::mem::take(&mut w.state.spare);
        let mut overlaps = std::mem::take(&mut w.state.overlaps);
        let res = self.miss_locked(&w, sid, start, end, access, &mut unpins, &mut overlaps);
        self.unpin_drain(&mut unpins);
        overlaps.clear();
        w.state.spare = unpins;
        w.state.overlaps = overlaps;
        drop(w);
        let (region, watch) = res?;
        if let (Some(watcher), Some((ts, te))) = (&self.watcher, watch) {
            watcher.watch(ts, te - ts);
        }
        Ok(region)
    }

    /// The miss proper, cache mutex held. Returns the region and, if it entered the index, the
    /// range to hand to the watcher. Leaves regions to unpin in `unpins` (the caller unpins them).
    ///
    /// A cached miss excludes readers once: to detach overlapping regions, evict, and insert the
    /// new region as PENDING, all before pinning. While it pins, hooks find the range in the index
    /// (so an invalidation of it is queued, and drained before any later lookup) and readers that
    /// find it treat it as a miss. Storing the keys and clearing PENDING needs no exclusion.
    #[allow(clippy::too_many_arguments)]
    fn miss_locked(
        &self,
        w: &Writer,
        sid: usize,
        start: usize,
        end: usize,
        access: Access,
        unpins: &mut Vec<RegionPtr>,
        overlaps: &mut Vec<RegionPtr>,
    ) -> FhResult<(RegionPtr, Option<(usize, usize)>)> {
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
            self.slots[sid].add_hit(sid);
            return Ok((NonNull::from(r), None));
        }
        self.c.misses.bump(w, 1);

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
                    return Err(fh_status::FH_ERR_NO_MEMORY);
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
        let mut pending = PendingGuard {
            cache: self,
            w,
            region: pending,
        };
        // Evicted regions go before the new pin (the backend may be at its limit).
        self.unpin_drain(unpins);

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
                        return Err(fh_status::FH_ERR_NO_MEMORY);
                    }
                    self.c.evictions.bump(w, 1);
                    self.c.pin_retries.bump(w, 1);
                    self.unpin_drain(unpins);
                }
                Err(PinError::Failed(_)) if (ts, te, ta) != (start, end, access) => {
                    // The union may cover memory that is gone; the request alone may still pin.
                    (ts, te, ta) = (start, end, access);
                    if pending.region.is_some() {
                        self.drop_pending(w, pending.region.take());
                        let x = w.exclude();
                        // The record just freed is reused: this cannot run out.
                        pending.region = self.insert_pending(&x, ts, te, ta);
                        if pending.region.is_none() {
                            self.c.pin_failures.bump(w, 1);
                            return Err(fh_status::FH_ERR_NO_MEMORY);
                        }
                    }
                }
                Err(PinError::Failed(_)) => {
                    self.drop_pending(w, pending.region.take());
                    self.c.pin_failures.bump(w, 1);
                    return Err(fh_status::FH_ERR_PIN_FAILED);
                }
            }
        };
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
                return Err(fh_status::FH_ERR_NO_MEMORY);
            };
            self.count_pin(len, false);
            self.c.uncached_total.bump(w, 1);
            return Ok((region, None));
        };
        self.count_pin(len, true);
        // SAFETY: the pending region is ours (one holder: this miss) and live.
        let r = unsafe { region.as_ref() };
        r.set_pinned(pinned);
        // An invalidation that arrived while pinning found the range in the index and is queued:
        // the drain before the next lookup (every lookup drains first) detaches the region. This
        // caller's keys stay valid until its release either way.
        r.publish();
        Ok((region, Some((ts, te))))
    }

    /// Allocate a region record for `[ts, te)` (one holder, PENDING, placeholder keys) and put it
    /// in the index. `None` when ~4 Mi region records exist.
    fn insert_pending(&self, x: &Exclusive, ts: usize, te: usize, ta: Access) -> Option<RegionPtr> {
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

    /// Undo `insert_pending` after a failed pin. No drain runs between the insert and the pin, so
    /// the region is still indexed; checked anyway, since removing an unindexed one would be wrong.
    fn drop_pending(&self, w: &Writer, pending: Option<RegionPtr>) {
        let Some(p) = pending else { return };
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

    /// Cached bytes and regions that stay pinned once the regions in `unpins` are gone.
    fn staying(&self, unpins: &[RegionPtr]) -> (usize, usize) {
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
    fn fits_limits(limits: Limits, bytes: usize, regions: usize, extra: usize) -> bool {
        bytes.saturating_add(extra) <= limits.max_pinned
            && regions.saturating_add((extra > 0) as usize) <= limits.max_regions
    }

    /// Whether `extra` more bytes (and one more region) fit without evicting.
    fn has_room(&self, w: &Writer, extra: usize, unpins: &[RegionPtr]) -> bool {
        let (bytes, regions) = self.staying(unpins);
        Self::fits_limits(w.state.limits, bytes, regions, extra)
    }

    /// Evict idle regions (CLOCK order) until `extra` more bytes and one more region fit.
    /// Returns whether they fit (false: everything left is in use).
    fn make_room(
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
    fn detach(&self, x: &Exclusive, p: RegionPtr, unpins: &mut Vec<RegionPtr>) {
        x.index().remove(&self.slab, p);
        // SAFETY: `p` was indexed, hence live; readers are excluded, so its count cannot rise.
        let prev = unsafe { p.as_ref() }
            .state
            .fetch_or(DETACHED, Ordering::AcqRel);
        if prev & COUNT_MASK == 0 {
            unpins.push(p);
        }
    }

    /// Process queued invalidations: detach every indexed region they overlap (PENDING ones
    /// included); idle ones are queued in `unpins`.
    #[inline]
    fn drain(&self, w: &Writer, unpins: &mut Vec<RegionPtr>) {
        if self.pending() {
            self.drain_queued(w, unpins);
        }
    }

    #[cold]
    #[inline(never)]
    fn drain_queued(&self, w: &Writer, unpins: &mut Vec<RegionPtr>) {
        let x = w.exclude();
        let all = self.overflow.0.swap(false, Ordering::SeqCst);
        let mut victims = Vec::new();
        while let Some((s, e)) = self.queue.0.pop() {
            if !all {
                victims.extend(x.index().overlapping(&self.slab, s, e));
            }
        }
        if all {
            victims = x.index().all(&self.slab);
        }
        victims.sort_unstable();
        victims.dedup();
        self.c.invalidations.bump(w, victims.len() as u64);
        for p in victims {
            self.detach(&x, p, unpins);
        }
    }

    fn unpin_all(&self, mut unpins: Vec<RegionPtr>) {
        self.unpin_drain(&mut unpins);
    }

    /// Unpin everything in `unpins`, leaving it empty (its capacity is kept for reuse).
    fn unpin_drain(&self, unpins: &mut Vec<RegionPtr>) {
        for p in unpins.drain(..) {
            self.unpin_free(p);
        }
    }

    /// Unpin and free a detached region nobody holds.
    #[inline(never)]
    fn unpin_free(&self, p: RegionPtr) {
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
    fn unwatch(&self, r: &Region) {
        if let (Some(w), false) = (&self.watcher, r.uncached) {
            w.unwatch(r.start, self.len_of(r));
        }
    }

    /// The counter a region of this kind is charged to.
    fn pin_count(&self, cached: bool) -> &PinCount {
        if cached {
            &self.c.cached
        } else {
            &self.c.uncached
        }
    }

    fn count_pin(&self, len: u64, cached: bool) {
        self.pin_count(cached).add(len >> self.shift);
        let total = (self.c.cached.get().0 + self.c.uncached.get().0) << self.shift;
        // Usually below the peak: a load, no locked instruction.
        if total > self.c.pinned_peak.load(Ordering::Relaxed) {
            self.c.pinned_peak.fetch_max(total, Ordering::Relaxed);
        }
    }

    fn count_unpin(&self, len: u64, cached: bool) {
        self.pin_count(cached).sub(len >> self.shift);
    }

    /// Drop one reference; the last holder of a detached region unpins it.
    #[inline(always)]
    fn release_region(&self, sid: usize, p: RegionPtr) {
        // SAFETY: the caller owned one reference, so the region is live until we drop it here.
        let prev = unsafe { p.as_ref() }.state.fetch_sub(1, Ordering::AcqRel);
        debug_assert!(prev & COUNT_MASK != 0, "refcount underflow");
        if prev & COUNT_MASK == 1 {
            // Every hit of an otherwise idle region ends here: keep this part inline.
            self.slots[sid].add_in_use(sid, -1);
            if prev & DETACHED != 0 {
                self.unpin_free(p);
            } else if self.over_limits() {
                self.trim();
            }
        }
    }

    /// Lazy release left the cache above its bounds (it was full of in-use regions).
    #[cold]
    #[inline(never)]
    fn trim(&self) {
        let mut w = self.lock();
        let mut unpins = std::mem::take(&mut w.state.spare);
        self.drain(&w, &mut unpins);
        {
            let x = w.exclude();
            self.make_room(&w, &x, 0, &mut unpins);
        }
        self.unpin_drain(&mut unpins);
        w.state.spare = unpins;
    }

    #[inline]
    fn over_limits(&self) -> bool {
        let (pages, regions) = self.c.cached.get();
        (pages as usize) << self.shift > self.max_pinned.load(Ordering::Relaxed)
            || regions as usize > self.max_regions.load(Ordering::Relaxed)
    }

    /// Unknown / already released handle -> `FH_ERR_UNKNOWN_HANDLE` and nothing changes.
    pub fn deregister(&self, handle: u64) -> FhResult<()> {
        if self.is_forked() {
            return Err(fh_status::FH_ERR_FORKED);
        }
        let sid = my_slot();
        let r = self
            .handles
            .release(sid, handle)
            .ok_or(fh_status::FH_ERR_UNKNOWN_HANDLE)?;
        self.release_region(sid, r);
        if self.pending() {
            self.drain_now();
        }
        Ok(())
    }

    #[cold]
    #[inline(never)]
    fn drain_now(&self) -> usize {
        let w = self.lock();
        let mut unpins = Vec::new();
        self.drain(&w, &mut unpins);
        let n = unpins.len();
        self.unpin_all(unpins);
        n
    }

    /// HOOK-SAFE: no allocation, no blocking, no backend call. Regions overlapping the range can
    /// never be hit again once this returns; they are unpinned at the next normal call.
    pub fn invalidate(&self, addr: usize, len: usize) {
        if len == 0 {
            return;
        }
        let start = addr & !(self.page - 1);
        let end = addr.saturating_add(len).saturating_add(self.page - 1) & !(self.page - 1);
        if self.may_be_cached(start, end) && !self.queue.0.push(start, end) {
            self.overflow.0.store(true, Ordering::SeqCst);
        }
    }

    /// Filter for `invalidate`: false only when no indexed region overlaps. A miss that is
    /// pinning has its region in the index already (PENDING), so its range counts. Conservative
    /// (true) whenever a writer is active.
    fn may_be_cached(&self, start: usize, end: usize) -> bool {
        // Always the shared slot: a hook may fire on a thread that is itself inside the cache, and
        // exclusive slots do not nest.
        let slot = &self.slots[0];
        slot.enter(0, false);
        let res = if self.writer.0.load(Ordering::SeqCst) {
            true
        } else {
            // SAFETY: reader section, no writer active (see `try_hit`).
            unsafe { &*self.index.get() }.any_overlapping(&self.slab, start, end)
        };
        slot.exit(0);
        res
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
        self.unpin_all(unpins);
    }

    /// Counters. A pure read (takes no lock, changes nothing): idle regions invalidated since the
    /// last call still count as pinned until the next register/deregister/flush unpins them.
    pub fn stats(&self) -> Stats {
        let (mut hits, mut in_use) = (0u64, 0i64);
        for s in self.slots.iter() {
            hits += s.hits.load(Ordering::Relaxed);
            in_use += s.in_use.load(Ordering::Relaxed);
        }
        let c = &self.c;
        let (cached_pages, cached_regions) = c.cached.get();
        let (uncached_pages, uncached_regions) = c.uncached.get();
        Stats {
            hits,
            misses: c.misses.get(),
            evictions: c.evictions.get(),
            invalidations: c.invalidations.get(),
            pinned_bytes: (cached_pages + uncached_pages) << self.shift,
            pinned_peak: c.pinned_peak.load(Ordering::Relaxed),
            regions: cached_regions + uncached_regions,
            in_use: in_use.max(0) as u64,
            pin_retries: c.pin_retries.get(),
            pin_failures: c.pin_failures.get(),
            uncached: c.uncached_total.get(),
        }
    }

    /// Unpin every idle region (also processes pending invalidations). Returns how many.
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
        self.unpin_all(unpins);
        n
    }

    /// Process the invalidations reported since the last call now: count them and unpin the idle
    /// regions they cover. NOT hook-safe (takes the writer lock, may call the backend). `stats`
    /// stays a pure read; callers that want current counters (e.g. `fh_get_stats`) call this
    /// first. Returns how many regions were unpinned.
    pub fn process_invalidations(&self) -> usize {
        if self.pending() && !self.is_forked() {
            self.drain_now()
        } else {
            0
        }
    }

    /// Quarantine after `fork`, in the child (see `seam::MemoryListener::forked`): no lock, no
    /// allocation. A writer flag left raised by a parent thread that does not exist here is
    /// lowered and `overflow` raised, so every hit attempt falls through to the slow path, which
    /// returns `FH_ERR_FORKED` without waiting for anything.
    pub fn quarantine(&self) {
        self.forked.store(true, Ordering::SeqCst);
        self.overflow.0.store(true, Ordering::SeqCst);
        self.writer.0.store(false, Ordering::SeqCst);
    }

    /// Whether this cache was inherited across `fork` (see `quarantine`).
    pub fn is_forked(&self) -> bool {
        self.forked.load(Ordering::Relaxed)
    }

    /// Entries waiting in the invalidation ring (for tests and diagnostics).
    pub fn queued_invalidations(&self) -> usize {
        self.queue.0.len()
    }
}

/// See `Cache::max_request`.
fn max_request(max_pinned: usize, page: usize) -> usize {
    max_pinned.min((u32::MAX as usize).saturating_mul(page))
}

impl crate::seam::MemoryListener for Cache {
    fn on_unmap(&self, addr: usize, len: usize) {
        self.invalidate(addr, len)
    }

    fn forked(&self) {
        self.quarantine();
    }
}

impl Drop for Cache {
    fn drop(&mut self) {
        if self.is_forked() {
            // The pins are the parent's (an `ibv_dereg_mr` here would deregister the parent's MR
            // through the shared uverbs fd): leave them. The slab frees the records.
            return;
        }
        let mut all = self.index.get_mut().all(&self.slab);
        all.extend(self.handles.live_regions());
        all.sort_unstable();
        all.dedup();
        for p in all {
            // SAFETY: we have exclusive access; every region is either indexed or held by a live
            // handle (detached idle ones were already freed), each listed once. The slab frees
            // the records when it drops.
            let r = unsafe { p.as_ref() };
            self.pinner.unpin(r.pinned(), r.start, self.len_of(r));
            self.unwatch(r);
        }
    }
}
