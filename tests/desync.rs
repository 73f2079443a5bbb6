//! Request smuggling and desync, end to end on raw sockets. A recording upstream keeps every byte
//! each of its connections received and answers each request it frames with exact bytes; clients
//! write exact bytes to the proxy. Whatever a client sends and whatever an upstream answers, the
//! upstream receives whole requests with one framing each, no request carries the bytes of two
//! clients, and no client reads another's answer.

mod common;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::time::{timeout_at, Instant};

use common::{proxy, TestProxy};

const DEADLINE: Duration = Duration::from_secs(10);
/// How long an upstream that answers without reading a body waits for that body to arrive: the
/// worst case, a body forwarded before the early answer, is then what the test meets.
const BODY_WAIT: Duration = Duration::from_secs(2);
const USER_A: &str = "user-A-3f9c";
const USER_B: &str = "user-B-81d2";
const CHUNKED: &str = "Transfer-Encoding: chunked";

// A strict HTTP/1.1 framer, for both sides. -------------------------------------------------

/// One message as framed here: the start line's three parts, the fields, the body, the trailers
/// of a chunked body, and every byte it took.
#[derive(Clone, Debug, Default)]
struct Msg {
    start: Vec<String>,
    fields: Vec<(String, String)>,
    body: Vec<u8>,
    trailers: Vec<(String, String)>,
    raw: Vec<u8>,
}

impl Msg {
    fn all(&self, name: &str) -> Vec<&str> {
        let named = |(k, _): &&(String, String)| k.eq_ignore_ascii_case(name);
        let fields = self.fields.iter().filter(named);
        fields.map(|(_, v)| v.as_str()).collect()
    }

    fn target(&self) -> &str {
        &self.start[1]
    }

    fn status(&self) -> u16 {
        self.start[1].parse().unwrap_or(0)
    }
}

