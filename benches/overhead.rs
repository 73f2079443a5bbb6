//! What the proxy costs, against the floor a user would otherwise put there: `cargo bench
//! --bench overhead`.
//!
//! One run sends the same load five ways, all on loopback: straight to a paced mock upstream in
//! this process (the baseline), through nginx (one worker, keep-alive upstream, `proxy_buffering
//! off`: the pass-through floor, which measures nothing), through the real `tokenmeter` release
//! binary with one worker (the same resources as nginx's), through it on its default worker
//! count (one per CPU), and through it with one worker exporting OpenTelemetry (`tokenmeter+otlp`:
//! metrics every second and a span for every request, over OTLP/HTTP to a sink in this process
//! that decodes and discards; its CPU per frame against tokenmeter's is issue 39's cost). The proxies are child processes, so their CPU time and RSS are their own.
//! It prints one Markdown table for docs/performance.md, each figure for every way with tokenmeter's (one
//! worker) ratio to nginx: added TTFT at one user (the ways alternating request by request), proxy
//! CPU seconds per 1,000 frames and proxy RSS at 128, 512, 1,024 and 2,048 concurrent streams, and
//! at the top level (2,048 streams saturate a 2-core machine: proxy, mock and load generator share
//! it) the frames per second delivered and the share of streams that stalled. Details, the exact
//! workload, the machine's load and issue 12's targets follow. It measures and reports; it fails
//! nothing.
//!
//! Knobs, all optional: `--quick` or `TOKENMETER_BENCH_QUICK=1` (a smoke run of about 15 s),
//! `TOKENMETER_BENCH_STREAMS=128,512,1024,2048`, `TOKENMETER_BENCH_EVENTS=64` (tokens per stream),
//! `TOKENMETER_BENCH_INTERVAL_US=20000` (the pace), `TOKENMETER_BENCH_NGINX=PATH` (or `0` to leave
//! nginx out), `TOKENMETER_BENCH_RELAY=1` (a bare TCP relay process as one more way: the cost of
//! the hop alone), `TOKENMETER_BENCH_BINARY=PATH` (the tokenmeter binary to measure; by default
//! the bench builds it as `cargo build --release` does, into `target/shipping`: `cargo bench`'s
//! own build of it carries tokio's test-util), `TOKENMETER_BENCH_CANDIDATE=PATH` (another
//! tokenmeter binary, or a script that `exec`s one with other settings, as one more way,
//! `candidate`: two builds compared in one run, with its CPU per frame over tokenmeter's round by
//! round), `TOKENMETER_BENCH_SAMPLES=1000` (one-user requests per way), `TOKENMETER_BENCH_PIN=1`
//! (the bench's own threads, load generator and mock, on CPU 0 and the proxies on CPU 1, with
//! `taskset`: what each proxy adds when it does not share a core with the load; a diagnostic,
//! not the setup), `TOKENMETER_BENCH_ROUNDS=3` (rounds per
//! level and way, the ways rotating: more for a finer A/B), `TOKENMETER_BENCH_DEFAULT_WORKERS=0`
//! (leave out the way that runs tokenmeter on its default worker count), `TOKENMETER_BENCH_OTLP=0`
//! (leave out the way that exports OpenTelemetry),
//! `TOKENMETER_BENCH_PERF=DIR` (one extra, uncounted round per proxy at the level nearest 512
//! streams under `perf record -g`, written to DIR), and `TOKENMETER_BENCH_SAMPLES_DIR=DIR` (each
//! way's one-user samples, one request a line, written to DIR).

#[path = "overhead/load.rs"]
mod load;
#[path = "common/otlp_sink.rs"]
mod otlp_sink;
#[path = "overhead/processes.rs"]
mod processes;
#[path = "overhead/procfs.rs"]
mod procfs;
#[path = "overhead/serving.rs"]
mod serving;
#[path = "overhead/shipping.rs"]
mod shipping;
#[path = "overhead/upstream.rs"]
mod upstream;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use load::{Concurrent, PerfRequest, RoundShape, SingleUser, Way, Workload};
use processes::ProxyProcess;
use upstream::{Upstream, FRAMING_EVENTS};

/// The way that runs tokenmeter on its default worker count (one per CPU).
const DEFAULT_WORKERS_WAY: &str = "tokenmeter, per-CPU workers";

