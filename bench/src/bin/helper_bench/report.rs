//! Medians over repetitions, the perftest-style table, JSON, the targets, and the series files.

use std::fmt::Write as _;
use std::path::Path;

use serde_json::json;

use crate::workload::Program;
use crate::{Mode, Run};

pub struct Header {
    pub backend: String,
    pub memlock: String,
    pub placement: String,
    /// Where the program and the helper ran (`--cores`), or "unbound".
    pub binding: String,
    pub reps: usize,
    pub quick: bool,
    /// Every computation's length times this (`--compute-scale`), and where it came from.
    pub compute_scale: f64,
    pub compute_scale_why: String,
    /// The calibrated cost lines the model runs with.
    pub costs: String,
}

/// One mode of one program, over the repetitions.
pub struct Row {
    pub mode: Mode,
    pub comm_ms: f64,
    /// Sum over the communications of each one's median across the repetitions: the target is
    /// judged on it. A preemption on a shared host lands on a few communications of one
    /// repetition and drops out of their medians; a cost the mode itself adds (a caller's pin,
    /// a slower transfer) recurs at the same communications in every repetition and stays in.
    pub comm_step_ms: f64,
    pub comm_all: Vec<f64>,
    pub total_ms: f64,
    pub avg_kib: f64,
    pub peak_kib: f64,
    pub pins: u64,
    /// Helper only, summed over the repetitions.
    pub early: u64,
    pub late: u64,
    pub unpredicted: u64,
    pub evaluated: u64,
    pub accurate: u64,
    pub caller_pins: u64,
    pub helper_pins: u64,
    pub helper_unpins: u64,
}

pub struct Summary {
    pub rows: Vec<Row>,
}

