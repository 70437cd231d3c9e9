//! One pinned range: what the backend returned plus a packed refcount/detached state word.
//!
//! Regions live in their own 64-byte, 64-aligned heap block so two regions' refcounts never share a
//! cache line (threads hitting different regions do not false-share) and the metadata bound of 64
//! bytes per region holds by construction (checked at compile time below).

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use crate::pin::{Access, Pinned};

/// Set in `Region::state` once the region left the index (invalidated, replaced by a union, or
/// evicted). From then on nobody can acquire it; whoever brings the count to zero (last holder or,
/// if already idle, the detaching writer) unpins it. The low 31 bits are the holder count.
pub const DETACHED: u32 = 1 << 31;
pub const COUNT_MASK: u32 = DETACHED - 1;

#[repr(C, align(64))]
pub struct Region {
    /// Page-aligned start and end of the pinned range.
    pub start: usize,
    pub end: usize,
    /// The backend's result (token + keys).
    pub pinned: Pinned,
    pub access: Access,
    /// Holder count | DETACHED. Incremented only by readers inside a reader section (or the
    /// writer), so a writer that has excluded readers sees a stable "0 holders" and can detach.
    pub state: AtomicU32,
    /// CLOCK "recently used" bit: set by hits only when clear (so a hot hit does not keep writing
    /// a shared line), cleared by the eviction hand.
    pub referenced: AtomicBool,
    /// Position in the index's clock ring. Written only by the writer (mutex held).
    pub clock_pos: Cell<u32>,
}

const _: () = assert!(std::mem::size_of::<Region>() <= 64);

// SAFETY: `clock_pos` (the only non-Sync field) is read and written only by the writer while it
// holds the cache mutex; every other field is immutable after publication or atomic.
unsafe impl Sync for Region {}
// SAFETY: all fields are plain data or atomics; a Region owns no thread-bound resource.
unsafe impl Send for Region {}

impl Region {
    pub fn new(start: usize, end: usize, pinned: Pinned, access: Access, holders: u32) -> Region {
        Region {
            start,
            end,
            pinned,
            access,
            state: AtomicU32::new(holders),
            referenced: AtomicBool::new(true),
            clock_pos: Cell::new(u32::MAX),
        }
    }

    #[inline]
    pub fn len(&self) -> usize {
        self.end - self.start
    }

    #[inline]
    pub fn contains(&self, start: usize, end: usize) -> bool {
        self.start <= start && end <= self.end
    }

    #[inline]
    pub fn holders(&self) -> u32 {
        self.state.load(Ordering::Acquire) & COUNT_MASK
    }

    /// Mark used for CLOCK; writes the line only if the bit was clear.
    #[inline]
    pub fn touch(&self) {
        if !self.referenced.load(Ordering::Relaxed) {
            self.referenced.store(true, Ordering::Relaxed);
        }
    }
}
