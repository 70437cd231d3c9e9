//! Draws figures with plotters' own chart machinery: a grid of panels, each with a title of one
//! or more lines, a mesh with labelled linear or log axes (`ChartBuilder`, `log_scale`), series
//! of lines and markers, labelled vertical lines and a legend (`configure_series_labels`). What a
//! figure shows is built by `fh` and `helper_series`; this file only draws it. Text goes through
//! plotters' ab_glyph font table, which `font::load` fills.

use plotters::coord::ranged1d::{AsRangedCoord, ValueFormatter};
use plotters::coord::Shift;
use plotters::prelude::*;
use std::ops::Range;
use std::path::Path;

/// matplotlib's "tab10" colours, the ones the figures have always used.
pub const TAB_BLUE: RGBColor = RGBColor(31, 119, 180);
pub const TAB_ORANGE: RGBColor = RGBColor(255, 127, 14);
pub const TAB_GREEN: RGBColor = RGBColor(44, 160, 44);
pub const TAB_RED: RGBColor = RGBColor(214, 39, 40);
pub const TAB_GRAY: RGBColor = RGBColor(127, 127, 127);
const GREY: RGBColor = RGBColor(128, 128, 128);

/// The font family `font::load` registers.
pub const FAMILY: &str = "sans-serif";

/// How values map onto an axis.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scale {
    Linear,
    /// Decades.
    Log10,
    /// Powers of two; labels are sizes with binary prefixes (8, 4Ki, 1Mi): it is for bytes.
    Log2,
}

impl Scale {
    /// Whether a value can be placed on this axis (a log axis has no place for 0 or below).
    pub fn accepts(self, v: f64) -> bool {
        v.is_finite() && (self == Scale::Linear || v > 0.0)
    }

    fn to_axis(self, v: f64) -> f64 {
        match self {
            Scale::Linear => v,
            _ => v.ln(),
        }
    }

