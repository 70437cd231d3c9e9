//! fh_core: the Firehose state machine's own cost per op, natively, no network (the transport
//! is a loop in this process and the target pins nothing: `NullPins`).
//!
//! - hit: `acquire` that hits + `release` of an 8-byte put, firehoses already in place, over a
//!   working set of 1, 1024 or 16384 buckets (random order, precomputed), page mode (region =
//!   1 bucket) and region mode (32 buckets). The target: <= 100 ns per put.
//! - miss: every op misses (working set 8x a peer's share F): acquire, the move through the
//!   target's `handle_message`, the reply, `Ready`, `release`: the full bookkeeping of a miss,
//!   both sides, without the network and without `ibv_reg_mr`.
//!
//! Batches of `--ops` ops; latency = per-op mean of each batch, then typical (median), min, avg
//! and p99 over `--batches` batches. Table in perftest's layout, or `--json` (one object per row).

#[path = "../../cli.rs"]
mod cli;
#[path = "../../null_pins.rs"]
mod null_pins;

use firehose_proto::{Acquire, Event, Firehose, FirehoseConfig};
use null_pins::NullPins;
use serde_json::json;
use std::time::Instant;

struct Args {
    ops: usize,
    batches: usize,
    json: bool,
}

const USAGE: &str = "\
usage: fh_core [--ops 200000] [--batches 15] [--quick] [--json]
  Firehose core bookkeeping per op (hit: acquire+release; miss: acquire, move, reply, ready,
  release), in one process with no network and no pinning. --quick: 20000 ops x 5 batches.
";

fn parse() -> Result<Args, String> {
    use lexopt::prelude::*;
    let mut a = Args {
        ops: 200_000,
        batches: 15,
        json: false,
    };
    let mut p = lexopt::Parser::from_env();
    cli::finish((|| {
        while let Some(arg) = p.next()? {
            match arg {
                Long("ops") => a.ops = cli::num(&mut p, "--ops")?,
                Long("batches") => a.batches = cli::num(&mut p, "--batches")?,
                Long("quick") => {
                    a.ops = 20_000;
                    a.batches = 5;
                }
                Long("json") => a.json = true,
                Short('h') | Long("help") => return Ok(None),
                _ => return Err(arg.unexpected()),
            }
        }
        if a.ops == 0 || a.batches == 0 {
            return Err("--ops and --batches must be > 0".into());
        }
        Ok(Some(()))
    })())?;
    Ok(a)
}

struct Pair {
    a: Firehose,
    b: Firehose,
    pins: NullPins,
}

impl Pair {
    fn new(region: u32, f_buckets: usize, size: u32) -> Pair {
        let cfg = |r| {
            let mut c = FirehoseConfig::new(r, size);
            c.bucket_size = 4096;
            c.m_bytes = f_buckets * 4096 * (size as usize - 1);
            c.max_victim_bytes = f_buckets * 4096;
            c.max_region_buckets = region;
            c
        };
        Pair {
            a: Firehose::new(cfg(0)).expect("config"),
            b: Firehose::new(cfg(1)).expect("config"),
            pins: NullPins(0),
        }
    }

    /// Carries messages both ways until none is left.
    fn pump(&mut self) {
        loop {
            let mut moved = false;
            while let Some((_, m)) = self.a.poll_transmit() {
                self.b.handle_message(0, &m, &mut self.pins).expect("move");
                moved = true;
            }
            while let Some((_, m)) = self.b.poll_transmit() {
                self.a.handle_message(1, &m, &mut self.pins).expect("reply");
                moved = true;
            }
            if !moved {
                break;
            }
        }
    }

