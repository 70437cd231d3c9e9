//! Latency samples summarised the way perftest's latency tests report them: min, max, typical
//! (the median), mean, standard deviation, 99th and 99.9th percentile.

#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct Summary {
    pub min: f64,
    pub max: f64,
    pub typical: f64,
    pub avg: f64,
    pub stdev: f64,
    pub p99: f64,
    pub p999: f64,
}

impl Summary {
    /// Summary of `v` (any unit; the result is in the same unit). Empty input gives zeros.
    pub fn of(v: &[f64]) -> Summary {
        if v.is_empty() {
            return Summary::default();
        }
        let mut s = v.to_vec();
        s.sort_by(f64::total_cmp);
        let n = s.len() as f64;
        let avg = s.iter().sum::<f64>() / n;
        let var = s.iter().map(|x| (x - avg) * (x - avg)).sum::<f64>() / n;
        // Nearest-rank percentiles: a value that was actually measured.
        let pct = |p: f64| s[(((p * n).ceil() as usize).max(1) - 1).min(s.len() - 1)];
        Summary {
            min: s[0],
            max: s[s.len() - 1],
            typical: pct(0.5),
            avg,
            stdev: var.sqrt(),
            p99: pct(0.99),
            p999: pct(0.999),
        }
    }

    /// Every value multiplied by `k` (e.g. RTT -> RTT/2).
    #[allow(dead_code)] // wake_floor includes this file and has no RTT/2
    pub fn scaled(&self, k: f64) -> Summary {
        Summary {
            min: self.min * k,
            max: self.max * k,
            typical: self.typical * k,
            avg: self.avg * k,
            stdev: self.stdev * k,
            p99: self.p99 * k,
            p999: self.p999 * k,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_measured_values() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        let s = Summary::of(&v);
        assert_eq!(
            (s.min, s.max, s.typical, s.p99, s.p999),
            (1.0, 100.0, 50.0, 99.0, 100.0)
        );
        assert!((s.avg - 50.5).abs() < 1e-9);
        assert_eq!(Summary::of(&[3.0]).p99, 3.0);
        assert_eq!(Summary::of(&v).scaled(0.5).typical, 25.0);
    }
}
