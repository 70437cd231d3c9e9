//! Cost model for the `FH_STATS` "time saved" estimate: least-squares lines t = a + b * bytes.
//!
//! What a hit avoids is a registration and a deregistration of pages that are resident (and
//! already pinned by the cached region). Every `FH_STATS_SAMPLE`-th hit (default 256; only with
//! `FH_STATS`) registers and deregisters the hit's own range once more for real, timed, after the
//! cache answered (the caller gets the cached registration as usual; the sampled MR is released at
//! once and never handed out), and the estimate prices every hit with the line fitted on those
//! samples (`RESIDENT_*`).
//!
//! Where some misses were of pages that were all resident (checked with `mincore` before the
//! registration, `FH_STATS` only), their `ibv_reg_mr` and the real deregistrations price the hits
//! instead (`RESIDENT_MISS_REG`), and the samples' figure is printed as an upper bound: a sample
//! pins pages the cached registration pins already, which in the Soft-RoCE VM cost ~8x a plain
//! registration of the same resident buffer.
//!
//! The line fitted on the misses (`REG`, `DEREG`) is kept only as an upper bound: a miss also pays
//! the first touch of pages that were never faulted in (measured under hpcc: "time saved" priced
//! by the misses claimed 16-33 s per rank on a run the cache made slower). Pricing by size still
//! matters: the plain "hits x mean miss cost" overstates even more when a few huge registrations
//! dominate the mean (UCX registers its multi-MiB pools once) while the hits are on small buffers.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// Running sums for a least-squares fit of y (ns) against x (bytes).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Fit {
    n: f64,
    sx: f64,
    sy: f64,
    sxx: f64,
    sxy: f64,
}

impl Fit {
    pub(crate) const fn new() -> Fit {
        Fit {
            n: 0.0,
            sx: 0.0,
            sy: 0.0,
            sxx: 0.0,
            sxy: 0.0,
        }
    }

    pub(crate) fn add(&mut self, bytes: f64, ns: f64) {
        self.n += 1.0;
        self.sx += bytes;
        self.sy += ns;
        self.sxx += bytes * bytes;
        self.sxy += bytes * ns;
    }

    /// (a, b) of t = a + b * bytes, both clamped at 0; with one sample or a single size the
    /// slope is 0 and `a` is the mean. `None` without samples.
    pub(crate) fn line(&self) -> Option<(f64, f64)> {
        if self.n == 0.0 {
            return None;
        }
        let mean_x = self.sx / self.n;
        let mean_y = self.sy / self.n;
        let var = self.sxx / self.n - mean_x * mean_x;
        if self.n < 2.0 || var <= f64::EPSILON * mean_x * mean_x {
            return Some((mean_y, 0.0));
        }
        let b = ((self.sxy / self.n - mean_x * mean_y) / var).max(0.0);
        let a = (mean_y - b * mean_x).max(0.0);
        Some((a, b))
    }

    /// Predicted total ns for `count` operations totalling `bytes`.
    pub(crate) fn total(&self, count: u64, bytes: u64) -> f64 {
        self.line()
            .map(|(a, b)| a * count as f64 + b * bytes as f64)
            .unwrap_or(0.0)
    }
}

pub(crate) static REG: Mutex<Fit> = Mutex::new(Fit::new());
pub(crate) static DEREG: Mutex<Fit> = Mutex::new(Fit::new());

pub(crate) fn record(fit: &Mutex<Fit>, bytes: usize, ns: u64) {
    fit.lock()
        .unwrap_or_else(|e| e.into_inner())
        .add(bytes as f64, ns as f64);
}

/// Estimated ns saved by `hits` cache hits totalling `hit_bytes`: each avoided one real
/// registration and one real deregistration of its size.
/// An upper bound: misses also paid first touch.
pub(crate) fn saved_ns(hits: u64, hit_bytes: u64) -> u64 {
    let r = *REG.lock().unwrap_or_else(|e| e.into_inner());
    let d = *DEREG.lock().unwrap_or_else(|e| e.into_inner());
    priced(&r, &d, hits, hit_bytes)
}

/// Misses whose pages were all resident when they were registered (`FH_STATS` only): their
/// `ibv_reg_mr` is what a hit avoids, without the first touch. The preferred price of a hit,
/// with the deregistrations' fit (`DEREG`): the sampled re-registrations below pin pages that
/// the cached registration already pins, and in the Soft-RoCE VM those cost ~8x a plain
/// registration of the same resident buffer (bench-preload: 372 us against 44 us).
pub(crate) static RESIDENT_MISS_REG: Mutex<Fit> = Mutex::new(Fit::new());
static RESIDENT_MISSES: AtomicU64 = AtomicU64::new(0);

