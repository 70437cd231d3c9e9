//! Figs. 3, 4 and 5 of scripts/bench-fh from its bench-fh.json: put latency and bandwidth
//! against the remote working set (with the M and M + MAXVICTIM knees marked) and peak
//! bandwidth by message size, for Firehose, the two rendezvous baselines and the floor.

use crate::chart::{
    AxisSpec, Figure, Marker, Panel, Scale, Series, Stroke, Style, VLine, TAB_BLUE, TAB_GREEN,
    TAB_ORANGE, TAB_RED,
};
use serde_json::{Map, Value};
use std::path::Path;

/// 8 x 5 inches at 110 dpi, as the figures were first drawn.
pub const SIZE: (u32, u32) = (880, 550);

const SUBTITLE: &str = "Soft-RoCE (rxe) in a TCG VM: compare within the figure, not with hardware";

/// The series the figures show, in legend order: fh_bench's name, label, style.
const SERIES: [(&str, &str, Style); 4] = [
    (
        "firehose",
        "Firehose",
        Style {
            color: TAB_RED,
            marker: Marker::Circle,
            stroke: Stroke::Solid,
        },
    ),
    (
        "rdv_nounpin",
        "Rendezvous no-unpin",
        Style {
            color: TAB_BLUE,
            marker: Marker::Square,
            stroke: Stroke::Solid,
        },
    ),
    (
        "rdv_unpin",
        "Rendezvous with-unpin",
        Style {
            color: TAB_GREEN,
            marker: Marker::Triangle,
            stroke: Stroke::Solid,
        },
    ),
    (
        "floor",
        "registered once (floor)",
        Style {
            color: plotters::style::BLACK,
            marker: Marker::Cross,
            stroke: Stroke::Dashed,
        },
    ),
];

/// Fig. 3's extra series: Firehose's latency in page mode (a second sweep, FH_MAXREGION=4k).
const PAGE_MODE: (&str, Style) = (
    "Firehose, page mode (FH_MAXREGION=4k)",
    Style {
        color: TAB_ORANGE,
        marker: Marker::Circle,
        stroke: Stroke::Dotted,
    },
);

/// One sweep row's fields that the figures use.
#[derive(Clone, Debug, PartialEq)]
struct Row {
    series: String,
    x: f64,
    y: f64,
}

/// A sweep (`lat`, `bw`, `peak`) of an object, the (x, y) fields of its rows. A missing sweep
/// has no rows; rows of series the figures do not show are skipped.
fn rows(
    obj: &Map<String, Value>,
    where_: &str,
    key: &str,
    x: &str,
    y: &str,
) -> Result<Vec<Row>, String> {
    let Some(v) = obj.get(key) else {
        return Ok(Vec::new());
    };
    let list = v
        .as_array()
        .ok_or_else(|| format!("{where_}.{key} is not a list"))?;
    let mut out = Vec::new();
    for (i, r) in list.iter().enumerate() {
        let at = || format!("{where_}.{key}[{i}]");
        let r = r
            .as_object()
            .ok_or_else(|| format!("{} is not an object", at()))?;
        let series = r
            .get("series")
            .and_then(Value::as_str)
            .ok_or_else(|| format!("{} has no \"series\" name", at()))?;
        if !SERIES.iter().any(|s| s.0 == series) {
            continue;
        }
        let num = |f: &str| {
            r.get(f)
                .and_then(Value::as_f64)
                .ok_or_else(|| format!("{} ({series}) has no number \"{f}\"", at()))
        };
        out.push(Row {
            series: series.to_string(),
            x: num(x)?,
            y: num(y)?,
        });
    }
    Ok(out)
}

/// The vertical lines at the knees, in KiB: M (when set) and M + MAXVICTIM (when both are).
fn knees(m: f64, victim: f64) -> Vec<VLine> {
    let mut v = Vec::new();
    if m > 0.0 {
        v.push(VLine {
            x: m / 1024.0,
            label: "M".into(),
            stroke: Stroke::Dotted,
        });
        if victim > 0.0 {
            v.push(VLine {
                x: (m + victim) / 1024.0,
                label: "M+MAXVICTIM".into(),
                stroke: Stroke::DashDot,
            });
        }
    }
    v
}

/// The figure's series from its rows (x scaled by `x_div`), in legend order, sorted by x.
fn series(rows: &[Row], x_div: f64) -> Vec<Series> {
    SERIES
        .iter()
        .filter_map(|&(name, label, style)| {
            let mut points: Vec<(f64, f64)> = rows
                .iter()
                .filter(|r| r.series == name)
                .map(|r| (r.x / x_div, r.y))
                .collect();
            if points.is_empty() {
                return None;
            }
            points.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.total_cmp(&b.1)));
            Some(Series {
                label: label.to_string(),
                style,
                points,
            })
        })
        .collect()
}

