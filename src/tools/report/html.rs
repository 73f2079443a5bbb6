//! `--html FILE`: the report as one self-contained page (inline CSS, inline SVG drawn here by
//! plotters' SVG backend, no script and nothing fetched), so it can be mailed, attached to an
//! incident or opened from a laptop with no network. It holds the tables of the terminal report
//! and the plots people read faster: latency percentiles and output tokens/s against
//! concurrency with the bend marked, a TTFT histogram per route, each deployment's pods with
//! the pod the slowest requests or the violations concentrate on, and the slowest requests.
//!
//! Everything that came from a record file is escaped: a route or request id is data, never
//! markup.

use std::fmt::Write as _;

use plotters::prelude::*;

use super::analyze::{Bend, Group, Level, Report, Spread};
use super::cause::ms;
use super::pods::{self, Pods};

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

const TTFT_P50: RGBColor = RGBColor(66, 133, 244);
const TTFT_P99: RGBColor = RGBColor(219, 68, 55);
const E2E_P99: RGBColor = RGBColor(150, 90, 200);
const TOKENS: RGBColor = RGBColor(15, 157, 88);
const BEND: RGBColor = RGBColor(240, 160, 32);
const MEDIAN: RGBColor = RGBColor(15, 157, 88);

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

fn name(route: &str, model: Option<&str>) -> String {
    format!(
        "{} / {}",
        escape(route),
        escape(model.unwrap_or("(no model)"))
    )
}

