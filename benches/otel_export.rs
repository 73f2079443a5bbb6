//! What OpenTelemetry export costs per finished request: tokenmeter's own exporter
//! (`src/publish/otel/`) against the official SDK (`opentelemetry_sdk` with
//! `opentelemetry-otlp`) doing the same work: GenAI metrics every second, cumulative, base-2
//! exponential histograms, and every request's span kept (always_on) and exported over
//! OTLP/HTTP protobuf.
//!
//! `cargo bench --bench otel_export` (options after `--`: `--n N` requests per run, default
//! 20,000; `--rounds R`, default 3; `--rates 2000,10000,0` requests per second, 0 for as fast as
//! the calling thread goes). Each run is a fresh child process (this binary again, `--child`), so
//! the pipelines share no state, allocator or threads; the runs alternate pipelines in each
//! round. A third pipeline, `off`, runs the same loop and sends nothing: what the loop itself
//! costs, subtracted in the table's "over off" columns. Both pipelines export to one OTLP/HTTP
//! sink in the parent process (`common/otlp_sink.rs`), which decodes every body and discards it;
//! its CPU time is not charged to the pipelines.
//!
//! Per run the child reports: CPU of the calling thread (the request path: what
//! `/proc/thread-self/schedstat` counts while it feeds the requests); CPU of the whole process
//! from the first request until both pipelines' own timers have exported everything (6.5 s
//! after the last request: the 5 s span schedule delay and a metrics export), summed over the
//! threads' own accounts (`/proc/self/task/*/schedstat`, nanoseconds, every thread alive); the
//! same through the pipeline's stop, from `/proc/self/stat` (10 ms ticks, exited threads
//! included) as a cross-check; peak RSS (`VmHWM`); and the exporter's own counts where it has
//! them. The sink counts the spans delivered.

#[path = "otel_export/sdk.rs"]
mod sdk;
#[path = "common/otlp_sink.rs"]
mod sink;

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::process::{Command, ExitCode};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use tokenmeter::otel_bench::{BenchExporter, BenchRequest};
use tokenmeter::Dialect;

/// After the last request, how long the pipelines are left to export on their own timers
/// before the process is read: the 5 s schedule delay of spans, and a metrics export.
const SETTLE: Duration = Duration::from_millis(6500);
/// Distinct synthetic requests; a run cycles through them.
const TEMPLATES: usize = 1000;
const PIPELINES: [&str; 3] = ["off", "tokenmeter", "sdk"];

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--child") {
        return match child(&args[i + 1..]) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("otel_export child: {e}");
                ExitCode::FAILURE
            }
        };
    }
    match parent(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("otel_export: {e}");
            ExitCode::FAILURE
        }
    }
}

fn option<T: std::str::FromStr>(args: &[String], name: &str) -> Option<T> {
    let i = args.iter().position(|a| a == name)?;
    args.get(i + 1)?.parse().ok()
}

/// One child's figures.
#[derive(Debug, Clone, Default)]
struct Run {
    pipeline: String,
    rate: u64,
    n: u64,
    /// Calling thread CPU over the loop, ns.
    calling_ns: u64,
    /// Process CPU from the first request until the pipelines' timers exported everything, every
    /// thread's own account, ns.
    process_ns: u64,
    /// Process CPU from the first request until the pipeline stopped, ns (tick resolution).
    ticks_ns: u64,
    /// No thread exited during the `process_ns` window.
    same_threads: bool,
    wall_ms: u64,
    hwm_kib: u64,
    /// Spans the exporter counted as dropped (tokenmeter only: the SDK has no such count).
    dropped: Option<u64>,
    /// Finished requests dropped before aggregation (tokenmeter only).
    dropped_requests: Option<u64>,
    closed_in_time: bool,
    /// What the sink decoded during the run.
    delivered: u64,
    trace_exports: u64,
    metric_exports: u64,
    bytes: u64,
    span_attributes: u64,
    span_events: u64,
    rejected: u64,
}

