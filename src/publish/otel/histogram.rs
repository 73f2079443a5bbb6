//! Histogram aggregation for OTLP: base-2 exponential (the default) or explicit boundaries.
//!
//! The exponential one follows the OpenTelemetry SDK specification: at most [`MAX_BUCKETS`]
//! buckets, starting at scale [`MAX_SCALE`] and halving its resolution (scale − 1) whenever a
//! new value would need more; bucket `i` at scale `s` holds `(2^(i/2^s), 2^((i+1)/2^s)]`.
//! Values are durations and counts, never negative; zero goes to the zero bucket.

use opentelemetry_proto::tonic::metrics::v1::{
    exponential_histogram_data_point::Buckets, ExponentialHistogramDataPoint, HistogramDataPoint,
};

/// The SDK specification's defaults.
pub(crate) const MAX_BUCKETS: usize = 160;
pub(crate) const MAX_SCALE: i32 = 20;
const MIN_SCALE: i32 = -10;

#[derive(Debug, Clone)]
pub(crate) enum Histogram {
    Exponential(Exponential),
    Explicit(Explicit),
}

#[derive(Debug, Clone, Default)]
struct Stats {
    count: u64,
    sum: f64,
    min: f64,
    max: f64,
}

impl Stats {
    fn add(&mut self, v: f64) {
        if self.count == 0 {
            self.min = v;
            self.max = v;
        } else {
            self.min = self.min.min(v);
            self.max = self.max.max(v);
        }
        self.count += 1;
        self.sum += v;
    }
}

#[derive(Debug, Clone)]
pub(crate) struct Exponential {
    stats: Stats,
    scale: i32,
    zero_count: u64,
    /// The index of `counts[0]`.
    offset: i64,
    counts: Vec<u64>,
}

#[derive(Debug, Clone)]
pub(crate) struct Explicit {
    stats: Stats,
    bounds: &'static [f64],
    /// One more than `bounds`: the last is `(last bound, +Inf)`.
    counts: Vec<u64>,
}

impl Histogram {
    pub(crate) fn exponential() -> Self {
        Histogram::Exponential(Exponential {
            stats: Stats::default(),
            scale: MAX_SCALE,
            zero_count: 0,
            offset: 0,
            counts: Vec::new(),
        })
    }

    pub(crate) fn explicit(bounds: &'static [f64]) -> Self {
        Histogram::Explicit(Explicit {
            stats: Stats::default(),
            bounds,
            counts: vec![0; bounds.len() + 1],
        })
    }

    pub(crate) fn record(&mut self, v: f64) {
        // A NaN or a negative value cannot come from a clock or a counter; never aggregated.
        if v.is_nan() || v < 0.0 || v.is_infinite() {
            return;
        }
        match self {
            Histogram::Exponential(h) => h.record(v),
            Histogram::Explicit(h) => {
                h.stats.add(v);
                let i = h.bounds.partition_point(|b| *b < v);
                h.counts[i] += 1;
            }
        }
    }

    pub(crate) fn count(&self) -> u64 {
        match self {
            Histogram::Exponential(h) => h.stats.count,
            Histogram::Explicit(h) => h.stats.count,
        }
    }
}

/// The bucket index of `v > 0` at `scale`: `ceil(log2(v) · 2^scale) − 1`.
fn index(v: f64, scale: i32) -> i64 {
    (v.log2() * 2f64.powi(scale)).ceil() as i64 - 1
}

impl Exponential {
    fn record(&mut self, v: f64) {
        self.stats.add(v);
        if v == 0.0 {
            self.zero_count += 1;
            return;
        }
        let mut i = index(v, self.scale);
        if self.counts.is_empty() {
            self.offset = i;
            self.counts.push(1);
            return;
        }
        let low = self.offset.min(i);
        let high = (self.offset + self.counts.len() as i64 - 1).max(i);
        // Fewer, wider buckets until the range fits: each step down halves the index.
        let mut change = 0;
        while ((high >> change) - (low >> change) + 1) as usize > MAX_BUCKETS
            && self.scale - change > MIN_SCALE
        {
            change += 1;
        }
        if change > 0 {
            self.downscale(change);
            i >>= change;
        }
        if i < self.offset {
            let grow = (self.offset - i) as usize;
            self.counts.splice(0..0, std::iter::repeat_n(0, grow));
            self.offset = i;
        }
        let at = (i - self.offset) as usize;
        if at >= self.counts.len() {
            self.counts.resize(at + 1, 0);
        }
        self.counts[at] += 1;
    }

