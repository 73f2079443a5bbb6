//! What tests/engine.rs runs: llama.cpp's `llama-server` and the `tokenmeter` binary as child
//! processes, and two clients (a raw HTTP/1.1 client that timestamps every read, and `curl -N`).
//!
//! Self-contained on purpose: no `tokenmeter` library API, no tests/common. Nothing here uses a
//! fixed port or sleeps to synchronise: both servers bind port 0 and print the port they got,
//! and every wait polls for a condition with a deadline.

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

/// What a missing engine tells the person running the tests.
pub const SETUP: &str = "run `bash tests/engine/setup.sh` first: it builds llama.cpp's \
     llama-server and the tiny model once (about 6 minutes on 2 cores) into a cache \
     directory, and prints TOKENMETER_LLAMA_SERVER and TOKENMETER_LLAMA_MODEL";

/// The cache directory tests/engine/setup.sh uses when TOKENMETER_ENGINE_DIR is unset.
fn default_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("TOKENMETER_ENGINE_DIR") {
        return PathBuf::from(dir);
    }
    let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("/root"), PathBuf::from);
    home.join(".cache/tokenmeter/llama-cpp-11434.0.0")
}

/// The engine binary and the model: from the environment, else setup.sh's cache directory.
/// Missing ones fail the test (never a silent pass) and say how to get them.
pub fn engine_paths() -> (PathBuf, PathBuf) {
    let dir = default_dir();
    let server = std::env::var_os("TOKENMETER_LLAMA_SERVER")
        .map_or_else(|| dir.join("bin/llama-server"), PathBuf::from);
    let model = std::env::var_os("TOKENMETER_LLAMA_MODEL")
        .map_or_else(|| dir.join("model.gguf"), PathBuf::from);
    assert!(
        server.is_file(),
        "no llama-server at {}: {SETUP}",
        server.display()
    );
    assert!(model.is_file(), "no model at {}: {SETUP}", model.display());
    (server, model)
}

/// The slower model (`make_model.py --slow`), beside the tiny one.
pub fn slow_model_path() -> PathBuf {
    let model = std::env::var_os("TOKENMETER_LLAMA_SLOW_MODEL")
        .map_or_else(|| default_dir().join("model-slow.gguf"), PathBuf::from);
    assert!(
        model.is_file(),
        "no slower model at {}: {SETUP}",
        model.display()
    );
    model
}

/// A child process whose stdout and stderr lines are kept (for failure messages) and offered
/// to whoever waits for a line. Killed on drop, so a failing test leaves nothing running.
pub struct Proc {
    name: &'static str,
    child: Child,
    lines: Receiver<String>,
    log: Arc<Mutex<Vec<String>>>,
}

impl Proc {
    pub fn spawn(name: &'static str, cmd: &mut Command) -> Proc {
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {name}: {e}"));
        let log = Arc::new(Mutex::new(Vec::new()));
        let (tx, lines) = channel();
        let out: Box<dyn Read + Send> = Box::new(child.stdout.take().unwrap());
        let err: Box<dyn Read + Send> = Box::new(child.stderr.take().unwrap());
        // Both pipes are drained for the process's whole life: a full pipe would stall it.
        for pipe in [out, err] {
            let (tx, log) = (tx.clone(), log.clone());
            std::thread::spawn(move || {
                for line in BufReader::new(pipe).lines() {
                    let Ok(line) = line else { return };
                    log.lock().unwrap().push(line.clone());
                    let _ = tx.send(line);
                }
            });
        }
        Proc {
            name,
            child,
            lines,
            log,
        }
    }

