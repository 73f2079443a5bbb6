//! The overhead bench's load generator: HTTP/1.1 clients with a keep-alive pool per way, one
//! stream read to its end with every SSE event timed on arrival, and the two shapes of load the
//! report needs: one user alternating between the ways request by request, and N concurrent
//! streams held for a measuring window while the proxy's CPU time and RSS are sampled.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::CONTENT_TYPE;
use http::{Request, StatusCode, Uri};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use memchr::memmem;
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::procfs;
use crate::upstream::{Upstream, INTERVAL_HEADER, SENT_KEY};

type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// One way to the upstream: straight, or through a proxy process. Each has its own connection
/// pool, which stays open for the whole run as a client's would.
pub(crate) struct Way {
    pub(crate) name: &'static str,
    client: HttpClient,
    uri: Uri,
    /// The process the way passes through, whose CPU time and RSS are its cost.
    pub(crate) pid: Option<u32>,
    /// Requests the way answered (a response head arrived), warm-up and uncounted ones included:
    /// what a proxy that records every request has recorded.
    pub(crate) answered: AtomicU64,
}

impl Way {
    pub(crate) fn new(name: &'static str, addr: SocketAddr, pid: Option<u32>) -> Way {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        Way {
            name,
            client: Client::builder(TokioExecutor::new()).build(connector),
            uri: format!("http://{addr}/v1/chat/completions")
                .parse()
                .expect("a socket address makes a valid URI"),
            pid,
            answered: AtomicU64::new(0),
        }
    }
}

/// The model each request names: a real model id's length (the proxy reads it from every
/// request body for its labels; a five-byte name made that look cheaper than it is).
pub(crate) const MODEL: &str = "meta-llama/Llama-3.1-8B-Instruct";

/// What each stream asks the upstream for.
#[derive(Clone)]
pub(crate) struct Workload {
    pub(crate) tokens: usize,
    pub(crate) interval: Duration,
    body: Bytes,
}

impl Workload {
    pub(crate) fn new(tokens: usize, interval: Duration) -> Workload {
        let body = format!(
            r#"{{"model":"{MODEL}","messages":[{{"role":"user","content":"Tell me a story."}}],"stream":true,"stream_options":{{"include_usage":true}},"max_tokens":{tokens}}}"#
        );
        Workload {
            tokens,
            interval,
            body: Bytes::from(body),
        }
    }

    /// How long one stream takes on its own: the first token comes at once, each later one
    /// an interval after the one before.
    pub(crate) fn stream_length(&self) -> Duration {
        self.interval * (self.tokens.saturating_sub(1)) as u32
    }
}

/// What one stream saw; times are nanoseconds since the bench's epoch.
pub(crate) struct StreamSeen {
    pub(crate) sent_ns: u64,
    pub(crate) ended_ns: u64,
    /// From just before the request was sent to the arrival of the first token.
    pub(crate) ttft_ns: u64,
    /// For each token, its arrival minus the upstream's stamp.
    pub(crate) event_ns: Vec<u64>,
    /// The longest time between two consecutive tokens' arrivals.
    pub(crate) max_gap_ns: u64,
    /// Every SSE event received, tokens and framing alike, and their bytes.
    pub(crate) events: u64,
    pub(crate) bytes: u64,
    /// The events that arrived inside the measuring window.
    pub(crate) events_in_window: u64,
}

fn since(epoch: Instant) -> u64 {
    epoch.elapsed().as_nanos() as u64
}

fn sent_stamp(event: &[u8]) -> Option<u64> {
    let at = memmem::find(event, SENT_KEY)? + SENT_KEY.len();
    let digits = &event[at..];
    let len = digits.iter().take_while(|b| b.is_ascii_digit()).count();
    std::str::from_utf8(&digits[..len]).ok()?.parse().ok()
}

