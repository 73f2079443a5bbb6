//! How fast `tokenmeter report` reads records, and how much memory it takes, as the records grow:
//! `cargo bench --bench report`.
//!
//! It writes 10^6 per-request records (JSON lines with every field a proxy of this version
//! writes: three deployments of eight pods, three routes, two models, concurrency from 1 to 64,
//! one request in fifty failed) into `target/bench-report/` at run time (never committed; the file
//! is reused when it is already there), then runs the release binary's `report` over it, and
//! over the same file given ten times (10^7 records, as ten pods' files are merged: the disk
//! holds one), and prints records/s and the peak resident memory (VmHWM of the report's own
//! process, read from `/proc/PID/status` every 5 ms while it runs; the high-water mark only
//! rises, so the last reading is the peak unless the peak came in the last 5 ms).
//!
//! Knobs, all optional: `--quick` or `TOKENMETER_BENCH_QUICK=1` (10^5 and 10^6 records),
//! `TOKENMETER_REPORT_BENCH_RECORDS=N` (the file's records), `TOKENMETER_REPORT_BENCH_TIMES=K`
//! (the larger run reads it K times), `TOKENMETER_BENCH_BINARY=PATH` (another build), and
//! `TOKENMETER_REPORT_BASELINE=PATH` (a second binary measured beside it over the single file,
//! e.g. an older release that held every record, which over the larger run would need ten times
//! its memory).

#[allow(dead_code)]
#[path = "overhead/procfs.rs"]
mod procfs;
#[path = "overhead/shipping.rs"]
mod shipping;

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::Duration;

// The project's clock (clippy.toml); outside a runtime it reads the monotonic clock.
use tokio::time::Instant;

/// One record as the proxy writes it (every field, in the proxy's order).
fn record(out: &mut impl Write, i: u64, rng: &mut fastrand::Rng) -> std::io::Result<()> {
    let deployment = ["chat", "code", "embed"][(i % 3) as usize];
    let pod = format!("{deployment}-7d9f8c6b5-{:05}", rng.u32(0..8));
    let route = ["chat", "code", "batch"][rng.usize(0..3)];
    let model = ["llama-3.1-8b", "qwen2.5-32b"][rng.usize(0..2)];
    let in_flight = rng.u64(1..=64);
    let queued = in_flight.saturating_sub(16) as f64 * 35.0;
    let ttft = 45.0 + rng.f64() * 80.0 + queued;
    let output = rng.u64(1..=800);
    let tpot = 12.0 + rng.f64() * 25.0;
    let e2e = ttft + tpot * output as f64;
    let failed = i % 50 == 0;
    let (status, outcome, slo, reason) = match (failed, ttft > 900.0) {
        (true, _) => (502, "error", "violated", "\"upstream_reset\""),
        (false, true) => (200, "ok", "violated", "null"),
        (false, false) => (200, "ok", "good", "null"),
    };
    let ms = 1_772_359_200_000 + i * 86_400_000 / 1_000_000;
    let ts = humantime::format_rfc3339_millis(std::time::UNIX_EPOCH + Duration::from_millis(ms));
    let prompt = rng.u64(20..=6000);
    writeln!(
        out,
        "{{\"ts\":\"{ts}\",\"request_id\":\"req-{i:010}\",\"route\":\"{route}\",\"model\":\"{model}\",\
         \"method\":\"POST\",\"path\":\"/v1/chat/completions\",\"status\":{status},\
         \"outcome\":\"{outcome}\",\"slo\":\"{slo}\",\"violated\":{violated},\"finish_reason\":\"stop\",\
         \"prompt_tokens\":{prompt},\"output_tokens\":{output},\"token_source\":\"usage\",\
         \"events\":{events},\"ttfb_ms\":{ttfb:.3},\"ttft_ms\":{ttft:.3},\"ttfc_ms\":{ttft:.3},\
         \"tpot_ms\":{tpot:.3},\"max_itl_ms\":{itl:.3},\"e2e_ms\":{e2e:.3},\"in_flight\":{in_flight},\
         \"bytes\":{bytes},\"in_flight_total\":{total},\"reason\":{reason},\"read\":\"parsed\",\
         \"retries\":0,\"upstream_conn\":\"reused\",\"connect_ms\":null,\"proxy_ms\":{proxy:.3},\
         \"cached_tokens\":{cached},\"engine_prefill_ms\":{prefill:.3},\"engine_load_ms\":0.4,\
         \"queue_ms\":{queued:.3},\"queue_source\":\"derived\",\"engine_running\":{running},\
         \"engine_waiting\":{waiting},\"engine_kv_usage\":0.42,\"pod\":\"{pod}\",\
         \"namespace\":\"inference\",\"deployment\":\"{deployment}\"}}",
        violated = if slo == "violated" { "[\"ttft\"]" } else { "[]" },
        events = output + 2,
        ttfb = ttft - 2.0,
        itl = tpot * (1.5 + rng.f64() * 3.0),
        bytes = output * 180,
        total = in_flight * 3,
        proxy = 0.2 + rng.f64() * 0.3,
        cached = prompt / 3,
        prefill = ttft - queued - 10.0,
        running = in_flight.min(16),
        waiting = in_flight.saturating_sub(16),
    )
}

