//! The patched `mremap` computes the range a shrink takes away as
//! `page_span(old + new_size, old_size - new_size)` (src/monitor/ranges.rs, `mremap_ranges`).
//! With `old` near the top of the address space, `old + new_size` overflows: a debug build
//! panicked inside the `extern "C"` hook, which cannot unwind, so the process aborted where glibc
//! (and the unpatched kernel call) just fail the call (EFAULT or EINVAL, as the kernel says).

mod monitor_util;

use firehose::monitor::{self, ranges::mremap_ranges, MonitorOptions};
use monitor_util::{in_child, run_in_child};

/// Top page of the address space: never mapped, so the kernel answers EINVAL.
const OLD: usize = usize::MAX & !0xfff;

/// The pure range function: a shrink whose old end wraps must not panic (an overflowing range
/// is `None`, as `page_span` answers for `addr + len` past the end).
#[test]
fn mremap_ranges_does_not_panic_on_wrapping_shrink() {
    let r = std::panic::catch_unwind(|| mremap_ranges(OLD, 0x3000, 0x2000, 0, 0));
    assert!(
        r.is_ok(),
        "mremap_ranges panicked on old={OLD:#x} old_size=0x3000 new_size=0x2000"
    );
}

/// The patched libc entry itself: run in a child (an abort would take the test runner down).
#[test]
fn patched_mremap_with_wrapping_shrink_fails_as_the_kernel_does() {
    if in_child() {
        let st = monitor::install(MonitorOptions {
            patch_libc: true,
            userfaultfd: false,
        });
        assert!(st.patched & monitor::Hooked::Mremap.bit() != 0, "{st:?}");
        // What the kernel answers without the library: the raw system call (not patched).
        // SAFETY: the kernel rejects this request (nothing is mapped at the top page).
        let raw = unsafe { libc::syscall(libc::SYS_mremap, OLD, 0x3000usize, 0x2000usize, 0) };
        let raw_errno = std::io::Error::last_os_error().raw_os_error();
        assert_eq!(raw, -1);
        // SAFETY: as above, through the patched libc entry.
        let r = unsafe { libc::mremap(OLD as *mut _, 0x3000, 0x2000, 0) };
        assert_eq!(r, libc::MAP_FAILED);
        assert_eq!(
            std::io::Error::last_os_error().raw_os_error(),
            raw_errno,
            "the same error as the kernel's own"
        );
        return;
    }
    run_in_child(
        "patched_mremap_with_wrapping_shrink_fails_as_the_kernel_does",
        &[],
    );
}
