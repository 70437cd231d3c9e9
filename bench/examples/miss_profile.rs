//! The miss path alone: register + deregister of 4 KiB ranges where every op pins and unpins, as
//! in firehose-bench's miss rows: by default through a cache that keeps nothing
//! (`max_regions = 0`, the "ours" row), with `lru` through a cache that keeps one region while
//! the ops alternate between two ranges (each miss evicts the other: the "ours-lru" row).
//! For instruction-level profiling of the cache's own bookkeeping, e.g.
//!
//! ```text
//! cargo build --release -p firehose-bench --example miss_profile
//! valgrind --tool=callgrind target/release/examples/miss_profile 100000
//! strace -c -f target/release/examples/miss_profile 100000 mlock
//! ```
//!
//! Usage: `miss_profile [N] [null|mlock] [lru|raw] [BYTES]`. Backend `null` (default) pins nothing, so
//! only the cache's bookkeeping runs; `raw` calls the backend directly (the same two alternating
//! ranges as `lru`), the reference for the cache's overhead.
//!
//! Besides the total, it prints the time spent outside the backend (TSC ticks around each backend
//! call, converted with the wall clock): with mlock, that is the cache's bookkeeping as it runs
//! between system calls (colder than with the null backend), without the syscalls' own noise.
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use firehose::internals::cache::{Cache, Limits};
use firehose::internals::pin::MlockPinner;
use firehose::internals::pin::NullPinner;
use firehose::internals::pin::{Access, Pinner};

/// Counts TSC ticks spent inside the wrapped backend.
struct Timed {
    inner: Arc<dyn Pinner>,
    ticks: AtomicU64,
}

fn tsc() -> u64 {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: rdtsc has no preconditions.
    unsafe {
        core::arch::x86_64::_rdtsc()
    }
    #[cfg(not(target_arch = "x86_64"))]
    0
}

impl Pinner for Timed {
    fn pin(
        &self,
        addr: usize,
        len: usize,
        access: Access,
    ) -> Result<firehose::internals::pin::Pinned, firehose::internals::pin::PinError> {
        let t = tsc();
        let r = self.inner.pin(addr, len, access);
        self.ticks.fetch_add(tsc() - t, Ordering::Relaxed);
        r
    }
    fn unpin(&self, p: firehose::internals::pin::Pinned, addr: usize, len: usize) {
        let t = tsc();
        self.inner.unpin(p, addr, len);
        self.ticks.fetch_add(tsc() - t, Ordering::Relaxed);
    }
    fn name(&self) -> &'static str {
        "timed"
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let n: usize = args
        .first()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1_000_000);
    let inner: Arc<dyn Pinner> = match args.get(1).map(String::as_str) {
        Some("mlock") => Arc::new(MlockPinner::new()),
        _ => Arc::new(NullPinner),
    };
    let timed = Arc::new(Timed {
        inner,
        ticks: AtomicU64::new(0),
    });
    let pinner: Arc<dyn Pinner> = timed.clone();
    // TSC ticks per ns, from the wall clock over the whole run.
    let (t_start, tsc_start) = (std::time::Instant::now(), tsc());
    let outside = |n: usize| {
        let per_ns = (tsc() - tsc_start) as f64 / t_start.elapsed().as_nanos() as f64;
        let inside_ns = timed.ticks.load(Ordering::Relaxed) as f64 / per_ns;
        let total_ns = t_start.elapsed().as_nanos() as f64;
        (total_ns - inside_ns) / n as f64
    };
    let mode = args.get(2).map(String::as_str).unwrap_or("");
    let lru = mode == "lru" || mode == "raw";
    let size: usize = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(4096);
    let limits = Limits {
        max_pinned: 1 << 30,
        max_regions: lru as usize,
    };
    let cache = Cache::new(pinner.clone(), limits, None);
    let buf = vec![1u8; 2 * size + 8192];
    let base = (buf.as_ptr() as usize + 4095) & !4095;
    let addrs = [base, if lru { base + size + 4096 } else { base }];
    let access = Access(Access::LOCAL_WRITE.0 | Access::REMOTE_WRITE.0 | Access::REMOTE_READ.0);
    if mode == "raw" {
        let t = std::time::Instant::now();
        for i in 0..n {
            let a = std::hint::black_box(addrs[i & 1]);
            let p = pinner.pin(a, size, access).expect("pin");
            pinner.unpin(p, a, size);
        }
        let ns = t.elapsed().as_nanos() as f64 / n as f64;
        eprintln!(
            "{ns:.1} ns per pin+unpin (raw backend), {:.1} ns outside the backend",
            outside(n)
        );
        return;
    }
    let t = std::time::Instant::now();
    for i in 0..n {
        let r = cache
            .register(std::hint::black_box(addrs[i & 1]), size, access)
            .expect("miss");
        cache
            .deregister(std::hint::black_box(r.handle))
            .expect("release");
    }
    let ns = t.elapsed().as_nanos() as f64 / n as f64;
    let s = cache.stats();
    assert_eq!(s.misses, n as u64, "every op must be a miss");
    assert_eq!(s.regions, lru as u64, "what stays cached");
    eprintln!(
        "{ns:.1} ns per register+deregister ({n} misses), {:.1} ns outside the backend",
        outside(n)
    );
}
