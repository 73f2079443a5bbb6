//! What the proxy costs a stream, measured end to end: `cargo bench --bench overhead`.
//!
//! One run streams the same load straight to an in-process upstream and through the real
//! `tokenmeter` binary (a child process, so its CPU time and RSS are its own), alternating the
//! two ways round by round so both see the same machine, at 1 and at 256 concurrent streams, all
//! on loopback. The upstream streams OpenAI chat chunks the way vLLM does and writes into each
//! token the moment it handed that frame to hyper; the client notes when the frame arrives, so
//! per-event latency needs no clock but this process's. It prints a Markdown table for the
//! README (added TTFT and per-event latency at p50 and p99, proxy CPU time per 1,000 events, proxy
//! RSS) with the raw percentiles, the run's parameters and the targets. It measures and reports;
//! it fails nothing.
//!
//! Knobs, all optional: `--quick` or `TOKENMETER_BENCH_QUICK=1` (a smoke run of a few seconds),
//! `TOKENMETER_BENCH_STREAMS=1,64,256`, `TOKENMETER_BENCH_EVENTS=64` (tokens per stream),
//! `TOKENMETER_BENCH_INTERVAL_US` (one token gap for every level), and
//! `TOKENMETER_BENCH_RELAY=1`, which adds a third way through a bare TCP relay process to show
//! how much of the added latency any extra process on the path costs.

use std::convert::Infallible;
use std::future::Future;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::pin::Pin;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderValue, CACHE_CONTROL, CONTENT_TYPE};
use http::{Method, Request, Response, StatusCode, Uri};
use http_body_util::{BodyExt, Either, Full};
use hyper::body::{Body, Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use memchr::memmem;
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio::time::{Instant, Sleep};

const TARGET_TTFT_P99_NS: f64 = 100_000.0;
const TARGET_EVENT_P99_NS: f64 = 5_000.0;
const TARGET_IDLE_RSS_KIB: u64 = 32 * 1024;

/// The key under which the upstream writes its send time into each token chunk.
const SENT_KEY: &[u8] = b"\"sent_ns\":";

/// SSE events per stream besides the tokens: role, finish, usage and `[DONE]`.
const FRAMING_EVENTS: usize = 4;

/// The request every stream sends, as an OpenAI client asking for usage would.
const REQUEST_BODY: &[u8] = br#"{"model":"bench","messages":[{"role":"user","content":"Tell me a story."}],"stream":true,"stream_options":{"include_usage":true},"max_tokens":64}"#;

fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--relay-for") {
        return relay_main(args.get(i + 1));
    }
    let params = Params::from_env();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return fail(&format!("cannot start the runtime: {e}")),
    };
    let started = Instant::now();
    // One epoch for the upstream's send stamps and the clients' arrival stamps.
    let epoch = Instant::now();
    let upstream = match runtime.block_on(Upstream::start(epoch, params.events)) {
        Ok(upstream) => upstream,
        Err(e) => return fail(&e),
    };
    // Blocking on the child's stderr is fine here: the upstream runs on the runtime's workers.
    let proxy = match ProxyProcess::spawn(upstream.addr) {
        Ok(proxy) => proxy,
        Err(e) => return fail(&e),
    };
    let relay = if std::env::var("TOKENMETER_BENCH_RELAY").is_ok_and(|v| !v.is_empty() && v != "0")
    {
        match RelayProcess::spawn(upstream.addr) {
            Ok(relay) => Some(relay),
            Err(e) => return fail(&e),
        }
    } else {
        None
    };
    let reports = runtime.block_on(run(&params, epoch, &upstream, &proxy, relay.as_ref()));
    print_report(
        &params,
        &reports,
        &proxy,
        relay.is_some(),
        started.elapsed(),
    );
    std::process::ExitCode::SUCCESS
}

fn fail(message: &str) -> std::process::ExitCode {
    eprintln!("overhead bench: {message}");
    std::process::ExitCode::FAILURE
}

/// What one run does; the defaults take one to two minutes on two cores.
struct Params {
    /// Token chunks per stream.
    events: usize,
    levels: Vec<Level>,
    quick: bool,
}

/// The most tokens per second the upstream streams in all, unless an interval is given: about
/// what one busy GPU server produces. 256 streams 2 ms apart would be 128,000 a second, which
/// saturates a two-core machine by itself and measures the machine instead of the proxy.
const AGGREGATE_TOKENS_PER_SECOND: u64 = 12_800;

/// One concurrency level and how many rounds of each way it runs.
struct Level {
    streams: usize,
    /// The gap between one stream's tokens, as a model server's decode step spaces them.
    interval: Duration,
    warmup_rounds: usize,
    rounds: usize,
    /// Streams each worker runs back to back in one round.
    per_worker: usize,
    /// Streams at each end of a worker's round that are not counted: the first runs while the
    /// others are still starting and the last while they finish, so neither sees `streams`
    /// concurrent streams.
    ramp: usize,
}

impl Level {
    fn stream_duration(&self, events: usize) -> Duration {
        self.interval * events as u32
    }
}

