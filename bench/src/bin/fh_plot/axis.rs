//! Axis ranges and ticks, computed here rather than by plotters so that a log axis gets ticks at
//! round values (decades, or 1-2-5 when the data spans less than a few decades) with the values
//! themselves as labels, and every axis is drawn as a linear one in "axis space" (the logarithm
//! of the value on a log axis).

/// How values map onto an axis.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scale {
    Linear,
    /// Decades; labels are the values (20, 0.1, 1e6).
    Log10,
    /// Powers of two; labels are sizes with binary prefixes (8, 4Ki, 1Mi): it is for bytes.
    Log2,
}

impl Scale {
    /// A value's position in axis space.
    pub fn to_axis(self, v: f64) -> f64 {
        match self {
            Scale::Linear => v,
            Scale::Log10 => v.log10(),
            Scale::Log2 => v.log2(),
        }
    }

    /// The value at an axis-space position.
    pub fn value_at(self, t: f64) -> f64 {
        match self {
            Scale::Linear => t,
            Scale::Log10 => 10f64.powf(t),
            Scale::Log2 => t.exp2(),
        }
    }

    /// Whether a value can be placed on this axis (a log axis has no place for 0 or below).
    pub fn accepts(self, v: f64) -> bool {
        v.is_finite() && (self == Scale::Linear || v > 0.0)
    }
}

/// An axis' extent and ticks, all in axis space.
#[derive(Clone, Debug, PartialEq)]
pub struct Ticks {
    pub lo: f64,
    pub hi: f64,
    /// Labelled ticks (and the grid's stronger lines).
    pub major: Vec<(f64, String)>,
    /// Unlabelled grid lines (a log axis' 2..9 multiples).
    pub minor: Vec<f64>,
}

impl Ticks {
    /// The label of the major tick at `t` (plotters hands back the positions it was given).
    pub fn label_at(&self, t: f64) -> String {
        self.major
            .iter()
            .min_by(|a, b| (a.0 - t).abs().total_cmp(&(b.0 - t).abs()))
            .map(|m| m.1.clone())
            .unwrap_or_default()
    }
}

/// The margin on each side, as a share of the data's extent (matplotlib's default).
const MARGIN: f64 = 0.05;
/// About how many labelled ticks a linear axis gets.
const LINEAR_TICKS: f64 = 8.0;

/// Fits an axis to `values` (those the scale cannot place are ignored) with a 5 % margin each
/// side, then picks its ticks. No usable value: 0..1 (linear) or 1..10 (log).
pub fn fit(scale: Scale, values: impl IntoIterator<Item = f64>) -> Ticks {
    let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
    for v in values.into_iter().filter(|&v| scale.accepts(v)) {
        let t = scale.to_axis(v);
        lo = lo.min(t);
        hi = hi.max(t);
    }
    if lo > hi {
        (lo, hi) = match scale {
            Scale::Linear => (0.0, 1.0),
            Scale::Log10 => (0.0, 1.0),
            Scale::Log2 => (0.0, 3.0),
        };
    } else if hi - lo < 1e-9 * lo.abs().max(1.0) {
        // One value: a range around it (a tenth of it, or half a decade / one power of two).
        let half = match scale {
            Scale::Linear if lo != 0.0 => lo.abs() * 0.1,
            Scale::Linear => 1.0,
            Scale::Log10 => 0.5,
            Scale::Log2 => 1.0,
        };
        (lo, hi) = (lo - half, hi + half);
    } else {
        let pad = (hi - lo) * MARGIN;
        (lo, hi) = (lo - pad, hi + pad);
    }
    span(scale, lo, hi)
}

/// The ticks of an axis from `lo` to `hi` (axis space, `lo < hi`).
pub fn span(scale: Scale, lo: f64, hi: f64) -> Ticks {
    let (major, minor) = match scale {
        Scale::Linear => (linear_ticks(lo, hi), Vec::new()),
        Scale::Log10 => log10_ticks(lo, hi),
        Scale::Log2 => log2_ticks(lo, hi),
    };
    Ticks {
        lo,
        hi,
        major,
        minor,
    }
}

/// The step of about `LINEAR_TICKS` ticks over `span`: 1, 2, 2.5 or 5 times a power of ten.
fn nice_step(span: f64) -> f64 {
    let raw = span / LINEAR_TICKS;
    let mag = 10f64.powf(raw.log10().floor());
    let m = [1.0, 2.0, 2.5, 5.0, 10.0]
        .into_iter()
        .find(|&m| m * mag >= raw * (1.0 - 1e-9))
        .unwrap_or(10.0);
    m * mag
}

/// How many decimals print every multiple of `step` exactly.
fn decimals(step: f64) -> usize {
    (0..12)
        .find(|&d| {
            let s = step * 10f64.powi(d as i32);
            (s - s.round()).abs() < 1e-6 * s.max(1.0)
        })
        .unwrap_or(12)
}

