//! Whether the proxy's memory stays put, over a long run and under hostile connections:
//! `cargo bench --bench soak`.
//!
//! Each phase starts the real `tokenmeter` binary afresh in a process of its own (so its RSS,
//! read from `/proc/PID/status`, and its CPU time are its own), configured as in production: a
//! JSONL record file, routes with SLOs, `/metrics` scraped while it runs. All load is on
//! 127.0.0.1 and every count and wait is bounded.
//!
//! - **soak**: short SSE streams (role, four tokens, finish, usage, `[DONE]`, each its own
//!   write) from a fast in-process upstream, sent by 64 keep-alive clients as fast as they go;
//!   RSS and the proxy's CPU time sampled every tenth of the run. Flat when every sample after
//!   the first (the warm-up) lies within max(10 %, 2 MiB) of the first. At the end the proxy is
//!   stopped with SIGTERM and the records are counted: one per request.
//! - **bursts**: 2,000 keep-alive connections open at once, each streams one request; then all
//!   close. RSS idle, with all open, once the proxy has closed them, and 15 s later; five times.
//! - **heads**: 500 connections each send 390 KB of a request head that never ends.
//! - **uploads**: 500 uploads of 8 MiB towards an upstream that accepts and never reads.
//!
//! The default run is the full one: 10^6 streams sampled every 10^5, 2,000 connections a burst,
//! 500 hostile connections; about three minutes on two cores. Knobs, all optional: `--quick` or
//! `TOKENMETER_BENCH_QUICK=1` (a smoke run of about a minute: 20,000 streams, 200 and 50
//! connections), `TOKENMETER_SOAK_REQUESTS=N` (a longer or shorter soak, sampled every N/10),
//! `TOKENMETER_SOAK_PHASES=soak,bursts,heads,uploads`, `TOKENMETER_SOAK_BINARY=PATH` to measure
//! another build of the proxy (one with another allocator, say) under the same load; by default
//! it measures this source's binary as `cargo build --release` builds it (`target/shipping`).

// The overhead bench's /proc readers, shared rather than copied (not every one is used here).
#[allow(dead_code)]
#[path = "overhead/procfs.rs"]
mod procfs;
#[path = "overhead/serving.rs"]
mod serving;
#[path = "overhead/shipping.rs"]
mod shipping;

use std::convert::Infallible;
use std::io::Read;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderValue, CACHE_CONTROL, CONTENT_TYPE, HOST};
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Either, Full};
use hyper::body::{Body, Frame, Incoming};
use hyper::client::conn::http1::SendRequest;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use memchr::memmem;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::{watch, Semaphore};
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::{timeout, Instant};

/// The request every stream sends, as an OpenAI client asking for usage would.
const REQUEST_BODY: &[u8] = br#"{"model":"meta-llama/Llama-3.1-8B-Instruct","messages":[{"role":"user","content":"Tell me a story."}],"stream":true,"stream_options":{"include_usage":true},"max_tokens":4}"#;

/// The upstream's answer, chunk by chunk: what vLLM sends for four tokens.
const CHUNKS: [&[u8]; 8] = [
    b"data: {\"id\":\"chatcmpl-soak\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,\"model\":\"bench\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"logprobs\":null,\"finish_reason\":null}]}\n\n",
    b"data: {\"id\":\"chatcmpl-soak\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,\"model\":\"bench\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Once\"},\"logprobs\":null,\"finish_reason\":null}]}\n\n",
    b"data: {\"id\":\"chatcmpl-soak\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,\"model\":\"bench\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\" upon\"},\"logprobs\":null,\"finish_reason\":null}]}\n\n",
    b"data: {\"id\":\"chatcmpl-soak\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,\"model\":\"bench\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\" a\"},\"logprobs\":null,\"finish_reason\":null}]}\n\n",
    b"data: {\"id\":\"chatcmpl-soak\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,\"model\":\"bench\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\" time\"},\"logprobs\":null,\"finish_reason\":null}]}\n\n",
    b"data: {\"id\":\"chatcmpl-soak\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,\"model\":\"bench\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"\"},\"logprobs\":null,\"finish_reason\":\"length\",\"stop_reason\":null}]}\n\n",
    b"data: {\"id\":\"chatcmpl-soak\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,\"model\":\"bench\",\"choices\":[],\"usage\":{\"prompt_tokens\":12,\"total_tokens\":16,\"completion_tokens\":4}}\n\n",
    b"data: [DONE]\n\n",
];

/// Bytes of one whole answer: what a client must receive, exactly, for its stream to count.
fn answer_bytes() -> usize {
    CHUNKS.iter().map(|c| c.len()).sum()
}

/// Connections being opened at once in a burst: more would overflow the listen backlog, and a
/// dropped SYN costs its client a second.
const CONNECTING_AT_ONCE: usize = 256;

/// The client side's send buffer on hostile connections: the kernel holds what a hostile client
/// has written but the proxy has not read, and 500 autotuned buffers of 4 MiB each would be 2 GB
/// of kernel memory measuring nothing about the proxy.
const HOSTILE_SEND_BUFFER: u32 = 64 << 10;

/// What each hostile head sends before stopping: the size the issue measured 200 MB with.
const HOSTILE_HEAD_BYTES: usize = 390_000;

/// The Content-Length of each stalled upload: far beyond anything the buffers on its way hold.
const UPLOAD_BYTES: usize = 8 << 20;

/// An upload piece that takes longer than this to be written has stalled.
const STALL: Duration = Duration::from_secs(1);

/// After a burst, RSS is read again this long after the proxy closed its connections: an
/// allocator that returns memory on a timer (jemalloc's decay is 10 s) has had its time.
const LATER: Duration = Duration::from_secs(15);

/// Flatness margin of the soak: every sample after the first within this share of the first...
const FLAT_FRACTION: f64 = 0.10;
/// ...or within this many KiB, whichever is larger (small processes move by a few pages).
const FLAT_KIB: u64 = 2 * 1024;

fn main() -> std::process::ExitCode {
    let params = match Params::from_env() {
        Ok(params) => params,
        Err(e) => return fail(&e),
    };
    let needed = (2 * params.burst_connections.max(params.hostile_connections) + 512) as u64;
    if let Err(why) = procfs::ensure_open_files(needed) {
        return fail(&why);
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return fail(&format!("cannot start the runtime: {e}")),
    };
    let workdir = match WorkDir::create() {
        Ok(dir) => dir,
        Err(e) => return fail(&e),
    };
    let load_before = procfs::load_average();
    let started = Instant::now();
    let report = runtime.block_on(run(&params, &workdir));
    let load_after = procfs::load_average();
    print_report(&params, &report, load_before, load_after, started.elapsed());
    std::process::ExitCode::SUCCESS
}

