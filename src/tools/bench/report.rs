//! What a sweep means: per-level statistics (percentiles by linear interpolation, as numpy's
//! default), goodput against the SLO flags, cost, the saturation point (closed and open loop;
//! `report`'s bend uses the same [`knee`]), the recommendation, the errors by cause, the tables,
//! the A/B comparison and the CSV.

use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use super::request::{Record, Target};
use super::{BenchArgs, Sweep};

/// The most ITL gaps pooled for one level's percentiles, so memory stays bounded.
const MAX_LEVEL_GAPS: usize = 4_000_000;

/// The knee rule's threshold on the share of its own throughput that added load still brings
/// (the log-log slope of output tokens/s against load, see [`knee`]). Below saturation an open
/// loop serves what is offered (share 1) and a closed loop loses only what contention takes;
/// past it the share drops towards 0. For a throughput curve of the usual saturating form
/// T = T_max · L / (L + K) the share at L is exactly 1 - T / T_max, so a share under a third
/// means the server already delivers two thirds of the most it could: past that, more load
/// buys little throughput and costs latency.
pub const KNEE_SHARE: f64 = 1.0 / 3.0;

/// A level with fewer successful requests is not judged for the knee: its p99 TTFT would be
/// its one or two slowest requests, and its throughput a handful of completions.
pub const MIN_LEVEL_SAMPLE: usize = 20;

/// What a level holds steady: the requests in flight (closed loop) or the offered arrival rate
/// in requests/s (open loop).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Load {
    Concurrency(u32),
    Rate(f64),
}

impl Load {
    /// The short form used in progress lines: `c=5`, `rate=2.5/s`.
    pub fn label(&self) -> String {
        match self {
            Load::Concurrency(c) => format!("c={c}"),
            Load::Rate(r) => format!("rate={r}/s"),
        }
    }

    /// The number on a plot's x axis.
    pub fn value(&self) -> f64 {
        match *self {
            Load::Concurrency(c) => f64::from(c),
            Load::Rate(r) => r,
        }
    }
}

impl std::fmt::Display for Load {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Load::Concurrency(c) => write!(f, "concurrency {c}"),
            Load::Rate(r) => write!(f, "rate {r}/s"),
        }
    }
}

/// The price of an hour of the server (`--cost-per-hour`, `--currency`).
#[derive(Clone, Debug, PartialEq)]
pub struct Cost {
    pub per_hour: f64,
    pub currency: String,
}

/// The SLO thresholds given on the command line; an absent one is not judged.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Slo {
    pub ttft: Option<Duration>,
    pub tpot: Option<Duration>,
    pub e2e: Option<Duration>,
}

impl Slo {
    pub fn is_set(&self) -> bool {
        self.ttft.is_some() || self.tpot.is_some() || self.e2e.is_some()
    }

    /// vLLM `--goodput` semantics: a request is good when it succeeded and meets every given
    /// threshold. A request with a single token has no TPOT and so cannot miss that one.
    pub fn is_good(&self, record: &Record) -> bool {
        let within = |limit: Option<Duration>, value: Option<Duration>| match (limit, value) {
            (Some(limit), Some(value)) => value <= limit,
            (Some(_), None) => false,
            (None, _) => true,
        };
        record.error.is_none()
            && within(self.ttft, record.ttft)
            && (self.tpot.is_none() || record.tpot.is_none() || within(self.tpot, record.tpot))
            && within(self.e2e, Some(record.e2e))
    }
}

/// p50, p95 and p99 in milliseconds; `None` when there was nothing to measure.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Percentiles {
    pub p50: Option<f64>,
    pub p95: Option<f64>,
    pub p99: Option<f64>,
}

impl Percentiles {
    fn of(mut ms: Vec<f64>) -> Percentiles {
        ms.sort_by(f64::total_cmp);
        Percentiles {
            p50: percentile(&ms, 50.0),
            p95: percentile(&ms, 95.0),
            p99: percentile(&ms, 99.0),
        }
    }
}