/// Bytes as a quoted string for messages (CR and LF visible), cut at 1,500 characters.
fn shown(bytes: &[u8]) -> String {
    let text: String = String::from_utf8_lossy(bytes).chars().take(1500).collect();
    format!("{text:?}")
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

fn contains(haystack: &[u8], needle: &str) -> bool {
    find(haystack, needle.as_bytes()).is_some()
}

/// A length as RFC 9110 allows it: digits only.
fn length(value: &str) -> Option<usize> {
    let digits = value.bytes().all(|b| b.is_ascii_digit());
    digits.then(|| value.parse().ok())?
}

/// The head at the front of `buf`, as a message with no body. CRLF only, no obs-fold, no
/// whitespace in or before a field name.
fn head(buf: &[u8]) -> Result<Option<Msg>, String> {
    let Some(end) = find(buf, b"\r\n\r\n") else {
        return Ok(None);
    };
    let text = std::str::from_utf8(&buf[..end]).map_err(|_| "a head that is not UTF-8")?;
    let mut lines = text.split("\r\n");
    let start = lines.next().unwrap_or("").splitn(3, ' ').map(String::from);
    let mut msg = Msg {
        start: start.collect(),
        ..Msg::default()
    };
    if msg.start.len() != 3 || msg.start.iter().any(|p| p.contains(['\r', '\n'])) {
        return Err(format!("a malformed start line {:?}", msg.start));
    }
    let token = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
    for line in lines {
        let (name, value) = line.split_once(':').unwrap_or(("", ""));
        if name.is_empty() || !name.bytes().all(token) || line.contains(['\r', '\n']) {
            return Err(format!("a malformed field line {line:?}"));
        }
        let value = value.trim_matches([' ', '\t']).to_string();
        msg.fields.push((name.to_string(), value));
    }
    msg.raw = buf[..end + 4].to_vec();
    Ok(Some(msg))
}

/// How a body is delimited.
enum Framing {
    Length(usize),
    Chunked,
    Close,
}

/// The message whose head is `msg` with the body that follows it in `buf`; `None` while
/// incomplete. At the end of the stream (`eof`) a body delimited by the close is whole, and one
/// delimited by a length is what came.
fn complete(mut msg: Msg, buf: &[u8], framing: Framing, eof: bool) -> Result<Option<Msg>, String> {
    let (head, rest) = buf.split_at(msg.raw.len());
    let whole = |n: usize| Some((rest[..n].to_vec(), Vec::new(), n));
    let found = match framing {
        Framing::Length(n) if rest.len() >= n || eof => whole(n.min(rest.len())),
        Framing::Close if eof => whole(rest.len()),
        Framing::Length(_) | Framing::Close => None,
        Framing::Chunked => chunked(rest)?,
    };
    let Some((body, trailers, n)) = found else {
        return Ok(None);
    };
    (msg.body, msg.trailers, msg.raw) = (body, trailers, buf[..head.len() + n].to_vec());
    Ok(Some(msg))
}

/// A chunked body at the front of `buf`, strictly (hex sizes, CRLF everywhere): its data, its
/// trailers and how many bytes it took; `None` while incomplete.
type Chunked = (Vec<u8>, Vec<(String, String)>, usize);

fn chunked(buf: &[u8]) -> Result<Option<Chunked>, String> {
    let (mut at, mut data) = (0, Vec::new());
    loop {
        let Some(eol) = find(&buf[at..], b"\r\n") else {
            if buf[at..].contains(&b'\n') {
                return Err("a bare LF in a chunk line".into());
            }
            return Ok(None);
        };
        let line = std::str::from_utf8(&buf[at..at + eol]).unwrap_or("\r");
        let hex = |s: &&str| s.bytes().all(|b| b.is_ascii_hexdigit()) && !line.contains('\r');
        let digits = line.split(';').next().filter(hex);
        let size = digits.map(|s| usize::from_str_radix(s, 16));
        let Some(Ok(size)) = size else {
            return Err(format!("a bad chunk-size line {line:?}"));
        };
        at += eol + 2;
        if size == 0 {
            let mut trailers = Vec::new();
            while let Some(eol) = find(&buf[at..], b"\r\n") {
                let line = String::from_utf8_lossy(&buf[at..at + eol]).into_owned();
                at += eol + 2;
                if line.is_empty() {
                    return Ok(Some((data, trailers, at)));
                }
                let (k, v) = line.split_once(':').ok_or("a trailer without a colon")?;
                trailers.push((k.to_string(), v.trim().to_string()));
            }
            return Ok(None);
        }
        let Some(chunk) = buf.get(at..at + size + 2) else {
            return Ok(None);
        };
        if !chunk.ends_with(b"\r\n") {
            return Err("chunk data not followed by CRLF".into());
        }
        data.extend_from_slice(&chunk[..size]);
        at += size + 2;
    }
}

/// The request at the front of `buf`, HTTP/1.1 with exactly one framing (one plain
/// Content-Length field, one `Transfer-Encoding: chunked`, or neither); `None` while
/// incomplete. With `head_only` the body is left where it is.
fn frame_request(buf: &[u8], head_only: bool) -> Result<Option<Msg>, String> {
    let Some(msg) = head(buf)? else {
        return Ok(None);
    };
    let (lengths, codings) = (msg.all("content-length"), msg.all("transfer-encoding"));
    let framing = match (lengths.as_slice(), codings.as_slice()) {
        _ if msg.start[2] != "HTTP/1.1" => return Err(format!("not HTTP/1.1: {:?}", msg.start)),
        ([], []) => Framing::Length(0),
        _ if head_only => Framing::Length(0),
        ([], [te]) if te.eq_ignore_ascii_case("chunked") => Framing::Chunked,
        ([one], []) => Framing::Length(length(one).ok_or(format!("Content-Length {one:?}"))?),
        _ => return Err(format!("framed by {lengths:?} and {codings:?}")),
    };
    complete(msg, buf, framing, false)
}

/// The response at the front of `buf`, its body read by its framing, leniently (a length
/// listed twice as the same number is that number).
fn frame_response(buf: &[u8], bodiless: bool, eof: bool) -> Result<Option<Msg>, String> {
    let Some(msg) = head(buf)? else {
        return Ok(None);
    };
    let status = msg.status();
    let codings = msg.all("transfer-encoding");
    let last = codings.last().and_then(|v| v.rsplit(',').next());
    let lengths: Vec<Option<usize>> = (msg.all("content-length").iter())
        .flat_map(|v| v.split(','))
        .map(|v| v.trim().trim_start_matches('+').parse().ok())
        .collect();
    let same = lengths.iter().all(|&l| l == lengths[0]);
    let framing = match lengths.first() {
        _ if bodiless || status < 200 || status == 204 || status == 304 => Framing::Length(0),
        _ if last.is_some_and(|c| c.trim().eq_ignore_ascii_case("chunked")) => Framing::Chunked,
        Some(&Some(n)) if same => Framing::Length(n),
        _ => Framing::Close,
    };
    complete(msg, buf, framing, eof)
}

/// A connection's bytes as whole requests, and what follows them: nothing (`Ok(false)`), part
/// of a request (`Ok(true)`), or bytes that frame no request.
fn split_requests(raw: &[u8]) -> (Vec<Msg>, Result<bool, String>) {
    let (mut at, mut out) = (0, Vec::new());
    while at < raw.len() {
        match frame_request(&raw[at..], false) {
            Ok(Some(m)) => {
                at += m.raw.len();
                out.push(m);
            }
            Ok(None) => return (out, Ok(true)),
            Err(e) => return (out, Err(e)),
        }
    }
    (out, Ok(false))
}

// The recording upstream. --------------------------------------------------------------------

/// What one upstream connection received, and what its own framer made of it.
#[derive(Clone, Debug, Default)]
struct UpConn {
    raw: Vec<u8>,
    parsed: Vec<Msg>,
    /// The proxy closed it (or the upstream did, on a request it could not frame).
    closed: bool,
}

/// The upstream's answer to a request: exact bytes, and whether to skip the request's body
/// (not read, it is framed as the next request).
struct Answer(Vec<u8>, bool);

fn answer(bytes: &str) -> Answer {
    Answer(bytes.as_bytes().to_vec(), false)
}

/// A 200 whose body names the request: method, target, every `x-user`, the body.
fn echo(req: &Msg) -> Answer {
    let (users, body) = (req.all("x-user").join(","), shown(&req.body));
    let body = format!("{} {} user={users} body={body}", req.start[0], req.target());
    let head = format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n", body.len());
    answer(&(head + &body))
}

/// How the upstream answers each request.
trait Scripted: Fn(&Msg) -> Answer + Send + Sync + 'static {}
impl<F: Fn(&Msg) -> Answer + Send + Sync + 'static> Scripted for F {}
type Script = Arc<dyn Scripted>;

/// The upstream's connections, and a counter bumped at each change, to wait on.
type Shared = Arc<(Mutex<Vec<UpConn>>, watch::Sender<u64>)>;

fn note(shared: &Shared, index: usize, change: impl FnOnce(&mut UpConn)) {
    change(&mut shared.0.lock().unwrap()[index]);
    shared.1.send_modify(|n| *n += 1);
}

struct Upstream {
    addr: SocketAddr,
    shared: Shared,
}

impl Upstream {
    async fn start(script: impl Scripted) -> Upstream {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let shared: Shared = Arc::new((Mutex::default(), watch::channel(0).0));
        let (script, all): (Script, _) = (Arc::new(script), shared.clone());
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let index = {
                    let mut conns = all.0.lock().unwrap();
                    conns.push(UpConn::default());
                    conns.len() - 1
                };
                let conn = UpConnTask(stream, index, Vec::new(), all.clone());
                tokio::spawn(conn.run(script.clone()));
            }
        });
        Upstream { addr, shared }
    }

    fn snapshot(&self) -> Vec<UpConn> {
        self.shared.0.lock().unwrap().clone()
    }

    /// Waits (up to DEADLINE) until `done` holds of the connections; whether it did.
    async fn wait_until(&self, mut done: impl FnMut(&[UpConn]) -> bool) -> bool {
        let mut changes = self.shared.1.subscribe();
        let deadline = Instant::now() + DEADLINE;
        while !done(&self.shared.0.lock().unwrap()) {
            if timeout_at(deadline, changes.changed()).await.is_err() {
                return false;
            }
        }
        true
    }

    /// The connection on which the upstream framed a request for `target`.
    fn conn_of(&self, target: &str) -> Option<usize> {
        let framed = |c: &UpConn| c.parsed.iter().any(|m| m.target() == target);
        self.snapshot().iter().position(framed)
    }

    /// The request for `target` as the upstream framed it.
    fn parsed(&self, target: &str) -> Option<Msg> {
        let mut all = self.snapshot().into_iter().flat_map(|c| c.parsed);
        all.find(|m| m.target() == target)
    }

    /// Whether these bytes reached the upstream at all.
    fn received(&self, needle: &str) -> bool {
        self.snapshot().iter().any(|c| contains(&c.raw, needle))
    }
}

