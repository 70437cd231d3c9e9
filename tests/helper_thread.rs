//! The helper thread (Li et al., "Scalable Memory Registration for High Performance Networks Using
//! Helper Threads" (CF 2011)) on a real thread over the counting double: it pins ahead of periodic
//! uses, unpins in between, takes over the unpins of `deregister`, and never hands out a region
//! that an unmap raced with, under 16 threads. Forced on (`Placement::Anywhere`): the machines this
//! runs on rarely have an idle core.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use firehose::cache::{Cache, Limits};
use firehose::helper::clock::ClockChoice;
use firehose::helper::planner::PlannerConfig;
use firehose::helper::unmap_log;
use firehose::helper::{self, Helper, HelperConfig, HelperState, Placement};
use firehose::pin::counting::CountingPinner;
use firehose::pin::{Access, PinError, Pinned, Pinner};

const MIB: usize = 1 << 20;
const RW: Access = Access(1 | 2);

/// A fixed 1 ms slack (no adaptation to wake-up lateness): on a loaded machine the adaptive one
/// grows until the helper hardly unpins at all, and these tests must see it work. No bounds in
/// units of pin costs either: uncalibrated, the cost model's fallback line (20 us + 1 us a page,
/// times its margin) makes a 1 MiB pin 0.4 ms, and 16 of them are longer than these tests'
/// periods (the bounds are the planner's, tested in `helper::planner`).
fn cfg() -> HelperConfig {
    HelperConfig {
        placement: Placement::Anywhere,
        min_bytes: 4096,
        planner: PlannerConfig {
            slack_ns: 1_000_000,
            max_lateness_ns: 0,
            unpredicted_idle_pins: 0,
            min_unpinned_pins: 0,
            ..Default::default()
        },
        poll_ns: 200_000,
        calibrate: false,
        // The TSC here (the other helper tests run on `auto`, which picks clock_gettime on a
        // host with a TSC clocksource): both sources drive a real helper in the test command.
        clock: ClockChoice::Tsc,
    }
}

/// One test at a time: they are timing-sensitive and each runs many threads.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn limits() -> Limits {
    Limits {
        max_pinned: 1 << 40,
        max_regions: 1 << 16,
    }
}

/// The counting double, slower: a pin takes its pages (the double's serial) at once and returns
/// `delay` later, as `ibv_reg_mr` pins before it returns. Widens every race with an unmap.
struct Slow {
    inner: Arc<CountingPinner>,
    delay: Duration,
}

thread_local! {
    /// Set while the test thread is inside `deregister`: an unpin then is a violation.
    static IN_DEREGISTER: Cell<bool> = const { Cell::new(false) };
}

static UNPINS_IN_DEREGISTER: AtomicU64 = AtomicU64::new(0);

impl Pinner for Slow {
    fn pin(&self, addr: usize, len: usize, access: Access) -> Result<Pinned, PinError> {
        let r = self.inner.pin(addr, len, access);
        let t = Instant::now();
        while t.elapsed() < self.delay {
            std::hint::spin_loop();
        }
        r
    }
    fn unpin(&self, pinned: Pinned, addr: usize, len: usize) {
        if IN_DEREGISTER.with(|f| f.get()) {
            UNPINS_IN_DEREGISTER.fetch_add(1, Ordering::Relaxed);
        }
        self.inner.unpin(pinned, addr, len)
    }
    fn name(&self) -> &'static str {
        "slow-counting"
    }
}

fn setup(delay: Duration) -> (Arc<CountingPinner>, Arc<Cache>, Helper) {
    let counting = Arc::new(CountingPinner::new());
    let slow = Arc::new(Slow {
        inner: counting.clone(),
        delay,
    });
    let cache = Cache::new(helper::wrap_backend(slow), limits(), None);
    let h = Helper::start(&cache, cfg());
    assert_eq!(h.state(), &HelperState::On { cpu: None });
    #[cfg(target_arch = "x86_64")]
    assert_eq!(helper::clock::selected().map(|s| s.source()), Some("tsc"));
    (counting, cache, h)
}

