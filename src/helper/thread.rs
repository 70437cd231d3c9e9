//! The helper thread and its front: `Helper::register` / `deregister` are what `fh_register` /
//! `fh_deregister` (and the shim) call when a helper was asked for; the thread carries out the
//! planner's decisions on the cache.
//!
//! On the caller's side, a registration at or above `min_bytes` (the paper's 16 KiB threshold:
//! below it, the bookkeeping would cost more than the pin it may save) costs two clock reads and
//! one lock-free push on top of the cache's own path; a deregistration costs nothing on top: the
//! helper polls the handles it saw used (`releases.rs`). Nothing else: no lock, no wake-up of the
//! helper (it polls), no backend call (with a helper, the last holder of a detached region hands
//! it over too: `Cache::defer_unpins`).
//!
//! The thread loops: unpin what callers handed over, process queued invalidations, take the
//! events and look for releases, run the due actions (one pin or unpin at a time, taking new
//! events between them, as the paper alternates its DQ and RQ), then sleep until the next planned
//! action or `poll_ns`. Wake-ups that come late widen the planner's slack.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use super::clock::{self, now_ns, ClockChoice};
use super::cost::{self, CostModel};
use super::events::{Event, EventQueue, Key, Use, EVENT_CAPACITY};
use super::pin_flag;
use super::placement::{self, Placement};
use super::planner::{Action, Planner, PlannerConfig, PlannerStats};
use super::releases::Releases;
use super::{pins_ahead, unmap_log};
use crate::cache::{Cache, CacheError, Registration};
use crate::monitor::{MemoryListener, Subscription};
use crate::pin::Access;
use crossbeam_queue::ArrayQueue;

/// How a helper is started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HelperConfig {
    pub placement: Placement,
    /// Registrations shorter than this are not tracked (they stay lazily cached).
    pub min_bytes: usize,
    pub planner: PlannerConfig,
    /// Longest sleep between two looks at the event queue (ns).
    pub poll_ns: u64,
    /// Fit the cost model on the backend at start (else the default model, refined by the
    /// helper's own pins and unpins).
    pub calibrate: bool,
    /// The clock (`clock.rs`; the process's first helper decides for all).
    pub clock: ClockChoice,
}

/// Longest interval between two looks at a handle still held (ns): a region held for long is
/// seen idle at most this late (`releases.rs`).
const RELEASE_LOOK_MAX_NS: u64 = 1_000_000_000;

/// The paper's threshold.
pub(crate) const DEFAULT_MIN_BYTES: usize = 16 << 10;

impl Default for HelperConfig {
    fn default() -> Self {
        HelperConfig {
            placement: Placement::Auto,
            min_bytes: DEFAULT_MIN_BYTES,
            planner: PlannerConfig::default(),
            poll_ns: 500_000,
            calibrate: true,
            clock: ClockChoice::Auto,
        }
    }
}

/// Whether the helper runs, and why not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HelperState {
    /// Running; bound to that core if `Some`.
    On {
        cpu: Option<usize>,
    },
    Off {
        reason: String,
    },
}

/// What the helper did, for `fh_get_helper_stats` and `fh_info`.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct HelperStats {
    pub planner: PlannerStats,
    /// Events lost to a full queue (the region involved stays lazily cached).
    pub events_dropped: u64,
    /// Detached regions the helper unpinned for their releasing caller.
    pub deferred_unpins: u64,
    /// Pinned bytes averaged over the time the helper ran (sampled on every loop, at least
    /// every `poll_ns`), and the cache's peak.
    pub avg_pinned_bytes: u64,
    pub peak_pinned_bytes: u64,
    pub elapsed_ns: u64,
    /// Fitted cost lines (ns, ns per page), without the margin.
    pub pin_line: (f64, f64),
    pub unpin_line: (f64, f64),
    /// Current slack (configured lead + worst recent wake-up lateness), ns.
    pub slack_ns: u64,
}

/// Unmaps reported by the monitor, for the planner (`Planner::on_unmapped`). Hook-safe: a push
/// into a fixed lock-free ring; a full ring sets `overflow` (then every idle region's plan is
/// dropped, which only costs prefetches).
struct Unmaps {
    ring: ArrayQueue<(usize, usize)>,
    overflow: AtomicBool,
    /// In a forked child: the helper thread (the ring's consumer) stayed in the parent, and may
    /// have been half-way through a pop, so a push could spin for good: hooks push nothing.
    forked: AtomicBool,
}

