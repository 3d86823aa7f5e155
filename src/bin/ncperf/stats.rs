//! Latency samples and the figures taken from them: nearest-rank percentiles, the mean,
//! and a cumulative distribution thinned for charts; medians and spreads over rounds.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Latency samples in nanoseconds.
#[derive(Debug, Default, Clone)]
pub struct Samples {
    ns: Vec<u64>,
    sorted: bool,
}

impl Samples {
    /// Room for `n` samples.
    pub fn with_capacity(n: usize) -> Samples {
        Samples {
            ns: Vec::with_capacity(n),
            sorted: true,
        }
    }

    /// Adds one sample.
    pub fn push(&mut self, d: Duration) {
        self.ns
            .push(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
        self.sorted = false;
    }

    /// How many samples are held.
    pub fn len(&self) -> usize {
        self.ns.len()
    }

    fn sort(&mut self) {
        if !self.sorted {
            self.ns.sort_unstable();
            self.sorted = true;
        }
    }

    /// The `q` quantile (`0.0..=1.0`) by nearest rank, in microseconds: the smallest
    /// sample that at least a fraction `q` of the samples do not exceed (rank
    /// `ceil(q × n)`, at least 1). `None` when there is no sample.
    pub fn quantile_us(&mut self, q: f64) -> Option<f64> {
        if self.ns.is_empty() {
            return None;
        }
        self.sort();
        let n = self.ns.len();
        Some(self.ns[rank(q, n) - 1] as f64 / 1e3)
    }

    /// The mean in microseconds; `None` when there is no sample.
    pub fn mean_us(&self) -> Option<f64> {
        if self.ns.is_empty() {
            return None;
        }
        let sum: u128 = self.ns.iter().map(|&v| u128::from(v)).sum();
        Some(sum as f64 / self.ns.len() as f64 / 1e3)
    }

    /// The cumulative distribution as `[latency µs, fraction of samples at or below it]`
    /// points: every 1/`points` of the samples up to the 99th percentile, then every
    /// sample rank of the tail that adds a decade of nines (99.9, 99.99, …) and the
    /// maximum, so that a chart shows the tail without holding every sample.
    pub fn cdf(&mut self, points: usize) -> Vec<[f64; 2]> {
        if self.ns.is_empty() {
            return Vec::new();
        }
        self.sort();
        let n = self.ns.len();
        let points = points.max(2);
        let mut ranks: Vec<usize> = (1..=points).map(|i| (i * n).div_ceil(points)).collect();
        // Finer steps through the tail: ranks at 99 %, 99.5 %, 99.9 %, 99.95 %, ….
        let mut tail = 0.01;
        while tail * n as f64 >= 1.0 {
            for f in [1.0, 0.5] {
                ranks.push(rank(1.0 - tail * f, n));
            }
            tail /= 10.0;
        }
        ranks.push(n);
        ranks.sort_unstable();
        ranks.dedup();
        ranks
            .into_iter()
            .map(|r| [self.ns[r - 1] as f64 / 1e3, r as f64 / n as f64])
            .collect()
    }

    /// The summary of the samples (percentiles, mean, maximum, the thinned CDF).
    pub fn summary(&mut self) -> Option<Latency> {
        Some(Latency {
            samples: self.len() as u64,
            p50_us: self.quantile_us(0.5)?,
            p99_us: self.quantile_us(0.99)?,
            p999_us: self.quantile_us(0.999)?,
            mean_us: self.mean_us()?,
            max_us: self.quantile_us(1.0)?,
            cdf: self.cdf(100),
        })
    }
}

/// The nearest rank of quantile `q` among `n > 0` samples: `ceil(q × n)`, at least 1 (a
/// hair is taken off the product so that `0.99 × 1000` computed as 990.000…01 stays 990).
fn rank(q: f64, n: usize) -> usize {
    ((q.clamp(0.0, 1.0) * n as f64 - 1e-9).ceil() as usize).clamp(1, n)
}

/// A latency distribution's figures, in microseconds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Latency {
    /// Samples taken.
    pub samples: u64,
    /// Median.
    pub p50_us: f64,
    /// 99th percentile.
    pub p99_us: f64,
    /// 99.9th percentile.
    pub p999_us: f64,
    /// Mean.
    pub mean_us: f64,
    /// The slowest sample.
    pub max_us: f64,
    /// `[latency µs, cumulative fraction]` points ([`Samples::cdf`]).
    pub cdf: Vec<[f64; 2]>,
}

