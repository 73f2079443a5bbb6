//! What the records say, as one [`Report`]: per route and model the figures' percentiles,
//! goodput and attainment; the bend (latency and output tokens/s against concurrency at
//! arrival, its knee found by `bench`'s own rule); a latency timeline; the failed requests by
//! reason; the pods of each deployment and whether the slowest requests or the violations
//! concentrate on one of them; and the slowest requests with their causes. The JSON output is
//! this structure serialized, so its field names are the documented shape.
//!
//! When the records name more than one deployment, every route and model is a section per
//! deployment: two deployments serving a route `chat` are two services with their own speeds.
//! Records that name no deployment (an older proxy's) then form sections of their own; with one
//! deployment or none they all share the route's.
//!
//! The records stream through [`Fold`] once and are never all held: each is folded into bounded
//! summaries and dropped. What is kept, whatever the number of records:
//!
//! - per deployment, route and model: counts, and sketches ([`Quantiles`], the live view's
//!   DDSketch, within 1 % relative) of each figure; per concurrency level (at most 16 exact
//!   levels and one per power of two above) counts, sums and TTFT and E2E sketches; a timeline of
//!   at most [`TIMELINE_POINTS`] time buckets, each with a TTFT and an E2E sketch;
//! - per deployment and pod: counts and an E2E sketch ([`pods::Tally`]);
//! - the `--slowest` N slowest requests (a bounded heap);
//! - per failure reason (at most [`FAILURE_REASONS`]) a count and the first
//!   [`FAILURE_EXAMPLES`] requests.
//!
//! So memory grows with the number of groups, pods and failure reasons (the fleet's shape), never
//! with the number of records. Percentiles are within the sketch's 1 % of the exact ones; counts,
//! sums, attainment and goodput are exact.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};
use std::time::{Duration, UNIX_EPOCH};

use serde::Serialize;

use crate::tools::bench::report::{knee, LevelReport, Load, Percentiles};
use crate::tools::bench::Target;
use crate::Config;

use super::cause::{self, Baseline, Cause};
use super::figures::{ms, round, Quantiles, Spread, RELATIVE_ACCURACY};
use super::pods::{self, Pods};
use super::read::{Fields, Loaded, Request, Source};

/// Bumped when a field of the JSON output changes meaning or goes away (adding one does not).
pub const REPORT_VERSION: u32 = 1;
/// A concurrency level with fewer requests is shown but not judged for the bend: its p99 would
/// be one request.
pub const MIN_LEVEL_REQUESTS: usize = crate::tools::bench::report::MIN_LEVEL_SAMPLE;
/// Concurrency levels are exact up to here, then powers of two (17-32, 33-64, ...).
const EXACT_LEVELS: u64 = 16;
/// How many malformed lines the report itself lists.
const LISTED_PROBLEMS: usize = 5;
/// A group's timeline holds at most this many time buckets: a minute each while the records
/// span less than that many minutes, then twice as wide each time they would not fit.
pub const TIMELINE_POINTS: usize = 120;
/// The narrowest time bucket of a timeline, in seconds.
const TIMELINE_BUCKET_S: f64 = 60.0;
/// The failed requests kept per reason, as read (the first ones) ...
pub const FAILURE_EXAMPLES: usize = 5;
/// ... and the reasons told apart; failures of any further reason are counted together.
pub const FAILURE_REASONS: usize = 50;
/// Everything the report says; `--format json` prints exactly this.
#[derive(Debug, Serialize)]
pub struct Report {
    pub report_version: u32,
    pub files: Vec<Source>,
    /// Records read, over all files.
    pub records: usize,
    pub malformed: Malformed,
    /// How far a percentile may be from the exact one, relative (the sketch's accuracy).
    pub percentile_relative_error: f64,
    /// The first request's `ts` and the last request's end, RFC 3339.
    pub start: String,
    pub end: String,
    pub span_s: f64,
    /// Whether the groups are split by deployment: the records name more than one.
    pub by_deployment: bool,
    /// Worst first: lowest attainment against the objective (against 100 % without one), then
    /// the largest share of errors; groups with no SLO judged after those with one.
    pub groups: Vec<Group>,
    /// The bend against `in_flight_total` (in flight in the whole proxy), when records carry it.
    pub bend_total: Option<Bend>,
    /// Per deployment (one entry for all records unless `by_deployment`), its pods and whether
    /// the slowest requests or the violations concentrate on one; empty when no record names
    /// a pod.
    pub pods: Vec<Pods>,
    pub slowest: Vec<Slow>,
    /// The requests whose outcome was not `ok`, by reason.
    pub failures: Failures,
}

/// Lines that were not records: how many, and the first few as `FILE:LINE: problem`.
#[derive(Debug, Serialize)]
pub struct Malformed {
    pub count: usize,
    pub first: Vec<String>,
}