/// The `p`th percentile of sorted `values`, interpolated linearly between the two nearest
/// ranks (numpy's default method).
pub fn percentile(sorted: &[f64], p: f64) -> Option<f64> {
    let last = sorted.len().checked_sub(1)?;
    let rank = (p / 100.0).clamp(0.0, 1.0) * last as f64;
    let lo = rank.floor() as usize;
    let hi = rank.ceil() as usize;
    let (a, b) = (sorted[lo], sorted[hi.min(last)]);
    Some(a + (b - a) * (rank - lo as f64))
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// One level's results against one target.
#[derive(Debug)]
pub struct LevelReport {
    pub load: Load,
    /// Closed loop: the level's concurrency. Open loop: the most requests that were in flight.
    pub concurrency: u32,
    pub target: Target,
    /// Open loop: arrivals that waited because `max_in_flight` requests were already in flight.
    pub capped: u32,
    pub max_in_flight: u32,
    pub records: Vec<Record>,
    pub wall: Duration,
    pub requests_per_s: f64,
    pub output_tokens_per_s: f64,
    /// Over successful requests only.
    pub ttft: Percentiles,
    pub tpot: Percentiles,
    pub itl: Percentiles,
    pub e2e: Percentiles,
    pub errors: usize,
    /// Requests meeting every SLO threshold (failures are never good).
    pub good: usize,
    pub goodput: f64,
    pub attainment: f64,
}

impl LevelReport {
    /// A closed-loop level against target A.
    pub fn new(concurrency: u32, records: Vec<Record>, wall: Duration, slo: &Slo) -> Self {
        Self::measured(
            Load::Concurrency(concurrency),
            Target::A,
            records,
            wall,
            slo,
        )
    }

    pub fn measured(
        load: Load,
        target: Target,
        records: Vec<Record>,
        wall: Duration,
        slo: &Slo,
    ) -> Self {
        let secs = wall.as_secs_f64().max(f64::MIN_POSITIVE);
        let ok: Vec<&Record> = records.iter().filter(|r| r.error.is_none()).collect();
        let output_tokens: u64 = ok.iter().map(|r| r.output_tokens).sum();
        let mut gaps = Vec::new();
        for r in &ok {
            let room = MAX_LEVEL_GAPS.saturating_sub(gaps.len());
            gaps.extend(r.itl.iter().take(room).map(|&d| ms(d)));
        }
        let good = records.iter().filter(|r| slo.is_good(r)).count();
        LevelReport {
            load,
            concurrency: match load {
                Load::Concurrency(c) => c,
                Load::Rate(_) => 0,
            },
            target,
            capped: 0,
            max_in_flight: 0,
            requests_per_s: records.len() as f64 / secs,
            output_tokens_per_s: output_tokens as f64 / secs,
            ttft: Percentiles::of(ok.iter().filter_map(|r| r.ttft).map(ms).collect()),
            tpot: Percentiles::of(ok.iter().filter_map(|r| r.tpot).map(ms).collect()),
            itl: Percentiles::of(gaps),
            e2e: Percentiles::of(ok.iter().map(|r| ms(r.e2e)).collect()),
            errors: records.len() - ok.len(),
            good,
            goodput: good as f64 / secs,
            attainment: if records.is_empty() {
                0.0
            } else {
                good as f64 / records.len() as f64
            },
            wall,
            records,
        }
    }
}

impl LevelReport {
    /// What one request and one million output tokens cost at the throughput this level
    /// measured: the price of an hour divided by what that hour serves at this rate. `None`
    /// when nothing succeeded (an hour that serves nothing has no cost per unit).
    pub fn cost(&self, price: &Cost) -> Option<(f64, f64)> {
        let secs = self.wall.as_secs_f64();
        let ok = self.records.len() - self.errors;
        if ok == 0 || secs <= 0.0 || self.output_tokens_per_s <= 0.0 {
            return None;
        }
        let requests_per_hour = ok as f64 / secs * 3600.0;
        let tokens_per_hour = self.output_tokens_per_s * 3600.0;
        Some((
            price.per_hour / requests_per_hour,
            price.per_hour / tokens_per_hour * 1e6,
        ))
    }
}

impl LevelReport {
    /// Output tokens of the requests that met `slo` (every successful one without an SLO).
    pub fn good_output_tokens(&self, slo: &Slo) -> u64 {
        self.records
            .iter()
            .filter(|r| slo.is_good(r))
            .map(|r| r.output_tokens)
            .sum()
    }

    /// What one *good* request and one million *good* output tokens cost: the price of an
    /// hour over what that hour serves within `slo` at this level's rate. A level that serves
    /// fast but late pays for requests nobody could use; `None` when nothing was good.
    pub fn good_cost(&self, price: &Cost, slo: &Slo) -> Option<(f64, f64)> {
        let secs = self.wall.as_secs_f64();
        let good = self.records.iter().filter(|r| slo.is_good(r)).count();
        let tokens = self.good_output_tokens(slo);
        if good == 0 || tokens == 0 || secs <= 0.0 {
            return None;
        }
        Some((
            price.per_hour / (good as f64 / secs * 3600.0),
            price.per_hour / (tokens as f64 / secs * 3600.0) * 1e6,
        ))
    }
}

/// The default `--slo-objective`: the share of requests that must meet the SLO for a level to
/// count as meeting it (DistServe's goodput is judged at 90 % attainment).
pub const DEFAULT_OBJECTIVE: f64 = 0.9;

/// Which level to run at, in words: the level with the most goodput among those whose SLO
/// attainment reaches `objective`, with its cost per good request and per million good output
/// tokens when priced; or that no level meets the SLO. Without an SLO every successful request
/// counts, so the recommendation is the cheapest (most served) level, and it says so.
pub fn recommend(
    levels: &[LevelReport],
    slo: &Slo,
    objective: f64,
    price: Option<&Cost>,
) -> String {
    let cost = |level: &LevelReport| -> String {
        let Some(price) = price else {
            return String::new();
        };
        match level.good_cost(price, slo) {
            Some((per_request, per_million)) => format!(
                ", {} {cur} per good request, {} {cur} per million good output tokens at {} {cur}/hour",
                money(per_request),
                money(per_million),
                money(price.per_hour),
                cur = price.currency
            ),
            None => String::new(),
        }
    };
    if !slo.is_set() {
        let Some(price) = price else {
            return String::new();
        };
        let best = levels
            .iter()
            .filter_map(|l| Some((l, l.good_cost(price, slo)?.0)))
            .min_by(|a, b| a.1.total_cmp(&b.1))
            .map(|(l, _)| l);
        return match best {
            Some(level) => format!(
                "recommendation: {}: cheapest per successful request{} (no SLO given: set --slo-ttft, --slo-tpot or --slo-e2e to weigh latency)\n",
                level.load,
                cost(level)
            ),
            None => "recommendation: none: no level served a request\n".into(),
        };
    }
    // Judged on the records against `slo` itself, so the figures agree with the costs.
    let judged: Vec<(&LevelReport, f64, f64)> = levels
        .iter()
        .filter(|l| !l.records.is_empty())
        .map(|l| {
            let good = l.records.iter().filter(|r| slo.is_good(r)).count() as f64;
            let secs = l.wall.as_secs_f64().max(f64::MIN_POSITIVE);
            (l, good / l.records.len() as f64, good / secs)
        })
        .collect();
    let meeting = judged
        .iter()
        .filter(|j| j.1 >= objective)
        .max_by(|a, b| a.2.total_cmp(&b.2));
    match meeting {
        Some(&(level, attainment, goodput)) => format!(
            "recommendation: {}: the most goodput, {goodput:.2} good req/s, with {:.1} % of requests within the SLO (objective {:.0} %){}\n",
            level.load,
            attainment * 100.0,
            objective * 100.0,
            cost(level)
        ),
        None => {
            let best = judged.iter().max_by(|a, b| a.1.total_cmp(&b.1));
            match best {
                Some(&(level, attainment, _)) => format!(
                    "recommendation: none: no level meets the SLO for {:.0} % of requests; the best, {}, had {:.1} % within it\n",
                    objective * 100.0,
                    level.load,
                    attainment * 100.0
                ),
                None => "recommendation: none: no level sent a request\n".into(),
            }
        }
    }
}

/// Why a level is the saturation point.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Knee {
    /// The last level before the curve bends.
    pub load: Load,
    /// What the next judged level added: its output tokens/s growth and its load's growth
    /// (both as shares of this level's), the share of its own throughput the added load
    /// brought ([`KNEE_SHARE`]), and p99 TTFT here and there, in ms.
    pub throughput_growth: f64,
    pub load_growth: f64,
    pub share: f64,
    pub ttft_p99: (f64, f64),
}

