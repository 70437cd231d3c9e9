//! How a series looks: its marker and stroke, and the plotters element that draws a marker
//! (or a legend's sample of a series) with the backend's primitives.

use plotters::element::{Drawable, PointCollection};
use plotters::style::{Color, RGBColor};
use plotters_backend::{BackendCoord, DrawingBackend, DrawingErrorKind};

/// Series lines' width in pixels, and a marker's half-width.
pub const LINE_WIDTH: u32 = 2;
const MARKER_SIZE: i32 = 4;
/// The legend's sample of a series: its length in pixels.
const LEGEND_SAMPLE: i32 = 26;
/// A dotted line's dots: their side (square; plotters' smallest circles are crosses) and the
/// distance between them.
pub const DOT: i32 = 3;
pub const DOT_SPACING: f64 = 5.0;

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
    /// For vertical lines (a series gets dashes: plotters has no dash-dot line series).
    DashDot,
}

impl Stroke {
    /// On/off lengths in pixels, repeated; empty: solid.
    pub fn pattern(self) -> &'static [f64] {
        match self {
            Stroke::Solid => &[],
            Stroke::Dashed => &[7.0, 4.0],
            Stroke::Dotted => &[1.0, 2.5],
            Stroke::DashDot => &[7.0, 3.0, 1.5, 3.0],
        }
    }
}

/// A series' marker, or with `line` its legend sample (a short line in that stroke with the
/// marker in its middle), as one plotters element drawn with the backend's primitives: every
/// kind is then the same type.
pub struct Glyph<C> {
    pub at: C,
    pub marker: Marker,
    pub color: RGBColor,
    pub line: Option<Stroke>,
}

impl<'b, C> PointCollection<'b, C> for &'b Glyph<C> {
    type Point = &'b C;
    type IntoIter = std::iter::Once<&'b C>;
    fn point_iter(self) -> Self::IntoIter {
        std::iter::once(&self.at)
    }
}

impl<C, DB: DrawingBackend> Drawable<DB> for Glyph<C> {
    fn draw<I: Iterator<Item = BackendCoord>>(
        &self,
        mut pos: I,
        b: &mut DB,
        _: (u32, u32),
    ) -> Result<(), DrawingErrorKind<DB::ErrorType>> {
        let Some((mut x, y)) = pos.next() else {
            return Ok(());
        };
        if let Some(stroke) = self.line {
            let style = self.color.stroke_width(LINE_WIDTH);
            if stroke == Stroke::Dotted {
                let n = (LEGEND_SAMPLE as f64 / DOT_SPACING) as i32;
                for k in 0..=n {
                    let cx = x + (k as f64 * DOT_SPACING).round() as i32;
                    b.draw_rect(
                        (cx, y - DOT / 2),
                        (cx + DOT - 1, y - DOT / 2 + DOT - 1),
                        &self.color.filled(),
                        true,
                    )?;
                }
            } else {
                for (from, to) in pattern_runs(LEGEND_SAMPLE as f64, stroke.pattern()) {
                    let (from, to) = (x + from.round() as i32, x + to.round() as i32);
                    b.draw_line((from, y), (to.max(from + 1), y), &style)?;
                }
            }
            x += LEGEND_SAMPLE / 2;
        }
        let r = MARKER_SIZE;
        let fill = self.color.filled();
        match self.marker {
            Marker::None => Ok(()),
            Marker::Circle => b.draw_circle((x, y), r as u32, &fill, true),
            Marker::Square => b.draw_rect((x - r, y - r), (x + r, y + r), &fill, true),
            Marker::Triangle => {
                let h = r + 1;
                b.fill_polygon([(x, y - h), (x - h, y + h - 1), (x + h, y + h - 1)], &fill)
            }
            Marker::Cross => {
                let st = self.color.stroke_width(2);
                b.draw_line((x - r, y - r), (x + r, y + r), &st)?;
                b.draw_line((x - r, y + r), (x + r, y - r), &st)
            }
        }
    }
}

/// The "on" runs of a dash pattern (on, off, on, ... pixels) along a line `len` pixels long,
/// as (start, end) distances from its start. An empty pattern: one run, the whole line.
pub fn pattern_runs(len: f64, pattern: &[f64]) -> Vec<(f64, f64)> {
    if pattern.is_empty() || pattern.iter().any(|&p| p <= 0.0) {
        return vec![(0.0, len)];
    }
    let mut runs = Vec::new();
    let (mut at, mut i) = (0.0, 0);
    while at < len {
        let end = (at + pattern[i]).min(len);
        if i % 2 == 0 {
            runs.push((at, end));
        }
        at = end;
        i = (i + 1) % pattern.len();
    }
    runs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pattern_runs_repeat_the_pattern_and_stop_at_the_end() {
        assert_eq!(
            pattern_runs(20.0, &[4.0, 2.0]),
            [(0.0, 4.0), (6.0, 10.0), (12.0, 16.0), (18.0, 20.0)]
        );
        assert_eq!(pattern_runs(10.0, &[]), [(0.0, 10.0)]);
        // dash-dot: 7 on, 3 off, 1.5 on, 3 off
        assert_eq!(
            pattern_runs(16.0, &[7.0, 3.0, 1.5, 3.0]),
            [(0.0, 7.0), (10.0, 11.5), (14.5, 16.0)]
        );
        assert_eq!(pattern_runs(0.0, &[4.0, 2.0]), []);
    }
}
