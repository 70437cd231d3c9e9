//! Reducing per-batch timings to the numbers in a row.

/// Mean, p50 and p99 of per-op latencies (ns), one sample per batch.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Summary {
    pub mean: f64,
    pub p50: f64,
    pub p99: f64,
}

/// `batches` are per-op nanoseconds, one per batch (all batches the same size, so the mean of
/// batch means is the per-op mean).
pub fn summarize(batches: &[f64]) -> Summary {
    if batches.is_empty() {
        return Summary {
            mean: f64::NAN,
            p50: f64::NAN,
            p99: f64::NAN,
        };
    }
    let mut v = batches.to_vec();
    v.sort_by(f64::total_cmp);
    Summary {
        mean: v.iter().sum::<f64>() / v.len() as f64,
        p50: percentile(&v, 0.50),
        p99: percentile(&v, 0.99),
    }
}

/// Nearest-rank percentile of sorted data.
fn percentile(sorted: &[f64], q: f64) -> f64 {
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_of_known_data() {
        let v: Vec<f64> = (1..=100).map(|x| x as f64).collect();
        let s = summarize(&v);
        assert_eq!(s.mean, 50.5);
        assert_eq!(s.p50, 50.0);
        assert_eq!(s.p99, 99.0);
        let one = summarize(&[7.0]);
        assert_eq!((one.mean, one.p50, one.p99), (7.0, 7.0, 7.0));
        assert!(summarize(&[]).mean.is_nan());
    }
}
