//! The live view's percentile sketch: a DDSketch-style log-bucketed histogram of durations
//! with relative accuracy α (the error bound is stated and tested in `mod.rs`), and a request's
//! [`GapSketch`] of inter-token gaps built on it.

use std::time::Duration;

use super::Percentiles;

/// The sketch's relative accuracy α.
pub(crate) const RELATIVE_ACCURACY: f64 = 0.01;
/// ln γ with γ = (1+α)/(1−α), correctly rounded; a test checks it against α.
pub(super) const LN_GAMMA: f64 = 0.020_000_666_706_669_525;
/// The smallest and largest durations (seconds) the sketch tells apart; see the module doc.
pub(super) const MIN_SECS: f64 = 1e-6;
pub(super) const MAX_SECS: f64 = 1e5;
/// `key(MIN_SECS)` and `key(MAX_SECS)`; a test checks them.
pub(crate) const MIN_KEY: i32 = -690;
pub(super) const MAX_KEY: i32 = 576;
/// How many buckets a sketch can ever hold.
pub(super) const N_KEYS: usize = (MAX_KEY - MIN_KEY + 1) as usize;
/// Buckets added beyond the needed range when a sketch grows, so that growth is rare.
pub(super) const GROWTH_SLACK: i32 = 32;

// ---------------------------------------------------------------------------------------------
// The sketch

/// The bucket of a positive duration in seconds: `⌈ln v / ln γ⌉`, clamped to the kept range.
pub(super) fn key(secs: f64) -> i32 {
    let clamped = secs.clamp(MIN_SECS, MAX_SECS);
    let x = clamped.ln() / LN_GAMMA;
    // ⌈x⌉ without libm's `ceil` (a call per gap: x86-64's baseline has no rounding
    // instruction): x is within ±700 by the clamp, so the cast truncates it exactly, towards
    // zero, and one step up makes the ceiling of a non-integer.
    let truncated = x as i32;
    let k = if f64::from(truncated) < x {
        truncated + 1
    } else {
        truncated
    };
    k.clamp(MIN_KEY, MAX_KEY)
}

/// The value reported for bucket `k`, which holds `(γ^(k−1), γ^k]`: `(1−α)·γ^k`, within α
/// of every value in the bucket (`2γ^k/(γ+1)` simplified).
pub(crate) fn bucket_value(k: i32) -> f64 {
    (1.0 - RELATIVE_ACCURACY) * (f64::from(k) * LN_GAMMA).exp()
}

/// A log-bucketed relative-error sketch of durations (DDSketch), stored compactly: one `u32`
/// count per bucket over the contiguous range of buckets seen so far, plus a count of zeros.
/// Its storage never holds more than [`N_KEYS`] counts.
#[derive(Debug, Clone, Default)]
pub(crate) struct Sketch {
    pub(crate) zeros: u32,
    /// The key of `counts[0]`.
    pub(crate) first_key: i32,
    pub(crate) counts: Vec<u32>,
}

impl Sketch {
    // The rings add buckets found once per request (`ring::Bucket`); this stays for tests and
    // for other users of the sketch.
    #[cfg_attr(not(test), allow(dead_code))]
    pub(super) fn add(&mut self, d: Duration) {
        self.add_secs(d.as_secs_f64());
    }

    /// [`Sketch::add`] of a duration already in seconds (not negative).
    #[inline]
    pub(crate) fn add_secs(&mut self, secs: f64) {
        if secs == 0.0 {
            self.add_zeros(1);
        } else {
            self.add_key(key(secs), 1);
        }
    }

    pub(super) fn add_zeros(&mut self, n: u32) {
        self.zeros = self.zeros.saturating_add(n);
    }

    #[inline]
    pub(super) fn add_key(&mut self, k: i32, n: u32) {
        self.cover(k, k);
        // In range: `cover` just made it so.
        let i = (k - self.first_key) as usize;
        if let Some(c) = self.counts.get_mut(i) {
            *c = c.saturating_add(n);
        }
    }

    #[cfg(test)]
    pub(super) fn is_empty(&self) -> bool {
        self.zeros == 0 && self.counts.iter().all(|c| *c == 0)
    }

    pub(super) fn last_key(&self) -> i32 {
        self.first_key + self.counts.len() as i32 - 1
    }

    /// Grows the stored range to cover keys `lo..=hi`, with some slack, never past the kept
    /// range, and never to a capacity above [`N_KEYS`]. Inline: most keys fall in the range
    /// already stored, and then it is one comparison, not a call.
    #[inline]
    pub(super) fn cover(&mut self, lo: i32, hi: i32) {
        if !self.counts.is_empty() && lo >= self.first_key && hi <= self.last_key() {
            return;
        }
        self.grow(lo, hi);
    }

