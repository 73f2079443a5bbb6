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
//! Each route is also split by model, by the request's model label as `/metrics` has it
//! (bounded there: a configured or admitted name, `other`, `unknown`). A model row keeps the
//! 1-minute ring only, without ITL: its "5m" figures merge the last 5 long slots (the current,
//! partial minute and four before it, so 4 to 5 minutes), its "1h" all 60.
//!
//! Memory is bounded whatever the traffic: at most [`MAX_ROUTES`] routes are kept (a route
//! silent for an hour gives its place to a new one; requests on routes past the limit are only
//! counted as `untracked_requests`), each with 90 slots of four sketches whose counts can span
//! at most 1267 buckets of 4 bytes (`u32`, saturating: far beyond any server in one slot):
//! [`WORST_CASE_BYTES_PER_ROUTE`], 1.76 MiB, so 56 MiB if all 32 routes saw every duration from
//! 1 µs to 27 h in every slot. At most [`MAX_MODEL_ROWS`] model rows are kept over all routes
//! (one silent for an hour gives its place; requests past the limit count in their route and in
//! `unsplit_requests`), each at most `WORST_CASE_BYTES_PER_MODEL`, 0.89 MiB: 28 MiB more at
//! worst. Real traffic spans a few hundred buckets per sketch, a few hundred KiB per busy route.
//! A request's [`GapSketch`] is the same sketch: at most 5 KiB, typically a few hundred bytes.
//!
//! What a request costs here is one short lock: its durations' buckets are found before it (one
//! logarithm each, shared by the route's and the model's tallies), then a few additions to the
//! route's two slots and its model's one. The in-flight level it adds is one relaxed load of the
//! route's gauge the recorder already holds, and a `max` under the same lock.
//!
//! **Status**, per route and per model, with burn rate = violated share ÷ (1 − objective) over a
//! window (infinite for an objective of 1 missed):
//!
//! - `no_objective`: the route has no objective;
//! - `idle`: nothing judged in the 5-minute window;
//! - `met`: 5-minute attainment ≥ objective (burn rate ≤ 1);
//! - `broken`: over both 5 minutes and 1 hour, the burn rate is above 14.4 or nothing judged
//!   was good: the fast-burn page of `tokenmeter rules` (1 h and 5 m above 14.4: 2 % of a
//!   30-day budget in an hour), without its 2-minute hold, and a route failing every request
//!   even where its objective is too loose for 14.4 to be reachable;
//! - `burning`: below the objective, not broken.
//!
//! Ratios are compared as their correctly rounded doubles, so an attainment equal to the
//! objective is `met`, and a burn rate of exactly 14.4 is not above it.
//!
//! **Cost of a refresh.** The page fetches `/stats` every second and `/stats/series` every five
//! seconds. Both are built on the admin listener when asked, from the rings, taking the lock one
//! route at a time (a recorder waits at most one route's merge); nothing is computed on a
//! request's path. `/stats` also notes each route's in-flight level in its current slots, so the
//! in-flight chart has a point for every slot someone watched. The test
//! `tests::a_refresh_costs` prints what both cost for 8 routes with full rings.
//!
//! `/stats` is one JSON object:
//!
//! ```text
//! {"generated_at": "2025-01-01T12:00:00.000Z",   wall clock, RFC 3339, UTC
//!  "uptime_seconds": 3723.5,
//!  "windows": ["1m", "5m", "1h"],
//!  "percentile_relative_error": 0.01,              α above
//!  "untracked_requests": 0,                        requests on routes past MAX_ROUTES
//!  "unsplit_requests": 0,                          requests in no model row (MAX_MODEL_ROWS)
//!  "routes": [{
//!    "route": "chat", "objective": 0.99 | null, "in_flight": 3,
//!    "thresholds_ms": {"ttft": 300.0 | null, "tpot": .., "e2e": .., "max_itl": ..},
//!    "scoreboard": {                               over the 5m window
//!        "status": "met" | "burning" | "broken" | "idle" | "no_objective",
//!        "seconds": 300.0, "requests": n, "requests_per_second": ..,
//!        "errors": n,                              the `error` outcome
//!        "attainment": 0.995 | null,
//!        "burn_rate_5m": 0.5 | null, "burn_rate_1h": .. | null,   null: not finite or none
//!        "ttft_p99_ms": .. | null, "tpot_p99_ms": .., "itl_p99_ms": .., "e2e_p99_ms": ..},
//!    "models": [{"model": "llama", "scoreboard": {...}}],
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
//!
//! `/stats/series` is one point per slot of each ring, oldest first, from the process's first
//! slot or a ring ago, whichever is later (so up to 60 minutes and 30 ten-second slots); a slot
//! nothing happened in is a point with no requests and null figures:
//!
//! ```text
//! {"generated_at": "..", "uptime_seconds": 3723.5,
//!  "routes": [{"route": "chat", "objective": .., "thresholds_ms": {...},
//!    "minutes": {"slot_seconds": 60, "points": [{
//!        "start": 3660,                            the slot's start, s since the process started
//!        "seconds": 60.0,                          covered: less for the current slot
//!        "requests": n, "errors": n, "requests_per_second": ..,
//!        "output_tokens_per_second": .., "goodput_requests_per_second": ..,
//!        "goodput_output_tokens_per_second": .., "attainment": .. | null,
//!        "ttft_p50_ms": .. | null, "ttft_p99_ms": .., "tpot_p99_ms": .., "itl_p99_ms": ..,
//!        "e2e_p99_ms": .., "in_flight_max": n | null}]},
//!    "ten_seconds": {"slot_seconds": 10, "points": [...]}}]}
//! ```

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use serde::Serialize;
use tokio::time::Instant;

