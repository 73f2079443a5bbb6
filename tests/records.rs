//! The per-request record at its edges, through the binary. Records that cannot be written (a
//! full disk) are counted in `tokenmeter_access_log_dropped_total`, every one, and logged once
//! rather than once per record; and SIGTERM under load writes one record per request the proxy
//! took before the process ends. What must never happen again: 1,000 lost records leaving the
//! counter at 0, and records still queued at exit lost with the process. Every record names the
//! pod, namespace and deployment its environment (the downward API) or its file says.

mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::sync::mpsc;
use tokio::time::{timeout, Instant};

use common::*;

/// Kills the child if the test fails before it has stopped it.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The binary, started on `config`, with its addresses and its stderr, line by line.
struct Proxy {
    child: Reaped,
    listen: String,
    admin: String,
    stderr: mpsc::UnboundedReceiver<String>,
}

/// The variables a record's identity comes from: a test sets them itself, whatever the
/// environment that runs it says.
const IDENTITY_VARS: [&str; 3] = [
    "TOKENMETER_POD",
    "TOKENMETER_NAMESPACE",
    "TOKENMETER_DEPLOYMENT",
];

/// The binary on `config`, with the identity variables `env` and no other.
fn command(config: &Path, env: &[(&str, &str)]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_tokenmeter"));
    command.args(["--config", config.to_str().unwrap()]);
    for var in IDENTITY_VARS {
        command.env_remove(var);
    }
    command.envs(env.iter().copied());
    command
}

async fn start(config: &Path) -> Proxy {
    start_with(config, &[]).await
}

async fn start_with(config: &Path, env: &[(&str, &str)]) -> Proxy {
    let mut child = Reaped(
        command(config, env)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let (tx, mut stderr) = mpsc::unbounded_channel();
    let pipe = child.0.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(pipe).lines() {
            let _ = tx.send(line.unwrap());
        }
    });
    let serving = loop {
        let line = timeout(Duration::from_secs(10), stderr.recv())
            .await
            .expect("a startup line within 10 s")
            .expect("the proxy started");
        if line.contains("tokenmeter is serving") {
            break line;
        }
    };
    let field = |name: &str| {
        serving
            .split(&format!("{name}="))
            .nth(1)
            .and_then(|s| s.split_whitespace().next())
            .unwrap_or_else(|| panic!("{name} in {serving}"))
            .to_string()
    };
    Proxy {
        listen: field("listen"),
        admin: field("admin"),
        child,
        stderr,
    }
}

impl Proxy {
    fn signal(&self, signal: &str) {
        let sent = Command::new("kill")
            .args([signal, &self.child.0.id().to_string()])
            .status()
            .unwrap();
        assert!(sent.success());
    }

