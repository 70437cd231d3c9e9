//! Summary of one run: a perftest-style table row or one JSON object (serde_json). Times are per
//! timed iteration; the warm-up iterations are not in them.

use std::fmt::Write as _;
use std::time::Duration;

use serde::Serialize;

use crate::args::Args;
use crate::shim_stats::ShimStats;

pub struct Result {
    pub iters: usize,
    /// Mean and median time inside ibv_reg_mr + ibv_dereg_mr per iteration (0 in once mode).
    pub reg_mean_us: f64,
    pub reg_p50_us: f64,
    /// Mean and median of a whole iteration (registration + WRITE + completion).
    pub iter_mean_us: f64,
    pub iter_p50_us: f64,
    /// Wall time of the timed loop.
    pub span: Duration,
    pub verified_bytes: usize,
    /// The shim's counters before and after the timed loop (None: shim not loaded).
    pub shim: Option<(ShimStats, ShimStats)>,
    /// Mean cost of one clock read (two are inside every t_reg sample).
    pub clock_us: f64,
    /// Mean cost of one reading of the interval clock (--clock).
    pub tick_read_us: f64,
}

fn mean_us(v: &[u64]) -> f64 {
    v.iter().sum::<u64>() as f64 / v.len().max(1) as f64 / 1e3
}

fn p50_us(v: &mut [u64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_unstable();
    v[v.len() / 2] as f64 / 1e3
}

impl Result {
    pub fn new(
        mut reg_ns: Vec<u64>,
        mut iter_ns: Vec<u64>,
        span: Duration,
        verified_bytes: usize,
        shim: Option<(ShimStats, ShimStats)>,
    ) -> Self {
        Result {
            iters: iter_ns.len(),
            reg_mean_us: mean_us(&reg_ns),
            reg_p50_us: p50_us(&mut reg_ns),
            iter_mean_us: mean_us(&iter_ns),
            iter_p50_us: p50_us(&mut iter_ns),
            span,
            verified_bytes,
            shim,
            clock_us: 0.0,
            tick_read_us: 0.0,
        }
    }

    pub fn msg_rate_mpps(&self) -> f64 {
        self.iters as f64 / self.span.as_secs_f64() / 1e6
    }

    pub fn bw_mb_s(&self, size: usize) -> f64 {
        (self.iters * size) as f64 / self.span.as_secs_f64() / 1e6
    }

    /// (hits, misses) of the shim's caches during the timed loop.
    pub fn shim_delta(&self) -> Option<(u64, u64)> {
        self.shim
            .map(|(a, b)| (b.hits - a.hits, b.misses - a.misses))
    }
}

pub const HEADER: &str =
    " #bytes     #iterations    BW[MB/s]    MsgRate[Mpps]   t_reg[usec]  t_reg_p50[usec]  t_iter[usec]  mode      shim\n";

pub fn table(args: &Args, dev: &str, r: &Result) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "# reg_write_bw on {dev}: RDMA WRITE, {} source buffers, {} warm-up iterations (not timed), data verified ({} bytes), intervals by {} ({:.3} us a read; clock_gettime {:.3} us)",
        args.buffers, args.warmup, r.verified_bytes, args.clock.name(), r.tick_read_us, r.clock_us
    );
    s.push_str(HEADER);
    let shim = match r.shim_delta() {
        None => "no".to_string(),
        Some((h, m)) => format!("yes ({h} hits, {m} misses)"),
    };
    let _ = writeln!(
        s,
        " {:<10} {:<14} {:<11.2} {:<15.6} {:<12.2} {:<16.2} {:<13.2} {:<9} {}",
        args.size,
        r.iters,
        r.bw_mb_s(args.size),
        r.msg_rate_mpps(),
        r.reg_mean_us,
        r.reg_p50_us,
        r.iter_mean_us,
        args.mode.name(),
        shim
    );
    s
}

