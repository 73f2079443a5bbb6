//! `tokenmeter rules` against the real tools: the checked-in rule files are current and pass
//! `promtool check rules`, the `promtool test rules` cases in tests/promtool pass, and a real
//! Prometheus scraping the proxy in front of the sim computes the goodput ratio the proxy
//! counted and raises the burn alert once the sim turns slow.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::Value;
use tokio::time::Instant;

use common::prometheus::Prometheus;
use common::TempDir;
use tokenmeter::tools::rules::{self, Format, Options};
use tokenmeter::tools::sim::{self, SimConfig};
use tokenmeter::Config;

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

/// Runs promtool, failing with its output; promtool comes with Debian's prometheus package,
/// which tests/run.sh installs.
fn promtool(args: &[&str]) -> String {
    let out = Command::new("promtool")
        .args(args)
        .current_dir(repo(""))
        .output()
        .unwrap_or_else(|e| {
            panic!("cannot run promtool ({e}): install Debian's prometheus package, as tests/run.sh does")
        });
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "promtool {args:?} failed:\n{text}");
    text
}

/// The checked-in files and the flags that generate them (as their header says).
const GENERATED: [(&str, &[&str]); 2] = [
    ("k8s/prometheusrule.yaml", &[]),
    ("docker/prometheus/rules.yaml", &["--format", "prometheus"]),
];

#[test]
fn checked_in_rule_files_match_the_example_config() {
    for (file, flags) in GENERATED {
        let out = Command::new(env!("CARGO_BIN_EXE_tokenmeter"))
            .args(["rules", "--config", "config/tokenmeter.yaml"])
            .args(flags)
            .current_dir(repo(""))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let fresh = String::from_utf8(out.stdout).unwrap();
        let stored = std::fs::read_to_string(repo(file)).unwrap_or_default();
        let command = ["cargo run -- rules --config config/tokenmeter.yaml"]
            .into_iter()
            .chain(flags.iter().copied())
            .collect::<Vec<_>>()
            .join(" ");
        assert!(
            stored == fresh,
            "{file} is stale; regenerate it with:\n  {command} > {file}"
        );
    }
}

#[test]
fn promtool_accepts_both_rule_files() {
    let plain = promtool(&["check", "rules", "docker/prometheus/rules.yaml"]);
    let count = |text: &str| {
        text.split_whitespace()
            .collect::<Vec<_>>()
            .windows(2)
            .find(|w| w[1] == "rules")
            .and_then(|w| w[0].parse::<usize>().ok())
            .unwrap_or_else(|| panic!("no rule count in {text}"))
    };
    // promtool reads plain rule files only, so the PrometheusRule's spec is checked on its own.
    let resource: Value =
        serde_yaml::from_str(&std::fs::read_to_string(repo("k8s/prometheusrule.yaml")).unwrap())
            .unwrap();
    assert_eq!(resource["kind"], "PrometheusRule");
    assert_eq!(resource["apiVersion"], "monitoring.coreos.com/v1");
    let dir = TempDir::new();
    let spec = dir.path().join("spec.yaml");
    std::fs::write(&spec, serde_yaml::to_string(&resource["spec"]).unwrap()).unwrap();
    let wrapped = promtool(&["check", "rules", spec.to_str().unwrap()]);
    assert_eq!(count(&plain), count(&wrapped));
    // 4 x 7 SLO windows, 2 violation rates, 4 traffic rates, 4 histograms, 4 cost rules; alerts:
    // the absent one, and per route 3 burns (2 for a 90 % objective) plus goodput-below.
    assert_eq!(
        count(&plain),
        28 + 2 + 4 + 4 + 4 + 1 + 4 + 4 + 4 + 3,
        "{plain}"
    );
}

#[test]
fn promtool_unit_tests_pass() {
    let out = promtool(&["test", "rules", "tests/promtool/rules_test.yaml"]);
    assert!(out.contains("SUCCESS"), "{out}");
}

