//! `tokenmeter check`: is a configuration valid, and does it say what its author meant?
//!
//! A valid file prints what the proxy would run on, each route in match order with its match
//! and its SLO, so a threshold in the wrong unit or a missing objective shows before it serves.
//! Two mistakes that are valid YAML but never what anyone wants are warned about on stderr
//! (the exit stays 0, as the file is valid): a route that an earlier route makes unreachable,
//! and a route with SLO thresholds but no objective, which `tokenmeter rules` cannot alert on.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use wildmatch::WildMatch;

use crate::tools::cli::fail;
use crate::{Config, HeaderMatch, Match, Route, Slo};

/// The route every request no other route takes falls into (`config::DEFAULT_ROUTE`).
const DEFAULT_ROUTE: &str = "default";

#[derive(clap::Args, Debug)]
pub struct CheckArgs {
    /// The configuration file to check (or give it with --config).
    #[arg(
        value_name = "FILE",
        conflicts_with = "config",
        required_unless_present = "config"
    )]
    file: Option<PathBuf>,
    /// The configuration file to check, as the proxy takes it.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
}

/// Checks the file: exit 0 with its summary (and warnings on stderr), or 2 with one line.
pub fn main(args: CheckArgs) -> ExitCode {
    let Some(path) = args.file.or(args.config) else {
        return fail(&"check needs a configuration file: tokenmeter check FILE");
    };
    let config = match Config::load(&path) {
        Ok(config) => config,
        Err(e) => return fail(&e),
    };
    print!("{}: {}", path.display(), summary(&config));
    for warning in warnings(&config.routes) {
        eprintln!("tokenmeter: warning: {}: {warning}", path.display());
    }
    ExitCode::SUCCESS
}

/// What the proxy would run on: addresses, then every route in match order with its SLO.
pub fn summary(config: &Config) -> String {
    let mut out = format!(
        "ok (listen {}, admin {}, upstream {}, {} route(s))\n",
        config.listen,
        config.admin,
        config.upstream,
        config.routes.len()
    );
    out.push_str("routes, in match order (the first whose every condition holds wins):\n");
    let routes = config.routes.iter().filter(|r| r.name != DEFAULT_ROUTE);
    let default = config.routes.iter().find(|r| r.name == DEFAULT_ROUTE);
    let width = config
        .routes
        .iter()
        .map(|r| r.name.len())
        .chain([DEFAULT_ROUTE.len()])
        .max()
        .unwrap_or(0);
    for route in routes {
        out.push_str(&format!(
            "  {:width$}  match {}\n  {:width$}  {}\n",
            route.name,
            describe_match(&route.matcher),
            "",
            describe_slo(route.slo.as_ref())
        ));
    }
    out.push_str(&format!(
        "  {DEFAULT_ROUTE:width$}  every request no route above takes\n  {:width$}  {}\n",
        "",
        describe_slo(default.and_then(|r| r.slo.as_ref()))
    ));
    out
}

fn describe_match(m: &Match) -> String {
    let mut parts = Vec::new();
    if let Some(path) = &m.path {
        parts.push(format!("path {path}"));
    }
    if let Some(prefix) = &m.path_prefix {
        parts.push(format!("path_prefix {prefix}"));
    }
    if let Some(methods) = &m.methods {
        parts.push(format!("methods {}", methods.join(",")));
    }
    for (name, want) in m.headers.iter().flatten() {
        parts.push(match want {
            HeaderMatch::Present(_) => format!("header {name} present"),
            HeaderMatch::Exact(value) => format!("header {name}: {value}"),
        });
    }
    if let Some(model) = &m.model {
        parts.push(format!("model {model}"));
    }
    if parts.is_empty() {
        "every request (no conditions)".to_string()
    } else {
        parts.join(", ")
    }
}

fn describe_slo(slo: Option<&Slo>) -> String {
    let Some(slo) = slo else {
        return "no SLO: measured, never judged".to_string();
    };
    let thresholds: Vec<String> = [
        ("TTFT", slo.ttft),
        ("TPOT", slo.tpot),
        ("E2E", slo.e2e),
        ("max ITL", slo.max_itl),
    ]
    .into_iter()
    .filter_map(|(name, t)| Some(format!("{name} <= {}", duration(t?))))
    .collect();
    let thresholds = if thresholds.is_empty() {
        "no thresholds (good = outcome ok)".to_string()
    } else {
        thresholds.join(", ")
    };
    match slo.objective {
        Some(objective) => format!("SLO {thresholds}, objective {}", percent(objective)),
        None => format!("SLO {thresholds}, no objective (no alerts)"),
    }
}

fn duration(d: Duration) -> String {
    humantime::format_duration(d).to_string()
}

/// `0.99` as `99 %`, `0.999` as `99.9 %`: the fraction as written, without float noise.
fn percent(ratio: f64) -> String {
    let text = format!("{:.4}", ratio * 100.0);
    let text = text.trim_end_matches('0').trim_end_matches('.');
    format!("{text} %")
}