/// Sends one chat completion request along `way` and reads its stream to the end, splitting the
/// bytes into SSE events whichever frames they arrive in (hyper hands a chunk on in pieces if it
/// arrived in pieces, and two events may share a frame). Events arriving within `window`
/// (`[start, end)` since the epoch) are counted apart.
pub(crate) async fn stream_once(
    way: &Way,
    workload: &Workload,
    epoch: Instant,
    window: (u64, u64),
) -> Result<StreamSeen, String> {
    let request = Request::post(way.uri.clone())
        .header(CONTENT_TYPE, "application/json")
        .header(INTERVAL_HEADER, workload.interval.as_micros().to_string())
        .body(Full::new(workload.body.clone()))
        .map_err(|e| e.to_string())?;
    let sent_ns = since(epoch);
    let response = way
        .client
        .request(request)
        .await
        .map_err(|e| format!("request failed: {e}"))?;
    way.answered.fetch_add(1, Ordering::Relaxed);
    if response.status() != StatusCode::OK {
        return Err(format!("status {}", response.status()));
    }
    let mut body = response.into_body();
    let mut pending: Vec<u8> = Vec::with_capacity(512);
    let mut seen = StreamSeen {
        sent_ns,
        ended_ns: 0,
        ttft_ns: 0,
        event_ns: Vec::with_capacity(workload.tokens),
        max_gap_ns: 0,
        events: 0,
        bytes: 0,
        events_in_window: 0,
    };
    let mut last_token: Option<u64> = None;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| format!("body failed: {e}"))?;
        let arrived = since(epoch);
        let Ok(data) = frame.into_data() else {
            continue;
        };
        seen.bytes += data.len() as u64;
        pending.extend_from_slice(&data);
        let mut start = 0;
        while let Some(end) = memmem::find(&pending[start..], b"\n\n") {
            let event = &pending[start..start + end];
            seen.events += 1;
            if (window.0..window.1).contains(&arrived) {
                seen.events_in_window += 1;
            }
            if let Some(stamp) = sent_stamp(event) {
                match last_token {
                    None => seen.ttft_ns = arrived.saturating_sub(sent_ns),
                    Some(last) => seen.max_gap_ns = seen.max_gap_ns.max(arrived - last),
                }
                last_token = Some(arrived);
                seen.event_ns.push(arrived.saturating_sub(stamp));
            }
            start += end + 2;
        }
        pending.drain(..start);
    }
    seen.ended_ns = since(epoch);
    if seen.event_ns.len() != workload.tokens {
        return Err(format!(
            "{} of {} tokens arrived",
            seen.event_ns.len(),
            workload.tokens
        ));
    }
    Ok(seen)
}

/// A stream that has not ended this long after it started has failed.
const STREAM_TIMEOUT: Duration = Duration::from_secs(60);

async fn stream_bounded(
    way: &Way,
    workload: &Workload,
    epoch: Instant,
    window: (u64, u64),
) -> Result<StreamSeen, String> {
    match tokio::time::timeout(STREAM_TIMEOUT, stream_once(way, workload, epoch, window)).await {
        Ok(result) => result,
        Err(_) => Err(format!("no end within {} s", STREAM_TIMEOUT.as_secs())),
    }
}

/// TTFT and per-event latency of one way at one user.
#[derive(Default)]
pub(crate) struct SingleUser {
    pub(crate) ttft_ns: Vec<u64>,
    /// TTFT split at the upstream's stamp on the first token: until it (the request reaching
    /// the upstream, and its answer starting) and after it (the first token coming back).
    pub(crate) request_leg_ns: Vec<u64>,
    pub(crate) first_token_leg_ns: Vec<u64>,
    pub(crate) event_ns: Vec<u64>,
    pub(crate) failures: Vec<String>,
}

