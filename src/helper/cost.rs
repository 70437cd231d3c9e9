//! The cost model of Li et al., "Scalable Memory Registration for High Performance Networks Using
//! Helper Threads" (CF 2011) (section 3.2): `t = a + b x pages` for pinning and for unpinning,
//! fitted by least squares, first from a short calibration on the real backend at start
//! (`calibrate`), then refined with every pin and unpin the helper itself makes.
//!
//! The paper plans with the *maximum potential* cost (drivers have irregular fast paths), so an
//! estimate is the fitted line times `MARGIN`: a helper that starts a pin too early only keeps
//! memory pinned a little longer, one that starts too late makes the caller wait.

use super::clock::now_ns;
use crate::pin::{Access, Pinner};

/// Safety factor on the fitted line.
pub const MARGIN: f64 = 1.5;

/// One observed pin or unpin counts for at most this many times the current estimate (without
/// the margin). A preemption in the middle of one call (seen: a 5 ms "unpin" on a loaded host,
/// the model's only sample, after which the helper never unpinned again) then cannot take the
/// model over, while a backend really that slow is learned within a few samples.
pub(crate) const MAX_STEP: f64 = 4.0;

/// Running sums of a least-squares fit of ns against pages.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Fit {
    n: f64,
    sx: f64,
    sy: f64,
    sxx: f64,
    sxy: f64,
}

impl Fit {
    pub fn add(&mut self, pages: u64, ns: u64) {
        let (x, y) = (pages as f64, ns as f64);
        self.n += 1.0;
        self.sx += x;
        self.sy += y;
        self.sxx += x * x;
        self.sxy += x * y;
    }

    pub fn samples(&self) -> u64 {
        self.n as u64
    }

    /// (a, b): intercept in ns, slope in ns per page, both >= 0. A single size gives slope 0 and
    /// its mean as the intercept; `None` without samples.
    pub fn line(&self) -> Option<(f64, f64)> {
        if self.n == 0.0 {
            return None;
        }
        let (mx, my) = (self.sx / self.n, self.sy / self.n);
        let var = self.sxx / self.n - mx * mx;
        if self.n < 2.0 || var <= 1e-9 * (1.0 + mx * mx) {
            return Some((my.max(0.0), 0.0));
        }
        let b = ((self.sxy / self.n - mx * my) / var).max(0.0);
        Some(((my - b * mx).max(0.0), b))
    }
}

/// Pin and unpin cost lines.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CostModel {
    pub pin: Fit,
    pub unpin: Fit,
    /// Used while a fit has no samples (ns per op, ns per page).
    pub fallback: (f64, f64),
}

impl Default for CostModel {
    fn default() -> Self {
        // ibv_reg_mr on mlx5 (~16 us + 0.06 ns/byte = ~0.25 us per 4 KiB page),
        // rounded up: a model without calibration errs on the early side.
        CostModel {
            pin: Fit::default(),
            unpin: Fit::default(),
            fallback: (20_000.0, 1_000.0),
        }
    }
}

impl CostModel {
    /// A model with known lines (simulations and tests).
    pub fn fixed(pin: (u64, u64), unpin: (u64, u64)) -> CostModel {
        let mut m = CostModel::default();
        for pages in [1, 1001] {
            m.pin.add(pages, pin.0 + pin.1 * pages);
            m.unpin.add(pages, unpin.0 + unpin.1 * pages);
        }
        m
    }

    fn estimate(&self, fit: &Fit, pages: u64) -> u64 {
        (self.line_ns(fit, pages) * MARGIN) as u64
    }

    /// The fitted (or fallback) line at `pages`, without the margin.
    fn line_ns(&self, fit: &Fit, pages: u64) -> f64 {
        let (a, b) = fit.line().unwrap_or(self.fallback);
        a + b * pages as f64
    }

    /// `ns` capped at `MAX_STEP` times what `fit` predicts now (see `MAX_STEP`).
    fn capped(&self, fit: &Fit, pages: u64, ns: u64) -> u64 {
        let cap = MAX_STEP * self.line_ns(fit, pages).max(1.0);
        (ns as f64).min(cap) as u64
    }

    /// A pin the helper made took `ns`: refine the pin line.
    pub(crate) fn observe_pin(&mut self, pages: u64, ns: u64) {
        let ns = self.capped(&self.pin, pages, ns);
        self.pin.add(pages, ns);
    }

    /// An unpin the helper made took `ns`: refine the unpin line.
    pub(crate) fn observe_unpin(&mut self, pages: u64, ns: u64) {
        let ns = self.capped(&self.unpin, pages, ns);
        self.unpin.add(pages, ns);
    }

    /// Planned cost of pinning `pages` pages, in ns (with the margin).
    pub(crate) fn pin_ns(&self, pages: u64) -> u64 {
        self.estimate(&self.pin, pages)
    }

    /// Planned cost of unpinning `pages` pages, in ns (with the margin).
    pub(crate) fn unpin_ns(&self, pages: u64) -> u64 {
        self.estimate(&self.unpin, pages)
    }
}