/// One route and model (of one deployment, when the report is split by deployment).
#[derive(Debug, Serialize)]
pub struct Group {
    /// `namespace/deployment` or the deployment alone; `None` unless the report is split by
    /// deployment, and for records that name none.
    pub deployment: Option<String>,
    pub route: String,
    pub model: Option<String>,
    pub requests: usize,
    /// Requests whose outcome was not `ok`; the percentiles are over the others.
    pub errors: usize,
    pub ttft_ms: Spread,
    pub tpot_ms: Spread,
    pub max_itl_ms: Spread,
    pub e2e_ms: Spread,
    pub prompt_tokens: Spread,
    pub output_tokens: Spread,
    /// Requests the proxy judged against the route's SLO (the record's `slo` field).
    pub good: usize,
    pub violated: usize,
    /// Good requests per second over the whole report's span.
    pub goodput_per_s: Option<f64>,
    /// From the group's first request to the end of its last, in seconds: its active time.
    pub active_s: f64,
    /// Good requests per second of the group's active time: its rate while it had traffic (a
    /// route that ran for a minute of an hour is not diluted by the other 59).
    pub goodput_per_active_s: Option<f64>,
    /// good / (good + violated); `None` when the route has no SLO.
    pub attainment: Option<f64>,
    /// The route's SLO from `--config`, when given and the route is in it.
    pub slo: Option<SloShown>,
    pub bend: Bend,
    /// TTFT and E2E over the records' time, per time bucket.
    pub timeline: Timeline,
    /// Successful requests' TTFTs, for the histogram.
    #[serde(skip)]
    pub ttft: Quantiles,
    #[serde(skip)]
    pub baseline: Baseline,
}

/// A route's thresholds as its configuration states them.
#[derive(Debug, Serialize)]
pub struct SloShown {
    pub ttft_ms: Option<f64>,
    pub tpot_ms: Option<f64>,
    pub e2e_ms: Option<f64>,
    pub max_itl_ms: Option<f64>,
    pub objective: Option<f64>,
}

/// Latency and throughput against concurrency at arrival.
#[derive(Debug, Serialize)]
pub struct Bend {
    /// The record field the levels count: `in_flight` (the route) or `in_flight_total`.
    pub by: &'static str,
    pub levels: Vec<Level>,
    pub knee: Option<Knee>,
    /// The finding in words.
    pub verdict: String,
}

/// The requests that arrived at one concurrency level.
#[derive(Debug, Serialize)]
pub struct Level {
    /// `3`, or `17-32` past 16.
    pub concurrency: String,
    pub low: u64,
    pub high: u64,
    pub requests: usize,
    /// Whether it had enough requests ([`MIN_LEVEL_REQUESTS`]) to take part in finding the knee.
    pub judged: bool,
    pub ttft_p50_ms: Option<f64>,
    pub ttft_p99_ms: Option<f64>,
    pub e2e_p99_ms: Option<f64>,
    /// Little's law: mean concurrency × the level's output tokens ÷ its E2E seconds.
    pub output_tokens_per_s: Option<f64>,
}

/// Where the curve bends: past `concurrency`, output tokens/s stops growing while p99 TTFT rises.
#[derive(Debug, Serialize)]
pub struct Knee {
    pub concurrency: String,
    pub high: u64,
    /// The next judged level, where it shows.
    pub next: String,
    pub throughput_growth: f64,
    pub ttft_p99_ms: [f64; 2],
}

/// One of the slowest requests.
#[derive(Debug, Serialize)]
pub struct Slow {
    pub file: String,
    pub line: u64,
    pub ts: String,
    pub request_id: Option<String>,
    /// Who served it, when the record says.
    pub deployment: Option<String>,
    pub pod: Option<String>,
    pub route: String,
    pub model: Option<String>,
    pub outcome: Option<String>,
    pub e2e_ms: f64,
    pub ttft_ms: Option<f64>,
    pub prompt_tokens: Option<u64>,
    pub output_tokens: Option<u64>,
    pub in_flight: Option<i64>,
    /// Most telling first.
    pub causes: Vec<Cause>,
}

/// A group's latency over time.
#[derive(Debug, Serialize)]
pub struct Timeline {
    /// The width of each bucket, in seconds (a minute, or wider for a long span).
    pub bucket_s: f64,
    /// Buckets that hold requests, oldest first.
    pub points: Vec<Point>,
}

/// The requests that arrived in one time bucket; the percentiles are over the successful ones.
#[derive(Debug, Serialize)]
pub struct Point {
    /// The bucket's start, RFC 3339, and as seconds since the Unix epoch.
    pub start: String,
    pub at_s: f64,
    pub requests: usize,
    pub errors: usize,
    pub ttft_p50_ms: Option<f64>,
    pub ttft_p99_ms: Option<f64>,
    pub e2e_p50_ms: Option<f64>,
    pub e2e_p99_ms: Option<f64>,
}

/// The failed requests (outcome not `ok`): how many, and by reason.
#[derive(Debug, Serialize)]
pub struct Failures {
    pub count: usize,
    /// Most frequent first.
    pub reasons: Vec<FailureReason>,
}