/// Whether a level takes part in finding the knee: it measured a p99 TTFT and some
/// throughput, over at least [`MIN_LEVEL_SAMPLE`] successful requests. A level built without
/// its records (the report's levels, which keep only their figures) is taken as judged by
/// whoever built it: the report applies its own minimum before it asks.
fn judged(level: &LevelReport) -> bool {
    let ok = level.records.len().saturating_sub(level.errors);
    level.ttft.p99.is_some()
        && level.output_tokens_per_s > 0.0
        && level.load.value() > 0.0
        && (level.records.is_empty() || ok >= MIN_LEVEL_SAMPLE)
}

/// The level past which the server saturates, `None` when no level in the sweep behaves so.
///
/// One rule for closed loops (load = concurrency), open loops (load = offered rate) and the
/// report's bend (load = requests in flight at arrival): going from one judged level to the
/// next, the added load's share of throughput is the slope of output tokens/s against load on
/// log-log axes, ln(T2/T1) / ln(L2/L1): 1 when throughput grows in proportion to the load, 0
/// when it does not grow at all. The knee is the last level before that share falls under
/// [`KNEE_SHARE`] while p99 TTFT rises. Judged per relative change of load, a step from 8 to 9
/// users is held to an eighth of the growth a step from 1 to 2 is, so fine sweeps and coarse
/// ones name the same level; and slopes compose (8 to 12 to 16 averages to 8 to 16), so the
/// answer does not hinge on where the sweep put its levels. Levels are taken in order of load;
/// levels with too small a sample are skipped, not judged (see [`MIN_LEVEL_SAMPLE`]).
pub fn knee(levels: &[LevelReport]) -> Option<Knee> {
    let mut judged: Vec<&LevelReport> = levels.iter().filter(|l| judged(l)).collect();
    judged.sort_by(|a, b| a.load.value().total_cmp(&b.load.value()));
    judged.windows(2).find_map(|pair| {
        let (before, after) = (pair[0], pair[1]);
        let (b, a) = (before.ttft.p99?, after.ttft.p99?);
        let load_ratio = after.load.value() / before.load.value();
        if load_ratio <= 1.0 {
            return None;
        }
        let throughput_ratio = after.output_tokens_per_s / before.output_tokens_per_s;
        let share = throughput_ratio.ln() / load_ratio.ln();
        (share < KNEE_SHARE && a > b).then_some(Knee {
            load: before.load,
            throughput_growth: throughput_ratio - 1.0,
            load_growth: load_ratio - 1.0,
            share,
            ttft_p99: (b, a),
        })
    })
}

