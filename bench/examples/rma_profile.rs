//! The Firehose driver's hit path without a device: blocking 8-byte puts from rank 0 to rank 1
//! over the simulated link (`Rma::with_pins`, `SimPins`, a pin-down cache on the null backend),
//! for instruction-level profiling, against the "floor" on the same link (a plain
//! `Link::rdma` WRITE to a buffer registered once, then progress until its completion arrives
//! through the endpoint's RDMA handler, as fh_bench's floor does), e.g.
//!
//! ```text
//! cargo build --release -p firehose-bench --example rma_profile
//! valgrind --tool=callgrind target/release/examples/rma_profile fh 100000
//! valgrind --tool=callgrind target/release/examples/rma_profile floor 100000
//! valgrind --tool=callgrind target/release/examples/rma_profile fh 100000 0     # no inline: the source through the cache
//! valgrind --tool=callgrind target/release/examples/rma_profile get 100000       # blocking 8-byte gets
//! valgrind --tool=callgrind target/release/examples/rma_profile floor-get 100000
//! ```
//!
//! `scripts/profile-put` runs these at N and 2N and prints instructions per op, grouped.
//! `FH_PROGRESS_THREAD` is read as a job of two would read it (`auto`: both ranks get a progress
//! thread, polling next to the measured loop); unset, neither has one.
//!
//! Instructions per put: run N and 2N and divide the difference by N (setup and warm-up cancel
//! out). Rank 1 is progressed by a thread only during setup and warm-up (the first put misses:
//! its move needs the target); it is joined before the measured loop, where a hit needs nothing
//! from the target (the simulator's `Auto` mode runs a one-sided op in the initiator's poll).
//! The simulator's own work (a mutex, a queue) is in both counts.
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Instant;

use firehose::internals::cache::{Cache, Limits};
use firehose::internals::net::NetSettings;
use firehose::internals::net::{Delivery, SimConfig, SimNet};
use firehose::internals::net::{Link, LinkError, Peers, RdmaKind, RdmaOp};
use firehose::internals::pin::NullPinner;
use firehose::internals::rma::Rma;
use firehose::internals::rma::SimPins;
use firehose_proto::FirehoseConfig;

/// Token bit of the floor's own writes (Rma's op ids never have it).
const TAG: u64 = 1 << 63;

fn rank(net: &SimNet, r: u32) -> Arc<Rma> {
    let link: Arc<dyn Link> = net.link(r);
    let settings = match std::env::var_os("FH_PROGRESS_THREAD") {
        Some(_) => NetSettings::from_env().expect("FH_* settings").for_job(2),
        None => NetSettings::default(),
    };
    let peers = Arc::new(Peers::from_link(link, settings).expect("peers"));
    let unbounded = Limits {
        max_pinned: usize::MAX,
        max_regions: usize::MAX,
    };
    let cache = Cache::new(Arc::new(NullPinner), unbounded, None);
    let pins = Box::new(SimPins::new(net.clone(), r));
    let rma = Rma::with_pins(peers, Some(cache), FirehoseConfig::new(r, 2), pins).expect("rma");
    rma.peers().start_progress().expect("progress thread");
    rma
}

