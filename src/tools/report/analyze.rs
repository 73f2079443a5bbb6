//! What the records say, as one [`Report`]: per route and model the figures' percentiles,
//! goodput and attainment; the bend (latency and output tokens/s against concurrency at
//! arrival, its knee found by `bench`'s own rule); the pods of each deployment and whether the
//! slowest requests or the violations concentrate on one of them; and the slowest requests with
//! their causes. The JSON output is this structure serialized, so its field names are the
//! documented shape.
//!
//! When the records name more than one deployment, every route and model is a section per
//! deployment: two deployments serving a route `chat` are two services with their own speeds.
//! Records that name no deployment (an older proxy's) then form sections of their own; with one
//! deployment or none they all share the route's.

use std::collections::BTreeMap;
use std::time::{Duration, UNIX_EPOCH};

use serde::Serialize;

use crate::tools::bench::report::{knee, percentile, LevelReport, Load, Percentiles};
use crate::tools::bench::Target;
use crate::Config;

use super::cause::{self, Baseline, Cause};
use super::pods::{self, Pods};
use super::read::{Loaded, Request, Source};

/// Bumped when a field of the JSON output changes meaning or goes away (adding one does not).
pub const REPORT_VERSION: u32 = 1;
/// A concurrency level with fewer requests is shown but not judged for the bend: its p99 would
/// be one request.
pub const MIN_LEVEL_REQUESTS: usize = crate::tools::bench::report::MIN_LEVEL_SAMPLE;
/// Concurrency levels are exact up to here, then powers of two (17-32, 33-64, ...).
const EXACT_LEVELS: u64 = 16;
/// How many malformed lines the report itself lists.
const LISTED_PROBLEMS: usize = 5;

/// p50, p95 and p99 (numpy's linear interpolation), `None` when nothing was measured.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Spread {
    pub p50: Option<f64>,
    pub p95: Option<f64>,
    pub p99: Option<f64>,
}

impl Spread {
    pub fn of(values: impl IntoIterator<Item = f64>) -> Spread {
        let mut sorted: Vec<f64> = values.into_iter().filter(|v| v.is_finite()).collect();
        sorted.sort_by(f64::total_cmp);
        let at = |p| percentile(&sorted, p).map(round);
        Spread {
            p50: at(50.0),
            p95: at(95.0),
            p99: at(99.0),
        }
    }
}

/// To the thousandth (a microsecond, for milliseconds): what records hold, without the float
/// noise that interpolation adds to the JSON.
pub fn round(value: f64) -> f64 {
    (value * 1000.0).round() / 1000.0
}