    fn downscale(&mut self, change: i32) {
        let new_offset = self.offset >> change;
        let mut merged: Vec<u64> = Vec::new();
        for (k, c) in self.counts.iter().enumerate() {
            let at = (((self.offset + k as i64) >> change) - new_offset) as usize;
            if at >= merged.len() {
                merged.resize(at + 1, 0);
            }
            merged[at] += c;
        }
        self.offset = new_offset;
        self.counts = merged;
        self.scale -= change;
    }
}

impl Histogram {
    /// The cumulative point for export as an exponential histogram (`None` if explicit).
    pub(crate) fn exponential_point(
        &self,
        attributes: Vec<opentelemetry_proto::tonic::common::v1::KeyValue>,
        start: u64,
        now: u64,
    ) -> Option<ExponentialHistogramDataPoint> {
        let Histogram::Exponential(h) = self else {
            return None;
        };
        Some(ExponentialHistogramDataPoint {
            attributes,
            start_time_unix_nano: start,
            time_unix_nano: now,
            count: h.stats.count,
            sum: Some(h.stats.sum),
            scale: h.scale,
            zero_count: h.zero_count,
            positive: Some(Buckets {
                offset: h.offset as i32,
                bucket_counts: h.counts.clone(),
            }),
            negative: Some(Buckets::default()),
            min: (h.stats.count > 0).then_some(h.stats.min),
            max: (h.stats.count > 0).then_some(h.stats.max),
            ..Default::default()
        })
    }

    /// The cumulative point for export as an explicit histogram (`None` if exponential).
    pub(crate) fn explicit_point(
        &self,
        attributes: Vec<opentelemetry_proto::tonic::common::v1::KeyValue>,
        start: u64,
        now: u64,
    ) -> Option<HistogramDataPoint> {
        let Histogram::Explicit(h) = self else {
            return None;
        };
        Some(HistogramDataPoint {
            attributes,
            start_time_unix_nano: start,
            time_unix_nano: now,
            count: h.stats.count,
            sum: Some(h.stats.sum),
            bucket_counts: h.counts.clone(),
            explicit_bounds: h.bounds.to_vec(),
            min: (h.stats.count > 0).then_some(h.stats.min),
            max: (h.stats.count > 0).then_some(h.stats.max),
            ..Default::default()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bucket_of(h: &Exponential, v: f64) -> bool {
        let base = 2f64.powf(2f64.powi(-h.scale));
        h.counts.iter().enumerate().any(|(k, c)| {
            let i = h.offset + k as i64;
            *c > 0
                && base.powi(i as i32) < v * (1.0 + 1e-9)
                && v <= base.powi(i as i32 + 1) * (1.0 + 1e-9)
        })
    }

    #[test]
    fn a_wide_range_stays_within_the_bucket_limit_and_every_value_is_in_its_bucket() {
        let mut h = Histogram::exponential();
        let values: Vec<f64> = (0..2000).map(|k| 1e-4 * 1.01f64.powi(k)).collect();
        for v in &values {
            h.record(*v);
        }
        h.record(0.0);
        let Histogram::Exponential(e) = &h else {
            unreachable!()
        };
        assert!(e.counts.len() <= MAX_BUCKETS, "{}", e.counts.len());
        assert!(e.scale < MAX_SCALE);
        assert_eq!(e.counts.iter().sum::<u64>() + e.zero_count, 2001);
        assert_eq!(e.stats.count, 2001);
        let sum: f64 = values.iter().sum();
        assert!((e.stats.sum - sum).abs() < 1e-9 * sum);
        for v in [values[0], values[999], values[1999]] {
            assert!(bucket_of(e, v), "{v} at scale {}", e.scale);
        }
    }

    #[test]
    fn explicit_buckets_are_upper_inclusive() {
        let mut h = Histogram::explicit(&[1.0, 2.0]);
        for v in [0.5, 1.0, 1.5, 2.0, 3.0] {
            h.record(v);
        }
        let p = h.explicit_point(vec![], 0, 0).unwrap();
        assert_eq!(p.bucket_counts, vec![2, 2, 1]);
        assert_eq!(p.count, 5);
    }
}
