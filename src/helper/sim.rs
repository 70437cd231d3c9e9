//! The planner on a modelled clock and cache (the patterns of Li et al., "Scalable Memory
//! Registration for High Performance Networks Using Helper Threads" (CF 2011)), for tests and for
//! the benchmark's modelled rows: a program is a list of communication steps (call site, buffer,
//! transfer time, computation after it); the model cache pins on a caller's miss (the caller waits
//! the true pin cost) and keeps the region until the helper unpins it (lazy), or unpins at release
//! (no cache); the helper is one worker that wakes at its planned times or every `poll`, whichever
//! comes first, sees the events pushed before it woke (a release as of that wake-up, as the thread
//! sees it), and is busy for the true cost of every pin and unpin it makes. Like the thread with
//! its default threshold, it hears only of uses of `DEFAULT_MIN_BYTES` or more: the smaller ones
//! stay lazily cached.
//! Deterministic: no thread, no clock.

use std::collections::{HashMap, VecDeque};

use super::cost::CostModel;
use super::events::{Event, Key, Use};
use super::planner::{Action, Planner, PlannerConfig, PlannerStats};
use super::thread::DEFAULT_MIN_BYTES;

/// One communication: `site` registers `key`, holds it `hold` ns (the transfer), releases it,
/// then `compute` ns of computation follow.
#[derive(Debug, Clone, Copy)]
pub struct Step {
    pub site: usize,
    pub key: Key,
    pub hold: u64,
    pub compute: u64,
}

/// How registrations are handled.
#[derive(Debug, Clone, Copy)]
pub enum Mode {
    /// Pinned at every use, unpinned at every release.
    NoCache,
    /// Pinned at the first use, kept.
    Lazy,
    /// The lazy cache plus the helper, planning with this configuration.
    Helper(PlannerConfig),
}

/// True costs of the backend: (ns per operation, ns per page) for pin and unpin. The helper
/// plans with the same lines (times its margin), as after a calibration.
#[derive(Debug, Clone, Copy)]
pub struct Costs {
    pub pin: (u64, u64),
    pub unpin: (u64, u64),
    /// The helper's longest sleep (ns).
    pub poll: u64,
}

impl Costs {
    fn of(c: (u64, u64), k: &Key) -> u64 {
        c.0 + c.1 * (k.len() as u64 >> 12)
    }
}

/// What a simulated run did.
#[derive(Debug, Default, Clone)]
pub struct Outcome {
    /// Time-averaged pinned bytes, and the peak.
    pub avg_pinned: f64,
    pub peak_pinned: u64,
    /// Sum of (wait + hold) over all uses: the communication time (ns).
    pub comm: u64,
    /// The whole run (ns).
    pub total: u64,
    /// Pins made (callers' and helper's).
    pub pins: u64,
    pub stats: PlannerStats,
    /// (ns, pinned bytes) at every change.
    pub series: Vec<(u64, u64)>,
}

impl Outcome {
    /// Judged predictions within the tolerance.
    pub fn accuracy(&self) -> f64 {
        let p = self.stats.predictor;
        p.accurate as f64 / p.evaluated.max(1) as f64
    }
}

struct Model {
    pinned: HashMap<Key, u64>,
    ready_at: HashMap<Key, u64>,
    holders: HashMap<Key, u32>,
    bytes: u64,
    peak: u64,
    integral: f64,
    last: u64,
    pins: u64,
    series: Vec<(u64, u64)>,
}

impl Model {
    fn advance(&mut self, t: u64) {
        if t > self.last {
            self.integral += self.bytes as f64 * (t - self.last) as f64;
            self.last = t;
        }
    }
    fn pin(&mut self, k: Key, t: u64) {
        self.advance(t);
        if self.pinned.insert(k, t).is_none() {
            self.bytes += k.len() as u64;
            self.peak = self.peak.max(self.bytes);
            self.pins += 1;
            self.series.push((t, self.bytes));
        }
    }
    fn unpin(&mut self, k: Key, t: u64) -> bool {
        self.advance(t);
        if self.holders.get(&k).copied().unwrap_or(0) > 0 || self.pinned.remove(&k).is_none() {
            return false;
        }
        self.bytes -= k.len() as u64;
        self.series.push((t, self.bytes));
        true
    }
}

