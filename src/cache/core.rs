//! `Cache`: the pin-down cache proper (Tezuka et al., "Pin-down Cache: A Virtual Memory Management
//! Technique for Zero-copy Communication" (IPPS 1998)) with hook-safe invalidation: its state and
//! its construction. Its jobs live beside it, one file each: `exclusion.rs` (the mutex and the
//! reader exclusion), `hit.rs` (register/deregister fast paths), `miss.rs`, `limits.rs` (eviction
//! and bounds), `invalidate.rs`, `pins.rs` (unpinning and pinned-bytes accounting), `stats.rs`.
//!
//! Concurrency design (why the hit path scales):
//! * The index (non-overlapping regions) is mutated only by a *writer*: a thread holding `mutex`
//!   that has raised the writer bit and waited until every reader slot is empty. Readers (hits,
//!   and the hook-side overlap filter) enter their own per-thread slot, check the gate (one word:
//!   writer bit, overflow bit, announced invalidations; gate.rs), look up, bump the region's refcount and leave. A hit therefore writes only
//!   its slot line, the region's refcount and its handle record.
//! * The writer holds readers off only around index mutations, never around backend calls: a miss
//!   inserts its region PENDING (one exclusion, together with detaching overlaps and evicting),
//!   then pins with the mutex held but readers running, so hits on other regions continue
//!   meanwhile; readers that find a PENDING region take the slow path and wait for the mutex.
//! * `invalidate` (hooks) never blocks: it checks for overlap as a reader (PENDING regions count,
//!   so an unmap during a pin is not lost; it conservatively assumes overlap if a writer is
//!   active), announces the range in the gate and pushes it into a fixed ring. Every register
//!   sees the announcement and drains the ring (as writer) before looking up, so after `invalidate` returns no lookup can hit an
//!   overlapping region.
//! * No room within the bounds (the rest in use, or zero bounds): the registration is handed out
//!   uncached (detached from the start) and unpinned at its release.
//! * Regions leave the index by being *detached* (`DETACHED` bit). Whoever brings the count of a
//!   detached region to zero unpins and frees it; readers can no longer find it, and any reader
//!   that found it earlier finished before the writer detached it.

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use crossbeam_queue::ArrayQueue;

use super::counters::{Locked, PinCount};
use super::gate::Gate;
use super::handles::Handles;
use super::index::Index;
use super::inval_queue::InvalQueue;
use super::membarrier;
use super::readers::{ReaderSlot, SLOTS};
use super::region::Region;
use super::slab::Slab;
use super::writer_state::WriterState;
use super::{Limits, RangeWatcher};
use crate::pin::fork_mode::ForkMode;
use crate::pin::Pinner;
use crossbeam_utils::CachePadded;

/// Counters changed only on slow paths (misses, evictions, releases of detached regions); see
/// counters.rs for why most need no locked instruction.
///
/// `repr(C)`, the ones every miss touches first (`misses`, `evictions`, both `PinCount`s, read by
/// `count_pin`, and `pinned_peak`: 56 bytes), so they end the `Cache`'s miss-written lines and
/// the rarely changed rest spills into a line an evicting miss does not touch (see `Cache`).
#[derive(Default)]
#[repr(C)]
pub(super) struct SlowCounters {
    pub(super) misses: Locked,
    pub(super) evictions: Locked,
    /// Pinned pages and regions that count against the bounds: everything that was cached
    /// (indexed now, or detached and still held).
    pub(super) cached: PinCount,
    /// Registrations handed out uncached (no room in the cache) and still held.
    pub(super) uncached: PinCount,
    /// High-water mark of all pinned bytes.
    pub(super) pinned_peak: AtomicU64,
    // The rest changes only on rare paths.
    pub(super) invalidations: Locked,
    /// Registrations ever handed out uncached.
    pub(super) uncached_total: Locked,
    pub(super) pin_retries: Locked,
    pub(super) pin_failures: Locked,
    /// Regions the helper pinned ahead of a predicted use, and idle ones it unpinned.
    pub(super) prefetched: Locked,
    pub(super) released_ahead: Locked,
}

