//! Output: one perftest-style table per figure (and the app's), the issue's targets as
//! PASS/MISS lines with the measured ratios, or one JSON document (`--json`), rank 0 only.

use serde_json::{json, Value};

use firehose_proto::FirehoseStats;

use crate::args::{Args, Test};
use crate::served::TargetStats;
use crate::Ctx;

const RULE: &str =
    "---------------------------------------------------------------------------------------------------------\n";

/// One measured point of one transport.
#[derive(Debug, Clone)]
pub struct Row {
    pub series: &'static str,
    pub ws: usize,
    pub bytes: usize,
    pub iters: usize,
    /// Latency: µs per put, median (typical), min, mean and 99th percentile of every put
    /// timed alone; bandwidth: µs per put of each batch (window drained), median batch.
    pub t_typical: f64,
    pub t_min: f64,
    pub t_avg: f64,
    pub t_p99: f64,
    /// Latency: median time until the put was issued (the rest is the wait for completion).
    pub t_issue: f64,
    /// Bandwidth (MB/s, 10^6) of the median batch and of the best batch (perftest's BW peak).
    pub mb_s: f64,
    pub mb_s_peak: f64,
    pub latency: bool,
    /// Firehose's counters over the timed puts.
    pub hits: u64,
    pub misses: u64,
    pub moves: u64,
    pub puts_in_move: u64,
    /// The target's Firehose side after the point.
    pub remote: Option<TargetStats>,
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n == 0 {
        return f64::NAN;
    }
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

impl Row {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        series: &'static str,
        ws: usize,
        bytes: usize,
        iters: usize,
        mut per_op: Vec<f64>,
        mut issue: Vec<f64>,
        latency: bool,
        fh: Option<(FirehoseStats, FirehoseStats)>,
        remote: Option<TargetStats>,
    ) -> Row {
        let t_avg = per_op.iter().sum::<f64>() / per_op.len() as f64;
        let t_min = per_op.iter().copied().fold(f64::INFINITY, f64::min);
        let t_typical = median(&mut per_op);
        let t_p99 = per_op[((per_op.len() * 99) / 100).min(per_op.len() - 1)];
        let t_issue = median(&mut issue);
        let (hits, misses, moves, pim) = fh.map_or((0, 0, 0, 0), |(b, a)| {
            (
                a.hits - b.hits,
                a.misses - b.misses,
                a.moves_sent - b.moves_sent,
                a.puts_in_move - b.puts_in_move,
            )
        });
        Row {
            series,
            ws,
            bytes,
            iters,
            t_typical,
            t_min,
            t_avg,
            t_p99,
            t_issue,
            mb_s: bytes as f64 / t_typical,
            mb_s_peak: bytes as f64 / t_min,
            latency,
            hits,
            misses,
            moves,
            puts_in_move: pim,
            remote,
        }
    }

    /// One-sided hit rate in percent (Firehose rows only).
    pub fn hit_rate(&self) -> Option<f64> {
        let n = self.hits + self.misses;
        (self.series.starts_with("firehose") && n > 0).then(|| 100.0 * self.hits as f64 / n as f64)
    }

    fn json(&self) -> Value {
        let mut v = json!({
            "series": self.series, "working_set": self.ws, "bytes": self.bytes,
            "iterations": self.iters, "t_typical_us": self.t_typical, "t_min_us": self.t_min,
            "t_avg_us": self.t_avg, "t_p99_us": self.t_p99, "bw_mb_s": self.mb_s,
            "bw_peak_mb_s": self.mb_s_peak,
        });
        if self.latency {
            v["t_issue_us"] = json!(self.t_issue);
        }
        if self.series.starts_with("firehose") {
            v["hits"] = json!(self.hits);
            v["misses"] = json!(self.misses);
            v["moves"] = json!(self.moves);
            v["puts_in_move"] = json!(self.puts_in_move);
            v["hit_rate_pct"] = json!(self.hit_rate());
        }
        if let Some(r) = &self.remote {
            v["target_pinned_peak"] = json!(r.pinned_peak);
            v["target_pinned_now"] = json!(r.pinned_bytes);
            v["target_pins"] = json!(r.pins);
            v["target_unpins"] = json!(r.unpins);
            v["target_victim_hits"] = json!(r.victim_hits);
        }
        v
    }
}