    /// One op to completion through whatever path it takes.
    #[inline]
    fn op(&mut self, id: u64, addr: u64) -> bool {
        match self.a.acquire(id, 1, addr, 8, None).expect("acquire") {
            Acquire::Hit(s) => {
                std::hint::black_box(&s);
                self.a.release(id).expect("release");
                true
            }
            Acquire::Pending => {
                self.pump();
                match self.a.poll_event() {
                    Some(Event::Ready { op, segs }) => {
                        std::hint::black_box(&segs);
                        self.a.release(op).expect("release");
                    }
                    e => panic!("expected Ready, got {e:?}"),
                }
                false
            }
            Acquire::DoneInMove => unreachable!("no small puts here"),
        }
    }
}

/// A seeded sequence of bucket addresses in a working set.
fn addrs(ws: u64, n: usize, seed: u64) -> Vec<u64> {
    let mut rng = fastrand::Rng::with_seed(seed);
    (0..n)
        .map(|_| 0x7000_0000_0000 + rng.u64(..ws) * 4096 + 64)
        .collect()
}

struct Row {
    test: &'static str,
    region: u32,
    ws: u64,
    ops: usize,
    hit_pct: f64,
    ns: Vec<f64>,
}

fn measure(test: &'static str, region: u32, ws: u64, f: usize, a: &Args) -> Row {
    let mut p = Pair::new(region, f, 2);
    let seq = addrs(ws, a.ops.max(1 << 16), 42);
    let mut id = 0u64;
    // Warm: every bucket of the working set once (the hit rows then hit throughout).
    for b in 0..ws.min(f as u64) {
        id += 1;
        p.op(id, 0x7000_0000_0000 + b * 4096 + 64);
    }
    let (mut hits, mut total) = (0usize, 0usize);
    let mut ns = Vec::with_capacity(a.batches);
    for _ in 0..a.batches {
        let t = Instant::now();
        for i in 0..a.ops {
            id += 1;
            hits += p.op(id, seq[i % seq.len()]) as usize;
        }
        ns.push(t.elapsed().as_nanos() as f64 / a.ops as f64);
        total += a.ops;
    }
    ns.sort_by(|x, y| x.partial_cmp(y).unwrap());
    Row {
        test,
        region,
        ws,
        ops: total,
        hit_pct: 100.0 * hits as f64 / total as f64,
        ns,
    }
}

fn main() {
    let a = cli::or_exit(parse(), "fh_core", USAGE);
    let mut rows = Vec::new();
    for region in [1u32, 32] {
        for ws in [1u64, 1024, 16384] {
            rows.push(measure("hit", region, ws, 32768, &a));
        }
    }
    for region in [1u32, 32] {
        rows.push(measure("miss", region, 8 * 1024, 1024, &a));
    }
    let rule = "-".repeat(96);
    if !a.json {
        println!("{rule}\n fh_core: Firehose state machine bookkeeping per 8-byte put, natively, no network, no pinning\n{rule}");
        println!(" test  region[buckets]  working set[buckets]  #ops        hit[%]   t_min[ns]  t_typical[ns]  t_avg[ns]  t_p99[ns]");
    }
    for r in &rows {
        let avg = r.ns.iter().sum::<f64>() / r.ns.len() as f64;
        let typ = r.ns[r.ns.len() / 2];
        let p99 = r.ns[((r.ns.len() as f64 * 0.99) as usize).min(r.ns.len() - 1)];
        if a.json {
            println!(
                "{}",
                json!({"test": r.test, "region_buckets": r.region, "working_set_buckets": r.ws,
                       "ops": r.ops, "hit_pct": r.hit_pct, "ns_min": r.ns[0], "ns_typical": typ,
                       "ns_avg": avg, "ns_p99": p99})
            );
        } else {
            println!(
                " {:<5} {:<16} {:<21} {:<11} {:<8.2} {:<10.1} {:<14.1} {:<10.1} {:<10.1}",
                r.test, r.region, r.ws, r.ops, r.hit_pct, r.ns[0], typ, avg, p99
            );
        }
    }
    if !a.json {
        println!("{rule}\n target: hit (acquire + release) <= 100 ns per put\n{rule}");
    }
}
