//! Test harness: a scripted upstream, a proxy on port 0, and clients that read frame by frame.
//!
//! The upstream is raw TCP so a test controls exactly what the proxy receives: each write is one
//! HTTP/1.1 chunk, flushed on its own; a script can stall, stop without the final chunk, or reset
//! the connection. Everything binds 127.0.0.1:0.

#![allow(dead_code)]

pub mod prometheus;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, Mutex};
use tokio::time::{timeout, Instant};

use tokenmeter::Running;
use tokenmeter::{AccessLog, Config, LogFormat, LogPath, Upstream};

/// One step of a scripted response.
#[derive(Clone, Debug)]
pub enum Step {
    /// Write these bytes as one chunk (or raw, for a Content-Length response) and flush.
    Write(Bytes),
    /// Wait before the next step.
    Wait(Duration),
    /// Wait until this long after the response head was written (no drift over many steps).
    At(Duration),
    /// End the body properly (the zero chunk) and keep the connection.
    End,
    /// End the body properly, then close the connection without having said
    /// `Connection: close` (llama.cpp's server does this after every streamed response).
    EndThenClose,
    /// End the body with trailers (chunked only): `0\r\nname: value\r\n\r\n`.
    EndWithTrailers(String),
    /// Close the connection without ending the body: a truncated response.
    Close,
    /// Reset the connection (RST): an upstream crash.
    Reset,
    /// Never answer; hold the connection until the client goes away.
    Hang,
}

/// A scripted response: the head and then the steps.
#[derive(Clone, Debug)]
pub struct Script {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    /// `true`: chunked transfer coding, one chunk per write; `false`: Content-Length of all writes.
    pub chunked: bool,
    pub steps: Vec<Step>,
}

impl Script {
    /// A streaming response of `content_type` whose body is `frames`, each written on its own.
    pub fn stream(content_type: &str, frames: Vec<Bytes>) -> Script {
        let mut steps: Vec<Step> = frames.into_iter().map(Step::Write).collect();
        steps.push(Step::End);
        Script {
            status: 200,
            headers: vec![("content-type".into(), content_type.into())],
            chunked: true,
            steps,
        }
    }

    /// A whole JSON body with a Content-Length.
    pub fn json(status: u16, body: &str) -> Script {
        Script {
            status,
            headers: vec![("content-type".into(), "application/json".into())],
            chunked: false,
            steps: vec![Step::Write(Bytes::from(body.to_owned())), Step::End],
        }
    }

    /// Reads the request and never answers, not even a head.
    pub fn silent() -> Script {
        Script {
            status: 0,
            headers: vec![],
            chunked: true,
            steps: vec![Step::Hang],
        }
    }

    pub fn header(mut self, name: &str, value: &str) -> Script {
        self.headers.push((name.into(), value.into()));
        self
    }
}

/// What the upstream saw of one request.
#[derive(Clone, Debug)]
pub struct Seen {
    pub head: String,
    pub body: Vec<u8>,
}

impl Seen {
    pub fn header(&self, name: &str) -> Option<String> {
        self.head.lines().skip(1).find_map(|line| {
            let (k, v) = line.split_once(':')?;
            k.trim()
                .eq_ignore_ascii_case(name)
                .then(|| v.trim().to_string())
        })
    }
}

/// A running scripted upstream.
pub struct ScriptedUpstream {
    pub addr: SocketAddr,
    /// Every request, as received.
    pub seen: mpsc::UnboundedReceiver<Seen>,
    /// Fires when a response could not be written because the proxy went away.
    pub disconnects: mpsc::UnboundedReceiver<()>,
}

/// Starts an upstream that answers every request with `script(request)`.
pub async fn upstream<F>(script: F) -> ScriptedUpstream
where
    F: Fn(&Seen) -> Script + Send + Sync + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (seen_tx, seen) = mpsc::unbounded_channel();
    let (gone_tx, disconnects) = mpsc::unbounded_channel();
    let script = Arc::new(script);
    tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                return;
            };
            stream.set_nodelay(true).unwrap();
            let (script, seen_tx, gone_tx) = (script.clone(), seen_tx.clone(), gone_tx.clone());
            tokio::spawn(async move {
                let mut buf = Vec::new();
                while let Some(request) = read_request(&mut stream, &mut buf).await {
                    let _ = seen_tx.send(request.clone());
                    match play(&mut stream, &script(&request)).await {
                        Played::Ended => continue,
                        Played::Closed => return,
                        Played::PeerGone => {
                            let _ = gone_tx.send(());
                            return;
                        }
                    }
                }
            });
        }
    });
    ScriptedUpstream {
        addr,
        seen,
        disconnects,
    }
}