/// One user, one stream at a time, in two phases of `warmup + samples` rounds: the compared ways
/// (`0..compared`: direct, nginx and the tokenmeter builds under comparison), then direct again
/// with the other ways (the per-CPU way, the relay), whose direct requests are not counted.
/// Each round sends one request along every way of its phase, in the order [`round_order`]
/// gives. A request finds in the caches what the request before it left there: after a proxy
/// that proxy's code and data, after the direct way little but the bench's own, and after
/// another way of the same binary its own code. So a phase opens every round with direct, and
/// its proxies follow in every order in turn, each right after direct and right after each of
/// the others equally often; and the per-CPU way, the same binary as tokenmeter, runs in a phase
/// of its own, where it cannot warm the caches for tokenmeter's next request. (Until this round
/// the ways rotated alike in one phase: tokenmeter came right after nginx in three rounds of
/// four, nginx right after direct in three of four, and the per-CPU way right after tokenmeter.)
///
/// `paired`, `(a, b)`: way `b` (tokenmeter with OTLP export) leaves the second phase for a third
/// of its own with direct and way `a` (the same binary without it), alternating request by
/// request in every order, so the two are compared under the same conditions; `a`'s requests
/// there are returned apart (the second value), `b`'s are its figures.
pub(crate) async fn single_user(
    ways: &[Arc<Way>],
    compared: usize,
    paired: Option<(usize, usize)>,
    workload: &Workload,
    warmup: usize,
    samples: usize,
    epoch: Instant,
) -> (Vec<SingleUser>, SingleUser) {
    let mut out: Vec<SingleUser> = ways.iter().map(|_| SingleUser::default()).collect();
    let mut paired_off = SingleUser::default();
    let compared = compared.clamp(1, ways.len());
    let compared_phase: Vec<usize> = (0..compared).collect();
    let others_phase: Vec<usize> = std::iter::once(0)
        .chain((compared..ways.len()).filter(|&i| paired.is_none_or(|(_, b)| i != b)))
        .collect();
    let paired_phase: Vec<usize> = paired.map_or_else(Vec::new, |(a, b)| vec![0, a, b]);
    for (phase, members) in [compared_phase, others_phase, paired_phase]
        .iter()
        .enumerate()
    {
        if members.len() < 2 && phase > 0 {
            continue;
        }
        for round in 0..warmup + samples {
            for at in round_order(round, members.len()) {
                let i = members[at];
                let result = stream_bounded(&ways[i], workload, epoch, (0, 0)).await;
                if round < warmup || (phase > 0 && i == 0) {
                    continue;
                }
                let tally = if phase == 2 && paired.is_some_and(|(a, _)| a == i) {
                    &mut paired_off
                } else {
                    &mut out[i]
                };
                match result {
                    Ok(seen) => {
                        let first = seen.event_ns.first().copied().unwrap_or(0);
                        tally.ttft_ns.push(seen.ttft_ns);
                        tally
                            .request_leg_ns
                            .push(seen.ttft_ns.saturating_sub(first));
                        tally.first_token_leg_ns.push(first);
                        tally.event_ns.extend(seen.event_ns);
                    }
                    Err(e) => tally.failures.push(e),
                }
            }
        }
    }
    (out, paired_off)
}

/// The order of one round's `ways` requests: the first (direct) opens it, and the others follow
/// in the round's permutation of them, the permutations taken in turn (lexicographic order, by
/// the round's index in the factorial number system). Over any `(ways - 1)!` rounds each of them
/// comes right after the first and right after each of the others equally often.
pub(crate) fn round_order(round: usize, ways: usize) -> Vec<usize> {
    let mut order = Vec::with_capacity(ways);
    if ways == 0 {
        return order;
    }
    order.push(0);
    let mut pool: Vec<usize> = (1..ways).collect();
    let count: usize = (1..=pool.len()).product();
    let mut index = round % count;
    for left in (0..pool.len()).rev() {
        let block: usize = (1..=left).product();
        order.push(pool.remove(index / block));
        index %= block;
    }
    order
}

/// What one way did at one concurrency level, summed over its rounds.
#[derive(Default)]
pub(crate) struct Concurrent {
    /// Measuring window time, in nanoseconds, and the SSE events delivered in it.
    pub(crate) window_ns: u64,
    pub(crate) events_in_window: u64,
    /// CPU time, in nanoseconds, of the way's proxy process and of this bench process in the
    /// windows.
    pub(crate) proxy_cpu_ns: Option<u64>,
    pub(crate) bench_cpu_ns: Option<u64>,
    /// Of the proxy's CPU, its OpenTelemetry exporter thread's (the OTLP way only).
    pub(crate) exporter_cpu_ns: Option<u64>,
    /// The proxy's CPU seconds per 1,000 events in each round on its own: how far one round's
    /// figure moves from the next.
    pub(crate) rounds_cpu_per_1000: Vec<f64>,
    /// The largest VmRSS of the proxy sampled in the windows.
    pub(crate) max_rss_kib: Option<u64>,
    /// Busy ticks of other processes and all ticks of the machine in the windows: whether this
    /// way's figures were measured on a machine of its own.
    pub(crate) others: Option<(u64, u64)>,
    /// Streams that started and ended inside a window, so ran at full concurrency throughout.
    pub(crate) streams: usize,
    /// Of those, the ones with some gap between tokens over twice the interval.
    pub(crate) gapped: usize,
    pub(crate) ttft_ns: Vec<u64>,
    pub(crate) event_ns: Vec<u64>,
    pub(crate) events: u64,
    pub(crate) bytes: u64,
    /// Connections the upstream accepted during the way's rounds: a way that reuses its
    /// connections opens none after its first round.
    pub(crate) connections: u64,
    pub(crate) failures: Vec<String>,
}

/// CPU seconds per 1,000 events.
fn per_1000(cpu_ns: u64, events: u64) -> Option<f64> {
    (events > 0).then(|| cpu_ns as f64 / 1e9 / events as f64 * 1000.0)
}

impl Concurrent {
    pub(crate) fn events_per_second(&self) -> Option<f64> {
        (self.window_ns > 0).then(|| self.events_in_window as f64 * 1e9 / self.window_ns as f64)
    }