/// Run `program` in `mode` with the backend `costs`.
pub fn simulate(program: &[Step], mode: Mode, costs: Costs) -> Outcome {
    let mut m = Model {
        pinned: HashMap::new(),
        ready_at: HashMap::new(),
        holders: HashMap::new(),
        bytes: 0,
        peak: 0,
        integral: 0.0,
        last: 0,
        pins: 0,
        series: vec![(0, 0)],
    };
    let (pin_c, unpin_c, poll) = (costs.pin, costs.unpin, costs.poll);
    let mut planner = match mode {
        Mode::Helper(cfg) => Some(Planner::new(cfg, CostModel::fixed(pin_c, unpin_c))),
        _ => None,
    };
    let no_cache = matches!(mode, Mode::NoCache);
    let mut pending: VecDeque<Event> = VecDeque::new();
    let (mut busy_until, mut last_wake) = (0u64, 0u64);
    let mut comm = 0;
    let mut t = 0u64;
    let mut handle = 0u64;

    // Run the helper up to time `until` (it may overrun by its last action).
    let mut helper_until = |until: u64,
                            planner: &mut Option<Planner>,
                            pending: &mut VecDeque<Event>,
                            m: &mut Model| {
        let Some(p) = planner.as_mut() else { return };
        loop {
            let planned = p.next_wakeup().unwrap_or(u64::MAX);
            let wake = planned.min(last_wake + poll).max(busy_until);
            if wake > until {
                return;
            }
            last_wake = wake;
            while pending.front().is_some_and(|e| match e {
                Event::Use(u) => u.t <= wake,
                Event::Release { t, .. } => *t <= wake,
            }) {
                // A release reaches the planner with the time the helper saw it, as the thread
                // finds it by looking (`releases.rs`), not when it happened.
                p.on_event(match pending.pop_front().unwrap() {
                    Event::Release { handle, .. } => Event::Release { handle, t: wake },
                    e => e,
                });
            }
            let mut now = wake;
            while let Some(a) = p.poll(now) {
                match a {
                    Action::Pin(k) => {
                        let c = Costs::of(pin_c, &k);
                        let fresh = !m.pinned.contains_key(&k);
                        if fresh {
                            m.pin(k, now);
                            m.ready_at.insert(k, now + c);
                        }
                        p.pinned(k, Ok(fresh), now, now + c);
                        now += c;
                    }
                    Action::Unpin(k) => {
                        let c = Costs::of(unpin_c, &k);
                        let bytes = if m.unpin(k, now) { k.len() } else { 0 };
                        p.unpinned(k, bytes, now, now + c);
                        now += c;
                    }
                }
                if now > until {
                    break;
                }
            }
            busy_until = now;
        }
    };

    for s in program {
        helper_until(t, &mut planner, &mut pending, &mut m);
        // The use.
        let (wait, pinned_here) = if m.pinned.contains_key(&s.key) {
            (
                m.ready_at.get(&s.key).map_or(0, |&r| r.saturating_sub(t)),
                false,
            )
        } else {
            m.pin(s.key, t);
            (Costs::of(pin_c, &s.key), true)
        };
        m.ready_at.remove(&s.key);
        let tracked = s.key.len() >= DEFAULT_MIN_BYTES;
        *m.holders.entry(s.key).or_default() += 1;
        handle += 1;
        if tracked {
            pending.push_back(Event::Use(Use {
                tid: 1,
                site: s.site,
                key: s.key,
                handle,
                t,
                wait_ns: wait,
                pinned_here,
            }));
        }
        comm += wait + s.hold;
        t += wait + s.hold;
        helper_until(t, &mut planner, &mut pending, &mut m);
        // The release (no cache: the unpin too, on the caller), then the computation.
        *m.holders.get_mut(&s.key).unwrap() -= 1;
        if tracked {
            pending.push_back(Event::Release { handle, t });
        }
        if no_cache {
            m.unpin(s.key, t);
            let c = Costs::of(unpin_c, &s.key);
            comm += c;
            t += c;
        }
        t += s.compute;
    }
    helper_until(t, &mut planner, &mut pending, &mut m);
    m.advance(t);
    m.series.push((t, m.bytes));
    Outcome {
        avg_pinned: if t == 0 { 0.0 } else { m.integral / t as f64 },
        peak_pinned: m.peak,
        comm,
        total: t,
        pins: m.pins,
        stats: planner.map(|p| p.stats()).unwrap_or_default(),
        series: m.series,
    }
}
