//! Draws figures with plotters: a grid of panels, each with a title of one or more lines, axes
//! (linear or log, ticks from `axis`), series of lines and markers, labelled vertical lines and a
//! legend in the corner the data leaves freest. What a figure shows is built by `fh` and
//! `helper_series`; this file only draws it.

use crate::axis::{self, Scale, Ticks};
use crate::glyph::{pattern_runs, Glyph, DOT, DOT_SPACING, LINE_WIDTH};
pub use crate::glyph::{Marker, Stroke};
use crate::legend::{best_corner, headroom, obstacles, Corner};
use crate::text::{self, Align, Label};
use plotters::coord::ranged1d::{KeyPointHint, NoDefaultFormatting, Ranged, ValueFormatter};
use plotters::coord::Shift;
use plotters::prelude::*;
use std::path::Path;

/// matplotlib's "tab10" colours, the ones the figures have always used.
pub const TAB_BLUE: RGBColor = RGBColor(31, 119, 180);
pub const TAB_ORANGE: RGBColor = RGBColor(255, 127, 14);
pub const TAB_GREEN: RGBColor = RGBColor(44, 160, 44);
pub const TAB_RED: RGBColor = RGBColor(214, 39, 40);
pub const TAB_GRAY: RGBColor = RGBColor(127, 127, 127);
const GREY: RGBColor = RGBColor(128, 128, 128);

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

/// Text sizes: a line's height in pixels (ascent plus descent).
const TITLE: f32 = 18.0;
const SUBTITLE: f32 = 16.5;
const AXIS_DESC: f32 = 17.0;
const TICK_LABEL: f32 = 15.5;
const LEGEND: f32 = 14.5;
const NOTE: f32 = 13.5;
/// Tick marks' length, and the gap between a tick and its label.
const TICK: i32 = 5;
const GAP: i32 = 4;
/// The legend: the room its sample of a series takes left of the text, the padding inside its
/// box, the distance of the box from the plot's sides, the height of an entry.
const LEGEND_AREA: i32 = 34;
const LEGEND_PAD: i32 = 7;
const LEGEND_INSET: i32 = 6;
const LEGEND_LINE: f32 = 1.3 * LEGEND;

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

/// Draws `fig` on `root` (the whole canvas: text is placed in its pixels).
pub fn draw<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, fig: &Figure) -> Result<(), String> {
    root.fill(&WHITE).map_err(err)?;
    let cols = fig.cols.max(1);
    let rows = fig.panels.len().div_ceil(cols).max(1);
    let areas = root.split_evenly((rows, cols));
    for (panel, area) in fig.panels.iter().zip(&areas) {
        draw_panel(root, area, panel)?;
    }
    Ok(())
}

/// A series' points that the axes can place (a log axis drops values <= 0), as values.
fn placeable(s: &Series, x: Scale, y: Scale) -> Vec<(f64, f64)> {
    s.points
        .iter()
        .copied()
        .filter(|(a, b)| x.accepts(*a) && y.accepts(*b))
        .collect()
}

/// The chart of a panel: its plot below `title_h` pixels of title, room left of and below it
/// for ticks, their labels and the axis titles.
fn build<'a, DB: DrawingBackend>(
    area: &'a DrawingArea<DB, Shift>,
    title_h: i32,
    xt: &Ticks,
    yt: &Ticks,
) -> Result<ChartContext<'a, DB, Cartesian2d<Ticks, Ticks>>, String> {
    let tick_h = text::measure("0", TICK_LABEL).1.ceil() as i32;
    let desc_h = text::measure("0", AXIS_DESC).1.ceil() as i32;
    let y_label_w = yt
        .major
        .iter()
        .map(|m| text::measure(&m.1, TICK_LABEL).0.ceil() as i32)
        .max()
        .unwrap_or(0);
    ChartBuilder::on(area)
        .margin_top(title_h + 6)
        .margin_left(6)
        .margin_right(20)
        .margin_bottom(4)
        .x_label_area_size(TICK + GAP + tick_h + GAP + desc_h + 4)
        .y_label_area_size(TICK + GAP + y_label_w + GAP + 2 + desc_h)
        .build_cartesian_2d(xt.clone(), yt.clone())
        .map_err(err)
}

/// The plot's left, right, top and bottom pixels.
fn plot_rect<DB: DrawingBackend>(
    chart: &ChartContext<DB, Cartesian2d<Ticks, Ticks>>,
) -> (i32, i32, i32, i32) {
    let (xr, yr) = chart.plotting_area().get_pixel_range();
    (xr.start, xr.end - 1, yr.start, yr.end - 1)
}