impl MemoryListener for Unmaps {
    fn on_unmap(&self, addr: usize, len: usize) {
        if self.forked.load(Ordering::Relaxed) {
            return;
        }
        if self.ring.push((addr, addr.saturating_add(len))).is_err() {
            self.overflow.store(true, Ordering::Relaxed);
        }
    }

    fn forked(&self) {
        self.forked.store(true, Ordering::Relaxed);
    }
}

struct Shared {
    events: EventQueue,
    unmaps: Arc<Unmaps>,
    stop: Mutex<bool>,
    wake: Condvar,
    stats: Mutex<HelperStats>,
    /// False once the thread has left its loop (stopped, or panicked).
    running: AtomicBool,
}

/// A cache's helper (on or off). Dropping it stops and joins the thread.
pub struct Helper {
    state: HelperState,
    on: bool,
    min_bytes: usize,
    /// The system's page size (events carry page-aligned ranges, as the cache keeps them).
    page: usize,
    shared: Option<Arc<Shared>>,
    /// Taken by the first `stop` (or the drop).
    thread: Mutex<Option<crate::rt::raw_thread::RawThread>>,
    pid: u32,
    /// Subscribes `Shared::unmaps` to the monitor's events.
    _unmaps: Option<Subscription>,
}

static NEXT_TID: AtomicU32 = AtomicU32::new(1);

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 && (p as usize).is_power_of_two() {
        p as usize
    } else {
        4096
    }
}

thread_local! {
    static TID: Cell<u32> = const { Cell::new(0) };
}

/// This thread's number for the predictor's per-thread windows.
#[inline]
fn tid() -> u32 {
    TID.try_with(|t| {
        let v = t.get();
        if v != 0 {
            return v;
        }
        let v = NEXT_TID.fetch_add(1, Ordering::Relaxed).max(1);
        t.set(v);
        v
    })
    .unwrap_or(0)
}

impl Helper {
    /// A helper that does not run (`reason` shows in the stats and `fh_info`).
    pub fn off(reason: impl Into<String>) -> Helper {
        Helper {
            state: HelperState::Off {
                reason: reason.into(),
            },
            on: false,
            min_bytes: usize::MAX,
            page: page_size(),
            shared: None,
            thread: Mutex::new(None),
            pid: std::process::id(),
            _unmaps: None,
        }
    }

