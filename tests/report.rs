//! `tokenmeter report` as a user runs it, over the records of a synthetic run that crosses an
//! engine's slot limit (tests/fixtures/records, written by its `generate.py`: 2 slots, closed-loop
//! levels of 1 to 8 users). What must hold: the bend is named at 2 and the slowest requests are
//! explained as queued; CSV and JSON lines, one file or two pods' files, give the same report;
//! bad input is counted as FILE:LINE and never crashes; `--format json` keeps its documented
//! shape; the HTML page fetches nothing and renders in a real browser (Debian's chromium, which
//! this test requires: without it, it fails, it never skips).

mod common;

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

/// The JSON shape is documented (README "Why was it slow?"); a consumer must never find a
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
            "start",
            "end",
            "span_s",
            "groups",
            "bend_total",
            "slowest"
        ])
    );
    assert_eq!(
        keys(&r["files"][0]),
        sorted(&["path", "format", "records", "malformed"])
    );
    assert_eq!(keys(&r["malformed"]), sorted(&["count", "first"]));
    let g = &r["groups"][0];
    assert_eq!(
        keys(g),
        sorted(&[
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
            "attainment",
            "slo",
            "bend"
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
        2,
        "the bend plot and the TTFT histogram"
    );

    let url = format!("file://{}", page.display());
    let dom = chromium_run(&["--dump-dom".into()], &url);
    assert!(dom.contains("</html>"), "{dom}");
    assert_eq!(
        dom.matches("<svg").count(),
        2,
        "the browser kept both plots"
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