fn parent(args: &[String]) -> Result<(), String> {
    let n: u64 = option(args, "--n").unwrap_or(20_000);
    let rounds: usize = option(args, "--rounds").unwrap_or(3);
    let rates: Vec<u64> = option::<String>(args, "--rates")
        .unwrap_or_else(|| "2000,10000,0".into())
        .split(',')
        .map(|r| r.trim().parse().map_err(|_| format!("bad rate `{r}`")))
        .collect::<Result<_, _>>()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let sink::Sink { addr, tally } = runtime.block_on(sink::start())?;
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    eprintln!(
        "otel_export: {n} requests per run, {rounds} rounds, rates {rates:?} (0: as fast as possible), sink {addr}"
    );
    let mut runs: Vec<Run> = Vec::new();
    let mut shapes: Vec<(String, String)> = Vec::new();
    for &rate in &rates {
        for round in 0..rounds {
            // Alternate the order so that neither pipeline always runs first or last.
            let mut order = PIPELINES.to_vec();
            if round % 2 == 1 {
                order.reverse();
            }
            for pipeline in order {
                let before = snapshot(&tally);
                let output = Command::new(&exe)
                    .args([
                        "--child",
                        pipeline,
                        &rate.to_string(),
                        &n.to_string(),
                        &addr.to_string(),
                    ])
                    .output()
                    .map_err(|e| format!("cannot run a child: {e}"))?;
                if !output.status.success() {
                    return Err(format!(
                        "the {pipeline} child failed: {}",
                        String::from_utf8_lossy(&output.stderr)
                    ));
                }
                // Every export was answered before the child stopped; a moment for the
                // sink's last decode to be counted.
                std::thread::sleep(Duration::from_millis(200));
                let after = snapshot(&tally);
                let stdout = String::from_utf8_lossy(&output.stdout);
                let mut run = parse_run(&stdout)?;
                run.delivered = after[0] - before[0];
                run.trace_exports = after[1] - before[1];
                run.metric_exports = after[2] - before[2];
                run.bytes = after[3] - before[3];
                run.span_attributes = after[4] - before[4];
                run.span_events = after[5] - before[5];
                run.rejected = after[6] - before[6];
                eprintln!(
                    "  rate {rate:>5} round {} {pipeline:<10} calling {:>6.2} µs/req, process {:>6.2} µs/req, spans {}/{}, RSS {:.1} MiB",
                    round + 1,
                    run.calling_ns as f64 / run.n as f64 / 1e3,
                    run.process_ns as f64 / run.n as f64 / 1e3,
                    run.delivered,
                    run.n,
                    run.hwm_kib as f64 / 1024.0,
                );
                if pipeline != "off" && !shapes.iter().any(|(p, _)| p == pipeline) {
                    let shape = tally
                        .last_metrics
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .iter()
                        .map(|(name, (kind, points))| format!("{name} {kind} ×{points}"))
                        .collect::<Vec<_>>()
                        .join("; ");
                    shapes.push((pipeline.to_string(), shape));
                }
                runs.push(run);
            }
        }
    }
    print!("{}", report(&runs, &rates, rounds, &shapes));
    Ok(())
}

fn snapshot(t: &sink::Tally) -> [u64; 7] {
    [
        t.spans.load(Ordering::Relaxed),
        t.trace_exports.load(Ordering::Relaxed),
        t.metric_exports.load(Ordering::Relaxed),
        t.bytes.load(Ordering::Relaxed),
        t.span_attributes.load(Ordering::Relaxed),
        t.span_events.load(Ordering::Relaxed),
        t.rejected.load(Ordering::Relaxed),
    ]
}

fn parse_run(stdout: &str) -> Result<Run, String> {
    let line = stdout
        .lines()
        .find_map(|l| l.strip_prefix("RESULT "))
        .ok_or_else(|| format!("no RESULT line in the child's output: {stdout}"))?;
    let mut run = Run::default();
    for pair in line.split_whitespace() {
        let (k, v) = pair.split_once('=').ok_or("a bad RESULT field")?;
        let num = || v.parse::<u64>().map_err(|_| format!("bad {k}={v}"));
        match k {
            "pipeline" => run.pipeline = v.to_string(),
            "rate" => run.rate = num()?,
            "n" => run.n = num()?,
            "calling_ns" => run.calling_ns = num()?,
            "process_ns" => run.process_ns = num()?,
            "ticks_ns" => run.ticks_ns = num()?,
            "same_threads" => run.same_threads = v == "true",
            "wall_ms" => run.wall_ms = num()?,
            "hwm_kib" => run.hwm_kib = num()?,
            "dropped" => run.dropped = v.parse().ok(),
            "dropped_requests" => run.dropped_requests = v.parse().ok(),
            "closed" => run.closed_in_time = v == "true",
            _ => {}
        }
    }
    Ok(run)
}