/// The way that runs tokenmeter with one worker exporting OpenTelemetry to the bench's sink.
const OTLP_WAY: &str = "tokenmeter+otlp";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--relay-for") {
        return match processes::relay_main(args.get(i + 1)) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => fail(&e),
        };
    }
    let mut params = Params::from_env();
    let load_before = procfs::load_average();
    let started = Instant::now();
    // Every pool stays open, and this process holds the client end of every connection and the
    // upstream's end of every connection to it: a little over two descriptors per stream and way at
    // the top level, and one per stream of head room. Raised before the proxies start, so they
    // inherit it (each proxy needs a little over two per stream).
    let needed = |params: &Params| {
        let ways_count = 3
            + usize::from(params.default_workers)
            + usize::from(params.relay)
            + usize::from(params.otlp)
            + usize::from(params.candidate.is_some());
        let top = params.levels.iter().copied().max().unwrap_or(1);
        ((2 * ways_count + 1) * top) as u64 + 256
    };
    let top = params.levels.iter().copied().max().unwrap_or(1);
    if let Err(why) = procfs::ensure_open_files(needed(&params)) {
        // The OTLP way is on unless told otherwise; where the host's hard limit cannot hold it
        // beside the others, the standard run goes on without it rather than not at all.
        if !params.otlp || params.otlp_asked {
            return fail(&why);
        }
        params.otlp = false;
        if let Err(why) = procfs::ensure_open_files(needed(&params)) {
            return fail(&why);
        }
        eprintln!(
            "overhead bench: the {OTLP_WAY} way is left out: with it the run {why} \
             (TOKENMETER_BENCH_OTLP=1 insists on it)"
        );
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return fail(&format!("cannot start the runtime: {e}")),
    };
    // One epoch for the upstream's send stamps and the clients' arrival stamps.
    let epoch = Instant::now();
    let upstream = match runtime.block_on(Upstream::start(epoch)) {
        Ok(upstream) => upstream,
        Err(e) => return fail(&e),
    };
    let sink = if params.otlp {
        match runtime.block_on(otlp_sink::start()) {
            Ok(sink) => Some(sink),
            Err(e) => return fail(&e),
        }
    } else {
        None
    };
    // Blocking in these spawns is fine: the upstream runs on the runtime's workers.
    // One worker, as nginx has: the same resources for the comparison. Its default (one per
    // CPU) runs as one more way, unless left out.
    let tokenmeter = match ProxyProcess::tokenmeter(upstream.addr, Some(1)) {
        Ok(proxy) => proxy,
        Err(e) => return fail(&e),
    };
    let default_workers = if params.default_workers {
        match ProxyProcess::tokenmeter(upstream.addr, None) {
            Ok(proxy) => Some(proxy),
            Err(e) => return fail(&e),
        }
    } else {
        None
    };
    let mut nginx_version = None;
    let nginx = match processes::find_or_install_nginx().and_then(|binary| {
        nginx_version = processes::nginx_version(&binary);
        ProxyProcess::nginx(&binary, upstream.addr, top)
    }) {
        Ok(nginx) => Ok(nginx),
        Err(why) => {
            eprintln!("overhead bench: nginx: {why}; going on without it");
            Err(why)
        }
    };
    let relay = if params.relay {
        match processes::relay(upstream.addr) {
            Ok(relay) => Some(relay),
            Err(e) => return fail(&e),
        }
    } else {
        None
    };
    let otlp = match &sink {
        Some(sink) => match ProxyProcess::tokenmeter_otlp(upstream.addr, sink.addr) {
            Ok(proxy) => Some(proxy),
            Err(e) => return fail(&e),
        },
        None => None,
    };
    let candidate = match &params.candidate {
        Some(binary) => match ProxyProcess::tokenmeter_from(binary, upstream.addr, Some(1)) {
            Ok(proxy) => Some(proxy),
            Err(e) => return fail(&e),
        },
        None => None,
    };
    let mut proxies: Vec<(&'static str, &ProxyProcess)> = Vec::new();
    if let Ok(nginx) = &nginx {
        proxies.push(("nginx", nginx));
    }
    proxies.push(("tokenmeter", &tokenmeter));
    if let Some(candidate) = &candidate {
        proxies.push(("candidate", candidate));
    }
    // The ways compared at one user (direct and the proxies so far) run there in a phase of their
    // own, the others after them.
    let compared = 1 + proxies.len();
    if let Some(default_workers) = &default_workers {
        proxies.push((DEFAULT_WORKERS_WAY, default_workers));
    }
    if let Some(otlp) = &otlp {
        proxies.push((OTLP_WAY, otlp));
    }
    if let Some(relay) = &relay {
        proxies.push(("relay", relay));
    }
    if params.pin {
        let mut pins = vec![(std::process::id(), "0x1")];
        pins.extend(proxies.iter().map(|(_, proxy)| (proxy.pid(), "0x2")));
        for (pid, mask) in pins {
            if let Err(why) = processes::pin(pid, mask) {
                return fail(&why);
            }
        }
        eprintln!("overhead bench: pinned: this process on CPU 0, the proxies on CPU 1");
    }
    // Ways are built inside the runtime: hyper's client pool needs it.
    let (measured, ways) = runtime.block_on(async {
        let mut ways = vec![Arc::new(Way::new("direct", upstream.addr, None))];
        for (name, proxy) in &proxies {
            ways.push(Arc::new(Way::new(name, proxy.listen, Some(proxy.pid()))));
        }
        (run(&params, epoch, &upstream, &ways, compared).await, ways)
    });
    let after_rss: Vec<(&str, Option<u64>)> = proxies
        .iter()
        .map(|(name, proxy)| (*name, procfs::rss_kib(proxy.pid())))
        .collect();
    let otlp_export = match (&sink, &otlp, ways.iter().find(|w| w.name == OTLP_WAY)) {
        (Some(sink), Some(proxy), Some(way)) => Some(runtime.block_on(OtlpExport::settle(
            sink,
            proxy,
            way.answered.load(std::sync::atomic::Ordering::Relaxed),
        ))),
        _ => None,
    };
    let context = Context {
        load_before,
        load_after: procfs::load_average(),
        nginx_version,
        nginx_missing: nginx.as_ref().err().cloned(),
        proxies: &proxies,
        after_rss,
        otlp_export,
        took: started.elapsed(),
    };
    if let Some(dir) = &params.samples_dir {
        write_samples(dir, &context.way_names(), &measured.single);
    }
    print_report(&params, &measured, &context);
    ExitCode::SUCCESS
}

fn fail(message: &str) -> ExitCode {
    eprintln!("overhead bench: {message}");
    ExitCode::FAILURE
}

/// What one run does; the defaults take about three minutes on two cores.
struct Params {
    quick: bool,
    /// The one-user level: short, fast streams, since only the first token matters for TTFT.
    single: Workload,
    single_warmup: usize,
    single_samples: usize,
    /// The concurrent levels' streams, and how many run at once at each level.
    workload: Workload,
    levels: Vec<usize>,
    /// The measuring window of one round, and the rounds each way runs per level.
    window: Duration,
    rounds: usize,
    relay: bool,
    candidate: Option<PathBuf>,
    /// tokenmeter exporting OTLP to the bench's sink as one more way.
    otlp: bool,
    /// `TOKENMETER_BENCH_OTLP=1`: the OTLP way is wanted even where it means raising the limit
    /// on open files by hand.
    otlp_asked: bool,
    /// tokenmeter on its default worker count as one more way.
    default_workers: bool,
    pin: bool,
    perf_dir: Option<PathBuf>,
    /// Where each way's one-user samples are written, one request a line, in the order sent.
    samples_dir: Option<PathBuf>,
}