impl Params {
    fn from_env() -> Params {
        let quick = std::env::args().any(|a| a == "--quick")
            || std::env::var("TOKENMETER_BENCH_QUICK").is_ok_and(|v| !v.is_empty() && v != "0");
        let number = |name: &str| -> Option<u64> {
            let text = std::env::var(name).ok()?;
            let parsed = text.trim().parse().ok();
            if parsed.is_none() {
                eprintln!("overhead bench: ignoring {name}={text}: not a whole number");
            }
            parsed
        };
        // The quick run halves the streams' length as well as their number.
        let events = number("TOKENMETER_BENCH_EVENTS")
            .unwrap_or(if quick { 32 } else { 64 })
            .max(1) as usize;
        let fixed_interval = number("TOKENMETER_BENCH_INTERVAL_US").map(|us| us.max(1));
        let streams: Vec<usize> = std::env::var("TOKENMETER_BENCH_STREAMS")
            .ok()
            .map(|text| {
                text.split(',')
                    .filter_map(|s| s.trim().parse().ok())
                    .filter(|&n| n > 0)
                    .collect()
            })
            .filter(|v: &Vec<usize>| !v.is_empty())
            .unwrap_or_else(|| vec![1, 256]);
        let levels = streams
            .into_iter()
            .map(|streams| {
                let interval = Duration::from_micros(fixed_interval.unwrap_or_else(|| {
                    (streams as u64 * 1_000_000 / AGGREGATE_TOKENS_PER_SECOND).max(2_000)
                }));
                let (warmup_rounds, rounds, per_worker, ramp) = match (streams, quick) {
                    // A single stream overlaps no other, so every one counts and each round is
                    // one stream: the ways alternate as finely as they can.
                    (1, false) => (5, 200, 1, 0),
                    (1, true) => (2, 20, 1, 0),
                    // Each worker's first stream (not counted) opens its connections, so the
                    // quick run needs no warm-up round.
                    (_, false) => (1, 3, 4, 1),
                    (_, true) => (0, 1, 3, 1),
                };
                Level {
                    streams,
                    interval,
                    warmup_rounds,
                    rounds,
                    per_worker,
                    ramp,
                }
            })
            .collect();
        Params {
            events,
            levels,
            quick,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The upstream: a vLLM-shaped chat completions endpoint.

/// The running upstream: where it listens, the token interval it streams at (set per level),
/// and how many connections it has accepted, so that a way that keeps reconnecting shows.
struct Upstream {
    addr: SocketAddr,
    interval_us: Arc<AtomicU64>,
    accepted: Arc<AtomicU64>,
}

impl Upstream {
    /// Serves `POST /v1/chat/completions` on 127.0.0.1:0 over HTTP/1.1, each response a
    /// [`TokenStream`] of `events` tokens.
    async fn start(epoch: Instant, events: usize) -> Result<Upstream, String> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| format!("cannot bind the upstream: {e}"))?;
        let addr = listener
            .local_addr()
            .map_err(|e| format!("upstream address: {e}"))?;
        let interval_us = Arc::new(AtomicU64::new(2_000));
        let accepted = Arc::new(AtomicU64::new(0));
        let (interval, count) = (interval_us.clone(), accepted.clone());
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                count.fetch_add(1, Ordering::Relaxed);
                // Each token must leave as its own segment, as it does from a real model server.
                let _ = stream.set_nodelay(true);
                let interval = interval.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |request: Request<Incoming>| {
                        let gap = Duration::from_micros(interval.load(Ordering::Relaxed));
                        answer(request, epoch, events, gap)
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .timer(TokioTimer::new())
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Ok(Upstream {
            addr,
            interval_us,
            accepted,
        })
    }

    fn accepted(&self) -> u64 {
        self.accepted.load(Ordering::Relaxed)
    }
}

type UpstreamBody = Either<TokenStream, Full<Bytes>>;

async fn answer(
    request: Request<Incoming>,
    epoch: Instant,
    events: usize,
    interval: Duration,
) -> Result<Response<UpstreamBody>, Infallible> {
    if request.method() != Method::POST || request.uri().path() != "/v1/chat/completions" {
        return Ok(plain(StatusCode::NOT_FOUND));
    }
    // A model server reads the whole request before it answers.
    if request.into_body().collect().await.is_err() {
        return Ok(plain(StatusCode::BAD_REQUEST));
    }
    let mut response = Response::new(Either::Left(TokenStream::new(epoch, events, interval)));
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    Ok(response)
}

fn plain(status: StatusCode) -> Response<UpstreamBody> {
    let mut response = Response::new(Either::Right(Full::new(Bytes::new())));
    *response.status_mut() = status;
    response
}

/// A chat completion stream as vLLM sends it: a role chunk, then one chunk per token, a finish
/// chunk, a usage chunk and `data: [DONE]`, each chunk its own body frame.
///
/// The first token follows the role chunk at once (prefill costs nothing here), so TTFT holds no
/// timer jitter, only the two ways. Each later token waits `interval` after the one before it,
/// so tokens leave in separate writes. Every token carries the time it was handed to hyper.
struct TokenStream {
    epoch: Instant,
    tokens: usize,
    interval: Duration,
    next: Next,
    due: Pin<Box<Sleep>>,
}

#[derive(Clone, Copy)]
enum Next {
    Role,
    Token(usize),
    Finish,
    Usage,
    Done,
    End,
}

impl TokenStream {
    fn new(epoch: Instant, tokens: usize, interval: Duration) -> Self {
        TokenStream {
            epoch,
            tokens,
            interval,
            next: Next::Role,
            due: Box::pin(tokio::time::sleep(Duration::ZERO)),
        }
    }
}

impl Body for TokenStream {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = self.get_mut();
        let chunk = match this.next {
            Next::Role => {
                this.next = Next::Token(0);
                Bytes::from_static(b"data: {\"id\":\"chatcmpl-bench\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,\"model\":\"bench\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"logprobs\":null,\"finish_reason\":null}]}\n\n")
            }
            Next::Token(i) => {
                if i > 0 {
                    ready!(this.due.as_mut().poll(cx));
                }
                // Stamped when ready, never on Pending: this is the frame hyper writes next.
                let now = Instant::now();
                // The next token is due one interval after this one was due, not after it was
                // sent: tokio's timer fires up to a millisecond late, and that lateness must not
                // pile up into a slower stream. One that fell a whole interval behind restarts.
                let on_schedule = this.due.deadline() + this.interval;
                let next = if i > 0 && on_schedule > now {
                    on_schedule
                } else {
                    now + this.interval
                };
                this.due.as_mut().reset(next);
                this.next = if i + 1 == this.tokens {
                    Next::Finish
                } else {
                    Next::Token(i + 1)
                };
                Bytes::from(format!(
                    "data: {{\"id\":\"chatcmpl-bench\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,\"model\":\"bench\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\" tok{i}\"}},\"logprobs\":null,\"finish_reason\":null}}],\"sent_ns\":{}}}\n\n",
                    (now - this.epoch).as_nanos()
                ))
            }
            Next::Finish => {
                this.next = Next::Usage;
                Bytes::from_static(b"data: {\"id\":\"chatcmpl-bench\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,\"model\":\"bench\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"\"},\"logprobs\":null,\"finish_reason\":\"stop\",\"stop_reason\":null}]}\n\n")
            }
            Next::Usage => {
                this.next = Next::Done;
                Bytes::from(format!(
                    "data: {{\"id\":\"chatcmpl-bench\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,\"model\":\"bench\",\"choices\":[],\"usage\":{{\"prompt_tokens\":12,\"total_tokens\":{},\"completion_tokens\":{}}}}}\n\n",
                    12 + this.tokens,
                    this.tokens
                ))
            }
            Next::Done => {
                this.next = Next::End;
                Bytes::from_static(b"data: [DONE]\n\n")
            }
            Next::End => return Poll::Ready(None),
        };
        Poll::Ready(Some(Ok(Frame::data(chunk))))
    }

    fn is_end_stream(&self) -> bool {
        matches!(self.next, Next::End)
    }
}

// ---------------------------------------------------------------------------------------------
// The proxy: the release binary in a child process.

/// The running `tokenmeter` binary; killed when dropped, so a panic cannot leave it behind.
struct ProxyProcess {
    child: Child,
    listen: SocketAddr,
    /// Warnings and errors it logged; a healthy run has none.
    complaints: Arc<Mutex<Vec<String>>>,
    idle_rss_kib: Option<u64>,
}

impl ProxyProcess {
    fn spawn(upstream: SocketAddr) -> Result<ProxyProcess, String> {
        let mut child = Command::new(env!("CARGO_BIN_EXE_tokenmeter"))
            .args(["--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"])
            .arg("--upstream")
            .arg(format!("http://{upstream}"))
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", env!("CARGO_BIN_EXE_tokenmeter")))?;
        let Some(stderr) = child.stderr.take() else {
            let _ = child.kill();
            return Err("the proxy's stderr was not piped".into());
        };
        let complaints = Arc::new(Mutex::new(Vec::new()));
        let (serving_tx, serving_rx) = mpsc::channel();
        let kept = complaints.clone();
        // Reads stderr to the end so the pipe never fills and blocks the proxy's logging.
        std::thread::spawn(move || {
            let mut before_serving = Vec::new();
            let mut serving = Some(serving_tx);
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if serving.is_some() && line.contains("tokenmeter is serving") {
                    if let Some(tx) = serving.take() {
                        let _ = tx.send(Ok(line));
                    }
                    continue;
                }
                if serving.is_some() {
                    before_serving.push(line);
                } else if line.contains("WARN") || line.contains("ERROR") {
                    if let Ok(mut kept) = kept.lock() {
                        if kept.len() < 20 {
                            kept.push(line);
                        }
                    }
                }
            }
            if let Some(tx) = serving {
                let _ = tx.send(Err(before_serving.join("\n")));
            }
        });
        let mut proxy = ProxyProcess {
            child,
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            complaints,
            idle_rss_kib: None,
        };
        let line = match serving_rx.recv_timeout(Duration::from_secs(30)) {
            Ok(Ok(line)) => line,
            Ok(Err(output)) => return Err(format!("the proxy exited before serving:\n{output}")),
            Err(_) => return Err("the proxy did not say it was serving within 30 s".into()),
        };
        proxy.listen = line
            .split_whitespace()
            .find_map(|field| field.strip_prefix("listen="))
            .and_then(|addr| addr.parse().ok())
            .ok_or_else(|| format!("no listen=ADDR in the proxy's line: {line}"))?;
        // Let start-up allocations settle before calling what is left idle.
        std::thread::sleep(Duration::from_millis(200));
        proxy.idle_rss_kib = proc_status_kib(proxy.pid(), "VmRSS:");
        Ok(proxy)
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for ProxyProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A bare TCP relay in a process of its own (this executable, run with `--relay-for ADDR`): the
/// cost of one more process and two more loopback sockets on the path, without HTTP. Put in
/// place of the proxy, it tells how much of the added latency is the hop and how much is
/// tokenmeter. Only with `TOKENMETER_BENCH_RELAY=1`.
struct RelayProcess {
    child: Child,
    listen: SocketAddr,
}

impl RelayProcess {
    fn spawn(upstream: SocketAddr) -> Result<RelayProcess, String> {
        let exe = std::env::current_exe().map_err(|e| format!("cannot find this bench: {e}"))?;
        let mut child = Command::new(exe)
            .arg("--relay-for")
            .arg(upstream.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot start the relay: {e}"))?;
        let mut line = String::new();
        if let Some(stdout) = child.stdout.take() {
            let _ = BufReader::new(stdout).read_line(&mut line);
        }
        let mut relay = RelayProcess {
            child,
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        };
        relay.listen = line
            .trim()
            .strip_prefix("listen=")
            .and_then(|addr| addr.parse().ok())
            .ok_or_else(|| format!("the relay did not say where it listens: {line:?}"))?;
        Ok(relay)
    }
}

impl Drop for RelayProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The relay's own `main`: accept, connect upstream, copy both ways until either side closes.
/// It uses tokio's default multi-threaded runtime, as tokenmeter does.
fn relay_main(upstream: Option<&String>) -> std::process::ExitCode {
    let Some(upstream) = upstream.and_then(|a| a.parse::<SocketAddr>().ok()) else {
        return fail("--relay-for needs the upstream's ADDR");
    };
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => return fail(&format!("relay runtime: {e}")),
    };
    runtime.block_on(async move {
        let listener = match TcpListener::bind("127.0.0.1:0").await {
            Ok(l) => l,
            Err(e) => return fail(&format!("relay bind: {e}")),
        };
        match listener.local_addr() {
            Ok(addr) => println!("listen={addr}"),
            Err(e) => return fail(&format!("relay address: {e}")),
        }
        loop {
            let Ok((mut inbound, _)) = listener.accept().await else {
                continue;
            };
            let _ = inbound.set_nodelay(true);
            tokio::spawn(async move {
                let Ok(mut outbound) = tokio::net::TcpStream::connect(upstream).await else {
                    return;
                };
                let _ = outbound.set_nodelay(true);
                let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
            });
        }
    })
}

/// User plus system CPU time of `pid`, in clock ticks (Linux `/proc`; `None` elsewhere).
fn cpu_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces and parentheses; the fields proper follow the last `)`,
    // starting with field 3 (state), so utime (14) and stime (15) are the 12th and 13th.
    let mut fields = stat
        .get(stat.rfind(')')? + 1..)?
        .split_whitespace()
        .skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(utime + stime)
}

/// Busy and total CPU ticks of the whole machine, all cores, from `/proc/stat`. Busy is user,
/// nice and system time plus what the hypervisor stole; interrupt time is left out because the
/// kernel spends it on this run's own loopback traffic without charging any process for it.
fn machine_ticks() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let fields: Vec<u64> = stat
        .lines()
        .next()?
        .strip_prefix("cpu ")?
        .split_whitespace()
        .filter_map(|f| f.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal (guest time is inside user already)
    let [user, nice, system, idle, iowait, irq, softirq, steal, ..] = fields[..] else {
        return None;
    };
    let busy = user + nice + system + steal;
    Some((busy, busy + idle + iowait + irq + softirq))
}

/// A `kB` line of `/proc/<pid>/status`, such as `VmRSS:` or `VmHWM:`.
fn proc_status_kib(pid: u32, key: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|line| line.strip_prefix(key))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|kib| kib.parse().ok())
}