/// The failures of one reason: outcome, status and the proxy's reason, in words.
#[derive(Debug, Serialize)]
pub struct FailureReason {
    /// `outcome error, status 502, upstream_reset`; `other reasons` for failures past the
    /// [`FAILURE_REASONS`] reasons told apart.
    pub reason: String,
    pub count: usize,
    /// The first of them, as read (at most [`FAILURE_EXAMPLES`]).
    pub first: Vec<Failed>,
}

/// One failed request.
#[derive(Clone, Debug, Serialize)]
pub struct Failed {
    pub file: String,
    pub line: u64,
    pub ts: String,
    pub request_id: Option<String>,
    pub deployment: Option<String>,
    pub pod: Option<String>,
    pub route: String,
    pub model: Option<String>,
    pub e2e_ms: f64,
}

/// Which concurrency a bend counts.
#[derive(Clone, Copy)]
enum By {
    Route,
    Total,
}

impl By {
    fn field(self) -> &'static str {
        match self {
            By::Route => "in_flight",
            By::Total => "in_flight_total",
        }
    }

    fn words(self) -> &'static str {
        match self {
            By::Route => "in flight on the route",
            By::Total => "in flight in the proxy",
        }
    }
}

/// The level a concurrency falls in: itself up to 16, then (2^k/2, 2^k].
fn level_of(in_flight: i64) -> Option<(u64, u64)> {
    let c = u64::try_from(in_flight).ok().filter(|&c| c >= 1)?;
    if c <= EXACT_LEVELS {
        Some((c, c))
    } else {
        let high = c.checked_next_power_of_two()?;
        Some((high / 2 + 1, high))
    }
}

fn label(low: u64, high: u64) -> String {
    if low == high {
        low.to_string()
    } else {
        format!("{low}-{high}")
    }
}

/// A duration in whole microseconds (what records hold), so that sums do not depend on the
/// order the records came in.
fn micros(ms: f64) -> u64 {
    (ms * 1000.0).round() as u64
}

/// The successful requests that arrived at one concurrency level.
#[derive(Clone, Debug, Default)]
struct LevelTally {
    requests: usize,
    concurrency: i64,
    output_tokens: u64,
    e2e_us: u64,
    ttft: Quantiles,
    e2e: Quantiles,
}

impl LevelTally {
    fn merge(&mut self, o: &LevelTally) {
        self.requests += o.requests;
        self.concurrency += o.concurrency;
        self.output_tokens += o.output_tokens;
        self.e2e_us += o.e2e_us;
        self.ttft.merge(&o.ttft);
        self.e2e.merge(&o.e2e);
    }

    fn level(&self, (low, high): (u64, u64)) -> Level {
        let ttft = self.ttft.spread();
        let concurrency = self.concurrency as f64 / self.requests.max(1) as f64;
        let seconds = self.e2e_us as f64 / 1e6;
        Level {
            concurrency: label(low, high),
            low,
            high,
            requests: self.requests,
            judged: self.requests >= MIN_LEVEL_REQUESTS,
            ttft_p50_ms: ttft.p50,
            ttft_p99_ms: ttft.p99,
            e2e_p99_ms: self.e2e.spread().p99,
            output_tokens_per_s: (seconds > 0.0)
                .then(|| round(concurrency * self.output_tokens as f64 / seconds)),
        }
    }
}

/// The levels of one bend as the records stream past.
#[derive(Clone, Debug, Default)]
struct Levels(BTreeMap<(u64, u64), LevelTally>);

impl Levels {
    /// A successful request that arrived with `in_flight` in flight; false when it has no level.
    fn add(&mut self, in_flight: Option<i64>, f: &Fields) -> bool {
        let Some((n, level)) = in_flight.and_then(|n| Some((n, level_of(n)?))) else {
            return false;
        };
        let l = self.0.entry(level).or_default();
        l.requests += 1;
        l.concurrency += n;
        l.output_tokens += f.output_tokens.unwrap_or(0);
        l.e2e_us += micros(f.e2e_ms);
        if let Some(t) = f.ttft_ms {
            l.ttft.add(t);
        }
        l.e2e.add(f.e2e_ms);
        true
    }

    fn merge(&mut self, o: &Levels) {
        for (level, tally) in &o.0 {
            self.0.entry(*level).or_default().merge(tally);
        }
    }

    fn bend(&self, by: By) -> Bend {
        let levels: Vec<Level> = self.0.iter().map(|(&at, l)| l.level(at)).collect();
        let judged: Vec<&Level> = levels.iter().filter(|l| l.judged).collect();
        let knee = find_knee(&judged);
        let verdict = match &knee {
            Some(k) => format!(
                "past {} {}, output tokens/s grows by {:+.0} % (the added load brings under a third of its share) while p99 TTFT rises from {} to {}",
                k.concurrency,
                by.words(),
                k.throughput_growth * 100.0,
                ms(k.ttft_p99_ms[0]),
                ms(k.ttft_p99_ms[1]),
            ),
            None if judged.len() < 2 => format!(
                "too few concurrency levels with {MIN_LEVEL_REQUESTS} or more requests to tell"
            ),
            None => format!(
                "none: output tokens/s keeps growing, or p99 TTFT does not rise, up to {} {}",
                judged.last().map_or(String::new(), |l| l.concurrency.clone()),
                by.words()
            ),
        };
        Bend {
            by: by.field(),
            levels,
            knee,
            verdict,
        }
    }
}