fn figure(
    title: &str,
    x: AxisSpec,
    y: AxisSpec,
    series: Vec<Series>,
    vlines: Vec<VLine>,
) -> Figure {
    Figure {
        size: SIZE,
        cols: 1,
        panels: vec![Panel {
            title: vec![title.to_string(), SUBTITLE.to_string()],
            x,
            y,
            series,
            vlines,
        }],
    }
}

/// The figures bench-fh.json's sweeps give, with their file names: fig3 (lat), fig4 (bw), fig5
/// (peak); a sweep without rows gives no figure. Err when the JSON is not bench-fh's or gives
/// no figure at all.
pub fn figures(json: &str) -> Result<Vec<(&'static str, Figure)>, String> {
    let doc: Value = serde_json::from_str(json).map_err(|e| format!("not JSON: {e}"))?;
    let doc = doc.as_object().ok_or("not a JSON object")?;
    // bench-fh.json keeps fh_bench's output under "sweeps"; fh_bench's own file is that object.
    let (sw, where_) = match doc.get("sweeps") {
        Some(v) => (
            v.as_object().ok_or("\"sweeps\" is not an object")?,
            "sweeps",
        ),
        None => (doc, "(top)"),
    };
    let cfg = sw.get("config").and_then(Value::as_object);
    let cfg_num = |k: &str| {
        cfg.and_then(|c| c.get(k))
            .and_then(Value::as_f64)
            .unwrap_or(0.0)
    };
    let marks = knees(cfg_num("m"), cfg_num("max_victim"));
    let working_set = "random remote working set [KiB]";

    let mut figs = Vec::new();
    let lat = rows(sw, where_, "lat", "working_set", "t_typical_us")?;
    if !lat.is_empty() {
        let mut s = series(&lat, 1024.0);
        let page = match doc.get("sweeps_page_mode").and_then(Value::as_object) {
            Some(pm) => rows(pm, "sweeps_page_mode", "lat", "working_set", "t_typical_us")?,
            None => Vec::new(),
        };
        let page_fh: Vec<Row> = page
            .into_iter()
            .filter(|r| r.series == "firehose")
            .collect();
        if let Some(fh) = series(&page_fh, 1024.0).pop() {
            s.push(Series {
                label: PAGE_MODE.0.to_string(),
                style: PAGE_MODE.1,
                points: fh.points,
            });
        }
        figs.push((
            "fig3.png",
            figure(
                "Fig. 3: put latency vs. remote working set",
                AxisSpec::new(working_set, Scale::Linear),
                AxisSpec::new("8-byte put latency, median [us]", Scale::Log10),
                s,
                marks.clone(),
            ),
        ));
    }
    let bw = rows(sw, where_, "bw", "working_set", "bw_peak_mb_s")?;
    if !bw.is_empty() {
        figs.push((
            "fig4.png",
            figure(
                "Fig. 4: put bandwidth vs. remote working set",
                AxisSpec::new(working_set, Scale::Linear),
                AxisSpec::new("64 KiB put bandwidth, best batch [MB/s]", Scale::Linear),
                series(&bw, 1024.0),
                marks,
            ),
        ));
    }
    let peak = rows(sw, where_, "peak", "bytes", "bw_peak_mb_s")?;
    if !peak.is_empty() {
        figs.push((
            "fig5.png",
            figure(
                "Fig. 5: peak put bandwidth by message size",
                AxisSpec::new("message size [bytes]", Scale::Log2),
                AxisSpec::new("put bandwidth, best batch [MB/s]", Scale::Log10),
                series(&peak, 1.0),
                Vec::new(),
            ),
        ));
    }
    if figs.is_empty() {
        return Err(format!(
            "no rows of {} in {where_}.lat, .bw or .peak",
            SERIES.map(|s| s.0).join(", ")
        ));
    }
    Ok(figs)
}

