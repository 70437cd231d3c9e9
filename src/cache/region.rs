//! One pinned range: what the backend returned plus a packed refcount/detached state word.
//!
//! Regions live in the slab (`slab.rs`) as 40-byte records addressed by a u32 id, so per-region
//! metadata is the record plus one index entry (no per-region heap block). Neighbouring regions may
//! share a cache line: threads hitting *adjacent* regions then contend on one line, the price of
//! the 64-byte-per-region metadata bound (checked at compile time below).

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use crate::pin::{Access, Pinned};

/// Set in `Region::state` once the region left the index (invalidated, replaced by a union, or
/// evicted). From then on nobody can acquire it; whoever brings the count to zero (last holder or,
/// if already idle, the detaching writer) unpins it. The low 31 bits are the holder count.
pub const DETACHED: u32 = 1 << 31;
pub const COUNT_MASK: u32 = DETACHED - 1;
/// `state` of a slab record that holds no region (never a reachable count).
pub const FREE: u32 = u32::MAX;

#[repr(C)]
pub struct Region {
    /// Page-aligned start of the pinned range.
    pub start: usize,
    /// The backend's result (token + keys).
    pub pinned: Pinned,
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

const _: () = assert!(std::mem::size_of::<Region>() <= 40);
const _: () = assert!(Access::ALL.0 <= u8::MAX as u32);

impl Region {
    #[inline]
    pub fn end(&self, page_shift: u32) -> usize {
        self.start + ((self.pages as usize) << page_shift)
    }

    #[inline]
    pub fn access(&self) -> Access {
        Access(self.access as u32)
    }

    #[inline]
    pub fn holders(&self) -> u32 {
        self.state.load(Ordering::Acquire) & COUNT_MASK
    }

    /// Indexed (not detached, not a free record).
    #[inline]
    pub fn is_indexed(&self) -> bool {
        self.state.load(Ordering::Relaxed) & DETACHED == 0
    }

    /// Mark used for CLOCK; writes the line only if the bit was clear.
    #[inline]
    pub fn touch(&self) {
        if !self.referenced.load(Ordering::Relaxed) {
            self.referenced.store(true, Ordering::Relaxed);
        }
    }
}