/// The records file, written once and kept for the next run.
fn records_file(dir: &Path, records: u64) -> Result<PathBuf, String> {
    let path = dir.join(format!("records-{records}.jsonl"));
    if path.exists() {
        return Ok(path);
    }
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let partial = dir.join(format!("records-{records}.jsonl.partial"));
    let started = Instant::now();
    eprintln!("bench: writing {records} records to {}", path.display());
    let write = || -> std::io::Result<()> {
        let mut out = BufWriter::with_capacity(1 << 20, File::create(&partial)?);
        let mut rng = fastrand::Rng::with_seed(38);
        for i in 0..records {
            record(&mut out, i, &mut rng)?;
        }
        out.flush()
    };
    write().map_err(|e| format!("{}: {e}", partial.display()))?;
    std::fs::rename(&partial, &path).map_err(|e| format!("{}: {e}", path.display()))?;
    eprintln!("bench: written in {:.1} s", started.elapsed().as_secs_f64());
    Ok(path)
}

struct Run {
    records: u64,
    seconds: f64,
    peak_kib: Option<u64>,
}

/// Runs `binary report` over `files`, its JSON to a sink, watching its VmHWM.
fn run(binary: &Path, files: &[&Path], records: u64) -> Result<Run, String> {
    let started = Instant::now();
    let mut child = Command::new(binary)
        .arg("report")
        .args(files)
        .args(["--format", "json"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", binary.display()))?;
    let mut peak = None;
    let deadline = started + Duration::from_secs(3600);
    let status = loop {
        if let Some(kib) = procfs::status_kib(child.id(), "VmHWM:") {
            peak = Some(peak.map_or(kib, |p: u64| p.max(kib)));
        }
        if let Some(status) = child.try_wait().map_err(|e| e.to_string())? {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err("report did not finish within an hour".into());
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let seconds = started.elapsed().as_secs_f64();
    if !status.success() {
        let mut err = String::new();
        if let Some(mut pipe) = child.stderr.take() {
            let _ = std::io::Read::read_to_string(&mut pipe, &mut err);
        }
        return Err(format!("report failed ({status}): {err}"));
    }
    Ok(Run {
        records,
        seconds,
        peak_kib: peak,
    })
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

fn main() -> ExitCode {
    let quick = std::env::args().any(|a| a == "--quick")
        || std::env::var("TOKENMETER_BENCH_QUICK").is_ok_and(|v| v == "1");
    let records = env_u64("TOKENMETER_REPORT_BENCH_RECORDS").unwrap_or(if quick {
        100_000
    } else {
        1_000_000
    });
    let times = env_u64("TOKENMETER_REPORT_BENCH_TIMES")
        .unwrap_or(10)
        .max(1);
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let dir = std::env::var_os("CARGO_TARGET_DIR")
        .map_or_else(|| manifest.join("target"), PathBuf::from)
        .join("bench-report");
    let result = (|| -> Result<(), String> {
        let file = records_file(&dir, records)?;
        let size = std::fs::metadata(&file).map_err(|e| e.to_string())?.len();
        let mut binaries = vec![("this build", shipping::binary()?)];
        if let Some(base) = std::env::var_os("TOKENMETER_REPORT_BASELINE").filter(|p| !p.is_empty())
        {
            binaries.push(("baseline", PathBuf::from(base)));
        }
        println!(
            "tokenmeter report over per-request records ({} bytes a record, JSON lines):\n",
            size / records
        );
        println!("| binary | records | input | wall | records/s | peak RSS (VmHWM) |");
        println!("|---|---:|---:|---:|---:|---:|");
        for (i, (name, binary)) in binaries.iter().enumerate() {
            let many: Vec<&Path> = (0..times).map(|_| file.as_path()).collect();
            let runs = if i == 0 {
                vec![vec![file.as_path()], many]
            } else {
                vec![vec![file.as_path()]]
            };
            for files in runs {
                let n = records * files.len() as u64;
                let r = run(binary, &files, n)?;
                println!(
                    "| {name} | {} | {:.2} GB | {:.2} s | {:.0} | {} |",
                    r.records,
                    (size * files.len() as u64) as f64 / 1e9,
                    r.seconds,
                    r.records as f64 / r.seconds,
                    r.peak_kib
                        .map_or_else(|| "n/a".into(), |k| format!("{:.1} MiB", k as f64 / 1024.0))
                );
            }
        }
        Ok(())
    })();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench report: {e}");
            ExitCode::FAILURE
        }
    }
}
