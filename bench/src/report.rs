//! Output: perftest-style aligned tables, the targets with PASS/MISS, and the `--json` document
//! (serde_json).

use std::fmt::Write;

use serde::Serialize;

use crate::hit::{HitRow, Pattern};
use crate::metadata::MetaRow;
use crate::miss::MissRow;
use crate::targets::{scaling, Target};

/// Run-wide facts printed above the tables and stored in the JSON.
pub struct RunInfo {
    pub backend: String,
    pub memlock: String,
    pub quick: bool,
    pub cpus: usize,
    pub batch: usize,
    pub batches: usize,
    pub ucx_region_struct: (usize, usize),
    pub loadavg: String,
}

const HIT_HEADER: &str =
    " #regions  pattern  threads  impl   #iterations  t_mean[ns]  t_p50[ns]  t_p99[ns]    Mops/s";

pub fn hit_table(rows: &[HitRow]) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "{HIT_HEADER}");
    for r in rows {
        let _ = writeln!(
            s,
            " {:>8}  {:<7}  {:>7}  {:<5} {:>12}  {:>10.1}  {:>9.1}  {:>9.1}  {:>8.2}{}",
            r.regions,
            r.pattern.name(),
            r.threads,
            r.imp,
            r.iterations,
            r.lat.mean,
            r.lat.p50,
            r.lat.p99,
            r.mops,
            if r.failures > 0 {
                format!("  ({} FAILED)", r.failures)
            } else {
                String::new()
            }
        );
    }
    s
}

pub fn scaling_table(rows: &[HitRow], counts: &[usize], threads: &[usize]) -> String {
    let mut s = String::new();
    let mut head = String::from(" #regions  pattern  impl    Mops/s(1T)");
    for &t in threads.iter().filter(|&&t| t > 1) {
        let _ = write!(head, "  Mops/s({t}T)  {t}T/1T");
    }
    let _ = writeln!(s, "{head}");
    for &n in counts {
        for p in [Pattern::Same, Pattern::Random] {
            for imp in ["ours", "ucx", "ofi", "ceil"] {
                let Some(one) = rows
                    .iter()
                    .find(|r| r.imp == imp && r.regions == n && r.pattern == p && r.threads == 1)
                else {
                    continue;
                };
                let _ = write!(
                    s,
                    " {:>8}  {:<7}  {:<5} {:>11.2}",
                    n,
                    p.name(),
                    imp,
                    one.mops
                );
                for &t in threads.iter().filter(|&&t| t > 1) {
                    let tm = rows
                        .iter()
                        .find(|r| {
                            r.imp == imp
                                && r.regions == n.max(t)
                                && r.pattern == p
                                && r.threads == t
                        })
                        .map_or(f64::NAN, |r| r.mops);
                    let _ = write!(s, "  {:>10.2}  {:>5.2}x", tm, scaling(rows, imp, n, p, t));
                }
                let _ = writeln!(s);
            }
        }
    }
    s
}

pub fn miss_table(rows: &[MissRow]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "     size  impl      #iterations  t_mean[ns]  t_p50[ns]  t_p99[ns]  pins/op  overhead[%]  vs"
    );
    for r in rows {
        let _ = writeln!(
            s,
            " {:>8}  {:<8} {:>12}  {:>10.0}  {:>9.0}  {:>9.0}  {:>7.2}  {:>+11.1}  {}",
            size_name(r.size),
            r.imp,
            r.iterations,
            r.lat.mean,
            r.lat.p50,
            r.lat.p99,
            r.pins_per_op,
            r.overhead_pct,
            r.reference
        );
    }
    s
}

pub fn meta_table(rows: &[MetaRow]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        " impl   #regions  rss[B/region]  malloc[B/region]  rust-alloc[B/region]"
    );
    for r in rows {
        let _ = writeln!(
            s,
            " {:<5} {:>9}  {:>13.1}  {:>16.1}  {:>20}",
            r.imp,
            r.regions,
            r.per_region.rss,
            r.per_region.heap,
            if r.imp == "ours" {
                format!("{:.1}", r.per_region.alloc)
            } else {
                "n/a (C)".to_string()
            }
        );
    }
    s
}

