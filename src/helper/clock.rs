//! The helper's one clock, in nanoseconds. Everything else in `helper/` takes times as plain
//! `u64` arguments, so the predictor, the queues and the planner run on a simulated clock in
//! tests.
//!
//! Two sources, chosen once per process by the first helper that starts (`select`,
//! `FH_HELPER_CLOCK`):
//! - `monotonic`: `clock_gettime(CLOCK_MONOTONIC)`. A vDSO read of the TSC (~25 ns) where the
//!   kernel's clocksource is `tsc`; where it is not (hpet, acpi_pm: virtual machines without a
//!   paravirtual clock, some older hosts) every read is an emulated device access or a system
//!   call, ~1 us in the Soft-RoCE VM, and a tracked registration takes two of them.
//! - `tsc` (x86_64): the time-stamp counter (~15 ns in that VM, ~10 ns here), scaled by a rate
//!   measured against `CLOCK_MONOTONIC` over a few milliseconds at selection. Every time the
//!   helper compares comes from this one source, so its drift against the wall clock does not
//!   matter; a TSC that differs between cores (the reason a kernel may not use it) only blurs
//!   the predictions, and a wrong prediction only makes a caller pin as without a helper.
//! - `auto` (default): `tsc` when a `clock_gettime` costs more than `SLOW_CLOCK_NS` here, else
//!   `monotonic`.

use std::sync::OnceLock;

use crate::rt::monotonic::monotonic_ns;

/// `auto` picks the TSC when a `clock_gettime` costs more than this (ns).
pub(crate) const SLOW_CLOCK_NS: u64 = 150;

/// `FH_HELPER_CLOCK`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ClockChoice {
    #[default]
    Auto,
    Tsc,
    Monotonic,
}

impl ClockChoice {
    pub fn parse(v: &str) -> Option<ClockChoice> {
        match v.trim().to_ascii_lowercase().as_str() {
            "auto" => Some(ClockChoice::Auto),
            "tsc" => Some(ClockChoice::Tsc),
            "monotonic" => Some(ClockChoice::Monotonic),
            _ => None,
        }
    }
}

/// TSC ticks to ns: `base_ns + (ticks - base_ticks) * mult / 2^32`.
#[derive(Debug, Clone, Copy)]
struct Tsc {
    base_ticks: u64,
    base_ns: u64,
    mult: u64,
}

impl Tsc {
    #[inline]
    fn ns(&self, ticks: u64) -> u64 {
        // Signed: a read on a core whose counter lags the base core's may come out before it.
        let d = ticks.wrapping_sub(self.base_ticks) as i64 as i128;
        let ns = self.base_ns as i128 + ((d * self.mult as i128) >> 32);
        ns.max(0) as u64
    }
}

/// What was selected, and why (for `fh_info`).
#[derive(Debug, Clone, Copy)]
pub struct Selected {
    tsc: Option<Tsc>,
    /// Measured cost of one `clock_gettime` at selection (ns).
    pub monotonic_cost_ns: u64,
    pub choice: ClockChoice,
}

impl Selected {
    pub fn source(&self) -> &'static str {
        if self.tsc.is_some() {
            "tsc"
        } else {
            "monotonic"
        }
    }
}

static SELECTED: OnceLock<Selected> = OnceLock::new();

#[cfg(target_arch = "x86_64")]
#[inline]
fn ticks() -> Option<u64> {
    // SAFETY: rdtsc exists on every x86_64 CPU and has no memory effects.
    #[allow(unused_unsafe)]
    Some(unsafe { core::arch::x86_64::_rdtsc() })
}

#[cfg(not(target_arch = "x86_64"))]
#[inline]
fn ticks() -> Option<u64> {
    None
}

/// Nanoseconds since an arbitrary fixed point, from the selected source (`monotonic` until a
/// helper selected one).
#[inline]
pub(crate) fn now_ns() -> u64 {
    if let Some(Selected { tsc: Some(t), .. }) = SELECTED.get() {
        if let Some(c) = ticks() {
            return t.ns(c);
        }
    }
    monotonic_ns()
}