/// One upstream connection: its socket, its index, what it holds unframed.
struct UpConnTask(TcpStream, usize, Vec<u8>, Shared);

impl UpConnTask {
    /// Reads more; false at the end of the stream (or at `until`).
    async fn more(&mut self, until: Option<Instant>) -> bool {
        let mut chunk = vec![0u8; 64 << 10];
        let until = until.unwrap_or_else(|| Instant::now() + Duration::from_secs(3600));
        match timeout_at(until, self.0.read(&mut chunk)).await {
            Err(_) => false,
            Ok(Ok(n)) if n > 0 => {
                self.2.extend_from_slice(&chunk[..n]);
                note(&self.3, self.1, |c| c.raw.extend_from_slice(&chunk[..n]));
                true
            }
            Ok(_) => {
                note(&self.3, self.1, |c| c.closed = true);
                false
            }
        }
    }

    /// Reads until a request (or its head) is whole; `None` if the connection ended first or
    /// the request was malformed (then the connection is closed, as a strict server does).
    async fn frame(&mut self, head_only: bool) -> Option<Msg> {
        loop {
            match frame_request(&self.2, head_only) {
                Ok(Some(m)) => return Some(m),
                Ok(None) if self.more(None).await => {}
                Ok(None) => return None,
                Err(_) => {
                    note(&self.3, self.1, |c| c.closed = true);
                    return None;
                }
            }
        }
    }

    async fn run(mut self, script: Script) -> Option<()> {
        loop {
            let mut head = self.frame(true).await?;
            let Answer(bytes, skip_body) = script(&head);
            let length = head.all("content-length").first().and_then(|v| length(v));
            let want = head.raw.len() + length.unwrap_or(0);
            let until = Instant::now() + BODY_WAIT;
            while skip_body && self.2.len() < want && self.more(Some(until)).await {}
            if !skip_body {
                head = self.frame(false).await?;
            }
            self.2.drain(..head.raw.len());
            note(&self.3, self.1, |c| c.parsed.push(head));
            self.0.write_all(&bytes).await.ok()?;
        }
    }
}

async fn setup(script: impl Scripted) -> (Upstream, TestProxy) {
    let up = Upstream::start(script).await;
    let p = proxy(up.addr, |_| {}).await;
    (up, p)
}

/// The general properties, once the upstream has everything (each connection closed or at a
/// request boundary): each connection's bytes are whole requests with one framing each (part of
/// one may end a connection the proxy closed), and no request, as framed strictly or as the
/// upstream's own framer read it, carries two clients' markers.
async fn clean(up: &Upstream, markers: &[&str]) -> Vec<String> {
    let settled = |c: &UpConn| c.closed || split_requests(&c.raw).1 != Ok(true);
    up.wait_until(|conns| conns.iter().all(settled)).await;
    let mut problems = Vec::new();
    for (i, c) in up.snapshot().iter().enumerate() {
        let (requests, tail) = split_requests(&c.raw);
        let (whole, raw, open) = (requests.len(), shown(&c.raw), !c.closed);
        match tail {
            Err(e) => problems.push(format!("upstream {i}: {e} after {whole} requests: {raw}")),
            Ok(true) if open => problems.push(format!("upstream {i}: open mid-request: {raw}")),
            Ok(_) => {}
        }
        for m in requests.iter().chain(&c.parsed) {
            let carried: Vec<&&str> = markers.iter().filter(|k| contains(&m.raw, k)).collect();
            if carried.len() > 1 {
                let text = shown(&m.raw);
                problems.push(format!("upstream {i}: a request has {carried:?}: {text}"));
            }
        }
    }
    problems
}