    /// Start a helper for `cache`, or not, as `cfg.placement` decides. The cache's backend
    /// should be wrapped in `helper::FlaggingPinner` (see `helper::wrap_backend`), so the helper
    /// knows which registrations made their caller pin.
    pub fn start(cache: &Arc<Cache>, mut cfg: HelperConfig) -> Helper {
        cfg.planner.page_shift = page_size().trailing_zeros();
        let cpu = match placement::decide(cfg.placement) {
            Ok(cpu) => cpu,
            Err(reason) => return Helper::off(reason),
        };
        // Before the first time is taken (the callers' events, the calibration below).
        clock::select(cfg.clock);
        // Its pins ahead are safe only while the patched unmaps log themselves and wait for them.
        super::pins_ahead::install_unmap_windows();
        let unmaps = Arc::new(Unmaps {
            ring: ArrayQueue::new(1024),
            overflow: AtomicBool::new(false),
            forked: AtomicBool::new(false),
        });
        let subscription = crate::monitor::subscribe(unmaps.clone() as Arc<dyn MemoryListener>);
        let shared = Arc::new(Shared {
            events: EventQueue::new(EVENT_CAPACITY),
            unmaps,
            stop: Mutex::new(false),
            wake: Condvar::new(),
            stats: Mutex::new(HelperStats::default()),
            running: AtomicBool::new(true),
        });
        let (c, s) = (cache.clone(), shared.clone());
        // A plain pthread: see `raw_thread.rs` (a std thread could not start in a child forked
        // while another thread started or ended one).
        let spawned = crate::rt::raw_thread::spawn(c"fh-helper", move || {
            // The library's own thread: its unmaps never wait for another helper's pin ahead
            // (two helpers could each wait for the other's), nor for the revoke worker.
            crate::rt::inside::mark_thread();
            let res =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(&c, &s, cfg, cpu)));
            s.running.store(false, Ordering::Release);
            // Whatever happened, nothing handed over stays pinned for nobody.
            c.unpin_deferred();
            drop(res);
        });
        let thread = match spawned {
            Ok(t) => t,
            Err(e) => return Helper::off(format!("could not start the thread: {e}")),
        };
        cache.defer_unpins();
        Helper {
            state: HelperState::On { cpu },
            on: true,
            min_bytes: cfg.min_bytes.max(1),
            page: page_size(),
            shared: Some(shared),
            thread: Mutex::new(Some(thread)),
            pid: std::process::id(),
            _unmaps: Some(subscription),
        }
    }

    pub fn state(&self) -> &HelperState {
        &self.state
    }

    /// Running (started, its thread has not stopped, and this is the process that started it).
    pub fn is_on(&self) -> bool {
        self.on
            && !self.in_forked_child()
            && self
                .shared
                .as_ref()
                .is_some_and(|s| s.running.load(Ordering::Acquire))
    }

    /// `cache.register`, told to the helper. `site` identifies the call site (the C API passes
    /// the caller's return address).
    #[inline]
    pub fn register(
        &self,
        cache: &Cache,
        site: usize,
        addr: usize,
        len: usize,
        access: Access,
    ) -> Result<Registration, CacheError> {
        if !self.on || len < self.min_bytes {
            return cache.register(addr, len, access);
        }
        self.register_tracked(cache, site, addr, len, access)
    }

    #[inline(never)]
    fn register_tracked(
        &self,
        cache: &Cache,
        site: usize,
        addr: usize,
        len: usize,
        access: Access,
    ) -> Result<Registration, CacheError> {
        pin_flag::clear();
        let t0 = now_ns();
        let r = cache.register(addr, len, access)?;
        let t1 = now_ns();
        // Peek, not take: a caller around this one (the shim) reads the same flag after.
        let pinned_here = pin_flag::peek();
        if let Some(s) = &self.shared {
            let page = self.page;
            s.events.push(Event::Use(Use {
                tid: tid(),
                site,
                key: Key {
                    start: addr & !(page - 1),
                    end: (addr + len).next_multiple_of(page),
                    access: access.0,
                },
                handle: r.handle,
                t: t0,
                wait_ns: t1.saturating_sub(t0),
                pinned_here,
            }));
        }
        Ok(r)
    }

    /// `cache.deregister`. The helper is not told: it sees the handle go (`releases.rs`).
    #[inline]
    pub fn deregister(&self, cache: &Cache, handle: u64) -> Result<(), CacheError> {
        cache.deregister(handle)
    }

    /// Waits up to `timeout` for the thread to finish its start (the cost model's calibration,
    /// whose pins are not the program's) and publish its first counters. False if it did not
    /// (or the helper is off).
    pub fn wait_started(&self, timeout: Duration) -> bool {
        let t = std::time::Instant::now();
        while self.shared.is_some() && self.stats().elapsed_ns == 0 {
            if t.elapsed() >= timeout {
                return false;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        self.shared.is_some()
    }

    /// Whether this is a child forked from the process that made the helper: its thread stayed
    /// in the parent, and the parent's threads may have held its locks at the fork.
    pub(crate) fn in_forked_child(&self) -> bool {
        std::process::id() != self.pid
    }

    /// The latest counters the thread published (zeros when off, and in a forked child: the
    /// counters' mutex may have been inherited locked, with no thread left to unlock it).
    pub fn stats(&self) -> HelperStats {
        match &self.shared {
            Some(_) if self.in_forked_child() => HelperStats::default(),
            Some(s) => {
                let mut st = *s.stats.lock().unwrap_or_else(|e| e.into_inner());
                st.events_dropped = s.events.dropped();
                st
            }
            None => HelperStats::default(),
        }
    }
}

impl Helper {
    /// Stops the thread and waits until it has ended (it may be pinning ahead right now), for an
    /// owner that must be sure nothing runs any more while the helper itself may live on (the
    /// shim, before the real `ibv_dealloc_pd`: other threads may still hold this cache).
    /// Idempotent; nothing in a forked child (the thread stayed in the parent).
    pub fn stop(&self) {
        if self.in_forked_child() {
            return;
        }
        let t = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take();
        let Some(t) = t else { return };
        if let Some(s) = &self.shared {
            *s.stop.lock().unwrap_or_else(|e| e.into_inner()) = true;
            s.wake.notify_all();
        }
        if t.is_current() {
            std::mem::forget(t); // dropped by its own thread: it ends when it returns
        } else {
            t.join();
        }
    }
}

impl Drop for Helper {
    fn drop(&mut self) {
        if self.in_forked_child() {
            // A forked child: the thread stayed in the parent (and a parent thread may have held
            // the lock: `get_mut` takes none).
            let t = self
                .thread
                .get_mut()
                .unwrap_or_else(|e| e.into_inner())
                .take();
            std::mem::forget(t);
            return;
        }
        self.stop();
    }
}

/// Pinned bytes integrated over time (left rectangles between samples).
struct Integral {
    t0: u64,
    last_t: u64,
    last_b: u64,
    sum: f64,
}

impl Integral {
    fn sample(&mut self, t: u64, bytes: u64) {
        if t > self.last_t {
            self.sum += self.last_b as f64 * (t - self.last_t) as f64;
            self.last_t = t;
        }
        self.last_b = bytes;
    }
    fn average(&self) -> u64 {
        let span = self.last_t.saturating_sub(self.t0);
        if span == 0 {
            self.last_b
        } else {
            (self.sum / span as f64) as u64
        }
    }
}

/// Tells the planner of the unmaps reported since the last call. Returns the unmap log's mark
/// from before the ring was emptied, at or before every patched unmap then still in flight: each
/// one logged before it had reported (pushed to the ring) before it ended, so it is in the
/// planner now, and `prefetch_checked` looks at every one logged since.
fn take_unmaps(s: &Shared, p: &mut Planner) -> u64 {
    let synced = unmap_log::mark_before_unfinished();
    if s.unmaps.overflow.swap(false, Ordering::Relaxed) {
        while s.unmaps.ring.pop().is_some() {}
        p.on_unmapped_everything();
    }
    while let Some((a, b)) = s.unmaps.ring.pop() {
        p.on_unmapped(a, b);
    }
    synced
}

/// Takes the callers' events, then tells the planner of the releases seen since the last look.
fn take_events(s: &Shared, p: &mut Planner, releases: &mut Releases, cache: &Cache) {
    // Bounded, so a flood of events cannot starve a due pin.
    for _ in 0..EVENT_CAPACITY {
        let Some(ev) = s.events.pop() else { break };
        if let Event::Use(u) = &ev {
            releases.watch(u.handle, u.t);
        }
        p.on_event(ev);
    }
    if releases.is_empty() {
        return;
    }
    let now = now_ns();
    releases.poll(
        now,
        |h| cache.is_live(h),
        |handle| p.on_event(Event::Release { handle, t: now }),
    );
}

fn run(cache: &Arc<Cache>, s: &Shared, cfg: HelperConfig, cpu: Option<usize>) {
    if let Some(c) = cpu {
        let _ = placement::bind_current_thread(c);
    }
    // SAFETY: prctl(PR_SET_TIMERSLACK) takes plain integers and affects this thread only: 1 us
    // instead of 50 us of timer slack, so the helper wakes when it planned to.
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1000 as libc::c_ulong, 0, 0, 0) };
    let cost = if cfg.calibrate {
        let budget = (cache.limits().max_pinned / 4).min(1 << 20);
        cost::calibrate(&*cache.backend(), budget)
    } else {
        CostModel::default()
    };
    let mut planner = Planner::new(cfg.planner, cost);
    // A new handle is looked at on the next wake-up or so; one held for long, once a second.
    let mut releases = Releases::new(cfg.poll_ns / 4, RELEASE_LOOK_MAX_NS);
    let start = now_ns();
    let mut integral = Integral {
        t0: start,
        last_t: start,
        last_b: cache.pinned_bytes(),
        sum: 0.0,
    };
    let mut deferred = 0u64;
    let mut intended = start;
    loop {
        let woke = now_ns();
        planner.observe_wake(intended, woke);
        if *s.stop.lock().unwrap_or_else(|e| e.into_inner()) {
            break;
        }
        deferred += cache.unpin_deferred() as u64;
        cache.process_invalidations();
        take_events(s, &mut planner, &mut releases, cache);
        let mut synced = take_unmaps(s, &mut planner);
        while let Some(a) = planner.poll(now_ns()) {
            let t0 = now_ns();
            match a {
                Action::Pin(k) => {
                    let r = prefetch_checked(cache, k, synced).map_err(|_| ());
                    planner.pinned(k, r, t0, now_ns());
                }
                Action::Unpin(k) => {
                    let bytes = cache.evict_range(k.start, k.len());
                    planner.unpinned(k, bytes, t0, now_ns());
                }
            }
            integral.sample(now_ns(), cache.pinned_bytes());
            take_events(s, &mut planner, &mut releases, cache);
            synced = take_unmaps(s, &mut planner);
        }
        let now = now_ns();
        integral.sample(now, cache.pinned_bytes());
        publish(s, &planner, &integral, deferred, cache);
        let next = planner
            .next_wakeup()
            .unwrap_or(u64::MAX)
            .min(now + cfg.poll_ns);
        intended = next.max(now);
        if next > now {
            let g = s.stop.lock().unwrap_or_else(|e| e.into_inner());
            if !*g {
                let _ = s.wake.wait_timeout(g, Duration::from_nanos(next - now));
            }
        }
    }
    deferred += cache.unpin_deferred() as u64;
    integral.sample(now_ns(), cache.pinned_bytes());
    publish(s, &planner, &integral, deferred, cache);
}