/// The `--json` object: flat, one line (scripts/bench-preload reads keys out of it with sed and
/// prepends its own). Times rounded to the nanosecond, rates to 1e-6.
#[derive(Serialize)]
struct Json<'a> {
    bench: &'a str,
    device: &'a str,
    mode: &'a str,
    bytes: usize,
    iterations: usize,
    warmup: usize,
    buffers: usize,
    bw_mb_s: f64,
    msg_rate_mpps: f64,
    t_reg_us: f64,
    t_reg_p50_us: f64,
    t_iter_us: f64,
    t_iter_p50_us: f64,
    elapsed_s: f64,
    clock: &'a str,
    t_clock_read_us: f64,
    t_clock_us: f64,
    verified_bytes: usize,
    shim_loaded: bool,
    shim_hits: u64,
    shim_misses: u64,
}

/// `x` rounded to `digits` decimals (what the old fixed-precision output showed).
fn round(x: f64, digits: i32) -> f64 {
    let k = 10f64.powi(digits);
    (x * k).round() / k
}

pub fn json(args: &Args, dev: &str, r: &Result) -> String {
    let (loaded, hits, misses) = match r.shim_delta() {
        None => (false, 0, 0),
        Some((h, m)) => (true, h, m),
    };
    serde_json::to_string(&Json {
        bench: "reg_write_bw",
        device: dev,
        mode: args.mode.name(),
        bytes: args.size,
        iterations: r.iters,
        warmup: args.warmup,
        buffers: args.buffers,
        bw_mb_s: round(r.bw_mb_s(args.size), 3),
        msg_rate_mpps: round(r.msg_rate_mpps(), 6),
        t_reg_us: round(r.reg_mean_us, 3),
        t_reg_p50_us: round(r.reg_p50_us, 3),
        t_iter_us: round(r.iter_mean_us, 3),
        t_iter_p50_us: round(r.iter_p50_us, 3),
        elapsed_s: round(r.span.as_secs_f64(), 6),
        clock: args.clock.name(),
        t_clock_read_us: round(r.tick_read_us, 3),
        t_clock_us: round(r.clock_us, 3),
        verified_bytes: r.verified_bytes,
        shim_loaded: loaded,
        shim_hits: hits,
        shim_misses: misses,
    })
    .expect("plain numbers and strings serialize")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_and_medians() {
        let r = Result::new(
            vec![3000, 1000, 2000],
            vec![10_000, 30_000, 20_000],
            Duration::from_millis(3),
            100,
            None,
        );
        assert_eq!(r.iters, 3);
        assert!((r.reg_mean_us - 2.0).abs() < 1e-9);
        assert!((r.reg_p50_us - 2.0).abs() < 1e-9);
        assert!((r.iter_p50_us - 20.0).abs() < 1e-9);
        assert!((r.msg_rate_mpps() - 0.001).abs() < 1e-9);
        assert!((r.bw_mb_s(1000) - 1.0).abs() < 1e-9);
    }

    #[test]
    fn json_names_the_shim_counters() {
        let args = crate::args::parse(std::iter::empty::<String>()).unwrap();
        let a = ShimStats::default();
        let b = ShimStats {
            hits: 5,
            misses: 1,
            ..a
        };
        let r = Result::new(vec![1], vec![2], Duration::from_secs(1), 8, Some((a, b)));
        let j = json(&args, "rxe0", &r);
        assert!(
            j.contains("\"shim_loaded\":true,\"shim_hits\":5,\"shim_misses\":1}"),
            "{j}"
        );
        assert!(j.starts_with('{') && j.contains("\"mode\":\"per-iter\""));
        let v: serde_json::Value = serde_json::from_str(&j).unwrap();
        assert!(!j.contains('\n'));
        assert_eq!(v["device"], "rxe0");
        assert_eq!(v["t_iter_us"], 0.002);
        assert_eq!(v["elapsed_s"], 1.0);
    }
}
