//! The handles the helper saw used and has not yet seen released, polled instead of reported.
//!
//! A caller's `deregister` used to push a release event (a clock read and a queue push):
//! `bench/examples/track_profile.rs` measured a tracked deregister at 346 ns against 177 ns
//! without a helper, and 199 ns once it pushed nothing. The cache already knows when a handle
//! goes: its record's generation moves on (`Cache::is_live`). So the helper keeps the handles of
//! the uses it took and asks the cache, when it wakes, which of them are gone; a release then
//! costs the caller nothing beyond the cache's own.
//!
//! A release is seen at the first look after it, so the planner hears of it up to one look late
//! (it is given the time of that look). Each handle is looked at after `first` ns, then at
//! doubling intervals up to `max`: a handle held for long (a persistent buffer) costs one look
//! per `max`, and its release is seen at most as late as it was held, and never more than `max`.
//!
//! Sans-IO: times are arguments and liveness is a closure.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// One handle waiting for its release: (next look, handle, interval to the look after it), in a
/// min-heap on the next look, so a wake-up touches only the handles that are due.
type Watched = Reverse<(u64, u64, u64)>;

#[derive(Debug)]
pub(crate) struct Releases {
    watched: BinaryHeap<Watched>,
    /// Handles looked at and still live during one `poll` (kept for its capacity).
    again: Vec<Watched>,
    first: u64,
    max: u64,
}

impl Releases {
    /// Looks at a new handle after `first` ns, then at doubling intervals up to `max` ns.
    pub(crate) fn new(first: u64, max: u64) -> Releases {
        let first = first.max(1);
        Releases {
            watched: BinaryHeap::new(),
            again: Vec::new(),
            first,
            max: max.max(first),
        }
    }

    /// A use issued `handle` at `now`.
    pub(crate) fn watch(&mut self, handle: u64, now: u64) {
        self.watched.push(Reverse((
            now.saturating_add(self.first),
            handle,
            self.first,
        )));
    }

    /// Looks at every handle due by `now`; calls `released(handle)` once for each that
    /// `live(handle)` says is gone, and forgets it.
    pub(crate) fn poll(
        &mut self,
        now: u64,
        live: impl Fn(u64) -> bool,
        mut released: impl FnMut(u64),
    ) {
        while let Some(&Reverse((at, handle, every))) = self.watched.peek() {
            if at > now {
                break;
            }
            self.watched.pop();
            if live(handle) {
                let every = every.saturating_mul(2).min(self.max);
                self.again
                    .push(Reverse((now.saturating_add(every), handle, every)));
            } else {
                released(handle);
            }
        }
        self.watched.extend(self.again.drain(..));
    }

    /// Handles watched now.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.watched.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.watched.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;
    use std::collections::HashSet;

    fn released(r: &mut Releases, now: u64, live: &HashSet<u64>) -> Vec<u64> {
        let mut out = Vec::new();
        r.poll(now, |h| live.contains(&h), |h| out.push(h));
        out.sort_unstable();
        out
    }

    #[test]
    fn a_release_is_reported_once_at_the_first_look_after_it() {
        let mut r = Releases::new(100, 1000);
        let mut live: HashSet<u64> = [1, 2, 3].into();
        for h in [1, 2, 3] {
            r.watch(h, 0);
        }
        assert_eq!(
            released(&mut r, 50, &HashSet::new()),
            Vec::<u64>::new(),
            "not due yet"
        );
        live.remove(&2);
        assert_eq!(released(&mut r, 100, &live), vec![2]);
        assert_eq!(
            released(&mut r, 10_000, &live),
            Vec::<u64>::new(),
            "reported once"
        );
        live.clear();
        assert_eq!(released(&mut r, 20_000, &live), vec![1, 3]);
        assert!(r.is_empty());
    }

    #[test]
    fn a_long_held_handle_is_looked_at_less_and_less_often_up_to_max() {
        let mut r = Releases::new(100, 800);
        r.watch(7, 0);
        let looks = RefCell::new(Vec::new());
        for now in (0..10_000).step_by(10) {
            r.poll(
                now,
                |_| {
                    looks.borrow_mut().push(now);
                    true
                },
                |_| panic!("still live"),
            );
        }
        let looks = looks.into_inner();
        let gaps: Vec<u64> = looks.windows(2).map(|w| w[1] - w[0]).collect();
        assert_eq!(looks[0], 100);
        assert_eq!(&gaps[..3], &[200, 400, 800]);
        assert!(gaps[3..].iter().all(|&g| g == 800), "{gaps:?}");
        assert_eq!(r.len(), 1);
    }

    /// Every handle watched is reported released exactly once, whatever the order of
    /// releases and looks (random schedule against a set model).
    #[test]
    fn every_release_is_reported_exactly_once() {
        let mut r = Releases::new(50, 3200);
        let mut live = HashSet::new();
        let mut reported = HashSet::new();
        let mut rng = fastrand::Rng::with_seed(0x9e37_79b9_7f4a_7c15);
        let mut next = 1u64;
        let mut now = 0u64;
        for _ in 0..20_000 {
            let x = rng.u64(..);
            now += x % 40;
            match x % 3 {
                0 => {
                    r.watch(next, now);
                    live.insert(next);
                    next += 1;
                }
                1 => {
                    if let Some(&h) = live.iter().next() {
                        live.remove(&h);
                    }
                }
                _ => {
                    for h in released(&mut r, now, &live) {
                        assert!(!live.contains(&h), "{h} reported while live");
                        assert!(reported.insert(h), "{h} reported twice");
                    }
                }
            }
        }
        live.clear();
        for h in released(&mut r, u64::MAX, &live) {
            assert!(reported.insert(h), "{h} reported twice");
        }
        assert_eq!(reported.len() as u64, next - 1, "a release was lost");
        assert!(r.is_empty());
    }
}