/// Median and range of `values`.
fn stats(mut values: Vec<f64>) -> (f64, f64, f64) {
    values.sort_by(f64::total_cmp);
    let median = if values.is_empty() {
        f64::NAN
    } else {
        values[values.len() / 2]
    };
    (
        median,
        values.first().copied().unwrap_or(f64::NAN),
        values.last().copied().unwrap_or(f64::NAN),
    )
}

fn fmt_stat((median, lo, hi): (f64, f64, f64), digits: usize) -> String {
    format!("{median:.digits$} ({lo:.digits$}–{hi:.digits$})")
}

fn report(runs: &[Run], rates: &[u64], rounds: usize, shapes: &[(String, String)]) -> String {
    let mut out = String::new();
    let n = runs.first().map_or(0, |r| r.n);
    let _ = writeln!(
        out,
        "\n## OTLP export per finished request: tokenmeter's exporter vs the official SDK\n\n\
         {n} requests per run, {rounds} rounds, median (range); µs of CPU per request. \
         \"over off\": minus the same loop sending nothing, round by round.\n"
    );
    for &rate in rates {
        let label = if rate == 0 {
            "as fast as possible".to_string()
        } else {
            format!("paced at {rate}/s")
        };
        let _ = writeln!(out, "### {label}\n");
        let _ = writeln!(
            out,
            "| pipeline | calling thread µs/req | over off | process µs/req | over off | process incl. stop (ticks) over off | spans delivered / sent | dropped, counted: spans; requests | peak RSS MiB | feed s |"
        );
        let _ = writeln!(out, "|---|---|---|---|---|---|---|---|---|---|");
        let of = |p: &str| -> Vec<&Run> {
            runs.iter()
                .filter(|r| r.rate == rate && r.pipeline == p)
                .collect()
        };
        let off = of("off");
        for pipeline in PIPELINES {
            let rs = of(pipeline);
            if rs.is_empty() {
                continue;
            }
            let per = |f: &dyn Fn(&Run) -> u64| -> Vec<f64> {
                rs.iter().map(|r| f(r) as f64 / r.n as f64 / 1e3).collect()
            };
            let over = |f: &dyn Fn(&Run) -> u64| -> Vec<f64> {
                rs.iter()
                    .zip(&off)
                    .map(|(r, o)| (f(r) as f64 - f(o) as f64) / r.n as f64 / 1e3)
                    .collect()
            };
            let calling = per(&|r| r.calling_ns);
            let process = per(&|r| r.process_ns);
            let delivered = stats(rs.iter().map(|r| r.delivered as f64).collect());
            let dropped = match rs[0].dropped {
                Some(_) => format!(
                    "{}; {}",
                    fmt_stat(
                        stats(rs.iter().map(|r| r.dropped.unwrap_or(0) as f64).collect()),
                        0
                    ),
                    fmt_stat(
                        stats(
                            rs.iter()
                                .map(|r| r.dropped_requests.unwrap_or(0) as f64)
                                .collect()
                        ),
                        0
                    ),
                ),
                None if pipeline == "off" => "–".into(),
                None => "no count".into(),
            };
            let rss = stats(rs.iter().map(|r| r.hwm_kib as f64 / 1024.0).collect());
            let wall = stats(rs.iter().map(|r| r.wall_ms as f64 / 1e3).collect());
            let dash = |v: String| if pipeline == "off" { "–".into() } else { v };
            let _ = writeln!(
                out,
                "| {pipeline} | {} | {} | {} | {} | {} | {} / {} | {dropped} | {} | {} |",
                fmt_stat(stats(calling), 2),
                dash(fmt_stat(stats(over(&|r| r.calling_ns)), 2)),
                fmt_stat(stats(process), 2),
                dash(fmt_stat(stats(over(&|r| r.process_ns)), 2)),
                dash(fmt_stat(stats(over(&|r| r.ticks_ns)), 1)),
                fmt_stat(delivered, 0),
                rs[0].n,
                fmt_stat(rss, 1),
                fmt_stat(wall, 2),
            );
        }
        let _ = writeln!(out);
    }
    let _ = writeln!(out, "### What the sink decoded\n");
    for pipeline in ["tokenmeter", "sdk"] {
        let rs: Vec<&Run> = runs.iter().filter(|r| r.pipeline == pipeline).collect();
        let spans: u64 = rs.iter().map(|r| r.delivered).sum();
        let attributes: u64 = rs.iter().map(|r| r.span_attributes).sum();
        let events: u64 = rs.iter().map(|r| r.span_events).sum();
        let bytes: u64 = rs.iter().map(|r| r.bytes).sum();
        let rejected: u64 = rs.iter().map(|r| r.rejected).sum();
        let late = rs.iter().filter(|r| !r.closed_in_time).count();
        let exited = rs.iter().filter(|r| !r.same_threads).count();
        let exports: u64 = rs.iter().map(|r| r.metric_exports).sum();
        let _ = writeln!(
            out,
            "- {pipeline}: {:.2} attributes and {:.2} events per span, {:.0} bytes sent per span delivered (both signals), {rejected} bodies rejected, {late} runs not closed in time, {exited} runs where a thread exited while measured, {exports} metric exports in all; last metrics export: {}",
            attributes as f64 / spans.max(1) as f64,
            events as f64 / spans.max(1) as f64,
            bytes as f64 / spans.max(1) as f64,
            shapes
                .iter()
                .find(|(p, _)| p == pipeline)
                .map_or("none", |(_, s)| s.as_str()),
        );
    }
    out
}

