//! `--test rma`: what fh_put and fh_get cost an application that tunes nothing, next to the
//! floor, on 2 ranks (rank 0 measures; rank 1 sleeps until STOP when its progress thread
//! runs, the default in a job of two, and polls otherwise: `Ctx::serve_rma`).
//! scripts/bench-rma-compare sets these numbers beside OpenSHMEM's and MPI's one-sided paths
//! measured on the same boot.
//!
//! The remote bytes are the first 256 KiB of rank 1's exposed buffer (the anchors' window,
//! bench/anchor): 8-byte ops go to random 8-byte slots of it, `--bw-size` ops to random aligned
//! slots. Four points in this order: 8-byte put latency, `--bw-size` put bandwidth, 8-byte get
//! latency, `--bw-size` get bandwidth. At each point both ways warm up (one op at every 4 KiB
//! of the 256 KiB, so every Firehose region is held and every timed op is a hit, then
//! `--warmup` random ops), then their timed `--batches` batches run interleaved, as the sweeps'
//! (sweep.rs). `--rma-points` and `--series` keep some of them (a profile of one point).
//!
//! - `firehose`: `rma::Rma::start` + `wait` (fh_put / fh_get's engine): the local side through
//!   the pin-down cache (a short put inline), the remote side through Firehose.
//! - `floor`: both sides registered once (rank 1's buffer and our source / destination), a
//!   plain RDMA WRITE or READ posted on the same link and completed through the same progress
//!   path (transport.rs): what the library's own post and completion cost with no lookup.
//!
//! Latency is per op, timed alone (TSC), typical = median; bandwidth is per batch with the
//! window drained at its end (BW peak = the best batch, as in the sweeps).

use std::time::Instant;

use firehose::internals::net::RdmaKind;
use firehose_proto::FirehoseStats;

use crate::args::{Args, Test, RMA_POINTS};
use crate::clock::{ns_per_tick, Clock, Kind};
use crate::report::{Report, Row};
use crate::served::{self, Exposed, STOP};
use crate::sweep::Rng;
use crate::transport::{Firehose, Floor};
use crate::{fail, Ctx};

/// The remote working set (the anchors' 256 KiB).
pub const WS: usize = 256 << 10;

/// Bytes rank 1 exposes for `rma`.
pub fn target_len(a: &Args) -> usize {
    WS.max(a.bw_size).next_multiple_of(2 << 20)
}

/// One of the two ways, both driven through `start` + `quiet`.
enum Way {
    Floor(Floor),
    Firehose(Firehose),
}

impl Way {
    fn is_firehose(&self) -> bool {
        matches!(self, Way::Firehose(_))
    }

    fn series(&self, kind: RdmaKind) -> &'static str {
        match (self, kind) {
            (Way::Floor(_), RdmaKind::Write) => "floor_put",
            (Way::Floor(_), RdmaKind::Read) => "floor_get",
            (Way::Firehose(_), RdmaKind::Write) => "firehose_put",
            (Way::Firehose(_), RdmaKind::Read) => "firehose_get",
        }
    }

    /// # Safety
    /// `local` as `Firehose::start` / `Floor::start` want it (the bench's 'static buffers).
    unsafe fn start(&mut self, kind: RdmaKind, raddr: u64, local: *mut u8, len: usize) {
        // SAFETY: forwarded.
        unsafe {
            match self {
                Way::Floor(f) => f.start(kind, 1, raddr, local, len),
                Way::Firehose(f) => f.start(kind, 1, raddr, local, len),
            }
        }
    }

    fn quiet(&mut self) {
        use crate::transport::Transport;
        match self {
            Way::Floor(f) => f.quiet(),
            Way::Firehose(f) => f.quiet(),
        }
    }
}

struct Point {
    kind: RdmaKind,
    size: usize,
    latency: bool,
    n: usize,
}

pub fn run(ctx: &Ctx, a: &Args, rep: &mut Report) {
    let target = *served::info(ctx.peers.am(), 1)
        .first()
        .unwrap_or_else(|| fail("rank 1 exposes no buffer"));
    let ws = WS.max(a.bw_size);
    if (target.len as usize) < ws || a.bw_size > ctx.src.len() || a.bw_size > ctx.dst_len {
        fail("rma: buffers smaller than the working set or --bw-size");
    }
    let mut remote = vec![Vec::<Exposed>::new(); ctx.peers.size() as usize];
    remote[1] = vec![target];
    let wanted = |name: &str| a.series.is_empty() || a.series.iter().any(|s| s == name);
    let mut ways = Vec::new();
    if wanted("floor") {
        ways.push(Way::Floor(Floor::new(ctx, a.window, remote)));
    }
    if wanted("firehose") {
        ways.push(Way::Firehose(Firehose::new(ctx, a.window)));
    }
    if ways.is_empty() {
        fail("rma: --series names neither floor nor firehose");
    }
    let mut rng = Rng::with_seed(0x5EED_0000 + Test::Rma as u64);
    let points = [
        (RdmaKind::Write, true),
        (RdmaKind::Write, false),
        (RdmaKind::Read, true),
        (RdmaKind::Read, false),
    ]
    .map(|(kind, latency)| Point {
        kind,
        size: if latency { 8 } else { a.bw_size },
        latency,
        n: if latency { a.iters } else { a.bw_msgs },
    });
    for (i, p) in points.iter().enumerate() {
        if !(a.rma_points.is_empty() || a.rma_points.iter().any(|x| x == RMA_POINTS[i])) {
            continue;
        }
        for row in measure(ctx, a, &mut ways, target.addr, ws, p, &mut rng, i) {
            rep.add(Test::Rma, row);
        }
    }
    if let Err(e) = ctx.peers.am().send_oneway(1, STOP, &[]) {
        fail(format!("STOP to rank 1: {e:?}"));
    }
}