impl Params {
    fn from_env() -> Params {
        let quick = std::env::args().any(|a| a == "--quick") || flag("TOKENMETER_BENCH_QUICK");
        let number = |name: &str| -> Option<u64> {
            let text = std::env::var(name).ok()?;
            let parsed = text.trim().parse().ok();
            if parsed.is_none() {
                eprintln!("overhead bench: ignoring {name}={text}: not a whole number");
            }
            parsed
        };
        let tokens = number("TOKENMETER_BENCH_EVENTS")
            .unwrap_or(if quick { 16 } else { 64 })
            .clamp(1, 10_000) as usize;
        let interval = Duration::from_micros(
            number("TOKENMETER_BENCH_INTERVAL_US")
                .unwrap_or(20_000)
                .clamp(100, 1_000_000),
        );
        let levels: Vec<usize> = std::env::var("TOKENMETER_BENCH_STREAMS")
            .ok()
            .map(|text| {
                text.split(',')
                    .filter_map(|s| s.trim().parse().ok())
                    .filter(|&n| n > 0 && n <= 8192)
                    .collect()
            })
            .filter(|v: &Vec<usize>| !v.is_empty())
            .unwrap_or_else(|| {
                if quick {
                    vec![16, 64]
                } else {
                    vec![128, 512, 1024, 2048]
                }
            });
        let perf_dir = std::env::var("TOKENMETER_BENCH_PERF")
            .ok()
            .filter(|d| !d.is_empty())
            .map(PathBuf::from);
        Params {
            quick,
            // 16 tokens 2 ms apart: a request every ~35 ms, so hundreds of samples per way fit
            // in well under a minute.
            single: Workload::new(16, Duration::from_millis(2)),
            single_warmup: if quick { 3 } else { 10 },
            single_samples: number("TOKENMETER_BENCH_SAMPLES")
                .map(|n| n.clamp(1, 100_000) as usize)
                .unwrap_or(if quick { 30 } else { 1000 }),
            workload: Workload::new(tokens, interval),
            levels,
            window: Duration::from_secs(if quick { 1 } else { 4 }),
            rounds: number("TOKENMETER_BENCH_ROUNDS")
                .filter(|&n| n > 0)
                .map_or(if quick { 1 } else { 3 }, |n| n as usize),
            relay: flag("TOKENMETER_BENCH_RELAY"),
            otlp: std::env::var("TOKENMETER_BENCH_OTLP").as_deref() != Ok("0"),
            otlp_asked: std::env::var("TOKENMETER_BENCH_OTLP").as_deref() == Ok("1"),
            pin: flag("TOKENMETER_BENCH_PIN"),
            default_workers: std::env::var("TOKENMETER_BENCH_DEFAULT_WORKERS").as_deref()
                != Ok("0")
                && std::thread::available_parallelism().map_or(1, |n| n.get()) > 1,
            candidate: std::env::var_os("TOKENMETER_BENCH_CANDIDATE")
                .filter(|p| !p.is_empty())
                .map(PathBuf::from),
            perf_dir,
            samples_dir: std::env::var_os("TOKENMETER_BENCH_SAMPLES_DIR")
                .filter(|p| !p.is_empty())
                .map(PathBuf::from),
        }
    }

    /// The level profiled with `TOKENMETER_BENCH_PERF`: the one nearest 512 streams.
    fn profiled_level(&self) -> Option<usize> {
        self.levels.iter().copied().min_by_key(|&n| n.abs_diff(512))
    }
}

fn flag(name: &str) -> bool {
    std::env::var(name).is_ok_and(|v| !v.is_empty() && v != "0")
}

// ---------------------------------------------------------------------------------------------
// The run.

/// Everything measured.
struct Measured {
    single: Vec<SingleUser>,
    /// tokenmeter's one-user requests in the phase it shares with the OTLP way, alternating
    /// with it request by request (empty without the OTLP way).
    single_otlp_off: SingleUser,
    single_others: Option<(u64, u64)>,
    levels: Vec<Level>,
    perf: Vec<String>,
}

/// One concurrency level: what each way did, and what the rest of the machine took meanwhile.
struct Level {
    streams: usize,
    ways: Vec<Concurrent>,
    others: Option<(u64, u64)>,
}

async fn run(
    params: &Params,
    epoch: Instant,
    upstream: &Upstream,
    ways: &[Arc<Way>],
    compared: usize,
) -> Measured {
    let ours: Vec<u32> = std::iter::once(std::process::id())
        .chain(ways.iter().filter_map(|w| w.pid))
        .collect();
    let reading = || procfs::machine_ticks().zip(procfs::ticks_of(&ours));
    let index = |name: &str| ways.iter().position(|w| w.name == name);
    let paired = index("tokenmeter").zip(index(OTLP_WAY));
    eprintln!(
        "overhead bench: 1 user, {} + {} requests per way, alternating",
        params.single_warmup, params.single_samples
    );
    let before = reading();
    let (single, single_otlp_off) = load::single_user(
        ways,
        compared,
        paired,
        &params.single,
        params.single_warmup,
        params.single_samples,
        epoch,
    )
    .await;
    let single_others = procfs::others_between(before, reading());

    let mut levels = Vec::new();
    let mut perf = Vec::new();
    for &streams in &params.levels {
        eprintln!(
            "overhead bench: {streams} streams, {} rounds of {} s per way",
            params.rounds,
            params.window.as_secs_f64()
        );
        let shape = RoundShape {
            streams,
            window: params.window,
        };
        let mut level = Level {
            streams,
            ways: ways.iter().map(|_| Concurrent::default()).collect(),
            others: None,
        };
        let before = reading();
        for round in 0..params.rounds {
            for k in 0..ways.len() {
                let i = (round + k) % ways.len();
                let (done, _) = load::concurrent_round(
                    &ways[i],
                    &params.workload,
                    &shape,
                    epoch,
                    upstream,
                    &ours,
                    None,
                )
                .await;
                level.ways[i].absorb(done);
            }
        }
        level.others = procfs::others_between(before, reading());
        if let (Some(dir), true) = (&params.perf_dir, params.profiled_level() == Some(streams)) {
            perf.extend(profile(dir, ways, params, &shape, epoch, upstream, &ours).await);
        }
        levels.push(level);
    }
    Measured {
        single,
        single_otlp_off,
        single_others,
        levels,
        perf,
    }
}

