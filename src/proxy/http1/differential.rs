//! Differential tests against hyper: the same bytes go to tokenmeter's HTTP/1.1 stack and to
//! hyper's, and both must make the same decision. Server side: request bytes (pipelined, with
//! every smuggling trick the generator knows, then randomly mutated) into tokenmeter's server
//! and into a hyper server; each request either side hands to its service (method, target,
//! version, `Host`, body bytes or a body error) and whether each side refused, in order, must
//! agree. Client side: response bytes from a raw upstream into tokenmeter's client and into
//! hyper's; the status and the body bytes (or an error) must agree.
//!
//! Where tokenmeter is deliberately stricter, the case may differ only by tokenmeter refusing
//! what hyper took, at a head that [`stricter_request`] or [`stricter_response`] names; the
//! table of those rules, with their RFC sections, is in `docs/MEASUREMENT.md` ("HTTP/1.1: where
//! tokenmeter is stricter than hyper"). Every other difference fails with the case's bytes.
//!
//! Cases per direction: `TOKENMETER_DIFF_CASES` (10,000 by default; CI runs the default),
//! seeded by `TOKENMETER_DIFF_SEED` so a failure can be replayed.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use super::client::{Conn, Outgoing};
use super::headers;
use super::pool::{Pool, PooledBody};
use super::server::{serve, Hyper, Limits};
use crate::proxy::client_body::ClientBody;
use crate::proxy::request_body::ReplayBody;

const DEADLINE: Duration = Duration::from_secs(20);
/// Cases run at once: each waits on loopback sockets, not on the CPU.
const PARALLEL: usize = 32;

fn cases() -> usize {
    std::env::var("TOKENMETER_DIFF_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000)
}

fn seed() -> u64 {
    std::env::var("TOKENMETER_DIFF_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20261206)
}

/// What one side handed to its service for one request.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Handed {
    method: String,
    target: String,
    version: String,
    host: Vec<Vec<u8>>,
    /// The body's bytes, or `None` when reading it failed.
    body: Option<Vec<u8>>,
}

/// What one side made of a case's bytes: the requests it handed on, and the statuses it wrote
/// (1xx left out; 200 is the service's answer, anything else the server's own refusal).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct Decided {
    handed: Vec<Handed>,
    statuses: Vec<u16>,
}

impl Decided {
    fn refused(&self) -> bool {
        self.statuses.iter().any(|&s| s != 200)
    }
}

fn handed<B>(request: &Request<B>, body: Option<Vec<u8>>) -> Handed {
    Handed {
        method: request.method().to_string(),
        target: request.uri().to_string(),
        version: format!("{:?}", request.version()),
        host: request
            .headers()
            .get_all(http::header::HOST)
            .iter()
            .map(|v| v.as_bytes().to_vec())
            .collect(),
        body,
    }
}

/// The status codes of the responses in `bytes`, 1xx left out (heads only: the bodies are the
/// services' fixed `ok`, or empty).
fn statuses(bytes: &[u8]) -> Vec<u16> {
    let mut out = Vec::new();
    let mut at = 0;
    while let Some(found) = memchr::memmem::find(&bytes[at..], b"HTTP/1.") {
        let line = &bytes[at + found..];
        if let Some(code) = line
            .get(9..12)
            .and_then(|c| std::str::from_utf8(c).ok())
            .and_then(|c| c.parse::<u16>().ok())
        {
            // Accepted (the service's 200) or refused (the server's own answer): which 4xx or 5xx
            // a refusal is may differ between servers, the decision may not.
            if code >= 200 {
                out.push(if code == 200 { 200 } else { 400 });
            }
        }
        at += found + 12;
    }
    out
}

async fn pair() -> (TcpStream, TcpStream) {
    // Each pair on its own loopback address: a closed connection waits out TIME_WAIT on its
    // address and port, and a million cases on one address would use up the ports.
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % (200 * 250 * 250);
    let ip = std::net::Ipv4Addr::new(
        127,
        1 + (n / 62_500) as u8,
        (n / 250 % 250) as u8 + 1,
        (n % 250) as u8 + 1,
    );
    let listener = TcpListener::bind((ip, 0)).await.unwrap();
    let near = TcpStream::connect(listener.local_addr().unwrap())
        .await
        .unwrap();
    let (far, _) = listener.accept().await.unwrap();
    (near, far)
}

