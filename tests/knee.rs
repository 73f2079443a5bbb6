//! The knee rule on sweeps whose answer is known by construction: the simulator runs at most
//! 8 requests at once and queues the rest, so closed-loop throughput grows up to 8 users and
//! is flat past 8 while TTFT takes the queueing. `bench` must name 8 however the sweep is cut
//! (1, 2, 4, .., 16 or every level from 1 to 12), with the sim's decode contention (TPOT grows
//! with the batch, so throughput grows less than in proportion below 8) and without; it must
//! name nothing for a sweep that never fills the batch; and `report`, reading the records a
//! proxy wrote of the same sweep, must name the same level (issue 38: the report said 4 where
//! its own table bent at 8).
//!
//! Time is paused: the clock moves only to the sim's and bench's timers, so each sweep's figures
//! are exact and the tests take seconds of CPU, not of waiting.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde_json::Value;
use tokenmeter::tools::bench::{self, report, BenchArgs, Load, MaxTokens};
use tokenmeter::tools::sim::{self, RunningSim, SimConfig};

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// Requests per level: five rounds of a full batch, and above the rule's minimum sample.
const REQUESTS: u32 = 40;

/// The simulator with its default timings (8 at once), with or without decode contention.
async fn sim(contention: bool) -> std::io::Result<RunningSim> {
    let mut config = SimConfig {
        listen: "127.0.0.1:0".parse().expect("a literal address"),
        ..SimConfig::default()
    };
    assert_eq!(config.max_batch, 8, "the truth these tests know");
    if !contention {
        config.decode_step_per_request = Duration::ZERO;
    }
    sim::start(config).await
}

fn args(url: &str, levels: &[u32], max_tokens: MaxTokens) -> BenchArgs {
    let mut args = BenchArgs::new(url).expect("a valid URL");
    args.concurrency = levels.to_vec();
    args.requests = REQUESTS;
    args.prompt_tokens = 16;
    args.max_tokens = max_tokens;
    args.timeout = Duration::from_secs(60);
    args
}

/// The knee bench names for `levels`, with the per-level tokens/s for the failure message.
async fn bench_knee(url: &str, levels: &[u32], max_tokens: MaxTokens) -> (Option<Load>, String) {
    let sweep = bench::run_with(&args(url, levels, max_tokens), &bench::progress::Silent).await;
    for level in &sweep.levels {
        assert_eq!(level.errors, 0, "{}: {:?}", level.load, level.records);
    }
    let shown: Vec<String> = sweep
        .levels
        .iter()
        .map(|l| {
            format!(
                "{}: {:.0} tok/s, p99 TTFT {:.1} ms",
                l.load.value(),
                l.output_tokens_per_s,
                l.ttft.p99.unwrap_or(f64::NAN)
            )
        })
        .collect();
    let found = report::knee(&sweep.levels).map(|k| k.load);
    (found, shown.join("; "))
}

async fn names(contention: bool, levels: &[u32], expected: Option<u32>) -> TestResult {
    let sim = sim(contention).await?;
    let (found, table) = bench_knee(
        &format!("http://{}", sim.addr),
        levels,
        MaxTokens::Fixed(16),
    )
    .await;
    assert_eq!(
        found,
        expected.map(Load::Concurrency),
        "levels {levels:?}, contention {contention}: {table}"
    );
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn powers_and_steps_name_the_batch_size_with_contention() -> TestResult {
    names(true, &[1, 2, 4, 6, 8, 10, 12, 16], Some(8)).await
}

#[tokio::test(start_paused = true)]
async fn powers_and_steps_name_the_batch_size_without_contention() -> TestResult {
    names(false, &[1, 2, 4, 6, 8, 10, 12, 16], Some(8)).await
}

#[tokio::test(start_paused = true)]
async fn every_level_to_12_names_the_batch_size_with_contention() -> TestResult {
    names(true, &(1..=12).collect::<Vec<_>>(), Some(8)).await
}

#[tokio::test(start_paused = true)]
async fn every_level_to_12_names_the_batch_size_without_contention() -> TestResult {
    names(false, &(1..=12).collect::<Vec<_>>(), Some(8)).await
}

#[tokio::test(start_paused = true)]
async fn a_sweep_under_the_batch_size_names_none() -> TestResult {
    names(true, &[1, 2, 3, 4, 5, 6, 7, 8], None).await?;
    names(false, &[1, 2, 4, 6, 8], None).await
}

/// The proxy's records of a sweep, as `report --format json` reads them.
fn report_json(records: &Path) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_tokenmeter"))
        .args(["report", "--format", "json"])
        .arg(records)
        .output()
        .expect("tokenmeter runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("the report is JSON")
}

/// Waits until the proxy's record writer (a thread of its own) has written `n` lines.
fn records_written(path: &Path, n: usize) -> usize {
    let mut lines = 0;
    for _ in 0..1000 {
        lines = std::fs::read_to_string(path)
            .map(|t| t.lines().count())
            .unwrap_or(0);
        if lines >= n {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    lines
}

/// The report groups records by requests in flight at arrival, not by bench level. In a closed
/// loop at concurrency c every request but the level's first c arrives with c in flight (the
/// one that just ended has left the count when its successor arrives), so level c's records
/// land in the report's level c; the first c of each level are spread over 1..c, a few
/// requests per count that stay under the minimum sample and are not judged. Both measure
/// throughput differently (bench: tokens over the level's wall time; report: Little's law,
/// in flight × tokens ÷ E2E), but both are flat past the batch size and proportional below it.
async fn report_agrees(contention: bool, levels: &[u32]) -> TestResult {
    let sim = sim(contention).await?;
    let proxy = common::proxy(sim.addr, |_| {}).await;
    let (found, table) = bench_knee(
        &proxy.url("/v1/chat/completions"),
        levels,
        MaxTokens::Uniform(8, 24),
    )
    .await;
    assert_eq!(found, Some(Load::Concurrency(8)), "bench: {table}");

    let sent = levels.len() * REQUESTS as usize;
    let written = records_written(&proxy.records, sent);
    assert_eq!(written, sent, "one record per request");
    let r = report_json(&proxy.records);
    let bend = &r["groups"][0]["bend"];
    assert_eq!(bend["knee"]["concurrency"], "8", "report: {bend}");
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn report_names_the_level_bench_names_with_contention() -> TestResult {
    report_agrees(true, &[1, 2, 4, 6, 8, 10, 12, 16]).await
}

#[tokio::test(start_paused = true)]
async fn report_names_the_level_bench_names_without_contention() -> TestResult {
    report_agrees(false, &(1..=12).collect::<Vec<_>>()).await
}
