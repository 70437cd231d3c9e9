//! Summary of one run: a perftest-style table row or one JSON object (hand-written: the bench
//! has no serde). Times are per timed iteration; the warm-up iterations are not in them.

use std::fmt::Write as _;
use std::time::Duration;

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

pub fn json(args: &Args, dev: &str, r: &Result) -> String {
    let (loaded, hits, misses) = match r.shim_delta() {
        None => (false, 0, 0),
        Some((h, m)) => (true, h, m),
    };
    format!(
        concat!(
            "{{\"bench\":\"reg_write_bw\",\"device\":\"{}\",\"mode\":\"{}\",\"bytes\":{},",
            "\"iterations\":{},\"warmup\":{},\"buffers\":{},\"bw_mb_s\":{:.3},",
            "\"msg_rate_mpps\":{:.6},\"t_reg_us\":{:.3},\"t_reg_p50_us\":{:.3},",
            "\"t_iter_us\":{:.3},\"t_iter_p50_us\":{:.3},\"elapsed_s\":{:.6},",
            "\"clock\":\"{}\",\"t_clock_read_us\":{:.3},\"t_clock_us\":{:.3},\"verified_bytes\":{},\"shim_loaded\":{},\"shim_hits\":{},\"shim_misses\":{}}}"
        ),
        dev.replace(['"', '\\'], "_"),
        args.mode.name(),
        args.size,
        r.iters,
        args.warmup,
        args.buffers,
        r.bw_mb_s(args.size),
        r.msg_rate_mpps(),
        r.reg_mean_us,
        r.reg_p50_us,
        r.iter_mean_us,
        r.iter_p50_us,
        r.span.as_secs_f64(),
        args.clock.name(),
        r.tick_read_us,
        r.clock_us,
        r.verified_bytes,
        loaded,
        hits,
        misses
    )
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
        let args = crate::args::parse(std::iter::empty()).unwrap();
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
    }
}