/// `Cache::prefetch`, guarded against unmaps racing with it (`CacheError::Busy`: raced, nothing
/// stays pinned; else as `Cache::prefetch`). The pin is announced first
/// (`helper::pins_ahead`): a patched unmap of the range that begins from then on waits until this
/// returns, so the pin, and its undo if it raced, touch the old memory only, never a mapping the
/// application put there next. Then the unmap log (`helper::unmap_log`): a range that a patched
/// unmap is carrying out, or that one began on since the planner last took the unmap reports
/// (`synced`, from `take_unmaps`), is not pinned; a pin made while an overlapping unmap began is
/// undone before the region is published (its invalidation may have run before the region was in
/// the index). An unmap by a raw system call during the pin is reported by userfaultfd: the
/// cache watches a region's range from before its pin (`cache::miss`).
///
/// Why since `synced` and not since now: an unmap that was running when the planner looked at
/// the reports, or began after, and ended before this pin (its report not taken yet) left the
/// key's range to whatever the application maps there next. A pin of it then covered part of a
/// new mapping: mlock and the userfaultfd watch split that mapping, and the application's
/// `mremap` of it failed with EFAULT (seen in `case6_stale_threads_helper` under
/// AddressSanitizer, about 1 run in 6; the announcement closed the rest, about 1 in 30).
pub fn prefetch_checked(cache: &Cache, k: Key, synced: u64) -> Result<bool, CacheError> {
    let (s, e) = (k.start, k.end);
    let Some(_announced) = pins_ahead::enter(s, e) else {
        return Err(CacheError::Busy);
    };
    if unmap_log::in_flight_overlapping(s, e) || unmap_log::begun_since(synced, s, e) {
        return Err(CacheError::Busy);
    }
    let still_valid = || !unmap_log::begun_since(synced, s, e);
    cache.prefetch(s, e - s, Access(k.access), &still_valid)
}