/// One time bucket of a timeline.
#[derive(Clone, Debug, Default)]
struct PointTally {
    requests: usize,
    errors: usize,
    ttft: Quantiles,
    e2e: Quantiles,
}

impl PointTally {
    fn merge(&mut self, o: &PointTally) {
        self.requests += o.requests;
        self.errors += o.errors;
        self.ttft.merge(&o.ttft);
        self.e2e.merge(&o.e2e);
    }
}

/// A timeline as the records stream past: buckets keyed by `⌊at / width⌋`; when they would be
/// more than [`TIMELINE_POINTS`], the width doubles and neighbours merge, so it never holds more
/// (the records of several files come in any order, so the span is not known in advance).
#[derive(Clone, Debug)]
struct TimelineTally {
    width: f64,
    buckets: BTreeMap<i64, PointTally>,
}

impl Default for TimelineTally {
    fn default() -> Self {
        TimelineTally {
            width: TIMELINE_BUCKET_S,
            buckets: BTreeMap::new(),
        }
    }
}

impl TimelineTally {
    fn add(&mut self, at: f64, f: &Fields, ok: bool) {
        let key = (at / self.width).floor() as i64;
        let p = self.buckets.entry(key).or_default();
        p.requests += 1;
        if ok {
            if let Some(t) = f.ttft_ms {
                p.ttft.add(t);
            }
            p.e2e.add(f.e2e_ms);
        } else {
            p.errors += 1;
        }
        self.fit();
    }

    fn coarsen(&mut self) {
        let buckets = std::mem::take(&mut self.buckets);
        self.width *= 2.0;
        for (key, p) in buckets {
            self.buckets.entry(key.div_euclid(2)).or_default().merge(&p);
        }
    }

    fn fit(&mut self) {
        while self.buckets.len() > TIMELINE_POINTS {
            self.coarsen();
        }
    }

    fn merge(&mut self, o: &TimelineTally) {
        let mut o = o.clone();
        while o.width < self.width {
            o.coarsen();
        }
        while self.width < o.width {
            self.coarsen();
        }
        for (key, p) in &o.buckets {
            self.buckets.entry(*key).or_default().merge(p);
        }
        self.fit();
    }

    fn timeline(&self) -> Timeline {
        let points = self
            .buckets
            .iter()
            .map(|(&key, p)| {
                let at_s = key as f64 * self.width;
                let (ttft, e2e) = (p.ttft.spread(), p.e2e.spread());
                Point {
                    start: rfc3339(at_s),
                    at_s,
                    requests: p.requests,
                    errors: p.errors,
                    ttft_p50_ms: ttft.p50,
                    ttft_p99_ms: ttft.p99,
                    e2e_p50_ms: e2e.p50,
                    e2e_p99_ms: e2e.p99,
                }
            })
            .collect();
        Timeline {
            bucket_s: self.width,
            points,
        }
    }
}

/// One route and model (of one deployment) as the records stream past.
#[derive(Clone, Debug)]
struct GroupTally {
    requests: usize,
    errors: usize,
    good: usize,
    violated: usize,
    first: f64,
    last_end: f64,
    ttft: Quantiles,
    tpot: Quantiles,
    max_itl: Quantiles,
    e2e: Quantiles,
    prompt: Quantiles,
    output: Quantiles,
    // What the causes compare a request against (see `cause::Baseline`).
    in_flight: Quantiles,
    prefill: Quantiles,
    proxy: Quantiles,
    connect: Quantiles,
    cached_share: Quantiles,
    /// TTFTs of successful requests without a concurrency level: never counted as queued.
    unlevelled_ttft: Quantiles,
    levels: Levels,
    timeline: TimelineTally,
}

impl Default for GroupTally {
    fn default() -> Self {
        GroupTally {
            requests: 0,
            errors: 0,
            good: 0,
            violated: 0,
            first: f64::INFINITY,
            last_end: f64::NEG_INFINITY,
            ttft: Quantiles::default(),
            tpot: Quantiles::default(),
            max_itl: Quantiles::default(),
            e2e: Quantiles::default(),
            prompt: Quantiles::default(),
            output: Quantiles::default(),
            in_flight: Quantiles::default(),
            prefill: Quantiles::default(),
            proxy: Quantiles::default(),
            connect: Quantiles::default(),
            cached_share: Quantiles::default(),
            unlevelled_ttft: Quantiles::default(),
            levels: Levels::default(),
            timeline: TimelineTally::default(),
        }
    }
}