pub fn targets_table(targets: &[Target]) -> String {
    let mut s = String::new();
    for t in targets {
        let op = t.cmp.symbol();
        let _ = writeln!(
            s,
            " [{}] {:<58} {:>9.2} {} (target {op} {} {})  {}",
            if t.pass() { "PASS" } else { "MISS" },
            t.what,
            t.measured,
            t.unit,
            t.limit,
            t.unit,
            t.detail
        );
    }
    s
}

fn size_name(b: usize) -> String {
    if b >= 1 << 20 && b & ((1 << 20) - 1) == 0 {
        format!("{}MiB", b >> 20)
    } else if b >= 1 << 10 && b & ((1 << 10) - 1) == 0 {
        format!("{}KiB", b >> 10)
    } else {
        format!("{b}B")
    }
}

/// The `--json` document: run facts, then one flat object per row of each table.
#[derive(Serialize)]
struct JsonDoc<'a> {
    backend: &'a str,
    memlock: &'a str,
    quick: bool,
    cpus: usize,
    loadavg: &'a str,
    hit_batch_ops: usize,
    hit_batches: usize,
    ucx_region_struct_bytes: usize,
    ucx_base_region_bytes: usize,
    hit: Vec<JsonHit<'a>>,
    miss: Vec<JsonMiss<'a>>,
    metadata: Vec<JsonMeta<'a>>,
    targets: Vec<JsonTarget<'a>>,
}

// Non-finite numbers (a missing measurement is NaN) come out as `null`: serde_json writes JSON,
// which has no NaN.

#[derive(Serialize)]
struct JsonHit<'a> {
    regions: usize,
    pattern: &'a str,
    threads: usize,
    #[serde(rename = "impl")]
    imp: &'a str,
    iterations: u64,
    t_mean_ns: f64,
    t_p50_ns: f64,
    t_p99_ns: f64,
    mops: f64,
    failures: u64,
}

#[derive(Serialize)]
struct JsonMiss<'a> {
    size: usize,
    #[serde(rename = "impl")]
    imp: &'a str,
    iterations: u64,
    t_mean_ns: f64,
    t_p50_ns: f64,
    t_p99_ns: f64,
    pins_per_op: f64,
    overhead_pct: f64,
    overhead_vs: &'a str,
}

#[derive(Serialize)]
struct JsonMeta<'a> {
    #[serde(rename = "impl")]
    imp: &'a str,
    regions: usize,
    rss_bytes_per_region: f64,
    malloc_bytes_per_region: f64,
    /// Ours only (UCX allocates in C).
    rust_alloc_bytes_per_region: Option<f64>,
}

#[derive(Serialize)]
struct JsonTarget<'a> {
    target: &'a str,
    measured: f64,
    limit: f64,
    cmp: &'a str,
    unit: &'a str,
    pass: bool,
    detail: &'a str,
}