/// One extra round per proxy with `perf record -g` attached during its window; not counted,
/// since perf's sampling is charged to the process it samples.
async fn profile(
    dir: &std::path::Path,
    ways: &[Arc<Way>],
    params: &Params,
    shape: &RoundShape,
    epoch: Instant,
    upstream: &Upstream,
    ours: &[u32],
) -> Vec<String> {
    let mut notes = Vec::new();
    if let Err(e) = std::fs::create_dir_all(dir) {
        return vec![format!("perf: cannot create {}: {e}", dir.display())];
    }
    for way in ways.iter().filter(|w| w.pid.is_some()) {
        let base = format!("{}-{}", way.name, shape.streams);
        let request = PerfRequest {
            record: dir.join(format!("{base}.perf.data")),
            stat: dir.join(format!("{base}.stat.csv")),
        };
        eprintln!(
            "overhead bench: perf record of {} into {}",
            way.name,
            request.record.display()
        );
        let (round, children) = load::concurrent_round(
            way,
            &params.workload,
            shape,
            epoch,
            upstream,
            ours,
            Some(&request),
        )
        .await;
        let mut ok = true;
        for child in children {
            match child.and_then(|mut c| c.wait().map_err(|e| e.to_string())) {
                Ok(status) if status.success() => {}
                Ok(status) => {
                    ok = false;
                    notes.push(format!("perf on {} ended with {status}", way.name));
                }
                Err(e) => {
                    ok = false;
                    notes.push(format!("perf on {}: {e}", way.name));
                }
            }
        }
        if !ok {
            continue;
        }
        let per_frame: Vec<String> = load::perf_stat_counts(&request.stat)
            .into_iter()
            .map(|(event, count)| {
                format!(
                    "{:.2} {event}",
                    count as f64 / round.events_in_window.max(1) as f64
                )
            })
            .collect();
        notes.push(format!(
            "perf: {} at {} streams, per frame delivered: {}; profile in {} (`perf report -i {} --no-children`)",
            way.name,
            shape.streams,
            per_frame.join(", "),
            request.record.display(),
            request.record.display()
        ));
    }
    notes
}

// ---------------------------------------------------------------------------------------------
// The report.

/// What the report needs besides the measurements.
struct Context<'a> {
    load_before: Option<String>,
    load_after: Option<String>,
    nginx_version: Option<String>,
    nginx_missing: Option<String>,
    proxies: &'a [(&'static str, &'a ProxyProcess)],
    after_rss: Vec<(&'a str, Option<u64>)>,
    otlp_export: Option<OtlpExport>,
    took: Duration,
}

/// What the `tokenmeter+otlp` way exported by the end of the run, against what it was sent.
struct OtlpExport {
    /// Requests the way answered, every phase included: each is one span under `always_on`.
    requests: u64,
    spans: u64,
    trace_exports: u64,
    data_points: u64,
    metric_exports: u64,
    bytes: u64,
    rejected: u64,
    /// The proxy's own counts from its `/metrics`, when it could be read.
    dropped_spans: Option<f64>,
    dropped_requests_for_metrics: Option<f64>,
    export_errors: Option<f64>,
    /// How long the last spans took to arrive after the load ended.
    waited: Duration,
}

impl OtlpExport {
    /// Waits, up to twice the span batch's schedule delay and a little more, for every span not
    /// counted as dropped to reach the sink, then takes the tallies.
    async fn settle(sink: &otlp_sink::Sink, proxy: &ProxyProcess, requests: u64) -> OtlpExport {
        use std::sync::atomic::Ordering::Relaxed;
        let scrape = |series: &str| {
            proxy
                .admin
                .and_then(|admin| processes::scrape(admin, series))
        };
        let dropped = || scrape("tokenmeter_otel_dropped_total{signal=\"traces\"}");
        let waited = Instant::now();
        let deadline = waited + Duration::from_secs(12);
        while Instant::now() < deadline {
            let lost = dropped().unwrap_or(0.0) as u64;
            if sink.tally.spans.load(Relaxed) + lost >= requests {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let t = &sink.tally;
        OtlpExport {
            requests,
            spans: t.spans.load(Relaxed),
            trace_exports: t.trace_exports.load(Relaxed),
            data_points: t.data_points.load(Relaxed),
            metric_exports: t.metric_exports.load(Relaxed),
            bytes: t.bytes.load(Relaxed),
            rejected: t.rejected.load(Relaxed),
            dropped_spans: dropped(),
            dropped_requests_for_metrics: scrape(
                "tokenmeter_otel_dropped_total{signal=\"metrics\"}",
            ),
            export_errors: scrape("tokenmeter_otel_export_errors_total"),
            waited: waited.elapsed(),
        }
    }
}

impl Context<'_> {
    /// The ways in the order their figures are kept: direct, then each proxy.
    fn way_names(&self) -> Vec<&'static str> {
        std::iter::once("direct")
            .chain(self.proxies.iter().map(|(name, _)| *name))
            .collect()
    }
}

/// The p-th percentile with linear interpolation between the two nearest ranks (numpy's
/// default), over exact samples.
fn percentile(samples: &[u64], p: f64) -> Option<f64> {
    let mut sorted = samples.to_vec();
    sorted.sort_unstable();
    let last = sorted.len().checked_sub(1)?;
    let rank = p / 100.0 * last as f64;
    let (lo, hi) = (rank.floor() as usize, rank.ceil() as usize);
    let (a, b) = (sorted[lo] as f64, sorted[hi] as f64);
    Some(a + (b - a) * (rank - lo as f64))
}

/// A duration given in nanoseconds, to two or three significant figures.
fn human(ns: f64) -> String {
    let abs = ns.abs();
    if abs < 10_000.0 {
        format!("{:.1} µs", ns / 1e3)
    } else if abs < 1_000_000.0 {
        format!("{:.0} µs", ns / 1e3)
    } else {
        format!("{:.2} ms", ns / 1e6)
    }
}

fn signed(ns: f64) -> String {
    if ns >= 0.0 {
        format!("+{}", human(ns))
    } else {
        format!("−{}", human(-ns))
    }
}

fn or_na(value: Option<String>) -> String {
    value.unwrap_or_else(|| "n/a".into())
}

fn mib(kib: u64) -> String {
    format!("{:.1}", kib as f64 / 1024.0)
}

/// A whole number with thousands separated by commas.
fn thousands(n: f64) -> String {
    let digits = format!("{:.0}", n.max(0.0));
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn ratio(tokenmeter: Option<f64>, nginx: Option<f64>) -> String {
    match (tokenmeter, nginx) {
        (Some(t), Some(n)) if n > 0.0 => format!("{:.2}", t / n),
        _ => "n/a".into(),
    }
}

fn verdict(met: bool) -> &'static str {
    if met {
        "met"
    } else {
        "MISSED"
    }
}

