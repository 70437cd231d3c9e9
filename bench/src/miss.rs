//! Miss cost: register + deregister where every op really pins and unpins, through each cache
//! and directly through the backend ("raw"), interleaved round by round so the noise of a shared
//! machine hits all three alike.

use std::time::Instant;

use firehose::internals::pin::Pinner;

use crate::backend::CountingBackend;
use crate::impls::{RegCache, ACCESS};
use crate::summary::{summarize, Summary};

/// One miss row: one implementation at one size.
#[derive(Debug, Clone)]
pub struct MissRow {
    pub size: usize,
    pub imp: &'static str,
    pub iterations: u64,
    pub lat: Summary,
    /// Median over rounds of (this / raw in the same round) - 1, in %; 0 for raw itself.
    /// Pairing by round compares batches run milliseconds apart, so load that comes and goes
    /// on a shared host cancels out instead of landing on one side.
    pub overhead_pct: f64,
    /// Backend pin+unpin pairs observed per timed op (1.0 = every op was a real miss).
    pub pins_per_op: f64,
    /// The row `overhead_pct` is measured against.
    pub reference: &'static str,
}

/// A way to do one forced miss (register fresh + deregister + eventual unpin).
pub trait MissOp {
    fn name(&self) -> &'static str;
    /// Returns false on failure.
    fn op(&self, addr: usize, len: usize) -> bool;
    /// Untimed, after each batch: release what the op keeps pinned between calls. With mlock
    /// (not reference counted) a range left locked would change what the other contenders' calls
    /// on the same pages cost.
    fn settle(&self) {}
}

/// Direct pin/unpin through the backend, no cache.
pub struct Raw<'a>(pub &'a CountingBackend);

impl MissOp for Raw<'_> {
    fn name(&self) -> &'static str {
        "raw"
    }
    fn op(&self, addr: usize, len: usize) -> bool {
        match self.0.pin(addr, len, ACCESS) {
            Ok(p) => {
                self.0.unpin(p, addr, len);
                true
            }
            Err(_) => false,
        }
    }
}

/// Register + deregister through one of our caches. Its limits decide which row this is:
/// * "ours": `max_regions = 0`, so nothing stays cached: each registration is handed out
///   uncached and unpinned at its release;
/// * "ours-lru": `max_regions = 1`, ops alternating between two ranges (see `run`), so each op
///   misses, evicts (unpins) the other range and inserts its own: the steady state of a full
///   cache, index insert and eviction included. `settle` flushes what it keeps between batches.
pub struct CacheMiss<'a, C: RegCache> {
    pub cache: &'a C,
    pub name: &'static str,
}

impl<C: RegCache> MissOp for CacheMiss<'_, C> {
    fn name(&self) -> &'static str {
        self.name
    }
    fn op(&self, addr: usize, len: usize) -> bool {
        match self.cache.get(addr, len) {
            Some(h) => {
                self.cache.put(h);
                true
            }
            None => false,
        }
    }
    fn settle(&self) {
        self.cache.flush();
    }
}

/// The raw reference for the "ours-lru" row: the same backend calls in the same order (unpin the previous
/// range, then pin the next; one range stays pinned between ops). Pinning right after unpinning a
/// different range costs the kernel differently from pin+unpin of one range (measured: -8 % at
/// 1 MiB, +5 % at 4 KiB), so the evicting row is compared with this one, not with `Raw`.
pub struct RawEvicting<'a> {
    pub backend: &'a CountingBackend,
    pub held: std::cell::Cell<Option<(firehose::internals::pin::Pinned, usize, usize)>>,
}

impl MissOp for RawEvicting<'_> {
    fn name(&self) -> &'static str {
        "raw-lru"
    }
    fn op(&self, addr: usize, len: usize) -> bool {
        if let Some((p, a, l)) = self.held.take() {
            self.backend.unpin(p, a, l);
        }
        match self.backend.pin(addr, len, ACCESS) {
            Ok(p) => {
                self.held.set(Some((p, addr, len)));
                true
            }
            Err(_) => false,
        }
    }
    fn settle(&self) {
        if let Some((p, a, l)) = self.held.take() {
            self.backend.unpin(p, a, l);
        }
    }
}