/// A number printed with `d` decimals, never as "-0".
fn fixed(v: f64, d: usize) -> String {
    let s = format!("{v:.d$}");
    if s.trim_start_matches('-')
        .chars()
        .all(|c| c == '0' || c == '.')
    {
        s.trim_start_matches('-').to_string()
    } else {
        s
    }
}

/// Linear ticks at multiples of a round step.
fn linear_ticks(lo: f64, hi: f64) -> Vec<(f64, String)> {
    let step = nice_step(hi - lo);
    let d = decimals(step);
    let first = (lo / step - 1e-9).ceil() as i64;
    let last = (hi / step + 1e-9).floor() as i64;
    (first..=last)
        .map(|k| {
            let v = k as f64 * step;
            (v, fixed(v, d))
        })
        .collect()
}

/// `m` times ten to the `k`, printed plainly (20, 0.05) unless very large or small (2e7).
fn decade_label(m: u32, k: i32) -> String {
    match k {
        0..=5 => (m as u64 * 10u64.pow(k as u32)).to_string(),
        -4..=-1 => fixed(m as f64 * 10f64.powi(k), (-k) as usize),
        _ => format!("{m}e{k}"),
    }
}

/// Log10 ticks: decades when there are at least three in range, else 1-2-5, else every 1..9
/// multiple, else round values in value space. The multiples not labelled are minor lines.
fn log10_ticks(lo: f64, hi: f64) -> (Vec<(f64, String)>, Vec<f64>) {
    let (k0, k1) = (lo.floor() as i32, hi.ceil() as i32);
    let at = |m: u32, k: i32| (m as f64).log10() + k as f64;
    let in_range = |t: f64| t >= lo - 1e-9 && t <= hi + 1e-9;
    let all: Vec<(u32, i32)> = (k0..=k1)
        .flat_map(|k| (1..=9).map(move |m| (m, k)))
        .filter(|&(m, k)| in_range(at(m, k)))
        .collect();
    for labelled in [&[1u32][..], &[1, 2, 5], &[1, 2, 3, 4, 5, 6, 7, 8, 9]] {
        let mut major: Vec<(u32, i32)> = all
            .iter()
            .copied()
            .filter(|(m, _)| labelled.contains(m))
            .collect();
        if major.len() < 3 && labelled.len() < 9 {
            continue;
        }
        if major.len() < 2 {
            break;
        }
        if labelled.len() == 1 && major.len() > 10 {
            // Many decades: label every n-th, keep the others as grid lines.
            let n = major.len().div_ceil(8) as i32;
            major.retain(|&(_, k)| k.rem_euclid(n) == 0);
        }
        let minor = all
            .iter()
            .filter(|p| !major.contains(p))
            .map(|&(m, k)| at(m, k))
            .collect();
        let major = major
            .into_iter()
            .map(|(m, k)| (at(m, k), decade_label(m, k)))
            .collect();
        return (major, minor);
    }
    (value_ticks(Scale::Log10, lo, hi), Vec::new())
}

/// `2^p` with a binary prefix: 8, 512, 4Ki, 1Mi; below 1, the plain value.
fn pow2_label(p: i32) -> String {
    match p {
        0..=9 => (1u64 << p).to_string(),
        10..=19 => format!("{}Ki", 1u64 << (p - 10)),
        20..=29 => format!("{}Mi", 1u64 << (p - 20)),
        30..=39 => format!("{}Gi", 1u64 << (p - 30)),
        40..=62 => format!("{}Ti", 1u64 << (p - 40)),
        _ => format!("{}", (p as f64).exp2()),
    }
}

/// Log2 ticks: every power of two in range, labelled every n-th so that about nine are; the
/// rest are minor lines. Fewer than two powers in range: round values in value space.
fn log2_ticks(lo: f64, hi: f64) -> (Vec<(f64, String)>, Vec<f64>) {
    let powers: Vec<i32> = ((lo - 1e-9).ceil() as i32..=(hi + 1e-9).floor() as i32).collect();
    if powers.len() < 2 {
        return (value_ticks(Scale::Log2, lo, hi), Vec::new());
    }
    let n = powers.len().div_ceil(9) as i32;
    let (major, minor): (Vec<i32>, Vec<i32>) =
        powers.into_iter().partition(|p| p.rem_euclid(n) == 0);
    (
        major
            .into_iter()
            .map(|p| (p as f64, pow2_label(p)))
            .collect(),
        minor.into_iter().map(|p| p as f64).collect(),
    )
}