fn fail(message: &str) -> std::process::ExitCode {
    eprintln!("soak bench: {message}");
    std::process::ExitCode::FAILURE
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Phase {
    Soak,
    Bursts,
    Heads,
    Uploads,
}

impl Phase {
    const ALL: [Phase; 4] = [Phase::Soak, Phase::Bursts, Phase::Heads, Phase::Uploads];

    fn name(self) -> &'static str {
        match self {
            Phase::Soak => "soak",
            Phase::Bursts => "bursts",
            Phase::Heads => "heads",
            Phase::Uploads => "uploads",
        }
    }
}

/// What one run does.
struct Params {
    /// Streams the soak sends in all.
    requests: u64,
    /// RSS and CPU are sampled each time this many more streams have ended.
    sample_every: u64,
    /// Keep-alive clients of the soak, each with one connection and one stream at a time.
    clients: usize,
    /// Connections open at once in one burst, and how many bursts.
    burst_connections: usize,
    bursts: usize,
    /// Connections of each hostile phase.
    hostile_connections: usize,
    phases: Vec<Phase>,
    binary: PathBuf,
    quick: bool,
}

impl Params {
    fn from_env() -> Result<Params, String> {
        let flag = |arg: &str, env: &str| {
            std::env::args().any(|a| a == arg)
                || std::env::var(env).is_ok_and(|v| !v.is_empty() && v != "0")
        };
        let quick = flag("--quick", "TOKENMETER_BENCH_QUICK");
        let (requests, burst_connections, bursts, hostile_connections) = if quick {
            (20_000, 200, 2, 50)
        } else {
            (1_000_000, 2_000, 5, 500)
        };
        let requests = match std::env::var("TOKENMETER_SOAK_REQUESTS") {
            Ok(text) => match text.trim().parse::<u64>() {
                Ok(n) if n >= 10 => n,
                _ => {
                    return Err(format!(
                        "TOKENMETER_SOAK_REQUESTS={text}: a whole number, at least 10"
                    ))
                }
            },
            Err(_) => requests,
        };
        let phases = match std::env::var("TOKENMETER_SOAK_PHASES") {
            Ok(list) if !list.trim().is_empty() => {
                let mut phases = Vec::new();
                for name in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
                    match Phase::ALL.iter().find(|p| p.name() == name) {
                        Some(phase) => phases.push(*phase),
                        None => {
                            return Err(format!(
                                "TOKENMETER_SOAK_PHASES: no phase {name:?} (soak, bursts, heads, uploads)"
                            ))
                        }
                    }
                }
                phases
            }
            _ => Phase::ALL.to_vec(),
        };
        let binary = match std::env::var_os("TOKENMETER_SOAK_BINARY").filter(|p| !p.is_empty()) {
            Some(path) => PathBuf::from(path),
            None => shipping::binary()?,
        };
        Ok(Params {
            requests,
            sample_every: requests / 10,
            clients: 64,
            burst_connections,
            bursts,
            hostile_connections,
            phases,
            binary,
            quick,
        })
    }
}

/// A directory for the proxy's configuration and records, removed when dropped.
struct WorkDir {
    path: PathBuf,
}

impl WorkDir {
    fn create() -> Result<WorkDir, String> {
        let path = std::env::temp_dir().join(format!("tokenmeter-soak-{}", std::process::id()));
        std::fs::create_dir_all(&path)
            .map_err(|e| format!("cannot create {}: {e}", path.display()))?;
        Ok(WorkDir { path })
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

// ---------------------------------------------------------------------------------------------
// The upstreams.

/// Serves `POST /v1/chat/completions` on 127.0.0.1:0 over HTTP/1.1 with [`CHUNKS`], as fast as
/// it can.
async fn start_streaming_upstream() -> Result<SocketAddr, String> {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| format!("cannot bind the upstream: {e}"))?;
    let addr = listener
        .local_addr()
        .map_err(|e| format!("upstream address: {e}"))?;
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let _ = stream.set_nodelay(true);
            tokio::spawn(async move {
                let _ = hyper::server::conn::http1::Builder::new()
                    .timer(TokioTimer::new())
                    .serve_connection(TokioIo::new(stream), service_fn(answer))
                    .await;
            });
        }
    });
    Ok(addr)
}

type UpstreamBody = Either<Chunks, Full<Bytes>>;

async fn answer(request: Request<Incoming>) -> Result<Response<UpstreamBody>, Infallible> {
    if request.method() != Method::POST || request.uri().path() != "/v1/chat/completions" {
        let mut response = Response::new(Either::Right(Full::new(Bytes::new())));
        *response.status_mut() = StatusCode::NOT_FOUND;
        return Ok(response);
    }
    // A model server reads the whole request before it answers.
    let _ = request.into_body().collect().await;
    let mut response = Response::new(Either::Left(Chunks {
        next: 0,
        yielded: false,
    }));
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    Ok(response)
}

/// [`CHUNKS`] as body frames, yielding to the runtime once between two frames so that hyper
/// writes each on its own, as a model server's tokens leave: the proxy reads a stream of
/// events, not one block.
struct Chunks {
    next: usize,
    yielded: bool,
}

impl Body for Chunks {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = self.get_mut();
        let Some(chunk) = CHUNKS.get(this.next) else {
            return Poll::Ready(None);
        };
        if this.next > 0 && !this.yielded {
            this.yielded = true;
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        this.yielded = false;
        this.next += 1;
        Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(chunk)))))
    }

    fn is_end_stream(&self) -> bool {
        self.next >= CHUNKS.len()
    }
}

/// An upstream that accepts connections and never reads from them: uploads towards it stall
/// once the buffers on the way are full. Its connections close when the task is aborted.
async fn start_black_hole() -> Result<(SocketAddr, JoinHandle<()>), String> {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| format!("cannot bind the black hole: {e}"))?;
    let addr = listener
        .local_addr()
        .map_err(|e| format!("black hole address: {e}"))?;
    let task = tokio::spawn(async move {
        let mut held = Vec::new();
        loop {
            if let Ok((stream, _)) = listener.accept().await {
                held.push(stream);
            }
        }
    });
    Ok((addr, task))
}

// ---------------------------------------------------------------------------------------------
// The proxy: the release binary in a child process.

