//! The time-based, context-aware predictor of Li et al., "Scalable Memory Registration for High
//! Performance Networks Using Helper Threads" (CF 2011) (sections 3.1 and 4.2): per signature (see
//! `signature.rs`) the time of its last occurrence and what was learned of the gaps between
//! occurrences; the next occurrence is predicted one period after the last.
//!
//! Learning: the paper takes the *shortest* gap observed (noise only ever makes a gap longer, and
//! an early prediction costs pinned time where a late one costs the caller a pin). That is right
//! for *scheduling* and is kept for it (`Prediction::earliest`: the shortest of the last
//! `HISTORY` gaps), but as the *prediction* it is biased on a loaded machine, where most gaps are
//! longer than the shortest by more than 5 %: the predicted period is the median of the last
//! `HISTORY` gaps. A window of recent gaps also follows phase changes by itself (the paper leaves
//! them out): a slower or faster phase takes over once it holds most of the window, while a
//! single long gap (the end of an inner loop) moves nothing.
//!
//! A second, per-signature quantity answers "when is this *region* used next" after a use under
//! a given signature: the gap to the region's next use, whatever its signature (learned the same
//! way). The paper's per-signature period cannot see the third iteration of an inner loop coming
//! after the first two (its signature last occurred at the end of the previous inner loop, and
//! that prediction expired long ago), but "after the second iteration, the buffer is used again
//! one iteration later" is learned at once. The planner takes the earliest of them all.
//!
//! Accuracy is counted the paper's way: a prediction made at one occurrence is judged at the
//! next occurrence of the same signature, accurate when within `tolerance_pct` of the gap
//! actually observed (the paper: 94.68 % within 5 % on six NAS benchmarks).

use std::collections::HashMap;

use super::signature::{CallPoint, Window, MAX_WINDOW};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PredictorConfig {
    /// Previous call points in a signature (0..=`MAX_WINDOW`; the paper uses 2).
    pub window: usize,
    /// A prediction is accurate within this percentage of the observed gap (5).
    pub tolerance_pct: u64,
    /// Signatures kept at most; past that the table starts over (bounded memory for programs
    /// that never reuse an address).
    pub max_signatures: usize,
}

impl Default for PredictorConfig {
    fn default() -> Self {
        PredictorConfig {
            window: 2,
            tolerance_pct: 5,
            max_signatures: 1 << 16,
        }
    }
}

/// Gaps remembered per signature.
pub(crate) const HISTORY: usize = 5;
/// Threads tracked at most (their windows); past that the windows start over.
const MAX_THREADS: usize = 4096;

/// The last `HISTORY` gaps.
#[derive(Debug, Clone, Copy, Default)]
struct Learned {
    gaps: [u64; HISTORY],
    n: u8,
    next: u8,
}

impl Learned {
    fn learn(&mut self, gap: u64) {
        self.gaps[self.next as usize] = gap;
        self.next = (self.next + 1) % HISTORY as u8;
        self.n = (self.n + 1).min(HISTORY as u8);
    }

    fn known(&self) -> &[u64] {
        &self.gaps[..self.n as usize]
    }

    /// The median (the lower one of an even count); 0 before any gap.
    fn median(&self) -> u64 {
        let mut v = [0u64; HISTORY];
        let k = self.known();
        v[..k.len()].copy_from_slice(k);
        let v = &mut v[..k.len()];
        v.sort_unstable();
        v.get(v.len().saturating_sub(1) / 2).copied().unwrap_or(0)
    }

    fn shortest(&self) -> u64 {
        self.known().iter().copied().min().unwrap_or(0)
    }
}

/// A predicted next use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Prediction {
    /// The earliest it may come: the shortest recent gap less the spread between it and the
    /// median (a period that jitters by +-20 % has its next gap below the shortest of the last
    /// five about one time in six: on a slow backend each such use cost its caller a whole pin,
    /// `sim_tests::a_jittery_period_is_planned_against_its_spread`; a steady period has no
    /// spread). What pins are scheduled against.
    pub earliest: u64,
    /// When it is expected (the median recent gap): what accuracy is judged on, and past which
    /// (plus the tolerance) the prediction is overdue.
    pub expected: u64,
    /// The predicted gap (median).
    pub period: u64,
}

impl Prediction {
    fn after(t: u64, l: &Learned) -> Option<Prediction> {
        let period = l.median();
        let shortest = l.shortest();
        (period != 0).then(|| Prediction {
            earliest: t.saturating_add(shortest.saturating_sub(period - shortest)),
            expected: t.saturating_add(period),
            period,
        })
    }
}

#[derive(Debug, Clone, Copy)]
struct Sig {
    last: u64,
    /// Gaps between two occurrences of this signature.
    period: Learned,
    /// From an occurrence to the next use of the same region (any signature).
    succ: Learned,
}

