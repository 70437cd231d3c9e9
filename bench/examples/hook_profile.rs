//! What the libc hooks add to an application's `munmap`: map and unmap 4 KiB, N times, with the
//! monitor's libc patch installed (`patched`) or not (`plain`), and one subscribed listener that
//! does nothing (so every hook runs the guard and the registry). Run the two alternately and
//! compare: the system calls dominate, and the host moves both.
//!
//! Usage: `hook_profile plain|patched [N]` (default 200000). Prints ns per mmap + munmap.
use std::sync::Arc;
use std::time::Instant;

use firehose::internals::monitor::{self, MemoryListener, MonitorOptions};

struct Nothing;
impl MemoryListener for Nothing {
    fn on_unmap(&self, _addr: usize, _len: usize) {}
}

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let mode = a.get(1).map(String::as_str).unwrap_or("patched");
    let n: usize = a.get(2).and_then(|s| s.parse().ok()).unwrap_or(200_000);
    let _sub = if mode == "patched" {
        monitor::install(MonitorOptions {
            patch_libc: true,
            userfaultfd: false,
        });
        Some(monitor::subscribe(Arc::new(Nothing)))
    } else {
        None
    };
    let t = Instant::now();
    for _ in 0..n {
        // SAFETY: a fresh private mapping, unmapped at once.
        unsafe {
            let p = libc::mmap(
                std::ptr::null_mut(),
                4096,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            assert_ne!(p, libc::MAP_FAILED);
            libc::munmap(p, 4096);
        }
    }
    println!(
        "{mode}: {:.1} ns per mmap + munmap",
        t.elapsed().as_nanos() as f64 / n as f64
    );
}
