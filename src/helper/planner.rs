//! The helper's decisions, sans-IO (Li et al., "Scalable Memory Registration for High Performance
//! Networks Using Helper Threads" (CF 2011), section 3.2): fed with the callers' events and the
//! time, it answers "pin this region now" or "unpin this one now"; the helper thread (`thread.rs`)
//! carries the actions out on the cache and reports back how long they took. No thread, no clock,
//! no cache in here, so the simulations in `sim_tests.rs` drive it exactly.
//!
//! Per region (a page-aligned range plus access bits) it tracks the holders (uses minus
//! releases), the signatures it was used under, and what the helper did to it last. When a
//! region falls idle the *deregistration condition* is checked: with `next` the earliest
//! predicted use among its signatures (predictions already overdue by more than their tolerance
//! are ignored), unpin when
//!
//! ```text
//!     now + t_unpin + t_pin + t_event + slack + min_unpinned <= next
//! ```
//!
//! (the paper's inequality (1), plus `min_unpinned`: an unpin must buy at least that long
//! unpinned, see `PlannerConfig`) if the registration queue (`rq.rs`) can still pin it again in
//! time along with the pins already queued, and queue it there with deadline `next - slack`. A
//! region with no prediction at all is unpinned once it has been idle `unpredicted_idle_ns`, or
//! `unpredicted_idle_pins` times its pin cost if longer (the paper: at once, it may never be
//! used again). Predictions run from when a caller's registration returned, not from when it
//! was asked for: a caller that waited for a pin does everything after it that much later.
//! Otherwise it stays pinned and is looked at again when its prediction is overdue, so a wrong
//! prediction (the last iteration of an inner loop looks like every other one) costs only that
//! delay. A region the helper pinned whose use does not come is treated the same way.
//!
//! Classification of every use, for the stats: *early* (the helper's pin was done before the
//! caller asked), *late* (the helper had planned the pin, or pinned it too late, and the caller
//! paid), *unpredicted* (the helper unpinned it with no prediction and the caller pinned again:
//! the price of learning).

use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap, HashMap};

use super::cost::CostModel;
use super::events::{Event, Key, Use};
use super::predictor::{Prediction, Predictor, PredictorConfig, PredictorStats};
use super::rq::RegQueue;
use super::signature::CallPoint;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlannerConfig {
    pub predictor: PredictorConfig,
    /// Pins are planned to finish this long before the predicted use (ns); the measured lateness
    /// of the helper's wake-ups is added on top (`observe_wake`).
    pub slack_ns: u64,
    /// Planned cost of handling one event between two pins (the paper's t_hash + t_cache...).
    pub event_ns: u64,
    /// log2 of the page size (the cost model counts pages).
    pub page_shift: u32,
    /// Regions tracked at most (idle ones with nothing planned are forgotten first).
    pub max_regions: usize,
    /// Cap on the measured wake-up lateness added to the slack (ns; 0: fixed slack). A helper
    /// that wakes later than this keeps missing deadlines: the placement policy exists to avoid
    /// that (a helper needs an idle core), the cap keeps it useful where it runs anyway.
    pub max_lateness_ns: u64,
    /// A region with no prediction yet is unpinned once it has been idle this long (ns). The
    /// paper unpins at once (a buffer used once should not stay pinned); waiting keeps loops
    /// that are still being learned from paying a pin per iteration. 20 ms covers an outer
    /// iteration of the NAS skeletons, so their loops are learned before their buffers go (MG,
    /// modelled: +9.5 % communication time with 0, +2.2 % with 5 ms, +0.0 % with 20 ms; measured
    /// with `helper_bench --cores 0,1`: 5 unpredicted caller pins per run with 5 ms, none with
    /// 20 ms). A buffer used once stays pinned that much longer (the lazy cache: for ever).
    /// At least `unpredicted_idle_pins` times the region's planned pin cost, too.
    pub unpredicted_idle_ns: u64,
    /// The idle time before an unpredicted unpin, in units of the region's planned pin cost:
    /// a guess that turns out wrong then costs the caller one pin per this many pin-times the
    /// region sat unused. The pin cost is the planned one (the fitted line times the cost
    /// model's margin, plus an event). On a fast backend `unpredicted_idle_ns` is the longer
    /// (mlock, 512 KiB: 47 us planned x 256 = 12 ms); on a slow one this is (Soft-RoCE under
    /// emulation, pins of 550-950 us: 0.8-1.4 ms planned, x 256 = 0.2-0.37 s, one or two MG
    /// V-cycles with their computation stretched to keep its native share). Modelled with the
    /// VM's costs, MG's communication time over lazy was +21 % with 20 ms (buffers unpinned
    /// between their first uses) and +1.6 % with a fixed 250 ms.
    pub unpredicted_idle_pins: u64,
    /// An unpin is planned only if the region then stays unpinned at least this long (ns). The
    /// paper's inequality accepts any gap the pin and unpin fit into; but each unpin and its
    /// re-pin are two system calls on the helper's core whose effects reach the program's (its
    /// cache lines, the cache's shared lines), while the pinned bytes a sub-millisecond gap
    /// saves are small. Measured (`helper_bench --cores 0,1`, comm_step): the CG skeleton's
    /// inner loop (0.8 ms between uses of two 512 KiB buffers) cost +7.8..+9.0 % communication
    /// time with 0 (about 700 unpin/re-pin pairs per run), -3.0..+3.4 % with 2 ms (about 45),
    /// for 71 % -> 54 % fewer pinned bytes than lazy.
    pub min_unpinned_ns: u64,
    /// The same bound in units of the region's planned pin cost, when that is longer: the
    /// unpin and re-pin cost the program more the heavier they are (their system calls' effects
    /// on its core), so they must buy proportionally more. Natively `min_unpinned_ns` decides
    /// (mlock, 1 MiB: 83 us planned, x 16 = 1.3 ms); in the Soft-RoCE VM, where a pin is ~800
    /// us (1.15 ms planned, x 16 = 18 ms), this keeps CG's inner buffers (17 ms apart there)
    /// pinned: unpinning and re-pinning them every iteration cost +35 % measured there.
    pub min_unpinned_pins: u64,
}