/// One row of the main table: a label, a value per way (already formatted) and the numbers the
/// ratio is taken of.
struct Row {
    label: String,
    cells: Vec<String>,
    tokenmeter: Option<f64>,
    nginx: Option<f64>,
}

fn print_report(params: &Params, measured: &Measured, context: &Context) {
    let tick_s = 1.0 / procfs::clock_ticks_per_second() as f64;
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let names = context.way_names();
    let index = |name: &str| names.iter().position(|n| *n == name);
    let (nginx_at, tokenmeter_at) = (index("nginx"), index("tokenmeter"));
    let pick = |values: &[Option<f64>], at: Option<usize>| at.and_then(|i| values[i]);
    let mut rows: Vec<Row> = Vec::new();
    let mut push = |label: String, values: Vec<Option<f64>>, cells: Vec<String>| {
        rows.push(Row {
            label,
            tokenmeter: pick(&values, tokenmeter_at),
            nginx: pick(&values, nginx_at),
            cells,
        });
    };

    // 1. Added TTFT at one user: direct is the baseline, the others what they add to it.
    for (p, name) in [(50.0, "p50"), (99.0, "p99")] {
        let of: Vec<Option<f64>> = measured
            .single
            .iter()
            .map(|w| percentile(&w.ttft_ns, p))
            .collect();
        let base = of[0];
        let added: Vec<Option<f64>> = of.iter().map(|v| v.zip(base).map(|(v, b)| v - b)).collect();
        let cells = of
            .iter()
            .zip(&added)
            .enumerate()
            .map(|(i, (v, a))| {
                if i == 0 {
                    or_na(v.map(|v| format!("{} (baseline)", human(v))))
                } else {
                    or_na(a.map(signed))
                }
            })
            .collect();
        push(format!("added TTFT {name}, 1 user"), added, cells);
    }
    // 2. Proxy CPU per 1,000 frames.
    for level in &measured.levels {
        let values: Vec<Option<f64>> = level.ways.iter().map(|w| w.proxy_cpu_per_1000()).collect();
        let cells = values
            .iter()
            .enumerate()
            .map(|(i, v)| match (i, v) {
                (0, _) => "—".to_string(),
                (_, v) => or_na(v.map(|v| format!("{v:.4}"))),
            })
            .collect();
        push(
            format!(
                "CPU seconds per 1,000 frames, {} streams",
                thousands(level.streams as f64)
            ),
            values,
            cells,
        );
    }
    // 3. Proxy RSS: idle, then while each level's streams were open.
    let mut idle: Vec<Option<f64>> = vec![None];
    idle.extend(
        context
            .proxies
            .iter()
            .map(|(_, p)| p.idle_rss_kib.map(|k| k as f64)),
    );
    let rss_cells = |values: &[Option<f64>]| -> Vec<String> {
        values
            .iter()
            .enumerate()
            .map(|(i, v)| match (i, v) {
                (0, _) => "—".to_string(),
                (_, v) => or_na(v.map(|k| mib(k as u64))),
            })
            .collect()
    };
    push("RSS idle, MiB".into(), idle.clone(), rss_cells(&idle));
    for level in &measured.levels {
        let values: Vec<Option<f64>> = level
            .ways
            .iter()
            .map(|w| w.max_rss_kib.map(|k| k as f64))
            .collect();
        push(
            format!("RSS at {} streams, MiB", thousands(level.streams as f64)),
            values.clone(),
            rss_cells(&values),
        );
    }
    // 4. Saturation: the top level's delivery and stalls.
    let top = measured.levels.iter().max_by_key(|l| l.streams);
    if let Some(level) = top {
        let paced = level.streams as f64 * events_per_stream(params) as f64
            / params.workload.stream_length().as_secs_f64().max(1e-3);
        let values: Vec<Option<f64>> = level.ways.iter().map(|w| w.events_per_second()).collect();
        let cells = values.iter().map(|v| or_na(v.map(thousands))).collect();
        push(
            format!(
                "{} streams on {cores} cores: frames/s delivered (paced: {})",
                thousands(level.streams as f64),
                thousands(paced)
            ),
            values,
            cells,
        );
        let values: Vec<Option<f64>> = level.ways.iter().map(|w| w.gapped_share()).collect();
        // The counts beside the share: past saturation both proxies stall nearly every stream,
        // and the verdict can rest on a few streams that a rounded share does not show.
        let cells = level
            .ways
            .iter()
            .map(|w| {
                or_na(w.gapped_share().map(|s| {
                    format!(
                        "{:.1} % ({} of {})",
                        100.0 * s,
                        thousands(w.gapped as f64),
                        thousands(w.streams as f64)
                    )
                }))
            })
            .collect();
        push(
            format!(
                "{} streams: streams with a gap > 2× the pace ({} ms)",
                thousands(level.streams as f64),
                2 * params.workload.interval.as_millis()
            ),
            values,
            cells,
        );
    }

    println!();
    println!("## Overhead against nginx (`cargo bench --bench overhead`)");
    println!();
    println!("| figure | {} | tokenmeter / nginx |", names.join(" | "));
    println!("|---|{}---|", "---|".repeat(names.len()));
    for row in &rows {
        println!(
            "| {} | {} | {} |",
            row.label,
            row.cells.join(" | "),
            ratio(row.tokenmeter, row.nginx)
        );
    }
    if let Some(why) = &context.nginx_missing {
        println!();
        println!("**nginx is missing from this run:** {why}.");
    }
    for (streams, others) in measured
        .levels
        .iter()
        .map(|l| (format!("{}-stream level", l.streams), l.others))
        .chain(std::iter::once((
            "one-user level".to_string(),
            measured.single_others,
        )))
    {
        if let Some((others, all)) = others.filter(|(o, a)| *o * 20 > *a) {
            println!();
            println!(
                "**Not clean:** other processes took {:.0} % of the machine during the {streams}.",
                100.0 * others as f64 / all.max(1) as f64
            );
        }
    }

    println!();
    println!(
        "One user, {} requests per way (raw):",
        params.single_samples
    );
    println!();
    println!("| way | TTFT p50 | TTFT p99 | request leg p50 | request leg p99 | first-token leg p50 | first-token leg p99 | per-event p50 | per-event p99 | failed |");
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for (name, way) in names.iter().zip(&measured.single) {
        let at = |samples: &[u64], p| or_na(percentile(samples, p).map(human));
        println!(
            "| {name} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            at(&way.ttft_ns, 50.0),
            at(&way.ttft_ns, 99.0),
            at(&way.request_leg_ns, 50.0),
            at(&way.request_leg_ns, 99.0),
            at(&way.first_token_leg_ns, 50.0),
            at(&way.first_token_leg_ns, 99.0),
            at(&way.event_ns, 50.0),
            at(&way.event_ns, 99.0),
            way.failures.len(),
        );
    }
    println!();
    println!(
        "Concurrent streams, per way (raw; frames are SSE events as the clients received them):"
    );
    println!();
    println!("| streams | way | frames/s | proxy CPU s per 1,000 | the same, rounds' range | bench CPU s per 1,000 | proxy RSS MiB | streams counted | with a gap > 2× pace | TTFT p50 | TTFT p99 | per-event p50 | per-event p99 | upstream connections opened | failed | others' share of the machine |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for level in &measured.levels {
        for (name, way) in names.iter().zip(&level.ways) {
            let at = |samples: &[u64], p| or_na(percentile(samples, p).map(human));
            println!(
                "| {} | {name} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                level.streams,
                or_na(way.events_per_second().map(thousands)),
                or_na(way.proxy_cpu_per_1000().map(|v| format!("{v:.4}"))),
                or_na(range(&way.rounds_cpu_per_1000)),
                or_na(way.bench_cpu_per_1000().map(|v| format!("{v:.4}"))),
                or_na(way.max_rss_kib.map(mib)),
                way.streams,
                or_na(way.gapped_share().map(|s| format!("{:.1} %", 100.0 * s))),
                at(&way.ttft_ns, 50.0),
                at(&way.ttft_ns, 99.0),
                at(&way.event_ns, 50.0),
                at(&way.event_ns, 99.0),
                way.connections,
                way.failures.len(),
                or_na(way.others_share().map(|s| format!("{:.0} %", 100.0 * s))),
            );
        }
    }

    print_targets(&rows, measured, context, nginx_at, tokenmeter_at);
    if let (Some(t), Some(c)) = (tokenmeter_at, index("candidate")) {
        print_paired(measured, "candidate", c, "tokenmeter", t);
    }
    if let (Some(t), Some(o)) = (tokenmeter_at, index(OTLP_WAY)) {
        print_otlp(measured, context, t, o);
    }

    println!();
    println!("Run:");
    println!(
        "- one user: {} warm-up + {} counted requests per way, the ways alternating request by request: direct first in every round, then nginx and tokenmeter (and the candidate) in every order in turn, so each comes right after direct and right after the other equally often (a request finds in the caches what the one before it left); the per-CPU way (and the relay) in a second phase of their own, after direct, where the per-CPU way cannot warm the caches for tokenmeter (the same binary); {} tokens {} ms apart per request (TTFT does not depend on the pace: the first token follows the role chunk at once)",
        params.single_warmup,
        params.single_samples,
        params.single.tokens,
        params.single.interval.as_millis()
    );
    let (events, bytes) = measured
        .levels
        .iter()
        .flat_map(|l| &l.ways)
        .fold((0, 0), |(e, b), w| (e + w.events, b + w.bytes));
    println!(
        "- concurrent levels: each stream is {} SSE frames (role, {} tokens {} ms apart, finish, usage, `[DONE]`), compact OpenAI chat chunks of {} B on average, a token chunk carrying a ~4 B delta and its send stamp; one worker per stream, each running streams back to back, the workers' starts spread over one stream's length",
        events_per_stream(params),
        params.workload.tokens,
        params.workload.interval.as_millis(),
        bytes.checked_div(events).unwrap_or(0),
    );
    println!(
        "- per level and way: {} round(s), each with a {} s window that opens 1.25 stream lengths after the round starts (all streams running); the ways rotate round by round. CPU is the time the process's threads ran over the window (/proc/PID/task/*/schedstat, to the nanosecond; utime + stime in ticks of {:.0} ms if a thread came or went) divided by the frames delivered in it; RSS is the largest of five VmRSS readings in the window; a stream counts towards the gap share if it started and ended inside a window",
        params.rounds,
        params.window.as_secs_f64(),
        tick_s * 1e3
    );
    println!(
        "- nginx: {}, one process (master_process off, one worker), upstream keepalive {}, proxy_http_version 1.1, Connection \"\", proxy_buffering off, access_log off",
        or_na(context.nginx_version.clone()),
        params.levels.iter().copied().max().unwrap_or(0).max(16)
    );
    println!("- tokenmeter: this source's binary as `cargo build --release` builds it (not `cargo bench`'s, which carries tokio's test-util), on its embedded defaults (metrics and the live view on, no access log) with `--workers 1`: one event loop, as nginx has one worker; `{DEFAULT_WORKERS_WAY}`: the same on its default worker count (one per CPU: {cores} here), each worker its own event loop on its own thread");
    if params.otlp {
        println!("- `{OTLP_WAY}`: the same binary with `--workers 1` and OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:PORT (a sink in this process that decodes every body with opentelemetry-proto and discards it; its CPU is the bench's), OTEL_TRACES_SAMPLER=always_on (a span for every request), OTEL_METRIC_EXPORT_INTERVAL=1000 (metrics exported every second, within every round), the span queue and batch on the SDK's defaults; at one user it runs in a third phase with direct and tokenmeter, the three alternating request by request (direct first, the other two in either order in turn), and its TTFT is compared with tokenmeter's in that phase");
    }
    if params.pin {
        println!("- PINNED (TOKENMETER_BENCH_PIN): the load generator and the mock on CPU 0, the proxies on CPU 1; not issue 12's setup{}", if params.quick { "; QUICK run" } else { "" });
    } else {
        println!(
            "- {cores} core(s) shared by the proxies, the mock upstream and the load generator, all on loopback{}",
            if params.quick { "; QUICK run" } else { "" }
        );
    }
    println!(
        "- load average before and after: {} / {}",
        or_na(context.load_before.clone()),
        or_na(context.load_after.clone())
    );
    for (what, others) in
        std::iter::once(("the one-user level".to_string(), measured.single_others)).chain(
            measured
                .levels
                .iter()
                .map(|l| (format!("the {}-stream level", l.streams), l.others)),
        )
    {
        if let Some((others, all)) = others {
            println!(
                "- other processes (and hypervisor steal) took {:.1} CPU-s of {:.1} during {what} ({:.1} %)",
                others as f64 * tick_s,
                all as f64 * tick_s,
                100.0 * others as f64 / all.max(1) as f64
            );
        }
    }
    let after: Vec<String> = context
        .after_rss
        .iter()
        .map(|(name, kib)| format!("{name} {} MiB", or_na(kib.map(mib))))
        .collect();
    println!(
        "- RSS after the run, idle with the clients' keep-alive connections still open: {}",
        after.join(", ")
    );
    println!("- took {:.0} s", context.took.as_secs_f64());
    for note in &measured.perf {
        println!("- {note}");
    }
    let failures = measured
        .single
        .iter()
        .zip(&names)
        .flat_map(|(w, name)| w.failures.iter().map(move |f| (name.to_string(), f)))
        .chain(measured.levels.iter().flat_map(|l| {
            l.ways.iter().zip(&names).flat_map(move |(w, name)| {
                w.failures
                    .iter()
                    .map(move |f| (format!("{name} at {} streams", l.streams), f))
            })
        }));
    for (at, failure) in failures.take(10) {
        println!("- failed stream, {at}: {failure}");
    }
    for (name, proxy) in context.proxies {
        for line in proxy.complaints.lines() {
            println!("- {name} logged: {line}");
        }
    }
}

