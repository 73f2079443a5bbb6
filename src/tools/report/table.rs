//! The report's tables, laid out once for both writers: which columns, which rows, what each
//! cell says and what it is marked with. [`super::text`] pads them for a terminal and
//! [`super::html`] writes them as HTML tables, so the two can never disagree about a figure.

use super::analyze::{error_share, margin, Bend, Failures, Group, Report, SloShown};
use super::figures::{ms, Spread};
use super::pods::Pods;

/// How a column's cells line up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Align {
    Left,
    Right,
}

#[derive(Clone, Debug)]
pub struct Column {
    pub title: &'static str,
    pub align: Align,
}

/// One cell; `over` marks a figure past its SLO threshold or an attainment under its objective.
#[derive(Clone, Debug, Default)]
pub struct Cell {
    pub text: String,
    pub over: bool,
}

impl Cell {
    fn of(text: impl Into<String>) -> Cell {
        Cell {
            text: text.into(),
            over: false,
        }
    }

    fn over(text: impl Into<String>, over: bool) -> Cell {
        Cell {
            text: text.into(),
            over,
        }
    }
}

/// What a row stands for beyond its cells.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RowMark {
    #[default]
    None,
    /// The bend's level, or the pod the slowest requests or violations concentrate on.
    Named,
    /// A level with too few requests to be judged.
    Thin,
}

#[derive(Clone, Debug, Default)]
pub struct Row {
    pub cells: Vec<Cell>,
    pub mark: RowMark,
    /// Said after the row in text, as its title in HTML.
    pub note: Option<String>,
}

#[derive(Clone, Debug)]
pub struct Table {
    pub columns: Vec<Column>,
    pub rows: Vec<Row>,
}

fn left(title: &'static str) -> Column {
    Column {
        title,
        align: Align::Left,
    }
}

fn right(title: &'static str) -> Column {
    Column {
        title,
        align: Align::Right,
    }
}

/// A figure, or `-` when there is none.
pub fn figure(value: Option<f64>, decimals: usize) -> String {
    value.map_or_else(|| "-".into(), |v| format!("{v:.decimals$}"))
}

/// A group's name: its route and model, after its deployment when the report is split.
pub fn group_name(
    by_deployment: bool,
    deployment: Option<&str>,
    route: &str,
    model: Option<&str>,
) -> String {
    let name = format!("{route} / {}", model.unwrap_or("(no model)"));
    if by_deployment {
        format!("{}: {name}", deployment.unwrap_or("(no deployment)"))
    } else {
        name
    }
}

/// A route's SLO in words: `TTFT <= 1000 ms, objective 95 %`.
pub fn slo_line(slo: &SloShown) -> String {
    let mut parts = Vec::new();
    for (name, value) in [
        ("TTFT", slo.ttft_ms),
        ("TPOT", slo.tpot_ms),
        ("E2E", slo.e2e_ms),
        ("max ITL", slo.max_itl_ms),
    ] {
        if let Some(v) = value {
            parts.push(format!("{name} <= {}", ms(v)));
        }
    }
    if let Some(o) = slo.objective {
        parts.push(format!("objective {} %", o * 100.0));
    }
    parts.join(", ")
}

/// Whether `value` is past `threshold`.
fn past(value: Option<f64>, threshold: Option<f64>) -> bool {
    matches!((value, threshold), (Some(v), Some(t)) if v > t)
}

/// Every group on one line each, worst first (the order of `report.groups`).
pub fn summary(report: &Report) -> Table {
    let columns = vec![
        left("route / model"),
        right("requests"),
        right("errors"),
        right("attainment"),
        right("objective"),
        right("goodput/s"),
        right("p99 TTFT"),
        right("p99 TPOT"),
        right("p99 E2E"),
        right("active"),
    ];
    let rows = report
        .groups
        .iter()
        .map(|g| {
            let slo = g.slo.as_ref();
            let threshold = |get: fn(&SloShown) -> Option<f64>| slo.and_then(get);
            let objective = slo.and_then(|s| s.objective);
            let p99 = |s: Spread, t: Option<f64>| Cell::over(figure(s.p99, 1), past(s.p99, t));
            Row {
                cells: vec![
                    Cell::of(group_name(
                        report.by_deployment,
                        g.deployment.as_deref(),
                        &g.route,
                        g.model.as_deref(),
                    )),
                    Cell::of(g.requests.to_string()),
                    Cell::over(
                        match g.errors {
                            0 => "0".to_string(),
                            n => format!("{n} ({:.1} %)", error_share(g) * 100.0),
                        },
                        g.errors > 0,
                    ),
                    Cell::over(
                        g.attainment
                            .map_or_else(|| "-".into(), |a| format!("{:.1} %", a * 100.0)),
                        objective.is_some() && margin(g).is_some_and(|m| m < 0.0),
                    ),
                    Cell::of(objective.map_or_else(|| "-".into(), |o| format!("{} %", o * 100.0))),
                    Cell::of(figure(g.goodput_per_active_s, 2)),
                    p99(g.ttft_ms, threshold(|s| s.ttft_ms)),
                    p99(g.tpot_ms, threshold(|s| s.tpot_ms)),
                    p99(g.e2e_ms, threshold(|s| s.e2e_ms)),
                    Cell::of(format!("{:.0} s", g.active_s)),
                ],
                ..Row::default()
            }
        })
        .collect();
    Table { columns, rows }
}