/// A miss of `bytes` bytes, all resident before it was registered, whose `ibv_reg_mr` took `ns`.
pub(crate) fn record_resident_miss(bytes: usize, ns: u64) {
    record(&RESIDENT_MISS_REG, bytes, ns);
    RESIDENT_MISSES.fetch_add(1, Ordering::Relaxed);
}

/// How many misses were of resident pages.
pub(crate) fn resident_misses() -> u64 {
    RESIDENT_MISSES.load(Ordering::Relaxed)
}

/// Estimated ns saved by `hits` hits totalling `hit_bytes`, priced by the misses on resident
/// pages and the real deregistrations (the sampled deregistrations where none was timed yet);
/// 0 without such a miss.
pub(crate) fn resident_miss_saved_ns(hits: u64, hit_bytes: u64) -> u64 {
    let r = *RESIDENT_MISS_REG.lock().unwrap_or_else(|e| e.into_inner());
    let mut d = *DEREG.lock().unwrap_or_else(|e| e.into_inner());
    if d.n == 0.0 {
        d = *RESIDENT_DEREG.lock().unwrap_or_else(|e| e.into_inner());
    }
    if r.n == 0.0 {
        return 0;
    }
    priced(&r, &d, hits, hit_bytes)
}

/// The "time saved" estimate: the lower of the two resident-pages prices that exist (misses on
/// resident pages, sampled re-registrations). Each reads high for a reason of its own (a
/// process's first registrations of a buffer cost more; a sample pins pages pinned already), so
/// the lower one is the closer. 0 when neither has a sample.
pub(crate) fn lower_estimate(hits: u64, hit_bytes: u64) -> u64 {
    let by_misses = (resident_misses() > 0).then(|| resident_miss_saved_ns(hits, hit_bytes));
    let by_samples = (samples() > 0).then(|| resident_saved_ns(hits, hit_bytes));
    match (by_misses, by_samples) {
        (Some(a), Some(b)) => a.min(b),
        (Some(a), None) | (None, Some(a)) => a,
        (None, None) => 0,
    }
}

/// Fits over the sampled re-registrations of resident (already pinned) pages.
pub(crate) static RESIDENT_REG: Mutex<Fit> = Mutex::new(Fit::new());
pub(crate) static RESIDENT_DEREG: Mutex<Fit> = Mutex::new(Fit::new());

static SAMPLE_EVERY: AtomicU64 = AtomicU64::new(DEFAULT_SAMPLE_EVERY);
static HITS_SEEN: AtomicU64 = AtomicU64::new(0);
static SAMPLES: AtomicU64 = AtomicU64::new(0);
/// What the samples themselves took (they run on the application's thread).
static SAMPLE_NS: AtomicU64 = AtomicU64::new(0);

/// One hit in this many is sampled (`FH_STATS_SAMPLE`).
pub(crate) const DEFAULT_SAMPLE_EVERY: u64 = 256;

/// `FH_STATS_SAMPLE`: 0 turns sampling off.
pub(crate) fn set_sample_every(n: u64) {
    SAMPLE_EVERY.store(n, Ordering::Relaxed);
}

pub(crate) fn sample_every() -> u64 {
    SAMPLE_EVERY.load(Ordering::Relaxed)
}

/// Whether this hit is sampled: the first, then one in `sample_every()`; never without `FH_STATS`
/// (the sample costs a real registration).
pub(crate) fn should_sample() -> bool {
    pick(crate::settings::stats_fd().is_some())
}

fn pick(stats_on: bool) -> bool {
    let every = sample_every();
    if every == 0 || !stats_on {
        return false;
    }
    HITS_SEEN
        .fetch_add(1, Ordering::Relaxed)
        .is_multiple_of(every)
}

/// One sample: a real registration of `bytes` resident bytes took `reg` ns, its deregistration
/// `dereg` ns.
pub(crate) fn record_resident(bytes: usize, reg: u64, dereg: u64) {
    record(&RESIDENT_REG, bytes, reg);
    record(&RESIDENT_DEREG, bytes, dereg);
    SAMPLES.fetch_add(1, Ordering::Relaxed);
    SAMPLE_NS.fetch_add(reg.saturating_add(dereg), Ordering::Relaxed);
}

/// Total ns the samples took.
pub(crate) fn sample_ns() -> u64 {
    SAMPLE_NS.load(Ordering::Relaxed)
}

/// How many re-registrations were sampled.
pub(crate) fn samples() -> u64 {
    SAMPLES.load(Ordering::Relaxed)
}

