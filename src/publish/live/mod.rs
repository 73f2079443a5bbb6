//! The live view's numbers: per route, over the last minute, five minutes and hour, the request
//! and token rates, outcomes, TTFT/TPOT/ITL/E2E percentiles, goodput and SLO attainment that the
//! admin listener serves as `/stats` and draws on `/`.
//!
//! Every finished request is added once ([`LiveStats::record`], one short lock) to the current
//! slot of two rings of time slots on tokio's clock: 30 slots of 10 s (for 1 m and 5 m) and 60
//! slots of 60 s (for 1 h). A window merges the slots it covers: the current, partly elapsed slot
//! and the ones before it, so "1m" covers between 50 and 60 s, "5m" between 290 and 300 s and
//! "1h" between 59 and 60 min, and less while the process is younger than that. Rates divide by
//! the time actually covered (`seconds`), never by the nominal window. A request counts in the
//! slot where it *finished*: a long stream's tokens all land at its end.
//!
//! Exact samples over an hour are unbounded (ITL alone is one sample per token), so durations
//! go into a sketch: a DDSketch-style log-bucketed histogram with relative accuracy
//! α = 1 %. Its error bound, tested against numpy's linear interpolation over the exact samples:
//! for a p-quantile, numpy blends the order statistics `x_lo ≤ x_hi` at ranks `⌊p(n−1)⌋` and
//! `⌈p(n−1)⌉`; the sketch returns `q̂` with `x_lo·(1−α) ≤ q̂ ≤ x_hi·(1+α)`. This holds for zero
//! (counted exactly; ITL gaps between events of one frame are zero) and for every duration from
//! 1 µs to 10⁵ s (27.8 h). A nonzero duration below 1 µs is counted as 1 µs (under the page's
//! three-decimal millisecond resolution) and one above 10⁵ s as 10⁵ s.
//!
//! Which requests feed which number, as `docs/MEASUREMENT.md` has it for the histograms: every
//! finished request that has the figure, whatever its outcome (no TTFT without output, no TPOT
//! for N ≤ 1). ITL percentiles are event-weighted over every gap in the window. Goodput counts
//! good requests and their output tokens; attainment is good / (good + violated), `null` when
//! the route has no SLO or nothing was judged; violations are counted per failed criterion.
//!
//! Memory is bounded whatever the traffic: at most [`MAX_ROUTES`] routes are kept (a route
//! silent for an hour gives its place to a new one; requests on routes past the limit are only
//! counted as `untracked_requests`), each with 90 slots of four sketches whose counts can span
//! at most 1267 buckets of 4 bytes (`u32`, saturating: far beyond any server in one slot):
//! [`WORST_CASE_BYTES_PER_ROUTE`], 1.76 MiB, so 56 MiB if all 32 routes saw every duration from
//! 1 µs to 27 h in every slot. Real traffic spans a few hundred buckets per sketch, a few hundred
//! KiB per busy route. A request's [`GapSketch`] is the same sketch: at most 5 KiB, typically a
//! few hundred bytes.
//!
//! `/stats` is one JSON object:
//!
//! ```text
//! {"generated_at": "2025-01-01T12:00:00.000Z",   wall clock, RFC 3339, UTC
//!  "uptime_seconds": 3723.5,
//!  "windows": ["1m", "5m", "1h"],
//!  "percentile_relative_error": 0.01,              α above
//!  "untracked_requests": 0,                        requests on routes past MAX_ROUTES
//!  "routes": [{
//!    "route": "chat", "objective": 0.99 | null, "in_flight": 3,
//!    "windows": {"1m": {
//!        "seconds": 60.0,                          time covered, the divisor of every rate
//!        "requests": 1200, "requests_per_second": 20.0,
//!        "input_tokens_per_second": 900.0 | null,  null: no request reported prompt tokens
//!        "output_tokens_per_second": 4000.0,
//!        "outcomes": {"ok": n, "error": n, "client_error": n, "cancelled": n},
//!        "ttft_ms": {"p50": .., "p95": .., "p99": ..} | null,   null: no sample
//!        "tpot_ms": .., "itl_ms": .., "e2e_ms": ..,
//!        "good": n, "violated": n,
//!        "goodput_requests_per_second": .., "goodput_output_tokens_per_second": ..,
//!        "attainment": 0.995 | null, "meets_objective": true | null,
//!        "violations": {"ttft": n, "tpot": n, "e2e": n, "max_itl": n, "error": n}},
//!      "5m": {...}, "1h": {...}}}]}
//! ```

use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use serde::Serialize;
use tokio::time::Instant;

mod ring;
pub(crate) mod sketch;

use crate::policy::outcome::Outcome;
use crate::policy::slo::Verdict;
use ring::*;
pub(crate) use sketch::GapSketch;
use sketch::*;