/// One panel in `area`; `root` is the canvas, where text, ticks, the frame and the legend are
/// drawn in pixels.
fn draw_panel<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    area: &DrawingArea<DB, Shift>,
    p: &Panel,
) -> Result<(), String> {
    let put = |l: Label| root.draw(&l).map_err(err);
    let (ax, ay) = area.get_base_pixel();
    let (aw, _) = area.dim_in_pixel();
    let mut y = ay + 6;
    for (i, line) in p.title.iter().enumerate() {
        let size = if i == 0 { TITLE } else { SUBTITLE };
        put(Label::new(
            (ax + aw as i32 / 2, y),
            line,
            size,
            BLACK,
            Align::Center,
            Align::Start,
        ))?;
        y += (size * 1.2).round() as i32;
    }
    let title_h = y - ay;

    let (sx, sy) = (p.x.scale, p.y.scale);
    let kept: Vec<Vec<(f64, f64)>> = p.series.iter().map(|s| placeable(s, sx, sy)).collect();
    let vlines: Vec<&VLine> = p.vlines.iter().filter(|v| sx.accepts(v.x)).collect();
    let xs = kept.iter().flatten().map(|q| q.0);
    let xt = axis::fit(
        sx,
        xs.chain(vlines.iter().map(|v| v.x))
            .chain(p.x.include.iter().copied()),
    );
    let ys = kept.iter().flatten().map(|q| q.1);
    let mut yt = axis::fit(sy, ys.chain(p.y.include.iter().copied()));
    // The same points in axis space, where the chart is linear.
    let lines: Vec<Vec<(f64, f64)>> = kept
        .iter()
        .map(|l| {
            l.iter()
                .map(|&(a, b)| (sx.to_axis(a), sy.to_axis(b)))
                .collect()
        })
        .collect();
    let vx: Vec<f64> = vlines.iter().map(|v| sx.to_axis(v.x)).collect();

    // The legend goes in the corner the lines leave freest; when every corner has some, the y
    // axis grows upwards until the legend fits above the lines.
    let legend_w = p
        .series
        .iter()
        .map(|s| text::measure(&s.label, LEGEND).0.ceil() as i32)
        .max()
        .map(|w| 2 * LEGEND_PAD + LEGEND_AREA + w);
    let legend_h = 2 * LEGEND_PAD + (LEGEND_LINE * p.series.len() as f32).round() as i32;
    let mut corner = Corner::UpperRight;
    if let Some(legend_w) = legend_w {
        let (left, right, top, bottom) = plot_rect(&build(area, title_h, &xt, &yt)?);
        let need = (
            (legend_w + LEGEND_INSET) as f64 / (right - left).max(1) as f64,
            (legend_h + LEGEND_INSET) as f64 / (bottom - top).max(1) as f64,
        );
        let (c, covered) = best_corner(&obstacles(&lines, &vx, &xt, &yt), need);
        corner = c;
        let data_top = lines.iter().flatten().map(|q| q.1).reduce(f64::max);
        if let (true, Some(data_top)) = (covered > 0 && need.1 < 0.6, data_top) {
            yt = axis::span(sy, yt.lo, headroom(yt.lo, yt.hi, data_top, need.1));
            corner = best_corner(&obstacles(&lines, &vx, &xt, &yt), need).0;
        }
    }

    let mut chart = build(area, title_h, &xt, &yt)?;
    // plotters draws the grid; the frame, ticks and text are drawn here.
    chart
        .configure_mesh()
        .disable_axes()
        .bold_line_style(BLACK.mix(0.15))
        .light_line_style(BLACK.mix(0.07))
        .draw()
        .map_err(err)?;
    let (left, right, top, bottom) = plot_rect(&chart);
    root.draw(&Rectangle::new([(left, top), (right, bottom)], BLACK))
        .map_err(err)?;
    for (t, label) in &xt.major {
        let x = chart.backend_coord(&(*t, yt.lo)).0;
        root.draw(&PathElement::new(
            vec![(x, bottom), (x, bottom + TICK)],
            BLACK,
        ))
        .map_err(err)?;
        put(Label::new(
            (x, bottom + TICK + GAP),
            label,
            TICK_LABEL,
            BLACK,
            Align::Center,
            Align::Start,
        ))?;
    }
    for (t, label) in &yt.major {
        let y = chart.backend_coord(&(xt.lo, *t)).1;
        root.draw(&PathElement::new(vec![(left - TICK, y), (left, y)], BLACK))
            .map_err(err)?;
        put(Label::new(
            (left - TICK - GAP, y),
            label,
            TICK_LABEL,
            BLACK,
            Align::End,
            Align::Center,
        ))?;
    }
    let tick_h = text::measure("0", TICK_LABEL).1.ceil() as i32;
    let desc_h = text::measure("0", AXIS_DESC).1.ceil() as i32;
    let x_desc_y = bottom + TICK + GAP + tick_h + GAP;
    put(Label::new(
        ((left + right) / 2, x_desc_y),
        &p.x.desc,
        AXIS_DESC,
        BLACK,
        Align::Center,
        Align::Start,
    ))?;
    let mut y_desc = Label::new(
        (ax + 6 + desc_h / 2, (top + bottom) / 2),
        &p.y.desc,
        AXIS_DESC,
        BLACK,
        Align::Center,
        Align::Center,
    );
    y_desc.up = true;
    put(y_desc)?;

    let plot_h = (bottom - top).max(1) as f64;
    for (v, &x) in vlines.iter().zip(&vx) {
        let style = GREY.stroke_width(1);
        let span = yt.hi - yt.lo;
        chart
            .draw_series(
                pattern_runs(plot_h, v.stroke.pattern())
                    .into_iter()
                    .map(|(a, b)| {
                        // Runs are measured down from the top, in pixels.
                        let at = |d: f64| yt.hi - span * d / plot_h;
                        PathElement::new(vec![(x, at(a)), (x, at(b))], style)
                    }),
            )
            .map_err(err)?;
        let px = chart.backend_coord(&(x, yt.hi)).0;
        put(Label::new(
            (px + 4, top + 3),
            &v.label,
            NOTE,
            GREY,
            Align::Start,
            Align::Start,
        ))?;
    }

    for (s, line_pts) in p.series.iter().zip(&lines) {
        let color = s.style.color;
        let line = color.stroke_width(LINE_WIDTH);
        let pts = line_pts.iter().copied();
        match s.style.stroke {
            Stroke::Solid => chart.draw_series(LineSeries::new(pts, line)),
            // Dots: plotters' thick dashes a pixel or two long come out ragged.
            Stroke::Dotted => {
                chart.draw_series(DottedLineSeries::new(pts, 0.0, DOT_SPACING, move |c| {
                    Rectangle::new([c, (c.0 + DOT - 1, c.1 + DOT - 1)], color.filled())
                }))
            }
            d => {
                let pat = d.pattern();
                chart.draw_series(DashedLineSeries::new(pts, pat[0], pat[1], line))
            }
        }
        .map_err(err)?;
        if s.style.marker != Marker::None {
            chart
                .draw_series(line_pts.iter().map(|&q| Glyph {
                    at: q,
                    marker: s.style.marker,
                    color,
                    line: None,
                }))
                .map_err(err)?;
        }
    }

    let Some(legend_w) = legend_w else {
        return Ok(());
    };
    let (x0, y0) = match corner {
        Corner::UpperRight => (right - LEGEND_INSET - legend_w, top + LEGEND_INSET),
        Corner::UpperLeft => (left + LEGEND_INSET, top + LEGEND_INSET),
        Corner::LowerLeft => (left + LEGEND_INSET, bottom - LEGEND_INSET - legend_h),
        Corner::LowerRight => (
            right - LEGEND_INSET - legend_w,
            bottom - LEGEND_INSET - legend_h,
        ),
    };
    let (x1, y1) = (x0 + legend_w, y0 + legend_h);
    root.draw(&Rectangle::new(
        [(x0, y0), (x1, y1)],
        WHITE.mix(0.85).filled(),
    ))
    .map_err(err)?;
    root.draw(&Rectangle::new([(x0, y0), (x1, y1)], BLACK.mix(0.25)))
        .map_err(err)?;
    for (i, s) in p.series.iter().enumerate() {
        let cy = y0 + LEGEND_PAD + (LEGEND_LINE * (i as f32 + 0.5)).round() as i32;
        root.draw(&Glyph {
            at: (x0 + LEGEND_PAD, cy),
            marker: s.style.marker,
            color: s.style.color,
            line: Some(s.style.stroke),
        })
        .map_err(err)?;
        put(Label::new(
            (x0 + LEGEND_PAD + LEGEND_AREA, cy),
            &s.label,
            LEGEND,
            BLACK,
            Align::Start,
            Align::Center,
        ))?;
    }
    Ok(())
}

