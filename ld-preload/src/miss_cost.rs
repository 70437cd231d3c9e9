//! Where a miss through the shim spends its time, for the `FH_STATS` `miss path:` line.
//!
//! A registration through the cache is timed with the cycle counter (one read at each end; on x86
//! `rdtsc`, no system call even where `clock_gettime` falls back to one), and only a miss is
//! recorded, split into: the real `ibv_reg_mr` (timed by the backend), real `ibv_dereg_mr` calls
//! made on the way (evicted victims, regions overlapping the new one, drained invalidations), the
//! wait for undispatched userfaultfd events (`quiesce`), and the rest (the cache's lock, index,
//! watch bookkeeping). The userfaultfd `UFFDIO_REGISTER` of each newly cached range is timed by
//! the library (`firehose::internals::monitor::watch_costs`); it is part of "the rest" here and printed on
//! its own.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::OnceLock;
use std::time::Instant;

use firehose::internals::monitor::WatchCosts;

/// The cycle counter (x86-64), else nanoseconds since the first call.
#[inline]
pub(crate) fn ticks() -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: rdtsc has no preconditions on x86-64.
        #[allow(unused_unsafe)]
        unsafe {
            core::arch::x86_64::_rdtsc()
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        u64::try_from(origin().0.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }
}

/// (instant, ticks) of the first use: the calibration's start.
fn origin() -> &'static (Instant, u64) {
    static O: OnceLock<(Instant, u64)> = OnceLock::new();
    O.get_or_init(|| {
        let i = Instant::now();
        #[cfg(target_arch = "x86_64")]
        let t = ticks();
        #[cfg(not(target_arch = "x86_64"))]
        let t = 0;
        (i, t)
    })
}

/// Nanoseconds per tick, measured since the first registration (1 off x86-64).
pub(crate) fn ns_per_tick() -> f64 {
    if cfg!(not(target_arch = "x86_64")) {
        return 1.0;
    }
    let (i0, t0) = *origin();
    let dt = ticks().wrapping_sub(t0);
    let dns = i0.elapsed().as_nanos() as f64;
    if dt < 1_000_000 || dns <= 0.0 {
        return 1.0 / 2.5; // too short to calibrate: assume 2.5 GHz
    }
    dns / dt as f64
}

/// Real registration and deregistration time (ns) and deregistration count on this thread since
/// `begin`: what the backend did inside the current registration.
#[derive(Clone, Copy, Default)]
struct Stages {
    pin_ns: u64,
    unpin_ns: u64,
    unpins: u64,
}

thread_local! {
    static STAGES: Cell<Stages> = const {
        Cell::new(Stages {
            pin_ns: 0,
            unpin_ns: 0,
            unpins: 0,
        })
    };
}

fn stages() -> Stages {
    STAGES.try_with(|c| c.get()).unwrap_or_default()
}

fn update(f: impl FnOnce(&mut Stages)) {
    let _ = STAGES.try_with(|c| {
        let mut s = c.get();
        f(&mut s);
        c.set(s);
    });
}

/// Process-wide sums over the recorded misses.
pub(crate) struct MissCosts {
    pub misses: AtomicU64,
    /// Ticks from entering the cache to its answer.
    pub total_ticks: AtomicU64,
    pub quiesce_ticks: AtomicU64,
    pub reg_ns: AtomicU64,
    pub dereg_ns: AtomicU64,
    pub deregs: AtomicU64,
}

pub(crate) static MISS: MissCosts = MissCosts {
    misses: AtomicU64::new(0),
    total_ticks: AtomicU64::new(0),
    quiesce_ticks: AtomicU64::new(0),
    reg_ns: AtomicU64::new(0),
    dereg_ns: AtomicU64::new(0),
    deregs: AtomicU64::new(0),
};

/// Start of a registration through a cache: forget what the backend did before.
#[inline]
pub(crate) fn begin() -> u64 {
    // The calibration starts with the first registration (one load after that).
    let _ = origin();
    let _ = STAGES.try_with(|c| c.set(Stages::default()));
    ticks()
}

