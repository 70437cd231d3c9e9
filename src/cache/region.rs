//! One pinned range: what the backend returned plus a packed refcount/detached state word.
//!
//! Regions live in the slab (`slab.rs`) as 40-byte records addressed by a u32 id, so per-region
//! metadata is the record plus one index entry (no per-region heap block). Neighbouring regions may
//! share a cache line: threads hitting *adjacent* regions then contend on one line, the price of
//! the 64-byte-per-region metadata bound (checked at compile time below).

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};

use crate::pin::{Access, Pinned};

/// Set in `Region::state` once the region left the index (invalidated, replaced by a union, or
/// evicted). From then on nobody can acquire it; whoever brings the count to zero (last holder or,
/// if already idle, the detaching writer) unpins it. Uncached registrations are DETACHED from the
/// start. The low 30 bits are the holder count (`COUNT_MASK`).
pub(super) const DETACHED: u32 = 1 << 31;
/// Set in `Region::state` while the miss that created the region is still pinning it: the region
/// is already in the index (so hooks see the range and queue invalidations of it), but readers
/// treat it as a miss (they then wait for the cache mutex, which the pinning miss holds).
/// Cleared, with release ordering, once the keys are stored.
pub(super) const PENDING: u32 = 1 << 30;
pub(super) const COUNT_MASK: u32 = PENDING - 1;
/// `state` of a slab record that holds no region (never a reachable count).
pub(super) const FREE: u32 = u32::MAX;

#[repr(C)]
pub(super) struct Region {
    /// Page-aligned start of the pinned range.
    pub start: usize,
    /// The backend's result (token + keys): stored after the pin of a PENDING region, read by
    /// holders.
    pinned: PinnedCell,
    /// Length in pages (a registration of 2^32 pages or more is refused as too large).
    pub pages: u32,
    /// Holder count | DETACHED (or FREE). Incremented only by readers inside a reader section (or
    /// the writer), so a writer that has excluded readers sees a stable "0 holders" and can detach.
    pub state: AtomicU32,
    /// Slab id (stable for the record's life; lets a pointer find its way back to the free list).
    pub id: u32,
    /// Access bits (`Access` fits in a byte: four flags).
    pub access: u8,
    /// CLOCK "recently used" bit: set by hits only when clear (so a hot hit does not keep writing
    /// the line), cleared by the eviction hand.
    pub referenced: AtomicBool,
    /// Handed out without ever entering the index (the cache had no room): counted apart from the
    /// cache's bounds. Fixed for the record's life.
    pub uncached: bool,
}

/// `Pinned` in atomics: a PENDING region is reachable (by reference) while its keys are stored.
struct PinnedCell {
    token: AtomicUsize,
    lkey: AtomicU32,
    rkey: AtomicU32,
}

const _: () = assert!(std::mem::size_of::<Region>() <= 40);
const _: () = assert!(Access::ALL.0 <= u8::MAX as u32);

impl Region {
    /// A record for `Slab::alloc` to write into a FREE slot.
    pub(super) fn new(
        start: usize,
        pages: u32,
        pinned: Pinned,
        state: u32,
        id: u32,
        access: Access,
        uncached: bool,
    ) -> Region {
        Region {
            start,
            pinned: PinnedCell {
                token: AtomicUsize::new(pinned.token),
                lkey: AtomicU32::new(pinned.lkey),
                rkey: AtomicU32::new(pinned.rkey),
            },
            pages,
            state: AtomicU32::new(state),
            id,
            access: access.0 as u8,
            referenced: AtomicBool::new(true),
            uncached,
        }
    }

    /// The keys. Holders see the stored ones: they acquired the region after the release that
    /// cleared PENDING (or are the miss that stored them).
    #[inline]
    pub(super) fn pinned(&self) -> Pinned {
        Pinned {
            token: self.pinned.token.load(Ordering::Relaxed),
            lkey: self.pinned.lkey.load(Ordering::Relaxed),
            rkey: self.pinned.rkey.load(Ordering::Relaxed),
        }
    }

    /// Store the keys of a PENDING region (the miss that pinned it, before `publish`).
    pub(super) fn set_pinned(&self, p: Pinned) {
        self.pinned.token.store(p.token, Ordering::Relaxed);
        self.pinned.lkey.store(p.lkey, Ordering::Relaxed);
        self.pinned.rkey.store(p.rkey, Ordering::Relaxed);
    }

    /// Clear PENDING: from now on readers may acquire the region and read its keys.
    pub(super) fn publish(&self) {
        self.state.fetch_and(!PENDING, Ordering::Release);
    }

    #[inline]
    pub(super) fn end(&self, page_shift: u32) -> usize {
        self.start + ((self.pages as usize) << page_shift)
    }

    #[inline]
    pub(super) fn access(&self) -> Access {
        Access(self.access as u32)
    }

    #[inline]
    pub(super) fn holders(&self) -> u32 {
        self.state.load(Ordering::Acquire) & COUNT_MASK
    }

    /// Indexed (not detached, not a free record).
    #[inline]
    pub(super) fn is_indexed(&self) -> bool {
        self.state.load(Ordering::Relaxed) & DETACHED == 0
    }

    /// Mark used for CLOCK; writes the line only if the bit was clear.
    #[inline]
    pub(super) fn touch(&self) {
        if !self.referenced.load(Ordering::Relaxed) {
            self.referenced.store(true, Ordering::Relaxed);
        }
    }
}