/// Clock ticks per second, from `getconf CLK_TCK`; 100 (every Linux build) if that fails.
fn clock_ticks_per_second() -> u64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|out| String::from_utf8(out.stdout).ok())
        .and_then(|text| text.trim().parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(100)
}

/// The soft and hard limits on open files of this process, from `/proc/self/limits`.
fn open_files_limits() -> Option<(u64, u64)> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    let mut fields = line.split_whitespace().skip(3);
    let soft = fields.next()?.parse().ok()?;
    // "unlimited" is as good as any number here.
    let hard = fields.next()?.parse().unwrap_or(u64::MAX);
    Some((soft, hard))
}

/// Makes room for `needed` open files, raising the soft limit towards the hard one if it must.
/// Many desktops start at a soft limit of 1,024, too few for 256 streams on two pooled ways;
/// `prlimit` (util-linux) raises it without `unsafe`. Returns the error to report otherwise.
fn ensure_open_files(needed: u64) -> Result<(), String> {
    let Some((soft, hard)) = open_files_limits() else {
        return Ok(());
    };
    if soft >= needed {
        return Ok(());
    }
    let wanted = needed.next_power_of_two().min(hard);
    let _ = Command::new("prlimit")
        .arg("--pid")
        .arg(std::process::id().to_string())
        .arg(format!("--nofile={wanted}:"))
        .status();
    match open_files_limits() {
        Some((soft, _)) if soft >= needed => Ok(()),
        Some((soft, _)) => Err(format!(
            "needs about {needed} open files and the limit is {soft}; raise it with `ulimit -n {}`",
            needed.next_power_of_two()
        )),
        None => Ok(()),
    }
}