impl GroupTally {
    fn add(&mut self, r: &Request) {
        let f = &r.fields;
        let ok = r.ok();
        self.requests += 1;
        self.first = self.first.min(r.at);
        self.last_end = self.last_end.max(r.at + f.e2e_ms / 1000.0);
        match f.slo.as_deref() {
            Some("good") => self.good += 1,
            Some("violated") => self.violated += 1,
            _ => {}
        }
        self.timeline.add(r.at, f, ok);
        if !ok {
            self.errors += 1;
            return;
        }
        let add = |q: &mut Quantiles, v: Option<f64>| {
            if let Some(v) = v {
                q.add(v);
            }
        };
        add(&mut self.ttft, f.ttft_ms);
        add(&mut self.tpot, f.tpot_ms);
        add(&mut self.max_itl, f.max_itl_ms);
        add(&mut self.e2e, Some(f.e2e_ms));
        add(&mut self.prompt, f.prompt_tokens.map(|n| n as f64));
        add(&mut self.output, f.output_tokens.map(|n| n as f64));
        add(&mut self.in_flight, f.in_flight.map(|n| n as f64));
        add(&mut self.prefill, f.engine_prefill_ms);
        add(&mut self.proxy, f.proxy_ms);
        add(&mut self.connect, f.connect_ms);
        let share = f
            .prompt_tokens
            .filter(|&p| p > 0)
            .and_then(|p| Some(f.cached_tokens? as f64 / p as f64));
        add(&mut self.cached_share, share);
        if !self.levels.add(f.in_flight, f) {
            add(&mut self.unlevelled_ttft, f.ttft_ms);
        }
    }

    fn merge(&mut self, o: &GroupTally) {
        self.requests += o.requests;
        self.errors += o.errors;
        self.good += o.good;
        self.violated += o.violated;
        self.first = self.first.min(o.first);
        self.last_end = self.last_end.max(o.last_end);
        for (mine, theirs) in [
            (&mut self.ttft, &o.ttft),
            (&mut self.tpot, &o.tpot),
            (&mut self.max_itl, &o.max_itl),
            (&mut self.e2e, &o.e2e),
            (&mut self.prompt, &o.prompt),
            (&mut self.output, &o.output),
            (&mut self.in_flight, &o.in_flight),
            (&mut self.prefill, &o.prefill),
            (&mut self.proxy, &o.proxy),
            (&mut self.connect, &o.connect),
            (&mut self.cached_share, &o.cached_share),
            (&mut self.unlevelled_ttft, &o.unlevelled_ttft),
        ] {
            mine.merge(theirs);
        }
        self.levels.merge(&o.levels);
        self.timeline.merge(&o.timeline);
    }

    /// What is typical on the group, given where it bends: the median TTFT is over the
    /// successful requests at or below the bend (all of them without one) and those with no
    /// concurrency at arrival.
    fn baseline(&self, knee: Option<u64>) -> Baseline {
        let mut unqueued = self.unlevelled_ttft.clone();
        for (&(_, high), l) in &self.levels.0 {
            if knee.is_none_or(|k| high <= k) {
                unqueued.merge(&l.ttft);
            }
        }
        Baseline {
            knee,
            in_flight_p50: self.in_flight.spread().p50,
            typical_ttft: unqueued.spread().p50,
            prompt: self.prompt.spread(),
            output: self.output.spread(),
            tpot: self.tpot.spread(),
            prefill: self.prefill.spread(),
            proxy_p50: self.proxy.spread().p50,
            connect_p50: self.connect.spread().p50,
            cached_share_p50: self.cached_share.spread().p50,
        }
    }

    fn group(
        &self,
        (deployment, route, model): Key,
        span_s: f64,
        config: Option<&Config>,
    ) -> Group {
        let bend = self.levels.bend(By::Route);
        let baseline = self.baseline(bend.knee.as_ref().map(|k| k.high));
        let (good, violated) = (self.good, self.violated);
        let active_s = if self.last_end > self.first {
            self.last_end - self.first
        } else {
            0.0
        };
        Group {
            slo: slo_of(config, &route),
            deployment,
            route,
            model,
            requests: self.requests,
            errors: self.errors,
            ttft_ms: self.ttft.spread(),
            tpot_ms: self.tpot.spread(),
            max_itl_ms: self.max_itl.spread(),
            e2e_ms: self.e2e.spread(),
            prompt_tokens: self.prompt.spread(),
            output_tokens: self.output.spread(),
            good,
            violated,
            goodput_per_s: (span_s > 0.0).then(|| round(good as f64 / span_s)),
            active_s: round(active_s),
            goodput_per_active_s: (active_s > 0.0).then(|| round(good as f64 / active_s)),
            attainment: (good + violated > 0)
                .then(|| (good as f64 / (good + violated) as f64 * 1e6).round() / 1e6),
            bend,
            timeline: self.timeline.timeline(),
            ttft: self.ttft.clone(),
            baseline,
        }
    }
}

