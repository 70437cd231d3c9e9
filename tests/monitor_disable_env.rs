//! FH_TEST_DISABLE_HOOKS turns single paths off: with `munmap` disabled, free of a 64 MiB chunk
//! (glibc's internal __munmap) is not reported while madvise still is. Proves the munmap patch
//! is what catches free.

mod monitor_util;

use firehose::monitor::{self, MonitorOptions};
use monitor_util::{map, Recorder, PAGE};

#[test]
fn disabled_munmap_hook_misses_free_madvise_still_seen() {
    // Read once by install; this file is its own process and has a single test.
    std::env::set_var("FH_TEST_DISABLE_HOOKS", "munmap,uffd");
    let st = monitor::install(MonitorOptions {
        patch_libc: true,
        userfaultfd: true,
    });
    assert_eq!(st.patched & 1, 0, "munmap must not be patched: {st:?}");
    assert_eq!(st.patched, 0b11_1110, "{st:?}");
    assert!(!st.uffd, "uffd disabled by the switch");
    let rec = Recorder::new();
    let _sub = monitor::subscribe(rec.clone());

    let v = vec![1u8; 64 << 20];
    let p = v.as_ptr() as usize;
    rec.clear(); // (malloc's mmap reported the new chunk)
    drop(v);
    assert!(
        !rec.settle_then_overlap(p, 64 << 20),
        "free seen with the munmap hook disabled"
    );

    let a = map(4 * PAGE);
    rec.clear(); // (the mmap reported its new range)
                 // SAFETY: our mapping.
    unsafe { libc::madvise(a as *mut _, 4 * PAGE, libc::MADV_DONTNEED) };
    assert!(
        rec.saw_cover(a, 4 * PAGE),
        "madvise hook should still be active"
    );
    // SAFETY: our mapping.
    unsafe { libc::munmap(a as *mut _, 4 * PAGE) };
}