/// A child: one pipeline, one run, its figures on one `RESULT` line.
fn child(args: &[String]) -> Result<(), String> {
    let [pipeline, rate, n, addr, ..] = args else {
        return Err("usage: --child PIPELINE RATE N ADDR".into());
    };
    let rate: u64 = rate.parse().map_err(|_| "bad rate")?;
    let n: u64 = n.parse().map_err(|_| "bad n")?;
    let addr: SocketAddr = addr.parse().map_err(|_| "bad address")?;
    let mut requests = workload(TEMPLATES, 42);
    enum Pipeline {
        Off,
        Own(BenchExporter),
        Sdk(Box<sdk::Sdk>),
    }
    let p = match pipeline.as_str() {
        "off" => Pipeline::Off,
        "tokenmeter" => Pipeline::Own(
            BenchExporter::start(addr, Duration::from_secs(1)).map_err(|e| e.to_string())?,
        ),
        "sdk" => Pipeline::Sdk(Box::new(sdk::Sdk::start(addr)?)),
        other => return Err(format!("unknown pipeline {other}")),
    };
    // Let the pipeline's threads start before the clock does.
    std::thread::sleep(Duration::from_millis(200));
    let ticks0 = process_ticks()?;
    let threads0 = process_threads_ns()?;
    let calling0 = thread_ns()?;
    let wall0 = Instant::now();
    let gap = (rate > 0).then(|| Duration::from_secs_f64(1.0 / rate as f64));
    for i in 0..n {
        if let Some(gap) = gap {
            let due = wall0 + gap * i as u32;
            let now = Instant::now();
            if due > now {
                std::thread::sleep(due - now);
            }
        }
        let r = &mut requests[i as usize % TEMPLATES];
        // A request that finishes now started e2e ago.
        r.start = SystemTime::now() - Duration::from_secs_f64(r.e2e_ms / 1e3);
        match &p {
            Pipeline::Off => {
                std::hint::black_box(&*r);
            }
            Pipeline::Own(exporter) => exporter.send(r),
            Pipeline::Sdk(sdk) => sdk.finish(r),
        }
    }
    let calling_ns = thread_ns()? - calling0;
    let wall_ms = wall0.elapsed().as_millis() as u64;
    // Both pipelines export what is pending on their own timers (spans within the 5 s schedule
    // delay, metrics every second): the process is read after that, with every thread still
    // alive, so that each thread's own account (nanoseconds) covers all the export work.
    std::thread::sleep(SETTLE);
    let threads1 = process_threads_ns()?;
    let (same_threads, process_ns) = threads_delta(&threads0, &threads1);
    let (closed, dropped, dropped_requests) = match &p {
        Pipeline::Off => (true, None, None),
        Pipeline::Own(exporter) => {
            let closed = exporter.close_within(Duration::from_secs(60));
            let c = exporter.counts();
            (closed, Some(c.dropped_spans), Some(c.dropped_requests))
        }
        Pipeline::Sdk(sdk) => (sdk.shutdown().is_ok(), None, None),
    };
    // The whole run, stop included, threads that exited included, at clock-tick resolution.
    let ticks_ns = (process_ticks()? - ticks0) * (1_000_000_000 / clock_ticks());
    let hwm_kib = peak_rss_kib()?;
    let opt = |v: Option<u64>| v.map_or("none".to_string(), |v| v.to_string());
    println!(
        "RESULT pipeline={pipeline} rate={rate} n={n} calling_ns={calling_ns} process_ns={process_ns} ticks_ns={ticks_ns} same_threads={same_threads} wall_ms={wall_ms} hwm_kib={hwm_kib} dropped={} dropped_requests={} closed={closed}",
        opt(dropped),
        opt(dropped_requests),
    );
    Ok(())
}