/// SSE events in one stream of the concurrent levels.
fn events_per_stream(params: &Params) -> usize {
    params.workload.tokens + FRAMING_EVENTS
}

/// Issue 12's targets for tokenmeter against nginx, reported, not enforced.
fn print_targets(
    rows: &[Row],
    measured: &Measured,
    context: &Context,
    nginx_at: Option<usize>,
    tokenmeter_at: Option<usize>,
) {
    let (Some(n), Some(t)) = (nginx_at, tokenmeter_at) else {
        return;
    };
    println!();
    println!("Targets (issue 12; reported, not enforced):");
    let compare = |row: &Row, within: f64| match (row.tokenmeter, row.nginx) {
        (Some(tv), Some(nv)) => verdict(tv <= nv + within),
        _ => "n/a",
    };
    for row in rows {
        let label = row.label.as_str();
        let target = if label.starts_with("added TTFT p50") {
            Some(("≤ nginx's + 25 µs", compare(row, 25_000.0)))
        } else if label.starts_with("added TTFT p99") || label.starts_with("CPU seconds") {
            Some(("≤ nginx's", compare(row, 0.0)))
        } else if label.contains("frames/s delivered") {
            let met = match (row.tokenmeter, row.nginx) {
                (Some(tv), Some(nv)) => verdict(tv >= nv),
                _ => "n/a",
            };
            Some(("≥ nginx's", met))
        } else if label.contains("gap >") {
            Some(("no more than nginx's", compare(row, 0.0)))
        } else {
            None
        };
        if let Some((goal, met)) = target {
            println!("- {label} {goal}: {met}");
        }
    }
    // RSS per open stream: what each level's streams added over idle, per stream.
    let idle = |at: usize| context.proxies[at - 1].1.idle_rss_kib;
    for level in &measured.levels {
        let per_stream = |at: usize| -> Option<f64> {
            let open = level.ways[at].max_rss_kib? as f64;
            Some((open - idle(at)? as f64) / level.streams as f64)
        };
        let (nv, tv) = (per_stream(n), per_stream(t));
        println!(
            "- RSS per open stream at {} streams ≤ nginx's: tokenmeter {} KiB, nginx {} KiB: {}",
            level.streams,
            or_na(tv.map(|v| format!("{v:.1}"))),
            or_na(nv.map(|v| format!("{v:.1}"))),
            match (tv, nv) {
                (Some(tv), Some(nv)) => verdict(tv <= nv),
                _ => "n/a",
            }
        );
    }
    // One round's CPU figure moves far more with the machine than the proxies differ: within a
    // round the ways take turns seconds apart, so each round's own ratio is steadier.
    for (at, name) in context.proxies.iter().map(|(name, _)| *name).enumerate() {
        if at + 1 != n {
            print_paired(measured, name, at + 1, "nginx", n);
        }
    }
}

