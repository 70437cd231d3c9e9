//! Distinct cache lines touched per evicting miss (the "ours-lru" row's op, null backend), for
//! `valgrind --tool=lackey --trace-mem=yes`: one load of a marker word separates the ops, so a
//! trace splits into one segment per op (`scripts/miss-lines` counts the lines in each).
//!
//! Usage: `miss_lines [N]` (default 2000). Prints the marker's address on stderr.
use std::sync::Arc;

use firehose::internals::cache::{Cache, Limits};
use firehose::internals::pin::NullPinner;
use firehose::internals::pin::{Access, Pinner};

static MARKER: u64 = 0;

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(2000);
    let pinner: Arc<dyn Pinner> = Arc::new(NullPinner);
    let limits = Limits {
        max_pinned: 1 << 30,
        max_regions: 1,
    };
    let cache = Cache::new(pinner, limits, None);
    let buf = vec![1u8; 4 * 4096];
    let base = (buf.as_ptr() as usize + 4095) & !4095;
    let addrs = [base, base + 2 * 4096];
    let access = Access(Access::LOCAL_WRITE.0 | Access::REMOTE_WRITE.0 | Access::REMOTE_READ.0);
    eprintln!("marker {:p}", &MARKER);
    for i in 0..n {
        // SAFETY: a plain read of a static.
        unsafe { std::ptr::read_volatile(&MARKER) };
        let r = cache
            .register(std::hint::black_box(addrs[i & 1]), 4096, access)
            .expect("miss");
        cache
            .deregister(std::hint::black_box(r.handle))
            .expect("release");
    }
    // SAFETY: as above (closes the last op's segment).
    unsafe { std::ptr::read_volatile(&MARKER) };
    assert_eq!(cache.stats().misses, n as u64, "every op must be a miss");
}