/// The synthetic mix: one route, one model, streamed chat completions. Most requests are ok and
/// meet their SLO; some violate it (slow first token, slow tokens, a long stall), a few fail
/// (upstream error or timeout) and a few are abandoned by their client. A third carry a
/// caller's `traceparent`. Seeded: every run and pipeline sees the same requests.
fn workload(count: usize, seed: u64) -> Vec<BenchRequest> {
    let mut rng = fastrand::Rng::with_seed(seed);
    let route: Arc<str> = Arc::from("chat");
    let model: Arc<str> = Arc::from("meta-llama/Llama-3.1-8B-Instruct");
    (0..count)
        .map(|i| {
            let kind = rng.u32(0..1000);
            let prompt = rng.u64(150..2500);
            let mut output = rng.u64(40..700);
            let mut ttft = 60.0 + rng.f64() * 340.0;
            let mut tpot = 12.0 + rng.f64() * 18.0;
            let mut max_itl = tpot * (1.5 + rng.f64() * 2.5);
            let (mut outcome, mut slo, mut violated) = ("ok", Some("good"), vec![]);
            let (mut status, mut reason, mut finish) = (Some(200), None, Some("stop"));
            match kind {
                // Violations: TTFT, TPOT, a stall, or two at once.
                0..=19 => {
                    ttft += 2000.0;
                    slo = Some("violated");
                    violated = vec!["ttft"];
                }
                20..=34 => {
                    tpot += 40.0;
                    max_itl += 60.0;
                    slo = Some("violated");
                    violated = vec!["tpot"];
                }
                35..=44 => {
                    max_itl += 3000.0;
                    slo = Some("violated");
                    violated = vec!["max_itl", "e2e"];
                }
                // Failures: the upstream answered 503, or went idle mid-stream.
                45..=54 => {
                    outcome = "error";
                    status = Some(503);
                    slo = Some("violated");
                    violated = vec!["error"];
                    output = 0;
                    finish = None;
                }
                55..=59 => {
                    outcome = "error";
                    reason = Some("upstream_timeout");
                    slo = Some("violated");
                    violated = vec!["error"];
                    finish = None;
                }
                // Abandoned by the client.
                60..=69 => {
                    outcome = "cancelled";
                    reason = Some("client_gone");
                    slo = Some("excluded");
                    finish = None;
                }
                // Cut at max_tokens.
                70..=149 => finish = Some("length"),
                _ => {}
            }
            let failed_early = output == 0;
            let e2e = if failed_early {
                5.0 + rng.f64() * 50.0
            } else {
                ttft + tpot * (output.saturating_sub(1)) as f64
            };
            let parent = (rng.u32(0..3) == 0).then(|| {
                (
                    rng.u128(1..).to_be_bytes(),
                    rng.u64(1..).to_be_bytes(),
                    rng.bool(),
                )
            });
            let queue = rng.f64() * 30.0;
            BenchRequest {
                start: SystemTime::now(),
                request_id: Some(format!("chatcmpl-{:016x}{i:08x}", rng.u64(..)).into()),
                route: route.clone(),
                model: Some(model.clone()),
                path: "/v1/chat/completions".into(),
                status,
                outcome,
                slo,
                violated,
                finish_reason: finish,
                reason,
                prompt_tokens: Some(prompt),
                output_tokens: output,
                cached_tokens: Some(rng.u64(0..prompt / 2)),
                reasoning_tokens: None,
                ttfb_ms: (!failed_early).then_some(ttft - 0.3),
                ttft_ms: (!failed_early).then_some(ttft),
                tpot_ms: (!failed_early && output > 1).then_some(tpot),
                max_itl_ms: (!failed_early && output > 1).then_some(max_itl),
                e2e_ms: e2e,
                in_flight: rng.i64(1..64),
                in_flight_total: rng.i64(1..64),
                queue_ms: (!failed_early).then_some(queue),
                queue_source: (!failed_early).then_some("derived"),
                engine_prefill_ms: None,
                engine_decode_ms: None,
                engine_waiting: Some(rng.u32(0..8) as f64),
                engine_kv_usage: Some(rng.f64() * 0.9),
                parent,
                tracestate: None,
                dialect: Some(Dialect::OpenAiChat),
                stream: true,
                response_model: Some(model.to_string().into()),
            }
        })
        .collect()
}

