//! `--html FILE`: the report as one self-contained page (inline CSS, inline SVG drawn here by
//! plotters' SVG backend, no script and nothing fetched), so it can be mailed, attached to an
//! incident or opened from a laptop with no network. It leads with the problem: a summary of
//! every route and model, worst first, with every figure past its SLO threshold marked, and the
//! failed requests by reason. Then per route and model its tables and the plots people read
//! faster: latency percentiles and output tokens/s against concurrency with the bend marked, a
//! TTFT histogram and the latency over time, each with the route's SLO thresholds drawn when
//! `--config` gives them; each deployment's pods with the pod the slowest requests or the
//! violations concentrate on; and the slowest requests. The tables are [`super::table`]'s, the
//! same the terminal report prints. Colours are the Okabe-Ito palette, told apart with any
//! colour vision; the SLO lines are black and dashed.
//!
//! Everything that came from a record file is escaped: a route or request id is data, never
//! markup.

use std::fmt::Write as _;

use plotters::prelude::*;

use crate::tools::palette;

use super::analyze::{Bend, Group, Level, Report, SloShown, Timeline};
use super::figures::{ms, Quantiles, Spread};
use super::pods::{self, Pods};
use super::table::{self, Align, RowMark, Table};

const STYLE: &str = "
body { font-family: system-ui, -apple-system, 'Segoe UI', sans-serif; margin: 24px auto;
       max-width: 1240px; padding: 0 16px; color: #1d2330; background: #fff; }
h1 { font-size: 24px; margin-bottom: 4px; }
h2 { font-size: 19px; margin-top: 36px; padding-bottom: 4px; border-bottom: 2px solid #dde3ee; }
h3 { font-size: 15px; margin: 18px 0 6px; color: #44506a; }
p, li { font-size: 14px; line-height: 1.45; }
.muted { color: #66708a; }
table { border-collapse: collapse; font-size: 13px; margin: 6px 0 10px; }
th, td { padding: 4px 10px; border-bottom: 1px solid #e8ecf3; text-align: right;
         font-variant-numeric: tabular-nums; vertical-align: top; }
th { background: #f3f5fa; font-weight: 600; }
th.l, td.l { text-align: left; }
td.nowrap { white-space: nowrap; }
tr.knee td { background: #fff1d6; font-weight: 600; }
td.over { color: #b03000; font-weight: 700; }
td.over::after { content: ' \\25B2'; font-size: 10px; }
.table-wrap { overflow-x: auto; max-width: 100%; }
tr.thin td { color: #9aa3b8; }
.row { display: flex; flex-wrap: wrap; gap: 28px; align-items: flex-start; }
.verdict { font-size: 14px; padding: 8px 12px; background: #fff7e6; border-left: 4px solid #f0a020;
           margin: 8px 0 12px; }
.verdict.none { background: #f3f5fa; border-left-color: #9aa3b8; }
.plots { display: flex; flex-wrap: wrap; gap: 16px; }
.plots figure { margin: 0; border: 1px solid #e8ecf3; width: 600px; max-width: 100%; }
.plots svg { display: block; max-width: 100%; height: auto; }
figcaption { font-size: 12px; padding: 4px 10px 8px; color: #44506a; }
.key { display: inline-block; margin-right: 14px; white-space: nowrap; }
.key i { display: inline-block; width: 18px; margin-right: 5px; vertical-align: middle;
         border-top: 3px solid; }
.key i.dashed { border-top-style: dashed; }
ul.causes { margin: 0; padding-left: 16px; text-align: left; }
ul.causes li { font-size: 13px; margin: 1px 0; }
.cause { font-weight: 600; }
.problems { font-family: ui-monospace, monospace; font-size: 12px; color: #9b2c2c; }
";

/// One line of a plot, as its legend shows it (drawn under the plot in HTML, so it never
/// covers a curve).
struct Key {
    label: String,
    colour: RGBColor,
    dashed: bool,
}

// What each series is drawn in, from the tools' one palette.
const TTFT_P50: RGBColor = palette::BLUE;
const TTFT_P99: RGBColor = palette::VERMILLION;
const E2E_P99: RGBColor = palette::REDDISH_PURPLE;
const TOKENS: RGBColor = palette::BLUISH_GREEN;
const BEND: RGBColor = palette::ORANGE;
const MEDIAN: RGBColor = palette::BLUISH_GREEN;
const SLO: RGBColor = palette::BLACK;

/// A plot and its legend.
fn figure(plot: Result<(String, Vec<Key>), String>) -> String {
    match plot {
        Ok((svg, keys)) => {
            let mut out = format!("<figure>{svg}<figcaption>");
            for k in keys {
                let RGBColor(r, g, b) = k.colour;
                let _ = write!(
                    out,
                    "<span class=\"key\"><i{} style=\"border-color: rgb({r},{g},{b})\"></i>{}</span>",
                    if k.dashed { " class=\"dashed\"" } else { "" },
                    escape(&k.label)
                );
            }
            out.push_str("</figcaption></figure>\n");
            out
        }
        Err(e) => format!("<p class=\"muted\">(no plot: {})</p>\n", escape(&e)),
    }
}

/// Plot size in pixels; two fit side by side in the page's width.
const PLOT: (u32, u32) = (600, 360);
const HISTOGRAM_BINS: usize = 30;

/// Text from a record file, made safe inside HTML text and attribute values.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

fn cell(value: Option<f64>, decimals: usize) -> String {
    value.map_or_else(|| "–".into(), |v| format!("{v:.decimals$}"))
}

/// A group's name, escaped, after its deployment when the report is split by deployment.
fn group_name(
    report: &Report,
    deployment: Option<&str>,
    route: &str,
    model: Option<&str>,
) -> String {
    escape(&table::group_name(
        report.by_deployment,
        deployment,
        route,
        model,
    ))
}

/// One of [`super::table`]'s tables as HTML: figures past their threshold get `class="over"`,
/// the named row `class="knee"`, a row too thin to judge `class="thin"` with its note as title.
fn html_table(t: &Table) -> String {
    let class = |align: Align| match align {
        Align::Left => " class=\"l\"",
        Align::Right => "",
    };
    let mut out = String::from("<div class=\"table-wrap\"><table>\n<tr>");
    for c in &t.columns {
        let _ = write!(out, "<th{}>{}</th>", class(c.align), escape(c.title));
    }
    out.push_str("</tr>\n");
    for r in &t.rows {
        let title = r
            .note
            .as_deref()
            .map_or_else(String::new, |n| format!(" title=\"{}\"", escape(n)));
        let _ = write!(
            out,
            "<tr{}{title}>",
            match r.mark {
                RowMark::Named => " class=\"knee\"",
                RowMark::Thin => " class=\"thin\"",
                RowMark::None => "",
            }
        );
        for (c, column) in r.cells.iter().zip(&t.columns) {
            let classes: Vec<&str> = [
                (column.align == Align::Left).then_some("l"),
                c.over.then_some("over"),
            ]
            .into_iter()
            .flatten()
            .collect();
            let attribute = if classes.is_empty() {
                String::new()
            } else {
                format!(" class=\"{}\"", classes.join(" "))
            };
            let text = if c.text == "-" {
                "–".to_string()
            } else {
                escape(&c.text)
            };
            let _ = write!(out, "<td{attribute}>{text}</td>");
        }
        out.push_str("</tr>\n");
    }
    out.push_str("</table></div>\n");
    out
}

/// The whole page.
pub fn page(report: &Report) -> String {
    let mut out = String::new();
    let _ = write!(
        out,
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
         <title>tokenmeter report</title>\n<style>{STYLE}</style>\n</head>\n<body>\n"
    );
    out.push_str("<h1>tokenmeter report: why was it slow?</h1>\n");
    let _ = writeln!(
        out,
        "<p class=\"muted\">{} records from {} file(s), {} to {} ({:.1} s)</p>",
        report.records,
        report.files.len(),
        escape(&report.start),
        escape(&report.end),
        report.span_s
    );
    out.push_str("<ul>\n");
    for f in &report.files {
        let state = match (f.records, f.malformed) {
            (0, 0) => "empty".to_string(),
            (n, 0) => format!("{n} records"),
            (n, m) => format!("{n} records, {m} malformed lines skipped"),
        };
        let _ = writeln!(
            out,
            "<li><code>{}</code>: {state} ({})</li>",
            escape(&f.path),
            f.format.as_str()
        );
    }
    out.push_str("</ul>\n");
    if report.malformed.count > 0 {
        let _ = writeln!(
            out,
            "<p>{} malformed line(s) skipped, the first:</p>\n<div class=\"problems\">",
            report.malformed.count
        );
        for problem in &report.malformed.first {
            let _ = writeln!(out, "{}<br>", escape(problem));
        }
        out.push_str("</div>\n");
    }
    out.push_str("<h2>Summary, worst first</h2>\n");
    out.push_str(&html_table(&table::summary(report)));
    let _ = writeln!(
        out,
        "<p class=\"muted\">{}; a marked figure is past its SLO threshold or under its objective.</p>",
        escape(table::SUMMARY_NOTE)
    );
    if report.failures.count > 0 {
        let _ = writeln!(
            out,
            "<h2>Failed requests: {} (outcome not ok), by reason</h2>",
            report.failures.count
        );
        out.push_str(&html_table(&table::failures(
            &report.failures,
            report.by_deployment,
        )));
    }
    for g in &report.groups {
        group(&mut out, report, g);
    }
    if let (Some(total), true) = (&report.bend_total, report.groups.len() > 1) {
        out.push_str("<h2>All routes: the bend against requests in flight in the proxy</h2>\n");
        bend(&mut out, total, "all routes", None);
    }
    for p in &report.pods {
        pods(&mut out, p);
    }
    slowest(&mut out, report);
    out.push_str("</body>\n</html>\n");
    out
}

/// A deployment's pods, and the pod the slowest requests or the violations concentrate on.
fn pods(out: &mut String, p: &Pods) {
    let _ = writeln!(
        out,
        "<h2>Pods of {}</h2>",
        p.deployment.as_deref().map_or_else(
            || "the records".to_string(),
            |d| format!("deployment {}", escape(d))
        )
    );
    let _ = writeln!(
        out,
        "<p>{} requests; the {} slowest take {} or more (E2E); {} of {} judged requests violated \
         their SLO.</p>",
        p.requests,
        p.slowest,
        p.slowest_from_ms.map_or_else(|| "–".into(), ms),
        p.violated,
        p.judged
    );
    out.push_str(&html_table(&table::pods(p)));
    let class = if p.concentrated.is_empty() {
        "verdict none"
    } else {
        "verdict"
    };
    let _ = writeln!(
        out,
        "<p class=\"{class}\"><b>The pods:</b> {}</p>\n<p class=\"muted\">({})</p>",
        escape(&p.verdict),
        escape(&pods::rule())
    );
}

fn group(out: &mut String, report: &Report, g: &Group) {
    let _ = writeln!(
        out,
        "<h2>{}</h2>",
        group_name(
            report,
            g.deployment.as_deref(),
            &g.route,
            g.model.as_deref()
        )
    );
    let mut summary = format!("{} requests, {} not ok", g.requests, g.errors);
    match g.attainment {
        Some(a) => {
            let _ = write!(
                summary,
                "; goodput {} req/s over its {:.1} s of activity (first request to last; {} req/s over the whole span), SLO attainment {:.1} % ({} good, {} violated)",
                cell(g.goodput_per_active_s, 2),
                g.active_s,
                cell(g.goodput_per_s, 2),
                a * 100.0,
                g.good,
                g.violated
            );
        }
        None => summary.push_str("; no SLO judged on this route"),
    }
    let _ = writeln!(out, "<p>{summary}</p>");
    if let Some(slo) = &g.slo {
        let _ = writeln!(
            out,
            "<p class=\"muted\">SLO (from the configuration): {}</p>",
            escape(&table::slo_line(slo))
        );
    }
    out.push_str("<div class=\"row\">\n<div>\n<h3>Percentiles</h3>\n");
    out.push_str(&html_table(&table::percentiles(g)));
    out.push_str("</div>\n<div>\n");
    bend_table(out, &g.bend, g.slo.as_ref());
    out.push_str("</div>\n</div>\n");
    verdict(out, &g.bend);
    let slo = g.slo.as_ref();
    out.push_str("<div class=\"plots\">\n");
    out.push_str(&figure(bend_svg(
        &g.bend,
        "latency and output tokens/s against in flight",
        slo,
    )));
    out.push_str(&figure(histogram_svg(
        &g.ttft,
        &g.ttft_ms,
        slo.and_then(|s| s.ttft_ms),
    )));
    out.push_str(&figure(timeline_svg(&g.timeline, slo)));
    out.push_str("</div>\n");
}

fn verdict(out: &mut String, b: &Bend) {
    let class = if b.knee.is_some() {
        "verdict"
    } else {
        "verdict none"
    };
    let _ = writeln!(
        out,
        "<p class=\"{class}\"><b>The bend:</b> {}</p>",
        escape(&b.verdict)
    );
}

fn bend_table(out: &mut String, b: &Bend, slo: Option<&SloShown>) {
    let _ = writeln!(
        out,
        "<h3>The bend, by <code>{}</code> at arrival</h3>",
        b.by
    );
    out.push_str(&html_table(&table::bend(
        b,
        slo,
        super::analyze::MIN_LEVEL_REQUESTS,
    )));
}

fn bend(out: &mut String, b: &Bend, what: &str, slo: Option<&SloShown>) {
    bend_table(out, b, slo);
    verdict(out, b);
    out.push_str("<div class=\"plots\">\n");
    out.push_str(&figure(bend_svg(
        b,
        &format!("{what}: latency and output tokens/s against in flight"),
        slo,
    )));
    out.push_str("</div>\n");
}

fn slowest(out: &mut String, report: &Report) {
    let _ = writeln!(
        out,
        "<h2>The {} slowest requests, by E2E</h2>\n<table>",
        report.slowest.len()
    );
    out.push_str(
        "<tr><th>#</th><th>E2E (ms)</th><th>TTFT (ms)</th><th>prompt / output</th>\
         <th>in flight</th><th class=\"l\">route / model</th><th class=\"l\">request</th>\
         <th class=\"l\">likely causes, most telling first</th></tr>\n",
    );
    for (i, s) in report.slowest.iter().enumerate() {
        let tokens = match (s.prompt_tokens, s.output_tokens) {
            (Some(p), Some(o)) => format!("{p} / {o}"),
            (None, Some(o)) => format!("– / {o}"),
            _ => "–".into(),
        };
        let mut causes = String::from("<ul class=\"causes\">");
        for c in &s.causes {
            let _ = write!(
                causes,
                "<li><span class=\"cause\">{}</span>: {}</li>",
                escape(c.cause),
                escape(&c.evidence)
            );
        }
        causes.push_str("</ul>");
        let _ = writeln!(
            out,
            "<tr><td>{}</td><td>{:.0}</td><td>{}</td><td>{tokens}</td><td>{}</td>\
             <td class=\"l nowrap\">{}</td><td class=\"l\">{}<br><span class=\"muted\">{}<br>{}:{}</span></td>\
             <td class=\"l\">{causes}</td></tr>",
            i + 1,
            s.e2e_ms,
            cell(s.ttft_ms, 0),
            s.in_flight.map_or_else(|| "–".into(), |n| n.to_string()),
            group_name(report, s.deployment.as_deref(), &s.route, s.model.as_deref()),
            escape(s.request_id.as_deref().unwrap_or("(no id)"))
                + &s.pod
                    .as_deref()
                    .map_or_else(String::new, |p| format!(" on pod {}", escape(p))),
            escape(&s.ts),
            escape(&s.file),
            s.line
        );
    }
    out.push_str("</table>\n");
}

fn draw_error(e: &dyn std::fmt::Display) -> String {
    e.to_string()
}

/// TTFT p50 and p99 and E2E p99 (left axis, ms) and output tokens/s (right axis) against the
/// concurrency levels, evenly spaced and named; the knee marked by a dashed line. Lines join the
/// judged levels only; a level with too few requests is a faint point, so one request cannot
/// bend a curve. The SLO's TTFT and E2E thresholds, when given, are black dashed lines.
fn bend_svg(b: &Bend, title: &str, slo: Option<&SloShown>) -> Result<(String, Vec<Key>), String> {
    if b.levels.is_empty() {
        return Err("no record carries a concurrency at arrival".into());
    }
    let n = b.levels.len();
    type Get = fn(&Level) -> Option<f64>;
    let points = |get: Get, judged: bool| -> Vec<(f64, f64)> {
        b.levels
            .iter()
            .enumerate()
            .filter(|(_, l)| l.judged == judged)
            .filter_map(|(i, l)| Some((i as f64, get(l)?)))
            .collect()
    };
    let latency: [(&str, RGBColor, Get); 3] = [
        ("TTFT p50 (ms)", TTFT_P50, |l| l.ttft_p50_ms),
        ("TTFT p99 (ms)", TTFT_P99, |l| l.ttft_p99_ms),
        ("E2E p99 (ms)", E2E_P99, |l| l.e2e_p99_ms),
    ];
    let tokens: Get = |l| l.output_tokens_per_s;
    let top = |gets: &[Get]| {
        b.levels
            .iter()
            .flat_map(|l| gets.iter().filter_map(move |get| get(l)))
            .fold(0.0f64, f64::max)
            .max(1.0)
            * 1.08
    };
    let thresholds = slo_lines(slo, &[("TTFT", |s| s.ttft_ms), ("E2E", |s| s.e2e_ms)]);
    let ms_top = thresholds
        .iter()
        .map(|t| t.1 * 1.08)
        .fold(top(&latency.map(|c| c.2)), f64::max);
    let tokens_top = top(&[tokens]);
    let labels: Vec<String> = b.levels.iter().map(|l| l.concurrency.clone()).collect();
    let x_range = -0.5..(n as f64 - 0.5);
    let mut keys = Vec::new();

    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, PLOT).into_drawing_area();
        root.fill(&WHITE).map_err(|e| draw_error(&e))?;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 17))
            .margin(10)
            .x_label_area_size(40)
            .y_label_area_size(58)
            .right_y_label_area_size(58)
            .build_cartesian_2d(x_range.clone(), 0.0..ms_top)
            .map_err(|e| draw_error(&e))?
            .set_secondary_coord(x_range, 0.0..tokens_top);
        let label_of = |v: &f64| {
            let i = v.round();
            if (v - i).abs() < 1e-6 && i >= 0.0 {
                labels.get(i as usize).cloned().unwrap_or_default()
            } else {
                String::new()
            }
        };
        chart
            .configure_mesh()
            .x_labels(n)
            .x_label_formatter(&label_of)
            .x_desc(format!("requests in flight at arrival ({})", b.by))
            .y_desc("latency (ms)")
            .y_label_formatter(&|y| format!("{y:.0}"))
            .light_line_style(WHITE.mix(0.0))
            .draw()
            .map_err(|e| draw_error(&e))?;
        chart
            .configure_secondary_axes()
            .y_desc("output tokens/s")
            .y_label_formatter(&|y| format!("{y:.0}"))
            .draw()
            .map_err(|e| draw_error(&e))?;
        if let Some(k) = &b.knee {
            if let Some(i) = b.levels.iter().position(|l| l.high == k.high) {
                chart
                    .draw_series(DashedLineSeries::new(
                        [(i as f64, 0.0), (i as f64, ms_top)],
                        6,
                        4,
                        BEND.stroke_width(2),
                    ))
                    .map_err(|e| draw_error(&e))?;
                keys.push(Key {
                    label: format!("the bend: past {} in flight", k.concurrency),
                    colour: BEND,
                    dashed: true,
                });
            }
        }
        for (label, value, dashes) in &thresholds {
            chart
                .draw_series(DashedLineSeries::new(
                    [(-0.5, *value), (n as f64 - 0.5, *value)],
                    *dashes,
                    4,
                    SLO.stroke_width(2),
                ))
                .map_err(|e| draw_error(&e))?;
            keys.push(slo_key(label, *value));
        }
        let faint = |colour: RGBColor| colour.mix(0.35).filled();
        for (label, colour, get) in latency {
            chart
                .draw_series(
                    LineSeries::new(points(get, true), colour.stroke_width(2)).point_size(3),
                )
                .map_err(|e| draw_error(&e))?;
            chart
                .draw_series(
                    points(get, false)
                        .into_iter()
                        .map(|p| Circle::new(p, 3, faint(colour))),
                )
                .map_err(|e| draw_error(&e))?;
            keys.push(Key {
                label: label.into(),
                colour,
                dashed: false,
            });
        }
        chart
            .draw_secondary_series(
                LineSeries::new(points(tokens, true), TOKENS.stroke_width(3)).point_size(3),
            )
            .map_err(|e| draw_error(&e))?;
        chart
            .draw_secondary_series(
                points(tokens, false)
                    .into_iter()
                    .map(|p| Circle::new(p, 3, faint(TOKENS))),
            )
            .map_err(|e| draw_error(&e))?;
        keys.push(Key {
            label: "output tokens/s (right axis)".into(),
            colour: TOKENS,
            dashed: false,
        });
        root.present().map_err(|e| draw_error(&e))?;
    }
    if b.levels.iter().any(|l| !l.judged) {
        keys.push(Key {
            label: "faint points: too few requests to judge".into(),
            colour: RGBColor(190, 195, 205),
            dashed: false,
        });
    }
    Ok((svg, keys))
}

/// One of an SLO's thresholds, in ms.
type Threshold = fn(&SloShown) -> Option<f64>;

/// The SLO thresholds `wanted` that `slo` sets: `(name, ms, dash length)`, a different dash
/// for each so that two lines on one plot are told apart without colour.
fn slo_lines(
    slo: Option<&SloShown>,
    wanted: &[(&'static str, Threshold)],
) -> Vec<(&'static str, f64, u32)> {
    let Some(slo) = slo else { return Vec::new() };
    wanted
        .iter()
        .zip([10u32, 3])
        .filter_map(|((name, get), dash)| Some((*name, get(slo)?, dash)))
        .collect()
}

fn slo_key(name: &str, value: f64) -> Key {
    Key {
        label: format!("{name} SLO {}", ms(value)),
        colour: SLO,
        dashed: true,
    }
}

/// Tick labels with as many decimals as the axis's range needs, so that no two ticks of a short
/// axis read the same (0.2, 0.4, ..., not 0, 0, ...).
fn tick_decimals(range: f64) -> usize {
    let step = range / 10.0;
    if step >= 1.0 || step <= 0.0 {
        0
    } else {
        (-step.log10()).ceil().min(6.0) as usize
    }
}

/// A count axis's label: whole numbers only, nothing between them.
fn count_label(y: &f64) -> String {
    if (y - y.round()).abs() < 1e-9 {
        format!("{y:.0}")
    } else {
        String::new()
    }
}

/// How many successful requests had each TTFT, in equal bins from 0 to past the largest (twice
/// it when every request falls in one bucket, so a lone bar stands mid-plot), with p50 and p99
/// and the TTFT SLO marked. Counts come from the sketch's buckets, each placed within the
/// sketch's 1 %.
fn histogram_svg(
    ttft: &Quantiles,
    spread: &Spread,
    slo_ttft: Option<f64>,
) -> Result<(String, Vec<Key>), String> {
    let buckets = ttft.buckets();
    let Some(&(largest, _)) = buckets.last() else {
        return Err("no request has a TTFT".into());
    };
    let reach = if buckets.len() == 1 {
        largest * 2.0
    } else {
        largest * 1.0001
    };
    let reach = reach.max(slo_ttft.map_or(0.0, |t| t * 1.05)).max(1e-3);
    let width = reach / HISTOGRAM_BINS as f64;
    let mut counts = [0u64; HISTOGRAM_BINS];
    for &(value, n) in &buckets {
        let bin = ((value / width) as usize).min(HISTOGRAM_BINS - 1);
        counts[bin] += n;
    }
    let most = counts.iter().copied().max().unwrap_or(1).max(1) as f64;
    let y_top = (most * 1.15).max(most + 1.0);
    let x_top = width * HISTOGRAM_BINS as f64;
    let x_decimals = tick_decimals(x_top);
    let mut keys = vec![Key {
        label: format!("successful requests per {} of TTFT", ms(width)),
        colour: TTFT_P50,
        dashed: false,
    }];
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, PLOT).into_drawing_area();
        root.fill(&WHITE).map_err(|e| draw_error(&e))?;
        let mut chart = ChartBuilder::on(&root)
            .caption("TTFT histogram", ("sans-serif", 17))
            .margin(10)
            .x_label_area_size(40)
            .y_label_area_size(58)
            .build_cartesian_2d(0.0..x_top, 0.0..y_top)
            .map_err(|e| draw_error(&e))?;
        chart
            .configure_mesh()
            .x_desc("TTFT (ms)")
            .y_desc("requests")
            .x_labels(8)
            .y_labels((y_top as usize + 1).min(10))
            .x_label_formatter(&|x| format!("{x:.x_decimals$}"))
            .y_label_formatter(&count_label)
            .light_line_style(WHITE.mix(0.0))
            .draw()
            .map_err(|e| draw_error(&e))?;
        let bar = TTFT_P50;
        chart
            .draw_series(
                counts
                    .iter()
                    .enumerate()
                    .filter(|(_, &c)| c > 0)
                    .map(|(i, &c)| {
                        let x0 = i as f64 * width;
                        Rectangle::new([(x0, 0.0), (x0 + width * 0.92, c as f64)], bar.filled())
                    }),
            )
            .map_err(|e| draw_error(&e))?;
        let marks = [
            ("p50", spread.p50, MEDIAN, 6),
            ("p99", spread.p99, TTFT_P99, 6),
            ("TTFT SLO", slo_ttft, SLO, 10),
        ];
        for (label, value, colour, dash) in marks {
            let Some(v) = value else { continue };
            chart
                .draw_series(DashedLineSeries::new(
                    [(v, 0.0), (v, y_top)],
                    dash,
                    4,
                    colour.stroke_width(2),
                ))
                .map_err(|e| draw_error(&e))?;
            keys.push(Key {
                label: format!("{label} {}", ms(v)),
                colour,
                dashed: true,
            });
        }
        root.present().map_err(|e| draw_error(&e))?;
    }
    Ok((svg, keys))
}

/// A time axis's label: `HH:MM` (UTC), with the date when the span passes a day.
fn clock(at_s: f64, with_date: bool) -> String {
    let text = humantime::format_rfc3339_seconds(
        std::time::UNIX_EPOCH + std::time::Duration::from_secs_f64(at_s.max(0.0)),
    )
    .to_string();
    // 2026-01-01T12:34:56Z
    match (with_date, text.get(5..10), text.get(11..16)) {
        (true, Some(date), Some(time)) => format!("{date} {time}"),
        (_, _, Some(time)) => time.to_string(),
        _ => text,
    }
}

/// TTFT p50 and p99 and E2E p99 per time bucket over the records' span, with the SLO's TTFT and
/// E2E thresholds as black dashed lines; a bucket with no successful request has no point.
fn timeline_svg(t: &Timeline, slo: Option<&SloShown>) -> Result<(String, Vec<Key>), String> {
    let (Some(first), Some(last)) = (t.points.first(), t.points.last()) else {
        return Err("no request in the timeline".into());
    };
    let (x0, x1) = (first.at_s, last.at_s + t.bucket_s);
    type Get = fn(&super::analyze::Point) -> Option<f64>;
    let lines: [(&str, RGBColor, Get); 3] = [
        ("TTFT p50 (ms)", TTFT_P50, |p| p.ttft_p50_ms),
        ("TTFT p99 (ms)", TTFT_P99, |p| p.ttft_p99_ms),
        ("E2E p99 (ms)", E2E_P99, |p| p.e2e_p99_ms),
    ];
    let thresholds = slo_lines(slo, &[("TTFT", |s| s.ttft_ms), ("E2E", |s| s.e2e_ms)]);
    let y_top = t
        .points
        .iter()
        .flat_map(|p| lines.iter().filter_map(move |l| l.2(p)))
        .chain(thresholds.iter().map(|t| t.1))
        .fold(0.0f64, f64::max)
        .max(1e-3)
        * 1.08;
    let with_date = x1 - x0 > 86_400.0;
    let y_decimals = tick_decimals(y_top);
    let mut keys = Vec::new();
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, PLOT).into_drawing_area();
        root.fill(&WHITE).map_err(|e| draw_error(&e))?;
        let mut chart = ChartBuilder::on(&root)
            .caption("latency over time", ("sans-serif", 17))
            .margin(10)
            .x_label_area_size(40)
            .y_label_area_size(58)
            .build_cartesian_2d(x0..x1, 0.0..y_top)
            .map_err(|e| draw_error(&e))?;
        chart
            .configure_mesh()
            .x_labels(6)
            .x_label_formatter(&|x| clock(*x, with_date))
            .x_desc(format!(
                "arrival (UTC), per {} bucket",
                duration_words(t.bucket_s)
            ))
            .y_desc("latency (ms)")
            .y_label_formatter(&|y| format!("{y:.y_decimals$}"))
            .light_line_style(WHITE.mix(0.0))
            .draw()
            .map_err(|e| draw_error(&e))?;
        for (label, value, dashes) in &thresholds {
            chart
                .draw_series(DashedLineSeries::new(
                    [(x0, *value), (x1, *value)],
                    *dashes,
                    4,
                    SLO.stroke_width(2),
                ))
                .map_err(|e| draw_error(&e))?;
            keys.push(slo_key(label, *value));
        }
        for (label, colour, get) in lines {
            let points: Vec<(f64, f64)> = t
                .points
                .iter()
                .filter_map(|p| Some((p.at_s + t.bucket_s / 2.0, get(p)?)))
                .collect();
            chart
                .draw_series(LineSeries::new(points, colour.stroke_width(2)).point_size(2))
                .map_err(|e| draw_error(&e))?;
            keys.push(Key {
                label: label.into(),
                colour,
                dashed: false,
            });
        }
        root.present().map_err(|e| draw_error(&e))?;
    }
    Ok((svg, keys))
}

/// A bucket width in words: `1 min`, `16 min`, `2.1 h`.
fn duration_words(seconds: f64) -> String {
    if seconds < 3600.0 {
        format!("{:.0} min", seconds / 60.0)
    } else {
        format!("{:.1} h", seconds / 3600.0)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    /// Every `<text>` element of an SVG: its `x`, its `y` and its text.
    fn texts(svg: &str) -> Vec<(String, String, String)> {
        let attribute = |t: &str, name: &str| -> String {
            let key = format!(" {name}=\"");
            t.find(&key)
                .and_then(|at| {
                    let rest = &t[at + key.len()..];
                    Some(rest[..rest.find('"')?].to_string())
                })
                .unwrap_or_default()
        };
        svg.split("<text")
            .skip(1)
            .filter_map(|t| {
                let start = t.find('>')? + 1;
                let end = t.find("</text>")?;
                let text = t.get(start..end)?.trim().to_string();
                Some((attribute(t, "x"), attribute(t, "y"), text))
            })
            .collect()
    }

    /// Each axis's numeric tick labels (an axis's labels share a row or a column): none the
    /// same, and at least two on each.
    fn assert_distinct_ticks(svg: &str) {
        let numbers: Vec<(String, String, String)> = texts(svg)
            .into_iter()
            .filter(|t| !t.2.is_empty() && t.2.parse::<f64>().is_ok())
            .collect();
        let mut axes: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (x, y, text) in &numbers {
            axes.entry(format!("row {y}"))
                .or_default()
                .push(text.clone());
            axes.entry(format!("column {x}"))
                .or_default()
                .push(text.clone());
        }
        let axes: Vec<&Vec<String>> = axes.values().filter(|labels| labels.len() >= 2).collect();
        assert!(axes.len() >= 2, "an axis without labels: {numbers:?}");
        for labels in axes {
            let mut unique = labels.clone();
            unique.sort();
            unique.dedup();
            assert_eq!(
                unique.len(),
                labels.len(),
                "repeated tick labels: {labels:?}"
            );
        }
    }

    #[test]
    fn a_one_sample_histogram_has_sane_axes() {
        for value in [0.4, 80.0, 0.0, 25_000.0] {
            let mut q = Quantiles::default();
            q.add(value);
            let spread = q.spread();
            let (svg, keys) = histogram_svg(&q, &spread, None).expect("a plot");
            assert_distinct_ticks(&svg);
            // The count axis says 1, and nothing but whole numbers.
            let labels: Vec<String> = texts(&svg).into_iter().map(|t| t.2).collect();
            assert!(labels.iter().any(|t| t == "1"), "{labels:?}");
            assert!(
                !labels.iter().any(|t| t == "0.5" || t == "1.2"),
                "{labels:?}"
            );
            assert!(keys.iter().any(|k| k.label.starts_with("p50")));
        }
        // With an SLO, its line is on the plot and named in the legend.
        let mut q = Quantiles::default();
        q.add(80.0);
        let (_, keys) = histogram_svg(&q, &q.spread(), Some(300.0)).expect("a plot");
        assert!(
            keys.iter().any(|k| k.label == "TTFT SLO 300 ms"),
            "{:?}",
            keys.iter().map(|k| &k.label).collect::<Vec<_>>()
        );
    }

    #[test]
    fn record_text_cannot_become_markup() {
        assert_eq!(
            escape("<script>alert('x')</script>&\""),
            "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;&amp;&quot;"
        );
    }
}
