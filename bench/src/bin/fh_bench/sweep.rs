//! Figs. 3-5, measured by rank 0 against rank 1's exposed buffer; rank 1 serves (its progress
//! loop runs the Rendezvous handlers and Firehose's moves) until STOP.
//!
//! Per point and per transport (the four in rotating order, so drifts hit them alike):
//! warm-up (one put at every page-or-size stride of the working set, so Rendezvous no-unpin's
//! registrations and Firehose's regions exist, then `--warmup` random puts), then the timed
//! puts in `--batches` batches. Firehose's counters (hits, misses, moves) are the difference
//! over the timed puts; rank 1's pinned-bytes peak is read after every Firehose point and the
//! run fails if it ever exceeds M + MAXVICTIM.

use std::time::Instant;

use firehose_proto::{FirehoseConfig, FirehoseStats};

use crate::args::{Args, Test};
use crate::clock::{ns_per_tick, Clock, Kind};
use crate::report::{Report, Row};
use crate::served::{self, Exposed, STOP};
use crate::transport::{Firehose, Floor, Rendezvous, Transport};
use crate::{fail, Ctx};

/// The sweep's working sets: given, or 0.25x .. 4x of M + MAXVICTIM around both knees.
pub fn sweep(a: &Args, fh: &FirehoseConfig) -> Vec<usize> {
    if !a.sweep.is_empty() {
        return a.sweep.clone();
    }
    let (m, v) = (fh.m_bytes, fh.max_victim_bytes);
    let mut w = vec![
        m / 4,
        m / 2,
        m * 3 / 4,
        m,
        m + v / 2,
        m + v,
        (m + v) * 3 / 2,
        (m + v) * 2,
        (m + v) * 4,
    ];
    // Whole 64 KiB slots (Fig. 4's puts), no duplicates.
    for x in &mut w {
        *x = (*x).max(a.bw_size).next_multiple_of(a.bw_size);
    }
    w.dedup();
    w
}

/// Bytes rank 1 exposes: the largest working set (and the largest message).
pub fn target_len(a: &Args, fh: &FirehoseConfig) -> usize {
    let w = sweep(a, fh).into_iter().max().unwrap_or(0);
    let s = a.sizes.iter().copied().max().unwrap_or(0);
    w.max(s).max(a.bw_size).next_multiple_of(2 << 20)
}

/// The random slots: a seeded RNG (no allocation per draw).
pub use fastrand::Rng;

fn transports(ctx: &Ctx, a: &Args, target: Exposed) -> Vec<Box<dyn Transport>> {
    let mut remote = vec![Vec::new(); ctx.peers.size() as usize];
    remote[1] = vec![target];
    let all: Vec<Box<dyn Transport>> = vec![
        Box::new(Floor::new(ctx, a.window, remote)),
        Box::new(Firehose::new(ctx, a.window)),
        Box::new(Rendezvous::new(ctx, a.window, false)),
        Box::new(Rendezvous::new(ctx, a.window, true)),
    ];
    all.into_iter()
        .filter(|t| a.series.is_empty() || a.series.iter().any(|s| s == t.name()))
        .collect()
}

/// What one point measures.
struct Point {
    ws: usize,
    size: usize,
    /// Random slots (false: always the start of the buffer, Fig. 5).
    random: bool,
    /// Blocking puts timed one by one (latency) or a window of puts (bandwidth).
    latency: bool,
    n: usize,
}

pub fn run(ctx: &Ctx, a: &Args, test: Test, rep: &mut Report) {
    let target = *served::info(ctx.peers.am(), 1)
        .first()
        .unwrap_or_else(|| fail("rank 1 exposes no buffer"));
    let mut ts = transports(ctx, a, target);
    let mut rng = Rng::with_seed(0x5EED_0000 + test as u64);
    let points: Vec<Point> = match test {
        Test::Lat => sweep(a, &ctx.fh)
            .into_iter()
            .map(|ws| Point {
                ws,
                size: 8,
                random: true,
                latency: true,
                n: a.iters,
            })
            .collect(),
        Test::Bw => sweep(a, &ctx.fh)
            .into_iter()
            .map(|ws| Point {
                ws,
                size: a.bw_size,
                random: true,
                latency: false,
                n: a.bw_msgs,
            })
            .collect(),
        Test::Peak => a
            .sizes
            .iter()
            .map(|&s| Point {
                ws: s,
                size: s,
                random: false,
                latency: false,
                n: (a.peak_bytes / s).clamp(20, 2000),
            })
            .collect(),
        Test::App | Test::Rma => unreachable!(),
    };
    for (i, p) in points.iter().enumerate() {
        if p.ws > target.len as usize || p.size > ctx.src.len() {
            fail(format!(
                "working set {} > the exposed {} bytes",
                p.ws, target.len
            ));
        }
        for row in measure(ctx, a, &mut ts, target.addr, p, &mut rng, i) {
            rep.add(test, row);
        }
    }
    // Rendezvous no-unpin's registrations are per test (a later test starts cold, as this one).
    if let Err(e) = ctx.peers.am().send_oneway(1, STOP, &[]) {
        fail(format!("STOP to rank 1: {e:?}"));
    }
}

fn slot(p: &Point, rng: &mut Rng) -> u64 {
    if !p.random {
        return 0;
    }
    rng.u64(..(p.ws / p.size) as u64) * p.size as u64
}

/// What one transport collected over the batches of a point.
#[derive(Default)]
struct Acc {
    samples: Vec<f64>,
    /// Latency only: the part of each put until it was issued (`put_nb` returned).
    issue: Vec<f64>,
    iters: usize,
    fh: Option<(FirehoseStats, FirehoseStats)>,
}