/// The backend pinned (a real registration) for `ns`.
pub(crate) fn pinned(ns: u64) {
    update(|s| s.pin_ns = s.pin_ns.saturating_add(ns));
}

/// The backend unpinned (a real deregistration) for `ns`.
pub(crate) fn unpinned(ns: u64) {
    update(|s| {
        s.unpin_ns = s.unpin_ns.saturating_add(ns);
        s.unpins += 1;
    });
}

/// End of a registration that missed: `t0` from `begin`, `t1` after the event sync, `t2` now.
pub(crate) fn record_miss(t0: u64, t1: u64, t2: u64) {
    let m = &MISS;
    m.misses.fetch_add(1, Relaxed);
    m.total_ticks.fetch_add(t2.wrapping_sub(t0), Relaxed);
    m.quiesce_ticks.fetch_add(t1.wrapping_sub(t0), Relaxed);
    let s = stages();
    m.reg_ns.fetch_add(s.pin_ns, Relaxed);
    m.dereg_ns.fetch_add(s.unpin_ns, Relaxed);
    m.deregs.fetch_add(s.unpins, Relaxed);
}

/// Forget the recorded misses (the native benchmark, between modes).
#[cfg(test)]
pub(crate) fn reset() {
    let m = &MISS;
    for c in [
        &m.misses,
        &m.total_ticks,
        &m.quiesce_ticks,
        &m.reg_ns,
        &m.dereg_ns,
        &m.deregs,
    ] {
        c.store(0, Relaxed);
    }
}

/// Means per miss in microseconds, for the summary.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Breakdown {
    pub misses: u64,
    pub total_us: f64,
    pub reg_us: f64,
    pub dereg_us: f64,
    pub deregs_per_miss: f64,
    pub watch_us: f64,
    pub quiesce_us: f64,
    /// Userfaultfd unregistrations (at every unpin, on a miss's path or not: evicted victims,
    /// invalidations), their total divided by the misses.
    pub unwatch_per_miss_us: f64,
    /// Locks, index, bookkeeping: the total less every part above (never below 0).
    pub rest_us: f64,
    /// Mean of one userfaultfd unregistration.
    pub unwatch_us: f64,
}

/// Raw sums -> means per miss. `watch_ns` is all userfaultfd registration time (it happens on
/// misses only), `unwatch_ns`/`unwatches` the unregistrations at unpin.
#[allow(clippy::too_many_arguments)]
pub(crate) fn breakdown(
    misses: u64,
    total_ns: f64,
    quiesce_ns: f64,
    reg_ns: u64,
    dereg_ns: u64,
    deregs: u64,
    watch_ns: u64,
    unwatch: (u64, u64),
) -> Breakdown {
    if misses == 0 {
        return Breakdown::default();
    }
    let per = |ns: f64| ns / misses as f64 / 1000.0;
    let total_us = per(total_ns);
    let reg_us = per(reg_ns as f64);
    let dereg_us = per(dereg_ns as f64);
    let watch_us = per(watch_ns as f64);
    let quiesce_us = per(quiesce_ns);
    let unwatch_per_miss_us = per(unwatch.1 as f64);
    Breakdown {
        misses,
        total_us,
        reg_us,
        dereg_us,
        deregs_per_miss: deregs as f64 / misses as f64,
        watch_us,
        quiesce_us,
        unwatch_per_miss_us,
        rest_us: (total_us - reg_us - dereg_us - watch_us - quiesce_us - unwatch_per_miss_us)
            .max(0.0),
        unwatch_us: if unwatch.0 == 0 {
            0.0
        } else {
            unwatch.1 as f64 / unwatch.0 as f64 / 1000.0
        },
    }
}

/// The current breakdown.
pub(crate) fn current() -> Breakdown {
    since(WatchCosts::default())
}