/// `bench`'s closed-loop rule on the judged levels: each level becomes the `LevelReport` that
/// rule reads (its concurrency, output tokens/s and TTFT percentiles), so a sweep and a day of
/// production traffic bend by the same definition.
fn find_knee(judged: &[&Level]) -> Option<Knee> {
    let as_sweep: Vec<LevelReport> = judged
        .iter()
        .map(|l| {
            let concurrency = u32::try_from(l.high).unwrap_or(u32::MAX);
            LevelReport {
                load: Load::Concurrency(concurrency),
                concurrency,
                target: Target::A,
                capped: 0,
                max_in_flight: 0,
                records: Vec::new(),
                wall: Duration::ZERO,
                requests_per_s: 0.0,
                output_tokens_per_s: l.output_tokens_per_s.unwrap_or(0.0),
                ttft: Percentiles {
                    p50: l.ttft_p50_ms,
                    p95: None,
                    p99: l.ttft_p99_ms,
                },
                tpot: Percentiles::default(),
                itl: Percentiles::default(),
                e2e: Percentiles::default(),
                errors: 0,
                good: 0,
                goodput: 0.0,
                attainment: 0.0,
            }
        })
        .collect();
    let found = knee(&as_sweep)?;
    let at = as_sweep.iter().position(|l| l.load == found.load)?;
    let (level, next) = (judged[at], judged.get(at + 1)?);
    Some(Knee {
        concurrency: level.concurrency.clone(),
        high: level.high,
        next: next.concurrency.clone(),
        throughput_growth: round(found.throughput_growth),
        ttft_p99_ms: [found.ttft_p99.0, found.ttft_p99.1],
    })
}

fn slo_of(config: Option<&Config>, route: &str) -> Option<SloShown> {
    let slo = config?.routes.iter().find(|r| r.name == route)?.slo?;
    let ms = |d: Option<Duration>| d.map(|d| d.as_secs_f64() * 1000.0);
    Some(SloShown {
        ttft_ms: ms(slo.ttft),
        tpot_ms: ms(slo.tpot),
        e2e_ms: ms(slo.e2e),
        max_itl_ms: ms(slo.max_itl),
        objective: slo.objective,
    })
}

/// What a group is keyed by: deployment (when split), route, model.
type Key = (Option<String>, String, Option<String>);

fn rfc3339(seconds: f64) -> String {
    let at = UNIX_EPOCH + Duration::from_secs_f64(seconds.max(0.0));
    humantime::format_rfc3339_millis(at).to_string()
}

/// A request kept among the slowest, ordered so that the heap's top is the one to drop first:
/// the fastest, and of equal E2E the one read last (as a stable sort by E2E would keep the
/// earlier one).
struct Kept(Request);

impl Kept {
    fn rank(&self, other: &Kept) -> Ordering {
        other
            .0
            .fields
            .e2e_ms
            .total_cmp(&self.0.fields.e2e_ms)
            .then((self.0.file, self.0.line).cmp(&(other.0.file, other.0.line)))
    }
}

impl PartialEq for Kept {
    fn eq(&self, other: &Self) -> bool {
        self.rank(other) == Ordering::Equal
    }
}
impl Eq for Kept {}
impl PartialOrd for Kept {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Kept {
    fn cmp(&self, other: &Self) -> Ordering {
        self.rank(other)
    }
}

/// The failures of one reason as the records stream past; `file` of each example is an index
/// into the sources until the end.
#[derive(Default)]
struct FailureTally {
    count: usize,
    first: Vec<(usize, Failed)>,
}

/// Everything the report keeps while the records stream past; see the module doc for what it
/// holds and why it is bounded. [`Fold::add`] takes each record, [`Fold::finish`] builds the
/// report.
pub struct Fold {
    slowest: usize,
    kept: BinaryHeap<Kept>,
    groups: BTreeMap<Key, GroupTally>,
    deployments: BTreeSet<String>,
    pods: BTreeMap<Option<String>, pods::Tally>,
    total: Levels,
    any_total: bool,
    start: f64,
    end: f64,
    failures: BTreeMap<String, FailureTally>,
    other_failures: FailureTally,
    failed: usize,
}

impl Fold {
    /// A fold that keeps the `slowest` slowest requests to explain.
    pub fn new(slowest: usize) -> Fold {
        Fold {
            slowest,
            kept: BinaryHeap::with_capacity(slowest.saturating_add(1).min(1 << 16)),
            groups: BTreeMap::new(),
            deployments: BTreeSet::new(),
            pods: BTreeMap::new(),
            total: Levels::default(),
            any_total: false,
            start: f64::INFINITY,
            end: f64::NEG_INFINITY,
            failures: BTreeMap::new(),
            other_failures: FailureTally::default(),
            failed: 0,
        }
    }

