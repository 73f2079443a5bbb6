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

use common::prometheus::{Prometheus, Target};
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
    // The objective, 4 x 7 SLO windows, 2 violation rates, 4 traffic rates, 4 histograms,
    // 4 cost rules; alerts: absent fleet-wide and per deployment, 3 burns and goodput-below, one
    // set for every deployment and route however many routes the configuration has.
    assert_eq!(count(&plain), 1 + 28 + 2 + 4 + 4 + 4 + 2 + 3 + 1, "{plain}");
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
        .args(["--group-by", "cluster,namespace,service", "--name", "llm-a"])
        .args(["--min-requests-per-hour", "500"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("https://grafana.example/d/tokenmeter/tokenmeter?var-cluster="));
    assert!(text.contains("cluster_namespace_service_route:tokenmeter_slo_goodput:ratio_rate1h"));
    assert!(text.contains("- name: llm-a-slo"));
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
        (
            vec![
                "rules",
                "--config",
                "c.yaml",
                "--group-by",
                "namespace,model",
            ],
            "objectives are per route",
        ),
        (
            vec!["rules", "--config", "c.yaml", "--name", "LLM_A"],
            "rule set name",
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
            "namespace_job_route:tokenmeter_slo_goodput:ratio_rate5m to equal the proxy's good / eligible",
            30,
            || async {
                let got: BTreeMap<String, f64> = prometheus
                    .query("namespace_job_route:tokenmeter_slo_goodput:ratio_rate5m")
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

/// `tokenmeter rules` with `args`, written to `dir/name`; returns the path.
fn generate(dir: &Path, name: &str, args: &[&str]) -> PathBuf {
    let out = Command::new(env!("CARGO_BIN_EXE_tokenmeter"))
        .arg("rules")
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let path = dir.join(name);
    std::fs::write(&path, out.stdout).unwrap();
    path
}

/// Two deployments with different configurations (prices, routes) share one Prometheus and even
/// a job name; each has its own rule set, told apart by a selector and a name. promtool loads
/// both: each deployment's figures come from its own configuration, nothing collides. Without
/// the selectors both rule sets would record the same series for both deployments, and
/// Prometheus refuses the second sample: the same files then fail, which shows the test can.
#[test]
fn rule_sets_from_different_configurations_coexist_with_selectors() {
    let dir = TempDir::new();
    let a = dir.path().join("a.yaml");
    std::fs::write(
        &a,
        "routes:\n  - name: chat\n    slo: {ttft: 1s, objective: 0.99}\ncost: {per_hour: 2, currency: USD}\n",
    )
    .unwrap();
    let b = dir.path().join("b.yaml");
    std::fs::write(
        &b,
        "routes:\n  - name: chat\n    slo: {e2e: 9s, objective: 0.9}\n  - name: embed\ncost: {per_hour: 10, currency: USD}\n",
    )
    .unwrap();
    let (a, b) = (a.to_str().unwrap(), b.to_str().unwrap());
    let plain = ["--format", "prometheus"];
    let with_selectors = [
        generate(
            dir.path(),
            "rules-a.yaml",
            &[
                &plain[..],
                &[
                    "--config",
                    a,
                    "--selector",
                    "namespace=\"a\"",
                    "--name",
                    "llm-a",
                ],
            ]
            .concat(),
        ),
        generate(
            dir.path(),
            "rules-b.yaml",
            &[
                &plain[..],
                &[
                    "--config",
                    b,
                    "--selector",
                    "namespace=\"b\"",
                    "--name",
                    "llm-b",
                ],
            ]
            .concat(),
        ),
    ];
    let without = [
        generate(
            dir.path(),
            "bare-a.yaml",
            &[&plain[..], &["--config", a, "--name", "llm-a"]].concat(),
        ),
        generate(
            dir.path(),
            "bare-b.yaml",
            &[&plain[..], &["--config", b, "--name", "llm-b"]].concat(),
        ),
    ];
    let case = |files: &[PathBuf; 2]| {
        format!(
            r#"rule_files: [{}, {}]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      - series: tokenmeter_build_info{{namespace="a",job="llm",pod="a1"}}
        values: 1+0x20
      - series: tokenmeter_build_info{{namespace="a",job="llm",pod="a2"}}
        values: 1+0x20
      - series: tokenmeter_build_info{{namespace="b",job="llm",pod="b1"}}
        values: 1+0x20
      - series: tokenmeter_slo_eligible_requests_total{{namespace="a",job="llm",pod="a1",route="chat",model="m"}}
        values: 0+60x20
      - series: tokenmeter_slo_good_requests_total{{namespace="a",job="llm",pod="a1",route="chat",model="m"}}
        values: 0+60x20
      - series: tokenmeter_slo_eligible_requests_total{{namespace="b",job="llm",pod="b1",route="chat",model="m"}}
        values: 0+60x20
      - series: tokenmeter_slo_good_requests_total{{namespace="b",job="llm",pod="b1",route="chat",model="m"}}
        values: 0+30x20
    promql_expr_test:
      - expr: namespace_job:tokenmeter_cost_per_hour:sum
        eval_time: 10m
        exp_samples:
          - labels: 'namespace_job:tokenmeter_cost_per_hour:sum{{namespace="a",job="llm",currency="USD"}}'
            value: 4
          - labels: 'namespace_job:tokenmeter_cost_per_hour:sum{{namespace="b",job="llm",currency="USD"}}'
            value: 10
      - expr: namespace_job_route:tokenmeter_slo_goodput:ratio_rate5m
        eval_time: 10m
        exp_samples:
          - labels: 'namespace_job_route:tokenmeter_slo_goodput:ratio_rate5m{{namespace="a",job="llm",route="chat"}}'
            value: 1
          - labels: 'namespace_job_route:tokenmeter_slo_goodput:ratio_rate5m{{namespace="b",job="llm",route="chat"}}'
            value: 0.5
"#,
            files[0].display(),
            files[1].display()
        )
    };
    let test = dir.path().join("test.yaml");
    std::fs::write(&test, case(&with_selectors)).unwrap();
    let out = promtool(&["test", "rules", test.to_str().unwrap()]);
    assert!(out.contains("SUCCESS"), "{out}");

    std::fs::write(&test, case(&without)).unwrap();
    let out = Command::new("promtool")
        .args(["test", "rules", test.to_str().unwrap()])
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !out.status.success() && text.contains("duplicate sample for timestamp"),
        "two rule sets without selectors should collide:\n{text}"
    );
}

/// One sidecar of the fleet test: its deployment's labels, its model server and itself.
struct Pod {
    namespace: &'static str,
    job: &'static str,
    name: &'static str,
    sim: sim::RunningSim,
    proxy: common::TestProxy,
}

/// The issue's fleet, for real: two deployments with the same job name and the same route,
/// `chat/llm` with two pods and `code/llm` with one, every pod a tokenmeter in front of its own
/// sim, one Prometheus scraping all three with their namespace, job and pod, evaluating the one
/// rule set generated from one configuration (windows and holds divided by 60, so an hour is a
/// minute; the full windows are the promtool cases'). `code/llm`'s model server fails half its
/// requests from some point on: the fast-burn page fires for `code/llm` with its labels and
/// never for `chat/llm`, and each deployment's recorded goodput is what its own records say.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_rule_set_pages_for_the_burning_deployment_of_a_fleet_and_only_for_it() {
    let started = Instant::now();
    let config = Config::parse(
        // A TTFT bound far above the sim's: only failures make a request bad.
        "routes:\n  - name: chat\n    match: {path_prefix: /v1/}\n    slo: {ttft: 3s, objective: 0.99}\n",
        "fleet.yaml",
    )
    .unwrap();
    let rules = rules::render(
        &config,
        &Options {
            format: Format::Prometheus,
            time_divisor: 60,
            ..Options::default()
        },
        "fleet.yaml",
    );
    let mut pods = Vec::new();
    for (seed, (namespace, job, name)) in [
        ("chat", "llm", "chat-llm-0"),
        ("chat", "llm", "chat-llm-1"),
        ("code", "llm", "code-llm-0"),
    ]
    .into_iter()
    .enumerate()
    {
        let sim = sim::start(SimConfig {
            listen: "127.0.0.1:0".parse().unwrap(),
            seed: seed as u64 + 1,
            ..SimConfig::default()
        })
        .await
        .unwrap();
        let routes = config.routes.clone();
        let proxy = common::proxy(sim.addr, |c| c.routes = routes).await;
        pods.push(Pod {
            namespace,
            job,
            name,
            sim,
            proxy,
        });
    }
    let targets: Vec<Target> = pods
        .iter()
        .map(|p| {
            Target::new(
                p.proxy.running.admin,
                &[("namespace", p.namespace), ("job", p.job), ("pod", p.name)],
            )
        })
        .collect();
    let prometheus = Prometheus::scraping(&targets, &rules).await;
    let send = |pod: &Pod, max_tokens: u32| {
        let url = pod.proxy.url("/v1/chat/completions");
        async move {
            let r = common::send(
                &url,
                "POST",
                &chat(max_tokens),
                &[("content-type", "application/json")],
                false,
            )
            .await;
            r.status
        }
    };

    // Every pod's counters are first scraped at 0 (see the single-proxy test above for why):
    // an endless stream per pod creates them, then is cancelled, which excludes it.
    let endless: Vec<_> = pods.iter().map(|p| tokio::spawn(send(p, 60_000))).collect();
    prometheus
        .until("every pod's counters scraped at 0", 30, || async {
            let zeros = prometheus
                .query("tokenmeter_slo_eligible_requests_total == 0 and on (pod, route, model) tokenmeter_slo_good_requests_total == 0")
                .await;
            if zeros.len() == pods.len() {
                Ok(())
            } else {
                Err(format!("{zeros:?}"))
            }
        })
        .await;
    for task in endless {
        task.abort();
    }

    // code/llm's model server starts failing half its requests; chat/llm's stay healthy. Each
    // round sends one request to every pod, until the page fires (a scaled hour is a minute,
    // and the page needs both windows above 14.4x for its scaled hold).
    pods[2].sim.set_fail_rate(0.5);
    let mut sent = vec![0usize; pods.len()];
    let deadline = Instant::now() + Duration::from_secs(90);
    let page = loop {
        let (a, b, c) = tokio::join!(send(&pods[0], 4), send(&pods[1], 4), send(&pods[2], 4));
        let statuses = [a, b, c];
        for (i, status) in statuses.into_iter().enumerate() {
            assert!(
                status == 200 || (i == 2 && status >= 500),
                "pod {}: {status}",
                pods[i].name
            );
            sent[i] += 1;
        }
        let alerts = prometheus.alerts().await;
        let paging: Vec<_> = alerts
            .iter()
            .filter(|(l, _)| {
                l.get("alertname").map(String::as_str) == Some("TokenmeterErrorBudgetBurn")
            })
            .collect();
        assert!(
            paging
                .iter()
                .all(|(l, _)| l.get("namespace").map(String::as_str) == Some("code")),
            "the healthy deployment got a burn alert: {paging:?}"
        );
        if let Some((labels, _)) = paging.iter().find(|(l, state)| {
            state == "firing" && l.get("long_window").map(String::as_str) == Some("1h")
        }) {
            break labels.clone();
        }
        assert!(
            Instant::now() < deadline,
            "no firing fast-burn page for code/llm in 90 s; alerts: {alerts:?}\nprometheus log:\n{}",
            prometheus.log_text()
        );
    };
    for (label, want) in [
        ("namespace", "code"),
        ("job", "llm"),
        ("route", "chat"),
        ("severity", "page"),
    ] {
        assert_eq!(page.get(label).map(String::as_str), Some(want), "{page:?}");
    }
    let annotations = prometheus.annotations("TokenmeterErrorBudgetBurn").await;
    let (_, fast) = annotations
        .iter()
        .find(|(l, _)| l.get("long_window").map(String::as_str) == Some("1h"))
        .expect("the page's annotations");
    assert!(
        fast["summary"].starts_with("code/llm: route chat is burning its error budget"),
        "{fast:?}"
    );
    assert!(fast["description"].contains("objective of 99%"), "{fast:?}");
    assert_eq!(fast["failing_criterion"], "error", "{fast:?}");

    // Each deployment's goodput over the whole test (a scaled day) is what its pods' records
    // say: good / (good + violated), summed over the deployment's pods.
    let mut want: BTreeMap<&str, (f64, f64)> = BTreeMap::new();
    for (i, pod) in pods.iter().enumerate() {
        let records = pod.proxy.records(sent[i] + 1).await;
        let entry = want.entry(pod.namespace).or_default();
        for r in &records {
            match r["slo"].as_str() {
                Some("good") => {
                    entry.0 += 1.0;
                    entry.1 += 1.0;
                }
                Some("violated") => entry.1 += 1.0,
                _ => {}
            }
        }
    }
    let (chat_good, chat_eligible) = want["chat"];
    let (code_good, code_eligible) = want["code"];
    assert_eq!(
        chat_good, chat_eligible,
        "chat/llm's model servers never failed"
    );
    assert!(
        0.0 < code_good && code_good < code_eligible,
        "code/llm: {code_good} of {code_eligible}"
    );
    let seen = prometheus
        .until(
            "each deployment's recorded 1d goodput to equal its records' good / eligible",
            30,
            || async {
                let got: BTreeMap<String, f64> = prometheus
                    .query("namespace_job_route:tokenmeter_slo_goodput:ratio_rate1d")
                    .await
                    .into_iter()
                    .map(|(labels, v)| (format!("{}/{}", labels["namespace"], labels["job"]), v))
                    .collect();
                let close =
                    |key: &str, want: f64| got.get(key).is_some_and(|v| (v - want).abs() < 1e-9);
                if got.len() == 2
                    && close("chat/llm", 1.0)
                    && close("code/llm", code_good / code_eligible)
                {
                    Ok(got)
                } else {
                    Err(format!(
                        "{got:?}, want chat/llm 1 and code/llm {code_good} / {code_eligible}"
                    ))
                }
            },
        )
        .await;
    eprintln!(
        "fleet: {sent:?} requests per pod; goodput {seen:?}; code/llm paged; {:.1} s",
        started.elapsed().as_secs_f64()
    );
}