/// Round values (linear ticks of the values) placed on a log axis whose range is too narrow
/// for its own ticks.
fn value_ticks(scale: Scale, lo: f64, hi: f64) -> Vec<(f64, String)> {
    linear_ticks(scale.value_at(lo), scale.value_at(hi))
        .into_iter()
        .filter(|(v, _)| *v > 0.0)
        .map(|(v, s)| (scale.to_axis(v), s))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(t: &Ticks) -> Vec<&str> {
        t.major.iter().map(|m| m.1.as_str()).collect()
    }

    #[test]
    fn linear_axis_has_round_ticks_and_a_margin() {
        // fig3's x axis: working sets of 256..6144 KiB and the markers at 1024 and 1536.
        let t = fit(Scale::Linear, [256.0, 1024.0, 1536.0, 6144.0]);
        assert!((t.lo - (256.0 - 0.05 * 5888.0)).abs() < 1e-9);
        assert!((t.hi - (6144.0 + 0.05 * 5888.0)).abs() < 1e-9);
        assert_eq!(
            labels(&t),
            ["0", "1000", "2000", "3000", "4000", "5000", "6000"]
        );
        assert!(t.minor.is_empty());
        for (v, _) in &t.major {
            assert!(*v >= t.lo && *v <= t.hi);
        }
    }

    #[test]
    fn linear_labels_print_fractional_steps_exactly() {
        let t = fit(Scale::Linear, [0.0, 1.7]);
        assert_eq!(
            labels(&t),
            ["0.00", "0.25", "0.50", "0.75", "1.00", "1.25", "1.50", "1.75"]
        );
        let t = fit(Scale::Linear, [-0.3, 0.3]);
        assert_eq!(
            labels(&t),
            ["-0.3", "-0.2", "-0.1", "0.0", "0.1", "0.2", "0.3"]
        );
    }

    #[test]
    fn log10_axis_uses_decades_when_it_spans_three() {
        // fig5's y axis: 0.05 .. 50 MB/s.
        let t = fit(Scale::Log10, [0.052, 0.27, 11.0, 50.0]);
        assert_eq!(labels(&t), ["0.1", "1", "10"]);
        // 2..9 times each decade in range are grid lines.
        assert!(t.minor.contains(&(5.0f64.log10() - 2.0))); // 0.05
        assert!(t.minor.contains(&(2.0f64.log10() + 1.0))); // 20
        assert!(!t.minor.contains(&0.0));
        for m in &t.minor {
            assert!(*m >= t.lo && *m <= t.hi);
        }
    }

    #[test]
    fn log10_axis_spanning_under_three_decades_labels_1_2_5() {
        // fig3's y axis: 25 .. 600 us (21 .. 700 with the margins).
        let t = fit(Scale::Log10, [25.0, 31.0, 120.0, 600.0]);
        assert_eq!(labels(&t), ["50", "100", "200", "500"]);
        assert!(t.minor.contains(&300f64.log10()));
        assert!(t.minor.contains(&30f64.log10()));
        assert!((t.major[1].0 - 2.0).abs() < 1e-12);
    }

    #[test]
    fn log10_axis_narrower_than_a_factor_of_three_still_gets_ticks() {
        let t = fit(Scale::Log10, [101.0, 119.0]);
        assert!(t.major.len() >= 2, "{t:?}");
        for (v, _) in &t.major {
            assert!(*v >= t.lo && *v <= t.hi);
        }
    }

    #[test]
    fn log_axes_ignore_values_they_cannot_place() {
        let t = fit(Scale::Log10, [0.0, -3.0, f64::NAN, 10.0, 1000.0]);
        assert_eq!(labels(&t), ["10", "100", "1000"]);
    }

    #[test]
    fn log2_axis_labels_sizes_with_binary_prefixes() {
        // fig5's x axis: 8 B .. 1 MiB.
        let t = fit(Scale::Log2, [8.0, 64.0, 4096.0, 1048576.0]);
        assert_eq!(
            labels(&t),
            ["16", "64", "256", "1Ki", "4Ki", "16Ki", "64Ki", "256Ki", "1Mi"]
        );
        assert!(t.minor.contains(&3.0)); // 8: a grid line
        assert_eq!(t.major.len() + t.minor.len(), 18);
    }

    #[test]
    fn degenerate_ranges_are_widened() {
        let t = fit(Scale::Linear, [5.0, 5.0]);
        assert!(t.lo < 5.0 && t.hi > 5.0 && !t.major.is_empty());
        let t = fit(Scale::Linear, std::iter::empty());
        assert_eq!((t.lo, t.hi), (0.0, 1.0));
        let t = fit(Scale::Log10, [7.0]);
        assert!(t.lo < 7f64.log10() && t.hi > 7f64.log10() && t.major.len() >= 2);
        let t = fit(Scale::Log2, [4096.0]);
        assert!(t.major.len() >= 2);
    }

    #[test]
    fn label_at_finds_the_nearest_major_tick() {
        let t = fit(Scale::Log10, [25.0, 600.0]);
        assert_eq!(t.label_at(100f64.log10()), "100");
        assert_eq!(t.label_at(100f64.log10() + 1e-12), "100");
    }
}