/// Reads bench-fh.json and writes fig3..5.png into `out` (made if missing).
pub fn run(json: &Path, out: &Path) -> Result<(), String> {
    let text = std::fs::read_to_string(json).map_err(|e| format!("{}: {e}", json.display()))?;
    let figs = figures(&text).map_err(|e| format!("{}: {e}", json.display()))?;
    crate::font::load()?;
    std::fs::create_dir_all(out).map_err(|e| format!("{}: {e}", out.display()))?;
    for (name, fig) in &figs {
        let path = out.join(name);
        crate::chart::save(&path, fig)?;
        println!("fh_plot: wrote {}", path.display());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOC: &str = r#"{
      "sweeps": {
        "config": {"m": 1048576, "max_victim": 524288},
        "lat": [
          {"series": "firehose", "working_set": 524288, "t_typical_us": 40.0},
          {"series": "firehose", "working_set": 262144, "t_typical_us": 30.0},
          {"series": "floor", "working_set": 262144, "t_typical_us": 25.0},
          {"series": "something_else", "working_set": 1}
        ],
        "peak": [{"series": "rdv_unpin", "bytes": 8, "bw_peak_mb_s": 0.05}]
      },
      "sweeps_page_mode": {"lat": [
        {"series": "firehose", "working_set": 262144, "t_typical_us": 29.0},
        {"series": "floor", "working_set": 262144, "t_typical_us": 24.0}
      ]}
    }"#;

    #[test]
    fn knees_are_m_and_m_plus_maxvictim_in_kib() {
        let k = knees(1048576.0, 524288.0);
        assert_eq!(k.len(), 2);
        assert_eq!(
            (k[0].x, k[0].label.as_str(), k[0].stroke),
            (1024.0, "M", Stroke::Dotted)
        );
        assert_eq!(
            (k[1].x, k[1].label.as_str(), k[1].stroke),
            (1536.0, "M+MAXVICTIM", Stroke::DashDot)
        );
        assert_eq!(knees(1048576.0, 0.0).len(), 1);
        assert!(knees(0.0, 524288.0).is_empty());
    }

    #[test]
    fn figures_follow_the_sweeps_present() {
        let figs = figures(DOC).unwrap();
        let names: Vec<&str> = figs.iter().map(|f| f.0).collect();
        assert_eq!(names, ["fig3.png", "fig5.png"]); // no bw sweep: no fig4
        let fig3 = &figs[0].1.panels[0];
        let labels: Vec<&str> = fig3.series.iter().map(|s| s.label.as_str()).collect();
        assert_eq!(labels, ["Firehose", "registered once (floor)", PAGE_MODE.0]);
        // KiB, sorted by working set.
        assert_eq!(fig3.series[0].points, [(256.0, 30.0), (512.0, 40.0)]);
        assert_eq!(fig3.series[2].points, [(256.0, 29.0)]);
        assert_eq!(fig3.vlines.len(), 2);
        assert_eq!(fig3.y.scale, Scale::Log10);
        let fig5 = &figs[1].1.panels[0];
        assert!(fig5.vlines.is_empty());
        assert_eq!((fig5.x.scale, fig5.y.scale), (Scale::Log2, Scale::Log10));
        assert_eq!(fig5.series[0].points, [(8.0, 0.05)]);
    }

    #[test]
    fn fh_bench_output_without_the_sweeps_wrapper_is_read_too() {
        let doc = r#"{"bw": [{"series": "firehose", "working_set": 1024, "bw_peak_mb_s": 3}]}"#;
        let figs = figures(doc).unwrap();
        assert_eq!(figs[0].0, "fig4.png");
        assert!(figs[0].1.panels[0].vlines.is_empty()); // no config: no knees
    }

    #[test]
    fn bad_documents_are_errors() {
        for (doc, want) in [
            ("{", "not JSON"),
            ("[1, 2]", "not a JSON object"),
            (r#"{"sweeps": 3}"#, "\"sweeps\" is not an object"),
            (r#"{"sweeps": {}}"#, "no rows"),
            (r#"{"sweeps": {"lat": {}}}"#, "sweeps.lat is not a list"),
            (
                r#"{"sweeps": {"lat": [7]}}"#,
                "sweeps.lat[0] is not an object",
            ),
            (
                r#"{"sweeps": {"lat": [{"working_set": 1}]}}"#,
                "has no \"series\"",
            ),
            (
                r#"{"sweeps": {"lat": [{"series": "floor", "working_set": 1}]}}"#,
                "has no number \"t_typical_us\"",
            ),
            (
                r#"{"sweeps": {"lat": [{"series": "floor", "working_set": "x", "t_typical_us": 1}]}}"#,
                "has no number \"working_set\"",
            ),
        ] {
            let e = figures(doc)
                .err()
                .unwrap_or_else(|| panic!("{doc}: no error"));
            assert!(e.contains(want), "{doc}: {e:?} lacks {want:?}");
            assert!(!e.contains('\n'), "{e:?}");
        }
    }
}