/// The running `tokenmeter`; killed when dropped, so a panic cannot leave it behind.
struct ProxyProcess {
    child: Child,
    listen: SocketAddr,
    admin: SocketAddr,
    /// The upstream it forwards to: its connections there are its pool, kept after a burst.
    upstream: SocketAddr,
    records: PathBuf,
    /// Warnings and errors it logged, the first 20.
    complaints: serving::Complaints,
    idle_rss_kib: Option<u64>,
    idle_fds: Option<usize>,
}

impl ProxyProcess {
    /// Starts `binary` in front of `upstream` with a production-like configuration: a JSONL
    /// record file, routes with SLOs, the connection cap derived from the fd limit.
    fn spawn(
        binary: &Path,
        upstream: SocketAddr,
        dir: &Path,
        name: &str,
    ) -> Result<ProxyProcess, String> {
        let records = dir.join(format!("{name}.jsonl"));
        let config = dir.join(format!("{name}.yaml"));
        let yaml = format!(
            "listen: 127.0.0.1:0\n\
             admin: 127.0.0.1:0\n\
             upstream: http://{upstream}\n\
             access_log:\n  path: {}\n  format: jsonl\n\
             routes:\n\
             \x20 - name: chat\n    match: {{path_prefix: /v1/chat/, methods: [POST]}}\n    slo: {{ttft: 300ms, tpot: 40ms, e2e: 8s, objective: 0.99}}\n\
             \x20 - name: default\n    slo: {{e2e: 30s, objective: 0.9}}\n",
            records.display()
        );
        std::fs::write(&config, yaml)
            .map_err(|e| format!("cannot write {}: {e}", config.display()))?;
        let mut child = Command::new(binary)
            .arg("--config")
            .arg(&config)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", binary.display()))?;
        let (line, complaints) = serving::await_serving(&mut child)?;
        let mut proxy = ProxyProcess {
            listen: serving::address(&line, "listen=")?,
            admin: serving::address(&line, "admin=")?,
            child,
            upstream,
            records,
            complaints,
            idle_rss_kib: None,
            idle_fds: None,
        };
        // Let start-up allocations settle before calling what is left idle.
        std::thread::sleep(Duration::from_millis(300));
        proxy.idle_rss_kib = procfs::status_kib(proxy.pid(), "VmRSS:");
        proxy.idle_fds = open_fds(proxy.pid());
        Ok(proxy)
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn rss_kib(&self) -> Option<u64> {
        procfs::status_kib(self.pid(), "VmRSS:")
    }

    fn peak_rss_kib(&self) -> Option<u64> {
        procfs::status_kib(self.pid(), "VmHWM:")
    }

    /// Waits until the proxy holds no more descriptors than when idle, besides its connections
    /// to the upstream (the pool it keeps for the next burst, up to its connection cap), and
    /// the count has stopped moving: the clients' connections of a phase are closed. Gives up
    /// after 30 s and says so.
    async fn settle(&self) -> Result<Duration, String> {
        let started = Instant::now();
        let allowed = self.idle_fds.unwrap_or(0) + 8;
        let mut last = None;
        loop {
            let now = open_fds(self.pid())
                .zip(upstream_connections(self.pid(), self.upstream))
                .map(|(fds, pooled)| fds.saturating_sub(pooled));
            if now.is_some_and(|n| n <= allowed) && now == last {
                return Ok(started.elapsed());
            }
            if started.elapsed() > Duration::from_secs(30) {
                return Err(format!(
                    "the proxy still held {} descriptors after 30 s (idle {})",
                    now.map_or_else(|| "?".into(), |n| n.to_string()),
                    self.idle_fds.unwrap_or(0)
                ));
            }
            last = now;
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// SIGTERM, as an orchestrator stops it, and waits for the exit (the proxy writes every
    /// queued record before it exits). Returns whether it exited cleanly within 40 s.
    fn stop(&mut self) -> Result<(), String> {
        let sent = Command::new("kill")
            .args(["-TERM", &self.pid().to_string()])
            .status()
            .map_err(|e| format!("cannot run kill: {e}"))?;
        if !sent.success() {
            return Err("kill -TERM failed".into());
        }
        let deadline = Instant::now() + Duration::from_secs(40);
        loop {
            match self.child.try_wait() {
                Ok(Some(status)) if status.success() => return Ok(()),
                Ok(Some(status)) => return Err(format!("the proxy exited with {status}")),
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(50));
                }
                Ok(None) => return Err("the proxy did not exit within 40 s of SIGTERM".into()),
                Err(e) => return Err(format!("waiting for the proxy: {e}")),
            }
        }
    }

    fn complaints(&self) -> Vec<String> {
        self.complaints.lines()
    }
}

impl Drop for ProxyProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// ---------------------------------------------------------------------------------------------
// /proc.

/// Open file descriptors of `pid`.
fn open_fds(pid: u32) -> Option<usize> {
    Some(std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count())
}

/// The process's TCP connections to `upstream` that still hold a descriptor (established, or
/// closed by the upstream and not yet by the process), from `/proc/PID/net/tcp`.
fn upstream_connections(pid: u32, upstream: SocketAddr) -> Option<usize> {
    let SocketAddr::V4(upstream) = upstream else {
        return None;
    };
    let remote = format!(
        "{:08X}:{:04X}",
        u32::from_le_bytes(upstream.ip().octets()),
        upstream.port()
    );
    let table = std::fs::read_to_string(format!("/proc/{pid}/net/tcp")).ok()?;
    Some(
        table
            .lines()
            .skip(1)
            .filter(|line| {
                let mut fields = line.split_whitespace().skip(2);
                fields.next() == Some(remote.as_str()) && matches!(fields.next(), Some("01" | "08"))
            })
            .count(),
    )
}

// ---------------------------------------------------------------------------------------------
// Clients.

type Sender = SendRequest<Full<Bytes>>;

/// One keep-alive HTTP/1.1 connection to `addr`; its connection task ends when the sender is
/// dropped, closing the socket.
async fn open(addr: SocketAddr) -> Result<(Sender, JoinHandle<()>), String> {
    let stream = TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let _ = stream.set_nodelay(true);
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    let task = tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok((sender, task))
}

/// Closes a connection opened by [`open`] and waits (briefly) for its socket to be closed.
async fn close((sender, task): (Sender, JoinHandle<()>)) {
    drop(sender);
    let abort = task.abort_handle();
    if timeout(Duration::from_secs(5), task).await.is_err() {
        abort.abort();
    }
}

/// One streamed chat completion on `sender`, read to its end; it counts only if the client got
/// every byte of the upstream's answer.
async fn stream_once(sender: &mut Sender, host: &HeaderValue) -> Result<(), String> {
    sender
        .ready()
        .await
        .map_err(|e| format!("connection: {e}"))?;
    let request = Request::post("/v1/chat/completions")
        .header(HOST, host)
        .header(CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from_static(REQUEST_BODY)))
        .map_err(|e| e.to_string())?;
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| format!("request: {e}"))?;
    if response.status() != StatusCode::OK {
        return Err(format!("status {}", response.status()));
    }
    let mut body = response.into_body();
    let mut received = 0;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| format!("body: {e}"))?;
        if let Ok(data) = frame.into_data() {
            received += data.len();
        }
    }
    if received != answer_bytes() {
        return Err(format!("{received} of {} bytes", answer_bytes()));
    }
    Ok(())
}