/// Counters since creation.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PredictorStats {
    /// Predictions made (an occurrence of a signature with a learned period).
    pub made: u64,
    /// Predictions judged (their signature occurred again).
    pub evaluated: u64,
    /// Judged predictions within the tolerance of the observed gap.
    pub accurate: u64,
    /// Periods replaced by a longer one (phase changes).
    pub phase_changes: u64,
    /// Signatures live now.
    pub signatures: u64,
}

pub(crate) struct Predictor {
    cfg: PredictorConfig,
    windows: HashMap<u32, Window>,
    sigs: HashMap<u64, Sig>,
    /// Last use of each region (by start address): its signature and time.
    last_use: HashMap<usize, (u64, u64)>,
    stats: PredictorStats,
}

impl Predictor {
    pub(crate) fn new(mut cfg: PredictorConfig) -> Predictor {
        cfg.window = cfg.window.min(MAX_WINDOW);
        cfg.max_signatures = cfg.max_signatures.max(1);
        Predictor {
            cfg,
            windows: HashMap::new(),
            sigs: HashMap::new(),
            last_use: HashMap::new(),
            stats: PredictorStats::default(),
        }
    }

    /// Thread `tid` used `point` at time `t` (ns), and went on at once. Returns the signature
    /// of this occurrence.
    #[cfg(test)]
    pub(crate) fn observe(&mut self, tid: u32, point: CallPoint, t: u64) -> u64 {
        self.observe_span(tid, point, t, t)
    }

    /// Thread `tid` asked for `point` at `arrive` and got it at `leave` (ns; later when it had to
    /// wait for a pin). Gaps run from one occurrence's `leave` to the next one's `arrive`: a
    /// caller that waited for a pin starts its computation that much later, and everything it
    /// does next comes that much later too, so a gap from `arrive` would make the predictions
    /// made at a late pin early by the wait (seen in the MG skeleton on a slow backend: the next
    /// use of a level buffer one exchange later was dropped as overdue and the buffer unpinned
    /// just before it).
    pub(crate) fn observe_span(
        &mut self,
        tid: u32,
        point: CallPoint,
        arrive: u64,
        leave: u64,
    ) -> u64 {
        let (t, leave) = (arrive, leave.max(arrive));
        if self.windows.len() >= MAX_THREADS && !self.windows.contains_key(&tid) {
            self.windows.clear();
        }
        let w = self.windows.entry(tid).or_default();
        let sig = w.signature(point, self.cfg.window);
        w.push(point);
        if self.sigs.len() >= self.cfg.max_signatures && !self.sigs.contains_key(&sig) {
            self.sigs.clear();
        }
        if self.last_use.len() >= self.cfg.max_signatures
            && !self.last_use.contains_key(&point.addr)
        {
            self.last_use.clear();
        }
        let tol = self.cfg.tolerance_pct;
        if let Some((prev, t_prev)) = self.last_use.insert(point.addr, (sig, leave)) {
            if let Some(p) = self.sigs.get_mut(&prev) {
                p.succ.learn(t.saturating_sub(t_prev).max(1));
            }
        }
        let st = &mut self.stats;
        match self.sigs.get_mut(&sig) {
            None => {
                self.sigs.insert(
                    sig,
                    Sig {
                        last: leave,
                        period: Learned::default(),
                        succ: Learned::default(),
                    },
                );
            }
            Some(s) => {
                let gap = t.saturating_sub(s.last).max(1);
                let p = s.period.median();
                if p != 0 {
                    st.evaluated += 1;
                    if p.abs_diff(gap).saturating_mul(100) <= gap.saturating_mul(tol) {
                        st.accurate += 1;
                    }
                }
                s.period.learn(gap);
                let q = s.period.median();
                // The median moved by more than the tolerance: a new phase took over.
                if p != 0 && p.abs_diff(q).saturating_mul(100) > p.saturating_mul(tol) {
                    st.phase_changes += 1;
                }
                s.last = leave;
                st.made += 1;
            }
        }
        sig
    }

    /// The predicted next occurrence of `sig`, if learned.
    pub(crate) fn next(&self, sig: u64) -> Option<Prediction> {
        let s = self.sigs.get(&sig)?;
        Prediction::after(s.last, &s.period)
    }

    /// After a use under `sig` at `t`: the predicted next use of the same region, if learned.
    pub(crate) fn next_after(&self, sig: u64, t: u64) -> Option<Prediction> {
        Prediction::after(t, &self.sigs.get(&sig)?.succ)
    }

