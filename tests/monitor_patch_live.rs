//! Patching libc while other threads are inside the patched functions (many of them parked in the
//! `syscall` instruction) must not crash them. The old 13-byte absolute jump overwrote the bytes
//! after `syscall` in munmap/madvise, and a thread returning from the kernel ran garbage (SIGSEGV,
//! seen under the test harness). Own process: the patch is process-wide and happens once.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use firehose::monitor::{self, MonitorOptions};

#[test]
fn patching_under_threads_that_are_inside_the_functions() {
    let page = 4096usize;
    let stop = Arc::new(AtomicBool::new(false));
    let ops = Arc::new(AtomicU64::new(0));
    let workers: Vec<_> = (0..3)
        .map(|_| {
            let (stop, ops) = (stop.clone(), ops.clone());
            std::thread::spawn(move || {
                while !stop.load(Relaxed) {
                    // SAFETY: fresh private anonymous mapping, used and unmapped here only.
                    unsafe {
                        let p = libc::mmap(
                            std::ptr::null_mut(),
                            16 * page,
                            libc::PROT_READ | libc::PROT_WRITE,
                            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                            -1,
                            0,
                        );
                        assert_ne!(p, libc::MAP_FAILED);
                        *(p as *mut u8) = 1;
                        assert_eq!(libc::madvise(p, 16 * page, libc::MADV_DONTNEED), 0);
                        assert_eq!(libc::munmap(p, 16 * page), 0);
                    }
                    ops.fetch_add(1, Relaxed);
                }
            })
        })
        .collect();
    // Let the workers get going, so the patch lands while they are in and out of the kernel.
    let t0 = Instant::now();
    while ops.load(Relaxed) < 10_000 && t0.elapsed() < Duration::from_secs(5) {
        std::thread::yield_now();
    }
    let st = monitor::install(MonitorOptions {
        patch_libc: true,
        userfaultfd: false,
    });
    assert_eq!(st.patched, 0b11_1111, "all six functions patched: {st:?}");
    let before = ops.load(Relaxed);
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, Relaxed);
    for w in workers {
        w.join().expect("a worker died");
    }
    // The workers kept running through the patched functions (no crash, real progress).
    assert!(
        ops.load(Relaxed) > before + 100,
        "workers made no progress after patching"
    );
}