fn assert_none(problems: &[String]) {
    assert!(problems.is_empty(), "\n{}", problems.join("\n"));
}

// Clients. -----------------------------------------------------------------------------------

/// A client connection: the socket, what it holds unframed, whether the proxy closed it.
struct Client(TcpStream, Vec<u8>, bool);

impl Client {
    async fn connect(addr: SocketAddr) -> Client {
        let stream = TcpStream::connect(addr).await.unwrap();
        stream.set_nodelay(true).unwrap();
        Client(stream, Vec::new(), false)
    }

    /// Writes, ignoring a proxy that already closed (its answer is still read).
    async fn send(&mut self, bytes: impl AsRef<[u8]>) {
        let _ = self.0.write_all(bytes.as_ref()).await;
    }

    /// The next response (a 1xx included); `None` if the connection closed before a head. A
    /// body cut short by the close is what arrived.
    async fn response(&mut self, bodiless: bool) -> Option<Msg> {
        let deadline = Instant::now() + DEADLINE;
        let mut chunk = vec![0u8; 64 << 10];
        loop {
            match frame_response(&self.1, bodiless, self.2) {
                Err(e) => panic!("a malformed answer ({e}): {}", shown(&self.1)),
                Ok(Some(m)) => {
                    self.1.drain(..m.raw.len());
                    return Some(m);
                }
                Ok(None) if self.2 && self.1.is_empty() => return None,
                Ok(None) if self.2 => panic!("an answer cut short: {}", shown(&self.1)),
                Ok(None) => match timeout_at(deadline, self.0.read(&mut chunk)).await {
                    Err(_) => panic!("no whole answer in {DEADLINE:?}: {}", shown(&self.1)),
                    Ok(Ok(n)) if n > 0 => self.1.extend_from_slice(&chunk[..n]),
                    Ok(_) => self.2 = true,
                },
            }
        }
    }
}

/// One request on a new connection to the proxy, and its answer.
async fn ask(p: &TestProxy, request: impl AsRef<[u8]>) -> Option<Msg> {
    let mut client = Client::connect(p.running.listen).await;
    client.send(request).await;
    client.response(false).await
}

fn get(target: &str, user: &str) -> String {
    format!("GET {target} HTTP/1.1\r\nHost: x\r\nx-user: {user}\r\n\r\n")
}

/// What is wrong, if anything, with taking `got` for the upstream's echo of `target` for
/// `user`, naming none of `others`.
fn not_echo(got: Option<&Msg>, target: &str, user: &str, others: &[&str]) -> Option<String> {
    let Some(m) = got else {
        return Some(format!("{target} for {user}: closed, no answer"));
    };
    let body = String::from_utf8_lossy(&m.body);
    let ok = m.status() == 200
        && body.contains(&format!(" {target} "))
        && body.contains(user)
        && !others.iter().any(|o| body.contains(o));
    (!ok).then(|| format!("{target} for {user}: got {}", shown(&m.raw)))
}

fn status_of(got: &Option<Msg>) -> String {
    let status = |m: &Msg| m.status().to_string();
    got.as_ref().map_or("closed, no answer".into(), status)
}

// The tests. ---------------------------------------------------------------------------------

/// A request with `Expect: 100-continue` that the upstream answered early, without reading its
/// body, must never leave that body on a kept connection, where the upstream reads it as the
/// next request: a body shaped like a request was answered in place of another user's request,
/// or took that user's fields (credentials) as its own.
#[tokio::test]
async fn an_early_answer_to_expect_100_continue_smuggles_nothing_into_another_users_request() {
    let mut problems = Vec::new();
    let smuggled = format!("GET /smuggled HTTP/1.1\r\nHost: x\r\nx-user: {USER_A}\r\n");
    for (variant, body) in [
        ("a whole request", format!("{smuggled}\r\n")),
        ("an unterminated head", format!("{smuggled}x-ignore: ")),
    ] {
        let (up, p) = setup(|req: &Msg| match req.all("expect").first() {
            Some(v) if v.eq_ignore_ascii_case("100-continue") => {
                let bytes = b"HTTP/1.1 401 Unauthorized\r\ncontent-length: 0\r\n\r\n";
                Answer(bytes.to_vec(), true)
            }
            _ => echo(req),
        })
        .await;
        let mut a = Client::connect(p.running.listen).await;
        let length = body.len();
        a.send(format!("POST /a HTTP/1.1\r\nHost: x\r\nx-user: {USER_A}\r\nExpect: 100-continue\r\nContent-Length: {length}\r\n\r\n")).await;
        let first = a.response(false).await;
        let mut a_got = vec![status_of(&first)];
        if first.is_some_and(|m| m.status() == 100) {
            a.send(&body).await;
            a_got.push(status_of(&a.response(false).await));
        }
        let b = format!("GET /b HTTP/1.1\r\nHost: x\r\nx-user: {USER_B}\r\nAuthorization: Bearer {USER_B}\r\n\r\n");
        let b = ask(&p, b).await;
        if let Some(e) = not_echo(b.as_ref(), "/b", USER_B, &[USER_A, "/smuggled"]) {
            problems.push(format!("{variant} (A got {a_got:?}): B's answer: {e}"));
        }
        let smuggled_b = |m: &Msg| m.target() == "/smuggled" && contains(&m.raw, USER_B);
        for c in up.snapshot() {
            for m in c.parsed.iter().filter(|m| smuggled_b(m)) {
                let text = shown(&m.raw);
                problems.push(format!("{variant}: /smuggled read with B's fields: {text}"));
            }
        }
        problems.extend(clean(&up, &[USER_A, USER_B]).await);
    }
    assert_none(&problems);
}

