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

pub(super) type RegionPtr = NonNull<Region>;

pub(super) struct Index {
    sorted: super::sorted::Sorted,
    front: HashFront,
    hand: u32,
    shift: u32,
}

impl Index {
    pub(super) fn new(page_shift: u32) -> Self {
        Index {
            sorted: super::sorted::Sorted::new(),
            front: HashFront::new(),
            hand: 0,
            shift: page_shift,
        }
    }

    /// The region that contains `[start, end)` and whose access covers `access`, if any.
    #[inline(always)]
    pub(super) fn lookup<'s>(
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

    /// The miss path's lookup: like `lookup`, and when nothing contains the request, every
    /// indexed region overlapping it appended to `out` (address order), from one descent.
    pub(super) fn lookup_or_overlapping<'s>(
        &self,
        slab: &'s Slab,
        start: usize,
        end: usize,
        access: Access,
        out: &mut Vec<RegionPtr>,
    ) -> Option<&'s Region> {
        let exact = self.front.get(start, |id| {
            let r = slab.get(id);
            (r.start == start).then_some(r)
        });
        if let Some(r) = exact {
            if end <= r.end(self.shift) && r.access().covers(access) {
                return Some(r);
            }
        }
        let mut found = None;
        // Non-overlapping regions: only the first one visited (the predecessor of `start`) can
        // contain the request.
        self.sorted.scan_from_pred(start, |s, id| {
            if s >= end {
                return false;
            }
            let r = slab.get(id);
            let r_end = r.end(self.shift);
            if r_end <= start {
                return true; // the predecessor ends before the request
            }
            if s <= start && end <= r_end && r.access().covers(access) {
                found = Some(r);
                return false;
            }
            out.push(NonNull::from(r));
            true
        });
        if found.is_some() {
            out.clear();
        }
        found
    }

    pub(super) fn is_empty(&self) -> bool {
        self.sorted.is_empty()
    }

    /// Every indexed region overlapping `[start, end)`, in address order.
    pub(super) fn overlapping(&self, slab: &Slab, start: usize, end: usize) -> Vec<RegionPtr> {
        let mut out = Vec::new();
        self.for_each_overlapping(slab, start, end, |p| out.push(p));
        out
    }

    /// True if some indexed region overlaps `[start, end)`. Allocation-free (used from hooks).
    pub(super) fn any_overlapping(&self, slab: &Slab, start: usize, end: usize) -> bool {
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

    pub(super) fn insert(&mut self, slab: &Slab, p: RegionPtr) {
        // SAFETY: the writer owns the new region and it is live.
        let r = unsafe { p.as_ref() };
        debug_assert!(
            !self.any_overlapping(slab, r.start, r.end(self.shift)),
            "index must stay non-overlapping"
        );
        self.sorted.insert(r.start, r.id);
        self.front.insert(r.start, r.id, |id| slab.get(id).start);
    }

    pub(super) fn remove(&mut self, slab: &Slab, p: RegionPtr) {
        // SAFETY: `p` is in the index, hence live.
        let r = unsafe { p.as_ref() };
        let removed = self.sorted.remove(r.start);
        debug_assert!(removed == Some(r.id));
        self.front.remove(r.start, |id| slab.get(id).start);
    }

    /// Every indexed region (snapshot).
    pub(super) fn all(&self, slab: &Slab) -> Vec<RegionPtr> {
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
    pub(super) fn clock_victim(&mut self, slab: &Slab) -> Option<RegionPtr> {
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
            // Readers are excluded (`&mut self`), so no hit sets the bit meanwhile: a load and a
            // store instead of a swap, whose locked instruction is slow on the miss path.
            if r.referenced.load(std::sync::atomic::Ordering::Relaxed) {
                r.referenced
                    .store(false, std::sync::atomic::Ordering::Relaxed);
                continue;
            }
            return Some(NonNull::from(r));
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pin::Pinned;

    /// The miss path's single descent agrees with `lookup` + `overlapping` on random indexes of
    /// non-overlapping regions and random requests.
    #[test]
    fn lookup_or_overlapping_matches_lookup_then_overlapping() {
        let slab = Slab::new();
        let mut rng = fastrand::Rng::with_seed(0x2545_f491_4f6c_dd1d);
        let mut rnd = |n: u64| {
            let x = rng.u64(..);
            x % n
        };
        let none = Pinned {
            token: 0,
            lkey: 0,
            rkey: 0,
        };
        for _ in 0..200 {
            let mut idx = Index::new(12);
            // Regions of 1-3 pages with gaps of 0-2 pages, random rights.
            let mut page = rnd(4) as usize;
            for _ in 0..rnd(12) {
                let pages = 1 + rnd(3) as u32;
                let access = Access(rnd(16) as u32);
                let p = slab
                    .alloc(page << 12, pages, none, access, 0, false)
                    .unwrap();
                idx.insert(&slab, p);
                page += pages as usize + rnd(3) as usize;
            }
            for _ in 0..50 {
                let start = (rnd(page as u64 + 4) as usize) << 12;
                let end = start + ((1 + rnd(5) as usize) << 12);
                let access = Access(rnd(16) as u32);
                let want = idx.lookup(&slab, start, end, access).map(NonNull::from);
                let mut out = Vec::new();
                let got = idx
                    .lookup_or_overlapping(&slab, start, end, access, &mut out)
                    .map(NonNull::from);
                assert_eq!(got, want);
                if want.is_none() {
                    assert_eq!(out, idx.overlapping(&slab, start, end));
                } else {
                    assert!(out.is_empty());
                }
            }
        }
    }
}