    /// Waits (up to 20 s) for the process to end and returns its exit code and the rest of
    /// its stderr.
    async fn exit(mut self) -> (Option<i32>, Vec<String>) {
        let deadline = Instant::now() + Duration::from_secs(20);
        let code = loop {
            if let Some(status) = self.child.0.try_wait().unwrap() {
                break status.code();
            }
            assert!(
                Instant::now() < deadline,
                "still running 20 s after SIGTERM"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        let mut rest = Vec::new();
        while let Some(line) = self.stderr.recv().await {
            rest.push(line);
        }
        (code, rest)
    }

    async fn metric(&self, name: &str) -> Option<u64> {
        let got = send(
            &format!("http://{}/metrics", self.admin),
            "GET",
            "",
            &[],
            false,
        )
        .await;
        String::from_utf8_lossy(&got.bytes())
            .lines()
            .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
    }
}

fn chat_stream() -> Script {
    Script::stream(
        "text/event-stream",
        vec![
            role_chunk(),
            chat_chunk("a"),
            finish_chunk("stop", Some(1)),
            done(),
        ],
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn records_a_full_disk_refuses_are_all_counted_and_logged_once() {
    let upstream = upstream(|_| chat_stream()).await;
    let dir = TempDir::new();
    let config = dir.path().join("tm.yaml");
    std::fs::write(
        &config,
        format!(
            "listen: 127.0.0.1:0\nadmin: 127.0.0.1:0\nupstream: http://{}\naccess_log: {{path: /dev/full}}\n",
            upstream.addr
        ),
    )
    .unwrap();
    let proxy = start(&config).await;
    const REQUESTS: u64 = 1000;
    let url = format!("http://{}/v1/chat/completions", proxy.listen);
    let mut sent = tokio::task::JoinSet::new();
    for _ in 0..REQUESTS / 50 {
        for _ in 0..50 {
            let url = url.clone();
            sent.spawn(async move { send(&url, "POST", &chat_request("m"), &[], false).await });
        }
        while let Some(got) = sent.join_next().await {
            assert_eq!(got.unwrap().status, 200);
        }
    }
    let name = "tokenmeter_access_log_dropped_total";
    let deadline = Instant::now() + Duration::from_secs(10);
    while proxy.metric(name).await != Some(REQUESTS) {
        assert!(
            Instant::now() < deadline,
            "{name} is {:?}, not {REQUESTS}",
            proxy.metric(name).await
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    proxy.signal("-TERM");
    let (code, lines) = proxy.exit().await;
    assert_eq!(code, Some(0));
    let about_the_log: Vec<_> = lines.iter().filter(|l| l.contains("access log")).collect();
    assert!(
        (1..=2).contains(&about_the_log.len()),
        "one line when it starts failing (and at most one more), not one per record: {about_the_log:#?}"
    );
}

/// A streaming request that reports its response head; returns whether one arrived.
async fn stream(url: String, heads: mpsc::UnboundedSender<()>) -> bool {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build(connector);
    let request = http::Request::post(url)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(chat_request("m"))))
        .unwrap();
    let Ok(Ok(response)) = timeout(Duration::from_secs(10), client.request(request)).await else {
        return false;
    };
    let _ = heads.send(());
    let mut body = response.into_body();
    while let Ok(Some(Ok(_))) = timeout(Duration::from_secs(10), body.frame()).await {}
    true
}

/// Where the records go in a SIGTERM test.
enum Destination {
    /// A JSON-lines file.
    File,
    /// A FIFO read one line per millisecond: a destination slower than the records come, like
    /// a busy disk, so that records are still queued when the process is told to stop.
    Slow,
}

/// SIGTERM while streams are open and new requests keep coming: after the drain deadline cuts
/// the streams, the destination holds exactly one record per request that got a response head,
/// none of them lost with the process.
async fn sigterm_under_load(destination: Destination) {
    // Streams of 5 s: still open when the drain deadline (300 ms) cuts them.
    let upstream = upstream(|_| {
        let mut steps = vec![Step::Write(role_chunk())];
        for i in 1..=50 {
            steps.push(Step::At(Duration::from_millis(100 * i)));
            steps.push(Step::Write(chat_chunk("a")));
        }
        steps.push(Step::Write(done()));
        steps.push(Step::End);
        Script {
            status: 200,
            headers: vec![("content-type".into(), "text/event-stream".into())],
            chunked: true,
            steps,
        }
    })
    .await;
    let dir = TempDir::new();
    let (config, records) = (dir.path().join("tm.yaml"), dir.path().join("records.jsonl"));
    let slow_reader = match destination {
        Destination::File => None,
        Destination::Slow => {
            let made = Command::new("mkfifo").arg(&records).status().unwrap();
            assert!(made.success());
            let fifo = records.clone();
            Some(std::thread::spawn(move || {
                let mut lines = Vec::new();
                for line in BufReader::new(std::fs::File::open(fifo).unwrap()).lines() {
                    lines.push(line.unwrap());
                    std::thread::sleep(Duration::from_millis(1));
                }
                lines
            }))
        }
    };
    std::fs::write(
        &config,
        format!(
            "listen: 127.0.0.1:0\nadmin: 127.0.0.1:0\nupstream: http://{}\n\
             access_log: {{path: {}}}\ntimeouts: {{drain: 300ms}}\n",
            upstream.addr,
            records.display()
        ),
    )
    .unwrap();
    let proxy = start(&config).await;
    let url = format!("http://{}/v1/chat/completions", proxy.listen);
    const STREAMS: usize = 200;
    let (heads_tx, mut heads) = mpsc::unbounded_channel();
    let mut clients = tokio::task::JoinSet::new();
    for _ in 0..STREAMS {
        clients.spawn(stream(url.clone(), heads_tx.clone()));
    }
    for _ in 0..STREAMS {
        timeout(Duration::from_secs(20), heads.recv())
            .await
            .expect("every stream has its head within 20 s");
    }
    // More requests keep arriving, before and after the signal, until the listener refuses.
    let (stop_tx, mut stop) = tokio::sync::oneshot::channel::<()>();
    let late = {
        let (url, heads_tx) = (url.clone(), heads_tx.clone());
        tokio::spawn(async move {
            let mut late = tokio::task::JoinSet::new();
            loop {
                late.spawn(stream(url.clone(), heads_tx.clone()));
                tokio::select! {
                    _ = &mut stop => break,
                    _ = tokio::time::sleep(Duration::from_millis(2)) => {}
                }
            }
            while late.join_next().await.is_some() {}
        })
    };
    const LATE_BEFORE_THE_SIGNAL: usize = 5;
    for _ in 0..LATE_BEFORE_THE_SIGNAL {
        timeout(Duration::from_secs(20), heads.recv())
            .await
            .expect("late requests get their heads");
    }
    proxy.signal("-TERM");
    let (code, _) = proxy.exit().await;
    assert_eq!(code, Some(0));
    let _ = stop_tx.send(());
    late.await.unwrap();
    while clients.join_next().await.is_some() {}
    drop(heads_tx);
    let mut taken = STREAMS + LATE_BEFORE_THE_SIGNAL;
    while heads.recv().await.is_some() {
        taken += 1;
    }
    let lines: Vec<String> = match slow_reader {
        None => std::fs::read_to_string(&records)
            .unwrap()
            .lines()
            .map(str::to_string)
            .collect(),
        Some(reader) => reader.join().unwrap(),
    };
    for line in &lines {
        serde_json::from_str::<serde_json::Value>(line).expect("whole JSON lines");
    }
    assert_eq!(
        lines.len(),
        taken,
        "one record per request whose response began"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn sigterm_under_load_writes_one_record_per_request_taken() {
    sigterm_under_load(Destination::File).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn sigterm_waits_for_a_slow_destination_to_take_every_record() {
    sigterm_under_load(Destination::Slow).await;
}

/// What the record of the request with `id` says, from a JSON-lines file.
fn record_of(lines: &[serde_json::Value], id: &str) -> serde_json::Value {
    lines
        .iter()
        .find(|r| r["request_id"] == id)
        .unwrap_or_else(|| panic!("no record of {id} in {lines:#?}"))
        .clone()
}

/// Each record names its pod, namespace and deployment: the environment's (the downward API in
/// the shipped manifests) where set and not empty, else the file's `identity:` section, else
/// null; a reload that changes the section changes what the next records say.
#[tokio::test(flavor = "multi_thread")]
async fn records_name_the_pod_namespace_and_deployment_the_environment_or_file_says() {
    let upstream = upstream(|_| chat_stream()).await;
    let dir = TempDir::new();
    let (config, records) = (dir.path().join("tm.yaml"), dir.path().join("records.jsonl"));
    let write_config = |deployment: &str| {
        std::fs::write(
            &config,
            format!(
                "listen: 127.0.0.1:0\nadmin: 127.0.0.1:0\nupstream: http://{}\n\
                 access_log: {{path: {}}}\nreload: {{watch_interval: 0s}}\n\
                 identity: {{pod: from-the-file, deployment: {deployment}}}\n",
                upstream.addr,
                records.display()
            ),
        )
        .unwrap()
    };
    write_config("chat");
    // The pod from the environment beats the file's; an empty deployment (a label the pod
    // lacks) leaves the file's.
    let mut proxy = start_with(
        &config,
        &[
            ("TOKENMETER_POD", "llm-7d9f8c6b5-x2x4q"),
            ("TOKENMETER_NAMESPACE", "inference"),
            ("TOKENMETER_DEPLOYMENT", ""),
            ("HOSTNAME", "node-1"),
        ],
    )
    .await;
    let url = format!("http://{}/v1/chat/completions", proxy.listen);
    let request = |id: &'static str| {
        let url = url.clone();
        async move {
            let got = send(
                &url,
                "POST",
                &chat_request("m"),
                &[("x-request-id", id)],
                false,
            )
            .await;
            assert_eq!(got.status, 200);
        }
    };
    request("before").await;
    write_config("chat-v2");
    proxy.signal("-HUP");
    loop {
        let line = timeout(Duration::from_secs(10), proxy.stderr.recv())
            .await
            .expect("the reload is logged within 10 s")
            .expect("the proxy runs");
        assert!(!line.contains("ERROR"), "{line}");
        if line.contains("configuration reloaded") {
            break;
        }
    }
    request("after").await;
    proxy.signal("-TERM");
    let (code, _) = proxy.exit().await;
    assert_eq!(code, Some(0));
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(&records)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).expect("whole JSON lines"))
        .collect();
    assert_eq!(lines.len(), 2, "{lines:#?}");
    for (id, deployment) in [("before", "chat"), ("after", "chat-v2")] {
        let r = record_of(&lines, id);
        assert_eq!(
            (&r["pod"], &r["namespace"], &r["deployment"]),
            (
                &serde_json::json!("llm-7d9f8c6b5-x2x4q"),
                &serde_json::json!("inference"),
                &serde_json::json!(deployment)
            ),
            "{id}: {r}"
        );
    }
}

/// Without environment or file, the names are unknown: null, never a guess.
#[tokio::test(flavor = "multi_thread")]
async fn without_environment_or_file_the_names_are_null() {
    let upstream = upstream(|_| chat_stream()).await;
    let dir = TempDir::new();
    let (config, records) = (dir.path().join("tm.yaml"), dir.path().join("records.jsonl"));
    std::fs::write(
        &config,
        format!(
            "listen: 127.0.0.1:0\nadmin: 127.0.0.1:0\nupstream: http://{}\naccess_log: {{path: {}}}\n",
            upstream.addr,
            records.display()
        ),
    )
    .unwrap();
    let proxy = start_with(&config, &[("HOSTNAME", "node-1")]).await;
    let url = format!("http://{}/v1/chat/completions", proxy.listen);
    let got = send(
        &url,
        "POST",
        &chat_request("m"),
        &[("x-request-id", "r")],
        false,
    )
    .await;
    assert_eq!(got.status, 200);
    proxy.signal("-TERM");
    let (code, _) = proxy.exit().await;
    assert_eq!(code, Some(0));
    let text = std::fs::read_to_string(&records).unwrap();
    let r: serde_json::Value = serde_json::from_str(text.trim()).expect("one JSON line");
    for field in ["pod", "namespace", "deployment"] {
        assert!(r[field].is_null(), "{field} in {r}");
    }
}

/// A name from the environment that is not a name stops the start with one line naming the
/// variable, rather than being written into every record.
#[test]
fn a_bad_name_in_the_environment_is_refused_at_start() {
    let dir = TempDir::new();
    let config = dir.path().join("tm.yaml");
    std::fs::write(
        &config,
        "listen: 127.0.0.1:0\nadmin: 127.0.0.1:0\naccess_log: {path: \"-\"}\n",
    )
    .unwrap();
    let out = command(&config, &[("TOKENMETER_DEPLOYMENT", "chat model")])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("TOKENMETER_DEPLOYMENT: `chat model` must be"),
        "{err}"
    );
}