/// Fit both lines on `pinner` with a short calibration: pin and unpin resident anonymous memory
/// of 1, 4, 16, 64 and 256 pages (capped by `max_bytes`), three times each. A few ms with mlock.
/// Returns the default model if the memory cannot be mapped or pinned (e.g. a backend at its
/// limit): the helper then learns from its own operations.
pub fn calibrate(pinner: &dyn Pinner, max_bytes: usize) -> CostModel {
    let mut m = CostModel::default();
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as usize;
    let max_pages = (max_bytes / page).clamp(1, 256);
    let len = max_pages * page;
    // SAFETY: a fresh private anonymous mapping, no preconditions; checked below.
    let mem = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if mem == libc::MAP_FAILED {
        return m;
    }
    // Resident first: communication buffers are, and a first-touch fault is not the pin's cost.
    // SAFETY: `mem` is a writable mapping of `len` bytes.
    unsafe { std::ptr::write_bytes(mem.cast::<u8>(), 1, len) };
    let addr = mem as usize;
    'sizes: for pages in [1usize, 4, 16, 64, 256] {
        if pages > max_pages {
            break;
        }
        let (mut pins, mut unpins) = ([0u64; 3], [0u64; 3]);
        for i in 0..3 {
            let t0 = now_ns();
            let Ok(p) = pinner.pin(addr, pages * page, Access::LOCAL_WRITE) else {
                break 'sizes;
            };
            let t1 = now_ns();
            pinner.unpin(p, addr, pages * page);
            let t2 = now_ns();
            (pins[i], unpins[i]) = (t1 - t0, t2 - t1);
        }
        // Each size's median, three times (the fit's weight): one preempted call of the three
        // does not count.
        for _ in 0..3 {
            m.pin.add(pages as u64, median3(pins));
            m.unpin.add(pages as u64, median3(unpins));
        }
    }
    // SAFETY: unmapping the mapping made above (nothing of it is pinned any more).
    unsafe { libc::munmap(mem, len) };
    m
}

fn median3(mut v: [u64; 3]) -> u64 {
    v.sort_unstable();
    v[1]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_slow_observation_does_not_take_the_model_over() {
        let mut m = CostModel::default();
        // The first unpin the helper makes is preempted: 5 ms instead of ~30 us.
        m.observe_unpin(256, 5_000_000);
        let first = m.unpin_ns(256);
        let fallback = CostModel::default().unpin_ns(256);
        assert!(
            first <= (MAX_STEP * fallback as f64) as u64,
            "{first} vs {fallback}"
        );
        // Typical unpins afterwards pull it back down.
        for _ in 0..20 {
            m.observe_unpin(256, 30_000);
        }
        assert!(m.unpin_ns(256) < first / 2, "{} {first}", m.unpin_ns(256));
        // A backend that really is that slow is learned within a few samples.
        let mut slow = CostModel::default();
        for _ in 0..12 {
            slow.observe_pin(4, 1_000_000);
        }
        let est = slow.pin_ns(4) as f64 / MARGIN;
        assert!(est > 500_000.0, "{est}");
        assert_eq!(median3([9, 1, 5]), 5);
        assert_eq!(median3([5_000_000, 30_000, 31_000]), 31_000);
    }

    #[test]
    fn fit_recovers_a_line() {
        let mut f = Fit::default();
        for pages in [1u64, 4, 16, 64, 256] {
            f.add(pages, 5_000 + 300 * pages);
        }
        let (a, b) = f.line().unwrap();
        assert!(
            (a - 5_000.0).abs() < 1.0 && (b - 300.0).abs() < 0.01,
            "{a} {b}"
        );
        let mut one = Fit::default();
        assert_eq!(one.line(), None);
        one.add(8, 1000);
        one.add(8, 3000);
        assert_eq!(
            one.line(),
            Some((2000.0, 0.0)),
            "one size: the mean, no slope"
        );
    }

    #[test]
    fn estimates_carry_the_margin() {
        let m = CostModel::fixed((10_000, 100), (2_000, 50));
        assert_eq!(m.pin_ns(100), (20_000.0 * MARGIN) as u64);
        assert_eq!(m.unpin_ns(0), (2_000.0 * MARGIN) as u64);
        // No samples: the fallback, still with the margin.
        assert_eq!(CostModel::default().pin_ns(0), (20_000.0 * MARGIN) as u64);
    }

    #[test]
    fn calibration_on_mlock_fits_both_lines() {
        let m = calibrate(&crate::pin::mlock::MlockPinner::new(), 1 << 20);
        assert_eq!((m.pin.samples(), m.unpin.samples()), (15, 15));
        // (Whether the slope comes out positive depends on the host's load: a preempted small
        // pin can outlast a large one. The estimate never shrinks with size.)
        assert!(m.pin_ns(256) >= m.pin_ns(1) && m.pin_ns(1) > 0, "{m:?}");
        assert!(
            m.unpin_ns(256) >= m.unpin_ns(1) && m.unpin_ns(1) > 0,
            "{m:?}"
        );
    }

    #[test]
    fn calibration_on_a_failing_backend_keeps_the_defaults() {
        let c = crate::pin::counting::CountingPinner::new();
        c.set_fail_all(true);
        let m = calibrate(&c, 1 << 20);
        assert_eq!(m.pin.samples(), 0);
        assert_eq!(m, CostModel::default());
    }
}