/// Writes `bytes`, closes the writing half, reads all the server says until it closes.
async fn exchange_as_client(mut client: TcpStream, bytes: &[u8]) -> Vec<u8> {
    // A server may refuse and close before taking it all: what it did not read is dropped.
    let _ = client.write_all(bytes).await;
    let _ = client.shutdown().await;
    let mut got = Vec::new();
    let _ = tokio::time::timeout(DEADLINE, client.read_to_end(&mut got))
        .await
        .expect("the server closed in time");
    got
}

/// tokenmeter's server over `bytes`.
async fn ours(bytes: Vec<u8>) -> Decided {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let (client, stream) = pair().await;
    let record = seen.clone();
    let service = hyper::service::service_fn(move |request: Request<ClientBody>| {
        let record = record.clone();
        async move {
            let (parts, body) = request.into_parts();
            let body = body.collect().await.ok().map(|b| b.to_bytes().to_vec());
            let request = Request::from_parts(parts, ());
            record.lock().unwrap().push(handed(&request, body));
            Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok"))))
        }
    });
    let limits = Limits {
        request_head: DEADLINE,
        client_idle: DEADLINE,
        max_head_bytes: 16 << 10,
    };
    let server = tokio::spawn(async move {
        let (_keep, mut shutdown) = watch::channel(false);
        serve(stream, b"", limits, Hyper(service), &mut shutdown).await;
    });
    let got = exchange_as_client(client, &bytes).await;
    let _ = server.await;
    let handed = seen.lock().unwrap().clone();
    Decided {
        handed,
        statuses: statuses(&got),
    }
}

/// hyper's server over `bytes`.
async fn hypers(bytes: Vec<u8>) -> Decided {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let (client, stream) = pair().await;
    let record = seen.clone();
    let service = hyper::service::service_fn(move |request: Request<hyper::body::Incoming>| {
        let record = record.clone();
        async move {
            let (parts, body) = request.into_parts();
            let body = body.collect().await.ok().map(|b| b.to_bytes().to_vec());
            let request = Request::from_parts(parts, ());
            record.lock().unwrap().push(handed(&request, body));
            Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok"))))
        }
    });
    let server = tokio::spawn(async move {
        let _ = hyper::server::conn::http1::Builder::new()
            .half_close(true)
            .max_buf_size(16 << 10)
            .serve_connection(TokioIo::new(stream), service)
            .await;
    });
    let got = exchange_as_client(client, &bytes).await;
    let _ = server.await;
    let handed = seen.lock().unwrap().clone();
    Decided {
        handed,
        statuses: statuses(&got),
    }
}

/// A small seeded generator of HTTP/1.1 messages that knows the smuggling tricks.
struct Gen(fastrand::Rng);