#[test]
fn every_flag_still_gives_rules_promtool_accepts() {
    let dir = TempDir::new();
    let config = dir.path().join("c.yaml");
    std::fs::write(
        &config,
        "routes:\n  - name: a.b-c\n    slo: {ttft: 1s, objective: 0.995}\n  - name: free\ncost: {per_hour: 0.75, currency: EUR}\n",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_tokenmeter"))
        .args(["rules", "--config", config.to_str().unwrap()])
        .args([
            "--format",
            "prometheus",
            "--dashboard-url",
            "https://grafana.example/",
        ])
        .args(["--selector", "job=\"llm\",namespace=~\"prod|canary\""])
        .args(["--min-requests-per-hour", "500"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("https://grafana.example/d/tokenmeter/tokenmeter?var-route=a.b-c"));
    assert!(text.contains(">= 500"));
    let file = dir.path().join("rules.yaml");
    std::fs::write(&file, &text).unwrap();
    promtool(&["check", "rules", file.to_str().unwrap()]);
}

#[test]
fn bad_input_is_one_line_and_exit_2() {
    let dir = TempDir::new();
    let config = dir.path().join("c.yaml");
    std::fs::write(&config, "cost: {per_hour: 2.5, currency: usd}\n").unwrap();
    for (args, expect) in [
        (
            vec!["rules", "--config", config.to_str().unwrap()],
            "cost.currency",
        ),
        (
            vec!["rules", "--config", "c.yaml", "--selector", "job=llm"],
            "double quotes",
        ),
        (
            vec!["rules", "--config", "c.yaml", "--dashboard-url", "grafana"],
            "http://",
        ),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_tokenmeter"))
            .args(&args)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(expect), "{args:?}: {err}");
    }
}

// ---- End to end with a real Prometheus ----

/// Sums one counter family over the series of `route` in the proxy's own exposition.
fn counter(exposition: &str, family: &str, route: &str) -> f64 {
    exposition
        .lines()
        .filter(|l| {
            l.starts_with(&format!("{family}{{")) && l.contains(&format!("route=\"{route}\""))
        })
        .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
        .sum()
}

fn chat(max_tokens: u32) -> String {
    format!(
        r#"{{"model":"sim-llama","messages":[{{"role":"user","content":"hi"}}],"stream":true,"max_tokens":{max_tokens}}}"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_computes_the_proxys_goodput_and_pages_when_the_sim_turns_slow() {
    let started = Instant::now();
    // `mixed` has no objective: recorded, never alerted on. `chat` promises 99 %.
    let config = Config::parse(
        "routes:\n  - name: mixed\n    match: {headers: {x-route: mixed}}\n    slo: {ttft: 200ms}\n  - name: chat\n    match: {path_prefix: /v1/}\n    slo: {ttft: 200ms, objective: 0.99}\n",
        "e2e.yaml",
    )
    .unwrap();
    let rules = rules::render(
        &config,
        &Options {
            format: Format::Prometheus,
            ..Options::default()
        },
        "e2e.yaml",
    );
    let sim = sim::start(SimConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        ..SimConfig::default()
    })
    .await
    .unwrap();
    let routes = config.routes.clone();
    let proxy = common::proxy(sim.addr, |c| c.routes = routes).await;
    let prometheus = Prometheus::start(proxy.running.admin, &rules).await;
    let url = proxy.url("/v1/chat/completions");
    let send = |route: &'static str, max_tokens: u32| {
        let url = url.clone();
        async move {
            let r = common::send(
                &url,
                "POST",
                &chat(max_tokens),
                &[("content-type", "application/json"), ("x-route", route)],
                false,
            )
            .await;
            assert_eq!(r.status, 200);
        }
    };

    // rate() extrapolates a series that starts above zero by a factor that depends on its
    // values, which would skew good/eligible. So each route's counters are first scraped at 0:
    // one endless stream per route creates them (at its response head) and is then cancelled
    // before any deadline passed, which excludes it from the SLO.
    let endless: Vec<_> = ["mixed", "chat"]
        .into_iter()
        .map(|route| tokio::spawn(send(route, 60_000)))
        .collect();
    prometheus
        .until("both routes' counters scraped at 0", 30, || async {
            let zeros = prometheus
                .query("tokenmeter_slo_eligible_requests_total == 0 and on (route, model) tokenmeter_slo_good_requests_total == 0")
                .await;
            if zeros.len() == 2 {
                Ok(())
            } else {
                Err(format!("{zeros:?}"))
            }
        })
        .await;
    for task in endless {
        task.abort();
    }

    // A mix on `mixed`: every third request is held past its 200 ms TTFT.
    for i in 0..6 {
        let delay = if i % 3 == 0 { 400 } else { 0 };
        sim.set_extra_delay(Duration::from_millis(delay));
        send("mixed", 4).await;
    }
    sim.set_extra_delay(Duration::ZERO);
    // A healthy `chat`.
    for _ in 0..4 {
        send("chat", 4).await;
    }
    // Counters are final once every request (the two cancelled ones too) has its record.
    proxy.records(2 + 6 + 4).await;
    let metrics = proxy.metrics();
    let good = counter(&metrics, "tokenmeter_slo_good_requests_total", "mixed");
    let eligible = counter(&metrics, "tokenmeter_slo_eligible_requests_total", "mixed");
    assert!(
        0.0 < good && good < eligible,
        "expected a mix of good and violated requests: {good} of {eligible}"
    );
    assert_eq!(
        counter(&metrics, "tokenmeter_slo_good_requests_total", "chat"),
        4.0
    );
    let want = good / eligible;
    // Both routes' ratios, from one evaluation: `mixed` as the proxy counted it, `chat` 1.
    let seen = prometheus
        .until(
            "route:tokenmeter_slo_goodput:ratio_rate5m to equal the proxy's good / eligible",
            30,
            || async {
                let got: BTreeMap<String, f64> = prometheus
                    .query("route:tokenmeter_slo_goodput:ratio_rate5m")
                    .await
                    .into_iter()
                    .map(|(labels, v)| (labels["route"].clone(), v))
                    .collect();
                match (got.get("mixed"), got.get("chat")) {
                    (Some(v), Some(1.0)) if (v - want).abs() < 1e-9 => Ok(*v),
                    _ => Err(format!(
                        "{got:?}, want mixed {want} ({good} / {eligible}) and chat 1"
                    )),
                }
            },
        )
        .await;
    let alerts = prometheus.alerts().await;
    assert!(
        !alerts.iter().any(|(l, _)| l.get("route").is_some()),
        "no route has burnt any budget yet: {alerts:?}"
    );

    // Now the sim turns slow: three of chat's seven requests miss their TTFT, a 43 % error
    // ratio over both the 1h and the 5m window, far above 14.4 x 1 %.
    sim.set_extra_delay(Duration::from_millis(400));
    for _ in 0..3 {
        send("chat", 4).await;
    }
    let state = prometheus
        .until(
            "the 14.4x burn alert on chat to be pending or firing",
            30,
            || async {
                let alerts = prometheus.alerts().await;
                alerts
                    .iter()
                    .find(|(l, _)| {
                        l.get("alertname").map(String::as_str) == Some("TokenmeterErrorBudgetBurn")
                            && l.get("route").map(String::as_str) == Some("chat")
                            && l.get("long_window").map(String::as_str) == Some("1h")
                            && l.get("severity").map(String::as_str) == Some("page")
                    })
                    .map(|(_, state)| state.clone())
                    .ok_or_else(|| format!("{alerts:?}"))
            },
        )
        .await;
    assert!(state == "pending" || state == "firing", "{state}");
    let alerts = prometheus.alerts().await;
    assert!(
        !alerts
            .iter()
            .any(|(l, _)| l.get("route").map(String::as_str) == Some("mixed")),
        "a route without an objective got an alert: {alerts:?}"
    );
    eprintln!(
        "goodput ratio {seen} = {good} / {eligible}; burn alert {state}; {:.1} s",
        started.elapsed().as_secs_f64()
    );
}
