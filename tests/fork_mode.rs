//! Registrations a cache keeps, across `fork` in the parent (`FH_FORK_MODE`, `pin/fork_mode.rs`).
//!
//! The backend here does to a registered range what libibverbs' fork protection does on a kernel
//! that does not copy pinned pages at fork: `MADV_DONTFORK` at registration, `MADV_DOFORK` at
//! deregistration. A buffer the application registered and released, but the cache kept, is then
//! missing in a child: the child faults where it would have read its data without the cache.
//!
//! - `Release` deregisters idle registrations in the atfork prepare handler: the child reads the
//!   buffer. With `Keep` the same child dies of SIGSEGV (shown here, so the check can fail).
//! - `Retire` also detaches every cached registration in the parent after the fork: the next
//!   request for a range pins anew; a registration held across the fork stays valid for its
//!   holder and is deregistered at its release.
//! - 16 threads register and release while the main thread forks (release and retire): no fork
//!   hangs, each child still reads the buffer released just before its fork, and the pins balance
//!   at the end.
//! - With the helper thread, a region it is deregistering when the fork comes is waited for.
//! - A backend that panics in the prepare handler leaves the registry usable (found by review:
//!   the cache's unsubscribe then waited forever).
//!
//! No device: the verbs backends resolve `auto` from libibverbs (unit tests in
//! `pin/fork_mode.rs`); here the mode is set on the cache.

mod fork_util;
mod monitor_util;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use firehose::cache::{Cache, Limits};
use firehose::helper::{self, Helper, HelperConfig, Placement};
use firehose::monitor::{self, MemoryListener, Subscription};
use firehose::pin::fork_mode::ForkMode;
use firehose::pin::{Access, PinError, Pinned, Pinner};
use fork_util::{first_cpu, fork_run, say, wait_child};

const LEN: usize = 64 << 10;
const RW: Access = Access(1 | 2 | 4);

/// Fork protection as libibverbs applies it, plus counts. The unpin of `slow_addr` takes
/// 300 ms (a big MR's deregistration) and says when it started; with `panic_next` set, the
/// next unpin panics (after applying nothing).
#[derive(Default)]
struct ForkProtecting {
    pins: AtomicUsize,
    unpins: AtomicUsize,
    slow_addr: AtomicUsize,
    slow_started: AtomicBool,
    panic_next: AtomicBool,
}

impl ForkProtecting {
    fn live(&self) -> usize {
        self.pins.load(SeqCst) - self.unpins.load(SeqCst)
    }
}

fn advise(addr: usize, len: usize, advice: libc::c_int) -> i32 {
    // SAFETY: advice on a range the caller pins or unpins; DONTFORK/DOFORK change no data.
    unsafe { libc::madvise(addr as *mut libc::c_void, len, advice) }
}

impl Pinner for ForkProtecting {
    fn pin(&self, addr: usize, len: usize, _access: Access) -> Result<Pinned, PinError> {
        if advise(addr, len, libc::MADV_DONTFORK) != 0 {
            return Err(PinError::Failed(libc::EFAULT));
        }
        let n = self.pins.fetch_add(1, SeqCst) as u32 + 1;
        Ok(Pinned {
            token: addr,
            lkey: n,
            rkey: n,
        })
    }
    fn unpin(&self, _pinned: Pinned, addr: usize, len: usize) {
        if self.panic_next.swap(false, SeqCst) {
            panic!("the backend failed to unpin");
        }
        if addr == self.slow_addr.load(SeqCst) {
            self.slow_started.store(true, SeqCst);
            std::thread::sleep(Duration::from_millis(300));
        }
        advise(addr, len, libc::MADV_DOFORK);
        self.unpins.fetch_add(1, SeqCst);
    }
    fn name(&self) -> &'static str {
        "fork-protecting"
    }
}

struct Setup {
    cache: Arc<Cache>,
    pinner: Arc<ForkProtecting>,
    _sub: Subscription,
    _serial: std::sync::MutexGuard<'static, ()>,
}

/// One test at a time: a fork in one would reach the others' caches.
static SERIAL: Mutex<()> = Mutex::new(());

/// A cache in `mode`, subscribed (so the atfork handlers reach it).
fn setup(mode: ForkMode) -> Setup {
    setup_with(mode, false)
}

