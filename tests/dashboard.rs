//! The Grafana dashboard (`grafana/dashboards/tokenmeter.json`) against what tokenmeter really
//! serves: every panel queries the `datasource` variable; every series an expression names is
//! either in a real scrape of a proxy that has seen a good, a violated and a failed request, or
//! recorded by the shipped rules (`docker/prometheus/rules.yaml`); per-model queries use only
//! raw families (the rules have no model label); and every expression, its template variables
//! substituted, is PromQL that `promtool check rules` accepts.

mod common;

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::*;
use serde_json::Value;

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

/// Grafana's variables as Prometheus would see them once Grafana has filled them in.
fn substitute(expr: &str) -> Result<String, String> {
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
        out.push_str(match name {
            "route" | "model" => ".*",
            "__rate_interval" | "__interval" => "5m",
            "__range" => "1h",
            other => return Err(format!("unknown template variable ${other}")),
        });
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
/// uid), distinct ids, titled panels, route and model selectable with All.
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
    for name in ["route", "model"] {
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
}