/// The concurrency of the [`knee`]'s level: for an open-loop sweep the peak in flight of the
/// knee's level ([`knee`] says which rate).
pub fn saturation(levels: &[LevelReport]) -> Option<u32> {
    let found = knee(levels)?;
    levels
        .iter()
        .find(|l| l.load == found.load)
        .map(|l| l.concurrency)
}

/// The saturation verdict in words.
pub fn verdict(levels: &[LevelReport]) -> String {
    let Some(k) = knee(levels) else {
        let judged = levels.iter().filter(|l| judged(l)).count();
        return if judged < 2 {
            format!(
                "saturation: too few levels with {MIN_LEVEL_SAMPLE} or more successful requests to tell"
            )
        } else {
            "saturation: no saturation within the levels tried".into()
        };
    };
    let (b, a) = k.ttft_p99;
    let added = format!(
        "load +{:.0} %, output tokens/s {:+.0} %: the added load brought {:.0} % of its share (under {:.0} %), while p99 TTFT rose from {b:.1} to {a:.1} ms",
        k.load_growth * 100.0,
        k.throughput_growth * 100.0,
        k.share.max(0.0) * 100.0,
        KNEE_SHARE * 100.0
    );
    match k.load {
        Load::Concurrency(c) => format!("saturation: past concurrency {c} ({added})"),
        Load::Rate(r) => format!(
            "saturation: past {r} requests/s offered, output tokens/s stops tracking the offered load ({added})"
        ),
    }
}