/// Issue 39's cost bound for OpenTelemetry export, reported, not enforced: the OTLP way's CPU per
/// frame and RSS per open stream against tokenmeter's (OTLP off), and what reached the sink.
fn print_otlp(measured: &Measured, context: &Context, t: usize, o: usize) {
    println!();
    println!("OTLP on (issue 39; reported, not enforced): `{OTLP_WAY}` against `tokenmeter` (OTLP off), both one worker:");
    // One user: the two alternated request by request in a phase of their own (with direct).
    let (on, off) = (&measured.single[o], &measured.single_otlp_off);
    for (p, name) in [(50.0, "p50"), (99.0, "p99")] {
        let (a, b) = (percentile(&on.ttft_ns, p), percentile(&off.ttft_ns, p));
        println!(
            "- TTFT {name} at one user, alternating request by request: off {}, on {}, on − off {}",
            or_na(b.map(human)),
            or_na(a.map(human)),
            or_na(a.zip(b).map(|(a, b)| format!("{:+.0} µs", (a - b) / 1e3))),
        );
    }
    for level in &measured.levels {
        let (off, on) = (
            level.ways[t].proxy_cpu_per_1000(),
            level.ways[o].proxy_cpu_per_1000(),
        );
        let within = off.zip(on).map(|(off, on)| on / off);
        println!(
            "- CPU s per 1,000 frames at {} streams within 5 % of OTLP off: off {}, on {}, on / off {}: {}",
            level.streams,
            or_na(off.map(|v| format!("{v:.4}"))),
            or_na(on.map(|v| format!("{v:.4}"))),
            or_na(within.map(|r| format!("{r:.3}"))),
            within.map_or("n/a", |r| verdict(r <= 1.05))
        );
    }
    // The exporter's thread, read per thread in the same process: what export itself costs,
    // free of the noise between two processes' rounds. What it leaves out is on the request
    // path: building the record and handing it over.
    for level in &measured.levels {
        let way = &level.ways[o];
        let (exporter, total) = (way.exporter_cpu_per_1000(), way.proxy_cpu_per_1000());
        println!(
            "- the exporter thread's own CPU at {} streams: {} s per 1,000 frames, {} of the OTLP way's CPU{}",
            level.streams,
            or_na(exporter.map(|v| format!("{v:.5}"))),
            or_na(exporter.zip(total).map(|(e, t)| format!("{:.1} %", e / t * 100.0))),
            match (exporter, level.ways[t].proxy_cpu_per_1000()) {
                (Some(e), Some(off)) => format!(", {:.1} % of OTLP off's", e / off * 100.0),
                _ => String::new(),
            }
        );
    }
    let idle = |at: usize| context.proxies[at - 1].1.idle_rss_kib;
    for level in &measured.levels {
        let per_stream = |at: usize| -> Option<f64> {
            let open = level.ways[at].max_rss_kib? as f64;
            Some((open - idle(at)? as f64) / level.streams as f64)
        };
        println!(
            "- RSS per open stream at {} streams: off {} KiB, on {} KiB (RSS off {} MiB, on {} MiB)",
            level.streams,
            or_na(per_stream(t).map(|v| format!("{v:.1}"))),
            or_na(per_stream(o).map(|v| format!("{v:.1}"))),
            or_na(level.ways[t].max_rss_kib.map(mib)),
            or_na(level.ways[o].max_rss_kib.map(mib)),
        );
    }
    // Idle RSS is read before any request, so the figures above also carry what export holds
    // whatever the load (its thread, queue and buffers); the growth from one level to the next is
    // what each further stream costs.
    for pair in measured.levels.windows(2) {
        let (a, b) = (&pair[0], &pair[1]);
        if a.streams == b.streams {
            continue;
        }
        let slope = |at: usize| -> Option<f64> {
            let grown = b.ways[at].max_rss_kib? as f64 - a.ways[at].max_rss_kib? as f64;
            Some(grown / (b.streams as f64 - a.streams as f64))
        };
        println!(
            "- RSS added per stream from {} to {} streams: off {} KiB, on {} KiB",
            a.streams,
            b.streams,
            or_na(slope(t).map(|v| format!("{v:.1}"))),
            or_na(slope(o).map(|v| format!("{v:.1}"))),
        );
    }
    print_paired(measured, OTLP_WAY, o, "tokenmeter", t);
    if let Some(x) = &context.otlp_export {
        let count = |v: Option<f64>| or_na(v.map(thousands));
        println!(
            "- spans decoded by the sink: {} of {} requests sent through `{OTLP_WAY}` ({}); tokenmeter_otel_dropped_total: traces {}, metrics {}; export errors {}; {} trace exports, {} metric exports with {} data points, {} MiB of protobuf, {} bodies rejected; the last spans arrived {:.1} s after the load ended",
            thousands(x.spans as f64),
            thousands(x.requests as f64),
            if x.spans == x.requests {
                "every one".to_string()
            } else {
                format!("{} missing", x.requests as i64 - x.spans as i64)
            },
            count(x.dropped_spans),
            count(x.dropped_requests_for_metrics),
            count(x.export_errors),
            thousands(x.trace_exports as f64),
            thousands(x.metric_exports as f64),
            thousands(x.data_points as f64),
            mib(x.bytes / 1024),
            x.rejected,
            x.waited.as_secs_f64()
        );
    }
}