mod ring;
pub(crate) mod sketch;

use crate::config::Slo;
use crate::policy::outcome::Outcome;
use crate::policy::slo::Verdict;
use ring::*;
pub(crate) use sketch::GapSketch;
use sketch::*;

/// The page served on `/`: it fetches `/stats` every second and `/stats/series` every five,
/// and draws the scoreboard, the charts and the detailed tables.
pub const PAGE: &str = include_str!("page.html");

/// The most routes kept; see the module doc.
pub(crate) const MAX_ROUTES: usize = 32;

/// The most (route, model) rows kept over all routes; see the module doc.
pub(crate) const MAX_MODEL_ROWS: usize = 32;

/// The burn rate over both 5 m and 1 h past which a route is `broken`: the SRE Workbook's
/// fast-burn page, as `tokenmeter rules` writes it (2 % of a 30-day budget in an hour).
pub(crate) const BROKEN_BURN_RATE: f64 = 14.4;

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
    /// The request's model label, as `/metrics` has it (bounded there).
    pub(crate) model: &'a Arc<str>,
    /// The route's in-flight level as the request finished, itself included; `None` when it
    /// was never counted in flight.
    pub(crate) in_flight: Option<i64>,
}

/// A route to show, as the current configuration and gauges have it.
#[derive(Debug, Clone)]
pub(crate) struct RouteView {
    pub(crate) name: String,
    pub(crate) objective: Option<f64>,
    pub(crate) thresholds: Thresholds,
    pub(crate) in_flight: i64,
}

impl RouteView {
    pub(crate) fn new(name: &str, slo: Option<&Slo>, in_flight: i64) -> RouteView {
        let ms = |d: Option<Duration>| d.map(|d| d.as_secs_f64() * 1e3);
        RouteView {
            name: name.to_string(),
            objective: slo.and_then(|s| s.objective),
            thresholds: Thresholds {
                ttft: ms(slo.and_then(|s| s.ttft)),
                tpot: ms(slo.and_then(|s| s.tpot)),
                e2e: ms(slo.and_then(|s| s.e2e)),
                max_itl: ms(slo.and_then(|s| s.max_itl)),
            },
            in_flight,
        }
    }
}

/// A route's SLO thresholds in milliseconds; `null` for a criterion it does not have.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub(crate) struct Thresholds {
    pub(crate) ttft: Option<f64>,
    pub(crate) tpot: Option<f64>,
    pub(crate) e2e: Option<f64>,
    pub(crate) max_itl: Option<f64>,
}

#[derive(Debug, Default)]
struct Inner {
    routes: Vec<RouteRings>,
    untracked: u64,
    /// Requests counted in their route but in no model row (all `MAX_MODEL_ROWS` busy).
    unsplit: u64,
}

impl Inner {
    /// The place of `route`'s rings, made (or taken over from a route silent for an hour) if
    /// there is room; `None` past [`MAX_ROUTES`].
    fn route_index(&mut self, route: &str, long_n: u64) -> Option<usize> {
        if let Some(i) = self.routes.iter().position(|r| &*r.name == route) {
            return Some(i);
        }
        if self.routes.len() < MAX_ROUTES {
            self.routes.push(RouteRings::new(route));
            return Some(self.routes.len() - 1);
        }
        let i = self
            .routes
            .iter()
            .position(|r| !r.seen_within_hour(long_n))?;
        // Everything it held has expired; its rings are reused as they are, its models are
        // another route's and go.
        self.routes[i].name = route.into();
        self.routes[i].models.clear();
        Some(i)
    }

    /// The place of `model`'s ring within route `i`, made (or taken over from a model silent
    /// for an hour, on any route) if there is room; `None` past [`MAX_MODEL_ROWS`].
    fn model_index(&mut self, i: usize, model: &Arc<str>, long_n: u64) -> Option<usize> {
        if let Some(j) = self.routes[i].models.iter().position(|m| m.is(model)) {
            return Some(j);
        }
        let rows: usize = self.routes.iter().map(|r| r.models.len()).sum();
        let ring = if rows < MAX_MODEL_ROWS {
            ModelRings::new(model)
        } else {
            let (a, b) = self.routes.iter().enumerate().find_map(|(a, r)| {
                let b = r.models.iter().position(|m| !m.seen_within_hour(long_n))?;
                Some((a, b))
            })?;
            let mut ring = self.routes[a].models.swap_remove(b);
            ring.name = model.clone();
            ring
        };
        self.routes[i].models.push(ring);
        Some(self.routes[i].models.len() - 1)
    }
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