impl Gen {
    fn pick<'a>(&mut self, from: &[&'a str]) -> &'a str {
        from[self.0.usize(..from.len())]
    }

    fn chance(&mut self, percent: u8) -> bool {
        self.0.u8(..100) < percent
    }

    fn data(&mut self) -> Vec<u8> {
        let len = self.pick_len();
        (0..len).map(|_| self.0.alphanumeric() as u8).collect()
    }

    fn pick_len(&mut self) -> usize {
        match self.0.u8(..4) {
            0 => 0,
            1 => self.0.usize(1..8),
            2 => self.0.usize(8..64),
            _ => self.0.usize(64..600),
        }
    }

    /// A chunked body, its framing sometimes off (sizes, line ends, extensions, trailers).
    fn chunked(&mut self, data: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        let mut rest = data;
        while !rest.is_empty() {
            let n = self.0.usize(1..=rest.len().min(200));
            let size = match self.0.u8(..10) {
                0 => format!("{n:X}"),
                1 => format!("00{n:x}"),
                2 => format!("{n:x} "),
                _ => format!("{n:x}"),
            };
            out.extend_from_slice(size.as_bytes());
            out.extend_from_slice(
                self.pick(&["", "", "", ";ext", ";a=b;c=\"d\"", " ;x"])
                    .as_bytes(),
            );
            out.extend_from_slice(
                self.pick(&["\r\n", "\r\n", "\r\n", "\r\n", "\n", "\r\r\n", "\r"])
                    .as_bytes(),
            );
            out.extend_from_slice(&rest[..n]);
            out.extend_from_slice(
                self.pick(&["\r\n", "\r\n", "\r\n", "\r\n", "\n", "", "xx"])
                    .as_bytes(),
            );
            rest = &rest[n..];
        }
        out.extend_from_slice(self.pick(&["0", "0", "00", "0;end"]).as_bytes());
        out.extend_from_slice(b"\r\n");
        if self.chance(20) {
            out.extend_from_slice(
                self.pick(&[
                    "x-t: 1\r\n",
                    "content-length: 5\r\n",
                    "bad trailer\r\n",
                    "x-t: 1\n",
                    " folded\r\n",
                ])
                .as_bytes(),
            );
        }
        out.extend_from_slice(self.pick(&["\r\n", "\r\n", "\r\n", "\n", ""]).as_bytes());
        out
    }

    fn request(&mut self) -> Vec<u8> {
        let method = self.pick(&[
            "GET", "POST", "POST", "PUT", "HEAD", "OPTIONS", "DELETE", "G\x01T", "get",
        ]);
        let target = self.pick(&[
            "/",
            "/v1/chat/completions",
            "/a?b=c",
            "http://x/abs",
            "*",
            "models",
            "example.com:80",
            "/sp ace",
            "//x",
            "/%00",
        ]);
        let version = self.pick(&[
            "HTTP/1.1",
            "HTTP/1.1",
            "HTTP/1.1",
            "HTTP/1.0",
            "HTTP/2.0",
            "HTTP/1.1 ",
        ]);
        let mut fields: Vec<Vec<u8>> = Vec::new();
        if self.chance(90) {
            fields.push(format!("{}: x\r\n", self.pick(&["host", "Host", "HOST"])).into_bytes());
        }
        if self.chance(5) {
            fields.push(b"host: y\r\n".to_vec());
        }
        let extras: &[(u8, &[u8])] = &[
            (10, b"expect: 100-continue\r\n"),
            (10, b"connection: close\r\n"),
            (5, b"connection: keep-alive, host\r\n"),
            (5, b"te: trailers\r\n"),
            (4, b"x-cr: a\rb\r\n"),
            (4, b"x-lf: a\nb: c\r\n"),
            (3, b": empty\r\n"),
            (3, b"x-obs: \x80\xff\r\n"),
        ];
        let start = format!("{method} {target} {version}\r\n");
        self.message(start, fields, extras)
    }

    /// A message after its start line: `fields`, fields that frame its body (a length in one
    /// of its forms, or a transfer coding, sometimes both or doubled), `extras` each by its
    /// chance in a hundred, tricks both sides share, in any order; then the blank line and the
    /// body, chunked (its framing sometimes off) when a coding was given.
    fn message(
        &mut self,
        start: String,
        mut fields: Vec<Vec<u8>>,
        extras: &[(u8, &[u8])],
    ) -> Vec<u8> {
        let data = self.data();
        let len = data.len();
        let framing = self.0.u8(..10);
        match framing {
            0 => {}
            1..=5 => {
                let value = match self.0.u8(..16) {
                    0 => format!("{len}, {len}"),
                    1 => format!("+{len}"),
                    2 => format!("0{len}"),
                    3 => format!("{len} "),
                    4 => format!("{}", len + 1),
                    5 => format!("{len},"),
                    6 => format!("{len}, {}", len + 1),
                    7 => format!(" {len}"),
                    8 => format!("-{len}"),
                    9 => format!("{len} {len}"),
                    _ => format!("{len}"),
                };
                let name = self.pick(&[
                    "content-length",
                    "Content-Length",
                    "content-length ",
                    "content_length",
                ]);
                fields.push(format!("{name}: {value}\r\n").into_bytes());
                if self.chance(10) {
                    let other = self.pick(&["0", "1", &len.to_string()]).to_string();
                    fields.push(format!("Content-Length: {other}\r\n").into_bytes());
                }
            }
            _ => {
                let value = self.pick(&[
                    "chunked",
                    "chunked",
                    "chunked",
                    "Chunked",
                    " chunked",
                    "chunked, chunked",
                    "gzip, chunked",
                    "chunked, gzip",
                    "identity",
                    "xchunked",
                    "chunked;q=1",
                ]);
                let name = self.pick(&[
                    "transfer-encoding",
                    "Transfer-Encoding",
                    "transfer-encoding ",
                    "transfer_encoding",
                ]);
                fields.push(format!("{name}: {value}\r\n").into_bytes());
                if self.chance(15) {
                    fields.push(b"transfer-encoding: chunked\r\n".to_vec());
                }
                if self.chance(25) {
                    fields.push(format!("content-length: {len}\r\n").into_bytes());
                }
            }
        }
        let shared: [(u8, &[u8]); 4] = [
            (4, b"x-fold: a\r\n b\r\n"),
            (4, b"x-nul: a\x00b\r\n"),
            (3, b"x-bare-lf: 1\n"),
            (5, b"connection: keep-alive\r\n"),
        ];
        for &(chance, field) in extras.iter().chain(&shared) {
            if self.chance(chance) {
                fields.push(field.to_vec());
            }
        }
        self.0.shuffle(&mut fields);
        let mut out = start.into_bytes();
        for field in fields {
            out.extend_from_slice(&field);
        }
        out.extend_from_slice(
            self.pick(&["\r\n", "\r\n", "\r\n", "\r\n", "\n"])
                .as_bytes(),
        );
        if framing >= 6 {
            let body = self.chunked(&data);
            out.extend_from_slice(&body);
        } else {
            out.extend_from_slice(&data);
        }
        out
    }

    /// One to three requests in one write, then a random mutation now and then.
    fn request_bytes(&mut self) -> Vec<u8> {
        let mut bytes = Vec::new();
        for _ in 0..self.0.usize(1..=3) {
            bytes.extend_from_slice(&self.request());
        }
        self.mutate(&mut bytes);
        bytes
    }

    fn mutate(&mut self, bytes: &mut Vec<u8>) {
        if bytes.is_empty() || !self.chance(30) {
            return;
        }
        for _ in 0..self.0.usize(1..4) {
            let at = self.0.usize(..bytes.len());
            match self.0.u8(..4) {
                0 => {
                    bytes[at] = self
                        .pick(&["\r", "\n", " ", "\t", ":", ";", "0", "a", "\x00"])
                        .as_bytes()[0]
                }
                1 => {
                    bytes.remove(at);
                }
                2 => bytes.insert(at, self.pick(&["\r", "\n", " ", "0"]).as_bytes()[0]),
                _ => bytes.truncate(at),
            }
            if bytes.is_empty() {
                return;
            }
        }
    }
}