/// An upstream that says `chunked` twice (two fields, or a list) must never make the client's
/// head say it twice: the client would decode the body twice.
#[tokio::test]
async fn a_doubled_chunked_coding_reaches_the_client_once() {
    let (up, p) = setup(|req: &Msg| {
        let coding = match req.target() {
            "/fields" => "transfer-encoding: chunked\r\ntransfer-encoding: chunked",
            "/list" => "transfer-encoding: chunked, chunked",
            _ => return echo(req),
        };
        let body = "5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n";
        answer(&format!("HTTP/1.1 200 OK\r\n{coding}\r\n\r\n{body}"))
    })
    .await;
    let mut problems = Vec::new();
    for target in ["/fields", "/list"] {
        let got = ask(&p, get(target, USER_A)).await.expect("an answer");
        let said = got.all("transfer-encoding").join(",");
        let said = said.matches("chunked").count();
        if got.status() != 200 || said != 1 || got.body != b"hello world" {
            problems.push(format!("{target}: {said} chunked in {}", shown(&got.raw)));
        }
    }
    problems.extend(clean(&up, &[]).await);
    assert_none(&problems);
}

/// `Connection` naming `Host` or a framing field must never strip the request of its `Host` or
/// of its body's framing on the way upstream.
#[tokio::test]
async fn connection_cannot_strip_host_or_the_body_framing() {
    let (up, p) = setup(echo).await;
    let mut problems = Vec::new();
    let (length, coding) = ("Content-Length: 5", "Transfer-Encoding: chunked");
    let by_length = format!("Connection: content-length\r\n{length}");
    let by_coding = format!("Connection: transfer-encoding\r\n{coding}");
    for (target, fields, body) in [
        ("/host", "Connection: host", ""),
        ("/length", &by_length, "hello"),
        ("/chunked", &by_coding, "5\r\nhello\r\n0\r\n\r\n"),
    ] {
        let method = if body.is_empty() { "GET" } else { "POST" };
        let head = format!("{method} {target} HTTP/1.1\r\nHost: example\r\nx-user: {USER_A}");
        let got = ask(&p, format!("{head}\r\n{fields}\r\n\r\n{body}")).await;
        problems.extend(not_echo(got.as_ref(), target, USER_A, &[]));
        let want: &[u8] = if body.is_empty() { b"" } else { b"hello" };
        let sent = up.parsed(target);
        let ok = |m: &Msg| m.all("host") == ["example"] && m.body == want;
        if !sent.as_ref().is_some_and(ok) {
            let sent = sent.map(|m| shown(&m.raw));
            problems.push(format!("{target}: the upstream got {sent:?}"));
        }
    }
    problems.extend(clean(&up, &[]).await);
    assert_none(&problems);
}

/// A request length said twice (`5, 5`, or two fields) must never be forwarded as it came: the
/// proxy answers 400 (as nginx does), or forwards one `content-length: 5`.
#[tokio::test]
async fn a_repeated_request_length_is_refused_or_forwarded_once() {
    let (up, p) = setup(echo).await;
    let mut problems = Vec::new();
    for (target, fields) in [
        ("/list", "Content-Length: 5, 5"),
        ("/fields", "Content-Length: 5\r\nContent-Length: 5"),
    ] {
        let head = format!("POST {target} HTTP/1.1\r\nHost: x\r\nx-user: {USER_A}\r\n{fields}");
        let got = ask(&p, format!("{head}\r\n\r\nhello")).await;
        let sent = up.parsed(target);
        let once = |m: &Msg| m.all("content-length") == ["5"] && m.body == b"hello";
        let ok = match got.as_ref().map(Msg::status) {
            Some(400) => !up.received(target),
            Some(200) => sent.as_ref().is_some_and(once),
            _ => false,
        };
        if !ok {
            let (status, sent) = (status_of(&got), sent.map(|m| shown(&m.raw)));
            problems.push(format!("{target}: got {status}, upstream got {sent:?}"));
        }
    }
    problems.extend(clean(&up, &[]).await);
    assert_none(&problems);
}

/// After the answer to `bad`, the next request goes on a new upstream connection and the old
/// one is closed; what is wrong if not.
async fn moved_on(up: &Upstream, p: &TestProxy, bad: &str) -> Option<String> {
    let next = format!("{bad}-next");
    let got = ask(p, get(&next, USER_A)).await;
    if let Some(e) = not_echo(got.as_ref(), &next, USER_A, &[]) {
        return Some(e);
    }
    let (Some(old), Some(new)) = (up.conn_of(bad), up.conn_of(&next)) else {
        return Some(format!("the upstream did not frame both {bad} and {next}"));
    };
    if old == new {
        return Some(format!("{next} went on the connection that answered {bad}"));
    }
    let closed = up.wait_until(|c| c[old].closed).await;
    (!closed).then(|| format!("the connection that answered {bad} was kept open"))
}