    /// One finished request; called once per request from the recorder's single finish. The
    /// durations' buckets are found once, before the lock, for both the route's and the
    /// model's tallies.
    pub(crate) fn record(&self, now: Instant, route: &str, sample: &Sample<'_>) {
        let elapsed = now.saturating_duration_since(self.started);
        let short_n = elapsed.as_secs() / SHORT_SLOT_SECS;
        let long_n = elapsed.as_secs() / LONG_SLOT_SECS;
        let buckets = Buckets::of(sample);
        let mut inner = self.lock();
        let Some(i) = inner.route_index(route, long_n) else {
            inner.untracked += 1;
            return;
        };
        let model = inner.model_index(i, sample.model, long_n);
        let rings = &mut inner.routes[i];
        rings.last_long_slot = rings.last_long_slot.max(long_n);
        if let Some(t) = rings.short.tally(short_n) {
            t.add(sample, &buckets, true);
        }
        if let Some(t) = rings.long.tally(long_n) {
            t.add(sample, &buckets, true);
        }
        match model {
            Some(j) => {
                let m = &mut rings.models[j];
                m.last_long_slot = m.last_long_slot.max(long_n);
                if let Some(t) = m.long.tally(long_n) {
                    t.add(sample, &buckets, false);
                }
            }
            None => inner.unsplit += 1,
        }
    }

    /// Notes each route's current in-flight level in its current slots, so a minute in which
    /// nothing finished still has a level while someone watches. Only routes with rings, or
    /// with requests in flight, take part: a silent configured route takes no place.
    fn note_in_flight(&self, elapsed: Duration, views: &[RouteView]) {
        let short_n = elapsed.as_secs() / SHORT_SLOT_SECS;
        let long_n = elapsed.as_secs() / LONG_SLOT_SECS;
        let mut inner = self.lock();
        for view in views {
            let known = inner.routes.iter().any(|r| *r.name == *view.name);
            if !known && view.in_flight <= 0 {
                continue;
            }
            let Some(i) = inner.route_index(&view.name, long_n) else {
                continue;
            };
            let rings = &mut inner.routes[i];
            if let Some(t) = rings.short.tally(short_n) {
                t.note_in_flight(view.in_flight);
            }
            if let Some(t) = rings.long.tally(long_n) {
                t.note_in_flight(view.in_flight);
            }
        }
    }

    /// `routes` (configured ones even without traffic) plus any other route seen in the last
    /// hour, and the requests on routes past the limit and outside every model row.
    fn views(&self, long_n: u64, routes: &[RouteView]) -> (Vec<RouteView>, u64, u64) {
        let mut views: Vec<RouteView> = routes.to_vec();
        let inner = self.lock();
        for r in &inner.routes {
            if r.seen_within_hour(long_n) && !views.iter().any(|v| v.name == *r.name) {
                views.push(RouteView::new(&r.name, None, 0));
            }
        }
        (views, inner.untracked, inner.unsplit)
    }