/// The pin-down cache. `Send + Sync`; share it as `Arc<Cache>`.
///
/// Field order is the layout (`repr(C)`; `Arc` puts the 128-aligned struct at a line boundary),
/// grouped by who touches which line. An evicting miss runs cold between system calls, so each
/// line it touches is a likely cache miss; hits on other threads must not share a line that
/// every miss writes unless they read what the miss wrote. Lines from the start (`layout` test):
/// * 0 (and 1, padding): `gate`, which every reader checks and every writer raises.
/// * 2, read by every hit and constant after construction: `handles` (its table pointers; its
///   global-pool counter and locks change only when a slot refills a batch or a thread beyond
///   the slot count uses the shared list, as before), `slots`, `page`, `shift`, `forked`.
/// * 3, read-mostly: what a hit also reads (`max_request`, and `max_pinned`/`max_regions` when
///   a release leaves a region idle, the slab's chunk table, which `Slab` keeps first), and the
///   backend and watcher, which only misses read. Written only by `set_limits`.
/// * 4-7, written by every miss: the rest of the slab (its free list, taken and given back by
///   each evicting miss), the mutex with the writer's scratch lists, the index (CLOCK hand, hash
///   and sorted lengths) and the counters a miss bumps (`SlowCounters` puts them first). Hits
///   read the index and the pinned counts here, which the miss changes anyway.
/// * Then what an evicting miss does not touch: the rarely changed counters, the invalidation
///   ring (a drain looks at it only when the gate says so), `deferred` (helper only).
///
/// Before this order an evicting miss touched 8 of the struct's lines, now 7 (`scripts/miss-lines`).
#[repr(C)]
pub struct Cache {
    /// Writer bit, overflow bit and announced invalidations: the one word a hit checks. Beside
    /// them, in the same line, `gate.joined`: exclusive slots that ever entered this cache, and
    /// the highest such id (writers scan slots 0..=max only, and skip the membarrier when the
    /// only joined slot is their own).
    pub(super) gate: CachePadded<Gate>,
    // --- read by every hit, constant ---
    pub(super) handles: Handles,
    pub(super) slots: Box<[CachePadded<ReaderSlot>; SLOTS]>,
    pub(super) page: usize,
    pub(super) shift: u32,
    /// Set in a child process after `fork` (see `quarantine`): every call fails with
    /// `CacheError::Forked` before touching a lock, and drop leaves the parent's pins alone.
    pub(super) forked: AtomicBool,
    // --- read-mostly (written by `set_limits` only) ---
    /// Largest page-aligned request `register` accepts: `max_pinned`, capped so that the length
    /// in pages fits the region's u32 (one compare on the hit path covers both).
    pub(super) max_request: AtomicUsize,
    pub(super) max_pinned: AtomicUsize,
    pub(super) max_regions: AtomicUsize,
    pub(super) pinner: Arc<dyn Pinner>,
    pub(super) watcher: Option<Arc<dyn RangeWatcher>>,
    /// Region records (ids are what the index stores). Its chunk table (read by every hit) ends
    /// the read-mostly line, its free list (written by every miss) starts the next.
    pub(super) slab: Slab,
    // --- written by every miss ---
    /// Serialises writers (misses, drains, evictions); guards the limits.
    ///
    /// Lock order: `mutex`, then the reader exclusion (`Writer::exclude`), then the leaf locks
    /// (the slab's spin lock, the handle table's `grow`/`shared` mutexes, the reader-id pool),
    /// which never call out while held. The backend is called with `mutex` held (never with
    /// readers excluded). Hooks take no lock at all (`invalidate`).
    pub(super) mutex: Mutex<WriterState>,
    pub(super) index: UnsafeCell<Index>,
    pub(super) c: SlowCounters,
    // --- not touched by an evicting miss ---
    /// The ranges announced in `gate` (a ring that is full raises the gate's overflow bit).
    pub(super) queue: CachePadded<InvalQueue>,
    /// With a helper thread: detached regions whose last holder let go, for the helper to unpin
    /// (`ahead.rs`), so `deregister` never calls the backend. Unset without a helper.
    pub(super) deferred: OnceLock<ArrayQueue<usize>>,
    /// `pin::fork_mode::ForkMode` as its byte: what a `fork` in this process does to the cache
    /// (`across_fork.rs`). Keep until the cache's maker says otherwise.
    pub(super) fork_mode: AtomicU8,
    /// Threads in `unpin_deferred` (the helper's unpins, which run without the mutex): a fork's
    /// release waits for them, or a region the helper took off the queue before the flush would
    /// cross the fork still registered.
    pub(super) deferred_busy: AtomicUsize,
    /// Between a fork's release and its parent handler: the helper pins nothing ahead (read under
    /// the mutex by its misses, set before the release takes the mutex).
    pub(super) forking: AtomicBool,
}