impl Summary {
    pub fn row(&self, m: Mode) -> &Row {
        self.rows
            .iter()
            .find(|r| r.mode == m)
            .expect("every mode ran")
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n == 0 {
        0.0
    } else if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Sum over the program's communications of each one's median time across `rs` (ms).
fn step_medians_ms(rs: &[&Run]) -> f64 {
    let steps = rs.iter().map(|r| r.step_ns.len()).min().unwrap_or(0);
    (0..steps)
        .map(|i| median(rs.iter().map(|r| r.step_ns[i] as f64).collect()))
        .sum::<f64>()
        / 1e6
}

pub fn summarize(modes: &[Mode], runs: &[(Mode, Run)]) -> Summary {
    let rows = modes
        .iter()
        .map(|&m| {
            let rs: Vec<&Run> = runs
                .iter()
                .filter(|(x, _)| *x == m)
                .map(|(_, r)| r)
                .collect();
            let comm_all: Vec<f64> = rs.iter().map(|r| r.comm_ns as f64 / 1e6).collect();
            let sum = |f: &dyn Fn(&firehose::internals::helper::HelperStats) -> u64| -> u64 {
                rs.iter().filter_map(|r| r.helper.as_ref()).map(f).sum()
            };
            Row {
                mode: m,
                comm_ms: median(comm_all.clone()),
                comm_step_ms: step_medians_ms(&rs),
                comm_all,
                total_ms: median(rs.iter().map(|r| r.total_ns as f64 / 1e6).collect()),
                avg_kib: median(rs.iter().map(|r| r.pinned.avg / 1024.0).collect()),
                peak_kib: rs
                    .iter()
                    .map(|r| r.pinned.peak as f64 / 1024.0)
                    .fold(0.0, f64::max),
                pins: median(rs.iter().map(|r| r.pinned.pins as f64).collect()) as u64,
                early: sum(&|h| h.planner.early),
                late: sum(&|h| h.planner.late),
                unpredicted: sum(&|h| h.planner.unpredicted),
                evaluated: sum(&|h| h.planner.predictor.evaluated),
                accurate: sum(&|h| h.planner.predictor.accurate),
                caller_pins: sum(&|h| h.planner.caller_pins),
                helper_pins: sum(&|h| h.planner.helper_pins),
                helper_unpins: sum(&|h| h.planner.helper_unpins),
            }
        })
        .collect();
    Summary { rows }
}

/// The modelled runs as rows (one run each: deterministic).
pub fn summarize_model(runs: &[(Mode, firehose::internals::helper::sim::Outcome)]) -> Summary {
    let rows = runs
        .iter()
        .map(|(m, o)| {
            let p = o.stats;
            Row {
                mode: *m,
                comm_ms: o.comm as f64 / 1e6,
                comm_step_ms: o.comm as f64 / 1e6,
                comm_all: vec![o.comm as f64 / 1e6],
                total_ms: o.total as f64 / 1e6,
                avg_kib: o.avg_pinned / 1024.0,
                peak_kib: o.peak_pinned as f64 / 1024.0,
                pins: o.pins,
                early: p.early,
                late: p.late,
                unpredicted: p.unpredicted,
                evaluated: p.predictor.evaluated,
                accurate: p.predictor.accurate,
                caller_pins: p.caller_pins,
                helper_pins: p.helper_pins,
                helper_unpins: p.helper_unpins,
            }
        })
        .collect();
    Summary { rows }
}

/// One target line: (what, value text, target text, pass).
pub struct Target {
    pub program: &'static str,
    pub what: &'static str,
    pub value: f64,
    pub text: String,
    pub target: &'static str,
    pub pass: bool,
}

/// The targets, on each skeleton (and shown for Figure 1).
pub fn targets(programs: &[Program], results: &[Summary]) -> Vec<Target> {
    let mut out = Vec::new();
    for (p, s) in programs.iter().zip(results) {
        let (lazy, on) = (s.row(Mode::Lazy), s.row(Mode::Helper));
        let saved = 100.0 * (1.0 - on.avg_kib / lazy.avg_kib.max(1e-9));
        out.push(Target {
            program: p.name,
            what: "time-averaged pinned bytes, helper below lazy",
            value: saved,
            text: format!(
                "{saved:.1} % ({:.0} vs {:.0} KiB)",
                on.avg_kib, lazy.avg_kib
            ),
            target: ">= 30 %",
            pass: saved >= 30.0,
        });
        let over = 100.0 * (on.comm_step_ms / lazy.comm_step_ms.max(1e-9) - 1.0);
        out.push(Target {
            program: p.name,
            what: "communication time, helper over lazy",
            value: over,
            text: format!(
                "{over:+.1} % ({:.2} vs {:.2} ms)",
                on.comm_step_ms, lazy.comm_step_ms
            ),
            target: "<= +5 %",
            pass: over <= 5.0,
        });
        let acc = 100.0 * on.accurate as f64 / on.evaluated.max(1) as f64;
        out.push(Target {
            program: p.name,
            what: "predictions within 5 % of the observed period",
            value: acc,
            text: format!("{acc:.1} % of {}", on.evaluated),
            target: ">= 90 %",
            pass: acc >= 90.0,
        });
    }
    out
}

fn rows_table(o: &mut String, programs: &[Program], results: &[Summary]) {
    for (p, s) in programs.iter().zip(results) {
        let _ = writeln!(o, "## {}: {}", p.name, p.about);
        let _ = writeln!(
            o,
            " {:<8} {:>10} {:>13} {:>9} {:>15} {:>16} {:>6} {:>6} {:>5} {:>6} {:>9} {:>10}",
            "mode",
            "comm[ms]",
            "comm_step[ms]",
            "total[ms]",
            "pinned_avg[KiB]",
            "pinned_peak[KiB]",
            "pins",
            "early",
            "late",
            "unpred",
            "callerpin",
            "accuracy"
        );
        for r in &s.rows {
            let helper = r.mode.has_helper();
            let acc = if helper {
                format!(
                    "{:.1}%",
                    100.0 * r.accurate as f64 / r.evaluated.max(1) as f64
                )
            } else {
                "-".into()
            };
            let n = |v: u64| if helper { v.to_string() } else { "-".into() };
            let _ = writeln!(
                o,
                " {:<8} {:>10.2} {:>13.2} {:>9.1} {:>15.0} {:>16.0} {:>6} {:>6} {:>5} {:>6} {:>9} {:>10}",
                r.mode.name(),
                r.comm_ms,
                r.comm_step_ms,
                r.total_ms,
                r.avg_kib,
                r.peak_kib,
                r.pins,
                n(r.early),
                n(r.late),
                n(r.unpredicted),
                n(r.caller_pins),
                acc
            );
        }
    }
}

fn targets_table(o: &mut String, programs: &[Program], results: &[Summary]) {
    for t in targets(programs, results) {
        let _ = writeln!(
            o,
            " [{}] {:<5} {:<48} {:<30} (target {})",
            if t.pass { "PASS" } else { "MISS" },
            t.program,
            t.what,
            t.text,
            t.target
        );
    }
}

pub fn table(
    h: &Header,
    programs: &[Program],
    results: &[Summary],
    modelled: &[Summary],
) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "# helper_bench  backend={}  {}  reps={}{}",
        h.backend,
        h.memlock,
        h.reps,
        if h.quick { "  (quick)" } else { "" }
    );
    let _ = writeln!(
        o,
        "# helper forced on ({}); the placement policy (FH_HELPER_CPU=auto) says: {}",
        h.binding, h.placement
    );
    let _ = writeln!(o, "# helper clock: {}", clock_line());
    let _ = writeln!(
        o,
        "# computation x{:.2} ({})",
        h.compute_scale, h.compute_scale_why
    );
    let _ = writeln!(
        o,
        "# comm = register + transfer (copy) + deregister summed over all communications; medians over reps"
    );
    let _ = writeln!(
        o,
        "# comm_step = each communication's median over reps, summed (preemptions drop out; the target uses it)"
    );
    let _ = writeln!(o, "# MEASURED on this host, helper forced on");
    rows_table(&mut o, programs, results);
    let _ = writeln!(
        o,
        "# MODELLED: the same programs through the planner on a modelled clock (helper::sim), \
         calibrated here: {}; transfers timed here",
        h.costs
    );
    rows_table(&mut o, programs, modelled);
    let _ = writeln!(
        o,
        "## Targets, measured (the skeletons are cg and mg, fig1 shown too)"
    );
    targets_table(&mut o, programs, results);
    let _ = writeln!(o, "## Targets, modelled");
    targets_table(&mut o, programs, modelled);
    o
}