    /// Everything `/stats` shows, for `routes` (configured ones even without traffic) plus any
    /// other route seen in the last hour.
    pub(crate) fn snapshot(&self, now: Instant, routes: &[RouteView]) -> Snapshot {
        let elapsed = now.saturating_duration_since(self.started);
        let long_n = elapsed.as_secs() / LONG_SLOT_SECS;
        self.note_in_flight(elapsed, routes);
        let (views, untracked, unsplit) = self.views(long_n, routes);
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
                let scoreboard = Board::new(&five_minutes, &one_hour, view.objective);
                let models = rings
                    .map(|r| {
                        let cur = r.long.number(elapsed);
                        r.models
                            .iter()
                            .filter(|m| m.seen_within_hour(long_n))
                            .map(|m| {
                                let stats = |k: u64| {
                                    let seconds = m.long.covered(elapsed, k).as_secs_f64();
                                    Window::merge(m.long.window(cur, k))
                                        .stats(seconds, view.objective)
                                };
                                let (five, hour) =
                                    (stats(MODEL_WINDOW_5M_SLOTS), stats(LONG_SLOTS as u64));
                                ModelSnapshot {
                                    model: m.name.to_string(),
                                    scoreboard: Board::new(&five, &hour, view.objective),
                                }
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                RouteSnapshot {
                    route: view.name,
                    objective: view.objective,
                    thresholds_ms: view.thresholds,
                    in_flight: view.in_flight,
                    scoreboard,
                    models,
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
            unsplit_requests: unsplit,
            routes,
        }
    }

    /// `/stats/series`: per route, one point per slot of each ring, oldest first, from the
    /// process's first slot or a ring ago, whichever is later; the current slot is partial.
    pub(crate) fn series(&self, now: Instant, routes: &[RouteView]) -> Series {
        let elapsed = now.saturating_duration_since(self.started);
        let long_n = elapsed.as_secs() / LONG_SLOT_SECS;
        let (views, _, _) = self.views(long_n, routes);
        let routes = views
            .into_iter()
            .map(|view| {
                let inner = self.lock();
                let rings = inner.routes.iter().find(|r| *r.name == *view.name);
                let points = |id: RingId, width: u64, len: usize| {
                    let cur = elapsed.as_secs() / width;
                    let first = (cur + 1).saturating_sub(len as u64);
                    (first..=cur)
                        .map(|n| {
                            let start = n * width;
                            let seconds = (elapsed.as_secs_f64() - start as f64).min(width as f64);
                            let tally = rings.and_then(|r| r.ring(id).slot(n));
                            Point::new(start, seconds, tally, view.objective)
                        })
                        .collect()
                };
                RouteSeries {
                    route: view.name,
                    objective: view.objective,
                    thresholds_ms: view.thresholds,
                    minutes: Points {
                        slot_seconds: LONG_SLOT_SECS,
                        points: points(RingId::Long, LONG_SLOT_SECS, LONG_SLOTS),
                    },
                    ten_seconds: Points {
                        slot_seconds: SHORT_SLOT_SECS,
                        points: points(RingId::Short, SHORT_SLOT_SECS, SHORT_SLOTS),
                    },
                }
            })
            .collect();
        Series {
            generated_at: humantime::format_rfc3339_millis(SystemTime::now()).to_string(),
            uptime_seconds: elapsed.as_secs_f64(),
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

    #[cfg(test)]
    /// The bytes the model rows hold now.
    pub(crate) fn model_bytes_held(&self) -> usize {
        let inner = self.lock();
        inner
            .routes
            .iter()
            .flat_map(|r| &r.models)
            .map(|m| std::mem::size_of::<ModelRings>() + m.long.heap_bytes())
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
    pub(crate) unsplit_requests: u64,
    pub(crate) routes: Vec<RouteSnapshot>,
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct RouteSnapshot {
    pub(crate) route: String,
    pub(crate) objective: Option<f64>,
    pub(crate) thresholds_ms: Thresholds,
    pub(crate) in_flight: i64,
    pub(crate) scoreboard: Board,
    pub(crate) models: Vec<ModelSnapshot>,
    pub(crate) windows: Windows,
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct ModelSnapshot {
    pub(crate) model: String,
    pub(crate) scoreboard: Board,
}

/// Where a route or model stands against its objective; the module doc states the rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Status {
    Met,
    Burning,
    Broken,
    /// Nothing judged in the last 5 minutes.
    Idle,
    /// No objective: attainment is shown, not judged.
    NoObjective,
}

/// The burn rate of a window: its violated share over the share the objective allows;
/// `None` without judged requests or objective; infinite for an objective of 1 missed.
pub(crate) fn burn_rate(good: u64, violated: u64, objective: Option<f64>) -> Option<f64> {
    let objective = objective?;
    let judged = good + violated;
    if judged == 0 {
        return None;
    }
    let bad = violated as f64 / judged as f64;
    let budget = 1.0 - objective;
    Some(if bad == 0.0 {
        0.0
    } else if budget <= 0.0 {
        f64::INFINITY
    } else {
        bad / budget
    })
}

/// The status of a row from its 5-minute and 1-hour (good, violated) counts.
pub(crate) fn status(five: (u64, u64), hour: (u64, u64), objective: Option<f64>) -> Status {
    let Some(o) = objective else {
        return Status::NoObjective;
    };
    let judged = five.0 + five.1;
    if judged == 0 {
        return Status::Idle;
    }
    // Attainment good / judged is the correctly rounded quotient, as the objective is the
    // correctly rounded decimal: at a ratio equal to the objective they are the same double.
    if five.0 as f64 / judged as f64 >= o {
        return Status::Met;
    }
    // A decimal objective is off by an ulp in binary: the factor gets a relative margin far
    // below any real difference, so a burn of exactly 14.4 is not past it, as in the alert.
    let past = |(good, violated)| {
        burn_rate(good, violated, objective).is_some_and(|b| b > BROKEN_BURN_RATE * (1.0 + 1e-9))
            || (good == 0 && violated > 0)
    };
    if past(five) && past(hour) {
        Status::Broken
    } else {
        Status::Burning
    }
}

/// A scoreboard row: where a route or model stands over the last 5 minutes.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Board {
    pub(crate) status: Status,
    /// The time the row's figures cover.
    pub(crate) seconds: f64,
    pub(crate) requests: u64,
    pub(crate) requests_per_second: f64,
    /// Requests that ended in a server-side error (the `error` outcome).
    pub(crate) errors: u64,
    pub(crate) attainment: Option<f64>,
    pub(crate) burn_rate_5m: Option<f64>,
    pub(crate) burn_rate_1h: Option<f64>,
    pub(crate) ttft_p99_ms: Option<f64>,
    pub(crate) tpot_p99_ms: Option<f64>,
    pub(crate) itl_p99_ms: Option<f64>,
    pub(crate) e2e_p99_ms: Option<f64>,
}

impl Board {
    fn new(five: &WindowStats, hour: &WindowStats, objective: Option<f64>) -> Board {
        let finite = |b: Option<f64>| b.filter(|b| b.is_finite());
        let p99 = |p: Option<Percentiles>| p.map(|p| p.p99);
        Board {
            status: status(
                (five.good, five.violated),
                (hour.good, hour.violated),
                objective,
            ),
            seconds: five.seconds,
            requests: five.requests,
            requests_per_second: five.requests_per_second,
            errors: five.outcomes.error,
            attainment: five.attainment,
            burn_rate_5m: finite(burn_rate(five.good, five.violated, objective)),
            burn_rate_1h: finite(burn_rate(hour.good, hour.violated, objective)),
            ttft_p99_ms: p99(five.ttft_ms),
            tpot_p99_ms: p99(five.tpot_ms),
            itl_p99_ms: p99(five.itl_ms),
            e2e_p99_ms: p99(five.e2e_ms),
        }
    }
}

/// `/stats/series`; the module doc shows its shape.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Series {
    pub(crate) generated_at: String,
    pub(crate) uptime_seconds: f64,
    pub(crate) routes: Vec<RouteSeries>,
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct RouteSeries {
    pub(crate) route: String,
    pub(crate) objective: Option<f64>,
    pub(crate) thresholds_ms: Thresholds,
    pub(crate) minutes: Points,
    pub(crate) ten_seconds: Points,
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct Points {
    pub(crate) slot_seconds: u64,
    pub(crate) points: Vec<Point>,
}

/// One slot of a ring.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Point {
    /// The slot's start, in seconds since the process started.
    pub(crate) start: u64,
    /// The time it covers: its width, or less for the current slot.
    pub(crate) seconds: f64,
    pub(crate) requests: u64,
    pub(crate) errors: u64,
    pub(crate) requests_per_second: f64,
    pub(crate) output_tokens_per_second: f64,
    pub(crate) goodput_requests_per_second: f64,
    pub(crate) goodput_output_tokens_per_second: f64,
    pub(crate) attainment: Option<f64>,
    pub(crate) ttft_p50_ms: Option<f64>,
    pub(crate) ttft_p99_ms: Option<f64>,
    pub(crate) tpot_p99_ms: Option<f64>,
    pub(crate) itl_p99_ms: Option<f64>,
    pub(crate) e2e_p99_ms: Option<f64>,
    pub(crate) in_flight_max: Option<i64>,
}

impl Point {
    fn new(start: u64, seconds: f64, tally: Option<&Tally>, objective: Option<f64>) -> Point {
        let w = Window::merge(tally.into_iter()).stats(seconds, objective);
        let pick = |p: Option<Percentiles>, f: fn(Percentiles) -> f64| p.map(f);
        Point {
            start,
            seconds,
            requests: w.requests,
            errors: w.outcomes.error,
            requests_per_second: w.requests_per_second,
            output_tokens_per_second: w.output_tokens_per_second,
            goodput_requests_per_second: w.goodput_requests_per_second,
            goodput_output_tokens_per_second: w.goodput_output_tokens_per_second,
            attainment: w.attainment,
            ttft_p50_ms: pick(w.ttft_ms, |p| p.p50),
            ttft_p99_ms: pick(w.ttft_ms, |p| p.p99),
            tpot_p99_ms: pick(w.tpot_ms, |p| p.p99),
            itl_p99_ms: pick(w.itl_ms, |p| p.p99),
            e2e_p99_ms: pick(w.e2e_ms, |p| p.p99),
            in_flight_max: tally.and_then(|t| t.in_flight_max),
        }
    }
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

    thread_local! {
        static MODEL: Arc<str> = Arc::from("m");
    }

    /// A model label that lives as long as the test thread, like `/metrics`' labels.
    fn model_label(name: &str) -> &'static Arc<str> {
        Box::leak(Box::new(MODEL.with(|m| {
            if **m == *name {
                m.clone()
            } else {
                Arc::from(name)
            }
        })))
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
            model: model_label("m"),
            in_flight: None,
        }
    }

    fn view(name: &str) -> RouteView {
        let slo = Slo {
            objective: Some(0.9),
            ..Slo::default()
        };
        RouteView::new(name, Some(&slo), 2)
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
                        model: model_label("m"),
                        in_flight: Some(1),
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

    /// The status rules, exactly at their boundaries (objective 0.99 allows 1 % bad; a burn
    /// of 14.4 is 14.4 % bad).
    #[test]
    fn status_rules_at_the_boundaries() {
        let o = Some(0.99);
        let calm = (1000, 0);
        // Attainment exactly at the objective is met; one more violation is not.
        assert_eq!(status((99, 1), calm, o), Status::Met);
        assert_eq!(status((990, 10), calm, o), Status::Met);
        assert_eq!(status((989, 11), calm, o), Status::Burning);
        // A burn of exactly 14.4 over both windows is not above it; 14.5 over both is broken.
        assert_eq!(status((856, 144), (856, 144), o), Status::Burning);
        assert_eq!(status((855, 145), (855, 145), o), Status::Broken);
        // Past it over 5 minutes only, or over the hour only: burning.
        assert_eq!(status((855, 145), (9000, 145), o), Status::Burning);
        assert_eq!(status((990, 10), (855, 145), o), Status::Met);
        assert_eq!(status((50, 50), (8560, 1440), o), Status::Burning);
        assert_eq!(status((50, 50), (8550, 1450), o), Status::Broken);
        // Nothing judged in 5 minutes, or no objective.
        assert_eq!(status((0, 0), (0, 100), o), Status::Idle);
        assert_eq!(status((0, 10), (0, 10), None), Status::NoObjective);
        // An objective too loose for 14.4 to be reachable: broken only when nothing is good.
        let loose = Some(0.9);
        assert_eq!(status((1, 99), (1, 99), loose), Status::Burning);
        assert_eq!(status((0, 5), (0, 99), loose), Status::Broken);
        assert_eq!(status((0, 5), (1, 99), loose), Status::Burning);
        // An objective of 1: any violation burns infinitely fast; of 0: always met.
        assert_eq!(status((10, 0), (10, 0), Some(1.0)), Status::Met);
        assert_eq!(status((9, 1), (9, 1), Some(1.0)), Status::Broken);
        assert_eq!(status((0, 10), (0, 10), Some(0.0)), Status::Met);
        // The burn rate itself.
        let b = burn_rate(856, 144, o).unwrap();
        assert!((b - 14.4).abs() < 1e-9, "{b}");
        assert_eq!(burn_rate(10, 0, o), Some(0.0));
        assert_eq!(burn_rate(0, 0, o), None);
        assert_eq!(burn_rate(5, 5, None), None);
        assert_eq!(burn_rate(9, 1, Some(1.0)), Some(f64::INFINITY));
    }

    fn sample_of<'a>(
        model: &str,
        verdict: Option<&'a Verdict>,
        ttft_ms: u64,
        in_flight: i64,
        itl: &'a GapSketch,
    ) -> Sample<'a> {
        Sample {
            model: model_label(model),
            in_flight: Some(in_flight),
            ..sample(Outcome::Ok, verdict, ttft_ms, itl)
        }
    }

    /// The scoreboard: the route's row over 5 minutes, its status, and one row per model with
    /// its own figures and status; JSON as the module doc shows it.
    #[tokio::test(start_paused = true)]
    async fn the_scoreboard_splits_routes_by_model() {
        let live = LiveStats::new();
        let t0 = Instant::now();
        let g = GapSketch::default();
        let (good, slow) = (Verdict::Good, Verdict::Violated(vec![Criterion::Ttft]));
        let at = t0 + Duration::from_secs(30);
        for _ in 0..9 {
            live.record(at, "chat", &sample_of("fast", Some(&good), 100, 1, &g));
        }
        for _ in 0..3 {
            live.record(at, "chat", &sample_of("slow", Some(&slow), 900, 1, &g));
        }
        let slo = Slo {
            ttft: Some(Duration::from_millis(300)),
            objective: Some(0.9),
            ..Slo::default()
        };
        let view = RouteView::new("chat", Some(&slo), 4);
        let s = live.snapshot(t0 + Duration::from_secs(40), &[view]);
        let r = route(&s, "chat");
        assert_eq!(r.thresholds_ms.ttft, Some(300.0));
        assert_eq!(r.thresholds_ms.tpot, None);
        let b = &r.scoreboard;
        assert_eq!((b.requests, b.attainment), (12, Some(0.75)));
        // 25 % bad against 10 % allowed: a burn of 2.5, below the objective, not broken.
        assert_eq!(b.status, Status::Burning);
        assert!((b.burn_rate_5m.unwrap() - 2.5).abs() < 1e-9, "{b:?}");
        assert_eq!(b.burn_rate_5m, b.burn_rate_1h);
        assert!(b.ttft_p99_ms.unwrap() > 800.0, "{b:?}");
        let m = |name: &str| {
            r.models
                .iter()
                .find(|m| m.model == name)
                .unwrap_or_else(|| panic!("{name}: {r:?}"))
        };
        assert_eq!(r.models.len(), 2);
        let (fast, slow) = (&m("fast").scoreboard, &m("slow").scoreboard);
        assert_eq!(
            (fast.requests, fast.attainment, fast.status),
            (9, Some(1.0), Status::Met)
        );
        assert_eq!(
            (slow.requests, slow.attainment, slow.status),
            (3, Some(0.0), Status::Broken)
        );
        assert!((slow.burn_rate_5m.unwrap() - 10.0).abs() < 1e-9, "{slow:?}");
        assert!((fast.ttft_p99_ms.unwrap() / 100.0 - 1.0).abs() <= ALPHA);
        assert!((slow.ttft_p99_ms.unwrap() / 900.0 - 1.0).abs() <= ALPHA);
        assert_eq!(fast.itl_p99_ms, None, "model rows keep no ITL");
        let json = serde_json::to_value(&s).unwrap();
        let route_json = &json["routes"][0];
        assert_eq!(route_json["scoreboard"]["status"], "burning");
        assert_eq!(route_json["thresholds_ms"]["ttft"], 300.0);
        assert_eq!(route_json["models"][1]["scoreboard"]["status"], "broken");
        assert_eq!(json["unsplit_requests"], 0);
        // Without an objective: no status, attainment shown.
        let s = live.snapshot(t0 + Duration::from_secs(40), &[]);
        assert_eq!(route(&s, "chat").scoreboard.status, Status::NoObjective);
    }

    /// Model rows are bounded over all routes: past the limit, requests count in their route
    /// and as unsplit; an hour later a new model takes a silent one's place.
    #[tokio::test(start_paused = true)]
    async fn model_rows_are_bounded_and_silent_ones_give_way() {
        let live = LiveStats::new();
        let t0 = Instant::now();
        let g = GapSketch::default();
        for i in 0..MAX_MODEL_ROWS + 3 {
            let route = if i % 2 == 0 { "a" } else { "b" };
            live.record(t0, route, &sample_of(&format!("m{i}"), None, 100, 1, &g));
        }
        let s = live.snapshot(t0, &[]);
        let rows: usize = s.routes.iter().map(|r| r.models.len()).sum();
        assert_eq!(rows, MAX_MODEL_ROWS);
        assert_eq!(s.unsplit_requests, 3);
        let total: u64 = s.routes.iter().map(|r| r.windows.one_minute.requests).sum();
        assert_eq!(total, MAX_MODEL_ROWS as u64 + 3);
        let later = t0 + Duration::from_secs(3600);
        live.record(later, "a", &sample_of("new", None, 100, 1, &g));
        let s = live.snapshot(later, &[]);
        assert_eq!(s.unsplit_requests, 3);
        let a = route(&s, "a");
        assert_eq!(a.models.len(), 1, "{a:?}");
        assert_eq!(
            (a.models[0].model.as_str(), a.models[0].scoreboard.requests),
            ("new", 1)
        );
    }

    /// `/stats/series`: one point per minute (and per 10 s) since start, empty slots included,
    /// each with its own figures and in-flight level, at finishes and at `/stats` reads.
    #[tokio::test(start_paused = true)]
    async fn series_has_one_point_per_slot() {
        let live = LiveStats::new();
        let t0 = Instant::now();
        let g = gaps(&[10]);
        let good = Verdict::Good;
        let at = |s: u64| t0 + Duration::from_secs(s);
        live.record(at(5), "chat", &sample_of("m", Some(&good), 100, 3, &g));
        live.record(at(10), "chat", &sample_of("m", Some(&good), 200, 7, &g));
        live.record(at(150), "chat", &sample_of("m", None, 400, 1, &g));
        // A `/stats` read in minute 3 sees 5 in flight, with no finish there.
        live.snapshot(at(200), &[RouteView::new("chat", None, 5)]);
        let s = live.series(at(250), &[]);
        let r = s.routes.iter().find(|r| r.route == "chat").expect("chat");
        assert_eq!(r.minutes.slot_seconds, 60);
        let p = &r.minutes.points;
        let starts: Vec<u64> = p.iter().map(|p| p.start).collect();
        assert_eq!(starts, [0, 60, 120, 180, 240]);
        let requests: Vec<u64> = p.iter().map(|p| p.requests).collect();
        assert_eq!(requests, [2, 0, 1, 0, 0]);
        let in_flight: Vec<Option<i64>> = p.iter().map(|p| p.in_flight_max).collect();
        assert_eq!(in_flight, [Some(7), None, Some(1), Some(5), None]);
        assert_eq!(p[0].seconds, 60.0);
        assert_eq!(p[4].seconds, 10.0);
        assert_eq!(p[0].requests_per_second, 2.0 / 60.0);
        assert_eq!(p[0].attainment, Some(1.0));
        assert_eq!(p[2].attainment, None);
        assert!((p[0].ttft_p99_ms.unwrap() / 200.0 - 1.0).abs() <= ALPHA);
        assert!((p[0].ttft_p50_ms.unwrap() / 150.0 - 1.0).abs() <= ALPHA);
        assert!((p[2].ttft_p99_ms.unwrap() / 400.0 - 1.0).abs() <= ALPHA);
        assert!(p[1].ttft_p99_ms.is_none() && p[1].itl_p99_ms.is_none());
        assert!((p[0].itl_p99_ms.unwrap() / 10.0 - 1.0).abs() <= ALPHA);
        // The 10 s ring: 26 slots since start (the 26th just begun), one request in slot 0,
        // one in 1, one in 15.
        let short = &r.ten_seconds.points;
        assert_eq!(short.len(), 26);
        assert_eq!(short[25].seconds, 0.0);
        assert_eq!(
            (short[0].requests, short[1].requests, short[15].requests),
            (1, 1, 1)
        );
        assert_eq!(short.iter().map(|p| p.requests).sum::<u64>(), 3);
        // Past an hour, the last 60 minutes only.
        let s = live.series(at(3 * 3600 + 30), &[RouteView::new("chat", None, 0)]);
        let p = &s.routes[0].minutes.points;
        assert_eq!(p.len(), LONG_SLOTS);
        assert_eq!(p[0].start, 3 * 3600 - 59 * 60);
        assert_eq!(p.last().unwrap().start, 3 * 3600);
        assert!(p.iter().all(|p| p.requests == 0));
        let json = serde_json::to_value(&s).unwrap();
        assert_eq!(
            json["routes"][0]["minutes"]["points"][0]["in_flight_max"],
            serde_json::Value::Null
        );
    }

    /// What a refresh costs: `/stats` and `/stats/series` built and encoded for 8 routes whose
    /// rings are full (every slot of both rings holds requests of 3 models). Printed, not
    /// asserted: the figure depends on the machine.
    #[test]
    fn a_refresh_costs() {
        let live = LiveStats::new();
        let t0 = live.started;
        let mut g = GapSketch::default();
        for ms in [8, 9, 10, 12, 15, 20, 30] {
            g.add(Duration::from_millis(ms));
        }
        let good = Verdict::Good;
        let routes: Vec<RouteView> = (0..8)
            .map(|i| RouteView::new(&format!("route-{i}"), None, 3))
            .collect();
        for slot in 0..360u64 {
            let at = t0 + Duration::from_secs(slot * 10 + 5);
            for r in &routes {
                for k in 0..6u64 {
                    let ttft = 50 + (slot * 7 + k * 131) % 900;
                    let model = ["a", "b", "c"][(k % 3) as usize];
                    live.record(at, &r.name, &sample_of(model, Some(&good), ttft, 4, &g));
                }
            }
        }
        let now = t0 + Duration::from_secs(3600);
        let runs = 5;
        let time = |f: &dyn Fn() -> usize| {
            let start = std::time::SystemTime::now();
            let mut bytes = 0;
            for _ in 0..runs {
                bytes = f();
            }
            let spent = start.elapsed().unwrap_or_default() / runs;
            (spent, bytes)
        };
        let (stats, stats_bytes) = time(&|| {
            serde_json::to_vec(&live.snapshot(now, &routes))
                .unwrap()
                .len()
        });
        let (series, series_bytes) = time(&|| {
            serde_json::to_vec(&live.series(now, &routes))
                .unwrap()
                .len()
        });
        eprintln!(
            "a refresh, 8 routes with full rings: /stats {stats:?} ({stats_bytes} bytes), \
             /stats/series {series:?} ({series_bytes} bytes)"
        );
        assert!(stats_bytes > 0 && series_bytes > 0);
    }

    /// A model row's worst case stays within `WORST_CASE_BYTES_PER_MODEL`.
    #[tokio::test(start_paused = true)]
    async fn a_model_row_never_holds_more_than_the_worst_case() {
        let live = LiveStats::new();
        let t0 = Instant::now();
        let g = GapSketch::default();
        for minute in 0..LONG_SLOTS as u64 {
            let at = t0 + Duration::from_secs(minute * 60);
            for d in [Duration::from_nanos(1), Duration::from_secs(1 << 20)] {
                let s = Sample {
                    ttft: Some(d),
                    tpot: Some(d),
                    e2e: d,
                    ..sample_of("m", None, 1, 1, &g)
                };
                live.record(at, "chat", &s);
            }
        }
        let bytes = live.model_bytes_held();
        assert!(bytes <= WORST_CASE_BYTES_PER_MODEL, "{bytes}");
        assert!(bytes > WORST_CASE_BYTES_PER_MODEL * 9 / 10, "{bytes}");
        eprintln!("worst case per model row: {WORST_CASE_BYTES_PER_MODEL} bytes, filled: {bytes}");
    }

    #[test]
    fn the_page_is_self_contained() {
        assert!(PAGE.contains("/stats") && PAGE.contains("/stats/series"));
        for external in ["http://", "https://", "//cdn", "<link"] {
            assert!(!PAGE.contains(external), "{external}");
        }
    }
}
