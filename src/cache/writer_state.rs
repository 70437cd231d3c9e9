//! What the cache mutex guards (a leaf: `core.rs` owns the mutex, `exclusion.rs` hands out the
//! proof that it is held).

use super::index::RegionPtr;
use super::Limits;

/// What the cache mutex guards.
pub(super) struct WriterState {
    pub(super) limits: Limits,
    /// Storage for the unpin lists of misses and `trim`, kept between calls: a miss or a release
    /// that trims (every miss under tight bounds) then pays no malloc/free pair.
    pub(super) spare: Vec<RegionPtr>,
    /// Storage for a miss's list of overlapping regions.
    pub(super) overlaps: Vec<RegionPtr>,
}