/// One point, all transports: each warms up, then the timed batches run interleaved (batch b of
/// every transport, in an order rotated by point and batch), so a slow spell of the host (other
/// VMs on the same cores) falls on all of them rather than on whichever ran then.
fn measure(
    ctx: &Ctx,
    a: &Args,
    ts: &mut [Box<dyn Transport>],
    base: u64,
    p: &Point,
    rng: &mut Rng,
    point: usize,
) -> Vec<Row> {
    let mut acc: Vec<Acc> = ts.iter().map(|_| Acc::default()).collect();
    for t in ts.iter_mut() {
        warm_up(a, t.as_mut(), base, p, rng, &ctx.src[..p.size]);
    }
    // Bandwidth: at least two windows a batch and up to 8 batches: a batch that hit one of rxe's
    // retransmission stalls (tens of ms on a loaded TCG host, on every transport alike) is then
    // one of several, and the best batch (BW peak) shows what the transport itself costs.
    let batches = if p.latency {
        a.batches.min(p.n).max(1)
    } else {
        (p.n / (2 * a.window)).clamp(a.batches, 8).min(p.n).max(1)
    };
    let k = ts.len();
    for b in 0..batches {
        for j in 0..k {
            let i = (point + b + j) % k;
            let t = ts[i].as_mut();
            let unpin = t.name() == "rdv_unpin";
            let n = if unpin && p.latency {
                a.unpin_iters
            } else if unpin {
                p.n.div_ceil(2)
            } else {
                p.n
            };
            let per = (n / batches).max(1);
            let before = ctx.rma.stats().fh;
            let x = &mut acc[i];
            batch(t, base, p, rng, &ctx.src[..p.size], per, x);
            let after = ctx.rma.stats().fh;
            acc[i].iters += per;
            if t.name() == "firehose" {
                let zero = FirehoseStats::default();
                let (_, a0) = acc[i].fh.get_or_insert((zero, zero));
                a0.hits += after.hits - before.hits;
                a0.misses += after.misses - before.misses;
                a0.moves_sent += after.moves_sent - before.moves_sent;
                a0.puts_in_move += after.puts_in_move - before.puts_in_move;
            }
        }
    }
    let remote = served::stats(ctx.peers.am(), 1);
    let mut bound = (ctx.fh.m_bytes + ctx.fh.max_victim_bytes) as u64;
    // FH_BENCH_BREAK=1 checks against M alone, which a sweep past M exceeds by design: the
    // suite's smoke test (65-fh-bench) proves with it that the check can fail.
    if std::env::var_os("FH_BENCH_BREAK").is_some_and(|v| v == "1") {
        bound = ctx.fh.m_bytes as u64;
    }
    if remote.pinned_peak > bound {
        fail(format!(
            "rank 1 pinned {} bytes for Firehose, over M + MAXVICTIM = {bound}",
            remote.pinned_peak
        ));
    }
    ts.iter()
        .zip(acc)
        .map(|(t, x)| {
            let fh = t.name() == "firehose";
            Row::new(
                t.name(),
                p.ws,
                p.size,
                x.iters,
                x.samples,
                x.issue,
                p.latency,
                x.fh,
                fh.then_some(remote),
            )
        })
        .collect()
}

/// Every stride of the working set once (Rendezvous no-unpin's registrations and Firehose's
/// regions then exist), then random puts. With-unpin has nothing to warm but the path.
fn warm_up(
    a: &Args,
    t: &mut dyn Transport,
    base: u64,
    p: &Point,
    rng: &mut Rng,
    src: &'static [u8],
) {
    let unpin = t.name() == "rdv_unpin";
    if !unpin {
        for off in (0..p.ws).step_by(p.size.max(4096)) {
            t.put_nb(1, base + off as u64, src);
        }
    }
    let warm = if unpin { a.window.max(8) } else { a.warmup };
    for _ in 0..warm {
        t.put_nb(1, base + slot(p, rng), src);
    }
    t.quiet();
}

/// One timed batch of `n` puts; pushes µs per put: every put alone (latency: TSC, calibrated
/// over the batch, so the typical value is the median put, as perftest reports it), or the
/// batch's mean with the window drained at its end (bandwidth).
fn batch(
    t: &mut dyn Transport,
    base: u64,
    p: &Point,
    rng: &mut Rng,
    src: &'static [u8],
    n: usize,
    acc: &mut Acc,
) {
    let (out, issue) = (&mut acc.samples, &mut acc.issue);
    if p.latency {
        let kind = Kind::default_for_target();
        let clock = Clock::new(kind);
        let (t0, c0) = (Instant::now(), clock.now());
        let mut ticks = Vec::with_capacity(n);
        let mut issued = Vec::with_capacity(n);
        for _ in 0..n {
            let off = slot(p, rng);
            let c = clock.now();
            t.put_nb(1, base + off, src);
            let ci = clock.now();
            t.quiet();
            let ce = clock.now();
            ticks.push(ce - c);
            issued.push(ci - c);
        }
        let f = ns_per_tick(kind, clock.now() - c0, t0.elapsed().as_nanos() as u64);
        issue.extend(issued.iter().map(|&x| x as f64 * f / 1e3));
        out.extend(ticks.iter().map(|&x| x as f64 * f / 1e3));
    } else {
        let t0 = Instant::now();
        for _ in 0..n {
            t.put_nb(1, base + slot(p, rng), src);
        }
        t.quiet();
        out.push(t0.elapsed().as_secs_f64() * 1e6 / n as f64);
    }
}