    /// Folds in one record.
    pub fn add(&mut self, r: Request) {
        let f = &r.fields;
        let deployment = f.deployment();
        self.start = self.start.min(r.at);
        self.end = self.end.max(r.at + f.e2e_ms / 1000.0);
        if let Some(d) = &deployment {
            if !self.deployments.contains(d) {
                self.deployments.insert(d.clone());
            }
        }
        let key: Key = (deployment, f.route.clone(), f.model.clone());
        let ok = r.ok();
        if ok {
            self.any_total |= f.in_flight_total.is_some();
            self.total.add(f.in_flight_total, f);
        }
        if !ok {
            self.fail(&r);
        }
        match self.pods.get_mut(&key.0) {
            Some(tally) => tally.add(f),
            None => self.pods.entry(key.0.clone()).or_default().add(f),
        }
        self.groups.entry(key).or_default().add(&r);
        if self.slowest > 0 {
            let r = Kept(r);
            if self.kept.len() < self.slowest {
                self.kept.push(r);
            } else if self.kept.peek().is_some_and(|top| r < *top) {
                self.kept.pop();
                self.kept.push(r);
            }
        }
    }

    fn fail(&mut self, r: &Request) {
        self.failed += 1;
        let reason = cause::failure(&r.fields);
        let tally = if self.failures.contains_key(&reason) || self.failures.len() < FAILURE_REASONS
        {
            self.failures.entry(reason).or_default()
        } else {
            &mut self.other_failures
        };
        tally.count += 1;
        if tally.first.len() < FAILURE_EXAMPLES {
            let f = &r.fields;
            tally.first.push((
                r.file,
                Failed {
                    file: String::new(),
                    line: r.line,
                    ts: f.ts.clone(),
                    request_id: f.request_id.clone(),
                    deployment: f.deployment(),
                    pod: f.pod().map(String::from),
                    route: f.route.clone(),
                    model: f.model.clone(),
                    e2e_ms: f.e2e_ms,
                },
            ));
        }
    }

