//! `tokenmeter report` as a user runs it, over the records of a synthetic run that crosses an
//! engine's slot limit (tests/fixtures/records, written by its `generate.py`: 2 slots, closed-loop
//! levels of 1 to 8 users). What must hold: the bend is named at 2 and the slowest requests are
//! explained as queued; CSV and JSON lines, one file or two pods' files, give the same report;
//! bad input is counted as FILE:LINE and never crashes; `--format json` keeps its documented
//! shape; the HTML page fetches nothing and renders in a real browser (Debian's chromium, which
//! this test requires: without it, it fails, it never skips). Over a fleet's merged records, each
//! deployment is its own section and a pod the slowest requests or the violations concentrate on
//! is named, and no pod when they are spread as the requests are.

mod common;

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use common::TempDir;
use serde_json::Value;
// The project's clock (clippy.toml); outside a runtime, as here, it reads the monotonic clock.
use tokio::time::Instant;

fn fixture(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/records")
        .join(name)
        .display()
        .to_string()
}

fn report(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tokenmeter"))
        .arg("report")
        .args(args)
        .output()
        .expect("tokenmeter runs")
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The report as JSON; the run must succeed.
fn json(args: &[&str]) -> Value {
    let mut all = args.to_vec();
    all.extend(["--format", "json"]);
    let out = report(&all);
    assert!(out.status.success(), "{args:?}: {}", stderr(&out));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", stdout(&out)))
}

/// What a report says about the traffic, without where it was read from.
fn findings(report: &Value) -> Value {
    let mut slowest = report["slowest"].clone();
    for s in slowest.as_array_mut().expect("slowest is a list") {
        let s = s.as_object_mut().expect("a request");
        s.remove("file");
        s.remove("line");
    }
    serde_json::json!({
        "records": report["records"],
        "span_s": report["span_s"],
        "groups": report["groups"],
        "bend_total": report["bend_total"],
        "slowest": slowest,
    })
}

#[test]
fn the_bend_is_named_at_the_slot_count_and_the_slowest_requests_queued() {
    let r = json(&[&fixture("slots2.jsonl")]);
    let groups = r["groups"].as_array().expect("groups");
    assert_eq!(groups.len(), 1);
    let chat = &groups[0];
    assert_eq!(
        (chat["route"].as_str(), chat["model"].as_str()),
        (Some("chat"), Some("llama-3.1-8b"))
    );
    assert_eq!(chat["requests"], 210);
    let knee = &chat["bend"]["knee"];
    assert_eq!(knee["concurrency"], "2", "{}", chat["bend"]);
    assert_eq!(knee["next"], "3");
    assert!(knee["throughput_growth"].as_f64().expect("growth") < 0.10);
    // Up to 2 in flight tokens/s rises and TTFT is flat; past 2 TTFT climbs and tokens/s does not.
    let level = |c: &str| {
        chat["bend"]["levels"]
            .as_array()
            .and_then(|ls| ls.iter().find(|l| l["concurrency"] == c))
            .unwrap_or_else(|| panic!("no level {c}"))
            .clone()
    };
    let tps = |c: &str| level(c)["output_tokens_per_s"].as_f64().expect("tokens/s");
    let ttft50 = |c: &str| level(c)["ttft_p50_ms"].as_f64().expect("ttft");
    assert!(tps("2") > 1.8 * tps("1"), "{} vs {}", tps("2"), tps("1"));
    assert!((tps("8") / tps("2") - 1.0).abs() < 0.10);
    assert!(ttft50("2") < 2.0 * ttft50("1"));
    assert!(ttft50("8") > 20.0 * ttft50("2"));
    assert_eq!(level("7")["judged"], false, "one request is not a level");

    let slowest = r["slowest"].as_array().expect("slowest");
    assert_eq!(slowest.len(), 10);
    for s in slowest {
        let first = &s["causes"][0];
        assert_eq!(first["cause"], "queued", "{s}");
        let evidence = first["evidence"].as_str().expect("evidence");
        assert!(
            evidence.contains("in flight at arrival") && evidence.contains("bend at 2"),
            "{evidence}"
        );
        assert!(evidence.contains("engine waiting"), "{evidence}");
    }
    let e2e: Vec<f64> = slowest
        .iter()
        .map(|s| s["e2e_ms"].as_f64().expect("e2e"))
        .collect();
    assert!(
        e2e.windows(2).all(|w| w[0] >= w[1]),
        "by E2E, slowest first: {e2e:?}"
    );

    let text = report(&[&fixture("slots2.jsonl"), "--slowest", "3"]);
    assert!(text.status.success());
    let text = stdout(&text);
    assert!(
        text.contains("bend: past 2 in flight on the route"),
        "{text}"
    );
    assert!(text.contains("slowest 3 requests"), "{text}");
    assert!(text.contains("queued: 8 in flight at arrival"), "{text}");
}

#[test]
fn csv_and_jsonl_give_the_same_report() {
    let from_jsonl = json(&[&fixture("slots2.jsonl")]);
    let from_csv = json(&[&fixture("slots2.csv")]);
    assert_eq!(from_csv["files"][0]["format"], "csv");
    assert_eq!(from_jsonl["files"][0]["format"], "jsonl");
    assert_eq!(findings(&from_csv), findings(&from_jsonl));
}

#[test]
fn two_pods_files_merge_into_one_report() {
    // The same run split over two files, every other request each, one in CSV.
    let merged = json(&[&fixture("pod-a.jsonl"), &fixture("pod-b.csv")]);
    let files = merged["files"].as_array().expect("files");
    assert_eq!(files.len(), 2);
    assert_eq!(
        (files[0]["records"].as_u64(), files[1]["records"].as_u64()),
        (Some(105), Some(105))
    );
    assert_eq!(
        findings(&merged),
        findings(&json(&[&fixture("slots2.jsonl")]))
    );
    // And a slow request names the file and line it came from.
    let s = &merged["slowest"][0];
    let file = s["file"].as_str().expect("file");
    assert!(
        file.ends_with("pod-a.jsonl") || file.ends_with("pod-b.csv"),
        "{file}"
    );
    assert!(s["line"].as_u64().expect("line") >= 1);
}

#[test]
fn malformed_lines_are_skipped_and_counted_with_file_and_line() {
    let path = fixture("malformed.jsonl");
    let out = report(&[&path, "--slowest", "2"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("5 malformed lines skipped"), "{err}");
    for (line, problem) in [
        (2, "EOF while parsing"),
        (3, "expected"),
        (5, "missing field `e2e_ms`"),
        (6, "invalid type: string \"slow\""),
        (8, "is not an RFC 3339 time"),
    ] {
        let wanted = format!("{path}:{line}: ");
        let found = err.lines().find(|l| l.contains(&wanted));
        assert!(
            found.is_some_and(|l| l.contains(problem)),
            "{wanted}{problem} in:\n{err}"
        );
    }
    assert!(stdout(&out).contains("5 malformed lines skipped"));
    let r = json(&[&path]);
    assert_eq!(r["records"], 4);
    assert_eq!(r["malformed"]["count"], 5);
    assert_eq!(r["files"][0]["malformed"], 5);
    assert_eq!(r["malformed"]["first"].as_array().map(Vec::len), Some(5));
}

#[test]
fn an_empty_file_says_so_and_nothing_at_all_is_exit_2_in_one_line() {
    let empty = fixture("empty.jsonl");
    let out = report(&[&empty, &fixture("slots2.jsonl")]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stderr(&out).contains(&format!("{empty}: empty, no records")));
    assert!(stdout(&out).contains(&format!("{empty}: empty")));

    let out = report(&[&empty]);
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("no records") && err.contains("is empty"),
        "{err}"
    );

    // A file of nothing but bad lines: still one line, naming the first problem.
    let dir = TempDir::new();
    let bad = dir.path().join("bad.jsonl");
    std::fs::write(&bad, "{\"ts\": 1}\nnope\n").expect("write");
    let out = report(&[&bad.display().to_string()]);
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("only malformed lines (2") && err.contains("bad.jsonl:1:"),
        "{err}"
    );

    let out = report(&["/nonexistent/records.jsonl"]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(stderr(&out).lines().count(), 1, "{}", stderr(&out));
}

/// The JSON shape is documented (docs/live-view-and-report.md, "Why was it slow?"); a consumer must never find a
/// documented field gone or renamed.
#[test]
fn the_json_shape_is_the_documented_one() {
    let r = json(&[
        &fixture("slots2.jsonl"),
        "--slowest",
        "4",
        "--config",
        &fixture("tokenmeter.yaml"),
    ]);
    let keys = |v: &Value| -> Vec<String> {
        let mut k: Vec<String> = v.as_object().expect("an object").keys().cloned().collect();
        k.sort();
        k
    };
    let sorted = |names: &[&str]| {
        let mut k: Vec<String> = names.iter().map(|s| s.to_string()).collect();
        k.sort();
        k
    };
    assert_eq!(r["report_version"], 1);
    assert_eq!(
        keys(&r),
        sorted(&[
            "report_version",
            "files",
            "records",
            "malformed",
            "percentile_relative_error",
            "start",
            "end",
            "span_s",
            "by_deployment",
            "groups",
            "bend_total",
            "pods",
            "slowest",
            "failures"
        ])
    );
    assert_eq!(r["percentile_relative_error"], 0.01);
    assert_eq!(keys(&r["failures"]), sorted(&["count", "reasons"]));
    assert_eq!(r["by_deployment"], false);
    assert_eq!(r["pods"], serde_json::json!([]), "no record names a pod");
    assert_eq!(
        keys(&r["files"][0]),
        sorted(&["path", "format", "records", "malformed"])
    );
    assert_eq!(keys(&r["malformed"]), sorted(&["count", "first"]));
    let g = &r["groups"][0];
    assert_eq!(
        keys(g),
        sorted(&[
            "deployment",
            "route",
            "model",
            "requests",
            "errors",
            "ttft_ms",
            "tpot_ms",
            "max_itl_ms",
            "e2e_ms",
            "prompt_tokens",
            "output_tokens",
            "good",
            "violated",
            "goodput_per_s",
            "active_s",
            "goodput_per_active_s",
            "attainment",
            "slo",
            "bend",
            "timeline"
        ])
    );
    assert_eq!(keys(&g["timeline"]), sorted(&["bucket_s", "points"]));
    assert_eq!(
        keys(&g["timeline"]["points"][0]),
        sorted(&[
            "start",
            "at_s",
            "requests",
            "errors",
            "ttft_p50_ms",
            "ttft_p99_ms",
            "e2e_p50_ms",
            "e2e_p99_ms"
        ])
    );
    assert_eq!(keys(&g["ttft_ms"]), sorted(&["p50", "p95", "p99"]));
    assert_eq!(
        keys(&g["slo"]),
        sorted(&["ttft_ms", "tpot_ms", "e2e_ms", "max_itl_ms", "objective"])
    );
    assert_eq!(g["slo"]["ttft_ms"], 1000.0);
    assert_eq!(g["slo"]["objective"], 0.95);
    assert_eq!(
        keys(&g["bend"]),
        sorted(&["by", "levels", "knee", "verdict"])
    );
    assert_eq!(g["bend"]["by"], "in_flight");
    assert_eq!(
        keys(&g["bend"]["levels"][0]),
        sorted(&[
            "concurrency",
            "low",
            "high",
            "requests",
            "judged",
            "ttft_p50_ms",
            "ttft_p99_ms",
            "e2e_p99_ms",
            "output_tokens_per_s"
        ])
    );
    assert_eq!(
        keys(&g["bend"]["knee"]),
        sorted(&[
            "concurrency",
            "high",
            "next",
            "throughput_growth",
            "ttft_p99_ms"
        ])
    );
    assert_eq!(r["bend_total"]["by"], "in_flight_total");
    let s = &r["slowest"][0];
    assert_eq!(
        keys(s),
        sorted(&[
            "file",
            "line",
            "ts",
            "request_id",
            "deployment",
            "pod",
            "route",
            "model",
            "outcome",
            "e2e_ms",
            "ttft_ms",
            "prompt_tokens",
            "output_tokens",
            "in_flight",
            "causes"
        ])
    );
    assert_eq!(keys(&s["causes"][0]), sorted(&["cause", "ms", "evidence"]));
    // Attainment is good / (good + violated) from the records' `slo` field.
    let (good, violated) = (g["good"].as_f64().unwrap(), g["violated"].as_f64().unwrap());
    let attainment = g["attainment"].as_f64().unwrap();
    assert!((attainment - good / (good + violated)).abs() < 1e-6);
    assert_eq!(good + violated, 210.0);

    let text = stdout(&report(&[
        &fixture("slots2.jsonl"),
        "--config",
        &fixture("tokenmeter.yaml"),
    ]));
    assert!(
        text.contains("SLO (from --config): TTFT <= 1000 ms, TPOT <= 50.0 ms, objective 95 %"),
        "{text}"
    );
}

/// One record as a proxy writes it, with who served it (`None`: an older proxy's record,
/// without the fields).
fn record(
    i: usize,
    who: Option<(&str, &str, &str)>,
    route: &str,
    e2e_ms: f64,
    violated: bool,
) -> Value {
    let ts = humantime::format_rfc3339_millis(
        std::time::UNIX_EPOCH + Duration::from_millis(1_772_359_200_000 + 100 * i as u64),
    )
    .to_string();
    let mut r = serde_json::json!({
        "ts": ts,
        "request_id": format!("req-{i}"),
        "route": route,
        "model": "llama-3.1-8b",
        "status": 200,
        "outcome": "ok",
        "slo": if violated { "violated" } else { "good" },
        "prompt_tokens": 200,
        "output_tokens": 80,
        "ttft_ms": e2e_ms / 20.0,
        "e2e_ms": e2e_ms,
        "in_flight": 1,
        "in_flight_total": 1,
    });
    if let Some((namespace, deployment, pod)) = who {
        r["namespace"] = namespace.into();
        r["deployment"] = deployment.into();
        r["pod"] = pod.into();
    }
    r
}

/// Writes records as JSON lines, or as CSV with a header of their fields.
fn write_records(path: &Path, records: &[Value]) {
    let text = if path.extension().is_some_and(|e| e == "csv") {
        let columns = [
            "ts",
            "request_id",
            "route",
            "model",
            "status",
            "outcome",
            "slo",
            "prompt_tokens",
            "output_tokens",
            "ttft_ms",
            "e2e_ms",
            "in_flight",
            "in_flight_total",
            "pod",
            "namespace",
            "deployment",
        ];
        let mut text = columns.join(",") + "\n";
        for r in records {
            let cells: Vec<String> = columns
                .iter()
                .map(|c| match &r[*c] {
                    Value::Null => String::new(),
                    Value::String(s) => s.clone(),
                    v => v.to_string(),
                })
                .collect();
            text += &(cells.join(",") + "\n");
        }
        text
    } else {
        records.iter().map(|r| r.to_string() + "\n").collect()
    };
    std::fs::write(path, text).expect("write records");
}

/// The pods entry of a deployment.
fn pods_of<'a>(report: &'a Value, deployment: Option<&str>) -> &'a Value {
    report["pods"]
        .as_array()
        .expect("pods")
        .iter()
        .find(|p| p["deployment"].as_str() == deployment)
        .unwrap_or_else(|| panic!("no pods of {deployment:?} in {}", report["pods"]))
}

