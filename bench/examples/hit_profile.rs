//! The hit path alone (register + deregister of one cached 4 KiB range, counting backend), for
//! instruction-level profiling, e.g.
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

use firehose::cache::{Cache, Limits};
use firehose::pin::counting::CountingPinner;
use firehose::pin::{Access, Pinner};

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
    let buf = vec![0u8; 1 << 16];
    let addr = buf.as_ptr() as usize;
    let access = Access(Access::LOCAL_WRITE.0 | Access::REMOTE_WRITE.0 | Access::REMOTE_READ.0);
    let first = cache
        .register(addr, 4096, access)
        .expect("first registration");
    cache.deregister(first.handle).expect("release");
    let t = std::time::Instant::now();
    for _ in 0..n {
        let r = cache
            .register(std::hint::black_box(addr), 4096, access)
            .expect("hit");
        cache
            .deregister(std::hint::black_box(r.handle))
            .expect("release");
    }
    let ns = t.elapsed().as_nanos() as f64 / n as f64;
    let hits = cache.stats().hits;
    assert_eq!(hits, n as u64, "every timed op must be a hit");
    eprintln!("{ns:.2} ns per register+deregister ({n} hits)");
}
