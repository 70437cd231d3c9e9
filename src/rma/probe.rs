//! `WaitClock`: what a blocking RMA wait (`Rma::wait`, `Rma::quiet`) must do now and then:
//! probe the peers it waits on (a dead peer turns into failed ops), and give up once its bound
//! (`FH_AM_TIMEOUT_MS`) has passed (a live peer that never answers turns into
//! `FH_ERR_TIMEOUT`, never a wait forever). The clock is read once per `CHECK_EVERY` polls, not
//! on every one: a clock read is cheap natively (vDSO) but a system call that reads an emulated
//! HPET under TCG (microseconds), and read on every poll it sat on the path of every blocking
//! put. A wait that ends before that (the common case: a hit) never reads it.
//!
//! Busy polls count too (not only idle ones): a waiter whose polls keep handling other peers'
//! traffic must still see its own peer's silence.
//!
//! `IdlePolls`: what a wait does after a poll that found nothing. It spins (`spin_loop`) and
//! yields the CPU (`sched_yield`) only every `YIELD_EVERY`-th time. Yielding after every empty
//! poll put a system call between a completion's arrival and the poll that sees it (natively
//! hundreds of ns against a 2-3 us put; under TCG microseconds); UCX's and OpenSHMEM's waits
//! spin on their progress call and pay none. A rank sharing its core with another (more ranks
//! than cores) still gets the core back within `YIELD_EVERY` polls.

use std::time::{Duration, Instant};

/// Polls between two clock reads. A poll costs at least a CQ poll (and every `YIELD_EVERY`-th
/// idle one a `sched_yield`: hundreds of ns natively), so the probe interval (1 s by default)
/// and the bound are still kept to well under a millisecond.
pub(super) const CHECK_EVERY: u32 = 64;

/// Empty polls per `sched_yield` of a waiting thread; the others spin. In the Soft-RoCE VM, 8
/// rounds of the interleaved benchmark against 1 (a yield per empty poll): 7 of its 8 ratios
/// moved the right way, by 0.4-1.5 % (`docs/benchmarks.md`).
pub(super) const YIELD_EVERY: u32 = 64;

/// A wait's empty polls: spin, yield every `YIELD_EVERY`-th (see the module's doc).
#[derive(Debug, Default)]
pub(super) struct IdlePolls {
    n: u32,
}

impl IdlePolls {
    /// After a poll that found nothing; returns whether it yielded (`yield_now`).
    #[inline]
    pub(super) fn pause(&mut self, yield_now: impl FnOnce()) -> bool {
        self.n += 1;
        if self.n < YIELD_EVERY {
            std::hint::spin_loop();
            return false;
        }
        self.n = 0;
        yield_now();
        true
    }
}

/// What a wait has to do after a poll.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Due {
    Nothing,
    /// Probe the peers waited on (one probe interval passed).
    Probe,
    /// The bound passed: give up.
    Expired,
}

pub(super) struct WaitClock {
    every: Duration,
    timeout: Option<Duration>,
    polls: u32,
    /// The first clock read (the wait's bound counts from there) and the last probe.
    since: Option<(Instant, Instant)>,
}

impl WaitClock {
    /// Probe every `every`; give up `timeout` after the first clock read (`None`: never).
    pub(super) fn new(every: Duration, timeout: Option<Duration>) -> Self {
        WaitClock {
            every,
            timeout,
            polls: 0,
            since: None,
        }
    }

    /// Called after every poll of a wait that is not done; `now` reads the clock (called at most
    /// once per `CHECK_EVERY` calls).
    pub(super) fn tick(&mut self, now: impl FnOnce() -> Instant) -> Due {
        self.polls += 1;
        if self.polls < CHECK_EVERY {
            return Due::Nothing;
        }
        self.polls = 0;
        let t = now();
        let Some((start, probed)) = &mut self.since else {
            // The wait has lasted CHECK_EVERY polls: its clock starts here.
            self.since = Some((t, t));
            return Due::Nothing;
        };
        if self.timeout.is_some_and(|d| t.duration_since(*start) >= d) {
            return Due::Expired;
        }
        if t.duration_since(*probed) >= self.every {
            *probed = t;
            return Due::Probe;
        }
        Due::Nothing
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    #[test]
    fn reads_the_clock_once_per_check_every_polls() {
        let mut p = WaitClock::new(Duration::from_millis(10), None);
        let reads = Cell::new(0);
        let t0 = Instant::now();
        let clock = |at: Duration| {
            reads.set(reads.get() + 1);
            t0 + at
        };
        for _ in 0..CHECK_EVERY - 1 {
            assert_eq!(p.tick(|| clock(Duration::ZERO)), Due::Nothing);
        }
        assert_eq!(reads.get(), 0, "a short wait never reads the clock");
        // The CHECK_EVERY-th poll starts the clock.
        assert_eq!(p.tick(|| clock(Duration::ZERO)), Due::Nothing);
        assert_eq!(reads.get(), 1);
        // Before the interval has passed: no probe, one read per CHECK_EVERY polls.
        for _ in 0..CHECK_EVERY {
            assert_eq!(p.tick(|| clock(Duration::from_millis(5))), Due::Nothing);
        }
        assert_eq!(reads.get(), 2);
        // Once it has: probe, and a new interval starts there.
        let probes = |p: &mut WaitClock, at| {
            (0..CHECK_EVERY)
                .filter(|_| p.tick(|| clock(Duration::from_millis(at))) == Due::Probe)
                .count()
        };
        assert_eq!(probes(&mut p, 11), 1);
        assert_eq!(probes(&mut p, 12), 0);
        assert_eq!(probes(&mut p, 22), 1, "probed again one interval later");
    }

    #[test]
    fn idle_polls_yield_once_every_yield_every() {
        let mut idle = IdlePolls::default();
        let yields = Cell::new(0);
        let pauses = 3 * YIELD_EVERY + 5;
        let yielded = (0..pauses)
            .filter(|_| idle.pause(|| yields.set(yields.get() + 1)))
            .count();
        assert_eq!(
            yields.get(),
            3,
            "one yield per YIELD_EVERY empty polls, no more"
        );
        assert_eq!(yielded, 3);
        // The first empty polls of a wait spin: a completion due any moment is seen at once.
        let mut fresh = IdlePolls::default();
        assert!((1..YIELD_EVERY).all(|_| !fresh.pause(|| panic!("yielded early"))));
        assert!(fresh.pause(|| ()));
    }

    #[test]
    fn expires_once_the_bound_has_passed() {
        let mut p = WaitClock::new(Duration::from_millis(10), Some(Duration::from_millis(30)));
        let t0 = Instant::now();
        let mut run = |at: u64| {
            (0..CHECK_EVERY)
                .map(|_| p.tick(|| t0 + Duration::from_millis(at)))
                .find(|&d| d != Due::Nothing)
                .unwrap_or(Due::Nothing)
        };
        assert_eq!(run(0), Due::Nothing, "the clock starts");
        assert_eq!(run(29), Due::Probe);
        assert_eq!(run(30), Due::Expired);
        assert_eq!(run(31), Due::Expired, "and stays expired");
    }
}