/// The median of `xs` (the mean of the two middle values for an even count); `None`
/// when empty. NaNs sort last.
pub fn median(xs: &[f64]) -> Option<f64> {
    if xs.is_empty() {
        return None;
    }
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    let m = v.len() / 2;
    Some(if v.len() % 2 == 1 {
        v[m]
    } else {
        (v[m - 1] + v[m]) / 2.0
    })
}

/// Smallest and largest of `xs`; `None` when empty.
pub fn min_max(xs: &[f64]) -> Option<(f64, f64)> {
    let mut it = xs.iter().copied();
    let first = it.next()?;
    Some(it.fold((first, first), |(lo, hi), x| (lo.min(x), hi.max(x))))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn samples_us(values: &[u64]) -> Samples {
        let mut s = Samples::with_capacity(values.len());
        for &v in values {
            s.push(Duration::from_micros(v));
        }
        s
    }

    #[test]
    fn nearest_rank_percentiles_of_one_to_a_thousand() {
        // Shuffled: the order of arrival must not matter.
        let mut v: Vec<u64> = (1..=1000).collect();
        v.reverse();
        v.swap(3, 700);
        let mut s = samples_us(&v);
        assert_eq!(s.quantile_us(0.5), Some(500.0));
        assert_eq!(s.quantile_us(0.99), Some(990.0));
        assert_eq!(s.quantile_us(0.999), Some(999.0));
        assert_eq!(s.quantile_us(1.0), Some(1000.0));
        assert_eq!(s.quantile_us(0.0), Some(1.0));
        assert_eq!(s.mean_us(), Some(500.5));
    }

    #[test]
    fn a_percentile_between_ranks_takes_the_higher_sample() {
        // 10 samples: p99 is rank ceil(9.9) = 10, p50 rank 5, p55 rank ceil(5.5) = 6.
        let mut s = samples_us(&[10, 20, 30, 40, 50, 60, 70, 80, 90, 100]);
        assert_eq!(s.quantile_us(0.99), Some(100.0));
        assert_eq!(s.quantile_us(0.5), Some(50.0));
        assert_eq!(s.quantile_us(0.55), Some(60.0));
        // One sample is every percentile.
        let mut one = samples_us(&[7]);
        assert_eq!(one.quantile_us(0.001), Some(7.0));
        assert_eq!(one.quantile_us(0.999), Some(7.0));
    }

    #[test]
    fn no_samples_no_figures() {
        let mut s = Samples::default();
        assert_eq!(s.quantile_us(0.5), None);
        assert_eq!(s.mean_us(), None);
        assert!(s.summary().is_none());
        assert!(s.cdf(10).is_empty());
    }

    #[test]
    fn cdf_is_monotonic_ends_at_the_maximum_and_reaches_into_the_tail() {
        let v: Vec<u64> = (1..=100_000).collect();
        let mut s = samples_us(&v);
        let cdf = s.cdf(50);
        assert!(cdf
            .windows(2)
            .all(|w| w[0][0] <= w[1][0] && w[0][1] < w[1][1]));
        assert_eq!(*cdf.last().unwrap(), [100_000.0, 1.0]);
        // The tail points: 99.9 % and 99.99 % are there, not only the 1/50 steps.
        assert!(cdf.iter().any(|p| p[1] == 0.999 && p[0] == 99_900.0));
        assert!(cdf.iter().any(|p| p[1] == 0.9999 && p[0] == 99_990.0));
        assert!(cdf.len() < 80, "{} points", cdf.len());
    }

    #[test]
    fn summary_takes_every_figure_from_the_same_samples() {
        let v: Vec<u64> = (1..=2000).collect();
        let l = samples_us(&v).summary().unwrap();
        assert_eq!(l.samples, 2000);
        assert_eq!((l.p50_us, l.p99_us, l.p999_us), (1000.0, 1980.0, 1998.0));
        assert_eq!(l.max_us, 2000.0);
        assert_eq!(l.mean_us, 1000.5);
    }

    #[test]
    fn medians_and_spreads() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median(&[]), None);
        assert_eq!(min_max(&[2.0, -1.0, 5.0]), Some((-1.0, 5.0)));
        assert_eq!(min_max(&[]), None);
    }
}
