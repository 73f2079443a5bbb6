//! The report as a terminal reads it: a header naming what was read; a summary of every route
//! and model, worst first; the failed requests by reason; then per route and model (per
//! deployment, when split) the percentile table, goodput and attainment and the bend; then each
//! deployment's pods and whether the slowest requests or the violations concentrate on one; then
//! the slowest requests, each with its causes on the lines below it. The tables are
//! [`super::table`]'s, padded here; a figure past its SLO threshold ends in `!`.

use std::fmt::Write as _;

use super::analyze::{Bend, Group, Report, MIN_LEVEL_REQUESTS};
use super::figures::ms;
use super::pods::{self, Pods};
use super::table::{self, group_name, slo_line, Align, Table};

/// The mark after a figure past its SLO threshold (or an attainment under its objective).
const OVER: &str = "!";

/// `t`, its columns padded to their widest cell, each line after `indent`.
pub fn write_table(out: &mut String, t: &Table, indent: &str) {
    let text = |c: &table::Cell| {
        if c.over {
            format!("{}{OVER}", c.text)
        } else {
            c.text.clone()
        }
    };
    let widths: Vec<usize> = t
        .columns
        .iter()
        .enumerate()
        .map(|(i, c)| {
            t.rows
                .iter()
                .filter_map(|r| r.cells.get(i))
                .map(|cell| text(cell).chars().count())
                .chain([c.title.chars().count()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let line = |cells: Vec<String>| -> String {
        let padded: Vec<String> = cells
            .iter()
            .zip(&t.columns)
            .zip(&widths)
            .map(|((cell, column), &w)| match column.align {
                Align::Left => format!("{cell:<w$}"),
                Align::Right => format!("{cell:>w$}"),
            })
            .collect();
        padded.join("  ").trim_end().to_string()
    };
    let _ = writeln!(
        out,
        "{indent}{}",
        line(t.columns.iter().map(|c| c.title.to_string()).collect())
    );
    for r in &t.rows {
        let mut l = line(r.cells.iter().map(text).collect());
        if let Some(note) = &r.note {
            let _ = write!(l, "  ({note})");
        }
        let _ = writeln!(out, "{indent}{l}");
    }
}

/// A deployment's pods: their requests, slowest requests and violations, and the finding.
fn pods(out: &mut String, p: &Pods) {
    let _ = writeln!(
        out,
        "\npods of {}: {} requests, the {} slowest from {} E2E, {} of {} judged requests violated",
        p.deployment
            .as_deref()
            .map_or_else(|| "the records".to_string(), |d| format!("deployment {d}")),
        p.requests,
        p.slowest,
        p.slowest_from_ms.map_or_else(|| "-".into(), ms),
        p.violated,
        p.judged
    );
    write_table(out, &table::pods(p), "  ");
    let _ = writeln!(out, "  finding: {}", p.verdict);
}

/// The bend's table and verdict, each line indented by `indent`.
pub fn bend(out: &mut String, b: &Bend, g: Option<&Group>, indent: &str) {
    let slo = g.and_then(|g| g.slo.as_ref());
    write_table(out, &table::bend(b, slo, MIN_LEVEL_REQUESTS), indent);
    let _ = writeln!(out, "{indent}bend: {}", b.verdict);
}

/// The whole report, as printed on stdout.
pub fn render(report: &Report) -> String {
    let mut out = String::new();
    let files = report.files.len();
    let _ = writeln!(
        out,
        "tokenmeter report: {} records from {files} file{}, {} to {} ({:.1} s)",
        report.records,
        if files == 1 { "" } else { "s" },
        report.start,
        report.end,
        report.span_s
    );
    for f in &report.files {
        let state = match (f.records, f.malformed) {
            (0, 0) => "empty".to_string(),
            (n, 0) => format!("{n} records"),
            (n, m) => format!("{n} records, {m} malformed lines skipped"),
        };
        let _ = writeln!(out, "  {}: {state} ({})", f.path, f.format.as_str());
    }
    if report.malformed.count > 0 {
        let _ = writeln!(
            out,
            "{} malformed line{} skipped, the first:",
            report.malformed.count,
            if report.malformed.count == 1 { "" } else { "s" }
        );
        for problem in &report.malformed.first {
            let _ = writeln!(out, "  {problem}");
        }
    }
    out.push_str("\nsummary, worst first:\n");
    write_table(&mut out, &table::summary(report), "  ");
    let _ = writeln!(
        out,
        "  ({}{})",
        table::SUMMARY_NOTE,
        if report.groups.iter().any(|g| g.slo.is_some()) {
            format!("; {OVER}: past the SLO threshold or under the objective")
        } else {
            String::new()
        }
    );
    if report.failures.count > 0 {
        let _ = writeln!(
            out,
            "\n{} failed request{} (outcome not ok), by reason:",
            report.failures.count,
            if report.failures.count == 1 { "" } else { "s" }
        );
        write_table(
            &mut out,
            &table::failures(&report.failures, report.by_deployment),
            "  ",
        );
    }
    for g in &report.groups {
        let _ = writeln!(
            out,
            "\n{}: {} requests, {} not ok",
            group_name(
                report.by_deployment,
                g.deployment.as_deref(),
                &g.route,
                g.model.as_deref()
            ),
            g.requests,
            g.errors
        );
        if let Some(slo) = &g.slo {
            let _ = writeln!(out, "  SLO (from --config): {}", slo_line(slo));
        }
        match g.attainment {
            Some(a) => {
                let _ = writeln!(
                    out,
                    "  goodput {} req/s over its {:.1} s of activity (first request to last; {} req/s over the whole span), SLO attainment {:.1} % ({} good, {} violated)",
                    table::figure(g.goodput_per_active_s, 2),
                    g.active_s,
                    table::figure(g.goodput_per_s, 2),
                    a * 100.0,
                    g.good,
                    g.violated
                );
            }
            None => out.push_str("  no SLO judged on this route: no goodput or attainment\n"),
        }
        write_table(&mut out, &table::percentiles(g), "  ");
        out.push_str("\n  the bend: latency and output tokens/s against requests in flight on the route at arrival\n");
        bend(&mut out, &g.bend, Some(g), "  ");
    }
    if let (Some(total), true) = (&report.bend_total, report.groups.len() > 1) {
        out.push_str("\nthe bend over all routes, against requests in flight in the proxy:\n");
        bend(&mut out, total, None, "  ");
    }
    for p in &report.pods {
        pods(&mut out, p);
    }
    if !report.pods.is_empty() {
        let _ = writeln!(out, "  ({})", pods::rule());
    }
    let _ = writeln!(
        out,
        "\nslowest {} requests, by E2E, with their likely causes (most telling first):",
        report.slowest.len()
    );
    for (i, s) in report.slowest.iter().enumerate() {
        let _ = writeln!(
            out,
            "{:>3}. {:>9}  {}  {}  {}  {}:{}",
            i + 1,
            ms(s.e2e_ms),
            s.request_id.as_deref().unwrap_or("(no id)"),
            group_name(
                report.by_deployment,
                s.deployment.as_deref(),
                &s.route,
                s.model.as_deref()
            ),
            s.ts,
            s.file,
            s.line
        );
        let mut facts = Vec::new();
        if let Some(pod) = &s.pod {
            facts.push(format!("pod {pod}"));
        }
        if let Some(t) = s.ttft_ms {
            facts.push(format!("TTFT {}", ms(t)));
        }
        if let (Some(p), Some(o)) = (s.prompt_tokens, s.output_tokens) {
            facts.push(format!("{p} prompt / {o} output tokens"));
        }
        if let Some(n) = s.in_flight {
            facts.push(format!("{n} in flight"));
        }
        if !facts.is_empty() {
            let _ = writeln!(out, "       {}", facts.join(", "));
        }
        for c in &s.causes {
            let _ = writeln!(out, "       {c}");
        }
    }
    out
}