// ---------------------------------------------------------------------------------------------
// The clients.

type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// One way to the upstream: straight, through the proxy or through the relay. Each has its own
/// connection pool, warmed before anything is counted.
struct Target {
    client: HttpClient,
    uri: Uri,
}

impl Target {
    fn new(addr: SocketAddr) -> Target {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        Target {
            client: Client::builder(TokioExecutor::new()).build(connector),
            uri: format!("http://{addr}/v1/chat/completions")
                .parse()
                .expect("a socket address makes a valid URI"),
        }
    }
}

/// What one stream saw.
struct StreamSeen {
    /// From just before the request was sent to the arrival of the first token.
    ttft_ns: u64,
    /// For each token, its arrival minus the upstream's stamp.
    event_ns: Vec<u64>,
    /// Every SSE event received, tokens and framing alike.
    sse_events: u64,
}

/// Splits the received bytes into SSE events, whichever frames they arrive in: hyper hands on a
/// chunk in pieces if it arrived in pieces, and two events may share a frame.
struct EventSplitter {
    pending: Vec<u8>,
}

impl EventSplitter {
    /// Feeds one frame; calls `event` with the send stamp of each token it completes (`None` for
    /// the other events).
    fn feed(&mut self, frame: &[u8], mut event: impl FnMut(Option<u64>)) {
        self.pending.extend_from_slice(frame);
        let mut start = 0;
        while let Some(end) = memmem::find(&self.pending[start..], b"\n\n") {
            let text = &self.pending[start..start + end];
            event(sent_stamp(text));
            start += end + 2;
        }
        self.pending.drain(..start);
    }
}