    /// The report over everything folded in (at least one record), with the slowest requests
    /// explained and, with a configuration, each route's SLO beside its figures.
    pub fn finish(self, loaded: &Loaded, config: Option<&Config>) -> Report {
        let span_s = if self.start.is_finite() && self.end > self.start {
            self.end - self.start
        } else {
            0.0
        };
        let by_deployment = self.deployments.len() > 1;
        // Without a split, the groups of the one deployment (if any) and of the records that
        // name none are one group per route and model.
        let mut tallies: BTreeMap<Key, GroupTally> = BTreeMap::new();
        for ((deployment, route, model), tally) in self.groups {
            let key = (deployment.filter(|_| by_deployment), route, model);
            match tallies.get_mut(&key) {
                Some(mine) => mine.merge(&tally),
                None => {
                    tallies.insert(key, tally);
                }
            }
        }
        let mut groups: Vec<Group> = tallies
            .into_iter()
            .map(|(key, tally)| tally.group(key, span_s, config))
            .collect();
        groups.sort_by(worst_first);

        // Pods are compared within their deployment; without a split, the one deployment the
        // records name (if any) is all of them.
        let mut pod_tallies: BTreeMap<Option<String>, pods::Tally> = BTreeMap::new();
        for (deployment, tally) in self.pods {
            let deployment = if by_deployment {
                deployment
            } else {
                self.deployments.first().cloned()
            };
            pod_tallies.entry(deployment).or_default().merge(&tally);
        }
        let pods: Vec<Pods> = pod_tallies
            .iter()
            .filter_map(|(deployment, tally)| pods::of(deployment.clone(), tally))
            .collect();
        let bend_total = self.any_total.then(|| self.total.bend(By::Total));

        let path = |file: usize| {
            loaded
                .sources
                .get(file)
                .map_or_else(String::new, |s| s.path.clone())
        };
        let slowest = self
            .kept
            .into_sorted_vec()
            .into_iter()
            .map(|Kept(r)| {
                let f = &r.fields;
                let deployment = f.deployment();
                let group = groups.iter().find(|g| {
                    g.deployment == deployment.clone().filter(|_| by_deployment)
                        && g.route == f.route
                        && g.model == f.model
                });
                let causes =
                    cause::explain(&r, group.map_or(&Baseline::default(), |g| &g.baseline));
                Slow {
                    file: path(r.file),
                    line: r.line,
                    ts: f.ts.clone(),
                    request_id: f.request_id.clone(),
                    deployment,
                    pod: f.pod().map(String::from),
                    route: f.route.clone(),
                    model: f.model.clone(),
                    outcome: f.outcome.clone(),
                    e2e_ms: f.e2e_ms,
                    ttft_ms: f.ttft_ms,
                    prompt_tokens: f.prompt_tokens,
                    output_tokens: f.output_tokens,
                    in_flight: f.in_flight,
                    causes,
                }
            })
            .collect();

        let mut reasons: Vec<FailureReason> = self
            .failures
            .into_iter()
            .chain(
                (self.other_failures.count > 0)
                    .then(|| ("other reasons".to_string(), self.other_failures)),
            )
            .map(|(reason, tally)| FailureReason {
                reason,
                count: tally.count,
                first: tally
                    .first
                    .into_iter()
                    .map(|(file, mut failed)| {
                        failed.file = path(file);
                        failed
                    })
                    .collect(),
            })
            .collect();
        reasons.sort_by(|a, b| b.count.cmp(&a.count).then(a.reason.cmp(&b.reason)));

        Report {
            report_version: REPORT_VERSION,
            files: loaded.sources.clone(),
            records: loaded.records,
            malformed: Malformed {
                count: loaded.malformed,
                first: loaded
                    .problems
                    .iter()
                    .take(LISTED_PROBLEMS)
                    .map(ToString::to_string)
                    .collect(),
            },
            percentile_relative_error: RELATIVE_ACCURACY,
            start: rfc3339(self.start),
            end: rfc3339(self.end),
            span_s: round(span_s),
            by_deployment,
            groups,
            bend_total,
            pods,
            slowest,
            failures: Failures {
                count: self.failed,
                reasons,
            },
        }
    }
}

/// How far a group is from its objective: attainment minus the objective (minus 100 % without
/// one); `None` when no request of it was judged.
pub fn margin(g: &Group) -> Option<f64> {
    let objective = g.slo.as_ref().and_then(|s| s.objective).unwrap_or(1.0);
    g.attainment.map(|a| a - objective)
}

/// The share of a group's requests that failed.
pub fn error_share(g: &Group) -> f64 {
    g.errors as f64 / g.requests.max(1) as f64
}

/// Worst first: the lowest margin to the objective, then the largest share of errors; groups
/// judged against no SLO after those that were; then by name, so the order is stable.
fn worst_first(a: &Group, b: &Group) -> Ordering {
    let by_margin = match (margin(a), margin(b)) {
        (Some(x), Some(y)) => x.total_cmp(&y),
        (Some(_), None) => Ordering::Less,
        (None, Some(_)) => Ordering::Greater,
        (None, None) => Ordering::Equal,
    };
    by_margin
        .then(error_share(b).total_cmp(&error_share(a)))
        .then_with(|| (&a.deployment, &a.route, &a.model).cmp(&(&b.deployment, &b.route, &b.model)))
}

/// The report over every record of `paths`, streamed: the files are read once, each record
/// folded in and dropped.
pub fn build(
    paths: &[impl AsRef<std::path::Path>],
    slowest: usize,
    config: Option<&Config>,
) -> Result<(Loaded, Option<Report>), String> {
    let mut fold = Fold::new(slowest);
    let loaded = super::read::stream(paths, |r| fold.add(r))?;
    let report = (loaded.records > 0).then(|| fold.finish(&loaded, config));
    Ok((loaded, report))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_are_exact_to_16_then_powers_of_two() {
        assert_eq!(level_of(0), None);
        assert_eq!(level_of(1), Some((1, 1)));
        assert_eq!(level_of(16), Some((16, 16)));
        assert_eq!(level_of(17), Some((17, 32)));
        assert_eq!(level_of(32), Some((17, 32)));
        assert_eq!(level_of(33), Some((33, 64)));
        assert_eq!(label(17, 32), "17-32");
    }

    fn request(i: usize, at: f64, e2e_ms: f64) -> Request {
        Request {
            file: 0,
            line: i as u64 + 1,
            at,
            fields: Fields {
                ts: "2026-01-01T00:00:00Z".into(),
                route: "chat".into(),
                e2e_ms,
                ttft_ms: Some(e2e_ms / 10.0),
                in_flight: Some((i % 40) as i64 + 1),
                output_tokens: Some(50),
                ..Fields::default()
            },
        }
    }

    #[test]
    fn the_timeline_never_holds_more_than_its_points_and_keeps_every_request() {
        let mut t = TimelineTally::default();
        // Ten days, one request every 7 minutes, from two files out of order.
        let n = 10 * 24 * 60 / 7;
        for i in (0..n).rev().chain(0..n) {
            let r = request(i, 1.7e9 + i as f64 * 420.0, 100.0);
            t.add(r.at, &r.fields, true);
            assert!(t.buckets.len() <= TIMELINE_POINTS);
        }
        let timeline = t.timeline();
        assert_eq!(
            timeline.points.iter().map(|p| p.requests).sum::<usize>(),
            2 * n
        );
        assert!(timeline.bucket_s >= 10.0 * 86_400.0 / TIMELINE_POINTS as f64);
        let mut short = TimelineTally::default();
        let r = request(0, 1.7e9, 100.0);
        short.add(r.at, &r.fields, true);
        short.merge(&t);
        assert_eq!(short.width, t.width, "a merge takes the wider buckets");
    }

    #[test]
    fn the_heap_keeps_the_slowest_in_order_and_ties_by_position() {
        let mut fold = Fold::new(3);
        for (i, e2e) in [5.0, 9.0, 1.0, 9.0, 7.0, 2.0].into_iter().enumerate() {
            fold.add(request(i, 1.7e9, e2e));
        }
        let kept: Vec<(f64, u64)> = fold
            .kept
            .into_sorted_vec()
            .into_iter()
            .map(|k| (k.0.fields.e2e_ms, k.0.line))
            .collect();
        assert_eq!(kept, [(9.0, 2), (9.0, 4), (7.0, 5)]);
    }
}
