//! Invalidation: the hook-safe `invalidate` (filter, then the lock-free ring), the drain that
//! detaches what the queued ranges overlap before any lookup, and quarantine after fork.

use std::sync::atomic::Ordering;

use super::core::Cache;
use super::exclusion::Writer;
use super::index::RegionPtr;

impl Cache {
    /// Process queued invalidations: detach every indexed region they overlap (PENDING ones
    /// included); idle ones are queued in `unpins`.
    #[inline]
    pub(super) fn drain(&self, w: &Writer, unpins: &mut Vec<RegionPtr>) {
        if self.pending() {
            self.drain_queued(w, unpins);
        }
    }

    #[cold]
    #[inline(never)]
    pub(super) fn drain_queued(&self, w: &Writer, unpins: &mut Vec<RegionPtr>) {
        let x = w.exclude();
        let all = self.gate.take_overflow();
        let mut victims = Vec::new();
        let mut popped = 0;
        while let Some((s, e)) = self.queue.pop() {
            popped += 1;
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
        // Only now, with what they overlap detached (and readers still excluded), do the popped
        // ranges leave the gate's count.
        self.gate.drained(popped);
    }

    #[cold]
    #[inline(never)]
    pub(super) fn drain_now(&self) -> usize {
        let w = self.lock();
        let mut unpins = Vec::new();
        self.drain(&w, &mut unpins);
        let n = unpins.len();
        self.unpin_all(&w, unpins);
        n
    }

    /// HOOK-SAFE: no allocation, no blocking, no backend call. Regions overlapping the range can
    /// never be hit again once this returns; they are unpinned at the next normal call.
    pub fn invalidate(&self, addr: usize, len: usize) {
        // Quarantined after fork: nobody drains its ring any more, and a parent thread may have
        // been half-way through a pop of it (a push there could spin for good).
        if len == 0 || self.is_forked() {
            return;
        }
        let start = addr & !(self.page - 1);
        let end = addr.saturating_add(len).saturating_add(self.page - 1) & !(self.page - 1);
        if self.may_be_cached(start, end) {
            // Announced before the push: a hit that starts after this returns misses until a
            // drain has taken the range (gate.rs).
            self.gate.announce();
            if !self.queue.push(start, end) {
                self.gate.overflowed();
            }
        }
    }

    /// Filter for `invalidate`: false only when no indexed region overlaps. A miss that is
    /// pinning has its region in the index already (PENDING), so its range counts. Conservative
    /// (true) whenever a writer is active.
    pub(super) fn may_be_cached(&self, start: usize, end: usize) -> bool {
        // Always the shared slot: a hook may fire on a thread that is itself inside the cache, and
        // exclusive slots do not nest.
        let slot = &self.slots[0];
        slot.enter(0, false);
        let res = if self.gate.writer_seen() {
            true
        } else {
            // SAFETY: reader section, no writer active (see `try_hit`).
            unsafe { &*self.index.get() }.any_overlapping(&self.slab, start, end)
        };
        slot.exit(0);
        res
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
    /// returns `CacheError::Forked` without waiting for anything.
    pub fn quarantine(&self) {
        self.forked.store(true, Ordering::SeqCst);
        self.gate.quarantine();
    }

    /// Whether this cache was inherited across `fork` (see `quarantine`).
    pub fn is_forked(&self) -> bool {
        self.forked.load(Ordering::Relaxed)
    }

    /// Entries waiting in the invalidation ring (for tests and diagnostics).
    pub fn queued_invalidations(&self) -> usize {
        self.queue.len()
    }
}

impl crate::rt::seam::MemoryListener for Cache {
    fn on_unmap(&self, addr: usize, len: usize) {
        self.invalidate(addr, len)
    }

    fn forked(&self) {
        self.quarantine();
    }

    fn before_fork(&self) {
        self.release_before_fork();
    }

    fn after_fork_in_parent(&self) {
        self.retire_after_fork();
    }
}
