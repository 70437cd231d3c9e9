//! The pin-down cache (Tezuka et al., "Pin-down Cache: A Virtual Memory Management Technique for
//! Zero-copy Communication", IPPS 1998) plus invalidation.
//!
//! Owns: the index, region records, refcounts, LRU and limits, handles, the invalidation queue.
//! May call: `pin` (the `Pinner` backend), `rt` (`seam`'s `RangeWatcher`, reader ids' fork
//! hook, `inside`). Never: `monitor` (events come in through `invalidate`), `helper`,
//! `net`, `rma`.
//!
//! SEAM: the cache hooks nothing. Memory events reach it only through [`Cache::invalidate`], which
//! is safe to call from inside a memory hook (no allocation, no blocking lock, no backend call).
//! Unpinning of invalidated regions happens later, on a normal API call (or on the helper thread,
//! `ahead.rs`, when one runs).
//!
//! (Implementation lives in the sibling files; this file is the public surface.)

mod across_fork;
mod ahead;
mod core;
mod counters;
mod error;
mod exclusion;
mod gate;
mod handles;
mod hash_front;
mod hit;
mod index;
mod inval_queue;
mod invalidate;
mod limits;
mod membarrier;
mod miss;
mod pins;
mod readers;
mod region;
mod slab;
mod sorted;
mod spinlock;
mod stats;
mod writer_state;

pub use self::core::Cache;
pub use self::error::CacheError;
#[cfg(any(test, feature = "test-support"))]
pub use self::inval_queue::QUEUE_CAPACITY;

/// Bounds on what the cache keeps pinned. Regions in use are never evicted, so the bounds apply
/// to what lazy release keeps around; a request that alone exceeds `max_pinned` is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Bytes pinned at most (`FH_MAX_PINNED`).
    pub max_pinned: usize,
    /// Regions at most (`FH_MAX_REGIONS`).
    pub max_regions: usize,
}

/// One successful registration as the caller sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Registration {
    /// Opaque, generation-checked: releasing it twice or a made-up value is `CacheError::UnknownHandle`.
    pub handle: u64,
    /// Exactly what the caller asked for.
    pub addr: usize,
    pub len: usize,
    pub lkey: u32,
    pub rkey: u32,
}

/// Counters since creation. `pinned_bytes`/`regions` are "now"; `pinned_peak` is the high mark.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    pub hits: u64,
    pub misses: u64,
    pub evictions: u64,
    pub invalidations: u64,
    pub pinned_bytes: u64,
    pub pinned_peak: u64,
    pub regions: u64,
    pub in_use: u64,
    pub pin_retries: u64,
    pub pin_failures: u64,
    /// Registrations handed out uncached because the cache had no room (bounds reached with
    /// everything else in use, or zero bounds): pinned for their holder, unpinned at release.
    pub uncached: u64,
    /// Regions the helper thread pinned ahead of a predicted use (`Cache::prefetch`; neither
    /// hits nor misses).
    pub prefetched: u64,
    /// Idle regions the helper thread unpinned (`Cache::evict_range`).
    pub released_ahead: u64,
}

pub use crate::rt::seam::RangeWatcher;

#[cfg(test)]
mod tests;