/// An upstream response with an invalid length must never reach the client, nor its connection
/// be used again; identical repeated lengths must never reach the client twice; an HTTP/1.0
/// response with a transfer coding must never have its connection reused.
#[tokio::test]
async fn an_upstreams_invalid_response_framing_is_a_502_and_its_connection_goes() {
    let (up, p) = setup(|req: &Msg| {
        let length = match req.target() {
            "/plus" => "Content-Length: +5",
            "/minus" => "Content-Length: -5",
            "/spaced" => "Content-Length: 5 5",
            "/hex" => "Content-Length: 0x5",
            "/list" => "Content-Length: 5, 5",
            "/fields" => "Content-Length: 5\r\nContent-Length: 5",
            "/http10" => return answer("HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"),
            _ => return echo(req),
        };
        answer(&format!("HTTP/1.1 200 OK\r\n{length}\r\n\r\nhello"))
    })
    .await;
    let mut problems = Vec::new();
    let targets = ["/plus", "/minus", "/spaced", "/hex", "/list", "/fields"];
    for target in targets.into_iter().chain(["/http10"]) {
        let got = ask(&p, get(target, USER_A)).await;
        let once = |m: &Msg| m.all("content-length") == ["5"] && m.body == b"hello";
        let ok = match (target, got.as_ref().map(Msg::status)) {
            ("/http10", _) | (_, Some(502)) => true,
            ("/list" | "/fields", Some(200)) => got.as_ref().is_some_and(once),
            _ => false,
        };
        if !ok {
            let got = got.as_ref().map_or("no answer".into(), |m| shown(&m.raw));
            problems.push(format!("{target}: the client got {got}"));
        }
        if !matches!(target, "/list" | "/fields") {
            problems.extend(moved_on(&up, &p, target).await);
        }
    }
    assert_none(&problems);
}

/// A HEAD answer that is chunked or has no length must never get a `content-length: 0` the
/// proxy invented, and a 204 must never reach the client with a Content-Length.
#[tokio::test]
async fn head_and_204_answers_get_no_invented_or_stray_length() {
    let (up, p) = setup(|req: &Msg| match (req.start[0].as_str(), req.target()) {
        ("HEAD", "/chunked") => answer("HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"),
        ("HEAD", "/unframed") => answer("HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n\r\n"),
        ("HEAD", "/sized") => answer("HTTP/1.1 200 OK\r\ncontent-length: 42\r\n\r\n"),
        (_, "/empty0") => answer("HTTP/1.1 204 No Content\r\ncontent-length: 0\r\n\r\n"),
        (_, "/empty7") => answer("HTTP/1.1 204 No Content\r\ncontent-length: 7\r\n\r\n"),
        _ => echo(req),
    })
    .await;
    let mut problems = Vec::new();
    for (method, target, want) in [
        ("HEAD", "/chunked", &[][..]),
        ("HEAD", "/unframed", &[]),
        ("HEAD", "/sized", &["42"]),
        ("GET", "/empty0", &[]),
        ("GET", "/empty7", &[]),
    ] {
        let mut client = Client::connect(p.running.listen).await;
        let request = format!("{method} {target} HTTP/1.1\r\nHost: x\r\n\r\n");
        client.send(request).await;
        let got = client.response(method == "HEAD").await.expect("an answer");
        let coded = got.status() == 204 && !got.all("transfer-encoding").is_empty();
        if got.all("content-length") != want || coded {
            let got = shown(&got.raw);
            problems.push(format!("{method} {target}: the client got {got}"));
        }
        // The connection is still framed right: the next answer is the next request's.
        let after = format!("{target}-after");
        client.send(get(&after, USER_A)).await;
        let got = client.response(false).await;
        problems.extend(not_echo(got.as_ref(), &after, USER_A, &[]));
    }
    problems.extend(clean(&up, &[]).await);
    assert_none(&problems);
}

/// Trailers that would frame or route a message (`content-length`, `transfer-encoding`, `host`)
/// must never reach the client; an allowed one still does.
#[tokio::test]
async fn forbidden_trailers_are_dropped_and_allowed_ones_kept() {
    let (up, p) = setup(|_: &Msg| {
        answer("HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\ncontent-length: 10\r\ntransfer-encoding: chunked\r\nhost: evil\r\nx-checksum: 1\r\n\r\n")
    })
    .await;
    let got = ask(&p, "GET /t HTTP/1.1\r\nHost: x\r\nTE: trailers\r\n\r\n").await;
    let got = got.expect("an answer");
    let text = shown(&got.raw);
    let has = |name: &str| got.trailers.iter().any(|t| t.0.eq_ignore_ascii_case(name));
    assert_eq!(got.body, b"hello", "{text}");
    assert!(has("x-checksum"), "no x-checksum trailer: {text}");
    for forbidden in ["content-length", "transfer-encoding", "host"] {
        assert!(!has(forbidden), "a {forbidden} trailer: {text}");
    }
    assert_none(&clean(&up, &[]).await);
}

