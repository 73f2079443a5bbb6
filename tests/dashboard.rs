//! The Grafana dashboard (`grafana/dashboards/tokenmeter.json`) against what tokenmeter really
//! serves: every panel queries the `datasource` variable; every series an expression names is
//! either in a real scrape of a proxy that has seen a good, a violated and a failed request, or
//! recorded by the shipped rules (`docker/prometheus/rules.yaml`); per-model queries use only
//! raw families (the rules have no model label); and every expression, its template variables
//! substituted, is PromQL that `promtool check rules` accepts.
//!
//! And against a fleet: every selector matches the deployment variables (`namespace`, `job`),
//! every aggregation keeps them; a real Prometheus scraping three sidecars in two deployments
//! that share route names (evaluating the generated rules, for the recorded queries) shows each
//! deployment apart in every query, only the selected one when a namespace is picked, and only
//! one pod's series when a pod is.

mod common;

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::prometheus::{get, url_encode, Prometheus, Target};
use common::*;
use serde_json::Value;
use tokenmeter::tools::rules::{self, Format, Options};
use tokenmeter::tools::sim::{self, SimConfig};
use tokenmeter::Config;

const DASHBOARD: &str = "grafana/dashboards/tokenmeter.json";
const RULES: &str = "docker/prometheus/rules.yaml";

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

fn dashboard() -> Value {
    let text = std::fs::read_to_string(repo(DASHBOARD))
        .unwrap_or_else(|e| panic!("{DASHBOARD}: cannot read: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{DASHBOARD}: not JSON: {e}"))
}

/// Every panel, rows and the panels inside collapsed rows included.
fn panels(dashboard: &Value) -> Vec<&Value> {
    let mut out = Vec::new();
    for panel in dashboard["panels"].as_array().expect("panels is a list") {
        out.push(panel);
        if let Some(inner) = panel["panels"].as_array() {
            out.extend(inner);
        }
    }
    out
}

/// One PromQL query of the dashboard: where it is (for messages), a name for it that is a valid
/// metric-name part, and its text as written.
struct Query {
    place: String,
    key: String,
    expr: String,
}

/// Every panel target's `expr` and every query variable's query (as PromQL: `label_values(X, l)`
/// queries the series X).
fn queries(dashboard: &Value) -> Vec<Query> {
    let mut out = Vec::new();
    for panel in panels(dashboard) {
        for t in panel["targets"].as_array().into_iter().flatten() {
            out.push(Query {
                place: format!(
                    "panel {} {:?} query {}",
                    panel["id"],
                    panel["title"].as_str().unwrap_or_default(),
                    t["refId"].as_str().unwrap_or_default()
                ),
                key: format!(
                    "panel_{}_{}",
                    panel["id"],
                    t["refId"].as_str().unwrap_or_default()
                ),
                expr: t["expr"].as_str().unwrap_or_default().to_string(),
            });
        }
    }
    for var in dashboard["templating"]["list"].as_array().unwrap() {
        if var["type"] != "query" {
            continue;
        }
        let query = var["query"]["query"]
            .as_str()
            .or(var["query"].as_str())
            .unwrap_or_default();
        let expr = match query
            .strip_prefix("label_values(")
            .and_then(|q| q.strip_suffix(')'))
        {
            Some(args) => match args.rsplit_once(',') {
                Some((series, _label)) => series.trim().to_string(),
                None => panic!("variable {}: label_values without a metric", var["name"]),
            },
            None => query.to_string(),
        };
        out.push(Query {
            place: format!("variable {}", var["name"]),
            key: format!("variable_{}", var["name"].as_str().unwrap_or_default()),
            expr,
        });
    }
    out
}

/// The dashboard's query variables, in the order Grafana offers them: the deployment's labels,
/// then route, model and the pod (`instance`).
const VARIABLES: [&str; 5] = ["namespace", "job", "route", "model", "instance"];
/// The labels that tell deployments apart, which every query filters on and groups by.
const DEPLOYMENT: [&str; 2] = ["namespace", "job"];

/// Grafana's variables as Prometheus would see them once Grafana has filled them in, every one
/// at All.
fn substitute(expr: &str) -> Result<String, String> {
    substitute_with(expr, &[])
}

/// As [`substitute`], but the variables in `chosen` hold one value each, which Grafana writes
/// regex-escaped (a single value of a multi-value variable is matched with `=~`).
fn substitute_with(expr: &str, chosen: &[(&str, &str)]) -> Result<String, String> {
    let mut out = String::new();
    let mut rest = expr;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        let (name, len) = if let Some(braced) = after.strip_prefix('{') {
            let end = braced.find('}').ok_or("unclosed ${")?;
            let name = braced[..end].split(':').next().unwrap_or_default();
            (name, end + 2)
        } else {
            let end = after
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(after.len());
            (&after[..end], end)
        };
        match name {
            _ if VARIABLES.contains(&name) => match chosen.iter().find(|(n, _)| *n == name) {
                // Inside a PromQL string, so the regex's backslash is doubled.
                Some((_, value)) => out.push_str(&value.replace('.', "\\\\.")),
                None => out.push_str(".*"),
            },
            "__rate_interval" | "__interval" => out.push_str("5m"),
            "__range" => out.push_str("1h"),
            other => return Err(format!("unknown template variable ${other}")),
        }
        rest = &after[len..];
    }
    out.push_str(rest);
    Ok(out)
}