/// A fleet: deployment `chat` (3 pods, `chat-b` slow on every request), deployment `code`
/// (2 pods, every 7th request slow whichever pod served it), both in namespace `inference`,
/// one file per pod (one of them CSV), and one file of an older proxy whose records name no
/// one. The report has a section per deployment, names chat-b for chat's slowest requests and
/// violations, and no pod for code.
#[test]
fn a_fleets_records_are_split_by_deployment_and_name_the_slow_pod() {
    let dir = TempDir::new();
    let mut files: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    for i in 0..600 {
        let pod = ["chat-a", "chat-b", "chat-c"][i % 3];
        let base = 1000.0 + (i * 37 % 101) as f64;
        let (e2e, violated) = if pod == "chat-b" {
            (4.0 * base, true)
        } else {
            (base, i % 60 == 0)
        };
        let file = if pod == "chat-c" {
            "chat-c.csv"
        } else {
            &format!("{pod}.jsonl")
        };
        files.entry(file.to_string()).or_default().push(record(
            i,
            Some(("inference", "chat", pod)),
            "chat",
            e2e,
            violated,
        ));
    }
    for i in 0..400 {
        let pod = ["code-a", "code-b"][i % 2];
        let slow = i % 7 == 0;
        let e2e = if slow { 6000.0 } else { 800.0 } + (i * 13 % 29) as f64;
        files
            .entry(format!("{pod}.jsonl"))
            .or_default()
            .push(record(
                i,
                Some(("inference", "code", pod)),
                "chat",
                e2e,
                slow,
            ));
    }
    files.insert(
        "old.jsonl".into(),
        (0..30)
            .map(|i| record(i, None, "chat", 900.0, false))
            .collect(),
    );
    let mut paths = Vec::new();
    for (name, records) in &files {
        let path = dir.path().join(name);
        write_records(&path, records);
        paths.push(path.display().to_string());
    }
    let args: Vec<&str> = paths.iter().map(String::as_str).collect();
    let r = json(&args);
    assert_eq!(r["records"], 1030);
    assert_eq!(r["malformed"]["count"], 0, "{}", r["malformed"]);
    assert_eq!(r["by_deployment"], true);
    let sections: Vec<(Option<&str>, u64)> = r["groups"]
        .as_array()
        .expect("groups")
        .iter()
        .map(|g| (g["deployment"].as_str(), g["requests"].as_u64().unwrap()))
        .collect();
    assert_eq!(
        sections,
        [
            (Some("inference/chat"), 600),
            (Some("inference/code"), 400),
            (None, 30)
        ],
        "one section per deployment, the old records apart; worst attainment first"
    );

    let chat = pods_of(&r, Some("inference/chat"));
    assert_eq!(chat["requests"], 600);
    let named: Vec<(&str, &str)> = chat["concentrated"]
        .as_array()
        .expect("concentrated")
        .iter()
        .map(|c| (c["pod"].as_str().unwrap(), c["on"].as_str().unwrap()))
        .collect();
    assert_eq!(named, [("chat-b", "slowest"), ("chat-b", "violations")]);
    let slowest = &chat["concentrated"][0];
    assert_eq!(
        (slowest["count"].as_u64(), slowest["of"].as_u64()),
        (Some(20), Some(20))
    );
    assert!(slowest["chance"].as_f64().unwrap() < 1e-6);
    let code = pods_of(&r, Some("inference/code"));
    assert_eq!(code["concentrated"], serde_json::json!([]), "{code}");
    assert!(
        code["verdict"]
            .as_str()
            .unwrap()
            .starts_with("no pod stands out"),
        "{code}"
    );
    assert!(
        r["pods"]
            .as_array()
            .unwrap()
            .iter()
            .all(|p| !p["deployment"].is_null()),
        "the old records name no pod, so they have no pods entry"
    );
    // The slowest requests say who served them.
    let first = &r["slowest"][0];
    assert_eq!(first["deployment"], "inference/code");
    assert!(
        first["pod"].as_str().unwrap().starts_with("code-"),
        "{first}"
    );

    let mut with_html = args.clone();
    let html = dir.path().join("report.html");
    let html_arg = html.display().to_string();
    with_html.extend(["--html", &html_arg]);
    let out = report(&with_html);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    for wanted in [
        "inference/chat: chat / llama-3.1-8b: 600 requests",
        "inference/code: chat / llama-3.1-8b: 400 requests",
        "(no deployment): chat / llama-3.1-8b: 30 requests",
        "pods of deployment inference/chat",
        "finding: the slowest requests concentrate on pod chat-b: 20 of the 20 (100 %), against 33 % of the requests",
        "the violations concentrate on pod chat-b",
        "pods of deployment inference/code",
        "finding: no pod stands out: none of the 2 pods",
        "(a pod is named when it holds, of the slowest 1 % of its deployment's requests by E2E (at least the 20 slowest)",
    ] {
        assert!(text.contains(wanted), "{wanted:?} in:\n{text}");
    }
    let page = std::fs::read_to_string(&html).expect("the page");
    assert!(
        page.contains("<h2>Pods of deployment inference/chat</h2>"),
        "{page}"
    );
    assert!(page.contains("the slowest requests concentrate on pod chat-b"));
    assert!(
        page.contains("a pod is named when it holds"),
        "the rule is on the page"
    );
}