/// Each cause of failure over `levels` ([`cause`](super::request::cause)), with how many
/// requests it ended and the first such request's whole error; most frequent first.
pub fn error_causes<'a>(
    levels: impl IntoIterator<Item = &'a LevelReport>,
) -> Vec<(String, usize, String)> {
    let mut causes: Vec<(String, usize, String)> = Vec::new();
    for record in levels.into_iter().flat_map(|l| &l.records) {
        let Some(cause) = super::request::cause(record) else {
            continue;
        };
        match causes.iter_mut().find(|c| c.0 == cause) {
            Some(c) => c.1 += 1,
            None => causes.push((cause, 1, record.error.clone().unwrap_or_default())),
        }
    }
    causes.sort_by_key(|c| std::cmp::Reverse(c.1));
    causes
}

/// The failed requests by cause, as printed after the tables; empty when none failed.
pub fn render_errors<'a>(levels: impl IntoIterator<Item = &'a LevelReport> + Clone) -> String {
    let causes = error_causes(levels.clone());
    if causes.is_empty() {
        return String::new();
    }
    let failed: usize = causes.iter().map(|c| c.1).sum();
    let total: usize = levels.into_iter().map(|l| l.records.len()).sum();
    let mut out = format!(
        "errors: {failed} of {total} requests failed
"
    );
    for (cause, count, example) in &causes {
        let _ = writeln!(out, "  {count:>6}  {cause} (first: {example})");
    }
    out
}

/// The levels whose share of failed requests is above `max_share`, with that share.
pub fn failing_levels(levels: &[LevelReport], max_share: f64) -> Vec<(&LevelReport, f64)> {
    levels
        .iter()
        .filter(|l| !l.records.is_empty())
        .map(|l| (l, l.errors as f64 / l.records.len() as f64))
        .filter(|&(_, share)| share > max_share)
        .collect()
}

fn cell(value: Option<f64>) -> String {
    value.map_or_else(|| "-".to_string(), |v| format!("{v:.1}"))
}

/// A price with three significant digits, however small.
fn money(x: f64) -> String {
    if !(x.is_finite() && x > 0.0) {
        return "0".into();
    }
    let decimals = (2 - x.log10().floor() as i32).clamp(2, 12) as usize;
    format!("{x:.decimals$}")
}

/// The per-level tables and the saturation verdict, as printed on stdout.
pub fn render(levels: &[LevelReport], slo: &Slo) -> String {
    render_levels(levels, slo, DEFAULT_OBJECTIVE, None)
}

/// [`render`], with the cost of each level when a price is given and the [`recommend`]ation.
pub fn render_levels(
    levels: &[LevelReport],
    slo: &Slo,
    objective: f64,
    price: Option<&Cost>,
) -> String {
    let mut out = String::new();
    for level in levels {
        let _ = write!(
            out,
            "{}: {} requests in {:.2}s, {:.2} req/s, {:.1} output tokens/s, {} errors",
            level.load,
            level.records.len(),
            level.wall.as_secs_f64(),
            level.requests_per_s,
            level.output_tokens_per_s,
            level.errors
        );
        if let Load::Rate(_) = level.load {
            let _ = write!(out, ", peak {} in flight", level.concurrency);
        }
        out.push('\n');
        if level.capped > 0 {
            let _ = writeln!(
                out,
                "  {} arrivals waited for a free slot: --max-in-flight {} capped the offered rate",
                level.capped, level.max_in_flight
            );
        }
        let _ = writeln!(
            out,
            "  {:<10}{:>10}{:>10}{:>10}",
            "(ms)", "p50", "p95", "p99"
        );
        for (name, p) in [
            ("TTFT", level.ttft),
            ("TPOT", level.tpot),
            ("ITL", level.itl),
            ("E2E", level.e2e),
        ] {
            let _ = writeln!(
                out,
                "  {:<10}{:>10}{:>10}{:>10}",
                name,
                cell(p.p50),
                cell(p.p95),
                cell(p.p99)
            );
        }
        if slo.is_set() {
            let _ = writeln!(
                out,
                "  goodput {:.2} req/s, SLO attainment {:.1} %",
                level.goodput,
                level.attainment * 100.0
            );
        }
        if let Some(price) = price {
            match level.cost(price) {
                Some((per_request, per_million)) => {
                    let _ = write!(
                        out,
                        "  cost {} {cur} per request, {} {cur} per million output tokens",
                        money(per_request),
                        money(per_million),
                        cur = price.currency
                    );
                    if slo.is_set() {
                        match level.good_cost(price, slo) {
                            Some((per_good, _)) => {
                                let _ = write!(
                                    out,
                                    "; {} {cur} per good request",
                                    money(per_good),
                                    cur = price.currency
                                );
                            }
                            None => out.push_str("; no good request"),
                        }
                    }
                    out.push('\n');
                }
                None => out.push_str("  cost: nothing was served\n"),
            }
        }
        out.push('\n');
    }
    out.push_str(&verdict(levels));
    out.push('\n');
    out.push_str(&recommend(levels, slo, objective, price));
    out
}