fn sent_stamp(event: &[u8]) -> Option<u64> {
    let at = memmem::find(event, SENT_KEY)? + SENT_KEY.len();
    let digits = &event[at..];
    let len = digits.iter().take_while(|b| b.is_ascii_digit()).count();
    std::str::from_utf8(&digits[..len]).ok()?.parse().ok()
}

fn since(epoch: Instant) -> u64 {
    epoch.elapsed().as_nanos() as u64
}

/// Sends one chat completion request to `target` and reads its stream to the end.
async fn stream_once(target: &Target, epoch: Instant, tokens: usize) -> Result<StreamSeen, String> {
    let request = Request::post(target.uri.clone())
        .header(CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from_static(REQUEST_BODY)))
        .map_err(|e| e.to_string())?;
    let sent = since(epoch);
    let response = target
        .client
        .request(request)
        .await
        .map_err(|e| format!("request failed: {e}"))?;
    if response.status() != StatusCode::OK {
        return Err(format!("status {}", response.status()));
    }
    let mut body = response.into_body();
    let mut splitter = EventSplitter {
        pending: Vec::with_capacity(512),
    };
    let mut seen = StreamSeen {
        ttft_ns: 0,
        event_ns: Vec::with_capacity(tokens),
        sse_events: 0,
    };
    let mut first_token = None;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| format!("body failed: {e}"))?;
        let arrived = since(epoch);
        let Ok(data) = frame.into_data() else {
            continue;
        };
        splitter.feed(&data, |stamp| {
            seen.sse_events += 1;
            if let Some(stamp) = stamp {
                first_token.get_or_insert(arrived);
                seen.event_ns.push(arrived.saturating_sub(stamp));
            }
        });
    }
    if seen.event_ns.len() != tokens {
        return Err(format!(
            "{} of {tokens} tokens arrived",
            seen.event_ns.len()
        ));
    }
    seen.ttft_ns = first_token.map_or(0, |t| t - sent);
    Ok(seen)
}

/// What one round of one way produced.
#[derive(Default)]
struct Tally {
    ttft_ns: Vec<u64>,
    /// TTFT split at the upstream's stamp on the first token: until it (the request reaching
    /// the upstream, and its answer starting) and after it (the first token coming back).
    request_leg_ns: Vec<u64>,
    first_token_leg_ns: Vec<u64>,
    event_ns: Vec<u64>,
    /// Streams counted (outside the ramp).
    streams: usize,
    /// SSE events received, counted or not: what the proxy forwarded.
    sse_events: u64,
    /// Connections the upstream accepted during the round; after warm-up, a way that reuses
    /// its connections opens none.
    connections: u64,
    failures: Vec<String>,
}

impl Tally {
    fn absorb(&mut self, other: Tally) {
        self.ttft_ns.extend(other.ttft_ns);
        self.request_leg_ns.extend(other.request_leg_ns);
        self.first_token_leg_ns.extend(other.first_token_leg_ns);
        self.event_ns.extend(other.event_ns);
        self.streams += other.streams;
        self.sse_events += other.sse_events;
        self.connections += other.connections;
        self.failures.extend(other.failures);
    }
}

