//! The unmap log (`helper/unmap_log.rs`) in a child forked while parent threads were inside a
//! patched `munmap`.
//!
//! Every patched unmap counts itself in `IN_FLIGHT` (`begin`) until its system call returned
//! (`end`). A thread of the parent that was between the two at the fork does not exist in the
//! child. Before the atfork child handler ended those unmaps, the child's count never returned
//! to zero, and once 64 newer unmaps had pushed their slots out of the ring,
//! `in_flight_overlapping` answered "maybe" for every range, for good: that is what the helper
//! thread's prefetch asks before each pin ahead, so in such a child no helper ever pinned ahead
//! (98 of 100 children here).
//!
//! Four threads map and unmap (through the patched libc `munmap`) without pause while the main
//! thread forks. Each child unmaps 100 mappings of its own (nothing is in flight after that: it
//! has one thread) and asks whether an unmap overlapping an untouched range is in flight: it must
//! not be.
//!
//! The second test does the same for an announced pin ahead (`helper/pins_ahead.rs`).
//!
//! C API (`fh_cache_new` installs the libc patch), mlock backend.

mod fork_util;

use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;

use firehose::ffi::*;
use firehose::helper::unmap_log;
use fork_util::{cache_with, fork_run, say, wait_child};

const FORKS: usize = 100;
const WORKERS: usize = 4;
/// A range nobody maps or unmaps.
const UNTOUCHED: usize = 0x7eee_1234_0000;

fn new_cache() -> *mut fh_cache {
    cache_with(|cfg| {
        cfg.backend = FH_BACKEND_MLOCK;
        cfg.monitor = FH_MONITOR_PATCH_LIBC;
    })
    .expect("fh_cache_new")
}

fn map_unmap() {
    // SAFETY: a fresh anonymous mapping, unmapped at once (through the patched munmap).
    unsafe {
        let p = libc::mmap(
            ptr::null_mut(),
            1 << 16,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        assert_ne!(p, libc::MAP_FAILED);
        libc::munmap(p, 1 << 16);
    }
}

fn child() -> i32 {
    for _ in 0..100 {
        map_unmap();
    }
    if unmap_log::in_flight_overlapping(UNTOUCHED, UNTOUCHED + 4096) {
        say("child: an unmap of an untouched range is \"in flight\" (a parent thread's, gone)\n");
        return 2;
    }
    0
}

#[test]
fn unmaps_in_flight_at_the_fork_are_not_in_flight_in_the_child() {
    let c = new_cache();
    let stop = Arc::new(AtomicBool::new(false));
    let rounds = Arc::new(AtomicUsize::new(0));
    let workers: Vec<_> = (0..WORKERS)
        .map(|_| {
            let (stop, rounds) = (stop.clone(), rounds.clone());
            std::thread::spawn(move || {
                while !stop.load(SeqCst) {
                    map_unmap();
                    rounds.fetch_add(1, SeqCst);
                }
            })
        })
        .collect();
    while rounds.load(SeqCst) < 1000 {
        std::thread::yield_now();
    }
    let mut failures = Vec::new();
    for f in 0..FORKS {
        std::thread::sleep(Duration::from_millis(1 + (f % 3) as u64));
        if let Err(e) = wait_child(fork_run(child)) {
            failures.push(format!("fork {f}: {e}"));
        }
    }
    stop.store(true, SeqCst);
    for w in workers {
        w.join().unwrap();
    }
    // SAFETY: ours, no other user.
    unsafe { fh_cache_free(c) };
    assert!(
        failures.is_empty(),
        "{} of {FORKS} children failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// The same for the pins ahead a patched unmap waits for (`helper/pins_ahead.rs`): a parent
/// thread's announced pin is not in a child, which must not wait for it (it would, for the
/// whole bound, on every unmap of that range).
#[test]
fn a_pin_ahead_announced_at_the_fork_is_not_waited_for_in_the_child() {
    use firehose::helper::pins_ahead;
    let c = new_cache();
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let (held_tx, held_rx) = std::sync::mpsc::channel::<()>();
    let holder = std::thread::spawn(move || {
        let g = pins_ahead::enter(UNTOUCHED, UNTOUCHED + 4096).expect("a free slot");
        held_tx.send(()).unwrap();
        rx.recv().unwrap();
        drop(g);
    });
    held_rx.recv().unwrap();
    let child = || {
        let t = std::time::Instant::now();
        let waited = pins_ahead::wait_for_overlapping(UNTOUCHED, UNTOUCHED + 4096);
        if waited || t.elapsed() > Duration::from_millis(500) {
            say("child: waited for a pin ahead of a parent thread that is not here\n");
            return 2;
        }
        0
    };
    let r = wait_child(fork_run(child));
    // The parent still waits for it (up to the bound: the holder stays until told).
    let parent_waits = {
        let t = std::time::Instant::now();
        let w =
            std::thread::spawn(|| pins_ahead::wait_for_overlapping(UNTOUCHED, UNTOUCHED + 4096));
        std::thread::sleep(Duration::from_millis(100));
        let still = !w.is_finished();
        tx.send(()).unwrap();
        let waited = w.join().unwrap();
        still && waited && t.elapsed() < Duration::from_millis(900)
    };
    holder.join().unwrap();
    // SAFETY: ours, no other user.
    unsafe { fh_cache_free(c) };
    r.expect("child");
    assert!(parent_waits, "the parent's unmap did not wait for the pin");
}
