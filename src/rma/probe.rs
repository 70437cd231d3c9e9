//! `IdleProbe`: when a waiter has waited long enough to probe the peers it waits on (so a dead
//! peer turns into failed ops instead of a wait forever), without reading the clock on every
//! idle poll. A clock read is cheap natively (vDSO) but a system call that reads an emulated
//! HPET under TCG (microseconds): read on every idle poll, it sat on the path of every blocking
//! put and added its cost to the put's latency. The clock is now read once per `CHECK_EVERY`
//! idle polls, and not at all by a wait that ends before that (the common case: a hit).

use std::time::{Duration, Instant};

/// Idle polls between two clock reads. An idle poll costs at least a CQ poll and a
/// `sched_yield` (hundreds of ns natively), so the probe interval (1 s by default) is still
/// kept to well under a millisecond.
pub const CHECK_EVERY: u32 = 64;

pub struct IdleProbe {
    every: Duration,
    idle: u32,
    /// When the interval started: the first clock read (`None` until then).
    since: Option<Instant>,
}

impl IdleProbe {
    pub fn new(every: Duration) -> Self {
        IdleProbe {
            every,
            idle: 0,
            since: None,
        }
    }

    /// Called on every idle poll; `now` reads the clock (called at most once per
    /// `CHECK_EVERY` calls). True when the peers should be probed now (then a new interval
    /// starts).
    pub fn idle_tick(&mut self, now: impl FnOnce() -> Instant) -> bool {
        self.idle += 1;
        if self.idle < CHECK_EVERY {
            return false;
        }
        self.idle = 0;
        let t = now();
        match self.since {
            None => {
                // The wait has been idle for CHECK_EVERY polls: the interval starts here.
                self.since = Some(t);
                false
            }
            Some(s) if t.duration_since(s) >= self.every => {
                self.since = Some(t);
                true
            }
            Some(_) => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    #[test]
    fn reads_the_clock_once_per_check_every_idle_polls() {
        let mut p = IdleProbe::new(Duration::from_millis(10));
        let reads = Cell::new(0);
        let t0 = Instant::now();
        let clock = |at: Duration| {
            reads.set(reads.get() + 1);
            t0 + at
        };
        for _ in 0..CHECK_EVERY - 1 {
            assert!(!p.idle_tick(|| clock(Duration::ZERO)));
        }
        assert_eq!(reads.get(), 0, "a short wait never reads the clock");
        // The CHECK_EVERY-th idle poll starts the interval.
        assert!(!p.idle_tick(|| clock(Duration::ZERO)));
        assert_eq!(reads.get(), 1);
        // Before the interval has passed: no probe, one read per CHECK_EVERY polls.
        for _ in 0..CHECK_EVERY {
            assert!(!p.idle_tick(|| clock(Duration::from_millis(5))));
        }
        assert_eq!(reads.get(), 2);
        // Once it has: probe, and a new interval starts there.
        let mut probed = 0;
        for _ in 0..CHECK_EVERY {
            probed += p.idle_tick(|| clock(Duration::from_millis(11))) as u32;
        }
        assert_eq!(probed, 1);
        for _ in 0..CHECK_EVERY {
            assert!(!p.idle_tick(|| clock(Duration::from_millis(12))));
        }
        let mut probed = 0;
        for _ in 0..CHECK_EVERY {
            probed += p.idle_tick(|| clock(Duration::from_millis(22))) as u32;
        }
        assert_eq!(probed, 1, "probed again one interval later");
    }
}
