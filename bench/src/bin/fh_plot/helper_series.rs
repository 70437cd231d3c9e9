//! pinned.png of scripts/bench-helper: pinned bytes over time for helper_bench's three modes (no
//! cache, lazy cache, helper thread), one row per program, measured runs left and modelled ones
//! right, each mode's time-averaged pinned bytes in its legend. Reads the CSV files that
//! `helper_bench --series DIR` writes: `<program>-<mode>[-model].csv`, columns `ms,bytes` (its
//! `<program>-<mode>-steps.csv`, communication times, are not plotted).

use crate::chart::{
    AxisSpec, Figure, Marker, Panel, Scale, Series, Stroke, Style, TAB_BLUE, TAB_GRAY, TAB_RED,
};
use std::path::Path;

/// The modes in legend order: file name part, label, colour.
const MODES: [(&str, &str, plotters::style::RGBColor); 3] = [
    ("nocache", "no cache", TAB_GRAY),
    ("lazy", "lazy cache", TAB_RED),
    ("helper", "helper thread", TAB_BLUE),
];
/// helper_bench's programs, in row order.
const PROGRAMS: [&str; 3] = ["fig1", "cg", "mg"];
/// The columns: file name suffix, what the panel title calls it.
const KINDS: [(&str, &str); 2] = [("", "measured"), ("-model", "modelled")];

/// 13 inches wide and 3.2 per row at 110 dpi, as the figure was first drawn.
pub fn size(rows: usize) -> (u32, u32) {
    (1430, 352 * rows as u32)
}

/// A series file's points: (ms, MiB pinned). Err names the file and line.
pub fn parse_csv(text: &str, name: &str) -> Result<Vec<(f64, f64)>, String> {
    let mut lines = text.lines().enumerate();
    let header = lines
        .next()
        .map(|(_, h)| h.split(',').map(str::trim).collect::<Vec<_>>())
        .unwrap_or_default();
    let col = |c: &str| {
        header
            .iter()
            .position(|h| *h == c)
            .ok_or_else(|| format!("{name}: no \"{c}\" column in the header"))
    };
    let (ms, bytes) = (col("ms")?, col("bytes")?);
    let mut out = Vec::new();
    for (i, line) in lines {
        if line.trim().is_empty() {
            continue;
        }
        let cells: Vec<&str> = line.split(',').map(str::trim).collect();
        let num = |c: usize| {
            cells
                .get(c)
                .and_then(|v| v.parse::<f64>().ok())
                .filter(|v| v.is_finite())
                .ok_or_else(|| {
                    format!(
                        "{name}:{}: not a number in column {}: {line:?}",
                        i + 1,
                        header[c]
                    )
                })
        };
        out.push((num(ms)?, num(bytes)? / (1u64 << 20) as f64));
    }
    Ok(out)
}

/// The time average of a step function that holds each value until the next point, over
/// 0 .. the last time (0 when there is no interval to average over).
pub fn time_average(points: &[(f64, f64)]) -> f64 {
    let end = match points.last() {
        Some(&(t, _)) if points.len() > 1 && t > 0.0 => t,
        _ => return 0.0,
    };
    points
        .windows(2)
        .map(|w| w[0].1 * (w[1].0 - w[0].0))
        .sum::<f64>()
        / end
}

/// The corners of a step function that holds each value until the next point.
pub fn steps(points: &[(f64, f64)]) -> Vec<(f64, f64)> {
    let mut out = Vec::with_capacity(points.len() * 2);
    for (i, &(t, v)) in points.iter().enumerate() {
        out.push((t, v));
        if let Some(&(next, _)) = points.get(i + 1) {
            out.push((next, v));
        }
    }
    out
}

