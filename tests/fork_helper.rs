//! fork while a cache's helper thread runs and other threads read its counters (the fork guarantee,
//! extended to the helper thread).
//!
//! The helper's counters sit behind a mutex that the helper thread and every `fh_info` /
//! `fh_get_helper_stats` caller take. A child forked while any parent thread held it inherits it
//! locked, with no owner: before the fix, the child's first `fh_info` on the inherited cache
//! waited forever (and, when it did not, reported a helper "on" that does not exist in the child).
//!
//! Eight threads register and release 64 KiB buffers (tracked by the helper) and read the
//! counters without pause while the main thread forks. Each child, forked at any point of that:
//! - gets `FH_ERR_FORKED` from `fh_get_helper_stats` on the inherited cache, `*out` untouched;
//! - gets an `fh_info` that says the helper stayed in the parent, without waiting;
//! - gets `FH_ERR_FORKED` from `fh_register` on it, and frees it;
//! - makes a cache with a helper of its own, registers, sees its helper's counters, frees it;
//! - exits 0. A child that takes longer than the timeout is stuck: killed, and the test fails.
//!
//! C API (the `fh_*` exports), mlock backend, libc patching.

mod fork_util;

use std::ffi::{c_void, CStr};
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};

use firehose::ffi::*;
use firehose::status::fh_status;
use fork_util::{cache_with, first_cpu, fork_run, register, wait_child};

const LEN: usize = 64 << 10;
const FORKS: usize = 120;
const WORKERS: usize = 8;
/// Stop forking after this many failed children (each hang costs the timeout).
const MAX_FAILURES: usize = 3;

fn new_helper_cache() -> Result<*mut fh_cache, fh_status> {
    cache_with(|cfg| {
        cfg.backend = FH_BACKEND_MLOCK;
        cfg.monitor = FH_MONITOR_PATCH_LIBC;
        cfg.max_pinned = 64 << 20;
        cfg.helper = FH_HELPER_ON;
        cfg.helper_cpu = first_cpu();
        cfg.helper_min_bytes = LEN;
    })
}

fn map() -> usize {
    // SAFETY: a fresh anonymous mapping.
    let p = unsafe {
        libc::mmap(
            ptr::null_mut(),
            LEN,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED, "mmap");
    // SAFETY: just mapped, writable.
    unsafe { ptr::write_bytes(p as *mut u8, 1, LEN) };
    p as usize
}

fn helper_stats(c: *const fh_cache, out: &mut fh_helper_stats) -> fh_status {
    // SAFETY: live cache, valid out pointer.
    unsafe { fh_get_helper_stats(c, out) }
}

fn info(c: *const fh_cache) -> Result<String, fh_status> {
    let mut buf = vec![0u8; 8192];
    // SAFETY: live cache, `buf` valid for its length.
    let rc = unsafe { fh_info(c, buf.as_mut_ptr().cast(), buf.len(), ptr::null_mut()) };
    if rc != fh_status::FH_OK {
        return Err(rc);
    }
    Ok(CStr::from_bytes_until_nul(&buf)
        .expect("NUL-terminated")
        .to_string_lossy()
        .into_owned())
}

/// The helper's counters once `done` holds for them (they are published on every loop of the
/// thread, after its start-up calibration), or the last ones read after 5 s.
fn wait_helper(c: *const fh_cache, done: impl Fn(&fh_helper_stats) -> bool) -> fh_helper_stats {
    let t0 = Instant::now();
    let mut s = fh_helper_stats::default();
    while helper_stats(c, &mut s) == fh_status::FH_OK
        && !done(&s)
        && t0.elapsed() < Duration::from_secs(5)
    {
        std::thread::sleep(Duration::from_millis(1));
    }
    s
}

/// What a child checks; returns an exit code (0 = fine).
fn child(inherited: *mut fh_cache) -> i32 {
    // A marker the call must not overwrite (output parameters are written only on success).
    let mut out = fh_helper_stats {
        state: 77,
        ..Default::default()
    };
    let rc = helper_stats(inherited, &mut out);
    if rc != fh_status::FH_ERR_FORKED || out.state != 77 {
        eprintln!(
            "child: fh_get_helper_stats on the inherited cache: {rc:?}, state {}",
            out.state
        );
        return 2;
    }
    match info(inherited) {
        Ok(s) if s.contains("helper:        forked") => {}
        other => {
            eprintln!("child: fh_info on the inherited cache: {other:?}");
            return 3;
        }
    }
    let probe = [0u8; 64];
    let mut mr = std::mem::MaybeUninit::<fh_mr>::uninit();
    // SAFETY: live (inherited) cache, valid pointers.
    let rc = unsafe {
        fh_register(
            inherited,
            probe.as_ptr().cast(),
            probe.len(),
            FH_ACCESS_LOCAL_WRITE,
            mr.as_mut_ptr(),
        )
    };
    if rc != fh_status::FH_ERR_FORKED {
        eprintln!("child: fh_register on the inherited cache: {rc:?}");
        return 4;
    }
    // SAFETY: the inherited cache; nobody else uses it in the child.
    unsafe { fh_cache_free(inherited) };

    // A cache of the child's own, with a helper thread of its own.
    let c = match new_helper_cache() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("child: fh_cache_new: {e:?}");
            return 5;
        }
    };
    let p = map();
    match register(c, p, LEN) {
        // SAFETY: live cache, handle just issued.
        Ok(h) if unsafe { fh_deregister(c, h) } == fh_status::FH_OK => {}
        other => {
            eprintln!("child: register on its own cache: {other:?}");
            return 6;
        }
    }
    let s = wait_helper(c, |s| s.tracked_registrations == 1);
    if s.state != 1 || s.tracked_registrations != 1 {
        eprintln!(
            "child: its helper never counted the registration: state {}, tracked {}",
            s.state, s.tracked_registrations
        );
        return 8;
    }
    // SAFETY: ours; the registration was released.
    unsafe {
        fh_cache_free(c);
        libc::munmap(p as *mut c_void, LEN);
    }
    0
}