    /// CPU seconds per 1,000 events delivered, of the proxy (`None` for the direct way).
    pub(crate) fn proxy_cpu_per_1000(&self) -> Option<f64> {
        per_1000(self.proxy_cpu_ns?, self.events_in_window)
    }

    /// CPU seconds per 1,000 events delivered, of the proxy's exporter thread alone.
    pub(crate) fn exporter_cpu_per_1000(&self) -> Option<f64> {
        per_1000(self.exporter_cpu_ns?, self.events_in_window)
    }

    pub(crate) fn bench_cpu_per_1000(&self) -> Option<f64> {
        per_1000(self.bench_cpu_ns?, self.events_in_window)
    }

    /// The share of the machine other processes took in this way's windows.
    pub(crate) fn others_share(&self) -> Option<f64> {
        let (others, all) = self.others?;
        (all > 0).then(|| others as f64 / all as f64)
    }

    pub(crate) fn gapped_share(&self) -> Option<f64> {
        (self.streams > 0).then(|| self.gapped as f64 / self.streams as f64)
    }
}

/// How one concurrent round is shaped.
pub(crate) struct RoundShape {
    pub(crate) streams: usize,
    pub(crate) window: Duration,
}

/// `perf record -g` and `perf stat` attached to a proxy for one measuring window.
pub(crate) struct PerfRequest {
    pub(crate) record: PathBuf,
    pub(crate) stat: PathBuf,
}

/// One round of one way: `shape.streams` workers, their starts spread evenly over one stream's
/// length so the streams overlap as steady traffic would rather than arriving in one burst,
/// each running streams back to back. Once all have started and a quarter stream more has
/// passed, a window of `shape.window` is measured: the proxy's CPU time at both ends, its RSS
/// five times within, and every event that arrives. Workers start no stream after the window
/// closes and the round ends when the last stream does.
pub(crate) async fn concurrent_round(
    way: &Arc<Way>,
    workload: &Workload,
    shape: &RoundShape,
    epoch: Instant,
    upstream: &Upstream,
    ours: &[u32],
    perf: Option<&PerfRequest>,
) -> (Concurrent, Vec<Result<Child, String>>) {
    let stream_length = workload.stream_length().max(Duration::from_millis(1));
    let stagger = stream_length / shape.streams as u32;
    let now = since(epoch);
    let window_start = now + (stream_length * 5 / 4).as_nanos() as u64;
    let window_end = window_start + shape.window.as_nanos() as u64;
    let window = (window_start, window_end);
    let accepted_before = upstream.accepted();
    let gap_limit = 2 * workload.interval.as_nanos() as u64;

    let mut workers = JoinSet::new();
    for worker in 0..shape.streams {
        let way = way.clone();
        let workload = workload.clone();
        let delay = stagger * worker as u32;
        workers.spawn(async move {
            tokio::time::sleep(delay).await;
            let mut tally = Concurrent::default();
            while since(epoch) < window_end {
                match stream_bounded(&way, &workload, epoch, window).await {
                    Ok(seen) => {
                        tally.events_in_window += seen.events_in_window;
                        tally.events += seen.events;
                        tally.bytes += seen.bytes;
                        if seen.sent_ns >= window_start && seen.ended_ns < window_end {
                            tally.streams += 1;
                            tally.gapped += usize::from(seen.max_gap_ns > gap_limit);
                            tally.ttft_ns.push(seen.ttft_ns);
                            tally.event_ns.extend(seen.event_ns);
                        }
                    }
                    Err(e) => {
                        tally.failures.push(e);
                        // A failing way must not spin; the next stream starts a pace later.
                        tokio::time::sleep(workload.interval).await;
                    }
                }
            }
            tally
        });
    }

    // The sampler: CPU ticks at the window's ends, RSS within it.
    let at = |ns: u64| epoch + Duration::from_nanos(ns);
    tokio::time::sleep_until(at(window_start)).await;
    let bench_pid = std::process::id();
    let tick_ns = 1_000_000_000 / procfs::clock_ticks_per_second();
    let proxy_before = way.pid.and_then(procfs::cpu_reading);
    let bench_before = procfs::cpu_reading(bench_pid);
    let machine_before = procfs::machine_ticks().zip(procfs::ticks_of(ours));
    let opened = Instant::now();
    let perf_children = match (perf, way.pid) {
        (Some(request), Some(pid)) => start_perf(request, pid, shape.window),
        _ => Vec::new(),
    };
    let mut max_rss: Option<u64> = None;
    for i in 1..=5u64 {
        tokio::time::sleep_until(at(window_start + (window_end - window_start) * i / 6)).await;
        if let Some(rss) = way.pid.and_then(procfs::rss_kib) {
            max_rss = Some(max_rss.map_or(rss, |m| m.max(rss)));
        }
    }
    tokio::time::sleep_until(at(window_end)).await;
    let proxy_after = way.pid.and_then(procfs::cpu_reading);
    let bench_after = procfs::cpu_reading(bench_pid);
    let machine_after = procfs::machine_ticks().zip(procfs::ticks_of(ours));
    let measured = opened.elapsed();

    let mut round = Concurrent {
        window_ns: measured.as_nanos() as u64,
        proxy_cpu_ns: proxy_before
            .as_ref()
            .zip(proxy_after.as_ref())
            .map(|(b, a)| procfs::cpu_ns_between(b, a, tick_ns)),
        exporter_cpu_ns: proxy_before
            .as_ref()
            .zip(proxy_after.as_ref())
            .and_then(|(b, a)| procfs::exporter_ns_between(b, a)),
        bench_cpu_ns: bench_before
            .zip(bench_after)
            .map(|(b, a)| procfs::cpu_ns_between(&b, &a, tick_ns)),
        max_rss_kib: max_rss,
        others: procfs::others_between(machine_before, machine_after),
        ..Concurrent::default()
    };
    while let Some(done) = workers.join_next().await {
        match done {
            Ok(worker) => round.absorb(worker),
            Err(e) => round.failures.push(format!("worker panicked: {e}")),
        }
    }
    round.rounds_cpu_per_1000.extend(round.proxy_cpu_per_1000());
    round.connections = upstream.accepted() - accepted_before;
    (round, perf_children)
}