/// The page served on `/`: it fetches `/stats` every 2 s and draws one table per route.
pub const PAGE: &str = include_str!("page.html");

/// The most routes kept; see the module doc.
pub(crate) const MAX_ROUTES: usize = 32;

/// One finished request, as the live view needs it.
pub(crate) struct Sample<'a> {
    pub(crate) outcome: Outcome,
    /// `None`: the route has no SLO.
    pub(crate) verdict: Option<&'a Verdict>,
    pub(crate) prompt_tokens: Option<u64>,
    pub(crate) output_tokens: u64,
    pub(crate) ttft: Option<Duration>,
    pub(crate) tpot: Option<Duration>,
    pub(crate) e2e: Duration,
    pub(crate) itl: &'a GapSketch,
}

/// A route to show, as the current configuration and gauges have it.
#[derive(Debug, Clone)]
pub(crate) struct RouteView {
    pub(crate) name: String,
    pub(crate) objective: Option<f64>,
    pub(crate) in_flight: i64,
}

#[derive(Debug, Default)]
struct Inner {
    routes: Vec<RouteRings>,
    untracked: u64,
}

/// The live view's store: lives as long as the process, across configuration reloads.
#[derive(Debug)]
pub(crate) struct LiveStats {
    started: Instant,
    inner: Mutex<Inner>,
}

impl Default for LiveStats {
    fn default() -> Self {
        LiveStats::new()
    }
}