/// Failures of a phase: how many, and the first few messages.
#[derive(Default)]
struct Failures {
    count: u64,
    first: Vec<String>,
}

impl Failures {
    fn add(&mut self, message: String) {
        self.count += 1;
        if self.first.len() < 5 {
            self.first.push(message);
        }
    }
}

/// A GET of the proxy's `/metrics`, as Prometheus scrapes it; returns the exposition.
async fn scrape(admin: SocketAddr) -> Result<String, String> {
    let mut connection = open(admin).await?;
    let request = Request::get("/metrics")
        .header(HOST, admin.to_string())
        .body(Full::new(Bytes::new()))
        .map_err(|e| e.to_string())?;
    let result = async {
        let response = connection
            .0
            .send_request(request)
            .await
            .map_err(|e| format!("scrape: {e}"))?;
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| format!("scrape body: {e}"))?;
        String::from_utf8(body.to_bytes().to_vec()).map_err(|e| format!("scrape: {e}"))
    }
    .await;
    close(connection).await;
    result
}

/// The sum of a counter family over all its series in an exposition.
fn counter_sum(exposition: &str, family: &str) -> f64 {
    exposition
        .lines()
        .filter(|line| {
            line.strip_prefix(family)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

// ---------------------------------------------------------------------------------------------
// The soak.

/// The proxy's state after a number of streams.
struct Sample {
    requests: u64,
    at: Duration,
    rss_kib: Option<u64>,
    /// The proxy's CPU ticks so far.
    proxy_ticks: Option<u64>,
    /// This process's CPU ticks so far (the clients and the upstream).
    bench_ticks: Option<u64>,
    machine: Option<(u64, u64)>,
}

impl Sample {
    fn take(pid: u32, requests: u64, started: Instant) -> Sample {
        Sample {
            requests,
            at: started.elapsed(),
            rss_kib: procfs::status_kib(pid, "VmRSS:"),
            proxy_ticks: procfs::cpu_ticks(pid),
            bench_ticks: procfs::cpu_ticks(std::process::id()),
            machine: procfs::machine_ticks(),
        }
    }
}

#[derive(Default)]
struct SoakReport {
    /// At the start (0 streams), then every `sample_every` streams.
    samples: Vec<Sample>,
    peak_rss_kib: Option<u64>,
    failures: Failures,
    scrapes: u64,
    requests_counted: Option<f64>,
    records: Option<(u64, u64)>,
    stopped: Option<Result<(), String>>,
    complaints: Vec<String>,
}

async fn soak(params: &Params, dir: &Path) -> Result<SoakReport, String> {
    let upstream = start_streaming_upstream().await?;
    let mut proxy = ProxyProcess::spawn(&params.binary, upstream, dir, "soak")?;
    let pid = proxy.pid();
    let host = HeaderValue::from_str(&proxy.listen.to_string()).map_err(|e| e.to_string())?;
    let mut report = SoakReport::default();
    eprintln!(
        "soak bench: soak: {} streams from {} keep-alive clients, sampled every {}",
        params.requests, params.clients, params.sample_every
    );
    let started = Instant::now();
    let issued = Arc::new(AtomicU64::new(0));
    let ended = Arc::new(AtomicU64::new(0));
    let (samples_tx, samples_rx) = mpsc::channel();
    let _ = samples_tx.send(Sample::take(pid, 0, started));
    // A scrape every 5 s, a little more often than Prometheus' usual 15 s: rendering the
    // exposition is part of the production load.
    let (stop_scraping, mut scraping_stopped) = watch::channel(false);
    let admin = proxy.admin;
    let scraper = tokio::spawn(async move {
        let mut scrapes = 0u64;
        loop {
            if scrape(admin).await.is_ok() {
                scrapes += 1;
            }
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_secs(5)) => {}
                _ = scraping_stopped.changed() => return scrapes,
            }
        }
    });
    let mut clients = JoinSet::new();
    for _ in 0..params.clients {
        let (issued, ended, samples_tx, host) = (
            issued.clone(),
            ended.clone(),
            samples_tx.clone(),
            host.clone(),
        );
        let (listen, total, every) = (proxy.listen, params.requests, params.sample_every);
        clients.spawn(async move {
            let mut failures = Failures::default();
            let mut connection = None;
            while issued.fetch_add(1, Ordering::Relaxed) < total {
                let attempt = async {
                    let sender = match &mut connection {
                        Some((sender, _)) => sender,
                        None => &mut connection.insert(open(listen).await?).0,
                    };
                    stream_once(sender, &host).await
                };
                match timeout(Duration::from_secs(30), attempt).await {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => {
                        failures.add(e);
                        connection = None;
                    }
                    Err(_) => {
                        failures.add("no end within 30 s".into());
                        connection = None;
                    }
                }
                let n = ended.fetch_add(1, Ordering::Relaxed) + 1;
                if n % every == 0 {
                    let _ = samples_tx.send(Sample::take(pid, n, started));
                    eprintln!(
                        "soak bench: soak: {n} streams in {:.0} s",
                        started.elapsed().as_secs_f64()
                    );
                }
            }
            if let Some(connection) = connection {
                close(connection).await;
            }
            failures
        });
    }
    while let Some(done) = clients.join_next().await {
        match done {
            Ok(failures) => {
                report.failures.count += failures.count;
                for message in failures.first {
                    if report.failures.first.len() < 5 {
                        report.failures.first.push(message);
                    }
                }
            }
            Err(e) => report.failures.add(format!("client panicked: {e}")),
        }
    }
    drop(samples_tx);
    report.samples = samples_rx.try_iter().collect();
    report.samples.sort_by_key(|s| s.requests);
    report.peak_rss_kib = proxy.peak_rss_kib();
    let _ = stop_scraping.send(true);
    report.scrapes = scraper.await.unwrap_or(0);
    report.requests_counted = scrape(proxy.admin)
        .await
        .ok()
        .map(|text| counter_sum(&text, "tokenmeter_requests_total"));
    report.stopped = Some(proxy.stop());
    report.records = count_records(&proxy.records);
    report.complaints = proxy.complaints();
    Ok(report)
}

/// Lines in the record file, and how many of them say `"outcome":"ok"`.
fn count_records(path: &Path) -> Option<(u64, u64)> {
    let mut file = std::fs::File::open(path).ok()?;
    let mut buffer = vec![0; 1 << 20];
    let mut carry = Vec::new();
    let (mut lines, mut ok) = (0u64, 0u64);
    let ok_field = memmem::Finder::new(b"\"outcome\":\"ok\"");
    loop {
        let n = file.read(&mut buffer).ok()?;
        if n == 0 {
            break;
        }
        carry.extend_from_slice(&buffer[..n]);
        let mut start = 0;
        while let Some(end) = memchr::memchr(b'\n', &carry[start..]) {
            lines += 1;
            if ok_field.find(&carry[start..start + end]).is_some() {
                ok += 1;
            }
            start += end + 1;
        }
        carry.drain(..start);
    }
    Some((lines, ok))
}

/// The `outcome` (and `reason`) of every record in the file, and how many of each, most first.
fn count_outcomes(path: &Path) -> Vec<(String, u64)> {
    let Ok(text) = std::fs::read_to_string(path) else {
        return Vec::new();
    };
    let mut counts: Vec<(String, u64)> = Vec::new();
    for line in text.lines() {
        let outcome = serde_json::from_str::<serde_json::Value>(line)
            .ok()
            .and_then(|record| {
                let outcome = record.get("outcome")?.as_str()?;
                Some(match record.get("reason").and_then(|r| r.as_str()) {
                    Some(reason) => format!("{outcome} ({reason})"),
                    None => outcome.to_string(),
                })
            })
            .unwrap_or_else(|| "(unreadable)".into());
        match counts.iter_mut().find(|(o, _)| *o == outcome) {
            Some((_, n)) => *n += 1,
            None => counts.push((outcome, 1)),
        }
    }
    counts.sort_by_key(|(_, n)| std::cmp::Reverse(*n));
    counts
}

// ---------------------------------------------------------------------------------------------
// Bursts.

/// One burst: RSS with all its connections open, once the proxy closed them, and [`LATER`] after that.
struct BurstReport {
    opened: usize,
    open_rss_kib: Option<u64>,
    open_fds: Option<usize>,
    closed_rss_kib: Option<u64>,
    later_rss_kib: Option<u64>,
    settle: Result<Duration, String>,
}

struct BurstsReport {
    idle_rss_kib: Option<u64>,
    bursts: Vec<BurstReport>,
    peak_rss_kib: Option<u64>,
    failures: Failures,
    complaints: Vec<String>,
}

async fn bursts(params: &Params, dir: &Path) -> Result<BurstsReport, String> {
    let upstream = start_streaming_upstream().await?;
    let proxy = ProxyProcess::spawn(&params.binary, upstream, dir, "bursts")?;
    let host = HeaderValue::from_str(&proxy.listen.to_string()).map_err(|e| e.to_string())?;
    let mut report = BurstsReport {
        idle_rss_kib: proxy.idle_rss_kib,
        bursts: Vec::new(),
        peak_rss_kib: None,
        failures: Failures::default(),
        complaints: Vec::new(),
    };
    for round in 0..params.bursts {
        eprintln!(
            "soak bench: bursts: {} connections at once, burst {} of {}",
            params.burst_connections,
            round + 1,
            params.bursts
        );
        let gate = Arc::new(Semaphore::new(CONNECTING_AT_ONCE));
        let (release, released) = watch::channel(false);
        let (opened_tx, mut opened_rx) = tokio::sync::mpsc::unbounded_channel();
        let mut holders = JoinSet::new();
        for _ in 0..params.burst_connections {
            let (gate, mut released, opened_tx, host) = (
                gate.clone(),
                released.clone(),
                opened_tx.clone(),
                host.clone(),
            );
            let listen = proxy.listen;
            holders.spawn(async move {
                let permit = gate.acquire_owned().await;
                let attempt = async {
                    let mut connection = open(listen).await?;
                    match stream_once(&mut connection.0, &host).await {
                        Ok(()) => Ok(connection),
                        Err(e) => {
                            close(connection).await;
                            Err(e)
                        }
                    }
                };
                let held = match timeout(Duration::from_secs(30), attempt).await {
                    Ok(result) => result,
                    Err(_) => Err("no end within 30 s".into()),
                };
                drop(permit);
                let ok = held.is_ok();
                let _ = opened_tx.send(held.as_ref().map(|_| ()).map_err(Clone::clone));
                let _ = released.wait_for(|r| *r).await;
                if let Ok(connection) = held {
                    close(connection).await;
                }
                ok
            });
        }
        drop(opened_tx);
        // Every holder reports once and keeps its sender until released: count, do not wait
        // for the channel to close.
        let mut opened = 0;
        for _ in 0..params.burst_connections {
            match opened_rx.recv().await {
                Some(Ok(())) => opened += 1,
                Some(Err(e)) => report.failures.add(e),
                None => break,
            }
        }
        let open_rss_kib = proxy.rss_kib();
        let open_fds = open_fds(proxy.pid());
        let _ = release.send(true);
        while holders.join_next().await.is_some() {}
        let settle = proxy.settle().await;
        let closed_rss_kib = proxy.rss_kib();
        tokio::time::sleep(LATER).await;
        report.bursts.push(BurstReport {
            opened,
            open_rss_kib,
            open_fds,
            closed_rss_kib,
            later_rss_kib: proxy.rss_kib(),
            settle,
        });
    }
    report.peak_rss_kib = proxy.peak_rss_kib();
    report.complaints = proxy.complaints();
    Ok(report)
}

// ---------------------------------------------------------------------------------------------
// Hostile connections.

/// How a hostile connection ended up.
#[derive(Default)]
struct HostileTally {
    /// Heads: answered 431; uploads: the body went through whole.
    answered: usize,
    /// The proxy closed or reset the connection without an answer.
    reset: usize,
    /// Still open, the client's writes blocked (heads: no answer within 5 s).
    stalled: usize,
    /// Bytes the clients got written, in all.
    written: u64,
    failed_to_connect: Failures,
}

struct HostileReport {
    what: &'static str,
    connections: usize,
    idle_rss_kib: Option<u64>,
    /// With every connection open and done (refused, or stalled).
    open_rss_kib: Option<u64>,
    peak_rss_kib: Option<u64>,
    closed_rss_kib: Option<u64>,
    settle: Result<Duration, String>,
    tally: HostileTally,
    complaints: Vec<String>,
    /// The records' outcomes once the proxy was stopped, and how many of each.
    outcomes: Vec<(String, u64)>,
}

enum Hostility {
    /// A request head of [`HOSTILE_HEAD_BYTES`] that never ends.
    Head,
    /// An upload of [`UPLOAD_BYTES`] announced with Content-Length.
    Upload,
}

/// What one hostile connection saw.
enum Seen {
    Answered(u64),
    Reset(u64),
    Stalled(u64),
}

/// Opens `n` connections (each with a small send buffer), starts them all at once, has each do
/// its hostile thing, and measures the proxy with all of them done but still open.
async fn hostile(
    params: &Params,
    dir: &Path,
    hostility: Hostility,
) -> Result<HostileReport, String> {
    let n = params.hostile_connections;
    let (upstream, black_hole) = match hostility {
        Hostility::Head => (start_streaming_upstream().await?, None),
        Hostility::Upload => {
            let (addr, task) = start_black_hole().await?;
            (addr, Some(task))
        }
    };
    let name = match hostility {
        Hostility::Head => "heads",
        Hostility::Upload => "uploads",
    };
    let mut proxy = ProxyProcess::spawn(&params.binary, upstream, dir, name)?;
    eprintln!("soak bench: {name}: {n} connections");
    let listen = proxy.listen;
    let gate = Arc::new(Semaphore::new(CONNECTING_AT_ONCE));
    let (go, going) = watch::channel(false);
    let (release, released) = watch::channel(false);
    let (connected_tx, mut connected_rx) = tokio::sync::mpsc::unbounded_channel();
    let (seen_tx, mut seen_rx) = tokio::sync::mpsc::unbounded_channel();
    let is_head = matches!(hostility, Hostility::Head);
    let mut tasks = JoinSet::new();
    for _ in 0..n {
        let (gate, mut going, mut released) = (gate.clone(), going.clone(), released.clone());
        let (connected_tx, seen_tx) = (connected_tx.clone(), seen_tx.clone());
        tasks.spawn(async move {
            let permit = gate.acquire_owned().await;
            let stream = async {
                let socket = TcpSocket::new_v4()?;
                socket.set_send_buffer_size(HOSTILE_SEND_BUFFER)?;
                socket.connect(listen).await
            };
            let mut stream = match timeout(Duration::from_secs(30), stream).await {
                Ok(Ok(stream)) => stream,
                Ok(Err(e)) => {
                    let _ = connected_tx.send(Err(format!("connect: {e}")));
                    return;
                }
                Err(_) => {
                    let _ = connected_tx.send(Err("connect: no answer within 30 s".into()));
                    return;
                }
            };
            drop(permit);
            let _ = connected_tx.send(Ok(()));
            let _ = going.wait_for(|g| *g).await;
            let seen = if is_head {
                send_endless_head(&mut stream).await
            } else {
                send_stalled_upload(&mut stream).await
            };
            let _ = seen_tx.send(seen);
            let _ = released.wait_for(|r| *r).await;
            drop(stream);
        });
    }
    drop((connected_tx, seen_tx));
    let mut tally = HostileTally::default();
    let mut connected = 0;
    for _ in 0..n {
        match connected_rx.recv().await {
            Some(Ok(())) => connected += 1,
            Some(Err(e)) => tally.failed_to_connect.add(e),
            None => break,
        }
    }
    let _ = go.send(true);
    for _ in 0..connected {
        match seen_rx.recv().await {
            Some(Seen::Answered(bytes)) => {
                tally.answered += 1;
                tally.written += bytes;
            }
            Some(Seen::Reset(bytes)) => {
                tally.reset += 1;
                tally.written += bytes;
            }
            Some(Seen::Stalled(bytes)) => {
                tally.stalled += 1;
                tally.written += bytes;
            }
            None => break,
        }
    }
    let open_rss_kib = proxy.rss_kib();
    let peak_rss_kib = proxy.peak_rss_kib();
    let _ = release.send(true);
    while tasks.join_next().await.is_some() {}
    if let Some(black_hole) = black_hole {
        black_hole.abort();
    }
    let settle = proxy.settle().await;
    tokio::time::sleep(LATER).await;
    let closed_rss_kib = proxy.rss_kib();
    // Stopped so that every record is written before they are counted.
    let outcomes = match proxy.stop() {
        Ok(()) => count_outcomes(&proxy.records),
        Err(e) => vec![(format!("(not counted: {e})"), 0)],
    };
    Ok(HostileReport {
        what: name,
        connections: n,
        idle_rss_kib: proxy.idle_rss_kib,
        open_rss_kib,
        peak_rss_kib,
        closed_rss_kib,
        settle,
        tally,
        complaints: proxy.complaints(),
        outcomes,
    })
}

/// Writes a request head of [`HOSTILE_HEAD_BYTES`] that never ends, then waits up to 5 s for
/// an answer.
async fn send_endless_head(stream: &mut TcpStream) -> Seen {
    let mut head = b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Filler: ".to_vec();
    head.resize(HOSTILE_HEAD_BYTES, b'a');
    let mut written = 0u64;
    for piece in head.chunks(16 << 10) {
        match timeout(Duration::from_secs(5), stream.write_all(piece)).await {
            Ok(Ok(())) => written += piece.len() as u64,
            Ok(Err(_)) => break,
            Err(_) => return Seen::Stalled(written),
        }
    }
    let mut answer = [0u8; 16];
    match timeout(Duration::from_secs(5), stream.read(&mut answer)).await {
        Ok(Ok(n)) if answer[..n].starts_with(b"HTTP/1.1 431") => Seen::Answered(written),
        Ok(_) => Seen::Reset(written),
        Err(_) => Seen::Stalled(written),
    }
}

/// Announces an upload of [`UPLOAD_BYTES`] and writes it until a piece takes longer than
/// [`STALL`] to go: the upstream does not read, so once the buffers on the way are full,
/// nothing moves.
async fn send_stalled_upload(stream: &mut TcpStream) -> Seen {
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {UPLOAD_BYTES}\r\n\r\n"
    );
    if stream.write_all(head.as_bytes()).await.is_err() {
        return Seen::Reset(0);
    }
    let mut piece = br#"{"model":"bench","messages":[{"role":"user","content":""#.to_vec();
    piece.resize(16 << 10, b'x');
    let mut written = 0u64;
    while (written as usize) < UPLOAD_BYTES {
        let len = piece.len().min(UPLOAD_BYTES - written as usize);
        match timeout(STALL, stream.write_all(&piece[..len])).await {
            Ok(Ok(())) => written += len as u64,
            Ok(Err(_)) => return Seen::Reset(written),
            Err(_) => return Seen::Stalled(written),
        }
        // Only the first piece opens the JSON; the rest is the prompt's filler.
        piece[..64].fill(b'x');
    }
    Seen::Answered(written)
}

