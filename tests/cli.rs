//! The `tokenmeter` binary as a user runs it: `check`, config errors, and a clean stop on SIGTERM.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::TempDir;

/// Kills the child if the test fails before it has stopped it.
struct Reaped(std::process::Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn tokenmeter() -> Command {
    Command::new(env!("CARGO_BIN_EXE_tokenmeter"))
}

#[test]
fn the_documented_example_config_is_valid() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/config/tokenmeter.yaml");
    let out = tokenmeter()
        .args(["check", "--config", path])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("ok"));
}

/// A bad config must stop with one clear line naming the file, the field (and its line) and
/// the problem — never a panic, never a backtrace.
#[test]
fn bad_configs_name_file_field_and_problem() {
    let dir = TempDir::new();
    let cases = [
        ("not yaml", "listen: [\n", vec![]),
        (
            "unknown field",
            "listen: 127.0.0.1:1\nupstreem: http://x:1\n",
            vec!["unknown field `upstreem`", "line 2"],
        ),
        (
            "bad duration",
            "timeouts:\n  connect: fast\n",
            vec!["timeouts.connect", "`fast` is not a duration", "line 2"],
        ),
        (
            "bare number",
            "timeouts:\n  drain: 30\n",
            vec!["timeouts.drain", "no unit"],
        ),
        (
            "bad address",
            "admin: localhost:99999\n",
            vec!["admin", "socket address"],
        ),
        (
            "ratio out of range",
            "routes:\n  - name: chat\n    slo:\n      objective: 99\n",
            vec!["routes[0].slo.objective", "outside 0..1", "line 4"],
        ),
        (
            "bad upstream",
            "upstream: ftp://x\n",
            vec!["upstream", "only http://"],
        ),
    ];
    for (name, text, wants) in cases {
        let path = dir.path().join(format!("{}.yaml", name.replace(' ', "-")));
        std::fs::write(&path, text).unwrap();
        for args in [
            vec!["check", "--config", path.to_str().unwrap()],
            vec![
                "--config",
                path.to_str().unwrap(),
                "--listen",
                "127.0.0.1:0",
                "--admin",
                "127.0.0.1:0",
            ],
        ] {
            let out = tokenmeter()
                .args(&args)
                .env("RUST_BACKTRACE", "1")
                .output()
                .unwrap();
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{name}: {stderr}");
            assert!(
                stderr.contains(path.to_str().unwrap()),
                "{name}: file not named: {stderr}"
            );
            for want in &wants {
                assert!(stderr.contains(want), "{name}: `{want}` not in: {stderr}");
            }
            assert!(
                !stderr.contains("panicked") && !stderr.contains("backtrace"),
                "{name}: {stderr}"
            );
            assert_eq!(
                stderr.trim().lines().count(),
                1,
                "{name}: one line: {stderr}"
            );
        }
    }
    let out = tokenmeter()
        .args(["check", "--config", "/nonexistent.yaml"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent.yaml"));
}

/// Started without a config file, the binary serves on its defaults unless flags override them,
/// answers /healthz, and on SIGTERM drains and exits 0.
#[test]
fn runs_on_flags_and_stops_cleanly_on_sigterm() {
    let mut child = Reaped(
        tokenmeter()
            .args([
                "--listen",
                "127.0.0.1:0",
                "--admin",
                "127.0.0.1:0",
                "--upstream",
                "http://127.0.0.1:9",
            ])
            .env("RUST_LOG", "info")
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut lines = BufReader::new(child.0.stderr.take().unwrap()).lines();
    let serving = lines
        .by_ref()
        .map(|l| l.unwrap())
        .find(|l| l.contains("tokenmeter is serving"))
        .expect("a startup line");
    let admin = serving
        .split("admin=")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .expect("admin address in the startup line")
        .to_string();
    assert!(serving.contains("upstream=http://127.0.0.1:9"), "{serving}");
    // The live view's address, to open in a browser.
    assert!(
        serving.contains(&format!("live_view=http://{admin}/")),
        "{serving}"
    );
    let health = Command::new("curl")
        .args(["-sS", "--max-time", "5", &format!("http://{admin}/healthz")])
        .output()
        .expect("curl");
    assert_eq!(String::from_utf8_lossy(&health.stdout), "ok\n");

    let status = Command::new("kill")
        .args(["-TERM", &child.0.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let pid = child.0.id();
    let mut waited = child;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(waited.0.wait());
    });
    let exit = match rx.recv_timeout(Duration::from_secs(10)) {
        Ok(exit) => exit.unwrap(),
        Err(_) => {
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
            panic!("did not exit within 10 s of SIGTERM");
        }
    };
    assert_eq!(exit.code(), Some(0));
    let rest: Vec<String> = lines.map(|l| l.unwrap()).collect();
    assert!(rest.iter().any(|l| l.contains("drained")), "{rest:?}");
}

/// `access_log: {path: "-", format: csv}` writes a header and one row per request to stdout,
/// with the columns of the contract, from the binary run with a config file.
#[tokio::test(flavor = "multi_thread")]
async fn csv_records_go_to_stdout() {
    use common::*;
    let upstream = upstream(|_| {
        Script::stream(
            "text/event-stream",
            vec![
                role_chunk(),
                chat_chunk("hi"),
                finish_chunk("length", Some(1)),
                done(),
            ],
        )
    })
    .await;
    let dir = TempDir::new();
    let config = dir.path().join("tm.yaml");
    std::fs::write(
        &config,
        format!(
            "listen: 127.0.0.1:0\nadmin: 127.0.0.1:0\nupstream: http://{}\naccess_log: {{path: \"-\", format: csv}}\n",
            upstream.addr
        ),
    )
    .unwrap();
    let mut child = Reaped(
        tokenmeter()
            .args(["--config", config.to_str().unwrap()])
            .env("RUST_LOG", "info")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let stderr = child.0.stderr.take().unwrap();
    let listen = tokio::task::spawn_blocking(move || {
        let line = BufReader::new(stderr)
            .lines()
            .map(|l| l.unwrap())
            .find(|l| l.contains("tokenmeter is serving"))
            .unwrap();
        line.split("listen=")
            .nth(1)
            .unwrap()
            .split_whitespace()
            .next()
            .unwrap()
            .to_string()
    })
    .await
    .unwrap();
    let got = send(
        &format!("http://{listen}/v1/chat/completions"),
        "POST",
        &chat_request("tiny"),
        &[("x-request-id", "abc,1")],
        false,
    )
    .await;
    assert_eq!(got.status, 200);
    let stdout = child.0.stdout.take().unwrap();
    let rows = tokio::task::spawn_blocking(move || {
        let mut reader = csv::Reader::from_reader(BufReader::new(stdout));
        let header = reader.headers().unwrap().clone();
        let row = reader.records().next().unwrap().unwrap();
        (header, row)
    });
    let (header, row) = tokio::time::timeout(Duration::from_secs(10), rows)
        .await
        .unwrap()
        .unwrap();
    let columns: Vec<&str> = header.iter().collect();
    assert_eq!(
        columns[..5],
        ["ts", "request_id", "route", "model", "method"]
    );
    assert_eq!(
        columns.len(),
        49,
        "the contract's columns, pod, namespace and deployment last"
    );
    let field = |name: &str| {
        row.get(columns.iter().position(|c| *c == name).unwrap())
            .unwrap()
            .to_string()
    };
    assert_eq!(field("request_id"), "abc,1");
    assert_eq!(field("model"), "tiny");
    assert_eq!(field("outcome"), "ok");
    assert_eq!(field("finish_reason"), "length");
    assert_eq!(field("output_tokens"), "1");
    assert_eq!(
        field("tpot_ms"),
        "",
        "undefined for one token: empty in CSV"
    );
    assert!(field("ttft_ms").parse::<f64>().unwrap() > 0.0);
}

/// logrotate moves the record file away and sends SIGHUP: the next record must go to a fresh
/// file at the configured path, not into the moved one.
#[tokio::test(flavor = "multi_thread")]
async fn sighup_reopens_the_record_file_for_logrotate() {
    use common::*;
    let upstream = upstream(|_| {
        Script::stream(
            "text/event-stream",
            vec![chat_chunk("hi"), finish_chunk("stop", Some(1)), done()],
        )
    })
    .await;
    let dir = TempDir::new();
    let (config, records) = (dir.path().join("tm.yaml"), dir.path().join("records.jsonl"));
    std::fs::write(
        &config,
        format!(
            "listen: 127.0.0.1:0\nadmin: 127.0.0.1:0\nupstream: http://{}\naccess_log: {{path: {}}}\n",
            upstream.addr,
            records.display()
        ),
    )
    .unwrap();
    let mut child = Reaped(
        tokenmeter()
            .args(["--config", config.to_str().unwrap()])
            .env("RUST_LOG", "info")
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let (tx, mut lines) = tokio::sync::mpsc::unbounded_channel();
    let stderr = child.0.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let _ = tx.send(line.unwrap());
        }
    });
    let listen = loop {
        let line = lines.recv().await.expect("a startup line");
        if let Some(rest) = line.split("listen=").nth(1) {
            break rest.split_whitespace().next().unwrap().to_string();
        }
    };
    let url = format!("http://{listen}/v1/chat/completions");
    send(&url, "POST", &chat_request("before"), &[], false).await;
    wait_for_records(&records, 1).await;
    let rotated = dir.path().join("records.jsonl.1");
    std::fs::rename(&records, &rotated).unwrap();
    let hup = Command::new("kill")
        .args(["-HUP", &child.0.id().to_string()])
        .status()
        .unwrap();
    assert!(hup.success());
    // The reopen is done once the process has logged the SIGHUP and the reload that follows.
    while !lines
        .recv()
        .await
        .expect("the SIGHUP log line")
        .contains("SIGHUP")
    {}
    send(&url, "POST", &chat_request("after"), &[], false).await;
    let fresh = wait_for_records(&records, 1).await;
    assert_eq!(fresh.len(), 1);
    assert_eq!(fresh[0]["model"], "after");
    let old = wait_for_records(&rotated, 1).await;
    assert_eq!(old.len(), 1);
    assert_eq!(old[0]["model"], "before");
}

/// Every subcommand's `--help` ends with examples to paste; the list of subcommands is read from
/// the top-level help, so a new one without examples fails here.
#[test]
fn every_subcommand_help_has_examples() {
    let top = tokenmeter().arg("--help").output().unwrap();
    let top = String::from_utf8_lossy(&top.stdout).into_owned();
    assert!(top.contains("Examples:"), "{top}");
    let commands: Vec<&str> = top
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .collect();
    for expected in ["check", "sim", "bench", "rules", "demo", "inject", "report"] {
        assert!(commands.contains(&expected), "{expected} in {commands:?}");
    }
    for command in commands {
        let out = tokenmeter().args([command, "--help"]).output().unwrap();
        assert!(out.status.success(), "{command} --help");
        let help = String::from_utf8_lossy(&out.stdout);
        let examples = help
            .split_once("Examples:")
            .map(|(_, after)| after)
            .unwrap_or_else(|| panic!("{command} --help has no examples:\n{help}"));
        assert!(
            examples.contains(&format!("tokenmeter {command}")),
            "{command}'s examples run it:\n{help}"
        );
    }
}

fn check(args: &[&str]) -> (Option<i32>, String, String) {
    let out = tokenmeter().arg("check").args(args).output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `check FILE` and `check --config FILE` are the same check; giving both is refused (which
/// one would count?), and so is giving neither.
#[test]
fn check_takes_the_file_as_an_argument_or_with_config() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/config/tokenmeter.yaml");
    let positional = check(&[path]);
    assert_eq!(positional.0, Some(0), "{}", positional.2);
    assert_eq!(positional, check(&["--config", path]));

    let (code, _, stderr) = check(&[path, "--config", path]);
    assert_eq!(code, Some(2));
    assert!(stderr.contains("cannot be used with"), "{stderr}");
    let (code, _, stderr) = check(&[]);
    assert_eq!(code, Some(2));
    assert!(stderr.contains("<FILE>"), "{stderr}");
}

/// What `check` prints is what the proxy will judge: every route in match order with its
/// thresholds and objective, and the default route's, so a wrong unit shows before it serves.
#[test]
fn check_prints_the_slos_it_parsed() {
    let dir = TempDir::new();
    let path = dir.path().join("slos.yaml");
    std::fs::write(
        &path,
        "routes:\n\
         \x20 - name: chat\n\
         \x20   match: {path_prefix: /v1/chat/, methods: [POST]}\n\
         \x20   slo: {ttft: 300ms, tpot: 40ms, e2e: 8s, objective: 0.99}\n\
         \x20 - name: batch\n\
         \x20   match: {path: /v1/completions}\n\
         \x20   slo: {e2e: 1m, max_itl: 2s, objective: 0.999}\n",
    )
    .unwrap();
    let (code, stdout, stderr) = check(&[path.to_str().unwrap()]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stderr.is_empty(), "nothing to warn about: {stderr}");
    let lines: Vec<&str> = stdout.lines().map(str::trim).collect();
    let after = |name: &str| {
        let at = lines.iter().position(|l| l.starts_with(name)).unwrap();
        (lines[at], lines[at + 1])
    };
    let (chat, chat_slo) = after("chat ");
    assert!(
        chat.contains("path_prefix /v1/chat/, methods POST"),
        "{stdout}"
    );
    assert_eq!(
        chat_slo,
        "SLO TTFT <= 300ms, TPOT <= 40ms, E2E <= 8s, objective 99 %"
    );
    assert_eq!(
        after("batch ").1,
        "SLO E2E <= 1m, max ITL <= 2s, objective 99.9 %"
    );
    assert_eq!(after("default ").1, "no SLO: measured, never judged");
    // Match order: chat before batch before the default.
    let order: Vec<usize> = ["chat ", "batch ", "default "]
        .iter()
        .map(|n| lines.iter().position(|l| l.starts_with(n)).unwrap())
        .collect();
    assert!(order.windows(2).all(|w| w[0] < w[1]), "{stdout}");
}

/// Two valid mistakes are warned about on stderr, the file still valid (exit 0): a route that
/// an earlier route makes unreachable, and thresholds without an objective (no alerts). Routes
/// whose overlap is only partial are not warned about.
#[test]
fn check_warns_about_unreachable_routes_and_missing_objectives() {
    let dir = TempDir::new();
    let path = dir.path().join("mistakes.yaml");
    std::fs::write(
        &path,
        "routes:\n\
         \x20 - name: chat\n\
         \x20   match: {path_prefix: /v1/chat/}\n\
         \x20   slo: {ttft: 300ms, objective: 0.99}\n\
         \x20 - name: gold\n\
         \x20   match: {path_prefix: /v1/chat/completions, headers: {x-tier: gold}}\n\
         \x20   slo: {ttft: 200ms, objective: 0.999}\n\
         \x20 - name: post-only\n\
         \x20   match: {path_prefix: /v1/, methods: [POST]}\n\
         \x20   slo: {e2e: 30s}\n\
         \x20 - name: completions\n\
         \x20   match: {path: /v1/completions}\n\
         \x20   slo: {e2e: 60s, objective: 0.95}\n\
         \x20 - name: everything\n\
         \x20   slo: {e2e: 60s, objective: 0.9}\n\
         \x20 - name: default\n\
         \x20   slo: {e2e: 30s, objective: 0.9}\n",
    )
    .unwrap();
    let (code, stdout, stderr) = check(&[path.to_str().unwrap()]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stdout.contains("ok"), "{stdout}");
    let warnings: Vec<&str> = stderr.lines().collect();
    let about = |route: &str| -> Vec<&str> {
        warnings
            .iter()
            .copied()
            .filter(|w| w.contains(&format!("`{route}` ")))
            .collect()
    };
    assert!(
        warnings
            .iter()
            .all(|w| w.starts_with("tokenmeter: warning: ") && w.contains("mistakes.yaml")),
        "{stderr}"
    );
    let gold = about("gold");
    assert!(
        gold.iter()
            .any(|w| w.contains("routes[1] `gold` never gets a request: routes[0] `chat`")),
        "{stderr}"
    );
    assert!(
        about("post-only")
            .iter()
            .any(|w| w.contains("no objective, so it gets no alerts")),
        "{stderr}"
    );
    // A POST-only prefix route does not cover an exact path that takes every method.
    assert!(
        !stderr.contains("routes[3] `completions` never"),
        "{stderr}"
    );
    assert!(
        stderr.contains("routes[5] `default` never gets a request: routes[4] `everything`"),
        "{stderr}"
    );
    assert_eq!(warnings.len(), 3, "{stderr}");
}