impl LiveStats {
    pub(crate) fn new() -> Self {
        LiveStats {
            started: Instant::now(),
            inner: Mutex::new(Inner::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // The data stays consistent even if a holder panicked: every update is a few additions.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// One finished request; called once per request from the recorder's single finish.
    pub(crate) fn record(&self, now: Instant, route: &str, sample: &Sample<'_>) {
        let elapsed = now.saturating_duration_since(self.started);
        let short_n = elapsed.as_secs() / SHORT_SLOT_SECS;
        let long_n = elapsed.as_secs() / LONG_SLOT_SECS;
        let mut inner = self.lock();
        let i = match inner.routes.iter().position(|r| &*r.name == route) {
            Some(i) => i,
            None if inner.routes.len() < MAX_ROUTES => {
                inner.routes.push(RouteRings::new(route));
                inner.routes.len() - 1
            }
            None => match inner
                .routes
                .iter()
                .position(|r| !r.seen_within_hour(long_n))
            {
                Some(i) => {
                    // Everything it held has expired; its rings are reused as they are.
                    inner.routes[i].name = route.into();
                    i
                }
                None => {
                    inner.untracked += 1;
                    return;
                }
            },
        };
        let rings = &mut inner.routes[i];
        rings.last_long_slot = rings.last_long_slot.max(long_n);
        if let Some(t) = rings.short.tally(short_n) {
            t.add(sample);
        }
        if let Some(t) = rings.long.tally(long_n) {
            t.add(sample);
        }
    }

    /// Everything `/stats` shows, for `routes` (configured ones even without traffic) plus any
    /// other route seen in the last hour.
    pub(crate) fn snapshot(&self, now: Instant, routes: &[RouteView]) -> Snapshot {
        let elapsed = now.saturating_duration_since(self.started);
        let long_n = elapsed.as_secs() / LONG_SLOT_SECS;
        let mut views: Vec<RouteView> = routes.to_vec();
        let untracked = {
            let inner = self.lock();
            for r in &inner.routes {
                if r.seen_within_hour(long_n) && !views.iter().any(|v| v.name == *r.name) {
                    views.push(RouteView {
                        name: r.name.to_string(),
                        objective: None,
                        in_flight: 0,
                    });
                }
            }
            inner.untracked
        };
        let empty_short = Ring::new(SHORT_SLOT_SECS, 0);
        let empty_long = Ring::new(LONG_SLOT_SECS, 0);
        let routes = views
            .into_iter()
            .map(|view| {
                // One route at a time, so recorders wait at most one route's merge.
                let inner = self.lock();
                let rings = inner.routes.iter().find(|r| *r.name == *view.name);
                let window = |(_, id, k): (&str, RingId, u64)| {
                    let ring = match (rings, id) {
                        (Some(r), id) => r.ring(id),
                        (None, RingId::Short) => &empty_short,
                        (None, RingId::Long) => &empty_long,
                    };
                    let cur = ring.number(elapsed);
                    let seconds = ring.covered(elapsed, k).as_secs_f64();
                    Window::merge(ring.window(cur, k)).stats(seconds, view.objective)
                };
                let [one_minute, five_minutes, one_hour] = WINDOWS.map(window);
                RouteSnapshot {
                    route: view.name,
                    objective: view.objective,
                    in_flight: view.in_flight,
                    windows: Windows {
                        one_minute,
                        five_minutes,
                        one_hour,
                    },
                }
            })
            .collect();
        Snapshot {
            generated_at: humantime::format_rfc3339_millis(SystemTime::now()).to_string(),
            uptime_seconds: elapsed.as_secs_f64(),
            windows: WINDOWS.map(|(name, _, _)| name),
            percentile_relative_error: RELATIVE_ACCURACY,
            untracked_requests: untracked,
            routes,
        }
    }

    #[cfg(test)]
    /// The bytes the store holds now (rings and sketches), for tests and diagnostics.
    pub(crate) fn bytes_held(&self) -> usize {
        let inner = self.lock();
        inner
            .routes
            .iter()
            .map(|r| std::mem::size_of::<RouteRings>() + r.short.heap_bytes() + r.long.heap_bytes())
            .sum()
    }
}

/// The slots of one window, merged.
#[derive(Default)]
struct Window {
    requests: u64,
    outcomes: [u64; 4],
    prompt_tokens: u64,
    prompt_known: u64,
    output_tokens: u64,
    good: u64,
    violated: u64,
    good_output_tokens: u64,
    violations: [u64; 5],
    ttft: Merged,
    tpot: Merged,
    itl: Merged,
    e2e: Merged,
}

impl Window {
    fn merge<'a>(tallies: impl Iterator<Item = &'a Tally>) -> Window {
        let mut w = Window::default();
        for t in tallies {
            w.requests += t.requests;
            for (a, b) in w.outcomes.iter_mut().zip(t.outcomes) {
                *a += b;
            }
            w.prompt_tokens = w.prompt_tokens.saturating_add(t.prompt_tokens);
            w.prompt_known += t.prompt_known;
            w.output_tokens = w.output_tokens.saturating_add(t.output_tokens);
            w.good += t.good;
            w.violated += t.violated;
            w.good_output_tokens = w.good_output_tokens.saturating_add(t.good_output_tokens);
            for (a, b) in w.violations.iter_mut().zip(t.violations) {
                *a += b;
            }
            w.ttft.add(&t.ttft);
            w.tpot.add(&t.tpot);
            w.itl.add(&t.itl);
            w.e2e.add(&t.e2e);
        }
        w
    }

    fn stats(&self, seconds: f64, objective: Option<f64>) -> WindowStats {
        let rate = |n: u64| {
            if seconds > 0.0 {
                n as f64 / seconds
            } else {
                0.0
            }
        };
        let judged = self.good + self.violated;
        let attainment = (judged > 0).then(|| self.good as f64 / judged as f64);
        let [ok, error, client_error, cancelled] = self.outcomes;
        let [ttft, tpot, e2e, max_itl, error_v] = self.violations;
        WindowStats {
            seconds,
            requests: self.requests,
            requests_per_second: rate(self.requests),
            input_tokens_per_second: (self.prompt_known > 0).then(|| rate(self.prompt_tokens)),
            output_tokens_per_second: rate(self.output_tokens),
            outcomes: Outcomes {
                ok,
                error,
                client_error,
                cancelled,
            },
            ttft_ms: self.ttft.percentiles_ms(),
            tpot_ms: self.tpot.percentiles_ms(),
            itl_ms: self.itl.percentiles_ms(),
            e2e_ms: self.e2e.percentiles_ms(),
            good: self.good,
            violated: self.violated,
            goodput_requests_per_second: rate(self.good),
            goodput_output_tokens_per_second: rate(self.good_output_tokens),
            attainment,
            meets_objective: attainment.zip(objective).map(|(a, o)| a >= o),
            violations: Violations {
                ttft,
                tpot,
                e2e,
                max_itl,
                error: error_v,
            },
        }
    }
}

/// `/stats`; the module doc shows its shape.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Snapshot {
    pub(crate) generated_at: String,
    pub(crate) uptime_seconds: f64,
    pub(crate) windows: [&'static str; 3],
    pub(crate) percentile_relative_error: f64,
    pub(crate) untracked_requests: u64,
    pub(crate) routes: Vec<RouteSnapshot>,
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct RouteSnapshot {
    pub(crate) route: String,
    pub(crate) objective: Option<f64>,
    pub(crate) in_flight: i64,
    pub(crate) windows: Windows,
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct Windows {
    #[serde(rename = "1m")]
    pub(crate) one_minute: WindowStats,
    #[serde(rename = "5m")]
    pub(crate) five_minutes: WindowStats,
    #[serde(rename = "1h")]
    pub(crate) one_hour: WindowStats,
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct WindowStats {
    pub(crate) seconds: f64,
    pub(crate) requests: u64,
    pub(crate) requests_per_second: f64,
    pub(crate) input_tokens_per_second: Option<f64>,
    pub(crate) output_tokens_per_second: f64,
    pub(crate) outcomes: Outcomes,
    pub(crate) ttft_ms: Option<Percentiles>,
    pub(crate) tpot_ms: Option<Percentiles>,
    pub(crate) itl_ms: Option<Percentiles>,
    pub(crate) e2e_ms: Option<Percentiles>,
    pub(crate) good: u64,
    pub(crate) violated: u64,
    pub(crate) goodput_requests_per_second: f64,
    pub(crate) goodput_output_tokens_per_second: f64,
    pub(crate) attainment: Option<f64>,
    pub(crate) meets_objective: Option<bool>,
    pub(crate) violations: Violations,
}

#[derive(Debug, Clone, Copy, Serialize)]
pub(crate) struct Outcomes {
    pub(crate) ok: u64,
    pub(crate) error: u64,
    pub(crate) client_error: u64,
    pub(crate) cancelled: u64,
}

#[derive(Debug, Clone, Copy, Serialize)]
pub(crate) struct Percentiles {
    pub(crate) p50: f64,
    pub(crate) p95: f64,
    pub(crate) p99: f64,
}

#[derive(Debug, Clone, Copy, Serialize)]
pub(crate) struct Violations {
    pub(crate) ttft: u64,
    pub(crate) tpot: u64,
    pub(crate) e2e: u64,
    pub(crate) max_itl: u64,
    pub(crate) error: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::slo::Criterion;
    use proptest::prelude::*;

    const ALPHA: f64 = RELATIVE_ACCURACY;

    /// numpy's default percentile: linear interpolation between the order statistics at
    /// `⌊h⌋` and `⌈h⌉`, `h = p(n−1)`; also returns those two.
    fn numpy_percentile(sorted: &[f64], p: f64) -> (f64, f64, f64) {
        let h = p * (sorted.len() - 1) as f64;
        let (lo, hi) = (sorted[h.floor() as usize], sorted[h.ceil() as usize]);
        (lo + (h - h.floor()) * (hi - lo), lo, hi)
    }

    /// Builds a sketch from samples (seconds) the way the rings do, and checks the stated bound
    /// for `ps`. The tolerance covers float rounding of `ln` at a bucket's edge only.
    fn check_bound(samples: &[f64], ps: &[f64]) -> Result<(), TestCaseError> {
        let mut s = Sketch::default();
        for v in samples {
            s.add(Duration::from_secs_f64(*v));
        }
        let mut merged = Merged::default();
        merged.add(&s);
        // The bound is about the durations actually stored (nanosecond resolution).
        let mut sorted: Vec<f64> = samples
            .iter()
            .map(|v| Duration::from_secs_f64(*v).as_secs_f64())
            .collect();
        sorted.sort_by(f64::total_cmp);
        for &p in ps {
            let q = merged.quantile(p).expect("non-empty");
            let (exact, lo, hi) = numpy_percentile(&sorted, p);
            let eps = 1e-12;
            prop_assert!(
                q >= lo * (1.0 - ALPHA) * (1.0 - eps) && q <= hi * (1.0 + ALPHA) * (1.0 + eps),
                "p={p} n={} q̂={q} exact={exact} x_lo={lo} x_hi={hi}",
                sorted.len()
            );
        }
        Ok(())
    }

    fn ps() -> impl Strategy<Value = Vec<f64>> {
        prop::collection::vec(0.0..=1.0f64, 1..8).prop_map(|mut v| {
            v.extend([0.0, 0.5, 0.95, 0.99, 1.0]);
            v
        })
    }

    /// Log-uniform over the whole supported range, 1 µs to 10⁵ s.
    fn log_uniform() -> impl Strategy<Value = f64> {
        ((MIN_SECS * 1.001).ln()..MAX_SECS.ln()).prop_map(f64::exp)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn bound_holds_for_log_uniform_samples(
            v in prop::collection::vec(log_uniform(), 1..1000), ps in ps()
        ) {
            check_bound(&v, &ps)?;
        }

        #[test]
        fn bound_holds_for_uniform_latencies(
            v in prop::collection::vec(0.001..2.0f64, 1..1000), ps in ps()
        ) {
            check_bound(&v, &ps)?;
        }

        #[test]
        fn bound_holds_for_exponential_gaps_with_zeros(
            v in prop::collection::vec(
                // One gap in five is zero: events that arrived in one frame.
                (0.0..1.0f64).prop_map(|u| if u < 0.2 { 0.0 } else { (0.03 * (1.0 - u).ln()).abs() }),
                1..1000,
            ),
            ps in ps()
        ) {
            check_bound(&v, &ps)?;
        }

        #[test]
        fn bound_holds_for_bimodal_samples_with_ties(
            fast in prop::collection::vec(prop_oneof![Just(0.1), 0.09..0.11f64], 0..500),
            slow in prop::collection::vec(prop_oneof![Just(0.3), 0.29..5.0f64], 1..500),
            ps in ps()
        ) {
            let mut v = fast;
            v.extend(slow);
            check_bound(&v, &ps)?;
        }

        /// Merging sketches must give exactly what adding every sample to one sketch gives,
        /// whatever the order and split.
        #[test]
        fn merging_equals_adding_everything_to_one(
            parts in prop::collection::vec(prop::collection::vec(
                prop_oneof![1 => Just(0.0), 9 => log_uniform()], 0..200), 1..8)
        ) {
            let mut whole = Sketch::default();
            let mut merged = Sketch::default();
            let mut via_queries = Merged::default();
            for part in &parts {
                let mut s = Sketch::default();
                for v in part {
                    s.add(Duration::from_secs_f64(*v));
                    whole.add(Duration::from_secs_f64(*v));
                }
                merged.merge(&s);
                via_queries.add(&s);
            }
            let (mut a, mut b) = (Merged::default(), Merged::default());
            a.add(&whole);
            b.add(&merged);
            prop_assert_eq!(a.zeros, b.zeros);
            prop_assert_eq!(a.total, b.total);
            prop_assert_eq!(&a.counts, &b.counts);
            prop_assert_eq!(&a.counts, &via_queries.counts);
            prop_assert!(merged.counts.capacity() <= N_KEYS);
        }
    }

    /// Seeded sizes from 1 to 20 000 over several shapes, so large n is covered too.
    #[test]
    fn bound_holds_for_many_sizes() {
        let mut x: u64 = 0x2545_F491_4F6C_DD1D;
        let mut uniform = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 11) as f64 / (1u64 << 53) as f64
        };
        for n in [1, 2, 3, 5, 10, 20, 99, 100, 101, 1000, 4999, 20_000] {
            for shape in 0..4 {
                let v: Vec<f64> = (0..n)
                    .map(|_| {
                        let u = uniform();
                        match shape {
                            0 => (MIN_SECS.ln() + u * (MAX_SECS.ln() - MIN_SECS.ln()))
                                .exp()
                                .max(MIN_SECS * 1.001),
                            1 => 0.05 + 0.2 * u,
                            2 if u < 0.2 => 0.0,
                            2 => (0.02 * (1.0 - u).ln()).abs(),
                            _ => (0.1f64.ln()
                                + 0.5
                                    * (-2.0 * uniform().max(1e-300).ln()).sqrt()
                                    * (std::f64::consts::TAU * u).cos())
                            .exp(),
                        }
                    })
                    .collect();
                let ps: Vec<f64> = (0..=100).map(|i| f64::from(i) / 100.0).collect();
                check_bound(&v, &ps).unwrap_or_else(|e| panic!("n={n} shape={shape}: {e}"));
            }
        }
    }

    #[test]
    fn constants_follow_from_alpha() {
        let gamma: f64 = (1.0 + ALPHA) / (1.0 - ALPHA);
        assert!((LN_GAMMA - gamma.ln()).abs() < 1e-15);
        assert_eq!(key(MIN_SECS), MIN_KEY);
        assert_eq!(key(MAX_SECS), MAX_KEY);
        assert_eq!(
            (
                (MIN_SECS.ln() / LN_GAMMA).ceil() as i32,
                (MAX_SECS.ln() / LN_GAMMA).ceil() as i32
            ),
            (MIN_KEY, MAX_KEY)
        );
        // Every value of a bucket is within α of what the bucket reports.
        for k in [MIN_KEY, -1, 0, 1, MAX_KEY] {
            let (lo, hi) = (
                (f64::from(k - 1) * LN_GAMMA).exp(),
                (f64::from(k) * LN_GAMMA).exp(),
            );
            let v = bucket_value(k);
            assert!(v >= hi * (1.0 - ALPHA) * (1.0 - 1e-12), "{k}");
            assert!(v <= lo * (1.0 + ALPHA) * (1.0 + 1e-12), "{k}");
        }
    }

    /// `key` takes the ceiling without libm's `ceil`; it must be the same ceiling, on the
    /// buckets' own bounds (where the logarithm's quotient lands on or next to an integer) and
    /// between them, over the whole kept range.
    #[test]
    fn key_is_the_ceiling_of_the_log_quotient() {
        let by_ceil = |secs: f64| {
            ((secs.clamp(MIN_SECS, MAX_SECS).ln() / LN_GAMMA).ceil() as i32).clamp(MIN_KEY, MAX_KEY)
        };
        for k in MIN_KEY - 2..=MAX_KEY + 2 {
            let bound = (f64::from(k) * LN_GAMMA).exp();
            // The neighbouring doubles (the bound is positive and normal); `next_up` and
            // `next_down` need a newer Rust than the crate's `rust-version`.
            for v in [
                bound,
                f64::from_bits(bound.to_bits() + 1),
                f64::from_bits(bound.to_bits() - 1),
                bound * 1.005,
                bound * 0.995,
            ] {
                assert_eq!(key(v), by_ceil(v), "{v:e} (bucket bound {k})");
            }
        }
        for nanos in (1..4_000_000_000u64).step_by(999_983) {
            let v = Duration::from_nanos(nanos).as_secs_f64();
            assert_eq!(key(v), by_ceil(v), "{nanos} ns");
        }
        assert_eq!(key(0.0), MIN_KEY);
        assert_eq!(key(f64::INFINITY), MAX_KEY);
    }

    #[test]
    fn out_of_range_values_are_clamped_and_zeros_are_exact() {
        let mut s = Sketch::default();
        s.add(Duration::ZERO);
        s.add(Duration::from_nanos(1));
        s.add(Duration::from_secs(1_000_000));
        let mut m = Merged::default();
        m.add(&s);
        assert_eq!(m.quantile(0.0), Some(0.0));
        let small = m.quantile(0.5).unwrap();
        assert!((small / MIN_SECS - 1.0).abs() <= ALPHA, "{small}");
        let big = m.quantile(1.0).unwrap();
        assert!((big / MAX_SECS - 1.0).abs() <= ALPHA, "{big}");
        assert_eq!(Merged::default().quantile(0.5), None);
    }

    #[test]
    fn storage_never_exceeds_the_key_range() {
        let mut s = Sketch::default();
        // Growing one bucket at a time, both ways, must never over-allocate.
        for i in 0..700 {
            s.add(Duration::from_secs_f64((f64::from(i) * LN_GAMMA).exp()));
            s.add(Duration::from_secs_f64((-f64::from(i) * LN_GAMMA).exp()));
            assert!(s.counts.capacity() <= N_KEYS);
        }
        assert_eq!(s.counts.len(), N_KEYS);
        // A cleared sketch keeps its storage.
        s.clear();
        assert!(s.is_empty());
        s.add(Duration::from_millis(5));
        assert_eq!(s.counts.capacity(), N_KEYS);
    }

    fn gaps(ms: &[u64]) -> GapSketch {
        let mut g = GapSketch::default();
        for m in ms {
            g.add(Duration::from_millis(*m));
        }
        g
    }

    fn sample<'a>(
        outcome: Outcome,
        verdict: Option<&'a Verdict>,
        ttft_ms: u64,
        itl: &'a GapSketch,
    ) -> Sample<'a> {
        Sample {
            outcome,
            verdict,
            prompt_tokens: Some(10),
            output_tokens: 5,
            ttft: Some(Duration::from_millis(ttft_ms)),
            tpot: Some(Duration::from_millis(20)),
            e2e: Duration::from_millis(ttft_ms + 80),
            itl,
        }
    }

    fn view(name: &str) -> RouteView {
        RouteView {
            name: name.into(),
            objective: Some(0.9),
            in_flight: 2,
        }
    }

    fn route<'a>(s: &'a Snapshot, name: &str) -> &'a RouteSnapshot {
        s.routes
            .iter()
            .find(|r| r.route == name)
            .unwrap_or_else(|| panic!("{name} missing"))
    }

    /// Requests 30 s, 4 min and 50 min ago land in exactly the windows that cover them, and
    /// rates divide by the time each window covers.
    #[tokio::test(start_paused = true)]
    async fn requests_land_in_the_windows_that_cover_them() {
        let live = LiveStats::new();
        let t0 = Instant::now();
        let now = t0 + Duration::from_secs(70 * 60);
        let g = GapSketch::default();
        for ago in [50 * 60, 4 * 60, 30] {
            live.record(
                now - Duration::from_secs(ago),
                "chat",
                &sample(Outcome::Ok, None, 100, &g),
            );
        }
        let s = live.snapshot(now, &[view("chat")]);
        let w = &route(&s, "chat").windows;
        assert_eq!(
            (
                w.one_minute.requests,
                w.five_minutes.requests,
                w.one_hour.requests
            ),
            (1, 2, 3)
        );
        // 70 min is a slot boundary of both rings: the current slots have just begun.
        assert_eq!(w.one_minute.seconds, 50.0);
        assert_eq!(w.five_minutes.seconds, 290.0);
        assert_eq!(w.one_hour.seconds, 3540.0);
        assert_eq!(w.one_minute.requests_per_second, 1.0 / 50.0);
        assert_eq!(w.five_minutes.output_tokens_per_second, 10.0 / 290.0);
        assert_eq!(w.one_hour.input_tokens_per_second, Some(30.0 / 3540.0));
        assert_eq!(s.uptime_seconds, 4200.0);

        // Five seconds later the 1m window covers 55 s.
        let s = live.snapshot(now + Duration::from_secs(5), &[view("chat")]);
        assert_eq!(route(&s, "chat").windows.one_minute.seconds, 55.0);
    }

    /// A process younger than a window divides by its age, not by the nominal window.
    #[tokio::test(start_paused = true)]
    async fn rates_divide_by_the_time_covered() {
        let live = LiveStats::new();
        let t0 = Instant::now();
        let g = gaps(&[10, 20]);
        for s in [5, 12, 25] {
            live.record(
                t0 + Duration::from_secs(s),
                "chat",
                &sample(Outcome::Ok, Some(&Verdict::Good), 100, &g),
            );
        }
        let s = live.snapshot(t0 + Duration::from_secs(30), &[view("chat")]);
        for w in [
            &route(&s, "chat").windows.one_minute,
            &route(&s, "chat").windows.five_minutes,
            &route(&s, "chat").windows.one_hour,
        ] {
            assert_eq!(w.seconds, 30.0);
            assert_eq!(w.requests, 3);
            assert_eq!(w.requests_per_second, 0.1);
            assert_eq!(w.output_tokens_per_second, 0.5);
            assert_eq!(w.goodput_output_tokens_per_second, 0.5);
            let itl = w.itl_ms.expect("gaps");
            assert!((itl.p50 - 15.0).abs() <= 20.0 * ALPHA, "{itl:?}");
        }
    }

    /// Slots expire: once a ring has turned, what it held is gone from every window, and a
    /// reused slot starts empty.
    #[tokio::test(start_paused = true)]
    async fn slots_expire() {
        let live = LiveStats::new();
        let t0 = Instant::now();
        let g = GapSketch::default();
        let at = |s: u64| t0 + Duration::from_secs(s);
        live.record(at(5), "chat", &sample(Outcome::Ok, None, 100, &g));
        let w = |s: &Snapshot| {
            let w = &route(s, "chat").windows;
            (
                w.one_minute.requests,
                w.five_minutes.requests,
                w.one_hour.requests,
            )
        };
        assert_eq!(w(&live.snapshot(at(59), &[])), (1, 1, 1));
        assert_eq!(w(&live.snapshot(at(65), &[])), (0, 1, 1));
        // The same place of the short ring, one ring later.
        live.record(at(305), "chat", &sample(Outcome::Ok, None, 300, &g));
        let s = live.snapshot(at(306), &[]);
        assert_eq!(w(&s), (1, 1, 2));
        let ttft = route(&s, "chat").windows.five_minutes.ttft_ms.unwrap();
        assert!((ttft.p50 / 300.0 - 1.0).abs() <= ALPHA, "{ttft:?}");
        assert_eq!(w(&live.snapshot(at(3600 + 59), &[])), (0, 0, 1));
        // Past an hour the route is no longer listed unless configured.
        let s = live.snapshot(at(3600 + 360), &[]);
        assert!(s.routes.is_empty(), "{s:?}");
        let s = live.snapshot(at(3600 + 360), &[view("chat")]);
        assert_eq!(w(&s), (0, 0, 0));
        assert!(route(&s, "chat").windows.one_hour.ttft_ms.is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn verdicts_outcomes_and_attainment() {
        let live = LiveStats::new();
        let now = Instant::now() + Duration::from_secs(20);
        let g = gaps(&[0, 0, 10]);
        let good = Verdict::Good;
        let slow = Verdict::Violated(vec![Criterion::Ttft, Criterion::MaxItl]);
        let error = Verdict::Violated(vec![Criterion::Error]);
        live.record(now, "chat", &sample(Outcome::Ok, Some(&good), 100, &g));
        live.record(now, "chat", &sample(Outcome::Ok, Some(&good), 100, &g));
        live.record(now, "chat", &sample(Outcome::Ok, Some(&good), 100, &g));
        live.record(now, "chat", &sample(Outcome::Ok, Some(&slow), 900, &g));
        live.record(now, "chat", &sample(Outcome::Error, Some(&error), 5, &g));
        live.record(
            now,
            "chat",
            &sample(Outcome::ClientError, Some(&Verdict::Excluded), 5, &g),
        );
        let s = live.snapshot(now, &[view("chat")]);
        let r = route(&s, "chat");
        assert_eq!((r.objective, r.in_flight), (Some(0.9), 2));
        let w = &r.windows.one_minute;
        assert_eq!(w.requests, 6);
        assert_eq!(
            (
                w.outcomes.ok,
                w.outcomes.error,
                w.outcomes.client_error,
                w.outcomes.cancelled
            ),
            (4, 1, 1, 0)
        );
        assert_eq!((w.good, w.violated), (3, 2));
        assert_eq!(w.attainment, Some(0.6));
        assert_eq!(w.meets_objective, Some(false));
        assert_eq!(
            (
                w.violations.ttft,
                w.violations.tpot,
                w.violations.e2e,
                w.violations.max_itl,
                w.violations.error
            ),
            (1, 0, 0, 1, 1)
        );
        assert_eq!(w.goodput_requests_per_second, 3.0 / 20.0);
        assert_eq!(w.goodput_output_tokens_per_second, 15.0 / 20.0);
        // Six requests with three gaps each, two of them zero: p50 of 18 gaps is 0.
        assert_eq!(w.itl_ms.unwrap().p50, 0.0);

        // A route without an SLO has no attainment; one without objective no verdict on it.
        live.record(now, "batch", &sample(Outcome::Ok, None, 100, &g));
        let s = live.snapshot(now, &[]);
        let b = &route(&s, "batch").windows.one_minute;
        assert_eq!((b.attainment, b.meets_objective), (None, None));
        assert_eq!(route(&s, "chat").windows.one_minute.meets_objective, None);
    }

    #[tokio::test(start_paused = true)]
    async fn routes_are_bounded_and_silent_ones_give_way() {
        let live = LiveStats::new();
        let t0 = Instant::now();
        let g = gaps(&[5]);
        for i in 0..MAX_ROUTES + 8 {
            live.record(t0, &format!("r{i}"), &sample(Outcome::Ok, None, 100, &g));
        }
        let s = live.snapshot(t0, &[]);
        assert_eq!(s.routes.len(), MAX_ROUTES);
        assert_eq!(s.untracked_requests, 8);
        // An hour later, a new name takes the place of a silent one.
        let later = t0 + Duration::from_secs(3600);
        live.record(later, "new", &sample(Outcome::Ok, None, 100, &g));
        let s = live.snapshot(later, &[]);
        assert_eq!(s.untracked_requests, 8);
        assert_eq!(s.routes.len(), 1);
        assert_eq!(route(&s, "new").windows.one_hour.requests, 1);
    }

    /// Configured routes come first, in order, even without traffic; others seen follow.
    #[tokio::test(start_paused = true)]
    async fn snapshot_lists_configured_routes_then_seen_ones() {
        let live = LiveStats::new();
        let now = Instant::now();
        let g = GapSketch::default();
        live.record(now, "old", &sample(Outcome::Ok, None, 100, &g));
        let s = live.snapshot(now, &[view("b"), view("a")]);
        let names: Vec<_> = s.routes.iter().map(|r| r.route.as_str()).collect();
        assert_eq!(names, ["b", "a", "old"]);
        let json = serde_json::to_value(&s).unwrap();
        assert_eq!(json["windows"], serde_json::json!(["1m", "5m", "1h"]));
        let w = &json["routes"][0]["windows"]["1m"];
        for key in [
            "seconds",
            "requests",
            "requests_per_second",
            "input_tokens_per_second",
            "output_tokens_per_second",
            "outcomes",
            "ttft_ms",
            "tpot_ms",
            "itl_ms",
            "e2e_ms",
            "good",
            "violated",
            "goodput_requests_per_second",
            "goodput_output_tokens_per_second",
            "attainment",
            "meets_objective",
            "violations",
        ] {
            assert!(w.get(key).is_some(), "{key} missing in {w}");
        }
        assert!(w["ttft_ms"].is_null() && w["attainment"].is_null());
        assert_eq!(
            json["routes"][2]["windows"]["5m"]["ttft_ms"]["p50"]
                .as_f64()
                .map(|v| (v / 100.0 - 1.0).abs() <= ALPHA),
            Some(true)
        );
        assert!(json["generated_at"].as_str().unwrap().ends_with('Z'));
    }

    /// The worst case stated in the module doc: every slot of a route filled across the whole
    /// key range stays within `WORST_CASE_BYTES_PER_ROUTE`.
    #[tokio::test(start_paused = true)]
    async fn a_route_never_holds_more_than_the_worst_case() {
        let live = LiveStats::new();
        let t0 = Instant::now();
        let mut g = GapSketch::default();
        g.add(Duration::from_nanos(1));
        g.add(Duration::from_secs(1 << 20));
        for minute in 0..LONG_SLOTS as u64 {
            for tenth in 0..6 {
                let at = t0 + Duration::from_secs(minute * 60 + tenth * 10);
                for d in [Duration::from_nanos(1), Duration::from_secs(1 << 20)] {
                    let s = Sample {
                        outcome: Outcome::Ok,
                        verdict: None,
                        prompt_tokens: None,
                        output_tokens: 1,
                        ttft: Some(d),
                        tpot: Some(d),
                        e2e: d,
                        itl: &g,
                    };
                    live.record(at, "chat", &s);
                }
            }
        }
        let bytes = live.bytes_held();
        assert!(bytes <= WORST_CASE_BYTES_PER_ROUTE, "{bytes}");
        assert!(bytes > WORST_CASE_BYTES_PER_ROUTE * 9 / 10, "{bytes}");
        eprintln!("worst case per route: {WORST_CASE_BYTES_PER_ROUTE} bytes, filled: {bytes}");
    }

    #[test]
    fn the_page_is_self_contained() {
        assert!(PAGE.contains("/stats"));
        for external in ["http://", "https://", "//cdn", "<link"] {
            assert!(!PAGE.contains(external), "{external}");
        }
    }
}
