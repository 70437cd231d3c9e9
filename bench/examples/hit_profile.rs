//! The hit path alone (register + deregister of a cached 4 KiB range, counting backend), for
//! instruction-level profiling; `hit_profile OPS REGIONS` hits REGIONS cached ranges in a random
//! order (for cachegrind: the lines a hit touches at 10^5 regions), e.g.
//!
//! ```text
//! cargo build --release -p firehose-bench --example hit_profile
//! valgrind --tool=callgrind --dump-instr=yes target/release/examples/hit_profile 1000000
//! ```
//!
//! No hardware counters are visible on the shared VMs, so callgrind's instruction count is the
//! repeatable measure; the timing printed here is only a sanity check (use `firehose-bench` for
//! numbers that are compared with UCX).
use std::sync::Arc;

use firehose::internals::cache::{Cache, Limits};
use firehose::internals::pin::CountingPinner;
use firehose::internals::pin::{Access, Pinner};

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(50_000_000);
    let pinner: Arc<dyn Pinner> = Arc::new(CountingPinner::new());
    let unbounded = Limits {
        max_pinned: usize::MAX,
        max_regions: usize::MAX,
    };
    let cache = Cache::new(pinner, unbounded, None);
    // Optional second argument: that many cached 4 KiB regions side by side (as
    // firehose-bench's hit rows), hit in a random order: the case whose lines matter.
    let regions: usize = std::env::args()
        .nth(2)
        .and_then(|s| s.parse().ok())
        .unwrap_or(1)
        .max(1);
    let buf = vec![0u8; (regions + 1) * 4096];
    let base = (buf.as_ptr() as usize + 4095) & !4095;
    let access = Access(Access::LOCAL_WRITE.0 | Access::REMOTE_WRITE.0 | Access::REMOTE_READ.0);
    for i in 0..regions {
        let first = cache
            .register(base + i * 4096, 4096, access)
            .expect("first registration");
        cache.deregister(first.handle).expect("release");
    }
    let mut rng = fastrand::Rng::with_seed(0x9E37_79B9);
    let seq: Vec<usize> = (0..1 << 16)
        .map(|_| {
            let x = rng.u64(..);
            base + (x % regions as u64) as usize * 4096
        })
        .collect();
    let before = cache.stats().hits;
    let t = std::time::Instant::now();
    for i in 0..n {
        // One region: the same address every time, as before the random mode (comparable
        // instruction counts).
        let addr = if regions == 1 { base } else { seq[i & 0xffff] };
        let r = cache
            .register(std::hint::black_box(addr), 4096, access)
            .expect("hit");
        cache
            .deregister(std::hint::black_box(r.handle))
            .expect("release");
    }
    let ns = t.elapsed().as_nanos() as f64 / n as f64;
    let hits = cache.stats().hits - before;
    assert_eq!(hits, n as u64, "every timed op must be a hit");
    eprintln!("{ns:.2} ns per register+deregister ({n} hits, {regions} regions)");
}
