//! fork while threads use a peers context (`fh_init`): the context does not cross fork.
//!
//! Its locks (`Rma`'s engine and ops, the endpoint's) may be inherited locked from parent threads
//! that do not exist in the child, and its queue pairs and threads are the parent's. Before the
//! fork guard, a child's first `fh_get_rma_stats` on it hung in 3 of 4 forks here.
//!
//! A job of one (no device). Four threads put to their own rank (local copies through the
//! engine), wait, quiet and read the counters without pause while the main thread forks. Each
//! child calls every kind of entry point on the inherited context: each must return
//! `FH_ERR_FORKED` at once, writing nothing; `fh_finalize` of it returns `FH_OK`. A child that
//! takes longer than the timeout is stuck: killed, and the test fails.
//!
//! C API (the `fh_*` exports).

mod fork_util;

use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;

use firehose::ffi::rma::*;
use firehose::ffi::*;
use firehose::status::fh_status;
use fork_util::{fork_run, say, wait_child};

const FORKS: usize = 100;
const WORKERS: usize = 4;
const MAX_FAILURES: usize = 3;

fn init() -> *mut fh_ctx {
    let mut c = ptr::null_mut();
    // SAFETY: NULL config (environment, a job of one here), valid out pointer.
    assert_eq!(unsafe { fh_init(ptr::null(), &mut c) }, fh_status::FH_OK);
    assert_eq!(unsafe { fh_size(c) }, 1);
    c
}

struct Shared(*mut fh_ctx);
// SAFETY: every fh_* call on one context may come from any thread (except fh_finalize).
unsafe impl Send for Shared {}
unsafe impl Sync for Shared {}

fn put_self(c: *mut fh_ctx, dst: &mut [u8; 256], src: &[u8; 256]) -> fh_status {
    // SAFETY: live context; both buffers ours and alive for the call.
    unsafe {
        fh_put(
            c,
            0,
            dst.as_mut_ptr() as u64,
            src.as_ptr().cast(),
            src.len(),
        )
    }
}

/// The calls a child makes on the inherited context: each returns `FH_ERR_FORKED` without
/// waiting for anything, `*out` parameters untouched; `fh_finalize` of it returns `FH_OK`. Returns an exit code.
fn child_calls(c: *mut fh_ctx) -> i32 {
    let me = std::process::id();
    let forked = |what: &str, rc: fh_status| {
        if rc == fh_status::FH_ERR_FORKED {
            return true;
        }
        say(&format!(
            "child {me}: {what} on the inherited context: {rc:?}\n"
        ));
        false
    };
    let mut s = fh_rma_stats {
        puts: 77,
        ..Default::default()
    };
    // SAFETY: the inherited context, valid out pointer.
    if !forked("fh_get_rma_stats", unsafe { fh_get_rma_stats(c, &mut s) }) || s.puts != 77 {
        return 2;
    }
    let mut n = std::mem::MaybeUninit::<fh_net_stats>::uninit();
    // SAFETY: as above.
    if !forked("fh_get_net_stats", unsafe {
        fh_get_net_stats(c, n.as_mut_ptr())
    }) {
        return 3;
    }
    // SAFETY: as above.
    if !forked("fh_quiet", unsafe { fh_quiet(c) }) {
        return 4;
    }
    // SAFETY: as above.
    if !forked("fh_progress", unsafe { fh_progress(c) }) {
        return 5;
    }
    let (mut dst, src) = ([0u8; 256], [7u8; 256]);
    if !forked("fh_put", put_self(c, &mut dst, &src)) || dst != [0u8; 256] {
        return 6;
    }
    let mut op: fh_op = 0;
    // SAFETY: as above.
    let rc = unsafe {
        fh_get_nb(
            c,
            dst.as_mut_ptr().cast(),
            0,
            src.as_ptr() as u64,
            256,
            &mut op,
        )
    };
    if !forked("fh_get_nb", rc) || op != 0 {
        return 7;
    }
    // SAFETY: as above.
    if !forked("fh_wait", unsafe { fh_wait(c, 1) }) {
        return 8;
    }
    // SAFETY: as above.
    if !forked("fh_barrier", unsafe { fh_barrier(c) }) {
        return 9;
    }
    // SAFETY: the inherited context, not used after this.
    let rc = unsafe { fh_finalize(c) };
    if rc != fh_status::FH_OK {
        say(&format!(
            "child {me}: fh_finalize of the inherited context: {rc:?}\n"
        ));
        return 10;
    }
    0
}

fn worker(sh: Arc<Shared>, stop: Arc<AtomicBool>, k: usize, rounds: Arc<AtomicUsize>) {
    let (mut dst, src) = ([0u8; 256], [k as u8; 256]);
    let mut s = std::mem::MaybeUninit::<fh_rma_stats>::uninit();
    while !stop.load(SeqCst) {
        match k % 4 {
            0 | 1 => {
                let mut op: fh_op = 0;
                // SAFETY: live context, our buffers, valid out pointer.
                let rc = unsafe {
                    fh_put_nb(
                        sh.0,
                        0,
                        dst.as_mut_ptr() as u64,
                        src.as_ptr().cast(),
                        256,
                        &mut op,
                    )
                };
                assert_eq!(rc, fh_status::FH_OK);
                // SAFETY: live context, op just started.
                assert_eq!(unsafe { fh_wait(sh.0, op) }, fh_status::FH_OK);
                assert_eq!(put_self(sh.0, &mut dst, &src), fh_status::FH_OK);
            }
            2 => {
                // SAFETY: live context, valid out pointer.
                assert_eq!(
                    unsafe { fh_get_rma_stats(sh.0, s.as_mut_ptr()) },
                    fh_status::FH_OK
                );
            }
            _ => {
                // SAFETY: live context.
                assert_eq!(unsafe { fh_quiet(sh.0) }, fh_status::FH_OK);
                // SAFETY: live context.
                let _ = unsafe { fh_progress(sh.0) };
            }
        }
        rounds.fetch_add(1, SeqCst);
    }
}

#[test]
fn inherited_context_in_a_child() {
    let sh = Arc::new(Shared(init()));
    let stop = Arc::new(AtomicBool::new(false));
    let rounds = Arc::new(AtomicUsize::new(0));
    let workers: Vec<_> = (0..WORKERS)
        .map(|k| {
            let (sh, st, r) = (sh.clone(), stop.clone(), rounds.clone());
            std::thread::spawn(move || worker(sh, st, k, r))
        })
        .collect();
    while rounds.load(SeqCst) < 1000 {
        std::thread::yield_now();
    }
    let mut failures = Vec::new();
    let mut forks = 0;
    for f in 0..FORKS {
        forks += 1;
        std::thread::sleep(Duration::from_millis(1 + (f % 3) as u64));
        if let Err(e) = wait_child(fork_run(|| child_calls(sh.0))) {
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
    // SAFETY: every worker is gone.
    assert_eq!(unsafe { fh_finalize(sh.0) }, fh_status::FH_OK);

    assert!(
        failures.is_empty(),
        "calls on the inherited context: {} of {forks} children failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
