//! Listener registry semantics: fan-out, unsubscribe-on-drop, unsubscribe waits for an in-flight
//! call, slot exhaustion, and far more listeners than the old fixed 32, end to end through
//! the C API with libc patching (the last tests install it).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use firehose::monitor::{self, MemoryListener, MAX_LISTENERS};

static SERIAL: Mutex<()> = Mutex::new(());

#[derive(Default)]
struct Count(AtomicUsize);
impl MemoryListener for Count {
    fn on_unmap(&self, _: usize, len: usize) {
        // Only count our marker lengths (other tests' events in this process are ignored).
        if len == 0x1234_5000 {
            self.0.fetch_add(1, SeqCst);
        }
    }
}

#[test]
fn fan_out_and_unsubscribe_on_drop() {
    let _g = SERIAL.lock().unwrap();
    let a = Arc::new(Count::default());
    let b = Arc::new(Count::default());
    let sa = monitor::subscribe(a.clone());
    let sb = monitor::subscribe(b.clone());
    monitor::notify_unmapped(0x1000, 0x1234_5000);
    assert_eq!((a.0.load(SeqCst), b.0.load(SeqCst)), (1, 1));
    drop(sa);
    monitor::notify_unmapped(0x1000, 0x1234_5000);
    assert_eq!((a.0.load(SeqCst), b.0.load(SeqCst)), (1, 2));
    drop(sb);
    monitor::notify_unmapped(0x1000, 0x1234_5000);
    assert_eq!(b.0.load(SeqCst), 2);
    assert_eq!(Arc::strong_count(&a), 1, "registry released its reference");
}

struct Slow {
    entered: AtomicBool,
    done: AtomicBool,
}
impl MemoryListener for Slow {
    fn on_unmap(&self, _: usize, len: usize) {
        if len == 0x7777_0000 {
            self.entered.store(true, SeqCst);
            std::thread::sleep(Duration::from_millis(300));
            self.done.store(true, SeqCst);
        }
    }
}

#[test]
fn unsubscribe_waits_for_in_flight_call() {
    let _g = SERIAL.lock().unwrap();
    let l = Arc::new(Slow {
        entered: AtomicBool::new(false),
        done: AtomicBool::new(false),
    });
    let sub = monitor::subscribe(l.clone());
    let t = std::thread::spawn(|| monitor::notify_unmapped(0x1000, 0x7777_0000));
    while !l.entered.load(SeqCst) {
        std::thread::yield_now();
    }
    drop(sub);
    assert!(
        l.done.load(SeqCst),
        "Subscription::drop returned while the listener was running"
    );
    t.join().unwrap();
}

/// With the limit lowered (a test knob; the real one is `MAX_LISTENERS`), subscriptions past it
/// are inactive and never called; freed slots are reused.
#[test]
fn slots_run_out_then_free_up() {
    let _g = SERIAL.lock().unwrap();
    let c = Arc::new(Count::default());
    let base = monitor::listener_count();
    monitor::set_listener_limit_for_tests(base + 5);
    let subs: Vec<_> = (0..8).map(|_| monitor::subscribe(c.clone())).collect();
    let again_full = monitor::subscribe(c.clone());
    monitor::set_listener_limit_for_tests(MAX_LISTENERS);
    let active = subs.iter().filter(|s| s.is_active()).count();
    assert_eq!(active, 5);
    assert!(!again_full.is_active());
    monitor::notify_unmapped(0, 0x1234_5000);
    assert_eq!(
        c.0.load(SeqCst),
        active,
        "each active subscription called once"
    );
    drop(subs);
    drop(again_full);
    assert_eq!(monitor::listener_count(), base);
    let again = monitor::subscribe(c.clone());
    assert!(again.is_active());
}

/// Every one of `MAX_LISTENERS` slots (many chunks) can be used and is called; one more is not.
#[test]
fn capacity_is_max_listeners_across_chunks() {
    let _g = SERIAL.lock().unwrap();
    let c = Arc::new(Count::default());
    let base = monitor::listener_count();
    let subs: Vec<_> = (base..MAX_LISTENERS)
        .map(|_| monitor::subscribe(c.clone()))
        .collect();
    assert!(subs.iter().all(|s| s.is_active()));
    assert_eq!(monitor::listener_count(), MAX_LISTENERS);
    assert!(!monitor::subscribe(c.clone()).is_active());
    monitor::notify_unmapped(0, 0x1234_5000);
    assert_eq!(c.0.load(SeqCst), MAX_LISTENERS - base);
    drop(subs);
    assert_eq!(monitor::listener_count(), base);
    assert_eq!(Arc::strong_count(&c), 1);
}

