//! Cost model for the `FH_STATS` "time saved" estimate: a least-squares line t = a + b * bytes
//! over every real registration (and deregistration) the caches made.
//!
//! The plain "hits x mean miss cost" overstates savings badly when a few huge registrations
//! dominate the mean (UCX registers its multi-MiB pools once) while the hits are on small
//! buffers: measured under mpirun, 80 ms mean miss against 256 KiB hits. Pricing each hit by its
//! own size with the fitted line avoids that.

use std::sync::Mutex;

/// Running sums for a least-squares fit of y (ns) against x (bytes).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Fit {
    n: f64,
    sx: f64,
    sy: f64,
    sxx: f64,
    sxy: f64,
}

impl Fit {
    pub const fn new() -> Fit {
        Fit {
            n: 0.0,
            sx: 0.0,
            sy: 0.0,
            sxx: 0.0,
            sxy: 0.0,
        }
    }

    pub fn add(&mut self, bytes: f64, ns: f64) {
        self.n += 1.0;
        self.sx += bytes;
        self.sy += ns;
        self.sxx += bytes * bytes;
        self.sxy += bytes * ns;
    }

    /// (a, b) of t = a + b * bytes, both clamped at 0; with one sample or a single size the
    /// slope is 0 and `a` is the mean. `None` without samples.
    pub fn line(&self) -> Option<(f64, f64)> {
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
    pub fn total(&self, count: u64, bytes: u64) -> f64 {
        self.line()
            .map(|(a, b)| a * count as f64 + b * bytes as f64)
            .unwrap_or(0.0)
    }
}

pub static REG: Mutex<Fit> = Mutex::new(Fit::new());
pub static DEREG: Mutex<Fit> = Mutex::new(Fit::new());

pub fn record(fit: &Mutex<Fit>, bytes: usize, ns: u64) {
    fit.lock()
        .unwrap_or_else(|e| e.into_inner())
        .add(bytes as f64, ns as f64);
}

/// Estimated ns saved by `hits` cache hits totalling `hit_bytes`: each avoided one real
/// registration and one real deregistration of its size.
pub fn saved_ns(hits: u64, hit_bytes: u64) -> u64 {
    let r = *REG.lock().unwrap_or_else(|e| e.into_inner());
    let d = *DEREG.lock().unwrap_or_else(|e| e.into_inner());
    (r.total(hits, hit_bytes) + d.total(hits, hit_bytes)) as u64
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
}