/// The helper's time source (`firehose::internals::helper::clock`), as the first helper chose it.
fn clock_line() -> String {
    match firehose::internals::helper::clock::selected() {
        Some(s) => format!(
            "{} (FH_HELPER_CLOCK={:?}; one clock_gettime costs {} ns here)",
            s.source(),
            s.choice,
            s.monotonic_cost_ns
        ),
        None => "none selected (no helper ran)".to_string(),
    }
}

fn json_rows(programs: &[Program], results: &[Summary]) -> Vec<serde_json::Value> {
    programs
        .iter()
        .zip(results)
        .map(|(p, s)| {
            let rows: Vec<_> = s
                .rows
                .iter()
                .map(|r| {
                    json!({
                        "mode": r.mode.name(),
                        "comm_ms": r.comm_ms,
                        "comm_step_ms": r.comm_step_ms,
                        "comm_ms_runs": r.comm_all,
                        "total_ms": r.total_ms,
                        "pinned_avg_kib": r.avg_kib,
                        "pinned_peak_kib": r.peak_kib,
                        "pins": r.pins,
                        "early": r.early,
                        "late": r.late,
                        "unpredicted": r.unpredicted,
                        "caller_pins": r.caller_pins,
                        "helper_pins": r.helper_pins,
                        "helper_unpins": r.helper_unpins,
                        "predictions_evaluated": r.evaluated,
                        "predictions_accurate": r.accurate,
                    })
                })
                .collect();
            json!({"program": p.name, "about": p.about, "rows": rows})
        })
        .collect()
}

fn json_targets(programs: &[Program], results: &[Summary]) -> Vec<serde_json::Value> {
    targets(programs, results)
        .into_iter()
        .map(|t| {
            json!({"program": t.program, "what": t.what, "value": t.value, "text": t.text,
                   "target": t.target, "pass": t.pass})
        })
        .collect()
}

pub fn json(h: &Header, programs: &[Program], results: &[Summary], modelled: &[Summary]) -> String {
    json!({
        "bench": "helper_bench",
        "backend": h.backend,
        "memlock": h.memlock,
        "placement_policy": h.placement,
        "binding": h.binding,
        "reps": h.reps,
        "quick": h.quick,
        "compute_scale": h.compute_scale,
        "compute_scale_why": h.compute_scale_why,
        "helper_clock": clock_line(),
        "model_costs": h.costs,
        "measured": {"programs": json_rows(programs, results),
                     "targets": json_targets(programs, results)},
        "modelled": {"programs": json_rows(programs, modelled),
                     "targets": json_targets(programs, modelled)},
    })
    .to_string()
}

/// `DIR/<program>-<mode>.csv` (ms, bytes) of each mode's last repetition.
pub fn write_series(dir: &Path, p: &Program, runs: &[(Mode, Run)]) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    for m in Mode::ALL {
        let Some((_, r)) = runs.iter().rev().find(|(x, _)| *x == m) else {
            continue;
        };
        let mut s = String::from("ms,bytes\n");
        for (t, b) in &r.pinned.series {
            let _ = writeln!(s, "{t:.4},{b}");
        }
        std::fs::write(dir.join(format!("{}-{}.csv", p.name, m.name())), s)?;
    }
    write_steps(dir, p, runs)
}

/// `DIR/<program>-<mode>-steps.csv`: each communication's median time over the repetitions, with
/// its call site, for every mode that ran: where a mode's communication time goes.
fn write_steps(dir: &Path, p: &Program, runs: &[(Mode, Run)]) -> std::io::Result<()> {
    let mut modes: Vec<Mode> = runs.iter().map(|(m, _)| *m).collect();
    modes.sort_by_key(|m| m.name());
    modes.dedup();
    for m in modes {
        let rs: Vec<&Run> = runs
            .iter()
            .filter(|(x, _)| *x == m)
            .map(|(_, r)| r)
            .collect();
        let mut s = String::from("step,site,median_ns\n");
        for (i, step) in p.steps.iter().enumerate() {
            let v: Vec<f64> = rs
                .iter()
                .filter_map(|r| r.step_ns.get(i))
                .map(|&ns| ns as f64)
                .collect();
            let _ = writeln!(s, "{i},{:#x},{:.0}", step.site, median(v));
        }
        std::fs::write(dir.join(format!("{}-{}-steps.csv", p.name, m.name())), s)?;
    }
    Ok(())
}

/// `DIR/<program>-<mode>-model.csv` (ms, bytes) of the modelled runs.
pub fn write_model_series(
    dir: &Path,
    p: &Program,
    runs: &[(Mode, firehose::internals::helper::sim::Outcome)],
) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    for (m, o) in runs {
        let mut s = String::from("ms,bytes\n");
        for (t, b) in &o.series {
            let _ = writeln!(s, "{:.4},{b}", *t as f64 / 1e6);
        }
        std::fs::write(dir.join(format!("{}-{}-model.csv", p.name, m.name())), s)?;
    }
    Ok(())
}