/// One run of the app by one transport (Table 3).
#[derive(Debug, Clone)]
pub struct AppRow {
    pub series: &'static str,
    pub ranks: u32,
    pub keys_per_rank: usize,
    pub reps: usize,
    /// Seconds of the sort (all reps), rank 0's clock between barriers.
    pub secs: f64,
    pub puts: u64,
    /// Summed over ranks (Firehose only).
    pub hits: u64,
    pub misses: u64,
    pub moves: u64,
    pub verified: bool,
}

pub struct Report {
    rows: Vec<(Test, Row)>,
    app: Vec<AppRow>,
    json: bool,
    json_out: Option<std::path::PathBuf>,
    m: usize,
    victim: usize,
    region: usize,
    size: u32,
    window: usize,
    /// This rank's progress thread runs (`rma`'s target then sleeps until STOP).
    progress_thread: bool,
}

impl Report {
    pub fn new(ctx: &Ctx, a: &Args) -> Report {
        Report {
            rows: Vec::new(),
            app: Vec::new(),
            json: a.json,
            json_out: a.json_out.clone(),
            m: ctx.fh.m_bytes,
            victim: ctx.fh.max_victim_bytes,
            region: ctx.fh.region_buckets() as usize * ctx.fh.bucket_size,
            size: ctx.peers.size(),
            window: a.window,
            progress_thread: ctx.peers.settings().progress_thread,
        }
    }

    pub fn add(&mut self, t: Test, r: Row) {
        self.rows.push((t, r));
    }

    pub fn add_app(&mut self, r: AppRow) {
        self.app.push(r);
    }

    pub fn header(&self) -> String {
        format!(
            "{RULE} fh_bench: Firehose puts vs Rendezvous (no-unpin, with-unpin) vs registered once (floor), {} ranks\n \
             M {} KiB, MAXVICTIM {} KiB, region {} KiB, window {} puts in flight (bandwidth)\n{RULE}",
            self.size,
            self.m >> 10,
            self.victim >> 10,
            self.region >> 10,
            self.window
        )
    }

    fn of(&self, t: Test) -> impl Iterator<Item = &Row> {
        self.rows
            .iter()
            .filter(move |(x, _)| *x == t)
            .map(|(_, r)| r)
    }

    pub fn table(&self, t: Test) -> String {
        let mut s = String::new();
        match t {
            Test::Lat => {
                s += "Fig. 3: 8-byte blocking put latency over a random remote working set\n";
                s += " #bytes     #iterations  working_set[KiB] series        t_typical[usec] t_min[usec] t_avg[usec]  hit_rate[%]  misses  moves  pinned_peak[KiB]\n";
            }
            Test::Bw | Test::Peak => {
                s += if t == Test::Bw {
                    "Fig. 4: put bandwidth over a random remote working set\n"
                } else {
                    "Fig. 5: put bandwidth by message size (the same remote bytes)\n"
                };
                s += " #bytes     #iterations  working_set[KiB] series        BW_peak[MB/sec] BW_typical[MB/sec] MsgRate[Mpps] hit_rate[%]  misses  moves  pinned_peak[KiB]\n";
            }
            Test::App => return self.app_table(),
            Test::Rma => return self.rma_table(),
        }
        for r in self.of(t) {
            let hr = r.hit_rate().map_or("-".into(), |h| format!("{h:.3}"));
            let (mi, mo) = if r.series == "firehose" {
                (r.misses.to_string(), r.moves.to_string())
            } else {
                ("-".into(), "-".into())
            };
            let pk = r
                .remote
                .map_or("-".into(), |x| (x.pinned_peak >> 10).to_string());
            if r.latency {
                s += &format!(
                    " {:<10} {:<12} {:<16} {:<13} {:<15.2} {:<11.2} {:<12.2} {:<12} {:<7} {:<6} {}\n",
                    r.bytes, r.iters, r.ws >> 10, r.series, r.t_typical, r.t_min, r.t_avg, hr, mi, mo, pk
                );
            } else {
                s += &format!(
                    " {:<10} {:<12} {:<16} {:<13} {:<15.2} {:<18.2} {:<13.6} {:<12} {:<7} {:<6} {}\n",
                    r.bytes, r.iters, r.ws >> 10, r.series, r.mb_s_peak, r.mb_s, 1.0 / r.t_typical, hr, mi, mo, pk
                );
            }
        }
        s + RULE
    }