/// One round: `level.streams` workers, their starts spread evenly over one stream's length so
/// that the streams overlap as steady traffic would rather than arriving in one burst, each
/// running `level.per_worker` streams back to back.
async fn round(target: &Arc<Target>, level: &Level, params: &Params, epoch: Instant) -> Tally {
    let stagger = level.stream_duration(params.events) / level.streams as u32;
    let mut workers = JoinSet::new();
    for worker in 0..level.streams {
        let target = target.clone();
        let (per_worker, ramp, tokens) = (level.per_worker, level.ramp, params.events);
        let delay = stagger * worker as u32;
        workers.spawn(async move {
            tokio::time::sleep(delay).await;
            let mut tally = Tally::default();
            for i in 0..per_worker {
                let counted = i >= ramp && i + ramp < per_worker;
                let attempt = tokio::time::timeout(
                    Duration::from_secs(60),
                    stream_once(&target, epoch, tokens),
                )
                .await;
                match attempt {
                    Ok(Ok(seen)) => {
                        tally.sse_events += seen.sse_events;
                        if counted {
                            tally.streams += 1;
                            tally.ttft_ns.push(seen.ttft_ns);
                            let first = seen.event_ns.first().copied().unwrap_or(0);
                            tally
                                .request_leg_ns
                                .push(seen.ttft_ns.saturating_sub(first));
                            tally.first_token_leg_ns.push(first);
                            tally.event_ns.extend(seen.event_ns);
                        }
                    }
                    Ok(Err(e)) => tally.failures.push(e),
                    Err(_) => tally.failures.push("no end within 60 s".into()),
                }
            }
            tally
        });
    }
    let mut tally = Tally::default();
    while let Some(done) = workers.join_next().await {
        match done {
            Ok(worker) => tally.absorb(worker),
            Err(e) => tally.failures.push(format!("worker panicked: {e}")),
        }
    }
    tally
}

// ---------------------------------------------------------------------------------------------
// The run.

/// One way to the upstream, with the process (if any) it passes through.
struct Way {
    target: Arc<Target>,
    /// The process whose CPU time the way's rounds are charged: the proxy or the relay.
    pid: Option<u32>,
}

/// What one way produced at one level.
#[derive(Default)]
struct WayReport {
    tally: Tally,
    /// CPU ticks of the way's process during its counted rounds, and the SSE events it forwarded
    /// in them (ramp streams included: it forwarded those too).
    ticks: Option<u64>,
    events: u64,
}

impl WayReport {
    /// CPU time per 1,000 forwarded events, in nanoseconds.
    fn cpu_per_1000_ns(&self, tick_ns: f64) -> Option<f64> {
        let ticks = self.ticks?;
        (self.events > 0).then(|| ticks as f64 * tick_ns / self.events as f64 * 1000.0)
    }
}

/// Everything measured at one level.
struct LevelReport {
    streams: usize,
    /// Direct, proxied, and the relay if it ran, in that order.
    ways: Vec<WayReport>,
    peak_rss_kib: Option<u64>,
    rss_after_kib: Option<u64>,
    /// CPU ticks the rest of the machine took during the level, and the ticks there were.
    others: Option<(u64, u64)>,
    skipped: Option<String>,
}

async fn run(
    params: &Params,
    epoch: Instant,
    upstream: &Upstream,
    proxy: &ProxyProcess,
    relay: Option<&RelayProcess>,
) -> Vec<LevelReport> {
    let mut ways = vec![
        Way {
            target: Arc::new(Target::new(upstream.addr)),
            pid: None,
        },
        Way {
            target: Arc::new(Target::new(proxy.listen)),
            pid: Some(proxy.pid()),
        },
    ];
    if let Some(relay) = relay {
        ways.push(Way {
            target: Arc::new(Target::new(relay.listen)),
            pid: Some(relay.child.id()),
        });
    }
    let mut reports = Vec::new();
    for level in &params.levels {
        let mut report = LevelReport {
            streams: level.streams,
            ways: ways.iter().map(|_| WayReport::default()).collect(),
            peak_rss_kib: None,
            rss_after_kib: None,
            others: None,
            skipped: None,
        };
        // Every pool stays open, and this process holds both ends of every connection to the
        // upstream: two descriptors per stream and way, and two more for each hop's upstream
        // side.
        if let Err(why) = ensure_open_files(4 * ways.len() as u64 * level.streams as u64 + 64) {
            report.skipped = Some(why);
            reports.push(report);
            continue;
        }
        upstream
            .interval_us
            .store(level.interval.as_micros() as u64, Ordering::Relaxed);
        eprintln!(
            "overhead bench: {} stream(s), tokens {} µs apart: {} warm-up and {} counted rounds per way",
            level.streams,
            level.interval.as_micros(),
            level.warmup_rounds,
            level.rounds
        );
        let ours = || {
            let pids = [
                Some(std::process::id()),
                Some(proxy.pid()),
                relay.map(|r| r.child.id()),
            ];
            pids.into_iter()
                .flatten()
                .map(cpu_ticks)
                .sum::<Option<u64>>()
        };
        let before = machine_ticks().zip(ours());
        // Warm-up opens the pools (the proxy's to the upstream too) and pages the code in.
        for _ in 0..level.warmup_rounds {
            for way in &ways {
                let _ = round(&way.target, level, params, epoch).await;
            }
        }
        for (way, out) in ways.iter().zip(&mut report.ways) {
            out.ticks = way.pid.map(|_| 0);
        }
        for _ in 0..level.rounds {
            for (way, out) in ways.iter().zip(&mut report.ways) {
                let before = way.pid.and_then(cpu_ticks);
                let accepted = upstream.accepted();
                let mut tally = round(&way.target, level, params, epoch).await;
                tally.connections = upstream.accepted() - accepted;
                let after = way.pid.and_then(cpu_ticks);
                out.ticks = match (out.ticks, before, after) {
                    (Some(sum), Some(b), Some(a)) => Some(sum + a.saturating_sub(b)),
                    _ => None,
                };
                out.events += tally.sse_events;
                out.tally.absorb(tally);
            }
        }
        report.others = match (before, machine_ticks().zip(ours())) {
            (Some(((busy0, all0), ours0)), Some(((busy1, all1), ours1))) => {
                Some(((busy1 - busy0).saturating_sub(ours1 - ours0), all1 - all0))
            }
            _ => None,
        };
        report.peak_rss_kib = proc_status_kib(proxy.pid(), "VmHWM:");
        report.rss_after_kib = proc_status_kib(proxy.pid(), "VmRSS:");
        reports.push(report);
    }
    reports
}

