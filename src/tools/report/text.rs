//! The report as a terminal reads it: a header naming what was read, then per route and model
//! (per deployment, when split) the percentile table, goodput and attainment and the bend, then
//! each deployment's pods and whether the slowest requests or the violations concentrate on one,
//! then the slowest requests, each with its causes on the lines below it.

use std::fmt::Write as _;

use super::analyze::{Bend, Group, Report, SloShown, Spread, MIN_LEVEL_REQUESTS};
use super::cause::ms;
use super::pods::{self, Pods};

fn cell(value: Option<f64>, decimals: usize) -> String {
    value.map_or_else(|| "-".into(), |v| format!("{v:.decimals$}"))
}

fn route_name(route: &str, model: Option<&str>) -> String {
    format!("{route} / {}", model.unwrap_or("(no model)"))
}

/// A group's name: its route and model, after its deployment when the report is split.
fn group_name(
    by_deployment: bool,
    deployment: Option<&str>,
    route: &str,
    model: Option<&str>,
) -> String {
    if by_deployment {
        format!(
            "{}: {}",
            deployment.unwrap_or("(no deployment)"),
            route_name(route, model)
        )
    } else {
        route_name(route, model)
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
    let width = p
        .pods
        .iter()
        .map(|pod| pod.pod.len())
        .max()
        .unwrap_or(0)
        .max(3);
    let _ = writeln!(
        out,
        "  {:<width$}{:>10}{:>9}{:>10}{:>10}",
        "pod", "requests", "share", "slowest", "violated"
    );
    for pod in &p.pods {
        let _ = writeln!(
            out,
            "  {:<width$}{:>10}{:>8.1}%{:>10}{:>10}",
            pod.pod,
            pod.requests,
            pod.share * 100.0,
            pod.slowest,
            pod.violated
        );
    }
    let _ = writeln!(out, "  finding: {}", p.verdict);
}

fn slo_line(slo: &SloShown) -> String {
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

fn figures(out: &mut String, g: &Group) {
    let _ = writeln!(out, "  {:<16}{:>10}{:>10}{:>10}", "", "p50", "p95", "p99");
    let rows: [(&str, Spread, usize); 6] = [
        ("TTFT (ms)", g.ttft_ms, 1),
        ("TPOT (ms)", g.tpot_ms, 1),
        ("max ITL (ms)", g.max_itl_ms, 1),
        ("E2E (ms)", g.e2e_ms, 1),
        ("prompt tokens", g.prompt_tokens, 0),
        ("output tokens", g.output_tokens, 0),
    ];
    for (name, s, decimals) in rows {
        let _ = writeln!(
            out,
            "  {name:<16}{:>10}{:>10}{:>10}",
            cell(s.p50, decimals),
            cell(s.p95, decimals),
            cell(s.p99, decimals)
        );
    }
}

/// The bend's table and verdict, each line indented by `indent`.
pub fn bend(out: &mut String, b: &Bend, indent: &str) {
    let _ = writeln!(
        out,
        "{indent}{:>10}{:>10}{:>11}{:>11}{:>11}{:>15}",
        "in flight", "requests", "TTFT p50", "TTFT p99", "E2E p99", "output tok/s"
    );
    for l in &b.levels {
        let mark = if l.judged {
            String::new()
        } else {
            format!("  (fewer than {MIN_LEVEL_REQUESTS}: not judged)")
        };
        let _ = writeln!(
            out,
            "{indent}{:>10}{:>10}{:>11}{:>11}{:>11}{:>15}{mark}",
            l.concurrency,
            l.requests,
            cell(l.ttft_p50_ms, 1),
            cell(l.ttft_p99_ms, 1),
            cell(l.e2e_p99_ms, 1),
            cell(l.output_tokens_per_s, 1)
        );
    }
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
        match (g.attainment, g.goodput_per_s) {
            (Some(a), goodput) => {
                let _ = writeln!(
                    out,
                    "  goodput {} req/s, SLO attainment {:.1} % ({} good, {} violated)",
                    cell(goodput, 2),
                    a * 100.0,
                    g.good,
                    g.violated
                );
            }
            (None, _) => out.push_str("  no SLO judged on this route: no goodput or attainment\n"),
        }
        figures(&mut out, g);
        out.push_str("\n  the bend: latency and output tokens/s against requests in flight on the route at arrival\n");
        bend(&mut out, &g.bend, "  ");
    }
    if let (Some(total), true) = (&report.bend_total, report.groups.len() > 1) {
        out.push_str("\nthe bend over all routes, against requests in flight in the proxy:\n");
        bend(&mut out, total, "  ");
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