    pub(crate) fn stats(&self) -> PredictorStats {
        PredictorStats {
            signatures: self.sigs.len() as u64,
            ..self.stats
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn at(site: usize, addr: usize) -> CallPoint {
        CallPoint { site, addr }
    }

    fn exact(at: u64, period: u64) -> Option<Prediction> {
        Some(Prediction {
            earliest: at,
            expected: at,
            period,
        })
    }

    #[test]
    fn learns_a_period_and_predicts_the_next_use() {
        let mut p = Predictor::new(PredictorConfig::default());
        let mut sig = 0;
        for i in 0..5 {
            sig = p.observe(1, at(7, 0x1000), 10 * MS * i);
        }
        // The same point after itself: one context from the third use on.
        assert_eq!(p.next(sig), exact(50 * MS, 10 * MS));
        let s = p.stats();
        // Uses 0, 1, 2 have contexts none / (7) / (7,7): the third and later share a signature.
        assert_eq!((s.made, s.evaluated, s.accurate), (2, 1, 1));
    }

    #[test]
    fn noise_predicts_the_median_and_schedules_below_the_shortest_by_the_spread() {
        let mut p = Predictor::new(PredictorConfig {
            window: 0,
            ..Default::default()
        });
        let gaps = [100, 103, 101, 97, 104, 102, 100];
        let mut t = 0;
        let mut sig = p.observe(1, at(1, 1), t);
        for g in gaps {
            t += g * MS;
            sig = p.observe(1, at(1, 1), t);
        }
        // Last five gaps: 101, 97, 104, 102, 100: median 101, shortest 97, spread 4.
        let n = p.next(sig).unwrap();
        assert_eq!(
            (n.period, n.expected - t, n.earliest - t),
            (101 * MS, 101 * MS, 93 * MS)
        );
        let s = p.stats();
        assert_eq!(s.evaluated, gaps.len() as u64 - 1);
        assert_eq!(s.accurate, s.evaluated, "all within 5 %");
        assert_eq!(s.phase_changes, 0);
    }

    #[test]
    fn phase_changes_take_over_the_window_and_a_single_long_gap_does_not() {
        let mut p = Predictor::new(PredictorConfig {
            window: 0,
            ..Default::default()
        });
        let mut t = 0;
        let mut sig = p.observe(1, at(1, 1), t);
        for _ in 0..10 {
            t += 10 * MS;
            sig = p.observe(1, at(1, 1), t);
        }
        // One long gap (an inner loop ended): the period stays.
        t += 50 * MS;
        p.observe(1, at(1, 1), t);
        t += 10 * MS;
        p.observe(1, at(1, 1), t);
        assert_eq!(p.next(sig).unwrap().period, 10 * MS);
        assert_eq!(p.stats().phase_changes, 0);
        // A slower phase: three of the five gaps and it is the median.
        for _ in 0..3 {
            t += 30 * MS;
            p.observe(1, at(1, 1), t);
        }
        assert_eq!(p.next(sig).unwrap().period, 30 * MS);
        assert_eq!(p.stats().phase_changes, 1);
        let before = p.stats();
        for _ in 0..10 {
            t += 30 * MS;
            p.observe(1, at(1, 1), t);
        }
        let after = p.stats();
        assert_eq!(after.accurate - before.accurate, 10, "accurate again");
        assert_eq!(p.next(sig), exact(t + 30 * MS, 30 * MS));
        // A faster phase: scheduled by it at once (its 5 ms less a 25 ms spread: now, so the
        // region is kept pinned), predicted once it is the median.
        t += 5 * MS;
        p.observe(1, at(1, 1), t);
        assert_eq!(p.next(sig).unwrap().earliest, t);
    }

    #[test]
    fn threads_keep_their_own_windows() {
        let mut p = Predictor::new(PredictorConfig::default());
        // Thread 1 alternates A, B; thread 2's calls in between must not change thread 1's
        // contexts (with one shared window they would, and no signature would repeat).
        let mut sigs = Vec::new();
        for i in 0..6u64 {
            sigs.push(p.observe(1, at(1, 0xA000), i * 20 * MS));
            p.observe(2, at(9, 0x9000 + i as usize * 4096), i * 20 * MS + 1);
            p.observe(1, at(2, 0xB000), i * 20 * MS + 10 * MS);
        }
        assert_eq!(sigs[2], sigs[5]);
        assert_eq!(p.next(sigs[5]), exact(120 * MS, 20 * MS));
    }

    #[test]
    fn next_use_of_the_region_after_a_signature() {
        let mut p = Predictor::new(PredictorConfig::default());
        // Figure 4: five uses of buffer A 1 ms apart, then buffer B for 20 ms; twice over.
        let mut t = 0;
        let mut after_second = 0;
        for outer in 0..3 {
            for i in 0..5 {
                let s = p.observe(1, at(1, 0xA000), t);
                if outer == 2 && i == 1 {
                    after_second = s;
                }
                t += MS;
            }
            p.observe(1, at(2, 0xB000), t);
            t += 20 * MS;
        }
        // The second iteration's signature: the buffer is used again 1 ms later. Its own
        // period is an outer iteration, which says nothing about the third iteration.
        assert_eq!(p.next_after(after_second, 5 * MS), exact(6 * MS, MS));
        assert_eq!(p.next(after_second).unwrap().period, 25 * MS);
    }

    #[test]
    fn table_is_bounded() {
        let mut p = Predictor::new(PredictorConfig {
            max_signatures: 100,
            ..Default::default()
        });
        for i in 0..1000usize {
            p.observe(1, at(1, i * 4096), i as u64);
        }
        assert!(p.stats().signatures <= 100);
    }
}
