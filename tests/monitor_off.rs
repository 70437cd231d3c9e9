//! Control: with patching and userfaultfd both off, glibc-internal and raw-syscall unmaps are NOT
//! reported (proves the other test files see events because of those paths). Only
//! `notify_unmapped` (fh_notify_unmapped) reaches listeners.

mod monitor_util;

use firehose::monitor::{self, MonitorOptions};
use monitor_util::{map, serial, Recorder, PAGE};

#[test]
fn nothing_reported_without_hooks_or_uffd() {
    let _s = serial();
    let st = monitor::install(MonitorOptions {
        patch_libc: false,
        userfaultfd: false,
    });
    assert_eq!(st.patched, 0);
    assert!(!st.uffd);
    let rec = Recorder::new();
    let _sub = monitor::subscribe(rec.clone());

    let v = vec![1u8; 64 << 20];
    let p = v.as_ptr() as usize;
    drop(v);
    assert!(
        !rec.settle_then_overlap(p, 64 << 20),
        "free seen without any monitor path"
    );

    let a = map(4 * PAGE);
    // Watching is a no-op without userfaultfd.
    assert_eq!(monitor::uffd_watch(a, 4 * PAGE), 0);
    // SAFETY: our mapping, unmapped behind every hook's back.
    unsafe { libc::syscall(libc::SYS_munmap, a, 4 * PAGE) };
    assert!(
        !rec.settle_then_overlap(a, 4 * PAGE),
        "raw munmap seen without uffd"
    );

    // The application can still tell us.
    monitor::notify_unmapped(a, 4 * PAGE);
    assert!(rec.saw_cover(a, 4 * PAGE));
}

/// Control for monitor_uffd.rs's brk tests: no uffd, no report (runs in a child like those).
#[test]
fn sbrk_shrink_not_reported_without_uffd() {
    if !monitor_util::in_child() {
        return monitor_util::run_in_child(
            "sbrk_shrink_not_reported_without_uffd",
            &[("MALLOC_ARENA_MAX", "1")],
        );
    }
    let _s = serial();
    monitor::install(MonitorOptions {
        patch_libc: true,
        userfaultfd: false,
    });
    let rec = Recorder::new();
    let _sub = monitor::subscribe(rec.clone());
    // SAFETY: grow and shrink the break by the same amount; the test runs alone in its process.
    unsafe {
        let base = libc::sbrk(0) as usize;
        assert_ne!(libc::sbrk((4 << 20) as libc::intptr_t) as isize, -1);
        std::ptr::write_bytes(base as *mut u8, 1, 4 << 20);
        monitor::uffd_watch(base, 4 << 20);
        libc::sbrk(-((4 << 20) as libc::intptr_t));
        assert!(
            !rec.settle_then_overlap(base, 4 << 20),
            "brk shrink seen without uffd"
        );
    }
}