// ---------------------------------------------------------------------------------------------
// The run and the report.

#[derive(Default)]
struct Report {
    soak: Option<Result<SoakReport, String>>,
    bursts: Option<Result<BurstsReport, String>>,
    hostile: Vec<Result<HostileReport, String>>,
}

async fn run(params: &Params, dir: &WorkDir) -> Report {
    let mut report = Report::default();
    for phase in &params.phases {
        match phase {
            Phase::Soak => report.soak = Some(soak(params, &dir.path).await),
            Phase::Bursts => report.bursts = Some(bursts(params, &dir.path).await),
            Phase::Heads => report
                .hostile
                .push(hostile(params, &dir.path, Hostility::Head).await),
            Phase::Uploads => report
                .hostile
                .push(hostile(params, &dir.path, Hostility::Upload).await),
        }
    }
    report
}

fn mib(kib: Option<u64>) -> String {
    kib.map_or_else(|| "n/a".into(), |k| format!("{:.1}", k as f64 / 1024.0))
}

/// `(a - b) / n` in KiB, for a cost per connection.
fn per_connection(a: Option<u64>, b: Option<u64>, n: usize) -> String {
    match (a, b) {
        (Some(a), Some(b)) if n > 0 => {
            format!("{:.0} KiB", (a as f64 - b as f64) / n as f64)
        }
        _ => "n/a".into(),
    }
}