/// The deliberately stricter request rules (see the table in `docs/MEASUREMENT.md`): whether
/// tokenmeter refusing `head` where hyper took it is one of them, and which.
fn stricter_request(head: &[u8]) -> Option<&'static str> {
    let text = String::from_utf8_lossy(head).to_ascii_lowercase();
    let line = text.lines().next().unwrap_or("");
    let target = line.split(' ').nth(1).unwrap_or("");
    if !(target.starts_with('/') || target.starts_with("http://") || target.starts_with("https://"))
    {
        return Some("a target neither origin-form nor absolute-form (RFC 9112 §3.2)");
    }
    let te: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("transfer-encoding:"))
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .collect();
    if !te.is_empty() && te != ["chunked"] {
        return Some("a transfer coding other than one chunked (RFC 9112 §6.1: 501)");
    }
    if !te.is_empty() && line.ends_with("http/1.0") {
        return Some("Transfer-Encoding in an HTTP/1.0 request (RFC 9112 §6.1)");
    }
    // hyper parses a length only when it comes before the coding; tokenmeter always does.
    let lengths: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("content-length:"))
        .collect();
    let invalid = headers::content_length(lengths.iter().map(|l| l.as_bytes())).is_err();
    if !te.is_empty() && invalid {
        return Some(
            "a Content-Length that does not parse beside a chunked coding (RFC 9112 §6.3)",
        );
    }
    None
}