enum Played {
    Ended,
    Closed,
    PeerGone,
}

async fn play(stream: &mut TcpStream, script: &Script) -> Played {
    if script.status == 0 {
        // No head at all: close at once (a server that drops the request), or hang.
        if matches!(script.steps.first(), Some(Step::Close)) {
            let _ = stream.shutdown().await;
            return Played::Closed;
        }
        return hang(stream).await;
    }
    let mut head = format!("HTTP/1.1 {} Scripted\r\n", script.status);
    for (k, v) in &script.headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    if script.chunked {
        head.push_str("transfer-encoding: chunked\r\n");
    } else {
        let len: usize = script
            .steps
            .iter()
            .map(|s| if let Step::Write(b) = s { b.len() } else { 0 })
            .sum();
        head.push_str(&format!("content-length: {len}\r\n"));
    }
    head.push_str("\r\n");
    if stream.write_all(head.as_bytes()).await.is_err() {
        return Played::PeerGone;
    }
    let started = Instant::now();
    for step in &script.steps {
        match step {
            Step::Write(bytes) => {
                let mut out = Vec::with_capacity(bytes.len() + 16);
                if script.chunked {
                    if bytes.is_empty() {
                        continue;
                    }
                    out.extend_from_slice(format!("{:x}\r\n", bytes.len()).as_bytes());
                    out.extend_from_slice(bytes);
                    out.extend_from_slice(b"\r\n");
                } else {
                    out.extend_from_slice(bytes);
                }
                if stream.write_all(&out).await.is_err() || stream.flush().await.is_err() {
                    return Played::PeerGone;
                }
            }
            Step::Wait(d) | Step::At(d) => {
                let until = match step {
                    Step::At(_) => started + *d,
                    _ => Instant::now() + *d,
                };
                // Wait, but notice a proxy that gave up on us in the meantime.
                let mut probe = [0u8; 1];
                tokio::select! {
                    _ = tokio::time::sleep_until(until) => {}
                    r = stream.read(&mut probe) => if matches!(r, Ok(0) | Err(_)) { return Played::PeerGone },
                }
            }
            Step::End => {
                if script.chunked && stream.write_all(b"0\r\n\r\n").await.is_err() {
                    return Played::PeerGone;
                }
                return Played::Ended;
            }
            Step::EndThenClose => {
                if script.chunked {
                    let _ = stream.write_all(b"0\r\n\r\n").await;
                }
                let _ = stream.flush().await;
                let _ = stream.shutdown().await;
                return Played::Closed;
            }
            Step::EndWithTrailers(trailer) => {
                let end = format!("0\r\n{trailer}\r\n\r\n");
                if stream.write_all(end.as_bytes()).await.is_err() {
                    return Played::PeerGone;
                }
                return Played::Ended;
            }
            Step::Close => {
                let _ = stream.shutdown().await;
                return Played::Closed;
            }
            Step::Reset => {
                // Linger zero makes the close a RST; it cannot block, as nothing waits to be sent.
                #[allow(deprecated)]
                let _ = stream.set_linger(Some(Duration::ZERO));
                return Played::Closed;
            }
            Step::Hang => return hang(stream).await,
        }
    }
    Played::Ended
}

/// Holds the connection until the peer goes away.
async fn hang(stream: &mut TcpStream) -> Played {
    let mut probe = [0u8; 64];
    loop {
        match stream.read(&mut probe).await {
            Ok(0) | Err(_) => return Played::PeerGone,
            Ok(_) => {}
        }
    }
}