impl Default for PlannerConfig {
    fn default() -> Self {
        PlannerConfig {
            predictor: PredictorConfig::default(),
            slack_ns: 300_000,
            event_ns: 5_000,
            page_shift: 12,
            max_regions: 1 << 16,
            max_lateness_ns: 2_000_000,
            unpredicted_idle_ns: 20_000_000,
            unpredicted_idle_pins: 256,
            min_unpinned_ns: 2_000_000,
            min_unpinned_pins: 16,
        }
    }
}

impl PlannerConfig {
    /// Tracks every use and release but never unpins (so never pins ahead either): a helper
    /// with it costs the program only the tracking, which is what it is for (benchmarks).
    pub fn never_acting() -> PlannerConfig {
        PlannerConfig {
            min_unpinned_ns: 1 << 62,
            unpredicted_idle_ns: 1 << 62,
            ..PlannerConfig::default()
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Pin the region ahead of its predicted use (`Cache::prefetch`); report with `pinned`.
    Pin(Key),
    /// Unpin the idle region (`Cache::evict_range`); report with `unpinned`.
    Unpin(Key),
}

/// What the helper last did to a region, as far as it knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PinState {
    /// A caller used it; it stays cached (lazily) until the helper decides otherwise.
    Cached,
    /// The helper unpinned it; `planned`: a pin is queued before its predicted use.
    Unpinned { planned: bool },
    /// The helper pinned it (finished at `at`) and no use came since.
    HelperPinned { at: u64 },
    /// Not pinned by the cache as far as the helper knows (its unpin or pin found nothing):
    /// nothing to do until the next use.
    Gone,
}

/// Signatures remembered per region (most recent first).
const SIGS: usize = 8;

#[derive(Debug, Clone)]
struct Region {
    holders: u32,
    pin: PinState,
    sigs: [u64; SIGS],
    nsigs: usize,
    /// The pending re-evaluation (0: none); entries of the check heap that differ are stale.
    check_at: u64,
    /// Signature and time of the latest use.
    last: (u64, u64),
    /// When it fell idle (its last release).
    idle_since: u64,
}

impl Region {
    fn new() -> Region {
        Region {
            holders: 0,
            pin: PinState::Gone,
            sigs: [0; SIGS],
            nsigs: 0,
            check_at: 0,
            last: (0, 0),
            idle_since: 0,
        }
    }

    fn add_sig(&mut self, sig: u64) {
        let n = self.nsigs;
        if let Some(i) = self.sigs[..n].iter().position(|&s| s == sig) {
            self.sigs[..=i].rotate_right(1);
        } else {
            self.sigs.rotate_right(1);
            self.sigs[0] = sig;
            self.nsigs = (n + 1).min(SIGS);
        }
    }
}

/// Counters since creation.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PlannerStats {
    pub predictor: PredictorStats,
    /// Uses seen (registrations at or above the helper's size threshold).
    pub uses: u64,
    /// Uses the helper's pin was ready for.
    pub early: u64,
    /// Uses that came before the helper's planned pin (or while it was pinning).
    pub late: u64,
    /// Uses of regions the helper unpinned without a prediction (learning).
    pub unpredicted: u64,
    /// Sum over early uses of how long the pin was ready before the use (ns).
    pub early_lead_ns: u64,
    pub helper_pins: u64,
    pub helper_unpins: u64,
    pub helper_pin_failures: u64,
    /// Uses where the caller pinned on its own thread, and the time those callers waited (ns).
    pub caller_pins: u64,
    pub caller_pin_wait_ns: u64,
    /// Time every tracked registration took, hits included (ns).
    pub caller_wait_ns: u64,
    /// Releases of handles it saw used.
    pub releases: u64,
    /// Releases of handles the helper never saw used (below the threshold, or a dropped event).
    pub unknown_releases: u64,
    /// Regions tracked now, and queued for a pin now.
    pub regions: u64,
    pub queued: u64,
}

