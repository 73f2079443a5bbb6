//! `tokenmeter demo` as a newcomer runs it: the sim, the proxy and a sweep in one process,
//! a table row per level, the saturation verdict, the proxy's own verdict and the files.

use std::process::Command;

mod common;

use common::TempDir;

/// A short demo must run to the end on its own, print every level, and leave behind CSVs that
/// agree with each other: every request bench sent went through tokenmeter and was recorded.
#[test]
fn a_short_demo_prints_every_level_and_leaves_matching_csvs() {
    let dir = TempDir::new();
    let out = Command::new(env!("CARGO_BIN_EXE_tokenmeter"))
        .args([
            "demo",
            "--duration",
            "6s",
            "--levels",
            "1,2,4",
            "--max-batch",
            "2",
        ])
        .args(["--admin", "127.0.0.1:0", "--out"])
        .arg(dir.path())
        .output()
        .expect("the binary runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "demo failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // One row per level, in order, each starting with the level's number of users.
    let rows: Vec<u32> = stdout
        .lines()
        .filter(|l| l.contains(" | "))
        .filter_map(|l| l.split_whitespace().next()?.parse().ok())
        .collect();
    assert_eq!(rows, vec![1, 2, 4], "{stdout}");
    assert!(stdout.contains("Saturation:"), "{stdout}");
    assert!(stdout.contains("live view   http://127.0.0.1:"), "{stdout}");

    // bench's CSV has a header and a row per request; the proxy's has the same number of rows.
    let bench = std::fs::read_to_string(dir.path().join("bench.csv")).expect("bench.csv");
    let proxy = std::fs::read_to_string(dir.path().join("proxy-records.csv")).expect("records");
    let sent = bench.lines().count() - 1;
    assert!(sent >= 3, "at least one request per level:\n{bench}");
    assert_eq!(proxy.lines().count() - 1, sent, "{proxy}");
    let summary = format!("of {sent} requests meet the SLO; tokenmeter");
    assert!(stdout.contains(&summary), "{stdout}");
    assert!(stdout.contains("it refreshes every second"), "{stdout}");

    // "Next:" gives the report command over the files just written; as printed, it must work
    // and write the HTML page.
    let next = stdout
        .lines()
        .skip_while(|l| !l.starts_with("Next:"))
        .nth(1)
        .expect("a command under Next:")
        .trim();
    let words: Vec<&str> = next.split_whitespace().collect();
    assert_eq!(words[..2], ["tokenmeter", "report"], "{next}");
    assert!(next.contains("proxy-records.csv"), "{next}");
    let html = dir.path().join("report.html");
    assert!(
        words.contains(&"--html") && next.ends_with(&*html.to_string_lossy()),
        "{next}"
    );
    let report = Command::new(env!("CARGO_BIN_EXE_tokenmeter"))
        .args(&words[1..])
        .output()
        .expect("the binary runs");
    assert!(
        report.status.success(),
        "{next}\n{}",
        String::from_utf8_lossy(&report.stderr)
    );
    let page = std::fs::read_to_string(&html).expect("the report page");
    assert!(page.contains("<svg") && page.contains("chat"), "{page}");
}

#[test]
fn an_empty_level_list_is_a_clear_error() {
    let out = Command::new(env!("CARGO_BIN_EXE_tokenmeter"))
        .args(["demo", "--levels", ""])
        .output()
        .expect("the binary runs");
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.lines().count() >= 1 && !stderr.contains("panicked"),
        "{stderr}"
    );
}
