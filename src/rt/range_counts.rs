//! Counted address ranges: how many live holders cover each byte. The kernel does not count
//! userfaultfd registrations or mlock(2), so whoever registers/locks overlapping ranges on behalf
//! of several holders keeps one of these (under its own mutex) to know which pages no live holder
//! needs any more: the userfaultfd watcher (`monitor/uffd/watch.rs`) and the mlock pinner
//! (`pin/mlock.rs`). A neutral module: it knows nothing of either.
//!
//! Stored as boundaries: `key -> count` means every address from `key` up to the next key is
//! covered `count` times. Between calls there are no two neighbouring keys with the same count and
//! no key whose count equals the count before it (0 before the first key), so the map holds two
//! keys per run of equally-covered addresses.

use std::collections::BTreeMap;

#[derive(Debug, Default, Clone)]
pub(crate) struct RangeCounts {
    m: BTreeMap<usize, u32>,
}

impl RangeCounts {
    pub(crate) const fn new() -> Self {
        RangeCounts { m: BTreeMap::new() }
    }

    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.m.is_empty()
    }

    /// How many times `addr` is covered.
    pub(crate) fn count_at(&self, addr: usize) -> u32 {
        self.m.range(..=addr).next_back().map_or(0, |(_, &c)| c)
    }

    /// Number of stored boundaries (tests: the map does not grow with balanced add/sub).
    #[cfg(test)]
    pub(crate) fn boundaries(&self) -> usize {
        self.m.len()
    }

    /// Some address in [start, end) is covered.
    pub(crate) fn any_in(&self, start: usize, end: usize) -> bool {
        start < end && (self.count_at(start) > 0 || self.m.range(start..end).any(|(_, &c)| c > 0))
    }

    /// The sub-ranges of [start, end) that nothing covers (adjacent ones merged), in address
    /// order.
    pub(crate) fn zero_runs(&self, start: usize, end: usize) -> Vec<(usize, usize)> {
        let mut runs: Vec<(usize, usize)> = Vec::new();
        if start >= end {
            return runs;
        }
        let mut at = start;
        let mut c = self.count_at(start);
        let bounds = self.m.range(start + 1..end).map(|(&k, &v)| (k, v));
        for (k, v) in bounds.chain(std::iter::once((end, u32::MAX))) {
            if c == 0 {
                runs.push((at, k));
            }
            (at, c) = (k, v);
        }
        runs
    }

    /// Cover [start, end) `n` times more.
    pub(crate) fn add(&mut self, start: usize, end: usize, n: u32) {
        if start >= end || n == 0 {
            return;
        }
        // Fast path (every miss of the mlock backend, usually): [start, end] has no boundary and
        // lies in an uncovered run, so it becomes one run of its own: two inserts.
        if self
            .m
            .range(..=end)
            .next_back()
            .map_or(true, |(&k, &c)| k < start && c == 0)
        {
            self.m.insert(start, n);
            self.m.insert(end, 0);
            return;
        }
        self.split(start);
        self.split(end);
        for (_, c) in self.m.range_mut(start..end) {
            *c = c.saturating_add(n);
        }
        self.coalesce(start, end);
    }

    /// Cover [start, end) `n` times less and return the sub-ranges whose count dropped to zero
    /// now (adjacent ones merged), in address order. Counts stop at zero, and parts already at
    /// zero are not returned: they were not covered (an unbalanced call).
    pub(crate) fn sub(&mut self, start: usize, end: usize, n: u32) -> Vec<(usize, usize)> {
        let mut zeroed: Vec<(usize, usize)> = Vec::new();
        self.sub_each(start, end, n, |s, e| zeroed.push((s, e)));
        zeroed
    }

    /// `sub`, handing each zeroed run to `f` (in address order, adjacent ones merged) instead of
    /// returning a list: the mlock backend's unpin (every miss) then allocates nothing in its
    /// common case.
    pub(crate) fn sub_each(
        &mut self,
        start: usize,
        end: usize,
        n: u32,
        mut f: impl FnMut(usize, usize),
    ) {
        if start >= end || n == 0 {
            return;
        }
        // Fast path, the mirror of `add`'s: [start, end) is one run of exactly `n` between
        // uncovered ones: two removes.
        let mut inside = self.m.range(start..=end);
        if let (Some((&s, &c)), Some((&e, &z)), None) =
            (inside.next(), inside.next(), inside.next())
        {
            let before = self.m.range(..start).next_back().map_or(0, |(_, &c)| c);
            if s == start && c == n && e == end && z == 0 && before == 0 {
                self.m.remove(&start);
                self.m.remove(&end);
                f(start, end);
                return;
            }
        }
        let mut zeroed: Vec<(usize, usize)> = Vec::new();
        self.split(start);
        self.split(end);
        let mut it = self.m.range_mut(start..=end).peekable();
        while let Some((&k, c)) = it.next() {
            let Some((&next, _)) = it.peek() else { break }; // `end` itself: no segment after it here
            if *c == 0 {
                continue;
            }
            *c = c.saturating_sub(n);
            if *c == 0 {
                match zeroed.last_mut() {
                    Some(last) if last.1 == k => last.1 = next,
                    _ => zeroed.push((k, next)),
                }
            }
        }
        self.coalesce(start, end);
        for (s, e) in zeroed {
            f(s, e);
        }
    }

    /// Make `at` a boundary (it keeps the count of the run it falls in).
    fn split(&mut self, at: usize) {
        if !self.m.contains_key(&at) {
            let c = self.count_at(at);
            self.m.insert(at, c);
        }
    }

    /// Drop the boundaries in [start, end] that do not change the count.
    fn coalesce(&mut self, start: usize, end: usize) {
        let mut prev = self.m.range(..start).next_back().map_or(0, |(_, &c)| c);
        let mut dead: Vec<usize> = Vec::new();
        for (&k, &c) in self.m.range(start..=end) {
            if c == prev {
                dead.push(k);
            } else {
                prev = c;
            }
        }
        for k in dead {
            self.m.remove(&k);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::RangeCounts;

    #[test]
    fn overlapping_adds_count_and_last_sub_zeroes() {
        let mut r = RangeCounts::default();
        r.add(10, 30, 1);
        r.add(20, 40, 1);
        assert_eq!(
            (
                r.count_at(9),
                r.count_at(10),
                r.count_at(25),
                r.count_at(35)
            ),
            (0, 1, 2, 1)
        );
        assert_eq!(r.count_at(40), 0);
        assert_eq!(
            r.sub(10, 30, 1),
            vec![(10, 20)],
            "[20,30) is still covered by the second"
        );
        assert_eq!(r.count_at(25), 1);
        assert_eq!(r.sub(20, 40, 1), vec![(20, 40)]);
        assert!(r.is_empty(), "{r:?}");
    }

    #[test]
    fn zero_runs_and_any_in() {
        let mut r = RangeCounts::default();
        r.add(10, 20, 1);
        r.add(30, 40, 2);
        assert_eq!(r.zero_runs(0, 50), vec![(0, 10), (20, 30), (40, 50)]);
        assert_eq!(r.zero_runs(12, 35), vec![(20, 30)]);
        assert!(r.zero_runs(31, 39).is_empty());
        assert!(r.any_in(19, 21) && r.any_in(0, 11) && !r.any_in(20, 30) && !r.any_in(40, 99));
        assert_eq!(r.sub(30, 40, 2), vec![(30, 40)]);
    }

    #[test]
    fn same_range_twice_needs_two_subs() {
        let mut r = RangeCounts::default();
        r.add(0, 100, 1);
        r.add(0, 100, 1);
        assert!(r.sub(0, 100, 1).is_empty());
        assert_eq!(r.sub(0, 100, 1), vec![(0, 100)]);
        assert!(r.is_empty());
    }

    #[test]
    fn adjacent_zeroed_runs_are_merged_and_gaps_kept_apart() {
        let mut r = RangeCounts::default();
        r.add(0, 10, 1);
        r.add(10, 20, 1);
        r.add(30, 40, 1);
        assert_eq!(r.boundaries(), 4, "{r:?}"); // 0:1 20:0 30:1 40:0 (the key 10 merged away)
        r.add(0, 40, 1);
        assert_eq!(r.count_at(25), 1);
        assert!(r.sub(0, 20, 1).is_empty());
        assert_eq!(r.sub(0, 40, 1), vec![(0, 30)]);
        assert_eq!(r.sub(30, 40, 1), vec![(30, 40)]);
        assert!(r.is_empty());
    }

    #[test]
    fn unbalanced_sub_saturates_and_reports_nothing_uncovered() {
        let mut r = RangeCounts::default();
        assert!(r.sub(0, 10, 1).is_empty());
        r.add(5, 10, 1);
        assert_eq!(r.sub(0, 20, 1), vec![(5, 10)]);
        assert!(r.is_empty());
    }

    /// The maximal runs of addresses in [s, e) whose model count satisfies `f`.
    fn runs(model: &[u32], s: usize, e: usize, f: impl Fn(u32) -> bool) -> Vec<(usize, usize)> {
        let mut out: Vec<(usize, usize)> = vec![];
        for (a, &c) in model.iter().enumerate().take(e).skip(s) {
            if f(c) {
                match out.last_mut() {
                    Some((_, end)) if *end == a => *end = a + 1,
                    _ => out.push((a, a + 1)),
                }
            }
        }
        out
    }

    /// Random balanced add/sub against a per-address model.
    /// Cost of one add+sub pair of a range of its own among 1000 others (the mlock backend does
    /// one per miss): `cargo test --release -p firehose --lib add_sub_cost -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn add_sub_cost() {
        let mut r = RangeCounts::default();
        for i in 0..1000 {
            r.add(i * 100, i * 100 + 50, 1);
        }
        let t = std::time::Instant::now();
        for i in 0..1_000_000usize {
            let s = (i % 1000) * 100 + 60;
            r.add(s, s + 20, 1);
            assert_eq!(r.sub(s, s + 20, 1).len(), 1);
        }
        println!("add+sub: {:.1} ns", t.elapsed().as_nanos() as f64 / 1e6);
    }

    #[test]
    fn matches_a_simple_model() {
        let mut r = RangeCounts::default();
        let mut model = [0u32; 64];
        let mut live: Vec<(usize, usize)> = Vec::new();
        let mut rng = fastrand::Rng::with_seed(0x2545_f491_4f6c_dd1d);
        let mut rnd = |n: u64| {
            let x = rng.u64(..);
            (x % n) as usize
        };
        for _ in 0..5000 {
            if live.is_empty() || rnd(2) == 0 {
                let s = rnd(63);
                let e = s + 1 + rnd(64 - s as u64);
                r.add(s, e, 1);
                model[s..e].iter_mut().for_each(|c| *c += 1);
                live.push((s, e));
            } else {
                let (s, e) = live.swap_remove(rnd(live.len() as u64));
                let before = model;
                model[s..e].iter_mut().for_each(|c| *c -= 1);
                assert_eq!(r.sub(s, e, 1), runs(&before, s, e, |c| c == 1));
            }
            for (a, &c) in model.iter().enumerate() {
                assert_eq!(r.count_at(a), c, "at {a}");
            }
            let (s, e) = (rnd(64), rnd(65));
            let want = runs(&model, s, e, |c| c == 0);
            assert_eq!(r.zero_runs(s, e), want, "zero runs of [{s}, {e})");
            let covered = !runs(&model, s, e, |c| c > 0).is_empty();
            assert_eq!(r.any_in(s, e), covered);
        }
        for (s, e) in live {
            r.sub(s, e, 1);
        }
        assert!(r.is_empty());
    }
}
