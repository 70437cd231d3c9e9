//! The Firehose core's hit (`acquire` that hits + `release`, as `fh_core`'s hit rows) alone, for
//! instruction and cache-line profiling, e.g.
//!
//! ```text
//! cargo build --release -p firehose-bench --example core_profile
//! valgrind --tool=callgrind target/release/examples/core_profile 200000 16384 1
//! valgrind --tool=cachegrind --cache-sim=yes target/release/examples/core_profile 200000 16384 1
//! ```
//!
//! Arguments: ops, working set in buckets (random order), buckets per region. Per-op counts:
//! run N and 2N and divide the difference by N (setup and warm-up cancel out). The timing it
//! prints is a sanity check only; `fh_core` is the benchmark.
use std::time::Instant;

use firehose_proto::{Acquire, Firehose, FirehoseConfig};

#[path = "../src/null_pins.rs"]
mod null_pins;
use null_pins::NullPins;

fn arg(i: usize, default: u64) -> u64 {
    std::env::args()
        .nth(i)
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let n = arg(1, 1_000_000) as usize;
    let ws = arg(2, 16384).max(1);
    let region = arg(3, 1) as u32;
    let f = 32768usize;
    let cfg = |r| {
        let mut c = FirehoseConfig::new(r, 2);
        c.bucket_size = 4096;
        c.m_bytes = f * 4096;
        c.max_victim_bytes = f * 4096;
        c.max_region_buckets = region;
        c
    };
    let mut a = Firehose::new(cfg(0)).expect("config");
    let mut b = Firehose::new(cfg(1)).expect("config");
    let mut pins = NullPins(0);
    let base = 0x7000_0000_0000u64;
    let mut id = 0u64;
    // Warm-up: every bucket once, through the move (so the loop below only hits).
    for k in 0..ws {
        id += 1;
        match a
            .acquire(id, 1, base + k * 4096 + 64, 8, None)
            .expect("acquire")
        {
            Acquire::Hit(_) => {}
            Acquire::Pending => loop {
                let mut moved = false;
                while let Some((_, m)) = a.poll_transmit() {
                    b.handle_message(0, &m, &mut pins).expect("move");
                    moved = true;
                }
                while let Some((_, m)) = b.poll_transmit() {
                    a.handle_message(1, &m, &mut pins).expect("reply");
                    moved = true;
                }
                if !moved {
                    a.poll_event().expect("ready");
                    break;
                }
            },
            Acquire::DoneInMove => unreachable!("no small puts"),
        }
        a.release(id).expect("release");
    }
    let mut rng = fastrand::Rng::with_seed(42);
    let seq: Vec<u64> = (0..1 << 16)
        .map(|_| base + rng.u64(..ws) * 4096 + 64)
        .collect();
    let t = Instant::now();
    for i in 0..n {
        id += 1;
        match a.acquire(id, 1, seq[i & 0xffff], 8, None) {
            Ok(Acquire::Hit(segs)) => {
                std::hint::black_box(&segs);
                a.release(id).expect("release");
            }
            other => panic!("expected a hit: {other:?}"),
        }
    }
    println!(
        "{n} hits, working set {ws} buckets, region {region}: {:.1} ns per op",
        t.elapsed().as_nanos() as f64 / n as f64
    );
}