/// The breakdown with the userfaultfd watch costs counted from `base` (the library's counters are
/// process-wide and never reset: a measurement takes them before it starts).
pub(crate) fn since(base: WatchCosts) -> Breakdown {
    let m = &MISS;
    let k = ns_per_tick();
    let w = firehose::internals::monitor::watch_costs();
    breakdown(
        m.misses.load(Relaxed),
        m.total_ticks.load(Relaxed) as f64 * k,
        m.quiesce_ticks.load(Relaxed) as f64 * k,
        m.reg_ns.load(Relaxed),
        m.dereg_ns.load(Relaxed),
        m.deregs.load(Relaxed),
        w.watch_ns - base.watch_ns,
        (w.unwatches - base.unwatches, w.unwatch_ns - base.unwatch_ns),
    )
}

/// The `FH_STATS` lines (`None` before the first miss).
pub(crate) fn lines(b: &Breakdown) -> Option<String> {
    if b.misses == 0 {
        return None;
    }
    Some(format!(
        "  miss path:     {total:.1} us mean over {n} misses = ibv_reg_mr {reg:.1} + deregs on the way {dereg:.1} \
         ({dpm:.2} per miss) + userfaultfd register {watch:.1} + unregister {uwm:.1} + event sync {q:.1} + \
         locks/bookkeeping {rest:.1}\n\
         \x20                (unregister: every unpin's, {uw:.1} us mean, over the misses; the rest: what no \
         part timed)\n",
        total = b.total_us,
        n = b.misses,
        reg = b.reg_us,
        dereg = b.dereg_us,
        dpm = b.deregs_per_miss,
        watch = b.watch_us,
        q = b.quiesce_us,
        rest = b.rest_us,
        uw = b.unwatch_us,
        uwm = b.unwatch_per_miss_us,
    ))
}

/// Count the process's mappings (lines of `/proc/self/maps`): userfaultfd registration and
/// pinning split mappings, so a miss-heavy run shows here. At exit only.
pub(crate) fn mappings() -> Option<usize> {
    let s = std::fs::read("/proc/self/maps").ok()?;
    Some(s.iter().filter(|&&b| b == b'\n').count())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn breakdown_splits_a_miss_and_never_goes_negative() {
        // 10 misses: 100 us each in total, 60 reg, 10 dereg (2 deregs each), 5 watch, 1 sync.
        let b = breakdown(
            10,
            1_000_000.0,
            10_000.0,
            600_000,
            100_000,
            20,
            50_000,
            (4, 8_000),
        );
        assert!((b.total_us - 100.0).abs() < 1e-9);
        assert!((b.reg_us - 60.0).abs() < 1e-9);
        assert!((b.dereg_us - 10.0).abs() < 1e-9);
        assert!((b.deregs_per_miss - 2.0).abs() < 1e-9);
        assert!((b.watch_us - 5.0).abs() < 1e-9);
        assert!((b.quiesce_us - 1.0).abs() < 1e-9);
        assert!((b.unwatch_per_miss_us - 0.8).abs() < 1e-9);
        assert!((b.rest_us - 23.2).abs() < 1e-9);
        assert!((b.unwatch_us - 2.0).abs() < 1e-9);
        let t = lines(&b).unwrap();
        assert!(t.contains("100.0 us mean over 10 misses"), "{t}");
        // Clocks disagree a little: the rest is clamped, not negative.
        let c = breakdown(1, 1000.0, 0.0, 2000, 0, 0, 0, (0, 0));
        assert_eq!(c.rest_us, 0.0);
        assert_eq!(lines(&Breakdown::default()), None);
    }

    #[test]
    fn thread_stages_reset_per_registration() {
        let t0 = begin();
        pinned(500);
        unpinned(200);
        unpinned(300);
        assert_eq!(stages().pin_ns, 500);
        assert_eq!((stages().unpins, stages().unpin_ns), (2, 500));
        let _ = begin();
        assert_eq!(
            (stages().pin_ns, stages().unpin_ns, stages().unpins),
            (0, 0, 0)
        );
        assert!(ticks() >= t0 || cfg!(not(target_arch = "x86_64")));
        assert!(ns_per_tick() > 0.0);
    }
}