    fn rma_table(&self) -> String {
        let mut s = String::from(
            "fh_put / fh_get (library defaults) vs the floor: 8-byte latency on hits, bandwidth\n \
             #bytes     #iterations  series         t_typical[usec] t_min[usec] t_p99[usec] BW_peak[MB/sec] BW_typical[MB/sec] hit_rate[%]  misses\n",
        );
        for r in self.of(Test::Rma) {
            let hr = r.hit_rate().map_or("-".into(), |h| format!("{h:.3}"));
            let mi = if r.series.starts_with("firehose") {
                r.misses.to_string()
            } else {
                "-".into()
            };
            if r.latency {
                s += &format!(
                    " {:<10} {:<12} {:<14} {:<15.2} {:<11.2} {:<11.2} {:<15} {:<18} {:<12} {}\n",
                    r.bytes, r.iters, r.series, r.t_typical, r.t_min, r.t_p99, "-", "-", hr, mi
                );
            } else {
                s += &format!(
                    " {:<10} {:<12} {:<14} {:<15} {:<11} {:<11} {:<15.2} {:<18.2} {:<12} {}\n",
                    r.bytes, r.iters, r.series, "-", "-", "-", r.mb_s_peak, r.mb_s, hr, mi
                );
            }
        }
        s + RULE
    }

    fn app_table(&self) -> String {
        let mut s = String::from(
            "Table 3: bitonic sort over puts\n #ranks  keys/rank  reps  series        time[s]    puts     one_sided  misses  moves  verified\n",
        );
        for r in &self.app {
            s += &format!(
                " {:<7} {:<10} {:<5} {:<13} {:<10.4} {:<8} {:<10} {:<7} {:<6} {}\n",
                r.ranks,
                r.keys_per_rank,
                r.reps,
                r.series,
                r.secs,
                r.puts,
                if r.series == "firehose" {
                    r.hits.to_string()
                } else {
                    "-".into()
                },
                if r.series == "firehose" {
                    r.misses.to_string()
                } else {
                    "-".into()
                },
                if r.series == "firehose" {
                    r.moves.to_string()
                } else {
                    "-".into()
                },
                r.verified
            );
        }
        s + RULE
    }

    /// The issue's targets from the rows measured (none for a test not run).
    fn targets(&self) -> Vec<Value> {
        let mut out = Vec::new();
        let m = self.m;
        let bound = self.m + self.victim;
        let med = |t: Test, series: &str, below: bool, f: &dyn Fn(&Row) -> f64| -> Option<f64> {
            let mut v: Vec<f64> = self
                .of(t)
                .filter(|r| r.series == series && (r.ws <= m) == below)
                .map(f)
                .collect();
            (!v.is_empty()).then(|| median(&mut v))
        };
        let mut push = |name: &str, value: f64, op: &str, limit: f64, what: String| {
            let pass = if op == ">=" {
                value >= limit
            } else {
                value <= limit
            };
            out.push(
                json!({"target": name, "value": value, "op": op, "limit": limit,
                            "pass": pass, "what": what}),
            );
        };
        // Hit rate below M: the worst point of every sweep.
        let rates: Vec<f64> = self
            .rows
            .iter()
            .filter(|(t, r)| !matches!(t, Test::Peak | Test::Rma) && r.ws <= m)
            .filter_map(|(_, r)| r.hit_rate())
            .collect();
        if let Some(worst) = rates.iter().copied().reduce(f64::min) {
            push(
                "hit_rate_below_M_pct",
                worst,
                ">=",
                99.9,
                "worst one-sided hit rate over the sweep points with working set <= M (Figs. 3, 4)"
                    .into(),
            );
        }
        let lat = |s: &str| med(Test::Lat, s, true, &|r: &Row| r.t_typical);
        if let (Some(f), Some(fl), Some(rv)) = (lat("firehose"), lat("floor"), lat("rdv_nounpin")) {
            push(
                "hit_latency_vs_floor",
                f / fl,
                "<=",
                1.2,
                format!("8 B put, median over points <= M: firehose {f:.2} us / floor {fl:.2} us"),
            );
            push("hit_latency_vs_rdv_nounpin", f / rv, "<=", 0.5,
                 format!("8 B put, median over points <= M: firehose {f:.2} us / rendezvous no-unpin {rv:.2} us"));
        }
        let bw = |s: &str| med(Test::Bw, s, true, &|r: &Row| r.mb_s_peak);
        if let (Some(f), Some(fl)) = (bw("firehose"), bw("floor")) {
            push("bw_64k_vs_floor", f / fl, ">=", 0.9,
                 format!("64 KiB puts, BW peak (best batch), median over points <= M: firehose {f:.2} MB/s / floor {fl:.2} MB/s"));
        }
        // Degradation past M + MAXVICTIM: never worse than Rendezvous with-unpin (what every
        // miss then costs: a round trip, a pin and an unpin), at each such point.
        let past: Vec<(f64, f64)> = self
            .of(Test::Lat)
            .filter(|r| r.series == "firehose" && r.ws > bound)
            .filter_map(|f| {
                self.of(Test::Lat)
                    .find(|u| u.series == "rdv_unpin" && u.ws == f.ws)
                    .map(|u| (f.t_typical, u.t_typical))
            })
            .collect();
        if let Some(worst) = past.iter().map(|(f, u)| f / u).reduce(f64::max) {
            push(
                "past_bound_vs_rdv_unpin",
                worst,
                "<=",
                1.0,
                "8 B put latency past M + MAXVICTIM, worst point: firehose / rendezvous with-unpin"
                    .into(),
            );
        }
        // `rma`: every timed Firehose op a hit (what its latency claims to be).
        let rma_rates: Vec<f64> = self.of(Test::Rma).filter_map(Row::hit_rate).collect();
        if let Some(worst) = rma_rates.iter().copied().reduce(f64::min) {
            push(
                "rma_hit_rate_pct",
                worst,
                ">=",
                99.9,
                "worst one-sided hit rate of the rma points (puts and gets, 256 KiB warmed)".into(),
            );
        }
        let peak = self
            .rows
            .iter()
            .filter_map(|(_, r)| r.remote.map(|x| x.pinned_peak))
            .max();
        if let Some(p) = peak {
            push(
                "pinned_peak_vs_bound",
                p as f64 / bound as f64,
                "<=",
                1.0,
                format!("target's Firehose pinned bytes peak {p} / (M + MAXVICTIM) {bound}"),
            );
        }
        out
    }

