//! Statistics of benchmark samples, computed the way the seed papers report them: many
//! iterations, the mean of the middle 80 % (`avg80`: the lowest and the highest 10 % are
//! dropped), plus median and 99th percentile (from an HDR histogram of nanoseconds, 3
//! significant digits), minimum and maximum.

use hdrhistogram::Histogram;

/// Summary of a set of time samples, in nanoseconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Summary {
    /// Number of samples.
    pub count: usize,
    /// Smallest sample.
    pub min: f64,
    /// Largest sample.
    pub max: f64,
    /// Median (HDR histogram, 3 significant digits).
    pub median: f64,
    /// 99th percentile (HDR histogram, 3 significant digits).
    pub p99: f64,
    /// Mean of the middle 80 %.
    pub avg80: f64,
}

/// Mean of the middle 80 % of `sorted` (ascending): `n / 10` samples are dropped at each
/// end. `None` when empty.
pub fn avg80(sorted: &[f64]) -> Option<f64> {
    let n = sorted.len();
    if n == 0 {
        return None;
    }
    let cut = n / 10;
    let mid = &sorted[cut..n - cut];
    Some(mid.iter().sum::<f64>() / mid.len() as f64)
}

/// Median of `sorted` (ascending), interpolating between the two middle samples of an
/// even count. `None` when empty.
pub fn median_sorted(sorted: &[f64]) -> Option<f64> {
    let n = sorted.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(sorted[n / 2]),
        _ => Some((sorted[n / 2 - 1] + sorted[n / 2]) / 2.0),
    }
}

/// Sorts samples ascending (NaN last).
pub fn sort(samples: &mut [f64]) {
    samples.sort_unstable_by(f64::total_cmp);
}

impl Summary {
    /// Summarizes time samples in nanoseconds; `None` when there are none or the histogram
    /// cannot be built.
    pub fn of_nanos(mut samples: Vec<f64>) -> Option<Summary> {
        if samples.is_empty() {
            return None;
        }
        sort(&mut samples);
        let mut hist = Histogram::<u64>::new(3).ok()?;
        for &v in &samples {
            // Negative or NaN samples cannot occur for durations; clamp defensively.
            let ns = if v.is_finite() && v > 0.0 {
                v.round() as u64
            } else {
                0
            };
            hist.record(ns).ok()?;
        }
        Some(Summary {
            count: samples.len(),
            min: samples[0],
            max: samples[samples.len() - 1],
            median: hist.value_at_quantile(0.5) as f64,
            p99: hist.value_at_quantile(0.99) as f64,
            avg80: avg80(&samples)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn avg80_drops_ten_percent_each_side() {
        let v: Vec<f64> = (1..=10).map(f64::from).collect();
        assert_eq!(avg80(&v), Some(5.5)); // 2..=9
        let mut v: Vec<f64> = vec![100.0; 18];
        v.insert(0, 1.0); // outlier low
        v.push(1e9); // outlier high
        assert_eq!(avg80(&v), Some(100.0));
        // Fewer than 10 samples: nothing dropped.
        assert_eq!(avg80(&[1.0, 2.0, 6.0]), Some(3.0));
        assert_eq!(avg80(&[]), None);
    }

    #[test]
    fn median_exact() {
        assert_eq!(median_sorted(&[1.0, 2.0, 9.0]), Some(2.0));
        assert_eq!(median_sorted(&[1.0, 2.0, 4.0, 9.0]), Some(3.0));
        assert_eq!(median_sorted(&[]), None);
    }

    #[test]
    fn summary_of_known_data() {
        // 1..=1000 ns shuffled deterministically.
        let mut v: Vec<f64> = (1..=1000).map(f64::from).collect();
        v.reverse();
        v.swap(3, 700);
        let s = Summary::of_nanos(v).unwrap();
        assert_eq!(s.count, 1000);
        assert_eq!(s.min, 1.0);
        assert_eq!(s.max, 1000.0);
        assert!((s.median - 500.0).abs() <= 1.0, "median {}", s.median);
        assert!((s.p99 - 990.0).abs() <= 1.0, "p99 {}", s.p99);
        assert!((s.avg80 - 500.5).abs() < 1e-9, "avg80 {}", s.avg80); // 101..=900
    }

    #[test]
    fn summary_large_values_keep_three_digits() {
        let v = vec![2_000_000.0; 99].into_iter().chain([5e9]).collect();
        let s = Summary::of_nanos(v).unwrap();
        assert!((s.median - 2e6).abs() / 2e6 < 1e-3);
        assert_eq!(s.max, 5e9);
        assert!(Summary::of_nanos(Vec::new()).is_none());
    }
}