/// An axis for plotters: linear over the ticks' range (axis space), grid lines and labels at
/// the ticks.
impl Ranged for Ticks {
    type FormatOption = NoDefaultFormatting;
    type ValueType = f64;

    fn map(&self, v: &f64, (p0, p1): (i32, i32)) -> i32 {
        let f = (v - self.lo) / (self.hi - self.lo);
        p0 + (f * (p1 - p0) as f64).round() as i32
    }

    fn key_points<H: KeyPointHint>(&self, hint: H) -> Vec<f64> {
        if hint.weight().allow_light_points() {
            self.minor.clone()
        } else {
            self.major.iter().map(|m| m.0).collect()
        }
    }

    fn range(&self) -> std::ops::Range<f64> {
        self.lo..self.hi
    }
}

impl ValueFormatter<f64> for Ticks {
    fn format_ext(&self, v: &f64) -> String {
        self.label_at(*v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panel_draws_its_series_and_knee_line() {
        // Without a font the text is left out; everything else is drawn the same.
        let _ = crate::font::load();
        let style = Style {
            color: TAB_RED,
            marker: Marker::Circle,
            stroke: Stroke::Solid,
        };
        let fig = Figure {
            size: (400, 300),
            cols: 1,
            panels: vec![Panel {
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
            }],
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
        // The knee: one column of grey dots, a good part of the plot high.
        let columns = (0..400)
            .filter(|x| (0..300).filter(|y| is(GREY)(px[y * 400 + x])).count() > 40)
            .count();
        assert_eq!(columns, 1);
    }
}