impl Concurrent {
    /// Adds another round's or worker's figures to these.
    pub(crate) fn absorb(&mut self, other: Concurrent) {
        let add = |a: Option<u64>, b: Option<u64>| match (a, b) {
            (Some(a), Some(b)) => Some(a + b),
            (a, None) => a,
            (None, b) => b,
        };
        self.window_ns += other.window_ns;
        self.events_in_window += other.events_in_window;
        self.proxy_cpu_ns = add(self.proxy_cpu_ns, other.proxy_cpu_ns);
        self.bench_cpu_ns = add(self.bench_cpu_ns, other.bench_cpu_ns);
        self.exporter_cpu_ns = add(self.exporter_cpu_ns, other.exporter_cpu_ns);
        self.max_rss_kib = self.max_rss_kib.max(other.max_rss_kib);
        self.others = match (self.others, other.others) {
            (Some((o, a)), Some((p, b))) => Some((o + p, a + b)),
            (mine, theirs) => mine.or(theirs),
        };
        self.streams += other.streams;
        self.gapped += other.gapped;
        self.rounds_cpu_per_1000.extend(other.rounds_cpu_per_1000);
        self.ttft_ns.extend(other.ttft_ns);
        self.event_ns.extend(other.event_ns);
        self.events += other.events;
        self.bytes += other.bytes;
        self.connections += other.connections;
        self.failures.extend(other.failures);
    }
}

/// Starts `perf record -g` and `perf stat` (syscalls, context switches) on `pid` for `length`;
/// the caller waits for both after the round.
fn start_perf(request: &PerfRequest, pid: u32, length: Duration) -> Vec<Result<Child, String>> {
    let seconds = format!("{:.3}", length.as_secs_f64());
    let record = Command::new("perf")
        .args(["record", "-g", "-q", "-o"])
        .arg(&request.record)
        .arg("-p")
        .arg(pid.to_string())
        .args(["--", "sleep", &seconds])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn();
    let stat = Command::new("perf")
        .args([
            "stat",
            "-x,",
            "-e",
            "raw_syscalls:sys_enter,context-switches",
            "-o",
        ])
        .arg(&request.stat)
        .arg("-p")
        .arg(pid.to_string())
        .args(["--", "sleep", &seconds])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn();
    [record, stat]
        .into_iter()
        .map(|r| r.map_err(|e| format!("cannot start perf: {e}")))
        .collect()
}

/// The counts in a `perf stat -x,` file, by event name.
pub(crate) fn perf_stat_counts(path: &std::path::Path) -> Vec<(String, u64)> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| {
            let fields: Vec<&str> = line.split(',').collect();
            let count = fields.first()?.trim().parse().ok()?;
            Some((fields.get(2)?.trim().to_string(), count))
        })
        .collect()
}