/// The mistakes a valid file can hold, one sentence each, in route order.
pub fn warnings(routes: &[Route]) -> Vec<String> {
    let mut out = Vec::new();
    let ordered: Vec<(usize, &Route)> = routes
        .iter()
        .enumerate()
        .filter(|(_, r)| r.name != DEFAULT_ROUTE)
        .collect();
    for (at, &(i, later)) in ordered.iter().enumerate() {
        if let Some(&(j, earlier)) = ordered[..at]
            .iter()
            .find(|(_, earlier)| covers(&earlier.matcher, &later.matcher))
        {
            out.push(format!(
                "routes[{i}] `{}` never gets a request: routes[{j}] `{}` comes first and matches every request it would ({})",
                later.name,
                earlier.name,
                describe_match(&earlier.matcher)
            ));
        }
    }
    // The default takes what no route matched: nothing, once a route matches every request.
    if let Some((i, default)) = routes
        .iter()
        .enumerate()
        .find(|(_, r)| r.name == DEFAULT_ROUTE && r.slo.is_some())
    {
        if let Some(&(j, earlier)) = ordered
            .iter()
            .find(|(_, r)| covers(&r.matcher, &Match::default()))
        {
            out.push(format!(
                "routes[{i}] `{}` never gets a request: routes[{j}] `{}` matches every request",
                default.name, earlier.name
            ));
        }
    }
    for (i, route) in routes.iter().enumerate() {
        let Some(slo) = &route.slo else { continue };
        let has_threshold =
            slo.ttft.is_some() || slo.tpot.is_some() || slo.e2e.is_some() || slo.max_itl.is_some();
        if has_threshold && slo.objective.is_none() {
            out.push(format!(
                "routes[{i}] `{}` has SLO thresholds but no objective, so it gets no alerts: `tokenmeter rules` alerts on the objective (add slo.objective, like 0.99)",
                route.name
            ));
        }
    }
    out
}

/// Whether every request that satisfies `later` also satisfies `earlier`, as far as the
/// conditions alone prove it (the router checks each key independently, all must hold):
/// - `path`: none, or the same exact path;
/// - `path_prefix`: none, or a prefix of the later route's `path_prefix` or exact `path`;
/// - `methods`: none, or a superset of the later route's methods (case-insensitively, as the
///   router upper-cases them);
/// - `headers`: each earlier condition is also on the later route (names case-insensitively),
///   with the same exact value, or the earlier one only asks for presence;
/// - `model`: none, the same glob, or a glob that matches the later route's literal model name.
///
/// A `false` answer proves nothing: two routes whose overlap depends on values outside the
/// conditions (a glob against a glob, a prefix against an exact path elsewhere) are left alone.
pub fn covers(earlier: &Match, later: &Match) -> bool {
    let path = match &earlier.path {
        None => true,
        Some(p) => later.path.as_ref() == Some(p),
    };
    let prefix = match &earlier.path_prefix {
        None => true,
        Some(prefix) => {
            later
                .path_prefix
                .as_ref()
                .is_some_and(|p| p.starts_with(prefix.as_str()))
                || later
                    .path
                    .as_ref()
                    .is_some_and(|p| p.starts_with(prefix.as_str()))
        }
    };
    let methods = match (&earlier.methods, &later.methods) {
        (None, _) => true,
        (Some(_), None) => false,
        (Some(theirs), Some(ours)) => ours
            .iter()
            .all(|m| theirs.iter().any(|t| t.eq_ignore_ascii_case(m))),
    };
    let headers = earlier.headers.iter().flatten().all(|(name, want)| {
        later
            .headers
            .iter()
            .flatten()
            .any(|(n, have)| n.eq_ignore_ascii_case(name) && implies(have, want))
    });
    let model = match (&earlier.model, &later.model) {
        (None, _) => true,
        (Some(_), None) => false,
        (Some(glob), Some(theirs)) => {
            glob == theirs || (!theirs.contains(['*', '?']) && WildMatch::new(glob).matches(theirs))
        }
    };
    path && prefix && methods && headers && model
}

/// Whether a header that satisfies `have` always satisfies `want`.
fn implies(have: &HeaderMatch, want: &HeaderMatch) -> bool {
    matches!(want, HeaderMatch::Present(true)) || have == want
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(yaml: &str) -> Match {
        serde_yaml::from_str(yaml).unwrap()
    }

    #[test]
    fn an_earlier_route_covers_a_later_one_only_when_its_conditions_prove_it() {
        let proven = [
            ("{}", "{path_prefix: /v1/}"),
            ("{path_prefix: /v1/}", "{path_prefix: /v1/chat/}"),
            ("{path_prefix: /v1/}", "{path: /v1/completions}"),
            ("{path: /a}", "{path: /a, methods: [POST]}"),
            ("{methods: [post, GET]}", "{methods: [POST]}"),
            ("{headers: {x-tier: true}}", "{headers: {X-Tier: gold}}"),
            (
                "{headers: {x-tier: gold}}",
                "{headers: {x-tier: gold, x-b: true}}",
            ),
            ("{model: \"llama-*\"}", "{model: llama-3}"),
            ("{model: \"llama-*\"}", "{model: \"llama-*\"}"),
        ];
        for (earlier, later) in proven {
            assert!(covers(&m(earlier), &m(later)), "{earlier} covers {later}");
        }
        let unproven = [
            ("{path_prefix: /v1/chat/}", "{path_prefix: /v1/}"),
            ("{path_prefix: /v1/}", "{}"),
            ("{path: /a}", "{path_prefix: /a}"),
            ("{methods: [GET]}", "{methods: [GET, POST]}"),
            ("{methods: [GET]}", "{}"),
            ("{headers: {x-tier: gold}}", "{headers: {x-tier: true}}"),
            ("{headers: {x-tier: gold}}", "{headers: {x-tier: silver}}"),
            ("{model: \"llama-*\"}", "{model: \"llama-3*\"}"),
            ("{model: \"*\"}", "{}"),
        ];
        for (earlier, later) in unproven {
            assert!(
                !covers(&m(earlier), &m(later)),
                "{earlier} does not cover {later}"
            );
        }
    }

    #[test]
    fn objectives_print_as_written() {
        assert_eq!(percent(0.99), "99 %");
        assert_eq!(percent(0.999), "99.9 %");
        assert_eq!(percent(1.0), "100 %");
    }
}