    /// [`Sketch::cover`]'s growing, out of the line of the common case.
    #[cold]
    #[inline(never)]
    fn grow(&mut self, lo: i32, hi: i32) {
        if self.counts.is_empty() {
            let (new_lo, new_hi) = (
                (lo - GROWTH_SLACK).max(MIN_KEY),
                (hi + GROWTH_SLACK).min(MAX_KEY),
            );
            let len = (new_hi - new_lo + 1) as usize;
            self.first_key = new_lo;
            if self.counts.capacity() < len {
                self.counts = Vec::with_capacity(len);
            }
            self.counts.resize(len, 0);
            return;
        }
        let (old_lo, old_hi) = (self.first_key, self.last_key());
        let new_lo = if lo < old_lo {
            (lo - GROWTH_SLACK).max(MIN_KEY)
        } else {
            old_lo
        };
        let new_hi = if hi > old_hi {
            (hi + GROWTH_SLACK).min(MAX_KEY)
        } else {
            old_hi
        };
        let len = (new_hi - new_lo + 1) as usize;
        let shift = (old_lo - new_lo) as usize;
        self.first_key = new_lo;
        if len <= self.counts.capacity() {
            let old_len = self.counts.len();
            self.counts.resize(len, 0);
            if shift > 0 {
                self.counts.copy_within(0..old_len, shift);
                self.counts[..shift].fill(0);
            }
        } else {
            // An exact allocation, not `Vec`'s doubling, so capacity stays within N_KEYS.
            let mut grown = Vec::with_capacity(len);
            grown.resize(shift, 0);
            grown.extend_from_slice(&self.counts);
            grown.resize(len, 0);
            self.counts = grown;
        }
    }

    /// Adds everything `other` holds.
    pub(crate) fn merge(&mut self, other: &Sketch) {
        self.add_zeros(other.zeros);
        let Some(lo) = other.counts.iter().position(|c| *c > 0) else {
            return;
        };
        let hi = other.counts.iter().rposition(|c| *c > 0).unwrap_or(lo);
        let (lo_key, hi_key) = (other.first_key + lo as i32, other.first_key + hi as i32);
        self.cover(lo_key, hi_key);
        let offset = (lo_key - self.first_key) as usize;
        for (mine, theirs) in self.counts[offset..].iter_mut().zip(&other.counts[lo..=hi]) {
            *mine = mine.saturating_add(*theirs);
        }
    }

    /// Empties the sketch but keeps its storage, so a reused slot does not allocate again.
    pub(super) fn clear(&mut self) {
        self.zeros = 0;
        self.counts.clear();
    }

    #[cfg(test)]
    /// The bytes this sketch holds on the heap.
    pub(super) fn heap_bytes(&self) -> usize {
        self.counts.capacity() * std::mem::size_of::<u32>()
    }
}

/// Sketches merged for one query, with `u64` counts over the whole key range (an hour of a
/// busy route can exceed `u32` in one bucket).
#[derive(Debug, Clone, Default)]
pub(crate) struct Merged {
    pub(crate) zeros: u64,
    /// Indexed by `key − MIN_KEY`; empty until something non-empty is merged.
    pub(crate) counts: Vec<u64>,
    pub(crate) total: u64,
}

impl Merged {
    pub(crate) fn add(&mut self, s: &Sketch) {
        self.zeros += u64::from(s.zeros);
        self.total += u64::from(s.zeros);
        if s.counts.iter().all(|c| *c == 0) {
            return;
        }
        if self.counts.is_empty() {
            self.counts = vec![0; N_KEYS];
        }
        let offset = (s.first_key - MIN_KEY) as usize;
        for (mine, theirs) in self.counts[offset..].iter_mut().zip(&s.counts) {
            *mine += u64::from(*theirs);
            self.total += u64::from(*theirs);
        }
    }

    /// The value (seconds) of the sample at 0-based rank `r` in sorted order, within α.
    pub(crate) fn at_rank(&self, r: u64) -> f64 {
        if r < self.zeros {
            return 0.0;
        }
        let mut seen = self.zeros;
        let mut last = MIN_KEY;
        for (i, c) in self.counts.iter().enumerate() {
            if *c == 0 {
                continue;
            }
            last = MIN_KEY + i as i32;
            seen += c;
            if r < seen {
                return bucket_value(last);
            }
        }
        bucket_value(last)
    }

    /// The p-quantile (seconds) by numpy's linear interpolation between the two order
    /// statistics it blends, each read from its bucket; `None` without samples.
    pub(crate) fn quantile(&self, p: f64) -> Option<f64> {
        if self.total == 0 {
            return None;
        }
        let h = p.clamp(0.0, 1.0) * (self.total - 1) as f64;
        let lo = h.floor();
        let (v_lo, v_hi) = (self.at_rank(lo as u64), self.at_rank(h.ceil() as u64));
        Some(v_lo + (h - lo) * (v_hi - v_lo))
    }

    pub(super) fn percentiles_ms(&self) -> Option<Percentiles> {
        let ms = |p| self.quantile(p).map(|s| s * 1e3);
        Some(Percentiles {
            p50: ms(0.50)?,
            p95: ms(0.95)?,
            p99: ms(0.99)?,
        })
    }
}

/// One request's inter-token gaps, collected by its recorder without any lock and merged into
/// the live view once, when the request finishes. `add` computes one logarithm and only
/// allocates when the gaps reach a range of buckets not seen before in this request.
#[derive(Debug, Clone, Default)]
pub(crate) struct GapSketch(pub(super) Sketch);

impl GapSketch {
    /// One gap between two consecutive output-bearing events (zero for events handed to the
    /// client in the same frame).
    #[cfg(test)]
    pub(crate) fn add(&mut self, gap: Duration) {
        self.0.add(gap);
    }

    /// [`GapSketch::add`] of a gap already in seconds, as the recorder has it for its ITL
    /// histogram too.
    #[inline]
    pub(crate) fn add_secs(&mut self, gap: f64) {
        self.0.add_secs(gap);
    }
}

// ---------------------------------------------------------------------------------------------
// Slots and rings