pub(crate) struct Planner {
    cfg: PlannerConfig,
    predictor: Predictor,
    pub cost: CostModel,
    regions: HashMap<Key, Region>,
    /// The same keys ordered by start, and the longest, for `on_unmapped`'s range query.
    by_start: BTreeSet<Key>,
    max_len: usize,
    handles: HashMap<u64, Key>,
    rq: RegQueue<Key>,
    checks: BinaryHeap<Reverse<(u64, Key)>>,
    /// Largest recent lateness of the helper's wake-ups (halves every `LATENESS_HALF_LIFE`),
    /// and when it was last updated.
    late_max: u64,
    late_at: u64,
    stats: PlannerStats,
}

/// The measured lateness halves this often (ns): one preemption should not widen the slack for
/// long, a loaded machine keeps it wide.
const LATENESS_HALF_LIFE: u64 = 100_000_000;

/// Handles tracked at most: past that the table starts over (only a flood of lost releases can
/// get there; the regions involved then stay lazily cached).
const MAX_HANDLES: usize = 1 << 20;

impl Planner {
    pub(crate) fn new(cfg: PlannerConfig, cost: CostModel) -> Planner {
        Planner {
            cfg,
            predictor: Predictor::new(cfg.predictor),
            cost,
            regions: HashMap::new(),
            by_start: BTreeSet::new(),
            max_len: 0,
            handles: HashMap::new(),
            rq: RegQueue::default(),
            checks: BinaryHeap::new(),
            late_max: 0,
            late_at: 0,
            stats: PlannerStats::default(),
        }
    }

    /// Current slack: the configured lead plus the recent worst wake-up lateness.
    pub(crate) fn slack(&self) -> u64 {
        self.cfg.slack_ns + self.late_max
    }

    /// The helper meant to wake at `intended` and woke at `actual`.
    pub(crate) fn observe_wake(&mut self, intended: u64, actual: u64) {
        let late = actual
            .saturating_sub(intended)
            .min(self.cfg.max_lateness_ns);
        let halvings = actual.saturating_sub(self.late_at) / LATENESS_HALF_LIFE;
        let decayed = self.late_max.checked_shr(halvings as u32).unwrap_or(0);
        self.late_max = late.max(decayed);
        if halvings > 0 || late >= decayed {
            self.late_at = actual;
        }
    }

    pub(crate) fn stats(&self) -> PlannerStats {
        PlannerStats {
            predictor: self.predictor.stats(),
            regions: self.regions.len() as u64,
            queued: self.rq.len() as u64,
            ..self.stats
        }
    }

    fn pages(&self, k: &Key) -> u64 {
        (k.len() >> self.cfg.page_shift) as u64
    }

    fn check(&mut self, key: Key, at: u64) {
        if let Some(r) = self.regions.get_mut(&key) {
            r.check_at = at.max(1);
            self.checks.push(Reverse((r.check_at, key)));
        }
    }

    pub(crate) fn on_event(&mut self, ev: Event) {
        match ev {
            Event::Use(u) => self.on_use(u),
            Event::Release { handle, t } => self.on_release(handle, t),
        }
    }

    fn on_use(&mut self, u: Use) {
        let leave = u.t + u.wait_ns;
        let sig = self.predictor.observe_span(
            u.tid,
            CallPoint {
                site: u.site,
                addr: u.key.start,
            },
            u.t,
            leave,
        );
        if self.handles.len() >= MAX_HANDLES {
            self.handles.clear();
        }
        self.handles.insert(u.handle, u.key);
        if self.regions.len() >= self.cfg.max_regions && !self.regions.contains_key(&u.key) {
            self.forget_idle();
        }
        let st = &mut self.stats;
        st.uses += 1;
        st.caller_wait_ns += u.wait_ns;
        if u.pinned_here {
            st.caller_pins += 1;
            st.caller_pin_wait_ns += u.wait_ns;
        }
        if !self.regions.contains_key(&u.key) {
            self.by_start.insert(u.key);
            self.max_len = self.max_len.max(u.key.len());
        }
        let r = self.regions.entry(u.key).or_insert_with(Region::new);
        r.add_sig(sig);
        r.last = (sig, leave);
        r.holders += 1;
        r.check_at = 0;
        match r.pin {
            PinState::HelperPinned { at } if !u.pinned_here && at <= u.t => {
                st.early += 1;
                st.early_lead_ns += u.t - at;
            }
            PinState::HelperPinned { .. } | PinState::Unpinned { planned: true } => st.late += 1,
            PinState::Unpinned { planned: false } => st.unpredicted += 1,
            PinState::Cached | PinState::Gone => {}
        }
        r.pin = PinState::Cached;
        self.rq.remove(u.key);
    }

