//! The report's figures, at the bottom of its imports: how a value is rounded and written, a
//! distribution's p50/p95/p99 ([`Spread`]), and the bounded sketch a distribution is gathered in
//! while the records stream past ([`Quantiles`]).
//!
//! [`Quantiles`] is the live view's DDSketch (`crate::sketch`), so a report's percentile
//! and the live view's agree by construction: every quantile it answers is within the sketch's
//! relative accuracy α ([`RELATIVE_ACCURACY`], 1 %) of the exact one (numpy's linear
//! interpolation between the two order statistics it blends, each read within α), and its size
//! never depends on how many values went in: at most one `u32` count per bucket of the kept range
//! (a few KiB), however many records are read.

use serde::Serialize;

use crate::sketch::{bucket_value, Merged, Sketch, MIN_KEY};

pub(crate) use crate::sketch::RELATIVE_ACCURACY;

/// The sketch keeps durations in seconds from 1e-6 to 1e5; a value `v` (milliseconds, tokens, a
/// share) is kept as `v × SCALE` "seconds", so values from 0.001 to 10^8 are told apart within
/// α: a microsecond to a day of milliseconds, a token to a hundred million. Zero is kept exactly;
/// a positive value below 0.001 reads as 0.001.
const SCALE: f64 = 1e-3;

/// To the thousandth (a microsecond, for milliseconds): what records hold, without the float
/// noise that interpolation adds to the JSON.
pub fn round(value: f64) -> f64 {
    (value * 1000.0).round() / 1000.0
}

/// Milliseconds, to a precision that reads: 6743 ms, 27.0 ms, 0.35 ms.
pub fn ms(value: f64) -> String {
    if value.abs() >= 100.0 {
        format!("{value:.0} ms")
    } else if value.abs() >= 1.0 {
        format!("{value:.1} ms")
    } else {
        format!("{value:.2} ms")
    }
}

/// p50, p95 and p99, `None` when nothing was measured.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Spread {
    pub p50: Option<f64>,
    pub p95: Option<f64>,
    pub p99: Option<f64>,
}

/// A distribution of non-negative values, gathered in bounded memory; see the module doc for
/// its accuracy. Negative or non-finite values (a hand-edited cell) are not counted.
#[derive(Clone, Debug, Default)]
pub struct Quantiles(Sketch);

impl Quantiles {
    #[inline]
    pub fn add(&mut self, value: f64) {
        if value.is_finite() && value >= 0.0 {
            self.0.add_secs(value * SCALE);
        }
    }

    pub fn merge(&mut self, other: &Quantiles) {
        self.0.merge(&other.0);
    }

    /// The sketch's counts over the whole key range, for queries.
    fn merged(&self) -> Merged {
        let mut merged = Merged::default();
        merged.add(&self.0);
        merged
    }

    /// How many values went in.
    pub fn count(&self) -> u64 {
        u64::from(self.0.zeros) + self.0.counts.iter().map(|&c| u64::from(c)).sum::<u64>()
    }

    /// The `p`-quantile (0 to 1), within α; `None` when empty.
    pub fn quantile(&self, p: f64) -> Option<f64> {
        self.merged().quantile(p).map(|v| v / SCALE)
    }

    /// p50, p95 and p99, rounded to the thousandth.
    pub fn spread(&self) -> Spread {
        let merged = self.merged();
        let at = |p| merged.quantile(p).map(|v| round(v / SCALE));
        Spread {
            p50: at(0.50),
            p95: at(0.95),
            p99: at(0.99),
        }
    }

    /// The counts in ascending order of value, one per bucket that holds any: `(value, count)`,
    /// the value within α of every value the bucket holds; zeros first as `(0, n)`.
    pub fn buckets(&self) -> Vec<(f64, u64)> {
        let mut out = Vec::new();
        if self.0.zeros > 0 {
            out.push((0.0, u64::from(self.0.zeros)));
        }
        for (i, &c) in self.0.counts.iter().enumerate() {
            if c > 0 {
                out.push((
                    bucket_value(self.0.first_key + i as i32) / SCALE,
                    u64::from(c),
                ));
            }
        }
        out
    }

    /// The counts by bucket index: 0 for zeros, then one slot per key of the kept range, so that
    /// two sketches' slots line up. Empty when nothing went in.
    pub fn slots(&self) -> Vec<u64> {
        let merged = self.merged();
        if merged.total == 0 {
            return Vec::new();
        }
        let mut slots = Vec::with_capacity(merged.counts.len() + 1);
        slots.push(merged.zeros);
        slots.extend_from_slice(&merged.counts);
        slots
    }

    /// The value a slot of [`Quantiles::slots`] stands for.
    pub fn slot_value(slot: usize) -> f64 {
        match slot {
            0 => 0.0,
            s => bucket_value(MIN_KEY + s as i32 - 1) / SCALE,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// numpy's linear interpolation over sorted values.
    fn exact(sorted: &[f64], p: f64) -> f64 {
        let h = p * (sorted.len() - 1) as f64;
        let lo = h.floor() as usize;
        let hi = h.ceil() as usize;
        sorted[lo] + (h - lo as f64) * (sorted[hi] - sorted[lo])
    }

    #[test]
    fn quantiles_are_within_the_stated_relative_error_over_the_report_ranges() {
        // Skewed draws from a thousandth of `scale` up: milliseconds from a microsecond to a
        // day, token counts to 10^6.
        let mut rng = fastrand::Rng::with_seed(38);
        for scale in [1.0, 1_000.0, 60_000_000.0, 1_000_000.0] {
            let mut q = Quantiles::default();
            let mut values: Vec<f64> = (0..5_000)
                .map(|_| scale * (0.1 + rng.f64()).powi(3))
                .collect();
            values.iter().for_each(|&v| q.add(v));
            values.sort_by(f64::total_cmp);
            assert_eq!(q.count(), 5_000);
            for p in [0.0, 0.5, 0.95, 0.99, 1.0] {
                let (want, got) = (exact(&values, p), q.quantile(p).expect("a value"));
                assert!(
                    (got - want).abs() <= RELATIVE_ACCURACY * want * 1.000_001,
                    "scale {scale}, p{p}: {got} against {want}"
                );
            }
        }
    }

    #[test]
    fn zeros_negatives_and_merging() {
        let mut a = Quantiles::default();
        [0.0, 0.0, -5.0, f64::NAN, 10.0]
            .iter()
            .for_each(|&v| a.add(v));
        assert_eq!(a.count(), 3, "a negative or NaN value is not counted");
        assert_eq!(a.quantile(0.0), Some(0.0));
        let mut b = Quantiles::default();
        b.add(1000.0);
        a.merge(&b);
        assert_eq!(a.count(), 4);
        let top = a.quantile(1.0).unwrap();
        assert!((top - 1000.0).abs() <= 10.0, "{top}");
        let buckets = a.buckets();
        assert_eq!(buckets.first(), Some(&(0.0, 2)));
        assert_eq!(buckets.iter().map(|b| b.1).sum::<u64>(), 4);
        let slots = a.slots();
        let top_slot = slots.iter().rposition(|&c| c > 0).unwrap();
        assert!((Quantiles::slot_value(top_slot) - 1000.0).abs() <= 10.0);
        assert_eq!(Quantiles::default().spread(), Spread::default());
    }
}