// ---------------------------------------------------------------------------------------------
// The report.

/// The p-th percentile with linear interpolation between the two nearest ranks (numpy's
/// default), over exact samples.
fn percentile(sorted: &[u64], p: f64) -> Option<f64> {
    let last = sorted.len().checked_sub(1)?;
    let rank = p / 100.0 * last as f64;
    let (lo, hi) = (rank.floor() as usize, rank.ceil() as usize);
    let (a, b) = (sorted[lo] as f64, sorted[hi] as f64);
    Some(a + (b - a) * (rank - lo as f64))
}

/// p50 and p99 of some samples, in nanoseconds.
#[derive(Clone, Copy)]
struct Pair {
    p50: f64,
    p99: f64,
}

impl Pair {
    fn of(samples: &[u64]) -> Option<Pair> {
        let mut sorted = samples.to_vec();
        sorted.sort_unstable();
        Some(Pair {
            p50: percentile(&sorted, 50.0)?,
            p99: percentile(&sorted, 99.0)?,
        })
    }

    /// What the way sampled in `a` adds over the one sampled in `base`, percentile by percentile.
    fn added(a: &[u64], base: &[u64]) -> Option<Pair> {
        let (a, base) = (Pair::of(a)?, Pair::of(base)?);
        Some(Pair {
            p50: a.p50 - base.p50,
            p99: a.p99 - base.p99,
        })
    }
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

fn human_opt(ns: Option<f64>) -> String {
    ns.map_or_else(|| "n/a".into(), human)
}

fn mib(kib: Option<u64>) -> String {
    kib.map_or_else(|| "n/a".into(), |k| format!("{:.1}", k as f64 / 1024.0))
}

fn verdict(met: bool) -> &'static str {
    if met {
        "met"
    } else {
        "MISSED"
    }
}

