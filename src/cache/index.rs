//! The writer-maintained index of NON-overlapping cached regions.
//!
//! * `by_start` (BTreeMap start -> region): containment lookup is a predecessor search, because with
//!   non-overlapping regions the only candidate containing `start` is the last region starting at
//!   or before it. Overlap queries walk forward from that predecessor.
//! * `front` (exact-start hash): one probe for the "same buffer again" case.
//! * `clock` (ring of regions + hand): second-chance LRU. Hits only set a bit in the region, so
//!   the hit path never touches a shared LRU structure.
//!
//! Per-region overhead beyond the 64-byte `Region` block (honest count): B-tree entry 16 bytes of
//! key+value in nodes that are on average ~70 % full plus node headers (~24-30 bytes), hash front
//! 32-64 bytes (16-byte slots at <= 50 % load), clock ring 8 bytes. So ~64 + ~100 bytes all told.
//!
//! Readers may call the `&self` lookups concurrently; all `&mut self` methods run only while the
//! writer holds the cache mutex AND has excluded readers.

use std::collections::BTreeMap;
use std::ptr::NonNull;

use super::hash_front::HashFront;
use super::region::Region;
use crate::pin::Access;

pub type RegionPtr = NonNull<Region>;

pub struct Index {
    by_start: BTreeMap<usize, RegionPtr>,
    front: HashFront,
    clock: Vec<RegionPtr>,
    hand: usize,
}

impl Index {
    pub fn new() -> Self {
        Index {
            by_start: BTreeMap::new(),
            front: HashFront::new(),
            clock: Vec::new(),
            hand: 0,
        }
    }

    /// The region that contains `[start, end)` and whose access covers `access`, if any.
    #[inline]
    pub fn lookup(&self, start: usize, end: usize, access: Access) -> Option<&Region> {
        // SAFETY: indexed regions stay allocated while they are in the index, and the caller is
        // either a reader inside its reader section or the writer, so nothing frees them meanwhile.
        let r = match self.front.get(start) {
            Some(p) => unsafe { &*p.as_ptr() },
            None => {
                let (_, p) = self.by_start.range(..=start).next_back()?;
                // SAFETY: as above.
                unsafe { &*p.as_ptr() }
            }
        };
        (r.contains(start, end) && r.access.covers(access)).then_some(r)
    }

    /// Every indexed region overlapping `[start, end)`, in address order.
    pub fn overlapping(&self, start: usize, end: usize) -> Vec<RegionPtr> {
        let mut out = Vec::new();
        self.for_each_overlapping(start, end, |p| out.push(p));
        out
    }

    /// True if some indexed region overlaps `[start, end)`. Allocation-free (used from hooks).
    pub fn any_overlapping(&self, start: usize, end: usize) -> bool {
        let mut any = false;
        self.for_each_overlapping(start, end, |_| any = true);
        any
    }

    fn for_each_overlapping(&self, start: usize, end: usize, mut f: impl FnMut(RegionPtr)) {
        if start >= end {
            return;
        }
        let first = match self.by_start.range(..=start).next_back() {
            // SAFETY: indexed regions are live (see `lookup`).
            Some((&s, p)) if unsafe { p.as_ref() }.end > start => s,
            _ => start,
        };
        for (_, &p) in self.by_start.range(first..end) {
            f(p);
        }
    }

    pub fn insert(&mut self, p: RegionPtr) {
        // SAFETY: the writer owns the new region and it is live.
        let r = unsafe { p.as_ref() };
        debug_assert!(
            !self.any_overlapping(r.start, r.end),
            "index must stay non-overlapping"
        );
        self.by_start.insert(r.start, p);
        self.front.insert(r.start, p);
        r.clock_pos.set(self.clock.len() as u32);
        self.clock.push(p);
    }

    pub fn remove(&mut self, p: RegionPtr) {
        // SAFETY: `p` is in the index, hence live.
        let r = unsafe { p.as_ref() };
        let removed = self.by_start.remove(&r.start);
        debug_assert!(removed == Some(p));
        self.front.remove(r.start);
        let pos = r.clock_pos.get() as usize;
        debug_assert!(self.clock[pos] == p);
        self.clock.swap_remove(pos);
        if let Some(moved) = self.clock.get(pos) {
            // SAFETY: indexed regions are live.
            unsafe { moved.as_ref() }.clock_pos.set(pos as u32);
        }
        r.clock_pos.set(u32::MAX);
    }

    /// Every indexed region (snapshot).
    pub fn all(&self) -> Vec<RegionPtr> {
        self.clock.clone()
    }

    /// Next eviction victim by second chance: an idle region whose referenced bit is clear (bits of
    /// idle regions passed over are cleared). `None` when no indexed region is idle. The caller
    /// must have excluded readers so "idle" cannot change under it (only deregister can lower a
    /// count meanwhile, which only makes more regions idle).
    pub fn clock_victim(&mut self) -> Option<RegionPtr> {
        let n = self.clock.len();
        // Two sweeps: the first may only clear bits; the second then finds a clear one if any
        // region is idle.
        for _ in 0..2 * n + 1 {
            if self.clock.is_empty() {
                return None;
            }
            if self.hand >= self.clock.len() {
                self.hand = 0;
            }
            let p = self.clock[self.hand];
            // SAFETY: indexed regions are live.
            let r = unsafe { p.as_ref() };
            self.hand += 1;
            if r.holders() != 0 {
                continue;
            }
            if r.referenced
                .swap(false, std::sync::atomic::Ordering::Relaxed)
            {
                continue;
            }
            return Some(p);
        }
        None
    }
}