/// Where two decisions part: both handed on the same requests before it, tokenmeter refused the
/// next one that hyper took, and a stricter rule names it. `Err` with why otherwise.
fn explained(bytes: &[u8], ours: &Decided, hypers: &Decided) -> Result<(), String> {
    if ours == hypers {
        return Ok(());
    }
    let same = ours
        .handed
        .iter()
        .zip(&hypers.handed)
        .take_while(|(a, b)| a == b)
        .count();
    let heads: Vec<&[u8]> = split_heads(bytes);
    // From the head where the sides part to the case's end.
    let from = |at: usize| {
        let start = heads
            .get(at)
            .map_or(0, |h| h.as_ptr() as usize - bytes.as_ptr() as usize);
        &bytes[start..]
    };
    // tokenmeter failed a body hyper read: a chunked body's end with a bare LF, which hyper
    // takes as the start of a trailer section it then parses loosely.
    if let (Some(a), Some(b)) = (ours.handed.get(same), hypers.handed.get(same)) {
        let body_only = Handed {
            body: b.body.clone(),
            ..a.clone()
        } == *b;
        if body_only && a.body.is_none() && b.body.is_some() {
            return stricter_body(from(same))
                .map(|_| ())
                .ok_or_else(|| "tokenmeter failed a body no stricter rule names".into());
        }
    }
    if !ours.refused() || same != ours.handed.len() || hypers.handed.len() <= same {
        return Err("the sides disagree, and not by tokenmeter refusing what hyper took".into());
    }
    // The head tokenmeter refused is at or after the (same + 1)-th request line of the case (a
    // body may hold text that reads as one): one of them must be a head a stricter rule names.
    heads[same.min(heads.len().saturating_sub(1))..]
        .iter()
        .find_map(|head| stricter_request(head))
        .map(|_| ())
        .ok_or_else(|| "tokenmeter refused a head no stricter rule names".into())
}

/// The deliberately stricter body rule: whether a chunked body tokenmeter failed where hyper
/// read it has a bare LF in its framing or trailers, after its head (hyper takes a bare LF
/// after the last chunk as the start of a trailer section, which it then parses loosely, and may
/// take the next request's head for trailers).
fn stricter_body(rest: &[u8]) -> Option<&'static str> {
    // The head ends at its first empty line, CRLF or bare LF (as httparse reads it).
    let end = [&b"\n\r\n"[..], b"\n\n"]
        .iter()
        .filter_map(|blank| memchr::memmem::find(rest, blank).map(|at| at + blank.len()))
        .min();
    let body = end.map_or(rest, |end| &rest[end..]);
    let bare_lf = body
        .iter()
        .enumerate()
        .any(|(i, &b)| b == b'\n' && (i == 0 || body[i - 1] != b'\r'));
    bare_lf.then_some("a bare LF in a chunked body's framing or trailers (RFC 9112 §7.1)")
}

/// The case's bytes cut where each request line seems to start (the token two before each
/// ` HTTP/`, a body running into it or not), roughly: for naming the heads a refusal may have
/// been about.
fn split_heads(bytes: &[u8]) -> Vec<&[u8]> {
    let blank = |b: &u8| matches!(b, b' ' | b'\r' | b'\n');
    let token_start = |end: usize| bytes[..end].iter().rposition(blank).map_or(0, |at| at + 1);
    let mut starts: Vec<usize> = std::iter::once(0)
        .chain(
            memchr::memmem::find_iter(bytes, b" HTTP/").filter_map(|at| {
                let target = token_start(at);
                (target > 0 && bytes[target - 1] == b' ').then(|| token_start(target - 1))
            }),
        )
        .collect();
    starts.sort_unstable();
    starts.dedup();
    starts
        .iter()
        .enumerate()
        .map(|(i, &s)| &bytes[s..starts.get(i + 1).copied().unwrap_or(bytes.len())])
        .collect()
}

/// Runs `cases` cases of `one` (by index), `PARALLEL` at a time; the failures, with their bytes.
async fn run<F, Fut>(cases: usize, one: F) -> Vec<String>
where
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = Result<(), String>> + Send + 'static,
{
    let mut failures = Vec::new();
    let mut running = tokio::task::JoinSet::new();
    for i in 0..cases {
        if running.len() >= PARALLEL {
            if let Some(Ok(Err(e))) = running.join_next().await {
                failures.push(e);
            }
        }
        running.spawn(one(i));
    }
    while let Some(done) = running.join_next().await {
        if let Ok(Err(e)) = done {
            failures.push(e);
        }
    }
    failures
}

/// Fails with the first few cases that disagree, and the seed to replay them.
fn assert_agreed(failures: &[String]) {
    let shown: Vec<&str> = failures.iter().take(5).map(String::as_str).collect();
    assert!(
        failures.is_empty(),
        "{} of {} cases disagree (seed {}):\n{}",
        failures.len(),
        cases(),
        seed(),
        shown.join("\n")
    );
}