/// One buffer used every 8 ms: once learned, the helper unpins it after each use and pins it
/// again before the next, so callers hit and nothing stays pinned in between. Timing on a shared,
/// loaded 2-core machine (a 4 ms sleep was seen to last 30): up to three attempts, lenient bounds.
#[test]
fn pins_ahead_of_a_periodic_use_and_unpins_in_between() {
    let _g = serial();
    let mut last = String::new();
    for _attempt in 0..3 {
        let (counting, cache, h) = setup(Duration::from_micros(50));
        let addr = 0x10_0000_0000usize;
        let mut idle_zero = 0;
        for i in 0..60 {
            let r = h.register(&cache, 0x1234, addr, MIB, RW).unwrap();
            h.deregister(&cache, r.handle).unwrap();
            std::thread::sleep(Duration::from_millis(4));
            if i > 10 && counting.live_bytes() == 0 {
                idle_zero += 1; // unpinned while idle
            }
            std::thread::sleep(Duration::from_millis(4));
        }
        std::thread::sleep(Duration::from_millis(5));
        let s = h.stats();
        let p = s.planner;
        assert_eq!(p.uses, 60);
        assert_eq!(cache.stats().prefetched, p.helper_pins);
        drop(h);
        drop(cache);
        assert_eq!((counting.live_count(), counting.bad_unpins()), (0, 0));
        if p.early >= 15
            && p.helper_unpins >= 15
            && p.helper_pins >= 15
            && idle_zero >= 10
            && s.avg_pinned_bytes < MIB as u64
        {
            return;
        }
        last = format!("idle_zero {idle_zero}, {s:?}");
    }
    panic!("the helper did not pin ahead / unpin in three attempts: {last}");
}