    /// Prints the targets (or the JSON document), and writes the document to `--json-out`.
    pub fn finish(&self) {
        let targets = self.targets();
        let by = |t: Test| -> Vec<Value> { self.of(t).map(Row::json).collect() };
        let app: Vec<Value> = self
            .app
            .iter()
            .map(|r| {
                json!({"series": r.series, "ranks": r.ranks, "keys_per_rank": r.keys_per_rank,
                   "reps": r.reps, "secs": r.secs, "puts": r.puts, "one_sided": r.hits,
                   "misses": r.misses, "moves": r.moves, "verified": r.verified})
            })
            .collect();
        // The settings `rma` claims to run with (unset = the library's default).
        let env: serde_json::Map<String, Value> = [
            "FH_PROGRESS_THREAD",
            "FH_PROGRESS_SPIN_US",
            "FH_AM_SPIN_US",
            "FH_M",
            "FH_MAXVICTIM",
            "FH_MAXREGION",
        ]
        .iter()
        .map(|k| {
            (
                k.to_string(),
                std::env::var(k).map_or(Value::Null, Value::from),
            )
        })
        .collect();
        let progress_thread = self.progress_thread;
        let doc = json!({
            "bench": "fh_bench", "ranks": self.size,
            "config": {"m": self.m, "max_victim": self.victim, "region": self.region,
                       "window": self.window},
            "lat": by(Test::Lat), "bw": by(Test::Bw), "peak": by(Test::Peak), "app": app,
            "rma": by(Test::Rma), "env": env, "progress_thread": progress_thread,
            "targets": targets,
        });
        if let Some(path) = &self.json_out {
            if let Err(e) = std::fs::write(path, format!("{doc}\n")) {
                crate::fail(format!("writing {}: {e}", path.display()));
            }
        }
        if self.json {
            println!("{doc}");
            return;
        }
        for t in doc["targets"].as_array().into_iter().flatten() {
            println!(
                "{} {}: {:.4} {} {} ({})",
                if t["pass"] == true { "PASS" } else { "MISS" },
                t["target"].as_str().unwrap_or(""),
                t["value"].as_f64().unwrap_or(f64::NAN),
                t["op"].as_str().unwrap_or(""),
                t["limit"],
                t["what"].as_str().unwrap_or("")
            );
        }
    }
}
