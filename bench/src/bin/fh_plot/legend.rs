//! Where a panel's legend goes: the corner its lines leave freest and, when none is free, how
//! far the y axis must grow for the legend to fit above them. All in the plot's fractions (0..1,
//! y up) or axis space, no pixels.

use crate::axis::Ticks;

/// The legend's corners, in the order they are preferred.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Corner {
    UpperRight,
    UpperLeft,
    LowerLeft,
    LowerRight,
}

/// The corner for a legend box of `size` (fractions of the plot) that covers the fewest of the
/// polylines' points (normalized, y up; each segment sampled along its length), and how many it
/// covers; on a tie the first of upper right, upper left, lower left, lower right.
pub fn best_corner(lines: &[Vec<(f64, f64)>], size: (f64, f64)) -> (Corner, usize) {
    const STEPS: usize = 24;
    let mut samples = Vec::new();
    for l in lines {
        samples.extend(l.iter().copied());
        for w in l.windows(2) {
            let ((x0, y0), (x1, y1)) = (w[0], w[1]);
            for k in 1..STEPS {
                let f = k as f64 / STEPS as f64;
                samples.push((x0 + (x1 - x0) * f, y0 + (y1 - y0) * f));
            }
        }
    }
    let (w, h) = size;
    let corners = [
        (Corner::UpperRight, 1.0 - w, 1.0, 1.0 - h, 1.0),
        (Corner::UpperLeft, 0.0, w, 1.0 - h, 1.0),
        (Corner::LowerLeft, 0.0, w, 0.0, h),
        (Corner::LowerRight, 1.0 - w, 1.0, 0.0, h),
    ];
    let covered = |&(_, x0, x1, y0, y1): &(Corner, f64, f64, f64, f64)| {
        samples
            .iter()
            .filter(|(x, y)| *x >= x0 && *x <= x1 && *y >= y0 && *y <= y1)
            .count()
    };
    let mut best = 0;
    let mut best_n = usize::MAX;
    for (i, c) in corners.iter().enumerate() {
        let n = covered(c);
        if n < best_n {
            (best, best_n) = (i, n);
        }
    }
    (corners[best].0, best_n)
}

/// The top of a y axis from `lo` that leaves the top `share` of the plot (a legend's height)
/// clear of the data, which reaches `data_top`; never below the present top `hi`.
pub fn headroom(lo: f64, hi: f64, data_top: f64, share: f64) -> f64 {
    let room = (1.0 - share - 0.02).max(0.1);
    (lo + (data_top - lo) / room).max(hi)
}

/// A point's place in the plot as fractions of its width and height, y up.
pub fn normalize((x, y): (f64, f64), xt: &Ticks, yt: &Ticks) -> (f64, f64) {
    ((x - xt.lo) / (xt.hi - xt.lo), (y - yt.lo) / (yt.hi - yt.lo))
}

/// What the legend must not cover, normalized to the plot: the lines and the vertical lines.
pub fn obstacles(
    lines: &[Vec<(f64, f64)>],
    vlines: &[f64],
    xt: &Ticks,
    yt: &Ticks,
) -> Vec<Vec<(f64, f64)>> {
    let mut marks: Vec<Vec<(f64, f64)>> = lines
        .iter()
        .map(|l| l.iter().map(|&q| normalize(q, xt, yt)).collect())
        .collect();
    for &x in vlines {
        let x = normalize((x, yt.lo), xt, yt).0;
        marks.push(vec![(x, 0.0), (x, 1.0)]);
    }
    marks
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pos((c, _): (Corner, usize)) -> &'static str {
        match c {
            Corner::UpperRight => "upper right",
            Corner::UpperLeft => "upper left",
            Corner::LowerLeft => "lower left",
            Corner::LowerRight => "lower right",
        }
    }

    #[test]
    fn headroom_puts_the_data_below_the_legend() {
        // Data up to 9.5 on 0..10; a legend a quarter of the plot high.
        let hi = headroom(0.0, 10.0, 9.5, 0.25);
        assert!((9.5 / hi - 0.73).abs() < 1e-9, "{hi}");
        // A legend so low that the data already fits under it: the axis stays.
        assert_eq!(headroom(0.0, 10.0, 5.0, 0.25), 10.0);
        // Log axes are linear in axis space: the same from any lo.
        let hi = headroom(1.0, 3.0, 2.9, 0.5);
        assert!(((2.9 - 1.0) / (hi - 1.0) - 0.48).abs() < 1e-9, "{hi}");
    }

    #[test]
    fn legend_goes_where_the_data_is_not() {
        let rising = vec![vec![(0.0, 0.0), (1.0, 1.0)]];
        // A rising line crosses the lower-left and upper-right corners.
        assert_eq!(pos(best_corner(&rising, (0.3, 0.2))), "upper left");
        let falling = vec![vec![(0.0, 1.0), (1.0, 0.0)]];
        assert_eq!(pos(best_corner(&falling, (0.3, 0.2))), "upper right");
        // Everything high: below it.
        let high = vec![vec![(0.0, 0.9), (1.0, 0.95)]];
        assert_eq!(pos(best_corner(&high, (0.3, 0.2))), "lower left");
        // Nothing: the first choice.
        assert_eq!(best_corner(&[], (0.3, 0.2)), (Corner::UpperRight, 0));
        // Every corner crossed: the one crossed least, and by how much.
        let x = vec![
            vec![(0.0, 0.0), (1.0, 1.0)],
            vec![(0.0, 1.0), (1.0, 0.0)],
            vec![(0.9, 0.9), (0.95, 0.95)],
        ];
        let (c, n) = best_corner(&x, (0.3, 0.2));
        assert_eq!(c, Corner::UpperLeft);
        assert!(n > 0);
    }

    #[test]
    fn a_segment_through_a_corner_counts_even_without_a_point_in_it() {
        // Points only at the ends, outside the upper-right box; the segment crosses it.
        let l = vec![vec![(0.5, 1.0), (1.0, 0.5)], vec![(0.0, 0.9), (0.05, 0.9)]];
        assert_eq!(pos(best_corner(&l, (0.3, 0.3))), "lower left");
    }
}
