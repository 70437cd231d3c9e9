//! Output: perftest-style aligned tables, the targets with PASS/MISS, and the `--json` document
//! (written by hand: flat rows of numbers and fixed identifiers need no serializer).

use std::fmt::Write;

use crate::hit::{HitRow, Pattern};
use crate::metadata::MetaRow;
use crate::miss::MissRow;
use crate::targets::{scaling, Cmp, Target};

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
        let op = match t.cmp {
            Cmp::AtMost => "<=",
            Cmp::AtLeast => ">=",
        };
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

/// JSON number (NaN/inf become null, which JSON has no number for).
fn num(x: f64) -> String {
    if x.is_finite() {
        format!("{x}")
    } else {
        "null".to_string()
    }
}

/// JSON string for our fixed identifiers and messages (escapes what could appear).
fn jstr(s: &str) -> String {
    let mut o = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(o, "\\u{:04x}", c as u32);
            }
            c => o.push(c),
        }
    }
    o.push('"');
    o
}

pub fn json(
    info: &RunInfo,
    hits: &[HitRow],
    misses: &[MissRow],
    meta: &[MetaRow],
    targets: &[Target],
) -> String {
    let hit: Vec<String> = hits
        .iter()
        .map(|r| {
            format!(
                "{{\"regions\":{},\"pattern\":{},\"threads\":{},\"impl\":{},\"iterations\":{},\"t_mean_ns\":{},\"t_p50_ns\":{},\"t_p99_ns\":{},\"mops\":{},\"failures\":{}}}",
                r.regions, jstr(r.pattern.name()), r.threads, jstr(r.imp), r.iterations,
                num(r.lat.mean), num(r.lat.p50), num(r.lat.p99), num(r.mops), r.failures
            )
        })
        .collect();
    let miss: Vec<String> = misses
        .iter()
        .map(|r| {
            format!(
                "{{\"size\":{},\"impl\":{},\"iterations\":{},\"t_mean_ns\":{},\"t_p50_ns\":{},\"t_p99_ns\":{},\"pins_per_op\":{},\"overhead_pct\":{},\"overhead_vs\":{}}}",
                r.size, jstr(r.imp), r.iterations, num(r.lat.mean), num(r.lat.p50),
                num(r.lat.p99), num(r.pins_per_op), num(r.overhead_pct), jstr(r.reference)
            )
        })
        .collect();
    let md: Vec<String> = meta
        .iter()
        .map(|r| {
            format!(
                "{{\"impl\":{},\"regions\":{},\"rss_bytes_per_region\":{},\"malloc_bytes_per_region\":{},\"rust_alloc_bytes_per_region\":{}}}",
                jstr(r.imp), r.regions, num(r.per_region.rss), num(r.per_region.heap),
                if r.imp == "ours" { num(r.per_region.alloc) } else { "null".into() }
            )
        })
        .collect();
    let tg: Vec<String> = targets
        .iter()
        .map(|t| {
            format!(
                "{{\"target\":{},\"measured\":{},\"limit\":{},\"cmp\":{},\"unit\":{},\"pass\":{},\"detail\":{}}}",
                jstr(&t.what), num(t.measured), num(t.limit),
                jstr(if t.cmp == Cmp::AtMost { "<=" } else { ">=" }), jstr(t.unit), t.pass(), jstr(&t.detail)
            )
        })
        .collect();
    format!(
        "{{\"backend\":{},\"memlock\":{},\"quick\":{},\"cpus\":{},\"loadavg\":{},\"hit_batch_ops\":{},\"hit_batches\":{},\"ucx_region_struct_bytes\":{},\"ucx_base_region_bytes\":{},\n\"hit\":[\n{}\n],\n\"miss\":[\n{}\n],\n\"metadata\":[\n{}\n],\n\"targets\":[\n{}\n]}}",
        jstr(&info.backend), jstr(&info.memlock), info.quick, info.cpus, jstr(&info.loadavg), info.batch, info.batches,
        info.ucx_region_struct.1, info.ucx_region_struct.0,
        hit.join(",\n"), miss.join(",\n"), md.join(",\n"), tg.join(",\n")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_escapes_and_nulls() {
        assert_eq!(jstr("a\"b\\c\n"), "\"a\\\"b\\\\c\\u000a\"");
        assert_eq!(num(f64::NAN), "null");
        assert_eq!(num(1.5), "1.5");
        assert_eq!(size_name(4096), "4KiB");
        assert_eq!(size_name(1 << 20), "1MiB");
    }
}