/// Slowness spread over every pod as their requests are: no pod is named, in one deployment
/// (no split into sections).
#[test]
fn slowness_spread_over_the_pods_names_none() {
    let dir = TempDir::new();
    let pods = ["llm-1", "llm-2", "llm-3", "llm-4"];
    let mut paths = Vec::new();
    for (p, pod) in pods.iter().enumerate() {
        let records: Vec<Value> = (0..2000)
            .filter(|i| i % pods.len() == p)
            .map(|i| {
                // Every 7th request slow, and now and then a violation, whichever pod (7 and 13
                // share no factor with the 4 pods the requests go round).
                let e2e = if i % 7 == 0 { 5000.0 } else { 1000.0 } + (i * 31 % 97) as f64;
                record(
                    i,
                    Some(("prod", "llm", pod)),
                    "chat",
                    e2e,
                    i % 7 == 0 || i % 13 == 0,
                )
            })
            .collect();
        let path = dir.path().join(format!("{pod}.jsonl"));
        write_records(&path, &records);
        paths.push(path.display().to_string());
    }
    let args: Vec<&str> = paths.iter().map(String::as_str).collect();
    let r = json(&args);
    assert_eq!(r["by_deployment"], false, "one deployment: no split");
    assert!(r["groups"][0]["deployment"].is_null());
    let llm = pods_of(&r, Some("prod/llm"));
    assert_eq!(llm["slowest"], 20);
    assert_eq!(llm["pods"].as_array().map(Vec::len), Some(4));
    assert_eq!(llm["concentrated"], serde_json::json!([]), "{llm}");
    let text = stdout(&report(&args));
    assert!(
        text.contains(
            "finding: no pod stands out: none of the 4 pods holds a share of the 20 slowest requests nor of the"
        ),
        "{text}"
    );
}