#[test]
fn concurrent_notify_and_churn() {
    let _g = SERIAL.lock().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let notifiers: Vec<_> = (0..2)
        .map(|_| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                while !stop.load(SeqCst) {
                    monitor::notify_unmapped(0x1000, 0x1234_5000);
                }
            })
        })
        .collect();
    for _ in 0..500 {
        let c = Arc::new(Count::default());
        let s = monitor::subscribe(c.clone());
        drop(s);
        let seen = c.0.load(SeqCst);
        std::thread::yield_now();
        assert_eq!(c.0.load(SeqCst), seen, "called after unsubscribe returned");
        assert_eq!(Arc::strong_count(&c), 1);
    }
    stop.store(true, SeqCst);
    for t in notifiers {
        t.join().unwrap();
    }
}

/// Far more listeners than the old fixed 32 slots (the shim makes one cache per
/// protection domain and rights class): every one is subscribed and called.
#[test]
fn hundred_listeners_are_all_subscribed_and_called() {
    let _g = SERIAL.lock().unwrap();
    let base = monitor::listener_count();
    let ls: Vec<Arc<Count>> = (0..100).map(|_| Arc::new(Count::default())).collect();
    let subs: Vec<_> = ls.iter().map(|l| monitor::subscribe(l.clone())).collect();
    let inactive = subs.iter().filter(|s| !s.is_active()).count();
    assert_eq!(
        inactive, 0,
        "{inactive} of 100 listeners were not subscribed"
    );
    assert_eq!(monitor::listener_count(), base + 100);
    monitor::notify_unmapped(0x1000, 0x1234_5000);
    let missed = ls.iter().filter(|l| l.0.load(SeqCst) != 1).count();
    assert_eq!(missed, 0, "{missed} of 100 listeners were not called once");
    drop(subs);
    assert_eq!(monitor::listener_count(), base);
    assert!(ls.iter().all(|l| Arc::strong_count(l) == 1));
}

mod capi {
    use std::ffi::c_void;
    use std::ptr;

    use firehose::ffi::*;
    use firehose::status::fh_status;

    pub const PAGE: usize = 4096;

    pub fn new_cache(monitor: u32) -> Result<*mut fh_cache, fh_status> {
        let mut cfg = std::mem::MaybeUninit::<fh_config>::uninit();
        // SAFETY: valid for one fh_config write.
        assert_eq!(
            unsafe { fh_config_init(cfg.as_mut_ptr()) },
            fh_status::FH_OK
        );
        // SAFETY: initialised (FH_OK).
        let mut cfg = unsafe { cfg.assume_init() };
        cfg.backend = FH_BACKEND_MLOCK;
        cfg.monitor = monitor;
        cfg.max_pinned = 1 << 20;
        cfg.max_regions = 64;
        let mut c = ptr::null_mut();
        // SAFETY: valid config and out pointer.
        match unsafe { fh_cache_new(&cfg, &mut c) } {
            fh_status::FH_OK => Ok(c),
            e => Err(e),
        }
    }