fn print_report(
    params: &Params,
    reports: &[LevelReport],
    proxy: &ProxyProcess,
    relayed: bool,
    took: Duration,
) {
    let tick_ns = 1e9 / clock_ticks_per_second() as f64;
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let measured = || reports.iter().filter(|r| r.skipped.is_none());
    let names = ["direct", "proxied", "relayed"];
    println!();
    println!("## Overhead (`cargo bench --bench overhead`)");
    println!();
    println!("| concurrent streams | added TTFT p50 | added TTFT p99 | added per-event p50 | added per-event p99 | proxy CPU per 1,000 events | proxy RSS idle / peak |");
    println!("|---|---|---|---|---|---|---|");
    for r in reports {
        if let Some(why) = &r.skipped {
            println!("| {} | skipped: {why} | | | | | |", r.streams);
            continue;
        }
        let (direct, proxied) = (&r.ways[0], &r.ways[1]);
        let ttft = Pair::added(&proxied.tally.ttft_ns, &direct.tally.ttft_ns);
        let event = Pair::added(&proxied.tally.event_ns, &direct.tally.event_ns);
        let cpu = proxied
            .cpu_per_1000_ns(tick_ns)
            .map_or_else(|| "n/a".into(), |ns| format!("{:.1} ms", ns / 1e6));
        println!(
            "| {} | {} | {} | {} | {} | {} | {} / {} MiB |",
            r.streams,
            human_opt(ttft.map(|p| p.p50)),
            human_opt(ttft.map(|p| p.p99)),
            human_opt(event.map(|p| p.p50)),
            human_opt(event.map(|p| p.p99)),
            cpu,
            mib(proxy.idle_rss_kib),
            mib(r.peak_rss_kib),
        );
    }
    for r in measured() {
        if let Some((others, all)) = r.others.filter(|(o, a)| *o * 20 > *a) {
            println!();
            println!(
                "**Not clean:** other processes took {:.0}% of the machine during the {}-stream level.",
                100.0 * others as f64 / all.max(1) as f64,
                r.streams
            );
        }
    }
    println!();
    println!("Added = proxied − direct, percentile by percentile. Raw percentiles:");
    println!();
    println!("| streams | way | streams counted | TTFT p50 | TTFT p99 | TTFT's request leg p50 | TTFT's first-token leg p50 | tokens counted | per-event p50 | per-event p99 | upstream connections opened | failed streams |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    for r in measured() {
        for (name, way) in names.iter().zip(&r.ways) {
            let ttft = Pair::of(&way.tally.ttft_ns);
            let event = Pair::of(&way.tally.event_ns);
            let p50 = |samples: &[u64]| human_opt(Pair::of(samples).map(|p| p.p50));
            println!(
                "| {} | {name} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                r.streams,
                way.tally.streams,
                human_opt(ttft.map(|p| p.p50)),
                human_opt(ttft.map(|p| p.p99)),
                p50(&way.tally.request_leg_ns),
                p50(&way.tally.first_token_leg_ns),
                way.tally.event_ns.len(),
                human_opt(event.map(|p| p.p50)),
                human_opt(event.map(|p| p.p99)),
                way.tally.connections,
                way.tally.failures.len(),
            );
        }
    }
    if relayed {
        println!();
        println!("For scale, a bare TCP relay process (tokio `copy_bidirectional`) in the proxy's place: what the hop alone adds over direct, and what tokenmeter adds over the bare hop:");
        println!();
        println!("| streams | relay adds TTFT p50 / p99 | relay adds per-event p50 / p99 | relay CPU per 1,000 events | tokenmeter over relay TTFT p50 / p99 | tokenmeter over relay per-event p50 / p99 |");
        println!("|---|---|---|---|---|---|");
        for r in measured() {
            let (direct, proxied, relay) = (&r.ways[0], &r.ways[1], &r.ways[2]);
            let pair = |p: Option<Pair>| {
                format!(
                    "{} / {}",
                    human_opt(p.map(|p| p.p50)),
                    human_opt(p.map(|p| p.p99))
                )
            };
            println!(
                "| {} | {} | {} | {} | {} | {} |",
                r.streams,
                pair(Pair::added(&relay.tally.ttft_ns, &direct.tally.ttft_ns)),
                pair(Pair::added(&relay.tally.event_ns, &direct.tally.event_ns)),
                relay
                    .cpu_per_1000_ns(tick_ns)
                    .map_or_else(|| "n/a".into(), |ns| format!("{:.1} ms", ns / 1e6)),
                pair(Pair::added(&proxied.tally.ttft_ns, &relay.tally.ttft_ns)),
                pair(Pair::added(&proxied.tally.event_ns, &relay.tally.event_ns)),
            );
        }
    }
    println!();
    println!("Targets (reported, not enforced):");
    for r in measured() {
        let (direct, proxied) = (&r.ways[0].tally, &r.ways[1].tally);
        let judge = |value: Option<f64>, target: f64| match value {
            Some(v) => format!("{} ({})", human(v), verdict(v <= target)),
            None => "n/a".into(),
        };
        println!(
            "- {} stream(s): added TTFT p99 ≤ 100 µs: {}; added per-event p99 ≤ 5 µs: {}",
            r.streams,
            judge(
                Pair::added(&proxied.ttft_ns, &direct.ttft_ns).map(|p| p.p99),
                TARGET_TTFT_P99_NS
            ),
            judge(
                Pair::added(&proxied.event_ns, &direct.event_ns).map(|p| p.p99),
                TARGET_EVENT_P99_NS
            ),
        );
    }
    match proxy.idle_rss_kib {
        Some(kib) => println!(
            "- proxy RSS idle ≤ 32 MiB: {} MiB ({})",
            mib(Some(kib)),
            verdict(kib <= TARGET_IDLE_RSS_KIB)
        ),
        None => println!("- proxy RSS idle ≤ 32 MiB: n/a (no /proc)"),
    }
    println!();
    println!("Run:");
    println!(
        "- {} tokens per stream, plus {FRAMING_EVENTS} more SSE events (role, finish, usage, [DONE]); the first token follows the role chunk at once, each later one waits the level's interval",
        params.events
    );
    for (level, r) in params.levels.iter().zip(reports) {
        if r.skipped.is_some() {
            continue;
        }
        let round = if level.streams == 1 && level.per_worker == 1 {
            "a round is one stream".to_string()
        } else {
            format!(
                "a round is {} workers each running {} streams back to back, their starts spread over one stream's length; each worker's first {} and last {} not counted (ramp)",
                level.streams, level.per_worker, level.ramp, level.ramp
            )
        };
        println!(
            "- {} stream(s), tokens {} µs apart: {} warm-up + {} counted rounds per way, alternating direct, proxied{} round by round; {round}",
            level.streams,
            level.interval.as_micros(),
            level.warmup_rounds,
            level.rounds,
            if relayed { ", relayed" } else { "" },
        );
        println!(
            "  proxy CPU: {} ticks of {:.0} ms over {} SSE events forwarded; proxy RSS after the level {} MiB",
            r.ways[1]
                .ticks
                .map_or_else(|| "n/a".into(), |t| t.to_string()),
            tick_ns / 1e6,
            r.ways[1].events,
            mib(r.rss_after_kib),
        );
    }
    println!(
        "- {cores} core(s) shared by the proxy, the upstream and the clients, all on loopback{}",
        if params.quick { "; QUICK run" } else { "" }
    );
    println!(
        "- CPU time is utime + stime from /proc/<pid>/stat; idle RSS is VmRSS before any load, peak is VmHWM after the level"
    );
    for r in measured() {
        if let Some((others, all)) = r.others {
            println!(
                "- other processes (and hypervisor steal) took {:.1} CPU-s of {:.1} during the {}-stream level ({:.1}%); the numbers are clean only when this is near 0",
                others as f64 * tick_ns / 1e9,
                all as f64 * tick_ns / 1e9,
                r.streams,
                100.0 * others as f64 / all.max(1) as f64
            );
        }
    }
    println!("- took {:.0} s", took.as_secs_f64());
    for r in reports {
        for (name, way) in names.iter().zip(&r.ways) {
            for failure in way.tally.failures.iter().take(5) {
                println!(
                    "- failed {name} stream at {} stream(s): {failure}",
                    r.streams
                );
            }
        }
    }
    if let Ok(complaints) = proxy.complaints.lock() {
        for line in complaints.iter() {
            println!("- proxy logged: {line}");
        }
    }
}