/// The measured loop: `scripts/profile-put` counts only what runs inside it
/// (`--toggle-collect`), so the warm-up (the first put's miss, polled with yields while rank 1's
/// thread answers) adds no noise to the difference between N and 2N ops.
#[inline(never)]
fn measured(n: usize, mut op: impl FnMut(u64)) {
    for i in 0..n as u64 {
        op(i);
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let what = args.next().unwrap_or_else(|| "fh".into());
    let n: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(100_000);
    // Third argument: the links' inline WRITE size (rxe: 256; 0: every put registers its
    // source through the pin-down cache).
    let inline: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(256);
    let mut cfg = SimConfig::new(2, 1, Delivery::Auto);
    cfg.slots = NetSettings::default().recv_depth;
    let net = SimNet::new(cfg);
    net.set_max_inline_write(inline);
    let (a, b) = (rank(&net, 0), rank(&net, 1));
    // The target: one page, 4 KiB aligned inside the allocation.
    let target = vec![0u8; 3 * 4096].into_boxed_slice();
    let taddr = (target.as_ptr() as u64 + 4095) & !4095;
    let src = [0x5Au8; 8];
    let mut dst = [0u8; 8];
    let dst_ptr = dst.as_mut_ptr();
    let get_mode = what == "get";

    // Completions of the floor's writes, chained in front of Rma's handler (only for the floor:
    // the chain would be on the measured path of Rma's ops).
    let done = Arc::new(AtomicU64::new(0));
    let prev = a.peers().am().rdma_handler();
    let d = done.clone();
    let floor_mode = what.starts_with("floor");
    floor_mode.then(|| {
        a.peers().am().set_rdma_handler(Some(Box::new(
            move |peer, token, res: Result<(), LinkError>| {
                if token & TAG == 0 {
                    if let Some(p) = &prev {
                        p(peer, token, res);
                    }
                    return;
                }
                res.expect("floor write");
                d.fetch_add(1, Relaxed);
            },
        )))
    });

    // Rank 1 progresses during the warm-up only.
    let stop = Arc::new(AtomicBool::new(false));
    let (s, bb) = (stop.clone(), b.clone());
    let server = std::thread::spawn(move || {
        while !s.load(Relaxed) {
            bb.progress().expect("progress 1");
            std::thread::yield_now();
        }
    });
    let put = || {
        // SAFETY: `src` outlives the blocking wait; it is only read.
        let h = unsafe { a.start(RdmaKind::Write, 1, taddr, src.as_ptr().cast_mut(), 8, false) }
            .expect("start");
        a.wait(h).expect("put");
    };
    let get = || {
        // SAFETY: `dst` outlives the blocking wait; nothing else touches it meanwhile.
        let h = unsafe { a.start(RdmaKind::Read, 1, taddr, dst_ptr, 8, false) }.expect("start");
        a.wait(h).expect("get");
    };
    for _ in 0..10 {
        if get_mode {
            get();
        } else {
            put();
        }
    }
    stop.store(true, Relaxed);
    server.join().unwrap();
    let hits0 = a.stats().fh.hits;

    // SAFETY: `target` lives to the end of main and is only written by the simulator.
    let rkey = unsafe { net.register(1, taddr, 4096) };
    let link = a.peers().link().clone();
    let floor_op = |kind: RdmaKind, i: u64| {
        let op = RdmaOp {
            kind,
            local_addr: match kind {
                RdmaKind::Write => src.as_ptr() as u64,
                RdmaKind::Read => dst_ptr as u64,
            },
            lkey: 0,
            len: 8,
            remote_addr: taddr,
            rkey,
            token: TAG | i,
        };
        let want = done.load(Relaxed) + 1;
        // SAFETY: `src` and `dst` live to the end of main (`src` only read, `dst` only written
        // by the simulator); the target range is registered.
        unsafe { link.rdma(1, op) }.expect("floor post");
        while done.load(Relaxed) < want {
            if a.progress().expect("progress") == 0 {
                std::thread::yield_now();
            }
        }
    };

    let t0 = Instant::now();
    match what.as_str() {
        "fh" => {
            measured(n, |_| put());
            let hits = a.stats().fh.hits - hits0;
            assert_eq!(hits, n as u64, "every measured put must hit");
        }
        "get" => {
            measured(n, |_| get());
            let hits = a.stats().fh.hits - hits0;
            assert_eq!(hits, n as u64, "every measured get must hit");
        }
        "floor" => measured(n, |i| floor_op(RdmaKind::Write, i)),
        "floor-get" => measured(n, |i| floor_op(RdmaKind::Read, i)),
        _ => {
            eprintln!("usage: rma_profile fh|get|floor|floor-get [N] [INLINE]");
            std::process::exit(2);
        }
    }
    let dt = t0.elapsed();
    println!(
        "{what}: {n} blocking 8-byte ops in {:.3} s, {:.0} ns each",
        dt.as_secs_f64(),
        dt.as_nanos() as f64 / n as f64
    );
    drop(target);
}