fn print_report(
    params: &Params,
    report: &Report,
    load_before: Option<String>,
    load_after: Option<String>,
    took: Duration,
) {
    let tick_s = 1.0 / procfs::clock_ticks_per_second() as f64;
    println!();
    println!("## Soak and memory (`cargo bench --bench soak`)");
    println!();
    println!("Proxy binary: {}", params.binary.display());
    if let Some(result) = &report.soak {
        match result {
            Ok(soak) => print_soak(params, soak, tick_s),
            Err(e) => println!("\nsoak: could not run: {e}"),
        }
    }
    if let Some(result) = &report.bursts {
        match result {
            Ok(bursts) => print_bursts(params, bursts),
            Err(e) => println!("\nbursts: could not run: {e}"),
        }
    }
    if !report.hostile.is_empty() {
        println!();
        println!("### Hostile connections");
        println!();
        println!(
            "| connections | proxy RSS idle | all open | peak (VmHWM) | {} s after they closed | per connection (open − idle) | per connection (peak − idle) | how they ended |",
            LATER.as_secs()
        );
        println!("|---|---|---|---|---|---|---|---|");
        for result in &report.hostile {
            match result {
                Ok(h) => {
                    let t = &h.tally;
                    let ended = match h.what {
                        "heads" => format!(
                            "{} answered 431, {} closed without answer, {} no answer in 5 s",
                            t.answered, t.reset, t.stalled
                        ),
                        _ => format!(
                            "{} stalled (a write blocked {} s), {} reset, {} sent whole; {:.0} KiB written each on average",
                            t.stalled,
                            STALL.as_secs(),
                            t.reset,
                            t.answered,
                            t.written as f64 / 1024.0 / h.connections.max(1) as f64
                        ),
                    };
                    let label = match h.what {
                        "heads" => format!(
                            "{} sending a {} KB head that never ends",
                            h.connections,
                            HOSTILE_HEAD_BYTES / 1000
                        ),
                        _ => format!(
                            "{} uploading {} MiB to an upstream that never reads",
                            h.connections,
                            UPLOAD_BYTES >> 20
                        ),
                    };
                    println!(
                        "| {label} | {} MiB | {} MiB | {} MiB | {} MiB | {} | {} | {ended} |",
                        mib(h.idle_rss_kib),
                        mib(h.open_rss_kib),
                        mib(h.peak_rss_kib),
                        mib(h.closed_rss_kib),
                        per_connection(h.open_rss_kib, h.idle_rss_kib, h.connections),
                        per_connection(h.peak_rss_kib, h.idle_rss_kib, h.connections),
                    );
                }
                Err(e) => println!("| could not run: {e} | | | | | | | |"),
            }
        }
        for h in report.hostile.iter().flatten() {
            if let Err(e) = &h.settle {
                println!("- {}: {e}", h.what);
            }
            for e in &h.tally.failed_to_connect.first {
                println!(
                    "- {}: {} connections failed, e.g. {e}",
                    h.what, h.tally.failed_to_connect.count
                );
            }
            if let Some(first) = h.complaints.first() {
                println!(
                    "- {} proxy logged {}{} warnings, e.g. {first}",
                    h.what,
                    if h.complaints.len() >= 20 {
                        "at least "
                    } else {
                        ""
                    },
                    h.complaints.len()
                );
            }
            if !h.outcomes.is_empty() {
                let list: Vec<String> = h
                    .outcomes
                    .iter()
                    .map(|(outcome, n)| format!("{n} {outcome}"))
                    .collect();
                println!("- {} records after SIGTERM: {}", h.what, list.join(", "));
            }
        }
    }
    println!();
    println!("Run:");
    println!(
        "- load average (1, 5, 15 min) before {} and after {}; {} core(s) shared by the proxy, the upstream and the clients, all on loopback{}",
        load_before.as_deref().unwrap_or("n/a"),
        load_after.as_deref().unwrap_or("n/a"),
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        if params.quick { "; QUICK run" } else { "" }
    );
    println!("- took {:.0} s", took.as_secs_f64());
}

