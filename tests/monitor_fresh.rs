//! A raw `munmap` on one thread, a libc `mmap` of the same hole on another, before userfaultfd's
//! event for the unmap has been read: the caches must hear of the range when the `mmap` returns
//! (`UnmapEvent::Fresh`), or the second thread could be handed the first one's registration of
//! pages that are gone (a stale registration; seen once on Soft-RoCE with 16 threads).
//!
//! The window is made wide on purpose: the child runs with `FH_TEST_UFFD_DELAY_US`, so the
//! reader sleeps before it reads the unmap's event. The child prints what the listener had heard
//! right after `mmap` returned; the parent runs it with the protection on (must have heard) and
//! off (`FH_TEST_DISABLE_HOOKS=fresh`: must not have heard, which shows the test can see it).

mod monitor_util;

use std::time::{Duration, Instant};

use firehose::monitor::{self, MonitorOptions};
use monitor_util::{in_child, map, Recorder, PAGE};

const LEN: usize = 16 * PAGE;
const DELAY_US: &str = "1000000";

/// Whether [a, a+len) is mapped now (`msync` fails with ENOMEM on a hole, writes nothing).
fn mapped(a: usize, len: usize) -> bool {
    // SAFETY: MS_ASYNC only checks the range.
    unsafe { libc::msync(a as *mut libc::c_void, len, libc::MS_ASYNC) == 0 }
}

/// libc's (patched) mmap of exactly [a, a+len), refusing to replace anything.
fn map_exactly_at(a: usize, len: usize) -> bool {
    // SAFETY: MAP_FIXED_NOREPLACE never replaces a mapping: it fails if the hole is taken.
    let p = unsafe {
        libc::mmap(
            a as *mut libc::c_void,
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
            -1,
            0,
        )
    };
    p as usize == a
}

/// The child: prints `FH_FRESH heard=<bool> late=<bool>` (late: the reader's event came after).
#[test]
fn child_maps_the_hole_of_a_raw_unmap() {
    if !in_child() {
        return;
    }
    let st = monitor::install(MonitorOptions {
        patch_libc: true,
        userfaultfd: true,
    });
    if !st.uffd || st.patched == 0 {
        println!("FH_FRESH skip: {st:?}");
        return;
    }
    let rec = Recorder::new();
    let _sub = monitor::subscribe(rec.clone());
    let a = map(LEN);
    assert_eq!(monitor::uffd_watch(a, LEN), 1);
    rec.clear();
    // The raw unmap blocks in the kernel until the (delayed) reader reads its event; the
    // addresses are free long before that.
    let unmapper = std::thread::spawn(move || {
        // SAFETY: our mapping; a raw system call no hook sees.
        assert_eq!(unsafe { libc::syscall(libc::SYS_munmap, a, LEN) }, 0);
    });
    let t0 = Instant::now();
    while mapped(a, LEN) {
        assert!(t0.elapsed() < Duration::from_secs(5), "the unmap never ran");
        std::thread::yield_now();
    }
    assert!(map_exactly_at(a, LEN), "the hole was taken");
    let heard = rec.saw_cover(a, LEN);
    let before_reader = t0.elapsed() < Duration::from_millis(600);
    unmapper.join().unwrap();
    let late = rec.wait_cover(a, LEN);
    println!("FH_FRESH heard={heard} in_window={before_reader} late={late}");
    // SAFETY: the new mapping is ours.
    unsafe { libc::munmap(a as *mut libc::c_void, LEN) };
    monitor::uffd_unwatch(a, LEN);
}

fn run(extra: &[(&str, &str)]) -> String {
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "child_maps_the_hole_of_a_raw_unmap",
            "--exact",
            "--test-threads=1",
            "--nocapture",
        ])
        .env("FH_CHILD", "1")
        .env("FH_TEST_UFFD_DELAY_US", DELAY_US)
        .envs(extra.iter().copied())
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "child failed: {text}");
    text
}

#[test]
fn mmap_of_a_raw_unmapped_hole_is_reported_before_it_returns() {
    if in_child() {
        return;
    }
    let on = run(&[]);
    if on.contains("FH_FRESH skip") {
        eprintln!("SKIP: {on}");
        return;
    }
    assert!(
        on.contains("FH_FRESH heard=true in_window=true late=true"),
        "the new mapping's range was not reported when mmap returned: {on}"
    );
    // Protection off: nothing is heard until the reader reads the unmap (the test can fail).
    let off = run(&[("FH_TEST_DISABLE_HOOKS", "fresh")]);
    assert!(
        off.contains("FH_FRESH heard=false in_window=true late=true"),
        "with `fresh` off the range was heard at once anyway: the test cannot tell: {off}"
    );
}

/// A moving `mremap` reports its destination, and a growing one the part it grew by: whatever a
/// cache held there was of other pages.
#[test]
fn mremap_reports_the_addresses_it_hands_out() {
    if in_child() {
        return;
    }
    monitor::install(MonitorOptions {
        patch_libc: true,
        userfaultfd: false,
    });
    if monitor::status().patched == 0 {
        eprintln!("SKIP: libc not patched");
        return;
    }
    let rec = Recorder::new();
    let _sub = monitor::subscribe(rec.clone());
    let a = map(4 * PAGE);
    // SAFETY: our mapping; its upper half is released so that growing in place may fit (it may
    // also move: either way the new addresses are reported).
    unsafe { libc::munmap((a + 2 * PAGE) as *mut libc::c_void, 2 * PAGE) };
    rec.clear();
    // SAFETY: our (remaining) mapping.
    let b = unsafe {
        libc::mremap(
            a as *mut libc::c_void,
            2 * PAGE,
            4 * PAGE,
            libc::MREMAP_MAYMOVE,
        )
    };
    assert_ne!(b, libc::MAP_FAILED);
    let b = b as usize;
    if b == a {
        assert!(rec.saw_cover(a + 2 * PAGE, 2 * PAGE), "growth in place");
    } else {
        assert!(rec.saw_cover(b, 4 * PAGE), "move to {b:#x}");
    }
    // SAFETY: ours.
    unsafe { libc::munmap(b as *mut libc::c_void, 4 * PAGE) };
}