/// Target B's added latency over A at each level: TTFT and ITL at p50 and p99 for both, and
/// B − A (the difference of the two percentiles), in ms to the microsecond.
pub fn render_compare(a: &[LevelReport], b: &[LevelReport]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<16}{:>12}{:>12}{:>12}{:>12}   (ms)",
        "B over A", "TTFT p50", "TTFT p99", "ITL p50", "ITL p99"
    );
    let row = |out: &mut String, name: &str, values: [Option<f64>; 4], signed: bool| {
        let _ = write!(out, "  {name:<14}");
        for v in values {
            let text = match v {
                Some(v) if signed => format!("{v:+.3}"),
                Some(v) => format!("{v:.3}"),
                None => "-".into(),
            };
            let _ = write!(out, "{text:>12}");
        }
        out.push('\n');
    };
    for (la, lb) in a.iter().zip(b) {
        let _ = writeln!(out, "{}", la.load);
        let of = |l: &LevelReport| [l.ttft.p50, l.ttft.p99, l.itl.p50, l.itl.p99];
        let (va, vb) = (of(la), of(lb));
        row(&mut out, "A", va, false);
        row(&mut out, "B", vb, false);
        let added = std::array::from_fn(|i| Some(vb[i]? - va[i]?));
        row(&mut out, "added (B - A)", added, true);
    }
    out
}

/// Everything `tokenmeter bench` prints at the end: each target's tables, the comparison, and
/// the cost when priced.
pub fn render_sweep(sweep: &Sweep, args: &BenchArgs) -> String {
    let (slo, price, objective) = (args.slo(), args.cost(), args.slo_objective);
    let mut out = match &args.compare {
        None => render_levels(&sweep.levels, &slo, objective, price.as_ref()),
        Some(b) => {
            let mut out = format!("A: {}\n\n", args.url);
            out.push_str(&render_levels(
                &sweep.levels,
                &slo,
                objective,
                price.as_ref(),
            ));
            let _ = write!(out, "\nB: {b}\n\n");
            out.push_str(&render_levels(
                &sweep.compared,
                &slo,
                objective,
                price.as_ref(),
            ));
            out.push('\n');
            out.push_str(&render_compare(&sweep.levels, &sweep.compared));
            out
        }
    };
    out.push_str(&render_errors(sweep.levels.iter().chain(&sweep.compared)));
    out
}

/// Writes one row per request of every level to `path`.
pub fn write_csv(path: &Path, levels: &[LevelReport]) -> Result<(), csv::Error> {
    write_rows(path, levels.iter())
}

/// Writes one row per request of the whole sweep (both targets with `--compare`) to `path`.
pub fn write_sweep_csv(path: &Path, sweep: &Sweep) -> Result<(), csv::Error> {
    write_rows(path, sweep.levels.iter().chain(&sweep.compared))
}