/// Each level's CPU per frame of one way over another's, round by round: the median and range.
fn print_paired(measured: &Measured, name: &str, at: usize, base: &str, base_at: usize) {
    for level in &measured.levels {
        let of_base = &level.ways[base_at].rounds_cpu_per_1000;
        let rounds = &level.ways[at].rounds_cpu_per_1000;
        if rounds.len() != of_base.len() || rounds.is_empty() {
            continue;
        }
        let mut ratios: Vec<f64> = rounds.iter().zip(of_base).map(|(r, b)| r / b).collect();
        ratios.sort_by(f64::total_cmp);
        let mid = ratios.len() / 2;
        let median = if ratios.len() % 2 == 0 {
            (ratios[mid - 1] + ratios[mid]) / 2.0
        } else {
            ratios[mid]
        };
        println!(
            "- (CPU per frame at {} streams, {name} / {base} round by round: median {median:.2}, {:.2}–{:.2} over {} rounds)",
            level.streams,
            ratios[0],
            ratios[ratios.len() - 1],
            ratios.len()
        );
    }
}

/// Each way's one-user samples as `one-user-WAY.tsv` in `dir`: TTFT, request leg and first-token
/// leg in nanoseconds, one request a line in the order sent, for distributions the report's two
/// percentiles do not show.
fn write_samples(dir: &std::path::Path, names: &[&str], single: &[SingleUser]) {
    use std::fmt::Write as _;
    let written = std::fs::create_dir_all(dir).and_then(|()| {
        for (name, way) in names.iter().zip(single) {
            let mut text = String::from("ttft_ns\trequest_leg_ns\tfirst_token_leg_ns\n");
            // The three are pushed together, one entry a request.
            for ((ttft, request), first) in way
                .ttft_ns
                .iter()
                .zip(&way.request_leg_ns)
                .zip(&way.first_token_leg_ns)
            {
                let _ = writeln!(text, "{ttft}\t{request}\t{first}");
            }
            let file = format!("one-user-{}.tsv", name.replace([' ', ','], "-"));
            std::fs::write(dir.join(file), text)?;
        }
        Ok(())
    });
    if let Err(e) = written {
        eprintln!(
            "overhead bench: could not write the samples to {}: {e}",
            dir.display()
        );
    }
}

/// The lowest and highest of some rounds' figures, `None` for none.
fn range(values: &[f64]) -> Option<String> {
    let lowest = values.iter().copied().reduce(f64::min)?;
    let highest = values.iter().copied().reduce(f64::max)?;
    Some(format!("{lowest:.4}–{highest:.4}"))
}