/// A request target in neither origin nor absolute form (nor `*` for OPTIONS) must never be
/// forwarded (it reached the upstream as `/`): 400, and nothing upstream.
#[tokio::test]
async fn targets_in_neither_origin_nor_absolute_form_are_400() {
    let (up, p) = setup(echo).await;
    let mut problems = Vec::new();
    for target in ["models", "example.com:80"] {
        let got = ask(&p, get(target, USER_A)).await;
        if got.as_ref().map(Msg::status) != Some(400) {
            problems.push(format!("{target}: the client got {}", status_of(&got)));
        }
    }
    // The legal forms still pass.
    let star = format!("OPTIONS * HTTP/1.1\r\nHost: x\r\nx-user: {USER_B}\r\n\r\n");
    problems.extend(not_echo(ask(&p, star).await.as_ref(), "*", USER_B, &[]));
    let absolute = ask(&p, get("http://x/y", USER_B)).await;
    problems.extend(not_echo(absolute.as_ref(), "/y", USER_B, &[]));
    let parsed: Vec<Msg> = up.snapshot().into_iter().flat_map(|c| c.parsed).collect();
    let targets: Vec<&str> = parsed.iter().map(Msg::target).collect();
    if targets != ["*", "/y"] {
        problems.push(format!("the upstream framed requests for {targets:?}"));
    }
    assert_none(&problems);
}

/// A chunked request body with a bare CR or LF in its framing, or more than 16 KiB of chunk
/// extensions, must never be forwarded as a complete body (hyper refuses each of these).
#[tokio::test]
async fn lenient_chunk_framing_in_a_request_is_refused() {
    let (up, p) = setup(echo).await;
    let flood = format!("1{}\r\nx\r\n", ";a=b".repeat(1000)).repeat(5);
    let mut problems = Vec::new();
    let cases = [
        ("a bare CR", "5\r\r\nhello\r\n0\r\n\r\n".into()),
        ("bare LFs", "5\nhello\n0\n\n".into()),
        ("a bare LF after a size", "5\nhello\r\n0\r\n\r\n".into()),
        ("20 KB of chunk extensions", format!("{flood}0\r\n\r\n")),
    ];
    for (i, (what, body)) in cases.iter().enumerate() {
        let target = format!("/chunks{i}");
        let head = format!("POST {target} HTTP/1.1\r\nHost: x\r\nx-user: {USER_A}\r\n");
        let got = ask(&p, format!("{head}{CHUNKED}\r\n\r\n{body}")).await;
        if got.as_ref().is_some_and(|m| m.status() != 400) {
            problems.push(format!("{what}: the client got {}", status_of(&got)));
        }
        // A request on another connection, answered: the upstream has had its turn.
        let after = format!("/after{i}");
        let next = ask(&p, get(&after, USER_B)).await;
        problems.extend(not_echo(next.as_ref(), &after, USER_B, &[USER_A]));
        if let Some(m) = up.parsed(&target) {
            let got = shown(&m.raw);
            problems.push(format!("{what}: the upstream read it whole: {got}"));
        }
    }
    problems.extend(clean(&up, &[USER_A, USER_B]).await);
    assert_none(&problems);
}