fn chromium() -> PathBuf {
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .flat_map(|dir| ["chromium", "chromium-browser"].map(|name| dir.join(name)))
            .find(|p| p.is_file())
    });
    found.unwrap_or_else(|| {
        panic!(
            "this test needs a real browser: Debian's `chromium` is not on PATH \
             (install it with `apt-get install chromium`; tests/run.sh does)"
        )
    })
}

/// Runs headless chromium with `action` (`--dump-dom`, `--screenshot=...`) on `url` and returns
/// its stdout; fails the test when it fails or takes over 90 s.
fn chromium_run(action: &[String], url: &str) -> String {
    let profile = TempDir::new();
    let mut child = Command::new(chromium())
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-dev-shm-usage",
            "--window-size=1280,2000",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .args(action)
        .arg(url)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start chromium: {e}"));
    // Both pipes drained on their own threads, so a large DOM cannot stall chromium.
    let drain = |mut pipe: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut out = String::new();
            let _ = pipe.read_to_string(&mut out);
            out
        })
    };
    let out = drain(Box::new(child.stdout.take().expect("piped")));
    let err = drain(Box::new(child.stderr.take().expect("piped")));
    let deadline = Instant::now() + Duration::from_secs(90);
    let status = loop {
        if let Some(status) = child.try_wait().expect("chromium's status") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "chromium did not finish within 90 s: {}",
                err.join().unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let (out, log) = (
        out.join().unwrap_or_default(),
        err.join().unwrap_or_default(),
    );
    assert!(status.success(), "chromium failed ({status}): {log}");
    out
}

