//! Text as a plotters element: laid out and rasterized with ab_glyph (advances, kerning, each
//! glyph at its own pixel bounds) in the font of `font`, horizontal or turned a quarter left.
//! plotters 0.3.7's own ab_glyph text drops each glyph's left side bearing and rounds its
//! position down, which spaces letters unevenly; so the figures draw every string with this.

use ab_glyph::{point, Font, PxScale, ScaleFont};
use plotters::element::{Drawable, PointCollection};
use plotters::style::{Color, RGBColor};
use plotters_backend::{BackendCoord, DrawingBackend, DrawingErrorKind};

/// Where the anchor point sits on the text's box, along and across the text.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Align {
    Start,
    Center,
    End,
}

/// A string at an anchor point (backend pixels). `size`: the line's height in pixels (ascent
/// plus descent, ab_glyph's `PxScale`). `h`/`v`: which point of the text's box is at the anchor
/// (left/centre/right, top/middle/bottom, before turning). `up`: read bottom to top (a y axis'
/// title).
#[derive(Clone, Debug)]
pub struct Label {
    pub at: BackendCoord,
    pub text: String,
    pub size: f32,
    pub color: RGBColor,
    pub h: Align,
    pub v: Align,
    pub up: bool,
}

impl Label {
    pub fn new(
        at: BackendCoord,
        text: &str,
        size: f32,
        color: RGBColor,
        h: Align,
        v: Align,
    ) -> Self {
        Label {
            at,
            text: text.to_string(),
            size,
            color,
            h,
            v,
            up: false,
        }
    }
}

/// The width (advances and kerning) and height of `text` at `size`; (0, 0) without a font.
pub fn measure(text: &str, size: f32) -> (f32, f32) {
    let Some(font) = crate::font::get() else {
        return (0.0, 0.0);
    };
    let sf = font.as_scaled(PxScale::from(size));
    let mut w = 0.0;
    let mut prev = None;
    for c in text.chars() {
        let id = sf.glyph_id(c);
        if let Some(p) = prev {
            w += sf.kern(p, id);
        }
        w += sf.h_advance(id);
        prev = Some(id);
    }
    (w, sf.height())
}

/// How far the box's start must move for `align` of a length `len` to be at the anchor.
fn shift(align: Align, len: f32) -> f32 {
    match align {
        Align::Start => 0.0,
        Align::Center => -len / 2.0,
        Align::End => -len,
    }
}

impl<'b> PointCollection<'b, BackendCoord> for &'b Label {
    type Point = &'b BackendCoord;
    type IntoIter = std::iter::Once<&'b BackendCoord>;
    fn point_iter(self) -> Self::IntoIter {
        std::iter::once(&self.at)
    }
}

impl<DB: DrawingBackend> Drawable<DB> for Label {
    fn draw<I: Iterator<Item = BackendCoord>>(
        &self,
        mut pos: I,
        backend: &mut DB,
        _: (u32, u32),
    ) -> Result<(), DrawingErrorKind<DB::ErrorType>> {
        let (Some(font), Some((ax, ay))) = (crate::font::get(), pos.next()) else {
            return Ok(());
        };
        let scale = PxScale::from(self.size);
        let sf = font.as_scaled(scale);
        let (w, h) = measure(&self.text, self.size);
        // The text's box, its top left at (0, 0) and the baseline at the ascent, moved so that
        // the anchor falls where `h` and `v` say.
        let (dx, dy) = (shift(self.h, w), shift(self.v, h));
        let mut pixels = Vec::new();
        let mut caret = 0.0;
        let mut prev = None;
        for c in self.text.chars() {
            let id = sf.glyph_id(c);
            if let Some(p) = prev {
                caret += sf.kern(p, id);
            }
            prev = Some(id);
            let glyph = id.with_scale_and_position(scale, point(caret + dx, sf.ascent() + dy));
            caret += sf.h_advance(id);
            if let Some(outline) = font.outline_glyph(glyph) {
                let b = outline.px_bounds();
                let (x0, y0) = (b.min.x as i32, b.min.y as i32);
                outline.draw(|x, y, cover| pixels.push((x0 + x as i32, y0 + y as i32, cover)));
            }
        }
        for (x, y, cover) in pixels {
            let at = if self.up {
                (ax + y, ay - x)
            } else {
                (ax + x, ay + y)
            };
            let color = self
                .color
                .mix(cover.clamp(0.0, 1.0) as f64)
                .to_backend_color();
            backend.draw_pixel(at, color)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use plotters::prelude::*;

    /// The pixels a label darkens on a white canvas: (min x, min y, max x, max y).
    fn ink(l: &Label, size: (u32, u32)) -> Option<(u32, u32, u32, u32)> {
        let mut buf = vec![255u8; (size.0 * size.1 * 3) as usize];
        {
            let root = BitMapBackend::with_buffer(&mut buf, size).into_drawing_area();
            root.draw(l).unwrap();
            root.present().unwrap();
        }
        let mut bb: Option<(u32, u32, u32, u32)> = None;
        for (i, px) in buf.chunks(3).enumerate() {
            if px[0] < 128 {
                let (x, y) = (i as u32 % size.0, i as u32 / size.0);
                bb = Some(match bb {
                    None => (x, y, x, y),
                    Some((a, b, c, d)) => (a.min(x), b.min(y), c.max(x), d.max(y)),
                });
            }
        }
        bb
    }

    #[test]
    fn labels_land_where_their_anchor_says() {
        if let Err(e) = crate::font::load() {
            println!("SKIP: {e}");
            return;
        }
        let (w, h) = measure("Hello", 20.0);
        assert!(w > 30.0 && w < 70.0 && h > 15.0 && h < 30.0, "{w} x {h}");
        let mut l = Label::new((100, 50), "Hello", 20.0, BLACK, Align::Start, Align::Start);
        let (x0, y0, x1, y1) = ink(&l, (200, 100)).unwrap();
        assert!(
            (100..104).contains(&x0) && (50..58).contains(&y0),
            "{x0},{y0}"
        );
        assert!((x1 as f32) < 100.0 + w + 1.0 && y1 < 50 + h as u32);
        // Centred on the anchor.
        l.h = Align::Center;
        l.v = Align::Center;
        let (x0, _, x1, _) = ink(&l, (200, 100)).unwrap();
        assert!(((x0 + x1) as i32 / 2 - 100).abs() <= 2, "{x0}..{x1}");
        // Turned: taller than wide, reading up, centred on the anchor.
        l.up = true;
        let (x0, y0, x1, y1) = ink(&l, (200, 200)).unwrap();
        assert!(y1 - y0 > x1 - x0, "{x0},{y0} {x1},{y1}");
        assert!(((y0 + y1) as i32 / 2 - 50).abs() <= 2, "{y0}..{y1}");
    }
}