fn publish(s: &Shared, p: &Planner, i: &Integral, deferred: u64, cache: &Cache) {
    let line = |f: &cost::Fit| f.line().unwrap_or(p.cost.fallback);
    let st = HelperStats {
        planner: p.stats(),
        events_dropped: s.events.dropped(),
        deferred_unpins: deferred,
        avg_pinned_bytes: i.average(),
        peak_pinned_bytes: cache.pinned_peak(),
        elapsed_ns: i.last_t - i.t0,
        pin_line: line(&p.cost.pin),
        unpin_line: line(&p.cost.unpin),
        slack_ns: p.slack(),
    };
    *s.stats.lock().unwrap_or_else(|e| e.into_inner()) = st;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::Limits;
    use crate::pin::counting::CountingPinner;

    /// An unmap of a key's memory that began, or was still running, when the planner last took
    /// the unmap reports (its report may not be in the ring yet) stops the pin of that key, also
    /// when it has ended by the pin. With a fresh mark at the pin the first was pinned; with a
    /// plain mark at the take, the second.
    #[test]
    fn a_key_unmapped_since_the_planners_last_look_is_not_pinned() {
        let counting = Arc::new(CountingPinner::new());
        let limits = Limits {
            max_pinned: 1 << 30,
            max_regions: 64,
        };
        let cache = Cache::new(counting.clone(), limits, None);
        // An address range nothing in this process maps.
        let k = Key {
            start: 0x41_0000_0000,
            end: 0x41_0001_0000,
            access: Access::LOCAL_WRITE.0,
        };
        let synced = unmap_log::mark_before_unfinished();
        let seq = unmap_log::begin(k.start + 0x8000, k.end + 0x8000);
        unmap_log::end(seq);
        assert_eq!(prefetch_checked(&cache, k, synced), Err(CacheError::Busy));
        // One in flight when the helper took the reports (its report not pushed yet), ended
        // before the pin.
        let seq = unmap_log::begin(k.start, k.start + 0x1000);
        let synced = unmap_log::mark_before_unfinished();
        unmap_log::end(seq);
        assert_eq!(prefetch_checked(&cache, k, synced), Err(CacheError::Busy));
        assert_eq!(counting.pins(), 0);
        // Nothing overlapping since a newer look: pinned. (Retried: other tests' unmaps may fill
        // the log's 64 slots between the mark and the check, which counts as raced.)
        let ok = (0..100)
            .any(|_| prefetch_checked(&cache, k, unmap_log::mark_before_unfinished()) == Ok(true));
        assert!(ok);
        assert_eq!(counting.pins(), 1);
    }
}