    pub fn map(at: usize) -> usize {
        let fixed = if at != 0 {
            libc::MAP_FIXED_NOREPLACE
        } else {
            0
        };
        // SAFETY: a fresh anonymous page (never over an existing mapping).
        let p = unsafe {
            libc::mmap(
                at as *mut c_void,
                PAGE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | fixed,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        assert!(at == 0 || p as usize == at, "address {at:#x} not reusable");
        // SAFETY: just mapped, writable.
        unsafe { *(p as *mut u8) = 1 };
        p as usize
    }

    /// Register and release one page (it stays cached, idle).
    pub fn reg_dereg(c: *mut fh_cache, p: usize) {
        let mut mr = std::mem::MaybeUninit::<fh_mr>::uninit();
        // SAFETY: live cache, valid out pointer.
        let rc = unsafe {
            fh_register(
                c,
                p as *const c_void,
                PAGE,
                FH_ACCESS_LOCAL_WRITE,
                mr.as_mut_ptr(),
            )
        };
        assert_eq!(rc, fh_status::FH_OK);
        // SAFETY: written on FH_OK; the handle is released once.
        assert_eq!(
            unsafe { fh_deregister(c, mr.assume_init().handle) },
            fh_status::FH_OK
        );
    }

    pub fn stats(c: *mut fh_cache) -> fh_stats {
        let mut s = std::mem::MaybeUninit::<fh_stats>::uninit();
        // SAFETY: live cache, valid out pointer.
        assert_eq!(unsafe { fh_get_stats(c, s.as_mut_ptr()) }, fh_status::FH_OK);
        // SAFETY: written on FH_OK.
        unsafe { s.assume_init() }
    }
}

/// Far more caches than the old 32 slots, end to end through the C API: 100 caches (libc patching
/// on), each with an idle cached page; every page is unmapped with `munmap` and mapped again at the
/// same address: every cache must miss (before the fix, caches past the 32nd were never told and
/// hit stale).
#[test]
fn hundred_caches_are_each_invalidated_by_munmap() {
    use capi::*;
    let _g = SERIAL.lock().unwrap();
    let n = 100;
    let caches: Vec<_> = (0..n)
        .map(|i| {
            new_cache(firehose::ffi::FH_MONITOR_PATCH_LIBC)
                .unwrap_or_else(|e| panic!("fh_cache_new #{i}: {e:?}"))
        })
        .collect();
    if monitor::status().patched == 0 {
        eprintln!("SKIP: libc patching not available here");
        return;
    }
    let pages: Vec<usize> = (0..n).map(|_| map(0)).collect();
    for (&c, &p) in caches.iter().zip(&pages) {
        reg_dereg(c, p);
    }
    for &p in &pages {
        // SAFETY: our page; the patched libc entry tells every listener first.
        assert_eq!(unsafe { libc::munmap(p as *mut _, PAGE) }, 0);
        map(p);
    }
    let mut stale = Vec::new();
    for (i, (&c, &p)) in caches.iter().zip(&pages).enumerate() {
        reg_dereg(c, p);
        let s = stats(c);
        if s.misses != 2 || s.hits != 0 {
            stale.push(i);
        }
    }
    for (&c, &p) in caches.iter().zip(&pages) {
        // SAFETY: ours; no other user.
        unsafe {
            firehose::ffi::fh_cache_free(c);
            libc::munmap(p as *mut _, PAGE);
        }
    }
    assert!(
        stale.is_empty(),
        "{} of {n} caches served a stale registration after munmap: {stale:?}",
        stale.len()
    );
}

/// A cache that cannot be subscribed is never handed out: `fh_cache_new` fails with
/// `FH_ERR_TOO_MANY_CACHES` and leaves `*out` alone.
#[test]
fn cache_new_fails_when_no_listener_slot_is_left() {
    use capi::*;
    let _g = SERIAL.lock().unwrap();
    let base = monitor::listener_count();
    monitor::set_listener_limit_for_tests(base + 1);
    let first = new_cache(0);
    let second = new_cache(0);
    monitor::set_listener_limit_for_tests(MAX_LISTENERS);
    let first = first.expect("one slot was left");
    assert_eq!(
        second.err(),
        Some(firehose::status::fh_status::FH_ERR_TOO_MANY_CACHES)
    );
    let mut out = 0x5a5a as *mut firehose::ffi::fh_cache;
    monitor::set_listener_limit_for_tests(base + 1);
    let mut cfg = std::mem::MaybeUninit::<firehose::ffi::fh_config>::uninit();
    // SAFETY: valid pointers; `out` must not be written on failure.
    let rc = unsafe {
        firehose::ffi::fh_config_init(cfg.as_mut_ptr());
        let mut cfg = cfg.assume_init();
        cfg.backend = firehose::ffi::FH_BACKEND_MLOCK;
        cfg.monitor = 0;
        firehose::ffi::fh_cache_new(&cfg, &mut out)
    };
    monitor::set_listener_limit_for_tests(MAX_LISTENERS);
    assert_eq!(rc, firehose::status::fh_status::FH_ERR_TOO_MANY_CACHES);
    assert_eq!(out as usize, 0x5a5a, "*out written on failure");
    // SAFETY: ours.
    unsafe { firehose::ffi::fh_cache_free(first) };
    assert_eq!(monitor::listener_count(), base);
}

/// Blocks in `on_unmap` for its marker length until released; records `forked`.
struct Gate {
    marker: usize,
    entered: AtomicBool,
    release: AtomicBool,
    forked: AtomicBool,
}

impl Gate {
    fn new(marker: usize) -> Arc<Gate> {
        Arc::new(Gate {
            marker,
            entered: AtomicBool::new(false),
            release: AtomicBool::new(false),
            forked: AtomicBool::new(false),
        })
    }
    fn wait_entered(&self) {
        while !self.entered.load(SeqCst) {
            std::thread::yield_now();
        }
    }
}

impl MemoryListener for Gate {
    fn on_unmap(&self, _: usize, len: usize) {
        if len == self.marker {
            self.entered.store(true, SeqCst);
            while !self.release.load(SeqCst) {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }
    fn forked(&self) {
        self.forked.store(true, SeqCst);
    }
}

/// Fork, the registry's side: fork while one thread is unsubscribing (it holds the
/// registry's lock, waiting for a call in flight) and another thread is inside a listener's call.
/// The child must find the registry unlocked (it subscribes), must not wait for the call that was
/// in flight in the parent (it unsubscribes that listener), and every listener subscribed at the
/// fork is told `forked` there. Before the fix the child hung in `subscribe`.
#[test]
fn fork_during_unsubscribe_and_an_inflight_call() {
    let _g = SERIAL.lock().unwrap();
    const X: usize = 0x5151_0000;
    const Y: usize = 0x6262_0000;
    let a = Gate::new(X);
    let c = Gate::new(Y);
    let sub_a = monitor::subscribe(a.clone());
    let sub_c = monitor::subscribe(c.clone());
    // In flight on C across the fork (released by the parent once the child is done).
    let n2 = std::thread::spawn(|| monitor::notify_unmapped(0x1000, Y));
    c.wait_entered();
    // In flight on A, which another thread unsubscribes: that thread holds the registry's lock
    // until A's call returns, 300 ms from now.
    let n1 = std::thread::spawn(|| monitor::notify_unmapped(0x1000, X));
    a.wait_entered();
    let dropping = Arc::new(AtomicBool::new(false));
    let d = dropping.clone();
    let u = std::thread::spawn(move || {
        d.store(true, SeqCst);
        drop(sub_a);
    });
    while !dropping.load(SeqCst) {
        std::thread::yield_now();
    }
    std::thread::sleep(Duration::from_millis(50));
    let a2 = a.clone();
    let t = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        a2.release.store(true, SeqCst);
    });
    // SAFETY: the child touches the registry and atomics only, then leaves with _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        let mut code = 0;
        if !c.forked.load(SeqCst) {
            code |= 1; // C was not told
        }
        drop(sub_c); // must not wait for the parent's in-flight call
        let again = monitor::subscribe(Arc::new(Count::default())); // must not hang
        if !again.is_active() {
            code |= 2;
        }
        drop(again);
        // SAFETY: leave without running the test harness in the child.
        unsafe { libc::_exit(code) };
    }
    let t0 = std::time::Instant::now();
    let mut status = 0;
    let exited = loop {
        // SAFETY: our child.
        if unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) } == pid {
            break true;
        }
        if t0.elapsed() > Duration::from_secs(10) {
            // SAFETY: our child.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, &mut status, 0);
            }
            break false;
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    c.release.store(true, SeqCst);
    for j in [n1, n2, u, t] {
        j.join().unwrap();
    }
    drop(sub_c);
    assert!(!a.forked.load(SeqCst) && !c.forked.load(SeqCst), "parent");
    assert!(
        exited,
        "child hung (registry lock inherited locked, or a stale in-flight count)"
    );
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "child exit code {} (1: not told forked, 2: could not subscribe)",
        libc::WEXITSTATUS(status)
    );
}