struct Shared(*mut fh_cache);
// SAFETY: every fh_* call on one cache may come from any thread.
unsafe impl Send for Shared {}
unsafe impl Sync for Shared {}

/// Even workers register and release (the helper tracks and plans them); odd ones read the
/// counters (`fh_get_helper_stats`, `fh_info`) without pause, so the mutex behind them is often
/// held at the fork.
fn worker(shared: Arc<Shared>, stop: Arc<AtomicBool>, k: usize, rounds: Arc<AtomicUsize>) {
    let p = map();
    let mut s = fh_helper_stats::default();
    while !stop.load(SeqCst) {
        if k % 2 == 0 {
            let h = register(shared.0, p, LEN).expect("register");
            // SAFETY: live cache, handle just issued.
            assert_eq!(unsafe { fh_deregister(shared.0, h) }, fh_status::FH_OK);
        } else if k % 4 == 1 {
            assert_eq!(helper_stats(shared.0, &mut s), fh_status::FH_OK);
        } else {
            info(shared.0).expect("fh_info");
        }
        rounds.fetch_add(1, SeqCst);
    }
    // SAFETY: ours; every registration of it was released.
    unsafe { libc::munmap(p as *mut c_void, LEN) };
}

#[test]
fn fork_while_the_helper_runs_and_threads_read_its_counters() {
    let shared = Arc::new(Shared(new_helper_cache().expect("fh_cache_new")));
    let s = wait_helper(shared.0, |s| s.elapsed_ns > 0);
    assert_eq!(s.state, 1, "the helper is forced on");
    assert!(s.elapsed_ns > 0, "the helper thread started");
    let stop = Arc::new(AtomicBool::new(false));
    let rounds = Arc::new(AtomicUsize::new(0));
    let workers: Vec<_> = (0..WORKERS)
        .map(|k| {
            let (sh, st, r) = (shared.clone(), stop.clone(), rounds.clone());
            std::thread::spawn(move || worker(sh, st, k, r))
        })
        .collect();
    while rounds.load(SeqCst) < 1000 {
        std::thread::yield_now();
    }
    let mut failures = Vec::new();
    for f in 0..FORKS {
        std::thread::sleep(Duration::from_millis(1 + (f % 3) as u64));
        if let Err(e) = wait_child(fork_run(|| child(shared.0))) {
            failures.push(format!("fork {f}: {e}"));
        }
        if failures.len() >= MAX_FAILURES {
            break;
        }
    }
    stop.store(true, SeqCst);
    for w in workers {
        w.join().unwrap();
    }
    // The parent's helper kept running through the forks.
    let s = wait_helper(shared.0, |s| s.tracked_registrations > 0);
    assert_eq!(s.state, 1);
    assert!(s.tracked_registrations > 0);
    // SAFETY: every worker is gone.
    unsafe { fh_cache_free(shared.0) };
    assert!(
        failures.is_empty(),
        "{} of {FORKS} children failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