/// Skips from an opening bracket at `i` to just past its closing one, over string literals.
fn skip_group(s: &[u8], mut i: usize, open: u8, close: u8) -> usize {
    let mut depth = 0;
    while i < s.len() {
        match s[i] {
            b'"' | b'\'' | b'`' => i = skip_string(s, i),
            c if c == open => {
                depth += 1;
                i += 1;
            }
            c if c == close => {
                depth -= 1;
                i += 1;
                if depth == 0 {
                    return i;
                }
            }
            _ => i += 1,
        }
    }
    i
}

fn skip_string(s: &[u8], i: usize) -> usize {
    let quote = s[i];
    let mut j = i + 1;
    while j < s.len() && s[j] != quote {
        j += if s[j] == b'\\' { 2 } else { 1 };
    }
    j + 1
}

const KEYWORDS: &[&str] = &[
    "and",
    "or",
    "unless",
    "bool",
    "offset",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "inf",
    "nan",
];
const GROUPING: &[&str] = &[
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
];

/// The series names a PromQL expression selects: identifiers that are not functions,
/// keywords, label names (inside `{}` or grouping lists), strings, numbers or durations.
fn series_names(expr: &str) -> Vec<String> {
    let s = expr.as_bytes();
    let ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_' || c == b':';
    let mut names = Vec::new();
    let mut i = 0;
    while i < s.len() {
        let c = s[i];
        if c == b'"' || c == b'\'' || c == b'`' {
            i = skip_string(s, i);
        } else if c == b'{' {
            i = skip_group(s, i, b'{', b'}');
        } else if c == b'[' {
            i = skip_group(s, i, b'[', b']');
        } else if c == b'#' {
            i = s[i..]
                .iter()
                .position(|&c| c == b'\n')
                .map_or(s.len(), |n| i + n);
        } else if c.is_ascii_digit() || (c == b'.' && s.get(i + 1).is_some_and(u8::is_ascii_digit))
        {
            while i < s.len() && (ident(s[i]) || s[i] == b'.') {
                i += 1;
            }
        } else if c.is_ascii_alphabetic() || c == b'_' || c == b':' {
            let start = i;
            while i < s.len() && ident(s[i]) {
                i += 1;
            }
            let word = &expr[start..i];
            let next = s[i..].iter().position(|c| !c.is_ascii_whitespace());
            let following = next.map_or("", |n| {
                let rest = &expr[i + n..];
                &rest[..rest
                    .find(|c: char| !c.is_ascii_alphanumeric() && c != '_')
                    .unwrap_or(rest.len())]
            });
            // A function call, or an aggregation whose grouping comes first (`sum by (le) (x)`).
            let called = next.is_some_and(|n| s[i + n] == b'(')
                || (["by", "without"].contains(&following) && !GROUPING.contains(&word));
            if called && GROUPING.contains(&word) {
                i = skip_group(s, i + next.unwrap(), b'(', b')');
            } else if !called && !KEYWORDS.contains(&word) {
                names.push(word.to_string());
            }
        } else {
            i += 1;
        }
    }
    names
}

/// Every vector selector of an expression: the series name and the text of its `{...}`
/// matchers (empty without), strings, ranges and grouping lists skipped.
fn selectors(expr: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut rest = expr;
    for name in series_names(expr) {
        // Names come in order, so each is found after the previous one; a name inside a
        // string or a label list cannot come first, since series_names skipped those.
        let at = find_word(rest, &name).expect("series_names returns words of the expression");
        let after = &rest[at + name.len()..];
        let trimmed = after.trim_start();
        let matchers = if trimmed.starts_with('{') {
            let end = skip_group(trimmed.as_bytes(), 0, b'{', b'}');
            trimmed[1..end - 1].to_string()
        } else {
            String::new()
        };
        out.push((name, matchers));
        rest = after;
    }
    out
}

/// Where `word` first occurs in `text` as a whole identifier, outside strings and `{}`.
fn find_word(text: &str, word: &str) -> Option<usize> {
    let s = text.as_bytes();
    let ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_' || c == b':';
    let mut i = 0;
    while i < s.len() {
        match s[i] {
            b'"' | b'\'' | b'`' => i = skip_string(s, i),
            b'{' => i = skip_group(s, i, b'{', b'}'),
            c if ident(c) => {
                let start = i;
                while i < s.len() && ident(s[i]) {
                    i += 1;
                }
                if &text[start..i] == word {
                    return Some(start);
                }
            }
            _ => i += 1,
        }
    }
    None
}

/// Identifiers and brackets of an expression, outside strings, matchers and ranges: enough to
/// read aggregations and their grouping lists.
fn tokens(expr: &str) -> Vec<String> {
    let s = expr.as_bytes();
    let ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_' || c == b':' || c == b'.';
    let mut out = Vec::new();
    let mut i = 0;
    while i < s.len() {
        match s[i] {
            b'"' | b'\'' | b'`' => i = skip_string(s, i),
            b'{' => i = skip_group(s, i, b'{', b'}'),
            b'[' => i = skip_group(s, i, b'[', b']'),
            b'(' | b')' => {
                out.push((s[i] as char).to_string());
                i += 1;
            }
            c if ident(c) => {
                let start = i;
                while i < s.len() && ident(s[i]) {
                    i += 1;
                }
                out.push(expr[start..i].to_string());
            }
            _ => i += 1,
        }
    }
    out
}

const AGGREGATIONS: &[&str] = &[
    "sum",
    "min",
    "max",
    "avg",
    "group",
    "stddev",
    "stdvar",
    "count",
    "count_values",
    "bottomk",
    "topk",
    "quantile",
    "limitk",
    "limit_ratio",
];