/// What the summary's columns mean, in one line.
pub const SUMMARY_NOTE: &str = "worst first: lowest attainment against the objective (100 % without --config), then the largest share of errors; goodput/s is over each group's active time (its first request to the end of its last); percentiles are of successful requests, in ms";

/// A group's percentiles, each figure past its SLO threshold marked.
pub fn percentiles(g: &Group) -> Table {
    let slo = g.slo.as_ref();
    let threshold = |get: fn(&SloShown) -> Option<f64>| slo.and_then(get);
    let rows: [(&str, Spread, usize, Option<f64>); 6] = [
        ("TTFT (ms)", g.ttft_ms, 1, threshold(|s| s.ttft_ms)),
        ("TPOT (ms)", g.tpot_ms, 1, threshold(|s| s.tpot_ms)),
        ("max ITL (ms)", g.max_itl_ms, 1, threshold(|s| s.max_itl_ms)),
        ("E2E (ms)", g.e2e_ms, 1, threshold(|s| s.e2e_ms)),
        ("prompt tokens", g.prompt_tokens, 0, None),
        ("output tokens", g.output_tokens, 0, None),
    ];
    let mut columns = vec![left(""), right("p50"), right("p95"), right("p99")];
    if slo.is_some() {
        columns.push(right("SLO"));
    }
    let rows = rows
        .into_iter()
        .map(|(name, s, d, t)| {
            let mut cells = vec![Cell::of(name)];
            for v in [s.p50, s.p95, s.p99] {
                cells.push(Cell::over(figure(v, d), past(v, t)));
            }
            if slo.is_some() {
                cells.push(Cell::of(t.map_or_else(String::new, |t| format!("<= {t}"))));
            }
            Row {
                cells,
                ..Row::default()
            }
        })
        .collect();
    Table { columns, rows }
}

/// The bend's levels; the knee's level named, levels too thin to judge marked.
pub fn bend(b: &Bend, slo: Option<&SloShown>, min_requests: usize) -> Table {
    let columns = vec![
        right("in flight"),
        right("requests"),
        right("TTFT p50"),
        right("TTFT p99"),
        right("E2E p99"),
        right("output tok/s"),
    ];
    let ttft = slo.and_then(|s| s.ttft_ms);
    let e2e = slo.and_then(|s| s.e2e_ms);
    let rows = b
        .levels
        .iter()
        .map(|l| {
            let (mark, note) = if b.knee.as_ref().is_some_and(|k| k.high == l.high) {
                (RowMark::Named, Some("the bend".to_string()))
            } else if !l.judged {
                (
                    RowMark::Thin,
                    Some(format!("fewer than {min_requests}: not judged")),
                )
            } else {
                (RowMark::None, None)
            };
            Row {
                cells: vec![
                    Cell::of(l.concurrency.clone()),
                    Cell::of(l.requests.to_string()),
                    Cell::over(figure(l.ttft_p50_ms, 1), past(l.ttft_p50_ms, ttft)),
                    Cell::over(figure(l.ttft_p99_ms, 1), past(l.ttft_p99_ms, ttft)),
                    Cell::over(figure(l.e2e_p99_ms, 1), past(l.e2e_p99_ms, e2e)),
                    Cell::of(figure(l.output_tokens_per_s, 1)),
                ],
                mark,
                note,
            }
        })
        .collect();
    Table { columns, rows }
}

/// A deployment's pods; the pods the slowest requests or violations concentrate on named.
pub fn pods(p: &Pods) -> Table {
    let columns = vec![
        left("pod"),
        right("requests"),
        right("share"),
        right("of the slowest"),
        right("violated"),
    ];
    let rows = p
        .pods
        .iter()
        .map(|pod| {
            let named = p.concentrated.iter().any(|c| c.pod == pod.pod);
            Row {
                cells: vec![
                    Cell::of(pod.pod.clone()),
                    Cell::of(pod.requests.to_string()),
                    Cell::of(format!("{:.1} %", pod.share * 100.0)),
                    Cell::of(pod.slowest.to_string()),
                    Cell::of(pod.violated.to_string()),
                ],
                mark: if named { RowMark::Named } else { RowMark::None },
                note: None,
            }
        })
        .collect();
    Table { columns, rows }
}

/// The failed requests by reason, most frequent first, with the first of each.
pub fn failures(f: &Failures, by_deployment: bool) -> Table {
    let columns = vec![
        left("reason"),
        right("requests"),
        left("first, as read (request, route / model, file:line)"),
    ];
    let rows = f
        .reasons
        .iter()
        .map(|r| {
            let first: Vec<String> = r
                .first
                .iter()
                .map(|x| {
                    format!(
                        "{} {} {}:{}",
                        x.request_id.as_deref().unwrap_or("(no id)"),
                        group_name(
                            by_deployment,
                            x.deployment.as_deref(),
                            &x.route,
                            x.model.as_deref()
                        ),
                        x.file,
                        x.line
                    )
                })
                .collect();
            Row {
                cells: vec![
                    Cell::of(r.reason.clone()),
                    Cell::of(r.count.to_string()),
                    Cell::of(first.join("; ")),
                ],
                ..Row::default()
            }
        })
        .collect();
    Table { columns, rows }
}
