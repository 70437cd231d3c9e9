//! `Cache::stats`: a pure read of the counters (no lock, nothing changes).

use std::sync::atomic::Ordering;

use super::core::Cache;
use super::Stats;

impl Cache {
    /// Counters. A pure read (takes no lock, changes nothing): idle regions invalidated since the
    /// last call still count as pinned until the next register/deregister/flush unpins them.
    pub fn stats(&self) -> Stats {
        let (mut hits, mut in_use) = (0u64, 0i64);
        for s in self.slots.iter() {
            hits += s.hits.load(Ordering::Relaxed);
            in_use += s.in_use.load(Ordering::Relaxed);
        }
        let c = &self.c;
        let (cached_pages, cached_regions) = c.cached.get();
        let (uncached_pages, uncached_regions) = c.uncached.get();
        Stats {
            hits,
            misses: c.misses.get(),
            evictions: c.evictions.get(),
            invalidations: c.invalidations.get(),
            pinned_bytes: (cached_pages + uncached_pages) << self.shift,
            pinned_peak: c.pinned_peak.load(Ordering::Relaxed),
            regions: cached_regions + uncached_regions,
            in_use: in_use.max(0) as u64,
            pin_retries: c.pin_retries.get(),
            pin_failures: c.pin_failures.get(),
            uncached: c.uncached_total.get(),
            prefetched: c.prefetched.get(),
            released_ahead: c.released_ahead.get(),
        }
    }
}