fn write_rows<'a>(
    path: &Path,
    levels: impl Iterator<Item = &'a LevelReport>,
) -> Result<(), csv::Error> {
    let mut writer = csv::Writer::from_path(path)?;
    writer.write_record([
        "request_id",
        "concurrency",
        "prompt_tokens",
        "output_tokens",
        "ttft_ms",
        "tpot_ms",
        "total_ms",
        "status",
        "error",
        "max_itl_ms",
        "token_source",
        "rate",
        "max_tokens",
        "start_ms",
        "target",
    ])?;
    let opt_ms = |d: Option<Duration>| d.map_or_else(String::new, |d| format!("{:.3}", ms(d)));
    for r in levels.flat_map(|l| &l.records) {
        writer.write_record([
            r.request_id.to_string(),
            r.concurrency.to_string(),
            r.prompt_tokens.map_or_else(String::new, |n| n.to_string()),
            r.output_tokens.to_string(),
            opt_ms(r.ttft),
            opt_ms(r.tpot),
            format!("{:.3}", ms(r.e2e)),
            r.status.to_string(),
            r.error.clone().unwrap_or_default(),
            opt_ms(r.max_itl),
            r.token_source.as_str().to_string(),
            r.rate.map_or_else(String::new, |r| r.to_string()),
            r.max_tokens.to_string(),
            format!("{:.3}", ms(r.start)),
            r.target.as_str().to_string(),
        ])?;
    }
    writer.flush()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A level as `report` builds it: figures only, no records.
    fn level(c: u32, tokens_per_s: f64, ttft_p99: f64) -> LevelReport {
        let mut l = LevelReport::new(c, Vec::new(), Duration::from_secs(1), &Slo::default());
        l.output_tokens_per_s = tokens_per_s;
        l.ttft.p99 = Some(ttft_p99);
        l
    }

    /// A server of 8 slots whose step slows by a fifth of its base per running request (the
    /// sim's default contention): tokens/s = b / (1 + b / 5) for b = min(users, 8).
    fn contended(users: u32) -> f64 {
        let b = f64::from(users.min(8));
        100.0 * b / (1.0 + b / 5.0)
    }

    // Issue 38: per step of one user, growth fell under 10 % at 4 on this curve, long before
    // the batch filled at 8.
    #[test]
    fn the_knee_is_where_the_batch_fills_however_finely_the_sweep_is_cut() {
        for users in [
            vec![1, 2, 4, 6, 8, 10, 12, 16],
            (1..=12).collect::<Vec<u32>>(),
        ] {
            let levels: Vec<LevelReport> = users
                .iter()
                .map(|&u| {
                    level(
                        u,
                        contended(u),
                        50.0 + 100.0 * f64::from(u.saturating_sub(8)),
                    )
                })
                .collect();
            let k = knee(&levels).expect("a knee");
            assert_eq!(k.load, Load::Concurrency(8), "{users:?}");
            assert!(k.share < KNEE_SHARE && k.share.abs() < 1e-9);
        }
        let under: Vec<LevelReport> = (1..=8).map(|u| level(u, contended(u), 50.0)).collect();
        assert_eq!(knee(&under), None);
    }

    #[test]
    fn a_level_with_too_few_requests_is_skipped_not_judged() {
        let record = |ttft_ms: u64| Record {
            request_id: 0,
            concurrency: 8,
            rate: None,
            target: Target::A,
            max_tokens: 1,
            start: Duration::ZERO,
            prompt_tokens: None,
            output_tokens: 1,
            token_source: super::super::request::TokenSource::Usage,
            ttft: Some(Duration::from_millis(ttft_ms)),
            tpot: None,
            e2e: Duration::from_millis(ttft_ms),
            itl: Vec::new(),
            max_itl: None,
            status: 200,
            error: None,
        };
        let measured = |c: u32, n: usize, ttft_ms: u64| {
            LevelReport::new(
                c,
                vec![record(ttft_ms); n],
                Duration::from_secs(1),
                &Slo::default(),
            )
        };
        // 16 users with as many tokens/s as 8 and a slower p99: a knee at 8, unless 16 is too
        // few requests to say so.
        assert_eq!(
            knee(&[measured(8, 40, 10), measured(16, 40, 90)]).map(|k| k.load),
            Some(Load::Concurrency(8)),
        );
        let few = [measured(8, 40, 10), measured(16, MIN_LEVEL_SAMPLE - 1, 90)];
        assert_eq!(knee(&few), None);
        assert!(
            verdict(&few).contains("too few levels"),
            "{}",
            verdict(&few)
        );
    }

    #[test]
    fn percentiles_interpolate_like_numpy() {
        // numpy.percentile([1, 2, 3, 4], [50, 95, 99]) == [2.5, 3.85, 3.97]
        let v = [1.0, 2.0, 3.0, 4.0];
        let close = |a: Option<f64>, b: f64| a.is_some_and(|a| (a - b).abs() < 1e-9);
        assert!(close(percentile(&v, 50.0), 2.5));
        assert!(close(percentile(&v, 95.0), 3.85));
        assert!(close(percentile(&v, 99.0), 3.97));
        assert!(close(percentile(&[7.0], 99.0), 7.0));
        assert_eq!(percentile(&[], 50.0), None);
    }
}