pub fn json(
    info: &RunInfo,
    hits: &[HitRow],
    misses: &[MissRow],
    meta: &[MetaRow],
    targets: &[Target],
) -> String {
    let doc = JsonDoc {
        backend: &info.backend,
        memlock: &info.memlock,
        quick: info.quick,
        cpus: info.cpus,
        loadavg: &info.loadavg,
        hit_batch_ops: info.batch,
        hit_batches: info.batches,
        ucx_region_struct_bytes: info.ucx_region_struct.1,
        ucx_base_region_bytes: info.ucx_region_struct.0,
        hit: hits
            .iter()
            .map(|r| JsonHit {
                regions: r.regions,
                pattern: r.pattern.name(),
                threads: r.threads,
                imp: r.imp,
                iterations: r.iterations,
                t_mean_ns: r.lat.mean,
                t_p50_ns: r.lat.p50,
                t_p99_ns: r.lat.p99,
                mops: r.mops,
                failures: r.failures,
            })
            .collect(),
        miss: misses
            .iter()
            .map(|r| JsonMiss {
                size: r.size,
                imp: r.imp,
                iterations: r.iterations,
                t_mean_ns: r.lat.mean,
                t_p50_ns: r.lat.p50,
                t_p99_ns: r.lat.p99,
                pins_per_op: r.pins_per_op,
                overhead_pct: r.overhead_pct,
                overhead_vs: r.reference,
            })
            .collect(),
        metadata: meta
            .iter()
            .map(|r| JsonMeta {
                imp: r.imp,
                regions: r.regions,
                rss_bytes_per_region: r.per_region.rss,
                malloc_bytes_per_region: r.per_region.heap,
                rust_alloc_bytes_per_region: (r.imp == "ours").then_some(r.per_region.alloc),
            })
            .collect(),
        targets: targets
            .iter()
            .map(|t| JsonTarget {
                target: &t.what,
                measured: t.measured,
                limit: t.limit,
                cmp: t.cmp.symbol(),
                unit: t.unit,
                pass: t.pass(),
                detail: &t.detail,
            })
            .collect(),
    };
    serde_json::to_string_pretty(&doc).expect("plain structs of numbers and strings serialize")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hit::Pattern;
    use crate::summary::summarize;
    use crate::targets::Cmp;

    #[test]
    fn size_names() {
        assert_eq!(size_name(4096), "4KiB");
        assert_eq!(size_name(1 << 20), "1MiB");
        assert_eq!(size_name(100), "100B");
    }

    #[test]
    fn json_document_keys_nulls_and_escapes() {
        let info = RunInfo {
            backend: "mlock".into(),
            memlock: "limit \"unlimited\"".into(),
            quick: true,
            cpus: 2,
            batch: 10,
            batches: 3,
            ucx_region_struct: (56, 72),
            loadavg: "0.5".into(),
        };
        let hit = HitRow {
            regions: 1,
            pattern: Pattern::Random,
            threads: 1,
            imp: "ours",
            iterations: 30,
            lat: summarize(&[15.5]),
            mops: f64::NAN,
            failures: 0,
            per_op: vec![15.5],
            round_mops: vec![],
        };
        let meta = [
            MetaRow {
                imp: "ours",
                regions: 100,
                per_region: crate::metadata::MetaSample {
                    alloc: 40.0,
                    heap: 48.0,
                    rss: 57.5,
                },
            },
            MetaRow {
                imp: "ucx",
                regions: 100,
                per_region: crate::metadata::MetaSample {
                    alloc: 0.0,
                    heap: 100.0,
                    rss: 122.5,
                },
            },
        ];
        let target = Target {
            what: "t".into(),
            measured: 0.5,
            limit: 0.4,
            cmp: Cmp::AtMost,
            unit: "x",
            detail: "a\nb".into(),
        };
        let text = json(&info, &[hit], &[], &meta, &[target]);
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["memlock"], "limit \"unlimited\"");
        assert_eq!(v["ucx_region_struct_bytes"], 72);
        assert_eq!(v["ucx_base_region_bytes"], 56);
        assert_eq!(v["hit"][0]["impl"], "ours");
        assert_eq!(v["hit"][0]["pattern"], "random");
        assert_eq!(v["hit"][0]["t_p50_ns"], 15.5);
        assert!(v["hit"][0]["mops"].is_null(), "NaN must be null");
        assert_eq!(v["miss"].as_array().unwrap().len(), 0);
        assert_eq!(v["metadata"][0]["rust_alloc_bytes_per_region"], 40.0);
        assert!(v["metadata"][1]["rust_alloc_bytes_per_region"].is_null());
        assert_eq!(v["targets"][0]["cmp"], "<=");
        assert_eq!(v["targets"][0]["pass"], false);
        assert_eq!(v["targets"][0]["detail"], "a\nb");
    }
}