/// Request bytes into tokenmeter's server and hyper's: the same requests handed on, the same
/// refusals, but where a documented stricter rule has tokenmeter refuse what hyper took.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_decides_as_hyper_does() {
    let mut gen = Gen(fastrand::Rng::with_seed(seed()));
    let all: Vec<Vec<u8>> = (0..cases()).map(|_| gen.request_bytes()).collect();
    let all = Arc::new(all);
    let stricter = Arc::new(Mutex::new(0usize));
    let counted = stricter.clone();
    let failures = run(all.len(), move |i| {
        let all = all.clone();
        let stricter = counted.clone();
        async move {
            let bytes = all[i].clone();
            let (a, b) = tokio::join!(ours(bytes.clone()), hypers(bytes.clone()));
            if a != b {
                *stricter.lock().unwrap() += 1;
            }
            explained(&bytes, &a, &b).map_err(|why| {
                format!(
                    "case {i}: {why}\n  bytes: {:?}\n  tokenmeter: {a:?}\n  hyper: {b:?}",
                    String::from_utf8_lossy(&bytes)
                )
            })
        }
    })
    .await;
    assert_agreed(&failures);
    eprintln!(
        "server side: {} cases, {} where tokenmeter was stricter by a documented rule",
        cases(),
        stricter.lock().unwrap()
    );
}

/// What one client made of a response.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Read {
    /// The status, the body's bytes.
    Whole(u16, Vec<u8>),
    /// The head, then the body failed.
    BodyFailed(u16),
    /// No response head.
    Refused,
}

/// A raw upstream: reads the request head, writes `bytes`, closes.
async fn upstream(bytes: Vec<u8>) -> (TcpStream, tokio::task::JoinHandle<()>) {
    let (client, mut server) = pair().await;
    let task = tokio::spawn(async move {
        let mut seen = Vec::new();
        let mut buf = [0u8; 1024];
        while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
            match server.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => seen.extend_from_slice(&buf[..n]),
            }
        }
        let _ = server.write_all(&bytes).await;
        let _ = server.shutdown().await;
    });
    (client, task)
}

async fn client_ours(bytes: Vec<u8>) -> Read {
    let (stream, task) = upstream(bytes).await;
    let mut conn = Box::new(Conn::new(stream));
    let mut request = Request::new(http_body_util::Either::Right(ReplayBody::of(Vec::new())));
    request
        .headers_mut()
        .insert(http::header::HOST, http::HeaderValue::from_static("x"));
    let (parts, body) = request.into_parts();
    let outgoing = Outgoing {
        parts: Box::new(parts),
        body,
    };
    let read = match tokio::time::timeout(DEADLINE, conn.exchange(outgoing))
        .await
        .expect("in time")
    {
        Err(_) => Read::Refused,
        Ok((head, framing)) => {
            let pool = Arc::new(Pool::new("127.0.0.1:9".into(), DEADLINE, 1));
            let body = PooledBody::new(conn, framing, pool);
            match tokio::time::timeout(DEADLINE, body.collect())
                .await
                .expect("in time")
            {
                Ok(body) => Read::Whole(head.status().as_u16(), body.to_bytes().to_vec()),
                Err(_) => Read::BodyFailed(head.status().as_u16()),
            }
        }
    };
    task.abort();
    read
}

async fn client_hypers(bytes: Vec<u8>) -> Read {
    let (stream, task) = upstream(bytes).await;
    let Ok((mut sender, conn)) =
        hyper::client::conn::http1::handshake::<_, Full<Bytes>>(TokioIo::new(stream)).await
    else {
        return Read::Refused;
    };
    let driver = tokio::spawn(conn);
    let request = Request::builder()
        .uri("/")
        .header(http::header::HOST, "x")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let read = match tokio::time::timeout(DEADLINE, sender.send_request(request))
        .await
        .expect("in time")
    {
        Err(_) => Read::Refused,
        Ok(response) => {
            let status = response.status().as_u16();
            match tokio::time::timeout(DEADLINE, response.into_body().collect())
                .await
                .expect("in time")
            {
                Ok(body) => Read::Whole(status, body.to_bytes().to_vec()),
                Err(_) => Read::BodyFailed(status),
            }
        }
    };
    driver.abort();
    task.abort();
    read
}