/// The local side of an op of `p`: the pattern-filled source (puts, only read) or the get
/// destination (written only by the NIC).
fn local(ctx: &Ctx, p: &Point) -> *mut u8 {
    match p.kind {
        RdmaKind::Write => ctx.src.as_ptr().cast_mut(),
        RdmaKind::Read => ctx.dst,
    }
}

fn slot(ws: usize, size: usize, rng: &mut Rng) -> u64 {
    rng.u64(..(ws / size) as u64) * size as u64
}

#[allow(clippy::too_many_arguments)]
fn measure(
    ctx: &Ctx,
    a: &Args,
    ways: &mut [Way],
    base: u64,
    ws: usize,
    p: &Point,
    rng: &mut Rng,
    point: usize,
) -> Vec<Row> {
    let loc = local(ctx, p);
    // SAFETY (every `start` below): `loc` is one of the bench's 'static buffers of at least
    // `p.size` bytes, registered in `LocalKeys` (the floor); a put only reads it, a get's
    // destination is never read or written by the bench, and every op is drained (`quiet`)
    // before the point ends.
    for w in ways.iter_mut() {
        for off in (0..ws).step_by(p.size.max(4096)) {
            unsafe { w.start(p.kind, base + off as u64, loc, p.size) };
        }
        for _ in 0..a.warmup {
            let off = slot(ws, p.size, rng);
            unsafe { w.start(p.kind, base + off, loc, p.size) };
        }
        w.quiet();
    }
    let batches = if p.latency {
        a.batches.min(p.n).max(1)
    } else {
        (p.n / (2 * a.window)).clamp(a.batches, 8).min(p.n).max(1)
    };
    let per = (p.n / batches).max(1);
    let mut samples: Vec<Vec<f64>> = vec![Vec::new(); ways.len()];
    let mut issue: Vec<Vec<f64>> = vec![Vec::new(); ways.len()];
    let mut fh = FirehoseStats::default();
    let am_before = ctx.peers.am().stats();
    for b in 0..batches {
        for j in 0..ways.len() {
            let i = (point + b + j) % ways.len();
            let w = &mut ways[i];
            let before = ctx.rma.stats().fh;
            if p.latency {
                let kind = Kind::default_for_target();
                let clock = Clock::new(kind);
                let (t0, c0) = (Instant::now(), clock.now());
                let mut ticks = Vec::with_capacity(per);
                let mut issued = Vec::with_capacity(per);
                for _ in 0..per {
                    let off = slot(ws, p.size, rng);
                    let c = clock.now();
                    unsafe { w.start(p.kind, base + off, loc, p.size) };
                    let ci = clock.now();
                    w.quiet();
                    let ce = clock.now();
                    ticks.push(ce - c);
                    issued.push(ci - c);
                }
                let f = ns_per_tick(kind, clock.now() - c0, t0.elapsed().as_nanos() as u64);
                issue[i].extend(issued.iter().map(|&x| x as f64 * f / 1e3));
                samples[i].extend(ticks.iter().map(|&x| x as f64 * f / 1e3));
            } else {
                let t0 = Instant::now();
                for _ in 0..per {
                    let off = slot(ws, p.size, rng);
                    unsafe { w.start(p.kind, base + off, loc, p.size) };
                }
                w.quiet();
                samples[i].push(t0.elapsed().as_secs_f64() * 1e6 / per as f64);
            }
            if w.is_firehose() {
                let after = ctx.rma.stats().fh;
                fh.hits += after.hits - before.hits;
                fh.misses += after.misses - before.misses;
                fh.moves_sent += after.moves_sent - before.moves_sent;
                fh.puts_in_move += after.puts_in_move - before.puts_in_move;
            }
        }
    }
    // What this rank's progress thread did while the batches ran (stderr: the tables stay as
    // they are): with the defaults it should sleep while the measuring thread waits.
    if ctx.peers.settings().progress_thread {
        let am_after = ctx.peers.am().stats();
        eprintln!(
            "# rank 0 progress thread, {:?} {} B {}: {} wake-ups, {} events handled",
            p.kind,
            p.size,
            if p.latency { "latency" } else { "bandwidth" },
            am_after.progress_wakeups - am_before.progress_wakeups,
            am_after.progress_thread_events - am_before.progress_thread_events,
        );
    }
    let remote = served::stats(ctx.peers.am(), 1);
    ways.iter()
        .zip(samples.into_iter().zip(issue))
        .map(|(w, (s, iss))| {
            let f = w.is_firehose();
            Row::new(
                w.series(p.kind),
                ws,
                p.size,
                per * batches,
                s,
                iss,
                p.latency,
                f.then_some((FirehoseStats::default(), fh)),
                f.then_some(remote),
            )
        })
        .collect()
}