/// Reads one request (head, then a Content-Length or chunked body) from a keep-alive connection.
async fn read_request(stream: &mut TcpStream, buf: &mut Vec<u8>) -> Option<Seen> {
    let head_end = loop {
        if let Some(i) = find(buf, b"\r\n\r\n") {
            break i + 4;
        }
        let mut chunk = [0u8; 8192];
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    buf.drain(..head_end);
    let seen_head = Seen {
        head: head.clone(),
        body: Vec::new(),
    };
    let mut body = Vec::new();
    if let Some(len) = seen_head
        .header("content-length")
        .and_then(|v| v.parse::<usize>().ok())
    {
        while buf.len() < len {
            let mut chunk = vec![0u8; 65536];
            let n = stream.read(&mut chunk).await.ok()?;
            if n == 0 {
                return None;
            }
            buf.extend_from_slice(&chunk[..n]);
        }
        body = buf.drain(..len).collect();
    } else if seen_head
        .header("transfer-encoding")
        .is_some_and(|v| v.eq_ignore_ascii_case("chunked"))
    {
        loop {
            let line_end = loop {
                if let Some(i) = find(buf, b"\r\n") {
                    break i;
                }
                let mut chunk = vec![0u8; 65536];
                let n = stream.read(&mut chunk).await.ok()?;
                if n == 0 {
                    return None;
                }
                buf.extend_from_slice(&chunk[..n]);
            };
            let size_text = String::from_utf8_lossy(&buf[..line_end]).into_owned();
            let size = usize::from_str_radix(size_text.split(';').next()?.trim(), 16).ok()?;
            while buf.len() < line_end + 2 + size + 2 {
                let mut chunk = vec![0u8; 65536];
                let n = stream.read(&mut chunk).await.ok()?;
                if n == 0 {
                    return None;
                }
                buf.extend_from_slice(&chunk[..n]);
            }
            body.extend_from_slice(&buf[line_end + 2..line_end + 2 + size]);
            buf.drain(..line_end + 2 + size + 2);
            if size == 0 {
                break;
            }
        }
    }
    Some(Seen { head, body })
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// A proxy under test, with its per-request record in a temporary JSON-lines file.
pub struct TestProxy {
    pub running: Running,
    pub records: PathBuf,
    _dir: TempDir,
}

impl TestProxy {
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.running.listen, path)
    }

    pub fn admin_url(&self, path: &str) -> String {
        format!("http://{}{}", self.running.admin, path)
    }

    /// Waits (up to 10 s) until `n` records have been written, and returns them all.
    pub async fn records(&self, n: usize) -> Vec<serde_json::Value> {
        wait_for_records(&self.records, n).await
    }

    pub fn metrics(&self) -> String {
        self.running.metrics_text()
    }
}

/// Starts a proxy in front of `upstream`; `tweak` may change the config first.
pub async fn proxy(upstream: SocketAddr, tweak: impl FnOnce(&mut Config)) -> TestProxy {
    let dir = TempDir::new();
    let records = dir.path().join("records.jsonl");
    let mut config = Config {
        listen: "127.0.0.1:0".parse().unwrap(),
        admin: "127.0.0.1:0".parse().unwrap(),
        upstream: Upstream::parse(&format!("http://{upstream}")).unwrap(),
        access_log: Some(AccessLog {
            path: LogPath::File(records.clone()),
            format: LogFormat::Jsonl,
        }),
        ..Config::default()
    };
    tweak(&mut config);
    let running = tokenmeter::start(config, None, Default::default())
        .await
        .unwrap();
    TestProxy {
        running,
        records,
        _dir: dir,
    }
}