/// `setup`, with the backend wrapped for a helper thread (`helped`; the caller starts it).
fn setup_with(mode: ForkMode, helped: bool) -> Setup {
    let serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let pinner = Arc::new(ForkProtecting::default());
    let backend: Arc<dyn Pinner> = if helped {
        helper::wrap_backend(pinner.clone())
    } else {
        pinner.clone()
    };
    let cache = Cache::new(
        backend,
        Limits {
            max_pinned: 1 << 30,
            max_regions: 1 << 12,
        },
        None,
    );
    cache.set_fork_mode(mode);
    let sub = monitor::subscribe(cache.clone() as Arc<dyn MemoryListener>);
    assert!(sub.is_active());
    Setup {
        cache,
        pinner,
        _sub: sub,
        _serial: serial,
    }
}

/// Ends the whole test process (exit 42) unless `done` is set within `secs`: a fork handler
/// that hangs must fail the run, not stall it.
fn watchdog(what: &'static str, secs: u64) -> Arc<AtomicBool> {
    let done = Arc::new(AtomicBool::new(false));
    let d = done.clone();
    std::thread::spawn(move || {
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(secs) {
            if d.load(SeqCst) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        say(&format!("\nHANG: {what} (not done in {secs} s)\n"));
        // SAFETY: leaving the process at once is the point.
        unsafe { libc::_exit(42) };
    });
    done
}

/// The raw wait status of child `pid`.
fn wait_status(pid: libc::pid_t) -> i32 {
    let mut status = 0;
    // SAFETY: waiting for our own child (it ends by itself: it reads 64 KiB).
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    status
}

/// A fresh anonymous mapping of `len` bytes, every byte `fill`.
fn buffer(len: usize, fill: u8) -> usize {
    let p = monitor_util::map(len);
    // SAFETY: just mapped, `len` bytes, ours.
    unsafe { std::ptr::write_bytes(p as *mut u8, fill, len) };
    p
}

/// In a child: 0 when every byte of the buffer is `fill` (a missing page faults first).
fn child_reads(addr: usize, len: usize, fill: u8) -> i32 {
    // SAFETY: mapped in the parent; in the child only if it was not MADV_DONTFORK.
    let bytes = unsafe { std::slice::from_raw_parts(addr as *const u8, len) };
    if bytes.iter().all(|&b| b == fill) {
        0
    } else {
        1
    }
}

/// Register and release: the cache keeps the registration (idle).
fn register_and_release(c: &Cache, addr: usize) {
    let r = c.register(addr, LEN, RW).expect("register");
    c.deregister(r.handle).expect("deregister");
}

#[test]
fn release_gives_a_child_the_pages_of_idle_registrations() {
    let s = setup(ForkMode::Release);
    let buf = buffer(LEN, 0x5a);
    register_and_release(&s.cache, buf);
    assert_eq!(s.pinner.live(), 1, "cached while idle");
    let pid = fork_run(|| child_reads(buf, LEN, 0x5a));
    wait_child(pid).expect("the child reads the released buffer");
    assert_eq!(s.pinner.live(), 0, "deregistered before the fork");
    assert_eq!(s.cache.stats().regions, 0);
    // The cache still serves the parent: a miss, then cached again.
    register_and_release(&s.cache, buf);
    assert_eq!(s.pinner.pins.load(SeqCst), 2);
    assert_eq!(s.pinner.live(), 1);
}

#[test]
fn keep_leaves_the_child_without_them() {
    // What `Release` is for: with the registration kept, the child has no page there.
    let s = setup(ForkMode::Keep);
    let buf = buffer(LEN, 0x3c);
    register_and_release(&s.cache, buf);
    let pid = fork_run(|| child_reads(buf, LEN, 0x3c));
    let status = wait_status(pid);
    assert!(
        libc::WIFSIGNALED(status) && libc::WTERMSIG(status) == libc::SIGSEGV,
        "the child must fault on the DONTFORK range: status {status:#x}"
    );
    assert_eq!(s.pinner.live(), 1, "Keep leaves the cache alone");
    let r = s.cache.register(buf, LEN, RW).expect("hit");
    assert_eq!(s.pinner.pins.load(SeqCst), 1, "still a hit after the fork");
    s.cache.deregister(r.handle).unwrap();
}

/// A held registration `a` and an idle one `b` across a fork; then both requested again.
/// Returns (pins made after the fork, unpins made after the fork).
fn across_fork(mode: ForkMode) -> (usize, usize, Setup) {
    let s = setup(mode);
    let (a, b) = (buffer(LEN, 1), buffer(LEN, 2));
    let held = s.cache.register(a, LEN, RW).unwrap();
    register_and_release(&s.cache, b);
    let pid = fork_run(|| 0);
    wait_child(pid).unwrap();
    let (pins, unpins) = (s.pinner.pins.load(SeqCst), s.pinner.unpins.load(SeqCst));
    let again = s.cache.register(a, LEN, RW).unwrap();
    register_and_release(&s.cache, b);
    // The holder's keys from before the fork are still its own until it releases them.
    s.cache.deregister(held.handle).unwrap();
    s.cache.deregister(again.handle).unwrap();
    (
        s.pinner.pins.load(SeqCst) - pins,
        s.pinner.unpins.load(SeqCst) - unpins,
        s,
    )
}

#[test]
fn retire_makes_the_parent_pin_anew_after_the_fork() {
    let (pins, unpins, s) = across_fork(ForkMode::Retire);
    assert_eq!(pins, 2, "both ranges pinned anew after the fork");
    assert_eq!(
        unpins, 1,
        "the held one, retired, deregistered at its release"
    );
    assert_eq!(s.pinner.live(), 2, "the new ones are cached");
    assert_eq!(s.cache.stats().regions, 2);
    assert!(s.cache.stats().invalidations >= 1);
}

#[test]
fn release_keeps_held_registrations_in_the_cache() {
    let (pins, unpins, s) = across_fork(ForkMode::Release);
    assert_eq!(
        pins, 1,
        "only the idle one, released before the fork, is pinned again"
    );
    assert_eq!(unpins, 0);
    assert_eq!(s.pinner.live(), 2);
}

#[test]
fn release_forks_while_sixteen_threads_register() {
    forks_while_sixteen_threads_register(ForkMode::Release);
}

#[test]
fn retire_forks_while_sixteen_threads_register() {
    forks_while_sixteen_threads_register(ForkMode::Retire);
}

fn forks_while_sixteen_threads_register(mode: ForkMode) {
    const THREADS: usize = 16;
    const FORKS: usize = 40;
    let s = setup(mode);
    let done = watchdog("forks while 16 threads register", 120);
    let stop = Arc::new(AtomicBool::new(false));
    let bufs: Vec<usize> = (0..THREADS * 4).map(|i| buffer(LEN, i as u8)).collect();
    let errors = Arc::new(Mutex::new(Vec::<String>::new()));
    let workers: Vec<_> = (0..THREADS)
        .map(|t| {
            let (c, stop, errors) = (s.cache.clone(), stop.clone(), errors.clone());
            let mine: Vec<usize> = bufs[t * 4..t * 4 + 4].to_vec();
            std::thread::spawn(move || {
                let mut rng = fastrand::Rng::with_seed(t as u64);
                while !stop.load(SeqCst) {
                    let addr = mine[rng.usize(..4)];
                    match c.register(addr, LEN, RW) {
                        Ok(r) => {
                            if r.lkey == 0 {
                                errors.lock().unwrap().push(format!("lkey 0 for {addr:#x}"));
                            }
                            c.deregister(r.handle).unwrap();
                        }
                        Err(e) => errors.lock().unwrap().push(format!("register: {e:?}")),
                    }
                }
            })
        })
        .collect();
    let mine = buffer(LEN, 0x77);
    for _ in 0..FORKS {
        register_and_release(&s.cache, mine);
        let pid = fork_run(|| child_reads(mine, LEN, 0x77));
        if let Err(e) = wait_child(pid) {
            errors.lock().unwrap().push(format!("child: {e}"));
        }
    }
    stop.store(true, SeqCst);
    for w in workers {
        w.join().unwrap();
    }
    let errors = errors.lock().unwrap();
    assert!(
        errors.is_empty(),
        "{} errors, first: {:?}",
        errors.len(),
        errors.first()
    );
    let st = s.cache.stats();
    assert_eq!(st.in_use, 0);
    assert_eq!(
        s.pinner.live() as u64,
        st.regions,
        "every pin is cached or undone"
    );
    s.cache.flush();
    assert_eq!(s.pinner.live(), 0);
    done.store(true, SeqCst);
}

/// The helper takes a released, detached region off its queue and deregisters it (300 ms) when
/// the application forks: the prepare handler waits for that deregistration, so the child has the
/// pages (found by review: the child died of SIGSEGV).
#[test]
fn a_fork_waits_for_the_helpers_unpin_in_flight() {
    let s = setup_with(ForkMode::Retire, true);
    let helper = Helper::start(
        &s.cache,
        HelperConfig {
            placement: Placement::Cpu(first_cpu() as usize),
            calibrate: false,
            ..HelperConfig::default()
        },
    );
    assert!(helper.is_on());
    let done = watchdog("fork with the helper's unpin in flight", 60);
    let buf = buffer(LEN, 0x5a);
    s.pinner.slow_addr.store(buf, SeqCst);
    let held = s.cache.register(buf, LEN, RW).unwrap();
    // A first fork retires the held region (detached at the next call); its release then goes to
    // the helper's queue, not to the backend.
    wait_child(fork_run(|| 0)).unwrap();
    s.cache.process_invalidations();
    s.cache.deregister(held.handle).unwrap();
    let t = Instant::now();
    while !s.pinner.slow_started.load(SeqCst) {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "the helper never unpinned"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    let pid = fork_run(|| child_reads(buf, LEN, 0x5a));
    wait_child(pid).expect("the child reads the buffer released before the fork");
    assert_eq!(s.pinner.live(), 0);
    drop(helper);
    done.store(true, SeqCst);
}

/// A backend that panics while the prepare handler releases: the fork goes on, the other caches
/// are still released, and the panicking cache can be dropped (its unsubscribe does not wait for
/// a notification that never ended).
#[test]
fn a_panicking_backend_in_the_prepare_handler_leaves_the_registry_usable() {
    let s = setup(ForkMode::Release);
    let other = {
        let pinner = Arc::new(ForkProtecting::default());
        let c = Cache::new(
            pinner.clone(),
            Limits {
                max_pinned: 1 << 30,
                max_regions: 16,
            },
            None,
        );
        c.set_fork_mode(ForkMode::Release);
        let sub = monitor::subscribe(c.clone() as Arc<dyn MemoryListener>);
        (c, pinner, sub)
    };
    let done = watchdog("a panic in the prepare handler", 30);
    let (a, b) = (buffer(LEN, 1), buffer(LEN, 2));
    register_and_release(&s.cache, a);
    register_and_release(&other.0, b);
    s.pinner.panic_next.store(true, SeqCst);
    let pid = fork_run(|| child_reads(b, LEN, 2));
    wait_child(pid).expect("the other cache was released before the fork");
    assert_eq!(other.1.live(), 0);
    drop(other);
    let Setup { cache, _sub, .. } = s;
    drop(_sub);
    drop(cache);
    done.store(true, SeqCst);
}

/// Calls the helper's `prefetch` from inside the fork's prepare handler, after the cache's own
/// release (listeners are called in subscription order).
struct PrefetchDuringFork {
    cache: Arc<Cache>,
    addr: usize,
    result: Mutex<Option<Result<bool, firehose::cache::CacheError>>>,
}

impl MemoryListener for PrefetchDuringFork {
    fn on_unmap(&self, _: usize, _: usize) {}
    fn before_fork(&self) {
        let r = self.cache.prefetch(self.addr, LEN, RW, &|| true);
        *self.result.lock().unwrap() = Some(r);
    }
}

/// Between the release before a fork and the parent handler the helper pins nothing ahead (a pin
/// there would cross the fork with MADV_DONTFORK on memory the application never registered);
/// after the fork it may again.
#[test]
fn no_pin_ahead_between_the_release_and_the_fork() {
    let s = setup(ForkMode::Release);
    let buf = buffer(LEN, 9);
    let probe = Arc::new(PrefetchDuringFork {
        cache: s.cache.clone(),
        addr: buf,
        result: Mutex::new(None),
    });
    let _p = monitor::subscribe(probe.clone() as Arc<dyn MemoryListener>);
    let pid = fork_run(|| child_reads(buf, LEN, 9));
    wait_child(pid).expect("the child has the pages");
    assert_eq!(
        *probe.result.lock().unwrap(),
        Some(Err(firehose::cache::CacheError::Busy))
    );
    assert_eq!(s.pinner.live(), 0);
    assert_eq!(s.cache.prefetch(buf, LEN, RW, &|| true), Ok(true));
    assert_eq!(s.pinner.live(), 1);
}