fn print_soak(params: &Params, soak: &SoakReport, tick_s: f64) {
    let samples = &soak.samples;
    println!();
    println!(
        "### Soak: {} streams, {} keep-alive clients",
        params.requests, params.clients
    );
    println!();
    println!("| streams | elapsed | proxy RSS | proxy CPU in the interval | CPU per stream | rate in the interval | others' share of the CPU |");
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    let mut previous: Option<&Sample> = None;
    for sample in samples {
        let interval = previous.map(|p| {
            let streams = sample.requests - p.requests;
            let seconds = (sample.at - p.at).as_secs_f64();
            let cpu = sample
                .proxy_ticks
                .zip(p.proxy_ticks)
                .map(|(a, b)| (a - b) as f64 * tick_s);
            let others = match (sample.machine, p.machine) {
                (Some((busy1, all1)), Some((busy0, all0))) => {
                    let ours = sample
                        .proxy_ticks
                        .zip(p.proxy_ticks)
                        .zip(sample.bench_ticks.zip(p.bench_ticks))
                        .map(|((a, b), (c, d))| (a - b) + (c - d))
                        .unwrap_or(0);
                    Some((busy1 - busy0).saturating_sub(ours) as f64 / (all1 - all0).max(1) as f64)
                }
                _ => None,
            };
            (streams, seconds, cpu, others)
        });
        match interval {
            None => println!(
                "| {} | {:.0} s | {} MiB (idle) | | | | |",
                sample.requests,
                sample.at.as_secs_f64(),
                mib(sample.rss_kib)
            ),
            Some((streams, seconds, cpu, others)) => println!(
                "| {} | {:.0} s | {} MiB | {} | {} | {:.0}/s | {} |",
                sample.requests,
                sample.at.as_secs_f64(),
                mib(sample.rss_kib),
                cpu.map_or_else(|| "n/a".into(), |c| format!("{c:.1} s")),
                cpu.map_or_else(
                    || "n/a".into(),
                    |c| format!("{:.0} µs", c * 1e6 / streams.max(1) as f64)
                ),
                streams as f64 / seconds.max(1e-9),
                others.map_or_else(|| "n/a".into(), |o| format!("{:.0} %", o * 100.0)),
            ),
        }
        previous = Some(sample);
    }
    // The first sample is at zero streams; the warm-up is the first interval.
    let after_warmup: Vec<u64> = samples.iter().skip(1).filter_map(|s| s.rss_kib).collect();
    println!();
    if let Some((&first, rest)) = after_warmup.split_first() {
        let margin = ((first as f64 * FLAT_FRACTION) as u64).max(FLAT_KIB);
        let worst = rest.iter().map(|&r| r.abs_diff(first)).max().unwrap_or(0);
        let last = rest.last().copied().unwrap_or(first);
        println!(
            "RSS after the warm-up ({} streams): {} MiB; the last sample {} MiB ({:+.1} MiB); the furthest any later sample strays: {:.1} MiB; margin max(10 %, 2 MiB) = {:.1} MiB: **{}**",
            params.sample_every,
            mib(Some(first)),
            mib(Some(last)),
            (last as f64 - first as f64) / 1024.0,
            worst as f64 / 1024.0,
            margin as f64 / 1024.0,
            if worst <= margin { "flat" } else { "NOT flat" }
        );
        if params.quick {
            println!("(a quick run's warm-up is too short for this verdict to mean much)");
        }
    }
    if let (Some(first), Some(last)) = (samples.first(), samples.last()) {
        let seconds = (last.at - first.at).as_secs_f64();
        let cpu = last
            .proxy_ticks
            .zip(first.proxy_ticks)
            .map(|(a, b)| (a - b) as f64 * tick_s);
        println!();
        println!(
            "- {} streams in {:.0} s: {:.0} streams/s; proxy CPU {} in all, {} per 10^5 streams; peak RSS (VmHWM) {} MiB",
            last.requests,
            seconds,
            last.requests as f64 / seconds.max(1e-9),
            cpu.map_or_else(|| "n/a".into(), |c| format!("{c:.1} s")),
            cpu.map_or_else(
                || "n/a".into(),
                |c| format!("{:.1} s", c * 1e5 / last.requests.max(1) as f64)
            ),
            mib(soak.peak_rss_kib)
        );
    }
    println!(
        "- each stream: a {}-byte request, an answer of {} SSE events ({} bytes, each event its own write) from an in-process upstream, checked byte for byte",
        REQUEST_BODY.len(),
        CHUNKS.len(),
        answer_bytes()
    );
    println!(
        "- failed streams: {}; /metrics scraped {} times while it ran; tokenmeter_requests_total at the end: {}",
        soak.failures.count,
        soak.scrapes,
        soak.requests_counted
            .map_or_else(|| "n/a".into(), |n| format!("{n:.0}"))
    );
    for e in &soak.failures.first {
        println!("  - e.g. {e}");
    }
    match &soak.stopped {
        Some(Ok(())) => println!("- SIGTERM at the end: exited 0"),
        Some(Err(e)) => println!("- SIGTERM at the end: {e}"),
        None => {}
    }
    match soak.records {
        Some((lines, ok)) => {
            println!("- records in the JSONL file after the exit: {lines}, {ok} of them `ok`")
        }
        None => println!("- records: the file could not be read"),
    }
    for line in &soak.complaints {
        println!("- proxy logged: {line}");
    }
}

