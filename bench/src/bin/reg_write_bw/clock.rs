//! Interval clock for the per-iteration timings. Under TCG the guest kernel runs on the HPET
//! clocksource and one clock_gettime(CLOCK_MONOTONIC) is a system call of 2-5 us, more than a
//! registration-cache hit: two reads inside every t_reg sample would bury what is measured. So, as
//! perftest does, intervals are read from the CPU's time-stamp counter and converted to time with
//! a rate calibrated against CLOCK_MONOTONIC (`Instant`) over the whole timed loop (seconds long,
//! so the calibration error is negligible). `--clock monotonic` uses `Instant` for every read.

use std::time::Instant;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Tsc,
    Monotonic,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Tsc => "tsc",
            Kind::Monotonic => "monotonic",
        }
    }

    /// The default: the TSC where there is one.
    pub fn default_for_target() -> Kind {
        if cfg!(target_arch = "x86_64") {
            Kind::Tsc
        } else {
            Kind::Monotonic
        }
    }
}

/// A raw reading: TSC ticks, or nanoseconds since the clock's origin.
pub struct Clock {
    kind: Kind,
    origin: Instant,
}

impl Clock {
    pub fn new(kind: Kind) -> Self {
        Clock {
            kind,
            origin: Instant::now(),
        }
    }

    #[inline]
    pub fn now(&self) -> u64 {
        match self.kind {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: RDTSC has no memory effects and is available on every x86-64 CPU.
            Kind::Tsc => unsafe { core::arch::x86_64::_rdtsc() },
            _ => self.origin.elapsed().as_nanos() as u64,
        }
    }
}

/// Converts readings of one run to nanoseconds: `ticks_per_ns` from the span measured both ways.
pub fn ns_per_tick(kind: Kind, ticks: u64, span_ns: u64) -> f64 {
    match kind {
        Kind::Monotonic => 1.0,
        Kind::Tsc if ticks == 0 => 0.0,
        Kind::Tsc => span_ns as f64 / ticks as f64,
    }
}

/// Mean cost of one CLOCK_MONOTONIC read and of one reading of `clock`, in microseconds.
pub fn read_costs_us(clock: &Clock) -> (f64, f64) {
    const N: u32 = 4096;
    let t = Instant::now();
    let mut last = t;
    for _ in 0..N {
        last = std::hint::black_box(Instant::now());
    }
    let mono = (last - t).as_secs_f64() * 1e6 / f64::from(N);
    let t = Instant::now();
    let c0 = clock.now();
    let mut c = c0;
    for _ in 0..N {
        c = std::hint::black_box(clock.now());
    }
    let ns = t.elapsed().as_nanos() as u64;
    let _ = c.wrapping_sub(c0);
    (mono, ns as f64 / 1e3 / f64::from(N))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calibration_carries_over_to_a_later_interval() {
        for kind in [Kind::default_for_target(), Kind::Monotonic] {
            let c = Clock::new(kind);
            let (t0, c0) = (Instant::now(), c.now());
            std::thread::sleep(std::time::Duration::from_millis(40));
            let f = ns_per_tick(kind, c.now() - c0, t0.elapsed().as_nanos() as u64);
            // A second, independent interval measured with that rate must match the OS clock.
            let (t1, c1) = (Instant::now(), c.now());
            std::thread::sleep(std::time::Duration::from_millis(20));
            let (ticks, span) = (c.now() - c1, t1.elapsed().as_nanos() as f64);
            let ns = ticks as f64 * f;
            assert!(
                (ns - span).abs() < span * 0.1,
                "{kind:?}: {ns} ns vs {span} ns"
            );
            assert!(ns >= 20e6, "{kind:?}: a 20 ms sleep measured {ns} ns");
        }
    }
}