#[test]
fn the_html_page_is_self_contained_and_renders_in_a_browser() {
    let dir = TempDir::new();
    let page = dir.path().join("report.html");
    let out = report(&[
        &fixture("slots2.jsonl"),
        "--html",
        &page.display().to_string(),
        "--config",
        &fixture("tokenmeter.yaml"),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let html = std::fs::read_to_string(&page).expect("the page was written");

    // Nothing to fetch: no script, stylesheet link, import or URL-valued attribute.
    let lower = html.to_ascii_lowercase();
    for forbidden in ["<script", "<link", "@import", "url(", "<img", "<iframe"] {
        assert!(!lower.contains(forbidden), "the page holds {forbidden}");
    }
    for attribute in ["src=", "href="] {
        for quote in ["\"", "'", ""] {
            for scheme in ["http://", "https://", "//"] {
                let wanted = format!("{attribute}{quote}{scheme}");
                assert!(!lower.contains(&wanted), "the page fetches: {wanted}");
            }
        }
    }
    assert_eq!(
        lower.matches("<svg").count(),
        3,
        "the bend plot, the TTFT histogram and the timeline"
    );

    let url = format!("file://{}", page.display());
    let dom = chromium_run(&["--dump-dom".into()], &url);
    assert!(dom.contains("</html>"), "{dom}");
    assert_eq!(
        dom.matches("<svg").count(),
        3,
        "the browser kept every plot"
    );
    // Every plot draws the route's TTFT SLO (from --config) and names it under the plot.
    assert_eq!(
        dom.matches("TTFT SLO 1000 ms").count(),
        3,
        "the SLO on every plot"
    );
    assert!(dom.contains("latency over time"), "the timeline");
    let summary = dom
        .find("Summary, worst first")
        .expect("the summary on top");
    assert!(
        summary < dom.find("Percentiles").expect("a group's tables"),
        "the summary leads"
    );
    // Queued requests push p99 TTFT past the 1 s SLO: the figure is marked.
    assert!(
        dom.contains("class=\"over\""),
        "a figure past its SLO is marked"
    );
    assert!(
        dom.contains("past 2 in flight on the route"),
        "the bend's verdict"
    );
    assert!(dom.contains("class=\"knee\""), "the bend's row is marked");
    assert!(
        dom.contains("<span class=\"cause\">queued</span>"),
        "the slowest explained"
    );

    let shot = dir.path().join("report.png");
    chromium_run(&[format!("--screenshot={}", shot.display())], &url);
    let png = std::fs::read(&shot).expect("a screenshot");
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    let size = |at: usize| u32::from_be_bytes([png[at], png[at + 1], png[at + 2], png[at + 3]]);
    assert_eq!((size(16), size(20)), (1280, 2000));
    // A blank or unstyled page compresses to a few KiB; plots, tables and text do not.
    assert!(
        png.len() > 60_000,
        "the screenshot looks empty: {} bytes",
        png.len()
    );
}

/// numpy's linear interpolation over sorted values.
fn exact_percentile(sorted: &[f64], p: f64) -> f64 {
    let h = p / 100.0 * (sorted.len() - 1) as f64;
    let (lo, hi) = (h.floor() as usize, h.ceil() as usize);
    sorted[lo] + (h - lo as f64) * (sorted[hi] - sorted[lo])
}

/// Within the sketch's stated relative error (1 %), plus the thousandth the JSON rounds to.
fn assert_within(what: &str, got: &Value, want: f64) {
    let got = got
        .as_f64()
        .unwrap_or_else(|| panic!("{what}: no figure, wanted {want}"));
    assert!(
        (got - want).abs() <= 0.01 * want.abs() + 0.0015,
        "{what}: {got} against exactly {want}"
    );
}

/// A generated day of two routes, folded by the streaming report, against the same figures
/// computed here exactly from every record: percentiles within the sketch's 1 %, counts, sums,
/// attainment, goodput, the levels' requests and output tokens/s, the slowest requests and the
/// failures exactly.
#[test]
fn streamed_figures_match_the_exact_ones_within_the_sketchs_error() {
    let dir = TempDir::new();
    let mut rng = fastrand::Rng::with_seed(38);
    let mut records = Vec::new();
    let reasons = ["upstream_reset", "upstream_timeout", "upstream_unreachable"];
    for i in 0..20_000u64 {
        let route = if i % 3 == 0 { "batch" } else { "chat" };
        let in_flight = rng.i64(1..=40);
        let queued = (in_flight - 8).max(0) as f64 * 120.0;
        let ttft = 40.0 + rng.f64() * 60.0 + queued;
        let output = rng.u64(1..=600);
        let tpot = 15.0 + rng.f64() * 20.0;
        let e2e = ((ttft + tpot * output as f64) * 1000.0).round() / 1000.0;
        let ok = i % 97 != 0;
        let ts = humantime::format_rfc3339_millis(
            std::time::UNIX_EPOCH + Duration::from_millis(1_772_359_200_000 + 4_000 * i),
        )
        .to_string();
        let mut r = serde_json::json!({
            "ts": ts,
            "request_id": format!("r{i}"),
            "route": route,
            "model": "m",
            "outcome": if ok { "ok" } else { "error" },
            "status": if ok { 200 } else { 502 },
            "slo": if !ok || ttft > 1000.0 { "violated" } else { "good" },
            "prompt_tokens": rng.u64(10..=4000),
            "output_tokens": output,
            "ttft_ms": (ttft * 1000.0).round() / 1000.0,
            "tpot_ms": (tpot * 1000.0).round() / 1000.0,
            "e2e_ms": e2e,
            "in_flight": in_flight,
            "in_flight_total": in_flight * 2,
        });
        if !ok {
            r["reason"] = reasons[(i % 3) as usize].into();
        }
        records.push(r);
    }
    let path = dir.path().join("day.jsonl");
    write_records(&path, &records);
    let r = json(&[&path.display().to_string(), "--slowest", "25"]);
    assert_eq!(r["records"], 20_000);

    let number = |v: &Value| v.as_f64().expect("a number");
    for g in r["groups"].as_array().expect("groups") {
        let route = g["route"].as_str().unwrap();
        let mine: Vec<&Value> = records.iter().filter(|x| x["route"] == route).collect();
        let ok: Vec<&Value> = mine
            .iter()
            .copied()
            .filter(|x| x["outcome"] == "ok")
            .collect();
        assert_eq!(g["requests"], mine.len());
        assert_eq!(g["errors"], mine.len() - ok.len());
        let good = mine.iter().filter(|x| x["slo"] == "good").count();
        assert_eq!(g["good"], good);
        for field in [
            "ttft_ms",
            "tpot_ms",
            "e2e_ms",
            "prompt_tokens",
            "output_tokens",
        ] {
            let mut values: Vec<f64> = ok.iter().map(|x| number(&x[field])).collect();
            values.sort_by(f64::total_cmp);
            for p in [50.0, 95.0, 99.0] {
                assert_within(
                    &format!("{route} {field} p{p}"),
                    &g[field][format!("p{p}")],
                    exact_percentile(&values, p),
                );
            }
        }
        // Goodput over the group's own active time, first request to the end of its last.
        let at = |x: &Value| {
            humantime::parse_rfc3339_weak(x["ts"].as_str().unwrap())
                .unwrap()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_secs_f64()
        };
        let first = mine.iter().map(|x| at(x)).fold(f64::INFINITY, f64::min);
        let last = mine
            .iter()
            .map(|x| at(x) + number(&x["e2e_ms"]) / 1000.0)
            .fold(f64::NEG_INFINITY, f64::max);
        assert_within(
            &format!("{route} goodput"),
            &g["goodput_per_active_s"],
            good as f64 / (last - first),
        );
        // Every level: its requests and output tokens/s exactly, its TTFT within 1 %.
        for level in g["bend"]["levels"].as_array().expect("levels") {
            let (low, high) = (number(&level["low"]), number(&level["high"]));
            let at_level: Vec<&&Value> = ok
                .iter()
                .filter(|x| (low..=high).contains(&number(&x["in_flight"])))
                .collect();
            assert_eq!(level["requests"], at_level.len(), "{level}");
            let mut ttft: Vec<f64> = at_level.iter().map(|x| number(&x["ttft_ms"])).collect();
            ttft.sort_by(f64::total_cmp);
            assert_within(
                "level TTFT p99",
                &level["ttft_p99_ms"],
                exact_percentile(&ttft, 99.0),
            );
            let n = at_level.len() as f64;
            let concurrency = at_level
                .iter()
                .map(|x| number(&x["in_flight"]))
                .sum::<f64>()
                / n;
            let tokens: f64 = at_level.iter().map(|x| number(&x["output_tokens"])).sum();
            let seconds: f64 = at_level.iter().map(|x| number(&x["e2e_ms"])).sum::<f64>() / 1000.0;
            let tps = number(&level["output_tokens_per_s"]);
            assert!(
                (tps - concurrency * tokens / seconds).abs() < 0.002,
                "{tps} against {}",
                concurrency * tokens / seconds
            );
        }
    }
    // The slowest, exactly.
    let mut e2e: Vec<f64> = records.iter().map(|x| number(&x["e2e_ms"])).collect();
    e2e.sort_by(|a, b| b.total_cmp(a));
    let slowest: Vec<f64> = r["slowest"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| number(&s["e2e_ms"]))
        .collect();
    assert_eq!(slowest, e2e[..25]);
    // The failures by reason, with the first of each as read.
    let failed: Vec<&Value> = records.iter().filter(|x| x["outcome"] != "ok").collect();
    assert_eq!(r["failures"]["count"], failed.len());
    let reasons_seen = r["failures"]["reasons"].as_array().expect("reasons");
    assert_eq!(reasons_seen.len(), 3);
    for reason in reasons_seen {
        let words = reason["reason"].as_str().unwrap();
        let of_it: Vec<&&Value> = failed
            .iter()
            .filter(|x| {
                words
                    == format!(
                        "outcome error, status 502, {}",
                        x["reason"].as_str().unwrap()
                    )
            })
            .collect();
        assert_eq!(reason["count"], of_it.len(), "{words}");
        let first: Vec<&str> = reason["first"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x["request_id"].as_str().unwrap())
            .collect();
        let want: Vec<&str> = of_it
            .iter()
            .take(5)
            .map(|x| x["request_id"].as_str().unwrap())
            .collect();
        assert_eq!(first, want);
    }
}

/// A route that ran for a minute of an hour, all good, and a route that ran all hour with a
/// fifth of its requests violating: the violating route leads the summary, the short route's
/// goodput is its rate while it ran, and the failures are listed with their reasons.
#[test]
fn the_report_leads_with_the_worst_route_and_its_failures() {
    let dir = TempDir::new();
    let mut records = Vec::new();
    for i in 0..60u64 {
        let mut r = record(i as usize, None, "short", 200.0, false);
        r["ts"] = humantime::format_rfc3339_millis(
            std::time::UNIX_EPOCH + Duration::from_millis(1_772_359_200_000 + 1_000 * i),
        )
        .to_string()
        .into();
        records.push(r);
    }
    for i in 0..360u64 {
        let mut r = record(i as usize, None, "long", 300.0, i % 5 == 0);
        r["ts"] = humantime::format_rfc3339_millis(
            std::time::UNIX_EPOCH + Duration::from_millis(1_772_359_200_000 + 10_000 * i),
        )
        .to_string()
        .into();
        if i % 10 == 0 {
            r["outcome"] = "error".into();
            r["status"] = 502.into();
            r["reason"] = "upstream_reset".into();
        }
        records.push(r);
    }
    let path = dir.path().join("hour.jsonl");
    write_records(&path, &records);
    let arg = path.display().to_string();
    let r = json(&[&arg]);
    let routes: Vec<&str> = r["groups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["route"].as_str().unwrap())
        .collect();
    assert_eq!(routes, ["long", "short"], "worst attainment first");
    let short = &r["groups"][1];
    // 60 good requests from 0 s to 59.2 s: about one a second, not a sixtieth of that.
    let active = short["active_s"].as_f64().unwrap();
    assert!((active - 59.2).abs() < 0.01, "{active}");
    assert_within("goodput", &short["goodput_per_active_s"], 60.0 / 59.2);
    assert!(
        short["goodput_per_s"].as_f64().unwrap() < 0.1,
        "over the whole span"
    );
    assert_eq!(r["failures"]["count"], 36);
    assert_eq!(
        r["failures"]["reasons"][0]["reason"],
        "outcome error, status 502, upstream_reset"
    );

    let text = stdout(&report(&[&arg]));
    let summary = text.find("summary, worst first").expect("a summary");
    let failures = text
        .find("36 failed requests (outcome not ok), by reason:")
        .expect("the failures");
    let first_section = text
        .find("long / llama-3.1-8b: 360 requests")
        .expect("a section");
    assert!(summary < failures && failures < first_section, "{text}");
    assert!(
        text.contains("outcome error, status 502, upstream_reset"),
        "{text}"
    );
    assert!(text.contains("over its 59.2 s of activity"), "{text}");
}

/// The demo's bench.csv (what `tokenmeter bench --csv` writes) is not a record file: the report
/// says so in one line, and what it reads, instead of a parse error about a cell.
#[test]
fn a_bench_csv_is_named_for_what_it_is() {
    let dir = TempDir::new();
    let bench = dir.path().join("bench.csv");
    std::fs::write(
        &bench,
        "request_id,concurrency,prompt_tokens,output_tokens,ttft_ms,tpot_ms,total_ms,status,error,max_itl_ms,token_source,rate,max_tokens,start_ms,target\n\
         0,1,12,64,80.100,20.200,1400.500,200,,30.000,usage,,64,0.000,a\n",
    )
    .expect("write");
    let out = report(&[&bench.display().to_string()]);
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("looks like a `tokenmeter bench` CSV")
            && err.contains("reads the per-request records the proxy writes"),
        "{err}"
    );
    assert!(!err.contains("invalid digit"), "{err}");
}

/// Loads `page` in a frame `width` px wide inside a wrapper page (the report itself holds no
/// script), and returns how wide its content is: `scrollWidth` of the report's own document.
fn rendered_width(page: &Path, width: u32) -> u32 {
    let dir = TempDir::new();
    let html = std::fs::read_to_string(page).unwrap();
    let escaped = html
        .replace('&', "&amp;")
        .replace('"', "&quot;")
        .replace('<', "&lt;")
        .replace('>', "&gt;");
    let wrapper = format!(
        r#"<!doctype html><html><body style="margin:0"><iframe id="frame" srcdoc="{escaped}" style="width:{width}px;height:2000px;border:0"></iframe>
<script>
document.getElementById("frame").addEventListener("load", (e) => {{
  const d = e.target.contentDocument.documentElement;
  document.body.dataset.measured = d.scrollWidth + " " + d.clientWidth;
}});
</script></body></html>"#
    );
    let path = dir.path().join("wrapper.html");
    std::fs::write(&path, wrapper).unwrap();
    let dom = chromium_run(
        &["--virtual-time-budget=5000".into(), "--dump-dom".into()],
        &format!("file://{}", path.display()),
    );
    let measured = dom
        .split("data-measured=\"")
        .nth(1)
        .and_then(|v| v.split('"').next())
        .unwrap_or_else(|| panic!("the frame never loaded:\n{dom}"));
    let [scroll, client]: [u32; 2] = measured
        .split(' ')
        .map(|v| v.parse().unwrap_or_else(|e| panic!("{measured}: {e}")))
        .collect::<Vec<_>>()
        .try_into()
        .unwrap_or_else(|_| panic!("{measured}"));
    assert!(
        client <= width && client + 20 >= width,
        "the frame is not {width} px wide: {measured}"
    );
    assert!(
        scroll <= client,
        "at {width} px the report is {scroll} px wide: it overflows horizontally"
    );
    scroll
}

/// The report of a route with a bend, its SLO from `--config` on every plot, and its 20 slowest
/// requests with their causes fits a 1280 px and a 1400 px window: wide tables scroll inside
/// their own box, the page never does. (At 300 px it does overflow, which shows the measurement
/// can fail.)
#[test]
fn the_html_report_never_overflows_a_1280_px_window() {
    let dir = TempDir::new();
    let page = dir.path().join("report.html");
    let out = report(&[
        &fixture("slots2.jsonl"),
        "--html",
        &page.display().to_string(),
        "--config",
        &fixture("tokenmeter.yaml"),
        "--slowest",
        "20",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    for width in [1280, 1400] {
        rendered_width(&page, width);
    }
}