/// User plus system CPU time of this process, every thread including those that exited, in
/// clock ticks.
fn process_ticks() -> Result<u64, String> {
    let stat = std::fs::read_to_string("/proc/self/stat").map_err(|e| e.to_string())?;
    // Fields after the command name (which may hold spaces) start at field 3: utime is 14 and
    // stime 15.
    let mut fields = stat
        .get(stat.rfind(')').ok_or("bad /proc/self/stat")? + 1..)
        .ok_or("bad /proc/self/stat")?
        .split_whitespace()
        .skip(11);
    let mut next = || -> Result<u64, String> {
        fields
            .next()
            .and_then(|f| f.parse().ok())
            .ok_or_else(|| "bad /proc/self/stat".to_string())
    };
    Ok(next()? + next()?)
}

/// Nanoseconds each of this process's threads has run, by thread id.
fn process_threads_ns() -> Result<Vec<(u32, u64)>, String> {
    let mut threads = Vec::new();
    for task in std::fs::read_dir("/proc/self/task").map_err(|e| e.to_string())? {
        let task = task.map_err(|e| e.to_string())?;
        let Some(tid) = task.file_name().to_str().and_then(|t| t.parse().ok()) else {
            continue;
        };
        // A thread that exits between the listing and the read is left out.
        let Ok(stat) = std::fs::read_to_string(task.path().join("schedstat")) else {
            continue;
        };
        if let Some(ns) = stat.split_whitespace().next().and_then(|v| v.parse().ok()) {
            threads.push((tid, ns));
        }
    }
    threads.sort_unstable();
    Ok(threads)
}

/// CPU between two readings: each thread's time now less its time before (a thread born in
/// between counts whole). Whether every thread of the first reading is still there: if one
/// exited, its time is missing and the tick figure is the one to trust.
fn threads_delta(before: &[(u32, u64)], after: &[(u32, u64)]) -> (bool, u64) {
    let same = before
        .iter()
        .all(|(tid, _)| after.iter().any(|(t, _)| t == tid));
    let ns = after
        .iter()
        .map(|(tid, ns)| {
            let was = before.iter().find(|(t, _)| t == tid).map_or(0, |(_, n)| *n);
            ns.saturating_sub(was)
        })
        .sum();
    (same, ns)
}

/// Nanoseconds the calling thread has run, as the scheduler counts them.
fn thread_ns() -> Result<u64, String> {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .map_err(|e| e.to_string())?
        .split_whitespace()
        .next()
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| "bad /proc/thread-self/schedstat".into())
}

/// Clock ticks per second (`getconf CLK_TCK`); 100, as on every Linux build, if that fails.
fn clock_ticks() -> u64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .filter(|&t| t > 0)
        .unwrap_or(100)
}

/// The process's peak resident memory.
fn peak_rss_kib() -> Result<u64, String> {
    std::fs::read_to_string("/proc/self/status")
        .map_err(|e| e.to_string())?
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .ok_or_else(|| "no VmHWM in /proc/self/status".into())
}