    fn on_release(&mut self, handle: u64, t: u64) {
        let Some(key) = self.handles.remove(&handle) else {
            self.stats.unknown_releases += 1;
            return;
        };
        self.stats.releases += 1;
        let Some(r) = self.regions.get_mut(&key) else {
            return;
        };
        r.holders = r.holders.saturating_sub(1);
        if r.holders == 0 {
            r.idle_since = t;
            self.check(key, t);
        }
    }

    /// Drop idle regions with nothing planned (bounded memory).
    fn forget_idle(&mut self) {
        self.regions.retain(|_, r| {
            r.holders > 0
                || matches!(
                    r.pin,
                    PinState::Cached
                        | PinState::HelperPinned { .. }
                        | PinState::Unpinned { planned: true }
                )
        });
        let regions = &self.regions;
        self.by_start.retain(|k| regions.contains_key(k));
    }

    /// The memory of `[start, end)` went away (an unmap, reported by the monitor). Regions
    /// overlapping it are not pinned ahead again until a caller registers them again: the
    /// application freed or is reshaping that memory, and a pin of its new pages made on a guess
    /// would split the new owner's mapping (an `mremap` of it would then fail), for a use that
    /// may never come. (Correctness does not depend on this: the cache invalidates regions the
    /// helper pinned like any other.)
    ///
    /// Held regions too: the planner sees a release only when the helper next polls the handle
    /// (`releases.rs`), so a region the application had already released and unmapped could
    /// still count a holder here. Exempted, it was unpinned and pinned ahead again once the
    /// release was seen, over whatever was mapped there since (seen: `case6_stale_threads_helper`
    /// under AddressSanitizer, another thread's `mremap` failing with EFAULT). A use after the
    /// unmap re-arms the region.
    pub(crate) fn on_unmapped(&mut self, start: usize, end: usize) {
        let lo = start.saturating_sub(self.max_len);
        let hits: Vec<Key> = self
            .by_start
            .range(
                Key {
                    start: lo,
                    end: 0,
                    access: 0,
                }..Key {
                    start: end,
                    end: 0,
                    access: 0,
                },
            )
            .filter(|k| k.end > start)
            .copied()
            .collect();
        for k in hits {
            if let Some(r) = self.regions.get_mut(&k) {
                r.pin = PinState::Gone;
                r.check_at = 0;
                self.rq.remove(k);
            }
        }
    }

    /// Unmaps were reported faster than the helper took them: forget every idle region's plan.
    pub(crate) fn on_unmapped_everything(&mut self) {
        self.on_unmapped(0, usize::MAX);
    }

    /// Earliest predicted use of `key` that is not overdue at `now`. Candidates: the next
    /// occurrence of each signature the region was used under, and the region's next use after
    /// its latest one (`Predictor::next_after`).
    fn next_use(&self, r: &Region, now: u64) -> Option<Prediction> {
        r.sigs[..r.nsigs]
            .iter()
            .filter_map(|&s| self.predictor.next(s))
            .chain(self.predictor.next_after(r.last.0, r.last.1))
            .filter(|p| self.overdue_at(p) >= now)
            .min()
    }

    /// When a prediction stops counting: its expected time plus the tolerance and the slack.
    fn overdue_at(&self, p: &Prediction) -> u64 {
        p.expected + p.period * self.cfg.predictor.tolerance_pct / 100 + self.slack()
    }