/// Everything the report says; `--format json` prints exactly this.
#[derive(Debug, Serialize)]
pub struct Report {
    pub report_version: u32,
    pub files: Vec<Source>,
    /// Records read, over all files.
    pub records: usize,
    pub malformed: Malformed,
    /// The first request's `ts` and the last request's end, RFC 3339.
    pub start: String,
    pub end: String,
    pub span_s: f64,
    /// Whether the groups are split by deployment: the records name more than one.
    pub by_deployment: bool,
    pub groups: Vec<Group>,
    /// The bend against `in_flight_total` (in flight in the whole proxy), when records carry it.
    pub bend_total: Option<Bend>,
    /// Per deployment (one entry for all records unless `by_deployment`), its pods and whether
    /// the slowest requests or the violations concentrate on one; empty when no record names
    /// a pod.
    pub pods: Vec<Pods>,
    pub slowest: Vec<Slow>,
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
    /// good / (good + violated); `None` when the route has no SLO.
    pub attainment: Option<f64>,
    /// The route's SLO from `--config`, when given and the route is in it.
    pub slo: Option<SloShown>,
    pub bend: Bend,
    /// Successful requests' TTFTs, sorted, for the histogram.
    #[serde(skip)]
    pub ttft_samples: Vec<f64>,
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

/// Which concurrency a bend counts.
#[derive(Clone, Copy)]
enum By {
    Route,
    Total,
}

impl By {
    fn of(self, r: &Request) -> Option<i64> {
        match self {
            By::Route => r.fields.in_flight,
            By::Total => r.fields.in_flight_total,
        }
    }

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

fn bend(requests: &[&Request], by: By) -> Bend {
    let mut at: BTreeMap<(u64, u64), Vec<&Request>> = BTreeMap::new();
    for r in requests.iter().filter(|r| r.ok()) {
        if let Some(level) = by.of(r).and_then(level_of) {
            at.entry(level).or_default().push(r);
        }
    }
    let levels: Vec<Level> = at
        .iter()
        .map(|(&(low, high), rs)| {
            let ttft = Spread::of(rs.iter().filter_map(|r| r.fields.ttft_ms));
            let concurrency =
                rs.iter().filter_map(|r| by.of(r)).sum::<i64>() as f64 / rs.len() as f64;
            let tokens: u64 = rs.iter().filter_map(|r| r.fields.output_tokens).sum();
            let seconds: f64 = rs.iter().map(|r| r.fields.e2e_ms).sum::<f64>() / 1000.0;
            Level {
                concurrency: label(low, high),
                low,
                high,
                requests: rs.len(),
                judged: rs.len() >= MIN_LEVEL_REQUESTS,
                ttft_p50_ms: ttft.p50,
                ttft_p99_ms: ttft.p99,
                e2e_p99_ms: Spread::of(rs.iter().map(|r| r.fields.e2e_ms)).p99,
                output_tokens_per_s: (seconds > 0.0)
                    .then(|| round(concurrency * tokens as f64 / seconds)),
            }
        })
        .collect();
    let judged: Vec<&Level> = levels.iter().filter(|l| l.judged).collect();
    let knee = find_knee(&judged);
    let verdict = match &knee {
        Some(k) => format!(
            "past {} {}, output tokens/s grows by {:+.0} % (the added load brings under a third of its share) while p99 TTFT rises from {} to {}",
            k.concurrency,
            by.words(),
            k.throughput_growth * 100.0,
            cause::ms(k.ttft_p99_ms[0]),
            cause::ms(k.ttft_p99_ms[1]),
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

fn group(
    (deployment, route, model): Key,
    requests: &[&Request],
    span_s: f64,
    config: Option<&Config>,
) -> Group {
    let ok: Vec<&Request> = requests.iter().copied().filter(|r| r.ok()).collect();
    let spread = |get: fn(&Request) -> Option<f64>| Spread::of(ok.iter().filter_map(|r| get(r)));
    let verdict = |v: &str| {
        requests
            .iter()
            .filter(|r| r.fields.slo.as_deref() == Some(v))
            .count()
    };
    let (good, violated) = (verdict("good"), verdict("violated"));
    let bend = bend(requests, By::Route);
    let baseline = Baseline::of(requests, bend.knee.as_ref().map(|k| k.high));
    let mut ttft_samples: Vec<f64> = ok.iter().filter_map(|r| r.fields.ttft_ms).collect();
    ttft_samples.sort_by(f64::total_cmp);
    Group {
        slo: slo_of(config, &route),
        deployment,
        route,
        model,
        requests: requests.len(),
        errors: requests.len() - ok.len(),
        ttft_ms: spread(|r| r.fields.ttft_ms),
        tpot_ms: spread(|r| r.fields.tpot_ms),
        max_itl_ms: spread(|r| r.fields.max_itl_ms),
        e2e_ms: spread(|r| Some(r.fields.e2e_ms)),
        prompt_tokens: spread(|r| r.fields.prompt_tokens.map(|n| n as f64)),
        output_tokens: spread(|r| r.fields.output_tokens.map(|n| n as f64)),
        good,
        violated,
        goodput_per_s: (span_s > 0.0).then(|| round(good as f64 / span_s)),
        attainment: (good + violated > 0)
            .then(|| (good as f64 / (good + violated) as f64 * 1e6).round() / 1e6),
        bend,
        ttft_samples,
        baseline,
    }
}

fn rfc3339(seconds: f64) -> String {
    let at = UNIX_EPOCH + Duration::from_secs_f64(seconds.max(0.0));
    humantime::format_rfc3339_millis(at).to_string()
}

/// The report over everything `loaded` holds (at least one request), with the `slowest` slowest
/// requests explained and, with a configuration, each route's SLO beside its figures.
pub fn build(loaded: &Loaded, slowest: usize, config: Option<&Config>) -> Report {
    let requests = &loaded.requests;
    let start = requests.iter().map(|r| r.at).fold(f64::INFINITY, f64::min);
    let end = requests
        .iter()
        .map(|r| r.at + r.fields.e2e_ms / 1000.0)
        .fold(f64::NEG_INFINITY, f64::max);
    let span_s = if start.is_finite() && end > start {
        end - start
    } else {
        0.0
    };
    let deployments: std::collections::BTreeSet<String> = requests
        .iter()
        .filter_map(|r| r.fields.deployment())
        .collect();
    let by_deployment = deployments.len() > 1;
    let deployment_of = |r: &Request| r.fields.deployment().filter(|_| by_deployment);
    let key_of = |r: &Request| -> Key {
        (
            deployment_of(r),
            r.fields.route.clone(),
            r.fields.model.clone(),
        )
    };
    let mut by_group: BTreeMap<Key, Vec<&Request>> = BTreeMap::new();
    for r in requests {
        by_group.entry(key_of(r)).or_default().push(r);
    }
    let groups: Vec<Group> = by_group
        .iter()
        .map(|(key, rs)| group(key.clone(), rs, span_s, config))
        .collect();
    // Pods are compared within their deployment; without a split, the one deployment the
    // records name (if any) is all of them.
    let mut by_deployment_requests: BTreeMap<Option<String>, Vec<&Request>> = BTreeMap::new();
    for r in requests {
        let deployment = if by_deployment {
            r.fields.deployment()
        } else {
            deployments.first().cloned()
        };
        by_deployment_requests
            .entry(deployment)
            .or_default()
            .push(r);
    }
    let pods: Vec<Pods> = by_deployment_requests
        .into_iter()
        .filter_map(|(deployment, rs)| pods::of(deployment, &rs))
        .collect();
    let all: Vec<&Request> = requests.iter().collect();
    let bend_total = requests
        .iter()
        .any(|r| r.fields.in_flight_total.is_some())
        .then(|| bend(&all, By::Total));

    let mut order: Vec<&Request> = requests.iter().collect();
    order.sort_by(|a, b| b.fields.e2e_ms.total_cmp(&a.fields.e2e_ms));
    let slowest = order
        .into_iter()
        .take(slowest)
        .map(|r| {
            let f = &r.fields;
            let key = key_of(r);
            let baseline = groups
                .iter()
                .find(|g| (&g.deployment, &g.route, &g.model) == (&key.0, &key.1, &key.2))
                .map(|g| &g.baseline);
            Slow {
                file: loaded.sources[r.file].path.clone(),
                line: r.line,
                ts: f.ts.clone(),
                request_id: f.request_id.clone(),
                deployment: f.deployment(),
                pod: f.pod().map(String::from),
                route: f.route.clone(),
                model: f.model.clone(),
                outcome: f.outcome.clone(),
                e2e_ms: f.e2e_ms,
                ttft_ms: f.ttft_ms,
                prompt_tokens: f.prompt_tokens,
                output_tokens: f.output_tokens,
                in_flight: f.in_flight,
                causes: cause::explain(r, baseline.unwrap_or(&Baseline::default())),
            }
        })
        .collect();
    Report {
        report_version: REPORT_VERSION,
        files: loaded.sources.clone(),
        records: requests.len(),
        malformed: Malformed {
            count: loaded.malformed,
            first: loaded
                .problems
                .iter()
                .take(LISTED_PROBLEMS)
                .map(ToString::to_string)
                .collect(),
        },
        start: rfc3339(start),
        end: rfc3339(end),
        span_s: round(span_s),
        by_deployment,
        groups,
        bend_total,
        pods,
        slowest,
    }
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
}
