//! A child forked while parent threads start or end threads makes a cache with a helper thread
//! (`fh_cache_new`, `FH_HELPER_ON`) and frees it.
//!
//! Every std thread, as it starts and as it ends, takes std's process-wide `thread_info` mutex
//! (stack-overflow bookkeeping), which no atfork handler covers. A child forked while another
//! thread of the parent held it inherits it locked. When the helper was a `std::thread`, the
//! child's new helper never got past its start, `fh_get_helper_stats` never showed it running,
//! and `fh_cache_free` (which joins the helper) waited forever: 3 of 282 children here. The
//! library's threads are plain pthreads now (`src/rt/raw_thread.rs`).
//!
//! The parent's threads churn std threads two ways: by making and freeing caches with a helper
//! (the library's own thread start and exit) and by spawning empty std threads. The main thread
//! forks; each child must see its helper start within 5 s and free the cache within the timeout.
//!
//! C API (the `fh_*` exports), mlock backend, no monitor.

mod fork_util;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};

use firehose::ffi::*;
use firehose::status::fh_status;
use fork_util::{cache_with, first_cpu, fork_run, say, wait_child};

const FORKS: usize = 300;
const MAX_FAILURES: usize = 3;
const CACHE_CHURNERS: usize = 3;
const STD_CHURNERS: usize = 5;

fn new_helper_cache() -> Result<*mut fh_cache, fh_status> {
    cache_with(|cfg| {
        cfg.backend = FH_BACKEND_MLOCK;
        cfg.monitor = 0;
        // Small: the helper's start-up calibration pins at most a quarter of it.
        cfg.max_pinned = 256 << 10;
        cfg.helper = FH_HELPER_ON;
        cfg.helper_cpu = first_cpu();
    })
}

fn helper_elapsed(c: *const fh_cache) -> Option<u64> {
    let mut s = fh_helper_stats::default();
    // SAFETY: live cache, valid out pointer.
    (unsafe { fh_get_helper_stats(c, &mut s) } == fh_status::FH_OK && s.state == 1)
        .then_some(s.elapsed_ns)
}

fn child() -> i32 {
    let c = match new_helper_cache() {
        Ok(c) => c,
        Err(e) => {
            say(&format!("child: fh_cache_new: {e:?}\n"));
            return 2;
        }
    };
    let t0 = Instant::now();
    loop {
        match helper_elapsed(c) {
            Some(ns) if ns > 0 => break,
            Some(_) => {}
            None => {
                say("child: the helper is not on\n");
                return 3;
            }
        }
        if t0.elapsed() > Duration::from_secs(5) {
            // The helper thread is stuck in std's thread start; fh_cache_free would join it
            // forever, so leave without it.
            say("child: its helper thread never started (5 s)\n");
            return 8;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    // SAFETY: ours, no other user; joins the helper.
    unsafe { fh_cache_free(c) };
    0
}

#[test]
fn fork_while_threads_start_and_end_helpers() {
    // The library's atfork handlers and monitor state exist before the first fork.
    let c = new_helper_cache().expect("fh_cache_new");
    // SAFETY: ours.
    unsafe { fh_cache_free(c) };
    let stop = Arc::new(AtomicBool::new(false));
    let rounds = Arc::new(AtomicUsize::new(0));
    let mut churners = Vec::new();
    for _ in 0..CACHE_CHURNERS {
        let (stop, rounds) = (stop.clone(), rounds.clone());
        churners.push(std::thread::spawn(move || {
            while !stop.load(SeqCst) {
                if let Ok(c) = new_helper_cache() {
                    // SAFETY: ours; joins its helper thread.
                    unsafe { fh_cache_free(c) };
                }
                rounds.fetch_add(1, SeqCst);
            }
        }));
    }
    for _ in 0..STD_CHURNERS {
        let (stop, rounds) = (stop.clone(), rounds.clone());
        churners.push(std::thread::spawn(move || {
            while !stop.load(SeqCst) {
                std::thread::spawn(|| {}).join().unwrap();
                rounds.fetch_add(1, SeqCst);
            }
        }));
    }
    while rounds.load(SeqCst) < 100 {
        std::thread::yield_now();
    }
    let mut failures = Vec::new();
    let mut forks = 0;
    for f in 0..FORKS {
        forks += 1;
        if let Err(e) = wait_child(fork_run(child)) {
            failures.push(format!("fork {f}: {e}"));
        }
        if failures.len() >= MAX_FAILURES {
            break;
        }
    }
    stop.store(true, SeqCst);
    for t in churners {
        t.join().unwrap();
    }
    assert!(
        failures.is_empty(),
        "{} of {forks} children failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