// SAFETY: `index` is mutated only by the writer (mutex held + readers excluded, see
// `Writer::exclude`) and read by readers only inside reader sections; regions are Sync; the rest
// is atomics or locks.
unsafe impl Sync for Cache {}
// SAFETY: nothing in Cache is tied to a thread.
unsafe impl Send for Cache {}

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
            slots: Box::new(std::array::from_fn(|_| CachePadded::default())),
            gate: CachePadded::new(Gate::new()),
            queue: CachePadded::new(InvalQueue::new()),
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
            deferred: OnceLock::new(),
            fork_mode: AtomicU8::new(ForkMode::Keep as u8),
            deferred_busy: AtomicUsize::new(0),
            forking: AtomicBool::new(false),
        })
    }

    /// The backend this cache pins with: for a library buffer that lives as long as its user
    /// and must not count among the cache's registrations (`rma::bounce`).
    pub(crate) fn pinner(&self) -> &Arc<dyn Pinner> {
        &self.pinner
    }

    pub fn limits(&self) -> Limits {
        Limits {
            max_pinned: self.max_pinned.load(Ordering::Relaxed),
            max_regions: self.max_regions.load(Ordering::Relaxed),
        }
    }

    /// A region's length is kept in pages as a u32.
    #[inline]
    pub(super) fn fits(&self, start: usize, end: usize) -> bool {
        (end - start) >> self.shift <= u32::MAX as usize
    }

    #[inline]
    pub(super) fn len_of(&self, r: &Region) -> usize {
        (r.pages as usize) << self.shift
    }

    /// Invalidations are waiting in the ring, or it overflowed (one load: see gate.rs).
    #[inline]
    pub(super) fn pending(&self) -> bool {
        self.gate.pending()
    }
}

/// See `Cache::max_request`.
pub(super) fn max_request(max_pinned: usize, page: usize) -> usize {
    max_pinned.min((u32::MAX as usize).saturating_mul(page))
}

impl Drop for Cache {
    fn drop(&mut self) {
        if self.is_forked() {
            // The pins are the parent's (an `ibv_dereg_mr` here would deregister the parent's MR
            // through the shared uverbs fd): leave them. The slab frees the records.
            return;
        }
        if let Some(q) = self.deferred.get() {
            while let Some(p) = q.pop() {
                // SAFETY: queued by the last holder of a detached region: ours alone, live.
                let r = unsafe { &*(p as *const Region) };
                self.pinner.unpin(r.pinned(), r.start, self.len_of(r));
                self.unwatch(r);
            }
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

#[cfg(test)]
mod layout {
    use super::{Cache, SlowCounters};
    use std::mem::offset_of;

    /// The line groups documented on `Cache` (the struct is 128-aligned, so offset / 64 is the
    /// line). A failure means a field or a std type changed size: regroup, don't just renumber.
    #[test]
    fn miss_touches_few_lines_and_hit_lines_stay_apart() {
        assert_eq!(std::mem::align_of::<Cache>(), 128);
        let line = |off: usize| off / 64;
        let end = |off: usize, size: usize| line(off + size - 1);
        // Hit line: everything a hit reads that never changes.
        assert_eq!(line(offset_of!(Cache, handles)), 2);
        assert_eq!(line(offset_of!(Cache, forked)), 2);
        // Read-mostly line, ending with the slab's chunk table (the slab's first field).
        assert_eq!(line(offset_of!(Cache, max_request)), 3);
        assert_eq!(line(offset_of!(Cache, slab)), 3);
        assert_eq!(offset_of!(Cache, slab) % 64, 64 - 8);
        // Miss-written lines 4..=7: the slab's free list .. the counters a miss bumps.
        assert_eq!(line(offset_of!(Cache, slab) + 8), 4);
        let hot = offset_of!(SlowCounters, invalidations);
        assert_eq!(hot, offset_of!(SlowCounters, pinned_peak) + 8);
        assert_eq!(end(offset_of!(Cache, c), hot), 7);
    }
}