/// Panics for events of its marker length.
struct Panics;
impl MemoryListener for Panics {
    fn on_unmap(&self, _: usize, len: usize) {
        if len == 0x7777_7000 {
            panic!("listener failed");
        }
    }
}

/// A listener that unwinds out of a notification is counted out anyway: its subscription can
/// still be dropped (without the count's drop guard, the drop waited forever; the atfork
/// handlers call listeners that call backends, which may panic). In a child process: the
/// notification guard's slot of the panicking thread stays claimed after the unwind (hooks never
/// panic; only the registry's count is under test), and a later thread with the same id would
/// find its notifications deferred, which would break the other tests here.
#[test]
fn a_listener_that_panics_can_still_be_unsubscribed() {
    let _g = SERIAL.lock().unwrap();
    // SAFETY: the child runs the check below and leaves with _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        let code = std::panic::catch_unwind(|| {
            let sub = monitor::subscribe(Arc::new(Panics));
            let t = std::thread::spawn(|| {
                std::panic::catch_unwind(|| monitor::notify_unmapped(0x1000, 0x7777_7000)).is_err()
            });
            if !t.join().unwrap_or(false) {
                return 3; // the listener was not called
            }
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                drop(sub);
                let _ = tx.send(());
            });
            match rx.recv_timeout(Duration::from_secs(10)) {
                Ok(()) => 0,
                Err(_) => 2, // unsubscribe hung: the call was never counted out
            }
        })
        .unwrap_or(99);
        // SAFETY: leave without running the test harness in the child.
        unsafe { libc::_exit(code) };
    }
    let mut status = 0;
    // SAFETY: our child; it ends by itself within 10 s.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "child status {status:#x} (exit 2: unsubscribe hung)"
    );
}
