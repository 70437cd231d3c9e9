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

/// Tiny xorshift64*: deterministic, so every implementation sees the same index sequence.
pub struct XorShift(u64);

impl XorShift {
    pub fn new(seed: u64) -> XorShift {
        XorShift(seed | 1)
    }
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    /// Uniform in `0..n` (multiply-shift; bias is negligible for n ≤ 2^32).
    pub fn below(&mut self, n: u32) -> u32 {
        (((self.next() >> 32) * n as u64) >> 32) as u32
    }
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

    #[test]
    fn xorshift_is_uniform_enough_and_in_range() {
        let mut r = XorShift::new(42);
        let mut counts = [0u32; 10];
        for _ in 0..100_000 {
            let x = r.below(10);
            counts[x as usize] += 1;
        }
        for c in counts {
            assert!((9_000..11_000).contains(&c), "{counts:?}");
        }
    }
}