    fn value_at(self, t: f64) -> f64 {
        match self {
            Scale::Linear => t,
            _ => t.exp(),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Marker {
    None,
    Circle,
    Square,
    Triangle,
    Cross,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stroke {
    Solid,
    Dashed,
    Dotted,
    /// For vertical lines (drawn with longer dashes: plotters has no dash-dot line).
    DashDot,
}

#[derive(Clone, Copy, Debug)]
pub struct Style {
    pub color: RGBColor,
    pub marker: Marker,
    pub stroke: Stroke,
}

/// One line of a panel, in data values; the legend shows `label`.
#[derive(Clone, Debug)]
pub struct Series {
    pub label: String,
    pub style: Style,
    pub points: Vec<(f64, f64)>,
}

/// A vertical line across the panel at `x`, `label` written at its top.
#[derive(Clone, Debug)]
pub struct VLine {
    pub x: f64,
    pub label: String,
    pub stroke: Stroke,
}

#[derive(Clone, Debug)]
pub struct AxisSpec {
    pub desc: String,
    pub scale: Scale,
    /// Values the axis must show besides the data (0 for a quantity that starts there).
    pub include: Vec<f64>,
}

impl AxisSpec {
    pub fn new(desc: &str, scale: Scale) -> Self {
        AxisSpec {
            desc: desc.to_string(),
            scale,
            include: Vec::new(),
        }
    }
}

#[derive(Clone, Debug)]
pub struct Panel {
    /// Centred lines above the plot, the first one larger.
    pub title: Vec<String>,
    pub x: AxisSpec,
    pub y: AxisSpec,
    pub series: Vec<Series>,
    pub vlines: Vec<VLine>,
}

/// Panels in rows of `cols`, on a white canvas of `size` pixels.
#[derive(Clone, Debug)]
pub struct Figure {
    pub size: (u32, u32),
    pub cols: usize,
    pub panels: Vec<Panel>,
}

/// Text sizes in pixels.
const TITLE: u32 = 18;
const SUBTITLE: u32 = 16;
const AXIS_DESC: u32 = 16;
const TICK_LABEL: u32 = 14;
const LEGEND: u32 = 14;
const NOTE: u32 = 13;
/// Series lines' width and markers' radius in pixels.
const LINE_WIDTH: u32 = 2;
const MARKER_SIZE: i32 = 4;
/// The margin on each side of the data, as a share of its extent (matplotlib's default), and
/// the share of the plot's height each legend entry reserves above the data.
const MARGIN: f64 = 0.05;
const LEGEND_ROOM: f64 = 0.075;

fn err<E: std::fmt::Display>(e: E) -> String {
    e.to_string()
}

/// Draws `fig` into `path` (a PNG: the name must end in .png). Needs `font::load` first.
pub fn save(path: &Path, fig: &Figure) -> Result<(), String> {
    let root = BitMapBackend::new(path, fig.size).into_drawing_area();
    draw(&root, fig)?;
    root.present()
        .map_err(|e| format!("{}: {e}", path.display()))
}

/// Draws `fig` on `root` (the whole canvas).
pub fn draw<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, fig: &Figure) -> Result<(), String> {
    root.fill(&WHITE).map_err(err)?;
    let cols = fig.cols.max(1);
    let rows = fig.panels.len().div_ceil(cols).max(1);
    let areas = root.split_evenly((rows, cols));
    for (panel, area) in fig.panels.iter().zip(areas) {
        draw_panel(area, panel)?;
    }
    Ok(())
}

/// The extent of an axis over `values` (those the scale cannot place are ignored), with a
/// margin each side in axis space (logarithms on a log axis), as values. No usable value: 0..1
/// (linear) or 1..10 (log); one value: a range around it.
fn extent(scale: Scale, values: impl IntoIterator<Item = f64>) -> Range<f64> {
    let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
    for v in values.into_iter().filter(|&v| scale.accepts(v)) {
        let t = scale.to_axis(v);
        lo = lo.min(t);
        hi = hi.max(t);
    }
    if lo > hi {
        return match scale {
            Scale::Linear => 0.0..1.0,
            _ => 1.0..10.0,
        };
    }
    let pad = if hi - lo < 1e-9 * lo.abs().max(1.0) {
        match scale {
            Scale::Linear if lo != 0.0 => lo.abs() * 0.1,
            Scale::Linear => 1.0,
            _ => 0.5,
        }
    } else {
        (hi - lo) * MARGIN
    };
    scale.value_at(lo - pad)..scale.value_at(hi + pad)
}

/// The same extent with its top raised (in axis space) so that `share` of the plot's height
/// stays above the data, for the legend.
fn with_headroom(scale: Scale, r: Range<f64>, share: f64) -> Range<f64> {
    let (lo, hi) = (scale.to_axis(r.start), scale.to_axis(r.end));
    let room = (1.0 - share).max(0.4);
    r.start..scale.value_at(lo + (hi - lo) / room)
}

/// A tick label: a plain number (20, 0.05, 1.25) unless very large or small (2e7); on a
/// `Log2` axis, sizes with binary prefixes (8, 4Ki, 1Mi).
fn label(scale: Scale, v: f64) -> String {
    if scale == Scale::Log2 && v >= 1.0 && v.log2().fract().abs() < 1e-9 {
        let p = v.log2().round() as u32;
        return match p {
            0..=9 => format!("{}", 1u64 << p),
            10..=19 => format!("{}Ki", 1u64 << (p - 10)),
            20..=29 => format!("{}Mi", 1u64 << (p - 20)),
            30..=39 => format!("{}Gi", 1u64 << (p - 30)),
            _ => format!("{}Ti", 1u64 << (p.min(62) - 40)),
        };
    }
    if v == 0.0 {
        return "0".into();
    }
    if !(1e-4..1e6).contains(&v.abs()) {
        return format!("{v:e}");
    }
    let s = format!("{v:.4}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// One panel in `area`: its title lines, then the chart under them.
fn draw_panel<DB: DrawingBackend>(area: DrawingArea<DB, Shift>, p: &Panel) -> Result<(), String> {
    let mut area = area;
    for (i, line) in p.title.iter().enumerate() {
        let size = if i == 0 { TITLE } else { SUBTITLE };
        area = area.titled(line, (FAMILY, size)).map_err(err)?;
    }
    let sx = p.x.scale;
    let xs = p.series.iter().flat_map(|s| s.points.iter().map(|q| q.0));
    let xs = xs.chain(p.vlines.iter().map(|v| v.x));
    let xr = extent(sx, xs.chain(p.x.include.iter().copied()));
    // Each scale is its own coordinate type: pick the pair, then draw with it.
    match sx {
        Scale::Linear => with_y(&area, p, xr),
        Scale::Log10 => with_y(&area, p, xr.log_scale()),
        Scale::Log2 => with_y(&area, p, xr.log_scale().base(2.0)),
    }
}

fn with_y<DB: DrawingBackend, X>(
    area: &DrawingArea<DB, Shift>,
    p: &Panel,
    x: X,
) -> Result<(), String>
where
    X: AsRangedCoord<Value = f64>,
    X::CoordDescType: ValueFormatter<f64>,
{
    let ys = p.series.iter().flat_map(|s| s.points.iter().map(|q| q.1));
    let yr = extent(p.y.scale, ys.chain(p.y.include.iter().copied()));
    let yr = with_headroom(p.y.scale, yr, LEGEND_ROOM * p.series.len() as f64);
    match p.y.scale {
        Scale::Linear => chart(area, p, x, yr),
        Scale::Log10 => chart(area, p, x, yr.log_scale()),
        Scale::Log2 => chart(area, p, x, yr.log_scale().base(2.0)),
    }
}

/// The chart of a panel on coordinates `x` and `y`: mesh, labels, vertical lines, series and
/// legend.
fn chart<DB: DrawingBackend, X, Y>(
    area: &DrawingArea<DB, Shift>,
    p: &Panel,
    x: X,
    y: Y,
) -> Result<(), String>
where
    X: AsRangedCoord<Value = f64>,
    Y: AsRangedCoord<Value = f64>,
    X::CoordDescType: ValueFormatter<f64>,
    Y::CoordDescType: ValueFormatter<f64>,
{
    let (sx, sy) = (p.x.scale, p.y.scale);
    let mut chart = ChartBuilder::on(area)
        .margin(8)
        .margin_right(20)
        .x_label_area_size(50)
        .y_label_area_size(70)
        .build_cartesian_2d(x, y)
        .map_err(err)?;
    let (x_range, y_range) = (chart.x_range(), chart.y_range());
    let fx = |v: &f64| label(sx, *v);
    let fy = |v: &f64| label(sy, *v);
    chart
        .configure_mesh()
        .x_desc(p.x.desc.as_str())
        .y_desc(p.y.desc.as_str())
        .x_label_formatter(&fx)
        .y_label_formatter(&fy)
        .label_style((FAMILY, TICK_LABEL))
        .axis_desc_style((FAMILY, AXIS_DESC))
        .bold_line_style(BLACK.mix(0.15))
        .light_line_style(BLACK.mix(0.07))
        .draw()
        .map_err(err)?;

    for v in p.vlines.iter().filter(|v| sx.accepts(v.x)) {
        let style = GREY.stroke_width(1);
        let pts = [(v.x, y_range.start), (v.x, y_range.end)];
        let (on, off) = match v.stroke {
            Stroke::Dotted => (2, 3),
            Stroke::DashDot => (9, 4),
            _ => (6, 4),
        };
        chart
            .draw_series(DashedLineSeries::new(pts, on, off, style))
            .map_err(err)?;
        let note = Text::new(
            v.label.clone(),
            (4, 3),
            (FAMILY, NOTE).into_font().color(&GREY),
        );
        chart
            .draw_series(std::iter::once(EmptyElement::at((v.x, y_range.end)) + note))
            .map_err(err)?;
    }

    for s in &p.series {
        let color = s.style.color;
        let line = color.stroke_width(LINE_WIDTH);
        let pts: Vec<(f64, f64)> = s
            .points
            .iter()
            .copied()
            .filter(|&(a, b)| sx.accepts(a) && sy.accepts(b))
            .filter(|(a, b)| x_range.contains(a) && y_range.contains(b))
            .collect();
        let drawn = match s.style.stroke {
            Stroke::Solid => chart.draw_series(LineSeries::new(pts.iter().copied(), line)),
            Stroke::Dotted => {
                chart.draw_series(DottedLineSeries::new(pts.iter().copied(), 0, 5, move |c| {
                    Circle::new(c, 1, color.filled())
                }))
            }
            _ => chart.draw_series(DashedLineSeries::new(pts.iter().copied(), 7, 4, line)),
        }
        .map_err(err)?;
        let (m, stroke) = (s.style.marker, s.style.stroke);
        // The legend's sample: a short line (dashes for a broken stroke) with the marker.
        let sample = match stroke {
            Stroke::Solid => vec![(0, 0), (24, 0)],
            _ => vec![(0, 0), (8, 0)],
        };
        let anno = drawn.label(s.label.as_str());
        let path = move |at| EmptyElement::at(at) + PathElement::new(sample.clone(), line);
        let (r, fill, thin) = (MARKER_SIZE, color.filled(), color.stroke_width(2));
        let pts = pts.iter().copied();
        // Each marker is its own element type: the legend's sample and the points per kind.
        match m {
            Marker::None => {
                anno.legend(path);
                Ok(())
            }
            Marker::Circle => {
                anno.legend(move |at| path(at) + Circle::new((12, 0), r, fill));
                chart
                    .draw_series(pts.map(|q| Circle::new(q, r, fill)))
                    .map(drop)
            }
            Marker::Square => {
                let sq = move |x| Rectangle::new([(x - r, -r), (x + r, r)], fill);
                anno.legend(move |at| path(at) + sq(12));
                chart
                    .draw_series(pts.map(|q| EmptyElement::at(q) + sq(0)))
                    .map(drop)
            }
            Marker::Triangle => {
                anno.legend(move |at| path(at) + TriangleMarker::new((12, 0), r + 1, fill));
                chart
                    .draw_series(pts.map(|q| TriangleMarker::new(q, r + 1, fill)))
                    .map(drop)
            }
            Marker::Cross => {
                anno.legend(move |at| path(at) + Cross::new((12, 0), r, thin));
                chart
                    .draw_series(pts.map(|q| Cross::new(q, r, thin)))
                    .map(drop)
            }
        }
        .map_err(err)?;
    }

    if !p.series.is_empty() {
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .label_font((FAMILY, LEGEND))
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK.mix(0.25))
            .draw()
            .map_err(err)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn panel() -> Panel {
        let style = Style {
            color: TAB_RED,
            marker: Marker::Circle,
            stroke: Stroke::Solid,
        };
        Panel {
            title: vec!["title".into()],
            x: AxisSpec::new("x", Scale::Linear),
            y: AxisSpec::new("y", Scale::Log10),
            series: vec![Series {
                label: "a".into(),
                style,
                // 0 has no place on a log axis: left out, not drawn at minus infinity.
                points: vec![(0.0, 1.0), (3.0, 0.0), (10.0, 100.0)],
            }],
            vlines: vec![VLine {
                x: 5.0,
                label: "M".into(),
                stroke: Stroke::Dotted,
            }],
        }
    }

    /// The font, or None (the test is then skipped: plotters cannot draw text without one).
    fn font() -> Option<()> {
        match crate::font::load() {
            Ok(()) => Some(()),
            Err(e) => {
                eprintln!("skipped: {e}");
                None
            }
        }
    }

    #[test]
    fn a_panel_draws_its_series_and_knee_line() {
        let Some(()) = font() else { return };
        let fig = Figure {
            size: (400, 300),
            cols: 1,
            panels: vec![panel()],
        };
        let mut buf = vec![0u8; 400 * 300 * 3];
        {
            let root = BitMapBackend::with_buffer(&mut buf, (400, 300)).into_drawing_area();
            draw(&root, &fig).unwrap();
            root.present().unwrap();
        }
        let is = |c: RGBColor| move |p: &[u8]| p == [c.0, c.1, c.2];
        let px: Vec<&[u8]> = buf.chunks(3).collect();
        assert!(px.iter().filter(|p| is(WHITE)(p)).count() > 400 * 300 / 2);
        assert!(px.iter().filter(|p| is(TAB_RED)(p)).count() > 100);
        // The knee: one column of grey dashes, a good part of the plot high.
        let columns = (0..400)
            .filter(|x| (0..300).filter(|y| is(GREY)(px[y * 400 + x])).count() > 40)
            .count();
        assert_eq!(columns, 1);
    }

    #[test]
    fn every_scale_pair_renders_a_png_file() {
        let Some(()) = font() else { return };
        let scales = [Scale::Linear, Scale::Log10, Scale::Log2];
        let mut panels = Vec::new();
        for sx in scales {
            for sy in scales {
                let mut p = panel();
                p.x.scale = sx;
                p.y.scale = sy;
                p.series[0].points.push((4096.0, 0.5));
                panels.push(p);
            }
        }
        let fig = Figure {
            size: (900, 900),
            cols: 3,
            panels,
        };
        let path = std::env::temp_dir().join(format!("fh_plot-test-{}.png", std::process::id()));
        save(&path, &fig).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        let _ = std::fs::remove_file(&path);
        assert!(bytes.len() > 1000, "{} bytes", bytes.len());
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
    }

    #[test]
    fn tick_labels_are_plain_numbers_or_binary_sizes() {
        assert_eq!(label(Scale::Linear, 1000.0), "1000");
        assert_eq!(label(Scale::Linear, 0.25), "0.25");
        assert_eq!(label(Scale::Log10, 2e7), "2e7");
        assert_eq!(label(Scale::Log2, 4096.0), "4Ki");
        assert_eq!(label(Scale::Log2, 1048576.0), "1Mi");
        assert_eq!(label(Scale::Log2, 8.0), "8");
        assert_eq!(label(Scale::Log2, 3.5), "3.5");
    }

    #[test]
    fn log_extents_leave_out_what_they_cannot_place() {
        let r = extent(Scale::Log10, [0.0, -3.0, f64::NAN, 10.0, 1000.0]);
        assert!(r.start > 0.0 && r.start < 10.0 && r.end > 1000.0, "{r:?}");
        let r = extent(Scale::Linear, [5.0, 5.0]);
        assert!(r.start < 5.0 && r.end > 5.0);
        assert_eq!(extent(Scale::Linear, []), 0.0..1.0);
    }
}