/// What in an expression could merge two deployments: an aggregation whose leading `by (...)`
/// lacks a deployment label, or that has none (`sum(x)`, `sum without`, a trailing `by`), and a
/// vector matching `on (...)` without them.
fn merges(expr: &str) -> Vec<String> {
    let t = tokens(expr);
    let list = |from: usize| -> Vec<&str> {
        t[from..]
            .iter()
            .skip(1)
            .take_while(|w| *w != ")")
            .map(String::as_str)
            .collect()
    };
    let mut out = Vec::new();
    for (i, word) in t.iter().enumerate() {
        let next = t.get(i + 1).map(String::as_str);
        let labels = if AGGREGATIONS.contains(&word.as_str()) && next == Some("by") {
            list(i + 2)
        } else if AGGREGATIONS.contains(&word.as_str()) {
            out.push(format!("{word} without a leading by (...)"));
            continue;
        } else if word == "on" {
            list(i + 1)
        } else {
            continue;
        };
        for l in DEPLOYMENT {
            if !labels.contains(&l) {
                out.push(format!("{word} ({}) without {l}", labels.join(", ")));
            }
        }
    }
    out
}

/// Range selectors' contents (`[5m]`, `[$__rate_interval]`), strings skipped.
fn ranges(expr: &str) -> Vec<String> {
    let s = expr.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < s.len() {
        match s[i] {
            b'"' | b'\'' | b'`' => i = skip_string(s, i),
            b'{' => i = skip_group(s, i, b'{', b'}'),
            b'[' => {
                let end = skip_group(s, i, b'[', b']');
                out.push(expr[i + 1..end - 1].to_string());
                i = end;
            }
            _ => i += 1,
        }
    }
    out
}

/// The `record:` names of the shipped rule file.
fn recorded_names() -> BTreeSet<String> {
    let text = std::fs::read_to_string(repo(RULES)).unwrap_or_else(|e| {
        panic!("{RULES}: cannot read ({e}); the dashboard's recorded series are checked against it")
    });
    let rules: serde_yaml::Value =
        serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("{RULES}: not YAML: {e}"));
    let mut names = BTreeSet::new();
    for group in rules["groups"]
        .as_sequence()
        .expect("rules file has groups")
    {
        for rule in group["rules"].as_sequence().into_iter().flatten() {
            if let Some(name) = rule["record"].as_str() {
                names.insert(name.to_string());
            }
        }
    }
    assert!(!names.is_empty(), "{RULES}: no recording rules");
    names
}

/// Series names in a Prometheus text exposition, and the families (`# TYPE`) with no sample.
fn scraped_names(text: &str) -> (BTreeSet<String>, Vec<String>) {
    let mut samples = BTreeSet::new();
    let mut families = Vec::new();
    for line in text.lines() {
        if let Some(typ) = line.strip_prefix("# TYPE ") {
            families.push(typ.split_whitespace().next().unwrap().to_string());
        } else if !line.starts_with('#') && !line.is_empty() {
            let end = line.find(['{', ' ']).unwrap_or(line.len());
            samples.insert(line[..end].to_string());
        }
    }
    let empty = families
        .into_iter()
        .filter(|f| {
            !samples.contains(f)
                && !["_bucket", "_sum", "_count"]
                    .iter()
                    .any(|s| samples.contains(&format!("{f}{s}")))
        })
        .collect();
    (samples, empty)
}