fn print_bursts(params: &Params, bursts: &BurstsReport) {
    println!();
    println!(
        "### Bursts: {} keep-alive connections open at once, each streams one request, then all close",
        params.burst_connections
    );
    println!();
    println!(
        "| burst | streams that ended whole | proxy RSS idle | all open | once the proxy closed them | {} s later | held over idle |",
        LATER.as_secs()
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    for (i, burst) in bursts.bursts.iter().enumerate() {
        println!(
            "| {} | {} | {} MiB | {} MiB | {} MiB | {} MiB | {} MiB |",
            i + 1,
            burst.opened,
            mib(bursts.idle_rss_kib),
            mib(burst.open_rss_kib),
            mib(burst.closed_rss_kib),
            mib(burst.later_rss_kib),
            match (burst.later_rss_kib, bursts.idle_rss_kib) {
                (Some(a), Some(b)) => format!("{:+.1}", (a as f64 - b as f64) / 1024.0),
                _ => "n/a".into(),
            }
        );
    }
    println!();
    println!(
        "- peak RSS (VmHWM) {} MiB; the proxy keeps its upstream connections idle afterwards for the next burst (up to its connection cap), as in production",
        mib(bursts.peak_rss_kib)
    );
    for (i, burst) in bursts.bursts.iter().enumerate() {
        match &burst.settle {
            Ok(took) => println!(
                "- burst {}: {} proxy descriptors with all open; closed within {:.1} s of the clients closing",
                i + 1,
                burst
                    .open_fds
                    .map_or_else(|| "n/a".into(), |n| n.to_string()),
                took.as_secs_f64()
            ),
            Err(e) => println!("- burst {}: {e}", i + 1),
        }
    }
    if bursts.failures.count > 0 {
        println!("- failed streams: {}", bursts.failures.count);
        for e in &bursts.failures.first {
            println!("  - e.g. {e}");
        }
    }
    for line in &bursts.complaints {
        println!("- proxy logged: {line}");
    }
}