    /// The first line (from now on) that contains `needle`; fails after `limit`, or at once if
    /// the process exits first, with its output.
    pub fn wait_for_line(&mut self, needle: &str, limit: Duration) -> String {
        let deadline = Instant::now() + limit;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self
                .lines
                .recv_timeout(left.min(Duration::from_millis(100)))
            {
                Ok(line) if line.contains(needle) => return line,
                Ok(_) => {}
                Err(_) => {
                    if let Ok(Some(status)) = self.child.try_wait() {
                        panic!(
                            "{} exited ({status}) before printing `{needle}`:\n{}",
                            self.name,
                            self.output()
                        );
                    }
                    assert!(
                        Instant::now() < deadline,
                        "{} printed no `{needle}` within {limit:?}:\n{}",
                        self.name,
                        self.output()
                    );
                }
            }
        }
    }

    /// Everything the process printed so far (the last 60 lines).
    pub fn output(&self) -> String {
        let log = self.log.lock().unwrap();
        let from = log.len().saturating_sub(60);
        log[from..].join("\n")
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A running llama-server on 127.0.0.1 and a port it chose itself.
pub struct Engine {
    pub proc: Proc,
    pub addr: String,
    /// One engine at a time: each takes a core, and the timing tests (the report's bend above
    /// all) must not share the machine with another engine decoding beside them.
    _turn: std::sync::MutexGuard<'static, ()>,
}

static ONE_ENGINE: std::sync::Mutex<()> = std::sync::Mutex::new(());

impl Engine {
    /// Starts llama-server with `--port 0`: it binds a free port itself and prints
    /// `listening on http://127.0.0.1:PORT` once the model is loaded, so there is no race for
    /// the port. Then /health must answer 200.
    pub fn start() -> Engine {
        Engine::start_with(engine_paths().1)
    }

    /// [`Engine::start`] with the slower model: a request stays in the engine long enough for
    /// the races around a kept-alive connection's close to show.
    pub fn start_slow() -> Engine {
        Engine::start_with(slow_model_path())
    }

    fn start_with(model: PathBuf) -> Engine {
        let turn = ONE_ENGINE.lock().unwrap_or_else(|p| p.into_inner());
        let (server, _) = engine_paths();
        let mut proc = Proc::spawn(
            "llama-server",
            Command::new(server).args([
                "--model",
                model.to_str().unwrap(),
                "--host",
                "127.0.0.1",
                "--port",
                "0",
                "--metrics",
                "--parallel",
                "2",
                "--ctx-size",
                "8192",
                // One thread: on 2 shared cores, two spinning decode threads lose to anything
                // else running (a token took 8-80 ms instead of ~3 while cargo compiled).
                "--threads",
                "1",
                "--alias",
                "tiny",
            ]),
        );
        let line = proc.wait_for_line("listening on http://", Duration::from_secs(60));
        let addr = line
            .split("listening on http://")
            .nth(1)
            .and_then(|s| s.split_whitespace().next())
            .unwrap_or_else(|| panic!("no address in `{line}`"))
            .to_string();
        let engine = Engine {
            proc,
            addr,
            _turn: turn,
        };
        poll(
            "llama-server's /health to answer 200",
            Duration::from_secs(30),
            || get(&engine.addr, "/health").is_ok_and(|(status, _)| status == 200),
        );
        engine
    }

    pub fn metrics(&self) -> String {
        let (status, body) = get(&self.addr, "/metrics").expect("llama-server /metrics");
        assert_eq!(status, 200, "llama-server /metrics: {body}");
        body
    }
}

/// A running tokenmeter binary in front of an upstream, with its JSONL record file.
pub struct Proxy {
    pub proc: Proc,
    pub listen: String,
    pub admin: String,
    pub records: PathBuf,
    dir: PathBuf,
}

impl Proxy {
    /// Starts the `tokenmeter` binary with a config file: both ports 0, the bound addresses read
    /// from its startup line (`tokenmeter is serving listen=... admin=... upstream=...`).
    pub fn start(upstream: &str) -> Proxy {
        Proxy::start_with(upstream, "")
    }

    /// Like [`Proxy::start`], with more YAML appended to the config file.
    pub fn start_with(upstream: &str, extra: &str) -> Proxy {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "tokenmeter-engine-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let records = dir.join("records.jsonl");
        let config = dir.join("tokenmeter.yaml");
        std::fs::write(
            &config,
            format!(
                "listen: 127.0.0.1:0\nadmin: 127.0.0.1:0\nupstream: http://{upstream}\n\
                 access_log: {{path: {}, format: jsonl}}\n{extra}",
                records.display()
            ),
        )
        .unwrap();
        let mut proc = Proc::spawn(
            "tokenmeter",
            Command::new(env!("CARGO_BIN_EXE_tokenmeter"))
                .args(["--config", config.to_str().unwrap()])
                .env("RUST_LOG", "info"),
        );
        let line = proc.wait_for_line("tokenmeter is serving", Duration::from_secs(30));
        let field = |name: &str| {
            line.split(&format!("{name}="))
                .nth(1)
                .and_then(|s| s.split_whitespace().next())
                .unwrap_or_else(|| panic!("no {name}= in `{line}`"))
                .to_string()
        };
        Proxy {
            listen: field("listen"),
            admin: field("admin"),
            proc,
            records,
            dir,
        }
    }

    /// The first `n` records, waiting (up to 10 s) for them: a record is written when its
    /// request has finished, which is after the client has read the end.
    pub fn records(&self, n: usize) -> Vec<Value> {
        let mut got = Vec::new();
        poll(
            &format!("{n} records in {}", self.records.display()),
            Duration::from_secs(10),
            || {
                let text = std::fs::read_to_string(&self.records).unwrap_or_default();
                got = text
                    .lines()
                    .filter(|l| l.ends_with('}'))
                    .map(|l| serde_json::from_str(l).expect("a JSON record"))
                    .collect();
                got.len() >= n
            },
        );
        got
    }

    pub fn metrics(&self) -> String {
        let (status, body) = get(&self.admin, "/metrics").expect("tokenmeter /metrics");
        assert_eq!(status, 200);
        body
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Polls `check` every 10 ms until it holds; fails naming `what` after `limit`.
pub fn poll(what: &str, limit: Duration, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !check() {
        assert!(
            Instant::now() < deadline,
            "timed out after {limit:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The sum of the samples of `name` whose labels include every one of `labels`, or None when
/// no sample matches. Reads the Prometheus text format line by line.
pub fn metric(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let mut sum = None;
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let (series, value) = match line.rsplit_once(' ') {
            Some(x) => x,
            None => continue,
        };
        let (n, l) = series.split_once('{').unwrap_or((series, ""));
        if n != name {
            continue;
        }
        if labels
            .iter()
            .all(|(k, v)| l.contains(&format!("{k}=\"{v}\"")))
        {
            *sum.get_or_insert(0.0) += value.parse::<f64>().unwrap();
        }
    }
    sum
}

/// One SSE event as the client got it: when (since the client started), and its data.
#[derive(Debug, Clone)]
pub struct Event {
    pub at: Duration,
    pub data: String,
}

impl Event {
    pub fn json(&self) -> Option<Value> {
        serde_json::from_str(&self.data).ok()
    }
}

/// A whole exchange as the client saw it. Times are since the client started, before it
/// connected: anything the proxy measures lies inside these intervals.
#[derive(Debug)]
pub struct Exchange {
    pub status: u16,
    pub head: String,
    /// The response body, de-chunked: what the proxy counts as `bytes`.
    pub body: Vec<u8>,
    /// When the body was complete.
    pub end: Duration,
    pub events: Vec<Event>,
}

impl Exchange {
    /// The first event that satisfies `output`: the client's first token.
    pub fn first(&self, output: impl Fn(&Value) -> bool) -> &Event {
        self.events
            .iter()
            .find(|e| e.json().is_some_and(|j| output(&j)))
            .unwrap_or_else(|| panic!("no output event in {:?}", self.text()))
    }

    pub fn outputs(&self, output: impl Fn(&Value) -> bool) -> Vec<&Event> {
        self.events
            .iter()
            .filter(|e| e.json().is_some_and(|j| output(&j)))
            .collect()
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text()))
    }
}

/// Splits complete SSE events off the front of `pending` (blank-line separated; CRLF or LF).
fn take_events(pending: &mut String, at: Duration, out: &mut Vec<Event>) {
    loop {
        let normalised = pending.replace("\r\n", "\n");
        let Some(end) = normalised.find("\n\n") else {
            *pending = normalised;
            return;
        };
        let block = &normalised[..end];
        let data: Vec<&str> = block
            .lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .map(|d| d.strip_prefix(' ').unwrap_or(d))
            .collect();
        if !data.is_empty() {
            out.push(Event {
                at,
                data: data.join("\n"),
            });
        }
        *pending = normalised[end + 2..].to_string();
    }
}

/// POSTs `body` as JSON over a fresh HTTP/1.1 connection and reads the response read by read,
/// timestamping each event when the read that completed it returned.
pub fn post(addr: &str, path: &str, body: &Value) -> Exchange {
    let body = body.to_string();
    let started = Instant::now();
    let mut conn = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect {addr}: {e}"));
    conn.set_nodelay(true).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    write!(
        conn,
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    read_response(&mut conn, started, &|_| false)
}

/// POSTs `body` like [`post`], reads until the first event that satisfies `until`, and hangs
/// up there: a client going away mid-stream. Returns what it had read.
pub fn post_and_hang_up(
    addr: &str,
    path: &str,
    body: &Value,
    until: fn(&Value) -> bool,
) -> Exchange {
    let body = body.to_string();
    let started = Instant::now();
    let mut conn = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect {addr}: {e}"));
    conn.set_nodelay(true).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    write!(
        conn,
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let x = read_response(&mut conn, started, &|e| e.json().is_some_and(|j| until(&j)));
    let _ = conn.shutdown(std::net::Shutdown::Both);
    x
}

/// A GET on a fresh connection: (status, body). Err when the connection fails.
pub fn get(addr: &str, path: &str) -> std::io::Result<(u16, String)> {
    let started = Instant::now();
    let mut conn = TcpStream::connect(addr)?;
    conn.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        conn,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let x = read_response(&mut conn, started, &|_| false);
    Ok((x.status, x.text()))
}

/// Reads one response; returns early, with what it has, once an event satisfies `stop`.
fn read_response(
    conn: &mut TcpStream,
    started: Instant,
    stop: &dyn Fn(&Event) -> bool,
) -> Exchange {
    let mut raw: Vec<u8> = Vec::new();
    let mut head: Option<(u16, String, usize)> = None;
    let mut body = Vec::new();
    let mut chunked = false;
    let mut length: Option<usize> = None;
    // For chunked bodies: where the next chunk-size line starts in `raw`.
    let mut cursor = 0;
    let mut pending = String::new();
    let mut events = Vec::new();
    let mut done = false;
    let mut buf = [0u8; 16384];
    while !done {
        let n = conn.read(&mut buf).expect("read the response");
        let at = started.elapsed();
        if n == 0 {
            assert!(
                !chunked,
                "connection closed before the last chunk: {:?}",
                String::from_utf8_lossy(&raw)
            );
            done = true;
        }
        raw.extend_from_slice(&buf[..n]);
        if head.is_none() {
            let Some(end) = raw.windows(4).position(|w| w == b"\r\n\r\n") else {
                assert!(n > 0, "no response head");
                continue;
            };
            let text = String::from_utf8_lossy(&raw[..end]).into_owned();
            let status = text
                .split_whitespace()
                .nth(1)
                .and_then(|s| s.parse().ok())
                .unwrap_or_else(|| panic!("bad status line: {text}"));
            for line in text.lines().skip(1) {
                let (k, v) = line.split_once(':').unwrap_or((line, ""));
                let (k, v) = (k.trim().to_ascii_lowercase(), v.trim().to_ascii_lowercase());
                if k == "transfer-encoding" && v.contains("chunked") {
                    chunked = true;
                }
                if k == "content-length" {
                    length = v.parse().ok();
                }
            }
            head = Some((status, text, end + 4));
            cursor = end + 4;
        }
        let before = body.len();
        if chunked {
            // Take every complete chunk from `cursor`.
            loop {
                let rest = &raw[cursor..];
                let Some(eol) = rest.windows(2).position(|w| w == b"\r\n") else {
                    break;
                };
                let size_text = String::from_utf8_lossy(&rest[..eol]);
                let size = usize::from_str_radix(size_text.split(';').next().unwrap().trim(), 16)
                    .unwrap_or_else(|_| panic!("bad chunk size `{size_text}`"));
                if size == 0 {
                    done = true;
                    break;
                }
                if rest.len() < eol + 2 + size + 2 {
                    break;
                }
                body.extend_from_slice(&rest[eol + 2..eol + 2 + size]);
                cursor += eol + 2 + size + 2;
            }
        } else {
            body.extend_from_slice(&raw[cursor..]);
            cursor = raw.len();
            if length.is_some_and(|l| body.len() >= l) {
                done = true;
            }
        }
        pending.push_str(&String::from_utf8_lossy(&body[before..]));
        take_events(&mut pending, at, &mut events);
        if events.iter().any(stop) {
            break;
        }
    }
    // A last event without its blank line still counts (WHATWG); llama.cpp always sends it.
    if !pending.trim().is_empty() {
        pending.push_str("\n\n");
        take_events(&mut pending, started.elapsed(), &mut events);
    }
    let (status, head, _) = head.expect("a response head");
    Exchange {
        status,
        head,
        body,
        end: started.elapsed(),
        events,
    }
}

/// The same POST made by `curl -N` (no buffering), its output read line by line as it comes:
/// a real client that proves the stream reaches it unbuffered. Times are since just before
/// curl was started (so they include curl's own start-up: later, never earlier, than the
/// proxy's view).
pub fn curl_post(addr: &str, path: &str, body: &Value) -> Exchange {
    let started = Instant::now();
    let mut child = Command::new("curl")
        .args([
            "-N",
            "-s",
            "-S",
            "--max-time",
            "60",
            "-H",
            "Content-Type: application/json",
            "--data-binary",
            &body.to_string(),
            "-w",
            "\n%{http_code}",
            &format!("http://{addr}{path}"),
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("curl (tests/run.sh installs it)");
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut body = Vec::new();
    let mut events = Vec::new();
    let mut pending = String::new();
    loop {
        let mut line = Vec::new();
        let n = out.read_until(b'\n', &mut line).unwrap();
        if n == 0 {
            break;
        }
        let at = started.elapsed();
        body.extend_from_slice(&line);
        pending.push_str(&String::from_utf8_lossy(&line));
        take_events(&mut pending, at, &mut events);
    }
    let end = started.elapsed();
    let status = child.wait_with_output().unwrap();
    assert!(status.status.success(), "curl failed: {status:?}");
    // The last line is -w's status code, after a newline of its own.
    let text = String::from_utf8(body.clone()).unwrap();
    let (payload, code) = text.rsplit_once('\n').unwrap();
    let status = code.trim().parse().expect("curl's %{http_code}");
    Exchange {
        status,
        head: String::new(),
        body: payload.as_bytes().to_vec(),
        end,
        events,
    }
}