impl Gen {
    fn response_bytes(&mut self) -> Vec<u8> {
        let mut out = Vec::new();
        if self.chance(10) {
            out.extend_from_slice(
                self.pick(&[
                    "HTTP/1.1 100 Continue\r\n\r\n",
                    "HTTP/1.1 103 Early Hints\r\nlink: </a>\r\n\r\n",
                ])
                .as_bytes(),
            );
        }
        let status = self.pick(&[
            "200 OK",
            "200 OK",
            "200 OK",
            "201 Created",
            "404 Not Found",
            "500 X",
            "204 No Content",
            "304 Not Modified",
            "600 X",
            "099 X",
            "200",
            "2000 X",
        ]);
        let version = self.pick(&[
            "HTTP/1.1", "HTTP/1.1", "HTTP/1.1", "HTTP/1.0", "HTTP/1.2", "HTTP/2",
        ]);
        let start = format!("{version} {status}\r\n");
        let fields = vec![b"content-type: text/event-stream\r\n".to_vec()];
        let extras: &[(u8, &[u8])] = &[(10, b"connection: close\r\n")];
        let message = self.message(start, fields, extras);
        out.extend_from_slice(&message);
        self.mutate(&mut out);
        out
    }
}

/// The deliberately stricter response rules: whether tokenmeter refusing a response hyper read
/// is one of them.
fn stricter_response(bytes: &[u8]) -> Option<&'static str> {
    let text = String::from_utf8_lossy(bytes).to_ascii_lowercase();
    let final_line = text
        .split("\r\n\r\n")
        .map(|h| h.lines().next().unwrap_or(""))
        .find(|l| {
            !l.contains(" 1")
                || l.contains(" 1") && !l.split(' ').nth(1).is_some_and(|c| c.starts_with('1'))
        })
        .unwrap_or("");
    let code: u16 = final_line
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    if !(100..=599).contains(&code) {
        return Some("a status outside 100-599 (RFC 9110 §15)");
    }
    // `chunked` before another coding and again last: chunked twice (RFC 9112 §6.1); hyper
    // reads the last one.
    let codings: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("transfer-encoding:"))
        .collect();
    if headers::codings(codings.iter().map(|c| c.as_bytes())) == headers::Codings::ChunkedTwice {
        return Some("a body chunked more than once (RFC 9112 §6.1)");
    }
    // hyper reads no length for 204 and 304; tokenmeter judges it, as it forwards it.
    let lengths: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("content-length:"))
        .collect();
    let invalid = headers::content_length(lengths.iter().map(|l| l.as_bytes())).is_err();
    if (code == 204 || code == 304) && invalid {
        return Some("a 204 or 304 whose Content-Length is invalid (RFC 9110 §8.6)");
    }
    None
}

/// Response bytes into tokenmeter's client and hyper's: the same status and body, or both
/// refusing, but where a documented stricter rule has tokenmeter refuse what hyper read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_reads_as_hyper_does() {
    let mut gen = Gen(fastrand::Rng::with_seed(seed() ^ 0x5eed));
    let all: Vec<Vec<u8>> = (0..cases()).map(|_| gen.response_bytes()).collect();
    let all = Arc::new(all);
    let failures = run(all.len(), move |i| {
        let all = all.clone();
        async move {
            let bytes = all[i].clone();
            let (a, b) = tokio::join!(client_ours(bytes.clone()), client_hypers(bytes.clone()));
            let agreed = a == b
                || (a == Read::Refused && stricter_response(&bytes).is_some())
                // A body that fails after its head, on both sides, however far each read.
                || matches!((&a, &b), (Read::BodyFailed(x), Read::BodyFailed(y)) if x == y)
                || (matches!((&a, &b), (Read::BodyFailed(x), Read::Whole(y, _)) if x == y)
                    && stricter_body(&bytes).is_some());
            if agreed {
                return Ok(());
            }
            Err(format!(
                "case {i}: the clients disagree\n  bytes: {:?}\n  tokenmeter: {a:?}\n  hyper: {b:?}",
                String::from_utf8_lossy(&bytes)
            ))
        }
    })
    .await;
    assert_agreed(&failures);
}