/// The invalidation guarantee for regions the helper pins, 16 threads: each thread uses its own
/// buffer periodically (so the helper pins it ahead), and now and then "unmaps and remaps" it
/// just before the next use, the way a patched munmap does (log the unmap, invalidate, then the
/// system call, then close the log entry). Every registration after that must come from a pin
/// made after the unmap finished. Checked failing with the unmap-log checks of the helper's
/// prefetch removed (`prefetch_checked` in src/helper/thread.rs).
#[test]
fn helper_pinned_regions_are_never_handed_out_stale_16_threads() {
    let _g = serial();
    let (counting, cache, h) = setup(Duration::from_micros(200));
    let h = Arc::new(h);
    let stale = Arc::new(Mutex::new(Vec::new()));
    let unmaps = Arc::new(AtomicU64::new(0));
    let threads: Vec<_> = (0..16usize)
        .map(|t| {
            let (c, h, counting, stale, unmaps) = (
                cache.clone(),
                h.clone(),
                counting.clone(),
                stale.clone(),
                unmaps.clone(),
            );
            std::thread::spawn(move || {
                let addr = 0x20_0000_0000usize + t * 64 * MIB;
                let mut after: Option<u64> = None;
                let mut rng = fastrand::Rng::with_seed(0x9E37_79B9u64.wrapping_mul(t as u64 + 1));
                for i in 0..120u64 {
                    let r = h.register(&c, 0x5000 + t, addr, MIB, RW).unwrap();
                    if let Some(s) = after {
                        // `lkey` is the double's serial of the pin that serves this.
                        if u64::from(r.lkey) <= s {
                            stale.lock().unwrap().push((t, i, r.lkey, s));
                        }
                    }
                    h.deregister(&c, r.handle).unwrap();
                    let jitter = rng.u64(..);
                    // Period ~6 ms; every third use is preceded by an unmap at a random point of
                    // the last 3 ms, where the helper's pin ahead of the use falls.
                    let before = 1500 + jitter % 1500;
                    std::thread::sleep(Duration::from_micros(6000 - before));
                    if i % 3 == 2 {
                        std::thread::sleep(Duration::from_micros(jitter % 1000));
                        let seq = unmap_log::begin(addr, addr + MIB);
                        c.invalidate(addr, MIB);
                        // The system call: the old pages go some time after the invalidation.
                        std::thread::sleep(Duration::from_micros(200));
                        after = Some(counting.pins());
                        unmap_log::end(seq);
                        unmaps.fetch_add(1, Ordering::Relaxed);
                        std::thread::sleep(Duration::from_micros(before.saturating_sub(1200)));
                    } else {
                        after = None;
                        std::thread::sleep(Duration::from_micros(before));
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let s = h.stats();
    eprintln!("{s:?}");
    let stale = stale.lock().unwrap();
    assert!(
        stale.is_empty(),
        "stale registrations handed out: {stale:?}"
    );
    assert!(unmaps.load(Ordering::Relaxed) >= 16 * 39);
    // The helper did pin ahead (the test exercised its prefetch, not only the callers' misses).
    assert!(s.planner.helper_pins >= 50, "{:?}", s.planner);
    drop(h);
    drop(cache);
    assert_eq!((counting.live_count(), counting.bad_unpins()), (0, 0));
}

/// `deregister` never unpins on the caller's thread with a helper: a detached region's last
/// release hands it to the helper. 16 threads register overlapping ranges and invalidate them
/// while held; every pin is unpinned exactly once, none inside a `deregister`.
#[test]
fn deregister_hands_unpins_to_the_helper_16_threads() {
    let _g = serial();
    let (counting, cache, h) = setup(Duration::ZERO);
    let h = Arc::new(h);
    let threads: Vec<_> = (0..16usize)
        .map(|t| {
            let (c, h) = (cache.clone(), h.clone());
            std::thread::spawn(move || {
                let base = 0x30_0000_0000usize + (t % 4) * 16 * MIB;
                // At most 16 x 40 regions are detached while held: fewer than the hand-over
                // queue holds, so none may be unpinned by its releasing caller even if the
                // helper does not get to run meanwhile.
                for i in 0..400usize {
                    let addr = base + (i % 7) * 64 * 1024;
                    let r = h.register(&c, t, addr, 256 * 1024, RW).unwrap();
                    if i % 10 == 0 {
                        c.invalidate(addr, 4096);
                        // The drain (another thread's register) detaches it while held.
                        let _ = c.process_invalidations();
                    }
                    IN_DEREGISTER.with(|f| f.set(true));
                    h.deregister(&c, r.handle).unwrap();
                    IN_DEREGISTER.with(|f| f.set(false));
                    if i % 50 == 0 {
                        std::thread::sleep(Duration::from_micros(200));
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let t = Instant::now();
    while h.stats().deferred_unpins == 0 && t.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(2));
    }
    let s = h.stats();
    assert_eq!(UNPINS_IN_DEREGISTER.load(Ordering::Relaxed), 0);
    assert!(s.deferred_unpins > 0, "{s:?}");
    drop(h);
    // Anything still queued is unpinned when the cache goes.
    drop(cache);
    assert_eq!((counting.live_count(), counting.bad_unpins()), (0, 0));
}

/// Callers do not report releases: the helper sees each handle it saw used go, whoever
/// deregisters it (`Helper::deregister` or the cache directly), exactly once, under 16 threads
/// that hold up to three registrations at a time. Fails when the helper stops looking
/// (`releases.rs`'s `poll`) or looks only once.
#[test]
fn every_release_reaches_the_planner_16_threads() {
    let _g = serial();
    let (counting, cache, h) = setup(Duration::ZERO);
    let h = Arc::new(h);
    const OPS: usize = 300;
    let threads: Vec<_> = (0..16usize)
        .map(|t| {
            let (c, h) = (cache.clone(), h.clone());
            std::thread::spawn(move || {
                let base = 0x40_0000_0000usize + t * 64 * MIB;
                let mut held = std::collections::VecDeque::new();
                for i in 0..OPS {
                    let addr = base + (i % 5) * MIB;
                    held.push_back(h.register(&c, 0x500 + i % 3, addr, 64 * 1024, RW).unwrap());
                    if held.len() == 3 || i + 1 == OPS {
                        while let Some(r) = held.pop_front() {
                            if r.handle % 7 == 0 {
                                c.deregister(r.handle).unwrap();
                            } else {
                                h.deregister(&c, r.handle).unwrap();
                            }
                        }
                    }
                    if i % 40 == 0 {
                        std::thread::sleep(Duration::from_micros(300));
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let t = Instant::now();
    let done = |s: &helper::HelperStats| {
        s.planner.uses + s.events_dropped == (16 * OPS) as u64
            && s.planner.releases == s.planner.uses
    };
    while !done(&h.stats()) && t.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(2));
    }
    let s = h.stats();
    assert!(done(&s), "{s:?}");
    assert!(s.planner.uses > 0);
    assert_eq!(s.planner.unknown_releases, 0, "{s:?}");
    // Nothing is reported twice: a second look finds nothing more.
    std::thread::sleep(Duration::from_millis(5));
    assert_eq!(h.stats().planner.releases, s.planner.releases);
    drop(h);
    drop(cache);
    assert_eq!((counting.live_count(), counting.bad_unpins()), (0, 0));
}

#[test]
fn placement_off_says_why() {
    let _g = serial();
    let cache = Cache::new(
        helper::wrap_backend(Arc::new(CountingPinner::new())),
        limits(),
        None,
    );
    let h = Helper::start(
        &cache,
        HelperConfig {
            placement: Placement::Cpu(100_000),
            ..cfg()
        },
    );
    match h.state() {
        HelperState::Off { reason } => assert!(reason.contains("affinity"), "{reason}"),
        s => panic!("{s:?}"),
    }
    assert!(!h.is_on());
    // Off: the front is the plain cache.
    let r = h.register(&cache, 1, 0x40_0000_0000, MIB, RW).unwrap();
    h.deregister(&cache, r.handle).unwrap();
    assert_eq!(cache.stats().misses, 1);
    assert_eq!(h.stats().planner.uses, 0);
}

/// `stop` ends the thread and waits for it while the helper lives on (the shim stops a domain's
/// helper before the real `ibv_dealloc_pd`, which other threads' lookups may outlive); twice is
/// fine, and so is the drop after it.
#[test]
fn stop_ends_the_thread_and_is_idempotent() {
    let _g = serial();
    let (_counting, cache, h) = setup(Duration::ZERO);
    assert!(h.is_on());
    h.stop();
    assert!(!h.is_on(), "the thread has ended");
    h.stop();
    let r = cache.register(0x10_0000, 4096, Access(1)).unwrap();
    cache.deregister(r.handle).unwrap();
    drop(h);
}