/// A proxy that has seen a good streamed request, one that broke its TTFT threshold and one
/// that failed upstream, scraped over HTTP from its admin port.
async fn scrape_after_traffic() -> String {
    let upstream = upstream(|seen: &Seen| {
        let path = seen.head.split_whitespace().nth(1).unwrap_or_default();
        if path == "/fail" {
            return Script::json(500, r#"{"error":"boom"}"#);
        }
        let mut script = Script::stream(
            "text/event-stream",
            vec![
                role_chunk(),
                chat_chunk("a"),
                chat_chunk("b"),
                chat_chunk("c"),
                finish_chunk("stop", Some(3)),
                done(),
            ],
        );
        if path == "/slow" {
            // Far past the strict route's 10 ms TTFT, so the verdict cannot depend on timing.
            script
                .steps
                .insert(1, Step::Wait(Duration::from_millis(60)));
        }
        script
    })
    .await;
    let proxy = proxy(upstream.addr, |c| {
        c.routes = routes(
            "routes:
  - name: chat
    match: {path: /v1/chat/completions}
    slo: {ttft: 5s, tpot: 1s, e2e: 20s, max_itl: 5s, objective: 0.99}
  - name: strict
    match: {path: /slow}
    slo: {ttft: 10ms, objective: 0.9}
  - name: default
    slo: {e2e: 30s, objective: 0.9}
",
        );
    })
    .await;
    for path in ["/v1/chat/completions", "/slow", "/fail"] {
        send(&proxy.url(path), "POST", &chat_request("m"), &[], false).await;
    }
    let records = proxy.records(3).await;
    let verdicts: Vec<_> = records
        .iter()
        .map(|r| {
            (
                r["route"].as_str(),
                r["outcome"].as_str(),
                r["slo"].as_str(),
            )
        })
        .collect();
    assert_eq!(
        verdicts,
        [
            (Some("chat"), Some("ok"), Some("good")),
            (Some("strict"), Some("ok"), Some("violated")),
            (Some("default"), Some("error"), Some("violated")),
        ]
    );
    let scrape = send(&proxy.admin_url("/metrics"), "GET", "", &[], false).await;
    assert_eq!(scrape.status, 200);
    String::from_utf8(scrape.bytes()).unwrap()
}

/// The dashboard must import cleanly anywhere: a datasource picked by the user (no hard-coded
/// uid), distinct ids, titled panels, deployment, route, model and pod selectable with All.
#[test]
fn every_panel_queries_the_datasource_variable_and_has_an_id_and_a_title() {
    let d = dashboard();
    assert_eq!(d["uid"], "tokenmeter");
    assert_eq!(d["title"], "tokenmeter");
    assert!(d["schemaVersion"].as_u64().unwrap() >= 36);
    let ds = serde_json::json!({"type": "prometheus", "uid": "${datasource}"});

    let vars: BTreeMap<&str, &Value> = d["templating"]["list"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| (v["name"].as_str().unwrap(), v))
        .collect();
    assert_eq!(vars["datasource"]["type"], "datasource");
    assert_eq!(vars["datasource"]["query"], "prometheus");
    for name in VARIABLES {
        let v = vars[name];
        assert_eq!(v["type"], "query", "{name}");
        assert_eq!(v["datasource"], ds, "{name}");
        assert_eq!(v["multi"], true, "{name}");
        assert_eq!(v["includeAll"], true, "{name}");
        assert_eq!(v["allValue"], ".*", "{name}: All must be a regex for =~");
    }

    let all = panels(&d);
    let mut ids = HashSet::new();
    let mut queried = 0;
    for p in &all {
        let id = p["id"]
            .as_u64()
            .unwrap_or_else(|| panic!("panel without id: {p}"));
        assert!(ids.insert(id), "panel id {id} used twice");
        let title = p["title"].as_str().unwrap_or_default();
        assert!(!title.trim().is_empty(), "panel {id} has no title");
        if p["type"] == "row" {
            continue;
        }
        assert_eq!(p["datasource"], ds, "panel {id} {title:?}: datasource");
        let targets = p["targets"].as_array().map(Vec::as_slice).unwrap_or(&[]);
        assert!(!targets.is_empty(), "panel {id} {title:?} has no query");
        let mut refs = HashSet::new();
        for t in targets {
            assert_eq!(
                t["datasource"], ds,
                "panel {id} {title:?}: target datasource"
            );
            assert!(
                refs.insert(t["refId"].as_str().unwrap()),
                "panel {id}: refId twice"
            );
            let expr = t["expr"].as_str().unwrap_or_default();
            assert!(!expr.trim().is_empty(), "panel {id} {title:?}: empty expr");
            for range in ranges(expr) {
                assert_eq!(
                    range, "$__rate_interval",
                    "panel {id} {title:?}: ranges follow the scrape interval: {expr}"
                );
            }
        }
        queried += 1;
    }
    assert!(queried >= 25, "only {queried} panels with queries");
}

/// A query naming a series nobody produces draws an empty panel without any error: the
/// dashboard may only name series that a real tokenmeter exports or the shipped rules record,
/// and per-model panels only raw families (a rule has no model label to filter on).
#[tokio::test]
async fn every_query_names_only_exported_or_recorded_series() {
    let (exported, empty) = scraped_names(&scrape_after_traffic().await);
    assert!(
        empty.is_empty(),
        "families without samples in the scrape: {empty:?}"
    );
    assert!(exported.contains("process_cpu_seconds_total"));
    let recorded = recorded_names();

    let mut unknown = Vec::new();
    let mut rules_by_model = Vec::new();
    let mut used = BTreeSet::new();
    for q in queries(&dashboard()) {
        let names = series_names(&q.expr);
        assert!(!names.is_empty(), "{}: no series in {:?}", q.place, q.expr);
        for name in names {
            if !exported.contains(&name) && !recorded.contains(&name) {
                unknown.push(format!("{}: {name}", q.place));
            }
            if recorded.contains(&name) && q.expr.contains("model") {
                rules_by_model.push(format!("{}: {name}", q.place));
            }
            used.insert(name);
        }
    }
    assert!(
        unknown.is_empty(),
        "series neither exported by tokenmeter nor recorded in {RULES}:\n{}",
        unknown.join("\n")
    );
    assert!(
        rules_by_model.is_empty(),
        "recorded series (no model label) in per-model queries:\n{}",
        rules_by_model.join("\n")
    );
    // The extraction found both kinds, so the checks above had something to check.
    assert!(used.iter().any(|n| recorded.contains(n)), "{used:?}");
    assert!(used.contains("tokenmeter_time_to_first_token_seconds_bucket"));
}

/// Every query must be PromQL Prometheus accepts once Grafana has filled in its variables;
/// promtool parses them as recording rules.
#[test]
fn every_query_is_valid_promql() {
    let mut rules = Vec::new();
    let mut bad = Vec::new();
    for q in queries(&dashboard()) {
        match substitute(&q.expr) {
            Ok(expr) => rules.push(serde_json::json!({
                "record": format!("dashboard:{}:check", q.key),
                "expr": expr,
            })),
            Err(e) => bad.push(format!("{}: {e}", q.place)),
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
    let file = serde_json::json!({"groups": [{"name": "dashboard", "rules": rules}]});
    let dir = TempDir::new();
    let path = dir.path().join("dashboard-rules.yaml");
    std::fs::write(&path, serde_yaml::to_string(&file).unwrap()).unwrap();
    let out = Command::new("promtool")
        .arg("check")
        .arg("rules")
        .arg(&path)
        .output()
        .expect("promtool not found: tests/run.sh installs it (Debian package prometheus)");
    assert!(
        out.status.success(),
        "promtool refused the dashboard's queries:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The JSON is generated; a hand edit that the generator would undo must not be committed.
#[test]
fn the_committed_json_is_what_the_generator_writes() {
    let out = Command::new("python3")
        .arg(repo("grafana/dashboard.py"))
        .arg("--check")
        .output()
        .expect("python3 not found: tests/run.sh installs it");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn series_names_skip_functions_labels_keywords_and_durations() {
    let names = series_names(
        r#"histogram_quantile(0.99, sum by (route, le) (rate(a_bucket{route=~"x|y", le!="1"}[5m])))
  / on (route) group_left () (1 - max without (b) (c:d:e offset 1h)) * 1e6 > bool 0.5 or f"#,
    );
    assert_eq!(names, ["a_bucket", "c:d:e", "f"]);
    assert_eq!(
        series_names(r#"sum(rate(x[$__rate_interval])) by (route)"#),
        ["x"]
    );
}

#[test]
fn substitution_fills_grafana_variables_and_refuses_unknown_ones() {
    assert_eq!(
        substitute(r#"rate(x{route=~"$route", model=~"${model:regex}"}[$__rate_interval])"#)
            .unwrap(),
        r#"rate(x{route=~".*", model=~".*"}[5m])"#
    );
    assert!(substitute("x{route=~\"$rout\"}").is_err());
    assert_eq!(
        substitute_with(
            r#"x{namespace=~"$namespace", job=~"$job", instance=~"$instance"}"#,
            &[("namespace", "a"), ("instance", "127.0.0.1:9464")]
        )
        .unwrap(),
        r#"x{namespace=~"a", job=~".*", instance=~"127\\.0\\.0\\.1:9464"}"#
    );
}

#[test]
fn merges_finds_aggregations_and_matchings_that_drop_the_deployment() {
    assert!(merges(
        r#"histogram_quantile(0.9, sum by (namespace, job, le) (rate(x{a="sum(y)"}[5m])))
  * on (namespace, job, instance) group_left () count by (job, namespace, version) (z)"#
    )
    .is_empty());
    assert_eq!(
        merges("sum(x) / max by (route) (y) * on (instance) z + sum without (a) (w)"),
        [
            "sum without a leading by (...)",
            "max (route) without namespace",
            "max (route) without job",
            "on (instance) without namespace",
            "on (instance) without job",
            "sum without a leading by (...)",
        ]
    );
}

#[test]
fn selectors_pair_each_series_with_its_matchers() {
    assert_eq!(
        selectors(r#"sum by (a) (rate(x{a=~"$a", b="}"}[5m])) / y * on (a) x"#),
        [
            ("x".to_string(), r#"a=~"$a", b="}""#.to_string()),
            ("y".to_string(), String::new()),
            ("x".to_string(), String::new()),
        ]
    );
}

/// A fleet is many deployments whose routes share names: every selector of every panel matches
/// the deployment variables, every aggregation and matching keeps the deployment labels, every
/// legend names the deployment, and each variable is filtered by those before it.
#[test]
fn every_query_is_filtered_and_grouped_by_deployment() {
    let d = dashboard();
    let vars: Vec<&Value> = d["templating"]["list"].as_array().unwrap().iter().collect();
    let names: Vec<&str> = vars.iter().map(|v| v["name"].as_str().unwrap()).collect();
    assert_eq!(names[0], "datasource");
    assert_eq!(names[1..], VARIABLES);
    let pod = vars.iter().find(|v| v["name"] == "instance").unwrap();
    assert_eq!(pod["label"], "Pod");

    let mut wrong = Vec::new();
    // Each variable's query matches every deployment variable before it (all of them, for
    // route, model and pod).
    for (i, var) in vars[1..].iter().enumerate() {
        let query = var["query"].as_str().unwrap();
        for l in &DEPLOYMENT[..i.min(DEPLOYMENT.len())] {
            if !query.contains(&format!(r#"{l}=~"${l}""#)) {
                wrong.push(format!("variable {}: no {l} matcher: {query}", var["name"]));
            }
        }
    }
    let mut pod_filtered = 0;
    for panel in panels(&d) {
        for t in panel["targets"].as_array().into_iter().flatten() {
            let place = format!("panel {} {} {}", panel["id"], panel["title"], t["refId"]);
            let expr = t["expr"].as_str().unwrap();
            for (name, matchers) in selectors(expr) {
                for l in DEPLOYMENT {
                    if !matchers.contains(&format!(r#"{l}=~"${l}""#)) {
                        wrong.push(format!("{place}: {name} not filtered by ${l}"));
                    }
                }
                pod_filtered += usize::from(matchers.contains(r#"instance=~"$instance""#));
                // The pod drill-down applies to raw families only: recorded series have no
                // instance label, so filtering one would empty the panel.
                if name.contains(':') && matchers.contains("instance") {
                    wrong.push(format!("{place}: recorded {name} filtered by instance"));
                }
            }
            for m in merges(expr) {
                wrong.push(format!("{place}: {m}"));
            }
            // A table names its rows by their label columns; a series by its legend.
            let legend = t["legendFormat"].as_str().unwrap_or_default();
            if t["format"] != "table" && !legend.starts_with("{{namespace}}/{{job}}") {
                wrong.push(format!(
                    "{place}: legend {legend:?} does not name the deployment"
                ));
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    assert!(
        pod_filtered >= 20,
        "only {pod_filtered} selectors follow $instance"
    );
    // The first row is the fleet overview: goodput and burn per deployment side by side.
    let first = &d["panels"][0];
    assert_eq!(first["type"], "row");
    assert!(
        first["title"].as_str().unwrap().starts_with("Fleet"),
        "{first}"
    );
}

/// The fleet's two deployments: same job, same route names, told apart by namespace. `a` has
/// two pods in front of a healthy server, `b` one pod in front of a server failing half of its
/// requests.
const FLEET: [(&str, usize, f64); 2] = [("a", 2, 0.0), ("b", 1, 0.5)];
const JOB: &str = "llm";
const FLEET_CONFIG: &str = "routes:
  - name: chat
    match: {path_prefix: /v1/}
    slo: {ttft: 5s, tpot: 1s, e2e: 20s, max_itl: 5s, objective: 0.99}
cost: {per_hour: 2.5, currency: USD}
";

/// Several sidecars in two deployments, scraped by one Prometheus every second with `rules`
/// loaded; the proxies' counters have been scraped before and after a second burst of traffic,
/// so every rate over them has two samples and the requests between them.
struct Fleet {
    prometheus: Prometheus,
    /// Each pod's namespace and `instance` (its admin address, as Prometheus labels it).
    pods: Vec<(&'static str, String)>,
    _proxies: Vec<TestProxy>,
    _sims: Vec<sim::RunningSim>,
}

fn chat_body() -> String {
    r#"{"model":"sim-llama","messages":[{"role":"user","content":"hi"}],"stream":true,"max_tokens":4}"#
        .to_string()
}

async fn fleet(rules: &str) -> Fleet {
    let config = Config::parse(FLEET_CONFIG, "fleet.yaml").unwrap();
    let mut sims = Vec::new();
    let mut proxies = Vec::new();
    let mut pods = Vec::new();
    let mut targets = Vec::new();
    for (namespace, replicas, fail_rate) in FLEET {
        let sim = sim::start(SimConfig {
            listen: "127.0.0.1:0".parse().unwrap(),
            fail_rate,
            seed: 7,
            ..SimConfig::default()
        })
        .await
        .unwrap();
        for _ in 0..replicas {
            let proxy = proxy(sim.addr, |c| {
                c.routes = config.routes.clone();
                c.cost = config.cost.clone();
            })
            .await;
            targets.push(Target::new(
                proxy.running.admin,
                &[("namespace", namespace), ("job", JOB)],
            ));
            pods.push((namespace, proxy.running.admin.to_string()));
            proxies.push(proxy);
        }
        sims.push(sim);
    }
    let prometheus = Prometheus::scraping(&targets, rules).await;
    let burst = |n: usize| {
        let proxies = &proxies;
        async move {
            for proxy in proxies {
                for _ in 0..n {
                    let r = send(
                        &proxy.url("/v1/chat/completions"),
                        "POST",
                        &chat_body(),
                        &[("content-type", "application/json")],
                        false,
                    )
                    .await;
                    assert!(r.status == 200 || r.status == 500, "{}", r.status);
                }
            }
        }
    };
    burst(3).await;
    let want: BTreeMap<String, f64> = FLEET
        .iter()
        .map(|(ns, replicas, _)| (ns.to_string(), *replicas as f64))
        .collect();
    // Every pod's counters exist and were scraped once before the second burst.
    prometheus
        .until("every pod's eligible counter scraped", 30, || async {
            let got: BTreeMap<String, f64> = prometheus
                .query("count by (namespace) (count by (namespace, instance) (tokenmeter_slo_eligible_requests_total))")
                .await
                .into_iter()
                .map(|(l, v)| (l["namespace"].clone(), v))
                .collect();
            if got == want {
                Ok(())
            } else {
                Err(format!("{got:?}"))
            }
        })
        .await;
    burst(5).await;
    for proxy in &proxies {
        proxy.records(8).await;
    }
    // The fleet is what the test says: the healthy deployment's pods all good, the other's
    // some good and some failed.
    let count = |text: &str, family: &str| -> f64 {
        text.lines()
            .filter(|l| l.starts_with(&format!("{family}{{")))
            .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
            .sum()
    };
    for (proxy, (namespace, instance)) in proxies.iter().zip(&pods) {
        let metrics = proxy.metrics();
        let good = count(&metrics, "tokenmeter_slo_good_requests_total");
        let eligible = count(&metrics, "tokenmeter_slo_eligible_requests_total");
        let failing = FLEET
            .iter()
            .any(|(ns, _, rate)| ns == namespace && *rate > 0.0);
        assert_eq!(eligible, 8.0, "{namespace} {instance}");
        if failing {
            assert!(
                0.0 < good && good < eligible,
                "{namespace} {instance}: {good} good"
            );
        } else {
            assert_eq!(good, eligible, "{namespace} {instance}");
        }
    }
    Fleet {
        prometheus,
        pods,
        _proxies: proxies,
        _sims: sims,
    }
}

type Series = Vec<(BTreeMap<String, String>, f64)>;

/// An instant query at `time`, so that two queries compare the same data.
async fn query_at(prometheus: &Prometheus, promql: &str, time: f64) -> Result<Series, String> {
    let url = prometheus.url(&format!(
        "/api/v1/query?query={}&time={time:.3}",
        url_encode(promql)
    ));
    let (status, body) = get(&url).await.ok_or("no answer")?;
    if status != 200 {
        return Err(format!("{promql}: {status} {body}"));
    }
    let v: Value = serde_json::from_str(&body).map_err(|e| e.to_string())?;
    Ok(v["data"]["result"]
        .as_array()
        .ok_or(format!("{promql}: {body}"))?
        .iter()
        .map(|s| {
            let labels = serde_json::from_value(s["metric"].clone()).unwrap();
            let value = s["value"][1].as_str().unwrap().parse::<f64>().unwrap();
            (labels, value)
        })
        .collect())
}

fn now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// The deployments a query may show in this fleet: `a` has no failed request, so queries of
/// errors and violations show `b` alone; every other query shows both.
fn expected_deployments(expr: &str) -> BTreeSet<String> {
    let failures = expr.contains(r#"outcome=~"error|cancelled""#)
        || expr.contains(r#"outcome="error""#)
        || expr.contains("violations");
    FLEET
        .iter()
        .filter(|(_, _, fail_rate)| !failures || *fail_rate > 0.0)
        .map(|(ns, _, _)| ns.to_string())
        .collect()
}

/// What is wrong with one query's result over the fleet: a series without its deployment
/// (two deployments merged into it), a foreign job, or not exactly the deployments it should
/// show.
fn deployment_errors(expr: &str, result: &Series) -> Vec<String> {
    let mut errors = Vec::new();
    let mut seen = BTreeSet::new();
    for (labels, _) in result {
        let (Some(ns), Some(job)) = (labels.get("namespace"), labels.get("job")) else {
            errors.push(format!("a series without its deployment: {labels:?}"));
            continue;
        };
        if job != JOB {
            errors.push(format!("job {job:?}: {labels:?}"));
        }
        seen.insert(ns.clone());
    }
    let want = expected_deployments(expr);
    if seen != want {
        errors.push(format!("deployments {seen:?}, want {want:?}"));
    }
    errors
}

fn same(a: &Series, b: &Series) -> bool {
    let close = |x: f64, y: f64| {
        (x.is_nan() && y.is_nan()) || x == y || (x - y).abs() <= 1e-9 * x.abs().max(y.abs())
    };
    let sorted = |s: &Series| {
        let mut s = s.clone();
        s.sort_by(|x, y| x.0.cmp(&y.0));
        s
    };
    let (a, b) = (sorted(a), sorted(b));
    a.len() == b.len() && a.iter().zip(&b).all(|(x, y)| x.0 == y.0 && close(x.1, y.1))
}

/// Runs `queries` over the fleet: first (polling) until each, at All, shows exactly the
/// deployments it should, apart, and each pod selected shows that pod's data; then, at that
/// instant, a namespace selected must give exactly that deployment's part of the All result, and
/// a pod selected only its own deployment and its own series. A query that does not follow the
/// variable (the namespace variable's own query; recorded series and the Fleet row for a pod)
/// must not change with it.
async fn check_against_fleet(fleet: &Fleet, queries: &[Query]) {
    let prometheus = &fleet.prometheus;
    let pod_expr = |q: &Query, instance: &str| substitute_with(&q.expr, &[("instance", instance)]);
    // Queries look 2 s into the past: every scrape and rule evaluation stamped before then has
    // been written (each takes milliseconds), so two queries at that instant see the same data.
    let time = prometheus
        .until(
            "every query to show each deployment apart and each pod's own data",
            60,
            || async {
                let time = now() - 2.0;
                let mut wrong = Vec::new();
                for q in queries {
                    let expr = substitute(&q.expr).unwrap();
                    let result = query_at(prometheus, &expr, time).await?;
                    for e in deployment_errors(&q.expr, &result) {
                        wrong.push(format!("{}: {e}\n  {expr}", q.place));
                    }
                    if !q.expr.contains("$instance") {
                        continue;
                    }
                    for (namespace, instance) in &fleet.pods {
                        if !expected_deployments(&q.expr).contains(*namespace) {
                            continue;
                        }
                        let expr = pod_expr(q, instance).unwrap();
                        if query_at(prometheus, &expr, time).await?.is_empty() {
                            wrong.push(format!("{}: empty for pod {instance}", q.place));
                        }
                    }
                }
                if wrong.is_empty() {
                    Ok(time)
                } else {
                    Err(wrong.join("\n"))
                }
            },
        )
        .await;

    let mut wrong = Vec::new();
    for q in queries {
        let all = query_at(prometheus, &substitute(&q.expr).unwrap(), time)
            .await
            .unwrap();
        for (namespace, _, _) in FLEET {
            let expr = substitute_with(&q.expr, &[("namespace", namespace)]).unwrap();
            let one = query_at(prometheus, &expr, time).await.unwrap();
            let want: Series = if q.expr.contains("$namespace") {
                all.iter()
                    .filter(|(l, _)| l["namespace"] == namespace)
                    .cloned()
                    .collect()
            } else {
                all.clone()
            };
            if !same(&one, &want) {
                wrong.push(format!(
                    "{}: namespace {namespace} selected gives\n  {one:?}\n  not\n  {want:?}",
                    q.place
                ));
            }
        }
        for (namespace, instance) in &fleet.pods {
            let one = query_at(prometheus, &pod_expr(q, instance).unwrap(), time)
                .await
                .unwrap();
            if !q.expr.contains("$instance") {
                if !same(&one, &all) {
                    wrong.push(format!("{}: changes with pod {instance}", q.place));
                }
                continue;
            }
            for (labels, _) in &one {
                let other_pod = labels.get("instance").is_some_and(|i| i != instance);
                if labels.get("namespace") != Some(&namespace.to_string()) || other_pod {
                    wrong.push(format!(
                        "{}: pod {namespace} {instance} selected, yet {labels:?}",
                        q.place
                    ));
                }
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

fn is_recorded(q: &Query) -> bool {
    series_names(&q.expr).iter().any(|n| n.contains(':'))
}

/// The dashboard against a real scrape of a fleet: two deployments with the same route names,
/// three sidecars. Every query over raw families keeps the deployments apart, a namespace
/// selected shows only it, a pod only its own series; the variables offer both deployments and,
/// within one, its own pods.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raw_queries_show_each_deployment_of_a_fleet_apart() {
    let started = tokio::time::Instant::now();
    let fleet = fleet("groups: []\n").await;
    let raw: Vec<Query> = queries(&dashboard())
        .into_iter()
        .filter(|q| !is_recorded(q))
        .collect();
    assert!(raw.len() >= 30, "{} raw queries", raw.len());
    check_against_fleet(&fleet, &raw).await;

    let p = &fleet.prometheus;
    let values = |query: String, label: &'static str| async move {
        let mut v: Vec<String> = p
            .query(&query)
            .await
            .into_iter()
            .map(|(l, _)| l[label].clone())
            .collect();
        v.sort();
        v.dedup();
        v
    };
    let d = dashboard();
    let var = |name: &str| -> String {
        let var = d["templating"]["list"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == name)
            .unwrap();
        let q = var["query"].as_str().unwrap();
        let series = q
            .strip_prefix("label_values(")
            .and_then(|q| q.rsplit_once(','))
            .unwrap()
            .0;
        series.to_string()
    };
    let pick = |name: &str, chosen: &[(&str, &str)]| substitute_with(&var(name), chosen).unwrap();
    assert_eq!(
        values(pick("namespace", &[]), "namespace").await,
        ["a", "b"]
    );
    assert_eq!(
        values(pick("job", &[("namespace", "b")]), "job").await,
        [JOB]
    );
    for (namespace, replicas, _) in FLEET {
        let mut want: Vec<String> = fleet
            .pods
            .iter()
            .filter(|(ns, _)| *ns == namespace)
            .map(|(_, i)| i.clone())
            .collect();
        want.sort();
        assert_eq!(want.len(), replicas);
        let got = values(pick("instance", &[("namespace", namespace)]), "instance").await;
        assert_eq!(got, want, "pods of {namespace}");
        let routes = values(pick("route", &[("namespace", namespace)]), "route").await;
        assert_eq!(routes, ["chat"], "routes of {namespace}");
    }

    // The attainment of each deployment is its own: `a` all good, `b` not; summed into one
    // (the bug this dashboard must not have), `a` would read below 1.
    let attainment = queries(&d)
        .into_iter()
        .find(|q| q.place.contains("SLO attainment vs objective") && q.place.ends_with(" A"))
        .expect("the attainment panel");
    let got: BTreeMap<String, f64> = p
        .query(&substitute(&attainment.expr).unwrap())
        .await
        .into_iter()
        .map(|(l, v)| (l["namespace"].clone(), v))
        .collect();
    assert_eq!(got.get("a"), Some(&1.0), "{got:?}");
    assert!(got.get("b").is_some_and(|b| *b < 1.0), "{got:?}");
    eprintln!(
        "{} raw queries over 3 sidecars in 2 deployments: {:.1} s",
        raw.len(),
        started.elapsed().as_secs_f64()
    );
}

/// The recorded queries (the Fleet row, burn rates, recorded latency, violations, cost) over
/// the same fleet with the rules `tokenmeter rules` generates for its configuration: each
/// deployment apart, a namespace selected shows only it, and the cost per hour counts each
/// deployment's own pods.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recorded_queries_show_each_deployment_of_a_fleet_apart() {
    let started = tokio::time::Instant::now();
    let config = Config::parse(FLEET_CONFIG, "fleet.yaml").unwrap();
    let rules = rules::render(
        &config,
        &Options {
            format: Format::Prometheus,
            ..Options::default()
        },
        "fleet.yaml",
    );
    let fleet = fleet(&rules).await;
    let recorded: Vec<Query> = queries(&dashboard())
        .into_iter()
        .filter(is_recorded)
        .collect();
    assert!(recorded.len() >= 20, "{} recorded queries", recorded.len());
    check_against_fleet(&fleet, &recorded).await;

    let p = &fleet.prometheus;
    let by_namespace = |query: &'static str| async move {
        p.query(query)
            .await
            .into_iter()
            .map(|(l, v)| (l["namespace"].clone(), v))
            .collect::<BTreeMap<String, f64>>()
    };
    let cost = by_namespace(r#"namespace_job:tokenmeter_cost_per_hour:sum{currency="USD"}"#).await;
    assert_eq!(cost.get("a"), Some(&5.0), "two pods at 2.5: {cost:?}");
    assert_eq!(cost.get("b"), Some(&2.5), "one pod at 2.5: {cost:?}");
    let goodput = by_namespace("namespace_job_route:tokenmeter_slo_goodput:ratio_rate1h").await;
    assert_eq!(goodput.get("a"), Some(&1.0), "{goodput:?}");
    assert!(goodput.get("b").is_some_and(|b| *b < 1.0), "{goodput:?}");
    eprintln!(
        "{} recorded queries over 3 sidecars in 2 deployments: {:.1} s",
        recorded.len(),
        started.elapsed().as_secs_f64()
    );
}