impl Drop for RawEvicting<'_> {
    fn drop(&mut self) {
        self.settle();
    }
}

/// UCX's cache with each region invalidated while held, so the put unregisters it.
pub struct UcxInvalidated<'a>(pub &'a crate::ucx::Ucx);

impl MissOp for UcxInvalidated<'_> {
    fn name(&self) -> &'static str {
        "ucx"
    }
    fn op(&self, addr: usize, len: usize) -> bool {
        match self.0.get(addr, len) {
            Some(h) => {
                self.0.invalidate(h);
                self.0.put(h);
                true
            }
            None => false,
        }
    }
}

/// An implementation under test plus the counter of the backend it pins through, and the index
/// (in `run`'s list) of the contender its overhead is measured against.
pub struct Contender<'a> {
    pub op: &'a dyn MissOp,
    pub backend: &'a CountingBackend,
    pub reference: usize,
}

/// `rounds` rounds; in each, every contender runs `per_batch` ops of `len` bytes, alternating
/// between `addrs[0]` and `addrs[1]` (the same sequence for everyone, so the backend sees the same
/// pages whoever calls it). The order rotates per round. The first contender must be "raw" (the
/// default reference).
pub fn run(
    contenders: &[Contender<'_>],
    addrs: [usize; 2],
    len: usize,
    per_batch: usize,
    rounds: usize,
) -> Vec<MissRow> {
    let k = contenders.len();
    let mut samples = vec![Vec::with_capacity(rounds); k];
    let mut pins = vec![0u64; k];
    let mut failed = vec![false; k];
    // Warm-up: one untimed op each (first-time costs: page tables, tree nodes, lazy init).
    for c in contenders {
        c.op.op(addrs[0], len);
        c.op.op(addrs[1], len);
        c.op.settle();
    }
    for round in 0..rounds {
        for j in 0..k {
            let i = (j + round) % k;
            let c = &contenders[i];
            let before = c.backend.pins().min(c.backend.unpins());
            let t0 = Instant::now();
            for k in 0..per_batch {
                failed[i] |= !c.op.op(addrs[k & 1], len);
            }
            samples[i].push(t0.elapsed().as_nanos() as f64 / per_batch as f64);
            c.op.settle();
            // A miss counts once it was pinned *and* unpinned (lazy unpin may trail by one op).
            pins[i] += c.backend.pins().min(c.backend.unpins()) - before;
        }
    }
    contenders
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let lat = summarize(&samples[i]);
            let iterations = (rounds * per_batch) as u64;
            MissRow {
                size: len,
                imp: c.op.name(),
                iterations,
                lat: if failed[i] { summarize(&[]) } else { lat },
                overhead_pct: overhead_pct(&samples[i], &samples[c.reference]),
                pins_per_op: pins[i] as f64 / iterations as f64,
                reference: contenders[c.reference].op.name(),
            }
        })
        .collect()
}

/// Median of per-round ratios `a[r] / b[r]`, as an overhead in percent.
fn overhead_pct(a: &[f64], b: &[f64]) -> f64 {
    let ratios: Vec<f64> = a.iter().zip(b).map(|(x, y)| x / y).collect();
    (summarize(&ratios).p50 - 1.0) * 100.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overhead_pairs_rounds_and_ignores_a_noisy_one() {
        let raw = [100.0, 100.0, 1000.0, 100.0, 100.0];
        let ours = [110.0, 110.0, 1100.0, 110.0, 5000.0];
        assert!((overhead_pct(&ours, &raw) - 10.0).abs() < 1e-9);
        assert_eq!(overhead_pct(&raw, &raw), 0.0);
    }
}
