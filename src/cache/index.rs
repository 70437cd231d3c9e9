//! The writer-maintained index of NON-overlapping cached regions.
//!
//! * `sorted` (start -> id, `sorted.rs`): containment lookup is a predecessor search, because with
//!   non-overlapping regions the only candidate containing `start` is the last region starting at
//!   or before it. Overlap queries walk forward from that predecessor.
//! * `front` (exact-start hash of ids): one probe for the "same buffer again" case.
//! * CLOCK (second-chance LRU) runs over the slab itself: the hand walks record ids, hits only set
//!   a bit in the region, so the hit path never touches a shared LRU structure.
//!
//! Per-region bytes (honest count): 40-byte slab record, 12-byte sorted entry in blocks that are
//! full for ascending fills (>= half full otherwise), 4-byte hash slot at 7/16..7/8 load. About
//! 40 + 12 + 5..9 = 57..61 bytes for the common case.
//!
//! Readers may call the `&self` lookups concurrently; all `&mut self` methods run only while the
//! writer holds the cache mutex AND has excluded readers.

use std::ptr::NonNull;

use super::hash_front::HashFront;
use super::region::Region;
use super::slab::Slab;
use crate::pin::Access;

pub type RegionPtr = NonNull<Region>;

pub struct Index {
    sorted: super::sorted::Sorted,
    front: HashFront,
    hand: u32,
    shift: u32,
}

impl Index {
    pub fn new(page_shift: u32) -> Self {
        Index {
            sorted: super::sorted::Sorted::new(),
            front: HashFront::new(),
            hand: 0,
            shift: page_shift,
        }
    }

    /// The region that contains `[start, end)` and whose access covers `access`, if any.
    #[inline(always)]
    pub fn lookup<'s>(
        &self,
        slab: &'s Slab,
        start: usize,
        end: usize,
        access: Access,
    ) -> Option<&'s Region> {
        let r = match self.front.get(start, |id| {
            let r = slab.get(id);
            (r.start == start).then_some(r)
        }) {
            Some(r) => r,
            None => slab.get(self.sorted.pred(start)?.1),
        };
        (end <= r.end(self.shift) && r.access().covers(access)).then_some(r)
    }

    pub fn is_empty(&self) -> bool {
        self.sorted.is_empty()
    }

    /// Every indexed region overlapping `[start, end)`, in address order.
    pub fn overlapping(&self, slab: &Slab, start: usize, end: usize) -> Vec<RegionPtr> {
        let mut out = Vec::new();
        self.overlapping_into(slab, start, end, &mut out);
        out
    }

    /// `overlapping`, appended to `out` (lets the miss path reuse one list).
    pub fn overlapping_into(
        &self,
        slab: &Slab,
        start: usize,
        end: usize,
        out: &mut Vec<RegionPtr>,
    ) {
        self.for_each_overlapping(slab, start, end, |p| out.push(p));
    }

    /// True if some indexed region overlaps `[start, end)`. Allocation-free (used from hooks).
    pub fn any_overlapping(&self, slab: &Slab, start: usize, end: usize) -> bool {
        let mut any = false;
        self.for_each_overlapping(slab, start, end, |_| any = true);
        any
    }

    fn for_each_overlapping(
        &self,
        slab: &Slab,
        start: usize,
        end: usize,
        mut f: impl FnMut(RegionPtr),
    ) {
        if start >= end {
            return;
        }
        let first = match self.sorted.pred(start) {
            Some((s, id)) if slab.get(id).end(self.shift) > start => s,
            _ => start,
        };
        self.sorted.scan_from(first, |s, id| {
            if s >= end {
                return false;
            }
            f(NonNull::from(slab.get(id)));
            true
        });
    }

    pub fn insert(&mut self, slab: &Slab, p: RegionPtr) {
        // SAFETY: the writer owns the new region and it is live.
        let r = unsafe { p.as_ref() };
        debug_assert!(
            !self.any_overlapping(slab, r.start, r.end(self.shift)),
            "index must stay non-overlapping"
        );
        self.sorted.insert(r.start, r.id);
        self.front.insert(r.start, r.id, |id| slab.get(id).start);
    }

    pub fn remove(&mut self, slab: &Slab, p: RegionPtr) {
        // SAFETY: `p` is in the index, hence live.
        let r = unsafe { p.as_ref() };
        let removed = self.sorted.remove(r.start);
        debug_assert!(removed == Some(r.id));
        self.front.remove(r.start, |id| slab.get(id).start);
    }

    /// Every indexed region (snapshot).
    pub fn all(&self, slab: &Slab) -> Vec<RegionPtr> {
        let mut out = Vec::new();
        self.sorted.scan_from(0, |_, id| {
            out.push(NonNull::from(slab.get(id)));
            true
        });
        out
    }

    /// Next eviction victim by second chance: an idle indexed region whose referenced bit is clear
    /// (bits of idle regions passed over are cleared). `None` when no indexed region is idle. The
    /// caller must have excluded readers so "idle" cannot change under it (only deregister can
    /// lower a count meanwhile, which only makes more regions idle).
    pub fn clock_victim(&mut self, slab: &Slab) -> Option<RegionPtr> {
        let n = slab.high_water();
        // Two sweeps over the records: the first may only clear bits; the second then finds a
        // clear one if any indexed region is idle.
        for _ in 0..2 * n as u64 + 1 {
            if self.hand >= n {
                self.hand = 0;
            }
            if n == 0 {
                return None;
            }
            let r = slab.get(self.hand);
            self.hand += 1;
            if !r.is_indexed() || r.holders() != 0 {
                continue;
            }
            if r.referenced
                .swap(false, std::sync::atomic::Ordering::Relaxed)
            {
                continue;
            }
            return Some(NonNull::from(r));
        }
        None
    }
}