    /// When the helper should next call `poll` (ns), if anything is scheduled.
    pub(crate) fn next_wakeup(&mut self) -> Option<u64> {
        // Drop stale checks first (a use or a newer check replaced them).
        while let Some(&Reverse((t, key))) = self.checks.peek() {
            if self.regions.get(&key).is_some_and(|r| r.check_at == t) {
                break;
            }
            self.checks.pop();
        }
        let check = self.checks.peek().map(|Reverse((t, _))| *t);
        match (self.rq.next_start(), check) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// The next action due at `now`, if any. Pins (deadlines) come first.
    pub(crate) fn poll(&mut self, now: u64) -> Option<Action> {
        while let Some(item) = self.rq.pop_due(now) {
            let Some(r) = self.regions.get(&item.key) else {
                continue;
            };
            if r.holders == 0 && r.pin == (PinState::Unpinned { planned: true }) {
                return Some(Action::Pin(item.key));
            }
        }
        while let Some(&Reverse((t, key))) = self.checks.peek() {
            if t > now {
                break;
            }
            self.checks.pop();
            if let Some(a) = self.evaluate(key, t, now) {
                return Some(a);
            }
        }
        None
    }

    /// The deregistration condition for an idle region (see the module docs).
    fn evaluate(&mut self, key: Key, check_at: u64, now: u64) -> Option<Action> {
        let r = self.regions.get(&key)?;
        if r.check_at != check_at || r.holders > 0 {
            return None; // stale check, or in use again
        }
        if !matches!(r.pin, PinState::Cached | PinState::HelperPinned { .. }) {
            return None;
        }
        let pages = self.pages(&key);
        let slack = self.slack();
        let next = self.next_use(r, now);
        let t_pin = self.cost.pin_ns(pages) + self.cfg.event_ns;
        let r = self.regions.get_mut(&key)?;
        r.check_at = 0;
        let Some(p) = next else {
            let idle = self
                .cfg
                .unpredicted_idle_ns
                .max(t_pin.saturating_mul(self.cfg.unpredicted_idle_pins));
            let unpin_at = r.idle_since.saturating_add(idle);
            if now < unpin_at {
                self.check(key, unpin_at);
                return None;
            }
            r.pin = PinState::Unpinned { planned: false };
            return Some(Action::Unpin(key));
        };
        let next = p.earliest;
        let t_unpin = self.cost.unpin_ns(pages);
        // The paper's inequality for this region alone, and room for its re-pin among the pins
        // already queued: when deadlines crowd (several buffers due together after a long
        // computation, on a slow backend), an unpin whose pin could only finish late would cost
        // its caller a whole pin.
        let min_unpinned = self
            .cfg
            .min_unpinned_ns
            .max(t_pin.saturating_mul(self.cfg.min_unpinned_pins));
        if now + t_unpin + t_pin + slack + min_unpinned <= next
            && self.rq.can_add(next - slack, t_pin, now + t_unpin)
        {
            r.pin = PinState::Unpinned { planned: true };
            self.rq.insert(key, next - slack, t_pin);
            return Some(Action::Unpin(key));
        }
        // Too close to unpin: look again once this prediction is overdue.
        let at = self.overdue_at(&p) + 1;
        self.check(key, at);
        None
    }

    /// Report of an `Action::Pin` that ran from `t0` to `t1`: `Ok(true)` pinned, `Ok(false)`
    /// already cached, `Err` the backend refused (memory gone, no room).
    pub(crate) fn pinned(&mut self, key: Key, res: Result<bool, ()>, t0: u64, t1: u64) {
        let pages = self.pages(&key);
        let Some(r) = self.regions.get(&key) else {
            return;
        };
        let overdue = self.next_use(r, t1).map(|p| self.overdue_at(&p) + 1);
        let Some(r) = self.regions.get_mut(&key) else {
            return;
        };
        match res {
            Ok(fresh) => {
                if fresh {
                    self.stats.helper_pins += 1;
                    self.cost.observe_pin(pages, t1.saturating_sub(t0));
                }
                r.pin = PinState::HelperPinned { at: t1 };
                // If the use does not come, look again once it is overdue.
                self.check(key, overdue.unwrap_or(t1));
            }
            Err(()) => {
                self.stats.helper_pin_failures += 1;
                r.pin = PinState::Gone;
            }
        }
    }

    /// Report of an `Action::Unpin` that ran from `t0` to `t1` and unpinned `bytes` (0: nothing
    /// idle was cached there: in use after all, or already invalidated).
    pub(crate) fn unpinned(&mut self, key: Key, bytes: usize, t0: u64, t1: u64) {
        let pages = self.pages(&key);
        if bytes > 0 {
            self.stats.helper_unpins += 1;
            self.cost.observe_unpin(pages, t1.saturating_sub(t0));
            return;
        }
        if let Some(r) = self.regions.get_mut(&key) {
            if r.holders == 0 {
                r.pin = PinState::Gone;
            }
        }
        self.rq.remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn key(n: usize) -> Key {
        Key {
            start: n << 20,
            end: (n << 20) + (64 << 12),
            access: 1,
        }
    }

    fn planner() -> Planner {
        Planner::new(
            PlannerConfig {
                slack_ns: 100_000,
                unpredicted_idle_ns: 0,
                unpredicted_idle_pins: 0,
                ..Default::default()
            },
            CostModel::fixed((20_000, 100), (5_000, 50)),
        )
    }

    fn use_at(p: &mut Planner, k: Key, handle: u64, t: u64, pinned_here: bool) {
        p.on_event(Event::Use(Use {
            tid: 1,
            site: 42,
            key: k,
            handle,
            t,
            wait_ns: if pinned_here { 50_000 } else { 100 },
            pinned_here,
        }));
    }

    /// Release `handle` at `t` and take the actions due then, as the helper would: every unpin
    /// is reported done (pins are left undone). Returns the regions unpinned.
    fn release_at(p: &mut Planner, handle: u64, t: u64) -> Vec<Key> {
        p.on_event(Event::Release { handle, t });
        let mut unpinned = Vec::new();
        while let Some(a) = p.poll(t) {
            if let Action::Unpin(k) = a {
                p.unpinned(k, k.len(), 0, 0);
                unpinned.push(k);
            }
        }
        unpinned
    }

    /// Eight uses of one region `period` apart, each released 10 us later: the unpins made
    /// after the first three (learning).
    fn unpins_after_learning(p: &mut Planner, period: u64) -> u32 {
        let mut n = 0;
        for i in 0..8u64 {
            use_at(p, key(1), i + 1, i * period, i == 0);
            let unpins = release_at(p, i + 1, i * period + 10_000).len() as u32;
            n += if i >= 3 { unpins } else { 0 };
        }
        n
    }

    #[test]
    fn unpredicted_region_is_unpinned_at_release() {
        let mut p = planner();
        use_at(&mut p, key(1), 1, 0, true);
        assert_eq!(p.poll(MS), None, "in use");
        p.on_event(Event::Release { handle: 1, t: MS });
        assert_eq!(p.poll(MS), Some(Action::Unpin(key(1))));
        p.unpinned(key(1), 64 << 12, MS, MS + 10);
        assert_eq!(p.poll(2 * MS), None);
        assert_eq!(p.next_wakeup(), None, "nothing planned");
        use_at(&mut p, key(1), 2, 10 * MS, true);
        assert_eq!(p.stats().unpredicted, 1);
    }

    #[test]
    fn predicted_region_is_unpinned_and_pinned_before_its_use() {
        let mut p = planner();
        // Same call site, same buffer, every 10 ms: learned after the third use.
        let mut h = 0;
        for i in 0..4 {
            h += 1;
            use_at(&mut p, key(1), h, i * 10 * MS, true);
            release_at(&mut p, h, i * 10 * MS + MS);
        }
        // After the use at 30 ms: next predicted at 40 ms, pin due before it.
        let wake = p.next_wakeup().unwrap();
        assert!(wake > 31 * MS && wake < 40 * MS, "{wake}");
        assert_eq!(p.poll(wake - 1), None);
        assert_eq!(p.poll(wake), Some(Action::Pin(key(1))));
        p.pinned(key(1), Ok(true), wake, wake + 50_000);
        use_at(&mut p, key(1), 99, 40 * MS, false);
        let s = p.stats();
        assert_eq!((s.early, s.late, s.helper_pins), (1, 0, 1));
        assert!(s.early_lead_ns > 0 && s.early_lead_ns < 2 * MS, "{s:?}");
    }

    #[test]
    fn a_use_that_comes_first_cancels_the_planned_pin_and_counts_late() {
        let mut p = planner();
        let mut h = 0;
        for i in 0..4 {
            h += 1;
            use_at(&mut p, key(1), h, i * 10 * MS, true);
            release_at(&mut p, h, i * 10 * MS + MS);
        }
        assert_eq!(p.stats().queued, 1);
        use_at(&mut p, key(1), 100, 35 * MS, true); // earlier than predicted
        assert_eq!(p.stats().queued, 0);
        assert_eq!(p.stats().late, 1);
        assert_eq!(p.poll(40 * MS), None, "no pin for a region in use");
    }

    #[test]
    fn too_close_stays_pinned_and_is_rechecked_when_overdue() {
        let mut p = planner();
        // Period 100 us: unpin + pin + slack (~157 us) do not fit.
        let mut h = 0;
        let period = 100_000;
        for i in 0..5 {
            h += 1;
            use_at(&mut p, key(1), h, i * period, i == 0);
            p.on_event(Event::Release {
                handle: h,
                t: i * period + 10_000,
            });
            let a = p.poll(i * period + 10_000);
            if i < 3 {
                // Learning: no prediction yet, unpinned; the next use pins again.
                assert_eq!(a, Some(Action::Unpin(key(1))), "use {i}");
                p.unpinned(key(1), key(1).len(), 0, 0);
            } else {
                assert_eq!(a, None, "use {i}: kept");
            }
        }
        // The use at 1.0 ms never comes: once overdue, the region is unpinned.
        let wake = p.next_wakeup().unwrap();
        assert!(wake > 5 * period && wake < 7 * period, "{wake}");
        assert_eq!(p.poll(wake), Some(Action::Unpin(key(1))));
    }

    /// Uses every 1.5 ms: unpin + pin + slack (~0.2 ms) fit into the gap, so the paper's
    /// inequality alone unpins and re-pins every time; `min_unpinned_ns` (2 ms by default)
    /// keeps the region pinned once its period is learned.
    #[test]
    fn a_gap_shorter_than_min_unpinned_is_not_worth_an_unpin() {
        let run = |min_unpinned_ns: u64| {
            let mut p = Planner::new(
                PlannerConfig {
                    slack_ns: 100_000,
                    unpredicted_idle_ns: 0,
                    unpredicted_idle_pins: 0,
                    min_unpinned_ns,
                    min_unpinned_pins: 0,
                    ..Default::default()
                },
                CostModel::fixed((20_000, 100), (5_000, 50)),
            );
            unpins_after_learning(&mut p, 1_500_000)
        };
        assert_eq!(
            run(0),
            5,
            "the paper's rule: an unpin in every gap once learned"
        );
        assert_eq!(PlannerConfig::default().min_unpinned_ns, 2_000_000);
        assert_eq!(run(2_000_000), 0, "kept pinned");
    }

    #[test]
    fn unpin_that_found_nothing_cancels_the_plan() {
        let mut p = planner();
        use_at(&mut p, key(2), 1, 0, true);
        p.on_event(Event::Release { handle: 1, t: 1 });
        assert_eq!(p.poll(1), Some(Action::Unpin(key(2))));
        p.unpinned(key(2), 0, 1, 2);
        assert_eq!(p.stats().helper_unpins, 0);
        use_at(&mut p, key(2), 2, 5 * MS, true);
        assert_eq!(p.stats().unpredicted, 0, "the helper did not unpin it");
    }

    #[test]
    fn an_unmap_cancels_the_plan_until_the_next_use() {
        let mut p = planner();
        let mut h = 0;
        for i in 0..4 {
            h += 1;
            use_at(&mut p, key(1), h, i * 10 * MS, true);
            release_at(&mut p, h, i * 10 * MS + MS);
        }
        assert_eq!(p.stats().queued, 1);
        // An unmap of another range changes nothing; one overlapping the buffer's end does.
        p.on_unmapped(key(1).end, key(1).end + 4096);
        assert_eq!(p.stats().queued, 1);
        p.on_unmapped(key(1).end - 4096, key(1).end + 4096);
        assert_eq!(p.stats().queued, 0);
        assert_eq!(p.poll(40 * MS), None, "no pin of memory that went away");
        // The next use re-arms it (a use of a Gone region is neither late nor unpredicted).
        use_at(&mut p, key(1), 50, 40 * MS, true);
        assert_eq!((p.stats().late, p.stats().unpredicted), (0, 3));
    }

    /// The unmap is reported while the planner still counts the last use's holder (the helper
    /// had not polled the release yet): once the release is seen, no pin ahead of that memory.
    #[test]
    fn an_unmap_reported_before_the_release_was_seen_cancels_the_plan() {
        let mut p = planner();
        for h in 1..=3u64 {
            use_at(&mut p, key(1), h, (h - 1) * 10 * MS, true);
            release_at(&mut p, h, (h - 1) * 10 * MS + MS);
        }
        use_at(&mut p, key(1), 4, 30 * MS, true);
        p.on_unmapped(key(1).start, key(1).end);
        release_at(&mut p, 4, 31 * MS);
        assert_eq!(p.stats().queued, 0);
        for ms in 31..100 {
            assert_eq!(p.poll(ms * MS), None, "at {ms} ms");
        }
        // The next use re-arms it.
        use_at(&mut p, key(1), 5, 100 * MS, true);
        release_at(&mut p, 5, 101 * MS);
        assert!(p
            .regions
            .get(&key(1))
            .is_some_and(|r| r.pin != PinState::Gone));
    }

    #[test]
    fn an_unpredicted_region_waits_its_idle_time() {
        let mut p = Planner::new(
            PlannerConfig {
                unpredicted_idle_ns: 5 * MS,
                unpredicted_idle_pins: 0,
                ..Default::default()
            },
            CostModel::fixed((20_000, 100), (5_000, 50)),
        );
        use_at(&mut p, key(3), 1, 0, true);
        p.on_event(Event::Release { handle: 1, t: MS });
        assert_eq!(p.poll(MS), None, "no prediction: kept for now");
        assert_eq!(p.next_wakeup(), Some(6 * MS));
        assert_eq!(p.poll(6 * MS - 1), None);
        assert_eq!(p.poll(6 * MS), Some(Action::Unpin(key(3))));
    }

    /// On a slow backend a region with no prediction waits `unpredicted_idle_pins` pin-times
    /// before it is unpinned, not only `unpredicted_idle_ns`: a wrong guess costs a whole pin.
    #[test]
    fn a_slow_pin_makes_an_unpredicted_region_wait_longer() {
        let cfg = PlannerConfig {
            unpredicted_idle_ns: 5 * MS,
            unpredicted_idle_pins: 100,
            ..Default::default()
        };
        let mut p = Planner::new(cfg, CostModel::fixed((MS, 0), (100_000, 0)));
        // The planned cost: the fitted line times the cost model's margin, plus an event.
        let t_pin = p.cost.pin_ns(64) + cfg.event_ns;
        assert!(t_pin >= MS);
        use_at(&mut p, key(3), 1, 0, true);
        p.on_event(Event::Release { handle: 1, t: MS });
        assert_eq!(p.poll(MS), None);
        assert_eq!(p.next_wakeup(), Some(MS + 100 * t_pin));
        assert_eq!(p.poll(6 * MS), None, "past unpredicted_idle_ns only");
        assert_eq!(p.poll(MS + 100 * t_pin), Some(Action::Unpin(key(3))));
        // A fast backend: `unpredicted_idle_ns` is the longer.
        let mut q = Planner::new(cfg, CostModel::fixed((10_000, 0), (5_000, 0)));
        use_at(&mut q, key(3), 1, 0, true);
        q.on_event(Event::Release { handle: 1, t: MS });
        assert_eq!(q.poll(MS), None);
        assert_eq!(q.next_wakeup(), Some(6 * MS));
    }

    /// Two regions used together every 20 ms, each pin 9.8 ms: each alone passes the paper's
    /// inequality, but one helper cannot pin both again in time. The second unpin is not made
    /// (its re-pin would have made a caller wait).
    #[test]
    fn an_unpin_whose_re_pin_cannot_be_scheduled_in_time_is_not_made() {
        let mut p = Planner::new(
            PlannerConfig {
                slack_ns: 100_000,
                unpredicted_idle_ns: 0,
                unpredicted_idle_pins: 0,
                min_unpinned_pins: 0,
                ..Default::default()
            },
            CostModel::fixed((9_800_000, 0), (100_000, 0)),
        );
        let period = 20 * MS;
        let mut unpinned_last = Vec::new();
        for i in 0..6u64 {
            let t = i * period;
            unpinned_last.clear();
            for (n, at) in [(1usize, 0u64), (2, 200_000)] {
                let h = i * 2 + n as u64;
                use_at(&mut p, key(n), h, t + at, i == 0);
                unpinned_last.extend(release_at(&mut p, h, t + at + 400_000));
            }
        }
        assert_eq!(unpinned_last, [key(1)], "{:?}", p.stats());
        assert_eq!(p.stats().queued, 1);
    }

    /// A region used by site A, then by site B 1 ms later, every 20 ms. Once A's caller waits
    /// 2 ms for a pin, B comes 1 ms after A's registration returned, 3 ms after it was asked
    /// for. Predicting B from when A was asked for would call it overdue by A's release and
    /// unpin the region just before B (seen in the MG skeleton on a slow backend).
    #[test]
    fn a_callers_pin_wait_does_not_make_the_next_use_look_overdue() {
        let mut p = Planner::new(
            PlannerConfig {
                slack_ns: 100_000,
                unpredicted_idle_ns: 0,
                unpredicted_idle_pins: 0,
                ..Default::default()
            },
            CostModel::fixed((20_000, 0), (5_000, 0)),
        );
        let period = 20 * MS;
        let mut h = 0;
        let mut one_use = |p: &mut Planner, site: usize, t: u64, wait_ns: u64, hold: u64| {
            h += 1;
            p.on_event(Event::Use(Use {
                tid: 1,
                site,
                key: key(1),
                handle: h,
                t,
                wait_ns,
                pinned_here: wait_ns > 0,
            }));
            !release_at(p, h, t + wait_ns + hold).is_empty()
        };
        for i in 0..5u64 {
            one_use(&mut p, 0xA, i * period, 0, 300_000);
            one_use(&mut p, 0xB, i * period + MS, 0, 300_000);
        }
        // A waits 2 ms; its release, 2.3 ms after it asked, comes after B's old due time.
        let t = 5 * period;
        assert!(
            !one_use(&mut p, 0xA, t, 2 * MS, 300_000),
            "unpinned 0.7 ms before B: {:?}",
            p.stats()
        );
    }

    /// A heavy pin (1 ms) and uses every 10 ms: the gap passes `min_unpinned_ns` (2 ms) but not
    /// 16 pin-times, so once learned the region stays pinned; without the pin-time bound it is
    /// unpinned and pinned again every iteration.
    #[test]
    fn a_heavy_pin_needs_a_proportionally_longer_gap() {
        let run = |min_unpinned_pins: u64| {
            let mut p = Planner::new(
                PlannerConfig {
                    slack_ns: 100_000,
                    unpredicted_idle_ns: 0,
                    unpredicted_idle_pins: 0,
                    min_unpinned_pins,
                    ..Default::default()
                },
                CostModel::fixed((MS, 0), (100_000, 0)),
            );
            unpins_after_learning(&mut p, 10 * MS)
        };
        assert_eq!(run(PlannerConfig::default().min_unpinned_pins), 0);
        assert!(run(0) >= 4, "{}", run(0));
    }

    #[test]
    fn unknown_release_is_counted_and_ignored() {
        let mut p = planner();
        p.on_event(Event::Release { handle: 77, t: 0 });
        assert_eq!(p.stats().unknown_releases, 1);
        assert_eq!(p.poll(MS), None);
    }

    #[test]
    fn wake_lateness_widens_the_slack_capped_and_decays() {
        let mut p = planner();
        assert_eq!(p.slack(), 100_000);
        p.observe_wake(10 * MS, 11 * MS);
        assert_eq!(p.slack(), 100_000 + MS);
        p.observe_wake(20 * MS, 60 * MS);
        assert_eq!(p.slack(), 100_000 + 2 * MS, "capped");
        // On time for a second: ten half-lives.
        for i in 1..=1000 {
            p.observe_wake(60 * MS + i * MS, 60 * MS + i * MS);
        }
        assert!(p.slack() < 100_000 + 10_000, "{}", p.slack());
    }
}