/// Estimated ns saved by `hits` hits totalling `hit_bytes`, priced by the resident-pages samples
/// (0 without any).
pub(crate) fn resident_saved_ns(hits: u64, hit_bytes: u64) -> u64 {
    let r = *RESIDENT_REG.lock().unwrap_or_else(|e| e.into_inner());
    let d = *RESIDENT_DEREG.lock().unwrap_or_else(|e| e.into_inner());
    priced(&r, &d, hits, hit_bytes)
}

fn priced(reg: &Fit, dereg: &Fit, hits: u64, hit_bytes: u64) -> u64 {
    (reg.total(hits, hit_bytes) + dereg.total(hits, hit_bytes)) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recovers_an_exact_line() {
        let mut f = Fit::new();
        for kib in [4.0, 64.0, 1024.0, 16384.0] {
            let bytes = kib * 1024.0;
            f.add(bytes, 16_000.0 + 0.06 * bytes);
        }
        let (a, b) = f.line().unwrap();
        assert!((a - 16_000.0).abs() < 1.0, "a = {a}");
        assert!((b - 0.06).abs() < 1e-6, "b = {b}");
        // 10 hits of 4 KiB each
        let t = f.total(10, 10 * 4096);
        assert!((t - (160_000.0 + 0.06 * 40960.0)).abs() < 10.0, "t = {t}");
    }

    #[test]
    fn a_huge_outlier_does_not_price_small_hits_at_its_cost() {
        let mut f = Fit::new();
        f.add(64.0 * 1048576.0, 80_000_000.0); // one 64 MiB pool, 80 ms
        for _ in 0..5 {
            f.add(262144.0, 400_000.0); // 256 KiB, 0.4 ms
        }
        let per_hit = f.total(1, 262144);
        let mean = (80_000_000.0 + 5.0 * 400_000.0) / 6.0;
        assert!(per_hit < mean / 5.0, "size-aware {per_hit} vs mean {mean}");
    }

    #[test]
    fn degenerate_inputs() {
        assert_eq!(Fit::new().line(), None);
        assert_eq!(Fit::new().total(5, 100), 0.0);
        let mut one = Fit::new();
        one.add(4096.0, 50_000.0);
        assert_eq!(one.line(), Some((50_000.0, 0.0)));
        let mut same = Fit::new();
        same.add(4096.0, 40_000.0);
        same.add(4096.0, 60_000.0);
        assert_eq!(
            same.line(),
            Some((50_000.0, 0.0)),
            "one size: the mean, no slope"
        );
    }

    /// Misses that faulted their pages in cost far more than re-registering resident pages:
    /// the estimate from the resident samples must not take the misses' price.
    #[test]
    fn resident_samples_price_hits_below_first_touch_misses() {
        let (mut miss_reg, mut miss_dereg) = (Fit::new(), Fit::new());
        let (mut res_reg, mut res_dereg) = (Fit::new(), Fit::new());
        for kib in [4.0, 64.0, 256.0, 1024.0] {
            let b = kib * 1024.0;
            // A miss: 20 us + first touch at 0.25 ns/B plus pinning at 0.05 ns/B.
            miss_reg.add(b, 20_000.0 + 0.30 * b);
            miss_dereg.add(b, 5_000.0 + 0.01 * b);
            // A resident re-registration: pinning only.
            res_reg.add(b, 8_000.0 + 0.05 * b);
            res_dereg.add(b, 5_000.0 + 0.01 * b);
        }
        let hits = 1000;
        let bytes = hits * 65536;
        let upper = priced(&miss_reg, &miss_dereg, hits, bytes) as f64;
        let est = priced(&res_reg, &res_dereg, hits, bytes) as f64;
        let want = hits as f64 * (8_000.0 + 5_000.0) + bytes as f64 * 0.06;
        assert!((est - want).abs() / want < 1e-6, "est {est} want {want}");
        assert!(est < upper / 2.0, "est {est} upper {upper}");
        assert_eq!(
            priced(&Fit::new(), &Fit::new(), hits, bytes),
            0,
            "no samples: no claim"
        );
    }

    #[test]
    fn sampling_takes_the_first_hit_then_one_in_n_and_only_with_stats() {
        let _s = crate::serial::serial();
        let old = sample_every();
        set_sample_every(4);
        assert!(
            (0..16).all(|_| !pick(false)),
            "without FH_STATS nothing is sampled"
        );
        HITS_SEEN.store(0, Ordering::Relaxed);
        let picks: Vec<bool> = (0..9).map(|_| pick(true)).collect();
        assert_eq!(
            picks,
            [true, false, false, false, true, false, false, false, true]
        );
        set_sample_every(0);
        assert!(!pick(true));
        set_sample_every(old);
    }
}