/// One `clock_gettime`'s cost here (ns): the best of a few batches (preemption only adds).
fn monotonic_cost_ns() -> u64 {
    (0..5)
        .map(|_| {
            let t0 = monotonic_ns();
            for _ in 0..32 {
                std::hint::black_box(monotonic_ns());
            }
            (monotonic_ns() - t0) / 33
        })
        .min()
        .unwrap_or(0)
}

/// The TSC's rate against CLOCK_MONOTONIC over `span_ns`, or `None` if it does not advance
/// sensibly (0.05 to 20 ticks a ns).
fn calibrate_tsc(span_ns: u64) -> Option<Tsc> {
    let (c0, m0) = (ticks()?, monotonic_ns());
    let mut m1 = m0;
    while m1 < m0 + span_ns {
        std::hint::spin_loop();
        m1 = monotonic_ns();
    }
    let c1 = ticks()?;
    let (dc, dm) = (c1.checked_sub(c0)?, m1 - m0);
    if dc < dm / 20 || dc > dm.saturating_mul(20) {
        return None;
    }
    let mult = ((dm as u128) << 32) / dc as u128;
    Some(Tsc {
        base_ticks: c1,
        base_ns: m1,
        mult: u64::try_from(mult).ok()?,
    })
}

/// Choose the source for this process (the first call decides; later ones return that
/// decision). Spins up to ~5 ms when it measures the TSC.
pub(crate) fn select(choice: ClockChoice) -> Selected {
    *SELECTED.get_or_init(|| {
        let cost = monotonic_cost_ns();
        let want_tsc = match choice {
            ClockChoice::Tsc => true,
            ClockChoice::Monotonic => false,
            ClockChoice::Auto => cost > SLOW_CLOCK_NS,
        };
        Selected {
            tsc: if want_tsc {
                calibrate_tsc(5_000_000)
            } else {
                None
            },
            monotonic_cost_ns: cost,
            choice,
        }
    })
}

/// The selection, if a helper made one.
pub fn selected() -> Option<Selected> {
    SELECTED.get().copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn monotonic() {
        let a = now_ns();
        std::thread::sleep(std::time::Duration::from_millis(2));
        let b = now_ns();
        assert!(b >= a + 1_000_000, "{a} {b}");
    }

    /// The TSC scaled by its measured rate tracks CLOCK_MONOTONIC (within 2 % over 50 ms, and
    /// 1 ms at the start: the scheduler may preempt between the two reads).
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn tsc_tracks_the_monotonic_clock() {
        let t = calibrate_tsc(2_000_000).expect("a TSC that advances");
        let (a_tsc, a_mono) = (t.ns(ticks().unwrap()), monotonic_ns());
        assert!(a_tsc.abs_diff(a_mono) < 1_000_000, "{a_tsc} vs {a_mono}");
        std::thread::sleep(std::time::Duration::from_millis(50));
        let (b_tsc, b_mono) = (t.ns(ticks().unwrap()), monotonic_ns());
        let (dt, dm) = (b_tsc - a_tsc, b_mono - a_mono);
        assert!(
            dt.abs_diff(dm) < dm / 50,
            "tsc {dt} ns vs monotonic {dm} ns"
        );
    }

    /// Ticks before the base (a lagging core) give earlier times, never a wrapped huge one.
    #[test]
    fn ticks_before_the_base_do_not_wrap() {
        let t = Tsc {
            base_ticks: 1_000_000,
            base_ns: 500,
            mult: 1 << 32,
        };
        assert_eq!(t.ns(1_000_100), 600);
        assert_eq!(t.ns(999_900), 400);
        assert_eq!(t.ns(0), 0);
    }

    #[test]
    fn parse() {
        assert_eq!(ClockChoice::parse(" TSC "), Some(ClockChoice::Tsc));
        assert_eq!(ClockChoice::parse("auto"), Some(ClockChoice::Auto));
        assert_eq!(
            ClockChoice::parse("monotonic"),
            Some(ClockChoice::Monotonic)
        );
        assert_eq!(ClockChoice::parse("rdtsc"), None);
    }
}