/// A request head the proxy refuses (400, 431, 501) must never go unrecorded: each is one
/// record and one `client_error` in `tokenmeter_requests_total`.
#[tokio::test]
async fn refusals_at_the_head_are_recorded_as_client_errors() {
    let up = Upstream::start(echo).await;
    let p = proxy(up.addr, |c| c.limits.max_request_head_bytes = 8 << 10).await;
    // Exactly the limit and no end: the proxy reads all of it, so its close is no reset.
    let mut too_large = "GET / HTTP/1.1\r\nHost: x\r\nx-big: ".to_string();
    too_large.push_str(&"a".repeat((8 << 10) - too_large.len()));
    let post = "POST / HTTP/1.1\r\nHost: x\r\n";
    let bad_head = format!("{post}no colon\r\n\r\n");
    let bad_length = format!("{post}Content-Length: abc\r\n\r\n");
    let gzip = format!("{post}Transfer-Encoding: gzip, chunked\r\n\r\n");
    let cases = [
        ("an unparsable head", bad_head, 400),
        ("a bad length", bad_length, 400),
        ("a head too large", too_large, 431),
        ("gzip, chunked", gzip, 501),
    ];
    let mut problems = Vec::new();
    for (what, request, status) in &cases {
        let got = ask(&p, request).await;
        if got.as_ref().map(Msg::status) != Some(*status) {
            let got = status_of(&got);
            problems.push(format!("{what}: the client got {got}, not {status}"));
        }
    }
    assert_none(&problems);
    let records = p.records(cases.len()).await;
    for (record, (what, _, status)) in records.iter().zip(&cases) {
        if record["outcome"] != "client_error" || record["status"] != *status {
            problems.push(format!("{what}: recorded {record}"));
        }
    }
    let metrics = p.metrics();
    let counted: f64 = (metrics.lines())
        .filter(|l| l.starts_with("tokenmeter_requests_total{"))
        .filter(|l| l.contains("outcome=\"client_error\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    if counted != cases.len() as f64 {
        problems.push(format!("{counted} client errors counted:\n{metrics}"));
    }
    if up.received("HTTP/1.1") {
        problems.push("a refused request reached the upstream".into());
    }
    assert_none(&problems);
}

/// A redirect must never count as `ok` (only 2xx is), and a status outside 100-599 must never
/// reach the client: it gets a 502.
#[tokio::test]
async fn only_2xx_is_ok_and_an_impossible_status_is_a_502() {
    let (_up, p) = setup(|req: &Msg| match req.target() {
        "/found" => answer("HTTP/1.1 302 Found\r\nlocation: /x\r\ncontent-length: 0\r\n\r\n"),
        "/600" => answer("HTTP/1.1 600 X\r\ncontent-length: 0\r\n\r\n"),
        _ => echo(req),
    })
    .await;
    let mut problems = Vec::new();
    for (target, status) in [("/found", 302), ("/600", 502)] {
        let got = ask(&p, get(target, USER_A)).await;
        if got.as_ref().map(Msg::status) != Some(status) {
            let got = status_of(&got);
            problems.push(format!("{target}: the client got {got}, not {status}"));
        }
    }
    let records = p.records(2).await;
    match records.iter().find(|r| r["path"] == "/found") {
        Some(r) if r["outcome"] == "ok" => problems.push(format!("a 302 recorded ok: {r}")),
        Some(_) => {}
        None => problems.push(format!("no record for /found: {records:?}")),
    }
    assert_none(&problems);
}

/// Classic smuggling (CL.TE, TE.CL, obfuscated Transfer-Encoding) must never put a byte of one
/// client's request into another's, nor hand another client its answer.
#[tokio::test]
async fn classic_cl_te_and_te_cl_smuggling_reaches_no_other_client() {
    let smuggled = format!("GET /smuggled HTTP/1.1\r\nHost: x\r\nx-user: {USER_A}\r\n");
    let cl_te = format!("0\r\n\r\n{smuggled}x-ignore: ");
    let inner = format!("{smuggled}Content-Length: 30\r\n\r\nx=");
    let te_cl = format!("{:x}\r\n{inner}\r\n0\r\n\r\n", inner.len());
    let mut problems = Vec::new();
    for (what, coding) in [
        ("CL.TE", ": chunked"),
        ("TE.CL", ": chunked"),
        ("then identity", ": chunked\r\nTransfer-Encoding: identity"),
        ("chunked, identity", ": chunked, identity"),
        ("xchunked", ": xchunked"),
        ("a tab", ":\tchunked"),
        ("a space before the colon", " : chunked"),
        ("a folded value", ":\r\n chunked"),
    ] {
        let (up, p) = setup(echo).await;
        let body = if what == "TE.CL" { &te_cl } else { &cl_te };
        let length = if what == "TE.CL" { 4 } else { cl_te.len() };
        let head = format!("POST /a HTTP/1.1\r\nHost: x\r\nx-user: {USER_A}");
        let fields = format!("Content-Length: {length}\r\nTransfer-Encoding{coding}");
        let a = ask(&p, format!("{head}\r\n{fields}\r\n\r\n{body}")).await;
        // Refused (400, 501) or answered with A's own answer.
        if a.as_ref().is_some_and(|m| m.status() < 400) {
            let wrong = not_echo(a.as_ref(), "/a", USER_A, &[USER_B]);
            problems.extend(wrong.map(|e| format!("{what}: A's answer: {e}")));
        }
        let b = ask(&p, get("/b", USER_B)).await;
        if let Some(e) = not_echo(b.as_ref(), "/b", USER_B, &[USER_A, "/smuggled"]) {
            problems.push(format!("{what} (A got {}): B's answer: {e}", status_of(&a)));
        }
        let found = clean(&up, &[USER_A, USER_B]).await;
        problems.extend(found.into_iter().map(|e| format!("{what}: {e}")));
    }
    assert_none(&problems);
}

/// Requests pipelined in one write, by two clients at once, must never be answered out of
/// order or to the other client, nor reach the upstream run together.
#[tokio::test]
async fn pipelined_requests_are_answered_in_order_and_framed_apart() {
    let (up, p) = setup(echo).await;
    let who = ["pipeA", "pipeB"];
    let markers: Vec<String> = (who.iter())
        .flat_map(|w| (1..=4).map(move |n| format!("{w}-{n}x")))
        .collect();
    let markers: Vec<&str> = markers.iter().map(String::as_str).collect();
    let run = |w: &'static str| {
        let (addr, markers) = (p.running.listen, markers.clone());
        async move {
            let mut client = Client::connect(addr).await;
            let bodies = [
                "\r\n",
                "Content-Length: 5\r\n\r\nhello",
                "Transfer-Encoding: chunked\r\n\r\n5\r\nworld\r\n0\r\n\r\n",
                "\r\n",
            ];
            let batch = (bodies.iter().zip(1..)).map(|(body, n)| {
                let method = if n == 2 || n == 3 { "POST" } else { "GET" };
                format!("{method} /{w}/{n} HTTP/1.1\r\nHost: x\r\nx-user: {w}-{n}x\r\n{body}")
            });
            client.send(batch.collect::<String>()).await;
            let mut problems = Vec::new();
            for n in 1..=4 {
                let (target, user) = (format!("/{w}/{n}"), format!("{w}-{n}x"));
                let others: Vec<&str> = markers.iter().copied().filter(|m| *m != user).collect();
                let got = client.response(false).await;
                problems.extend(not_echo(got.as_ref(), &target, &user, &others));
            }
            problems
        }
    };
    let (a, b) = tokio::join!(run(who[0]), run(who[1]));
    let mut problems = [a, b].concat();
    for (w, n, want) in who.iter().flat_map(|w| [(w, 2, "hello"), (w, 3, "world")]) {
        let target = format!("/{w}/{n}");
        let framed = up.parsed(&target);
        if framed.as_ref().is_none_or(|m| m.body != want.as_bytes()) {
            let framed = framed.map(|m| shown(&m.raw));
            problems.push(format!("{target}: the upstream framed {framed:?}"));
        }
    }
    problems.extend(clean(&up, &markers).await);
    assert_none(&problems);
}