/// A group's name, after its deployment when the report is split by deployment.
fn group_name(
    report: &Report,
    deployment: Option<&str>,
    route: &str,
    model: Option<&str>,
) -> String {
    if report.by_deployment {
        format!(
            "{}: {}",
            escape(deployment.unwrap_or("(no deployment)")),
            name(route, model)
        )
    } else {
        name(route, model)
    }
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
    for g in &report.groups {
        group(&mut out, report, g);
    }
    if let (Some(total), true) = (&report.bend_total, report.groups.len() > 1) {
        out.push_str("<h2>All routes: the bend against requests in flight in the proxy</h2>\n");
        bend(&mut out, total, "all routes");
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
    out.push_str(
        "<table>\n<tr><th class=\"l\">pod</th><th>requests</th><th>share</th>\
         <th>of the slowest</th><th>violated</th></tr>\n",
    );
    for pod in &p.pods {
        let named = p.concentrated.iter().any(|c| c.pod == pod.pod);
        let _ = writeln!(
            out,
            "<tr{}><td class=\"l\">{}</td><td>{}</td><td>{:.1} %</td><td>{}</td><td>{}</td></tr>",
            if named { " class=\"knee\"" } else { "" },
            escape(&pod.pod),
            pod.requests,
            pod.share * 100.0,
            pod.slowest,
            pod.violated
        );
    }
    out.push_str("</table>\n");
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
                "; goodput {} req/s, SLO attainment {:.1} % ({} good, {} violated)",
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
        let mut parts = Vec::new();
        for (label, value) in [
            ("TTFT", slo.ttft_ms),
            ("TPOT", slo.tpot_ms),
            ("E2E", slo.e2e_ms),
            ("max ITL", slo.max_itl_ms),
        ] {
            if let Some(v) = value {
                parts.push(format!("{label} &le; {}", ms(v)));
            }
        }
        if let Some(o) = slo.objective {
            parts.push(format!("objective {} %", o * 100.0));
        }
        let _ = writeln!(
            out,
            "<p class=\"muted\">SLO (from the configuration): {}</p>",
            parts.join(", ")
        );
    }
    out.push_str("<div class=\"row\">\n<div>\n<h3>Percentiles</h3>\n<table>\n");
    out.push_str("<tr><th class=\"l\"></th><th>p50</th><th>p95</th><th>p99</th></tr>\n");
    let rows: [(&str, Spread, usize); 6] = [
        ("TTFT (ms)", g.ttft_ms, 1),
        ("TPOT (ms)", g.tpot_ms, 1),
        ("max ITL (ms)", g.max_itl_ms, 1),
        ("E2E (ms)", g.e2e_ms, 1),
        ("prompt tokens", g.prompt_tokens, 0),
        ("output tokens", g.output_tokens, 0),
    ];
    for (label, s, d) in rows {
        let _ = writeln!(
            out,
            "<tr><td class=\"l\">{label}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            cell(s.p50, d),
            cell(s.p95, d),
            cell(s.p99, d)
        );
    }
    out.push_str("</table>\n</div>\n<div>\n");
    bend_table(out, &g.bend);
    out.push_str("</div>\n</div>\n");
    verdict(out, &g.bend);
    out.push_str("<div class=\"plots\">\n");
    out.push_str(&figure(bend_svg(
        &g.bend,
        "latency and output tokens/s against in flight",
    )));
    out.push_str(&figure(histogram_svg(&g.ttft_samples, &g.ttft_ms)));
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

fn bend_table(out: &mut String, b: &Bend) {
    let _ = writeln!(
        out,
        "<h3>The bend, by <code>{}</code> at arrival</h3>\n<table>",
        b.by
    );
    out.push_str(
        "<tr><th>in flight</th><th>requests</th><th>TTFT p50</th><th>TTFT p99</th>\
         <th>E2E p99</th><th>output tok/s</th></tr>\n",
    );
    for l in &b.levels {
        let class = if b.knee.as_ref().is_some_and(|k| k.high == l.high) {
            " class=\"knee\""
        } else if !l.judged {
            " class=\"thin\" title=\"too few requests to judge\""
        } else {
            ""
        };
        let _ = writeln!(
            out,
            "<tr{class}><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            escape(&l.concurrency),
            l.requests,
            cell(l.ttft_p50_ms, 1),
            cell(l.ttft_p99_ms, 1),
            cell(l.e2e_p99_ms, 1),
            cell(l.output_tokens_per_s, 1)
        );
    }
    out.push_str("</table>\n");
}

fn bend(out: &mut String, b: &Bend, what: &str) {
    bend_table(out, b);
    verdict(out, b);
    out.push_str("<div class=\"plots\">\n");
    out.push_str(&figure(bend_svg(
        b,
        &format!("{what}: latency and output tokens/s against in flight"),
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
/// bend a curve.
fn bend_svg(b: &Bend, title: &str) -> Result<(String, Vec<Key>), String> {
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
    let ms_top = top(&latency.map(|c| c.2));
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

/// How many successful requests had each TTFT, in equal bins from 0 to the largest, with p50
/// and p99 marked.
fn histogram_svg(sorted: &[f64], spread: &Spread) -> Result<(String, Vec<Key>), String> {
    let Some(&largest) = sorted.last() else {
        return Err("no request has a TTFT".into());
    };
    let width = (largest.max(1e-3) * 1.0001) / HISTOGRAM_BINS as f64;
    let mut counts = [0u32; HISTOGRAM_BINS];
    for &t in sorted {
        let bin = ((t / width) as usize).min(HISTOGRAM_BINS - 1);
        counts[bin] += 1;
    }
    let most = counts.iter().copied().max().unwrap_or(1).max(1);
    let x_top = width * HISTOGRAM_BINS as f64;
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
            .build_cartesian_2d(0.0..x_top, 0.0..f64::from(most) * 1.15)
            .map_err(|e| draw_error(&e))?;
        chart
            .configure_mesh()
            .x_desc("TTFT (ms)")
            .y_desc("requests")
            .x_label_formatter(&|x| format!("{x:.0}"))
            .y_label_formatter(&|y| format!("{y:.0}"))
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
                        Rectangle::new([(x0, 0.0), (x0 + width * 0.92, f64::from(c))], bar.filled())
                    }),
            )
            .map_err(|e| draw_error(&e))?;
        let marks = [("p50", spread.p50, MEDIAN), ("p99", spread.p99, TTFT_P99)];
        for (label, value, colour) in marks {
            let Some(v) = value else { continue };
            chart
                .draw_series(DashedLineSeries::new(
                    [(v, 0.0), (v, f64::from(most) * 1.15)],
                    6,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_text_cannot_become_markup() {
        assert_eq!(
            escape("<script>alert('x')</script>&\""),
            "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;&amp;&quot;"
        );
    }
}