pub async fn wait_for_records(path: &Path, n: usize) -> Vec<serde_json::Value> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let records: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        if records.len() >= n {
            return records;
        }
        assert!(
            Instant::now() < deadline,
            "expected {n} records, have {}: {text}",
            records.len()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// What a client received: the status, the head, each frame with its arrival time, and how
/// the body ended.
pub struct Received {
    pub status: u16,
    pub headers: http::HeaderMap,
    pub frames: Vec<(Instant, Bytes)>,
    pub body_error: Option<String>,
}

impl Received {
    pub fn bytes(&self) -> Vec<u8> {
        self.frames
            .iter()
            .flat_map(|(_, b)| b.iter().copied())
            .collect()
    }
}

/// Sends a request over HTTP/1.1 (or h2c with `h2`) and reads the response frame by frame.
pub async fn send(
    url: &str,
    method: &str,
    body: &str,
    headers: &[(&str, &str)],
    h2: bool,
) -> Received {
    let mut builder = Client::builder(TokioExecutor::new());
    builder.http2_only(h2);
    // Without TCP_NODELAY the request body waits on Nagle and a delayed ACK (~40 ms).
    let mut connector = hyper_util::client::legacy::connect::HttpConnector::new();
    connector.set_nodelay(true);
    let client: Client<_, http_body_util::Full<Bytes>> = builder.build(connector);
    let mut request = http::Request::builder().method(method).uri(url);
    for (k, v) in headers {
        request = request.header(*k, *v);
    }
    let request = request
        .body(http_body_util::Full::new(Bytes::from(body.to_owned())))
        .unwrap();
    let response = timeout(Duration::from_secs(20), client.request(request))
        .await
        .expect("response head within 20 s")
        .expect("response head");
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let mut body = response.into_body();
    let mut frames = Vec::new();
    let mut body_error = None;
    loop {
        match timeout(Duration::from_secs(20), body.frame())
            .await
            .expect("frame within 20 s")
        {
            Some(Ok(frame)) => {
                if let Ok(data) = frame.into_data() {
                    frames.push((Instant::now(), data));
                }
            }
            Some(Err(e)) => {
                body_error = Some(e.to_string());
                break;
            }
            None => break,
        }
    }
    Received {
        status,
        headers,
        frames,
        body_error,
    }
}

/// A chat completion request body.
pub fn chat_request(model: &str) -> String {
    format!(r#"{{"messages":[{{"role":"user","content":"hi"}}],"model":"{model}","stream":true}}"#)
}

/// One OpenAI chat chunk carrying `content`.
pub fn chat_chunk(content: &str) -> Bytes {
    Bytes::from(format!(
        "data: {{\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":{}}},\"finish_reason\":null}}]}}\n\n",
        serde_json::to_string(content).unwrap()
    ))
}

pub fn role_chunk() -> Bytes {
    Bytes::from_static(b"data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"finish_reason\":null}]}\n\n")
}

pub fn finish_chunk(reason: &str, completion_tokens: Option<u64>) -> Bytes {
    let usage = completion_tokens
        .map(|n| {
            format!(
                ",\"usage\":{{\"prompt_tokens\":7,\"completion_tokens\":{n},\"total_tokens\":{}}}",
                n + 7
            )
        })
        .unwrap_or_default();
    Bytes::from(format!(
        "data: {{\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{{\"index\":0,\"delta\":{{}},\"finish_reason\":\"{reason}\"}}]{usage}}}\n\n"
    ))
}

pub fn done() -> Bytes {
    Bytes::from_static(b"data: [DONE]\n\n")
}

/// A temporary directory removed on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new() -> TempDir {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static N: AtomicUsize = AtomicUsize::new(0);
        let path = std::env::temp_dir().join(format!(
            "tokenmeter-test-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&path).unwrap();
        TempDir(path)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Directory of the shared captured streams.
pub fn fixtures_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/fixtures/streams")
}

/// A tiny deterministic PRNG for frame splits (xorshift64*), so failures reproduce by seed.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % n.max(1)
    }
}

/// Cuts `data` into frames: `None` = random sizes from `rng`; `Some(n)` = fixed size `n`.
pub fn split(data: &[u8], rng: &mut Rng, fixed: Option<usize>) -> Vec<Bytes> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < data.len() {
        let n = fixed
            .unwrap_or_else(|| 1 + rng.below(64) as usize)
            .min(data.len() - i);
        out.push(Bytes::copy_from_slice(&data[i..i + n]));
        i += n;
    }
    out
}

pub type Shared<T> = Arc<Mutex<T>>;

/// Waits (up to 10 s) until `check` holds, for state the system reaches on its own time
/// (a stream getting in flight, a watcher noticing a file); fails naming `what` otherwise.
pub async fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Routes from a YAML `routes:` document, checked like a config file.
pub fn routes(yaml: &str) -> Vec<tokenmeter::Route> {
    Config::parse(yaml, "routes.yaml").unwrap().routes
}