/// The figure of the series in `dir`: a row for each program whose lazy-cache run is there.
pub fn figure(dir: &Path) -> Result<Figure, String> {
    if !dir.is_dir() {
        return Err(format!("{}: not a directory", dir.display()));
    }
    let progs: Vec<&str> = PROGRAMS
        .into_iter()
        .filter(|p| dir.join(format!("{p}-lazy.csv")).is_file())
        .collect();
    if progs.is_empty() {
        return Err(format!(
            "no series in {} (no {{{}}}-lazy.csv: write them with helper_bench --series DIR)",
            dir.display(),
            PROGRAMS.join(",")
        ));
    }
    let mut panels = Vec::new();
    for prog in &progs {
        for (suffix, kind) in KINDS {
            let mut series = Vec::new();
            for (mode, label, color) in MODES {
                let name = format!("{prog}-{mode}{suffix}.csv");
                let path = dir.join(&name);
                if !path.is_file() {
                    continue;
                }
                let text = std::fs::read_to_string(&path)
                    .map_err(|e| format!("{}: {e}", path.display()))?;
                let pts = parse_csv(&text, &path.display().to_string())?;
                series.push(Series {
                    label: format!("{label} (avg {:.2} MiB)", time_average(&pts)),
                    style: Style {
                        color,
                        marker: Marker::None,
                        stroke: Stroke::Solid,
                    },
                    points: steps(&pts),
                });
            }
            let mut y = AxisSpec::new("MiB pinned", Scale::Linear);
            y.include.push(0.0);
            panels.push(Panel {
                title: vec![format!("{prog}: pinned bytes over time ({kind})")],
                x: AxisSpec::new("ms", Scale::Linear),
                y,
                series,
                vlines: Vec::new(),
            });
        }
    }
    Ok(Figure {
        size: size(progs.len()),
        cols: KINDS.len(),
        panels,
    })
}

/// Reads the series in `dir` and writes `out` (a .png file).
pub fn run(dir: &Path, out: &Path) -> Result<(), String> {
    let fig = figure(dir)?;
    crate::font::load()?;
    crate::chart::save(out, &fig)?;
    println!("fh_plot: wrote {}", out.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_gives_ms_and_mib() {
        let pts = parse_csv("ms,bytes\n0.0000,0\n1.5,1048576\n\n3,2097152\n", "x.csv").unwrap();
        assert_eq!(pts, [(0.0, 0.0), (1.5, 1.0), (3.0, 2.0)]);
        // Columns found by name.
        let pts = parse_csv("bytes,ms\n524288,2\n", "x.csv").unwrap();
        assert_eq!(pts, [(2.0, 0.5)]);
        assert_eq!(parse_csv("ms,bytes\n", "x.csv").unwrap(), []);
    }

    #[test]
    fn bad_csv_names_the_file_and_line() {
        let e = parse_csv("ms,bytes\n0,0\n1,lots\n", "s/cg-lazy.csv").unwrap_err();
        assert!(e.starts_with("s/cg-lazy.csv:3:"), "{e}");
        let e = parse_csv("ms,bytes\n0\n", "f").unwrap_err();
        assert!(e.contains("f:2:"), "{e}");
        let e = parse_csv("time,bytes\n", "f").unwrap_err();
        assert!(e.contains("no \"ms\" column"), "{e}");
        assert!(parse_csv("", "f").is_err());
    }

    #[test]
    fn time_average_weights_each_value_by_how_long_it_holds() {
        // 0 MiB for 1 ms, 4 MiB for 2 ms, 1 MiB for 1 ms: (0 + 8 + 1) / 4.
        let pts = [(0.0, 0.0), (1.0, 4.0), (3.0, 1.0), (4.0, 0.0)];
        assert!((time_average(&pts) - 2.25).abs() < 1e-12);
        assert_eq!(time_average(&[]), 0.0);
        assert_eq!(time_average(&[(0.0, 5.0)]), 0.0);
        assert_eq!(time_average(&[(0.0, 5.0), (0.0, 6.0)]), 0.0);
    }

    #[test]
    fn steps_hold_each_value_until_the_next_point() {
        let pts = [(0.0, 1.0), (2.0, 3.0), (5.0, 0.0)];
        assert_eq!(
            steps(&pts),
            [(0.0, 1.0), (2.0, 1.0), (2.0, 3.0), (5.0, 3.0), (5.0, 0.0)]
        );
        assert_eq!(steps(&[]), []);
    }
}
