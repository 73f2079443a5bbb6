//! Hostile and sloppy clients: nothing they do holds a connection forever, exhausts the proxy's
//! file descriptors or makes it start upstream requests without bound. Each test is a client
//! doing one such thing against a proxy with short timeouts, and what must happen to it.

mod common;

use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::{timeout, Instant};

use common::{proxy, upstream, Script, TestProxy};

/// Timeouts short enough for a test; the deadline each check allows is far longer.
const SHORT: Duration = Duration::from_millis(300);
const DEADLINE: Duration = Duration::from_secs(10);

async fn short_proxy(tweak: impl FnOnce(&mut tokenmeter::Config)) -> TestProxy {
    let up = upstream(|_| Script::json(200, "{}")).await;
    proxy(up.addr, |c| {
        c.timeouts.request_head = SHORT;
        c.timeouts.client_idle = SHORT;
        tweak(c);
    })
    .await
}

/// Reads until the server closes the connection; returns what it sent. Fails past DEADLINE.
async fn read_to_close(stream: &mut TcpStream) -> Vec<u8> {
    let mut got = Vec::new();
    let started = Instant::now();
    let mut buf = [0u8; 4096];
    loop {
        let left = DEADLINE.saturating_sub(started.elapsed());
        match timeout(left, stream.read(&mut buf)).await {
            Err(_) => panic!("the connection was still open after {DEADLINE:?}"),
            Ok(Ok(0)) | Ok(Err(_)) => return got,
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
        }
    }
}

/// A connection that never sends a byte used to stay open forever.
#[tokio::test]
async fn a_connection_that_sends_nothing_is_closed() {
    let p = short_proxy(|_| {}).await;
    for addr in [p.running.listen, p.running.admin] {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        read_to_close(&mut stream).await;
    }
}

/// A request head that never completes used to hold the connection (and, on the admin port,
/// forever: it had no head timeout at all).
#[tokio::test]
async fn a_partial_head_is_closed_on_both_ports() {
    let p = short_proxy(|_| {}).await;
    for addr in [p.running.listen, p.running.admin] {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        stream
            .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
            .await
            .unwrap();
        read_to_close(&mut stream).await;
    }
}

/// An incomplete HTTP/2 preface used to hold the connection forever.
#[tokio::test]
async fn an_incomplete_http2_preface_is_closed() {
    let p = short_proxy(|_| {}).await;
    let mut stream = TcpStream::connect(p.running.listen).await.unwrap();
    stream.write_all(b"PRI * HTTP/2.0\r\n").await.unwrap();
    read_to_close(&mut stream).await;
}

/// Splits HTTP/2 frames out of `bytes`: (type, stream id).
fn h2_frames(bytes: &[u8]) -> Vec<(u8, u32)> {
    let mut frames = Vec::new();
    let mut at = 0;
    while at + 9 <= bytes.len() {
        let len = u32::from_be_bytes([0, bytes[at], bytes[at + 1], bytes[at + 2]]) as usize;
        let kind = bytes[at + 3];
        let stream =
            u32::from_be_bytes([bytes[at + 5], bytes[at + 6], bytes[at + 7], bytes[at + 8]])
                & 0x7fff_ffff;
        frames.push((kind, stream));
        at += 9 + len;
    }
    frames
}

/// An idle HTTP/2 connection used to stay open forever; it now gets a GOAWAY, then is closed.
#[tokio::test]
async fn an_idle_http2_connection_gets_goaway() {
    let p = short_proxy(|_| {}).await;
    let mut stream = TcpStream::connect(p.running.listen).await.unwrap();
    // The preface and an empty SETTINGS frame: a valid, idle HTTP/2 client.
    stream
        .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
        .await
        .unwrap();
    let got = read_to_close(&mut stream).await;
    let frames = h2_frames(&got);
    assert!(
        frames.iter().any(|&(kind, _)| kind == 0x7),
        "no GOAWAY among {frames:?}"
    );
}

/// Past the connection cap a client gets a clear 503, and the admin port still answers.
#[tokio::test]
async fn past_the_connection_cap_a_client_gets_503_and_health_still_answers() {
    let p = short_proxy(|c| {
        c.limits.max_connections = 3;
        // Long enough that the three silent connections stay open during the test.
        c.timeouts.request_head = Duration::from_secs(60);
    })
    .await;
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(TcpStream::connect(p.running.listen).await.unwrap());
    }
    // The accept loop sees connections in order; the fourth is over the cap.
    let mut extra = TcpStream::connect(p.running.listen).await.unwrap();
    let answer = String::from_utf8_lossy(&read_to_close(&mut extra).await).into_owned();
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(answer.contains("too_many_connections"), "{answer}");
    let health = reqwest_like_get(&p.admin_url("/healthz")).await;
    assert_eq!(health, 200);
    drop(held);
}

/// A minimal GET over a fresh connection; returns the status.
async fn reqwest_like_get(url: &str) -> u16 {
    let received = common::send(url, "GET", "", &[], false).await;
    received.status
}

/// Streams opened and reset in paced batches (50 every 10 ms) used to start thousands of
/// upstream requests a second from one connection, with no GOAWAY. Now the connection is sent
/// GOAWAY once its client has cancelled a few hundred, and the upstream sees a bounded number.
#[tokio::test]
async fn rapid_reset_gets_goaway_and_bounds_upstream_requests() {
    let mut up = upstream(|_| Script::silent()).await;
    let p = proxy(up.addr, |_| {}).await;
    let tcp = TcpStream::connect(p.running.listen).await.unwrap();
    let (client, connection) = h2::client::handshake(tcp).await.unwrap();
    let driver = tokio::spawn(connection);
    let mut sent = 0;
    let mut refused = false;
    'batches: for _ in 0..100 {
        for _ in 0..50 {
            let ready = timeout(DEADLINE, client.clone().ready()).await;
            let Ok(Ok(mut ready)) = ready else {
                refused = true;
                break 'batches;
            };
            let request = http::Request::post(p.url("/v1/chat/completions"))
                .body(())
                .unwrap();
            match ready.send_request(request, false) {
                Ok((_, mut body)) => {
                    let _ = body.send_data(Bytes::from_static(b"{\"model\":\"m\"}"), true);
                    body.send_reset(h2::Reason::CANCEL);
                    sent += 1;
                }
                Err(_) => {
                    refused = true;
                    break 'batches;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        refused,
        "sent {sent} cancelled requests and the connection was never refused"
    );
    assert!(sent < 1000, "{sent} requests went through before GOAWAY");
    drop(client);
    let _ = timeout(DEADLINE, driver).await;
    let mut upstream_requests = 0;
    while let Ok(Some(_)) = timeout(Duration::from_millis(200), up.seen.recv()).await {
        upstream_requests += 1;
    }
    assert!(
        upstream_requests <= sent && upstream_requests < 600,
        "the upstream saw {upstream_requests} requests"
    );
}

/// A response's last frame completes its request on the connection. It used to count as a
/// cancellation whenever the body said it had ended with that frame (hyper then polls no more),
/// so a client making its 201st request on one HTTP/2 connection within 10 s was sent GOAWAY as
/// a rapid-reset abuser.
#[tokio::test]
async fn many_complete_requests_on_one_http2_connection_are_not_cancellations() {
    let frames = vec![
        common::role_chunk(),
        common::chat_chunk("a"),
        common::finish_chunk("stop", Some(1)),
        common::done(),
    ];
    let up = upstream(move |_| Script::stream("text/event-stream", frames.clone())).await;
    let p = proxy(up.addr, |_| {}).await;
    let tcp = TcpStream::connect(p.running.listen).await.unwrap();
    let (client, connection) = h2::client::handshake(tcp).await.unwrap();
    let driver = tokio::spawn(connection);
    for n in 0..300 {
        let ready = timeout(DEADLINE, client.clone().ready()).await;
        let Ok(Ok(mut ready)) = ready else {
            panic!("request {n}: the connection refused new requests");
        };
        let request = http::Request::post(p.url("/v1/chat/completions"))
            .body(())
            .unwrap();
        let (response, mut body) = ready
            .send_request(request, false)
            .unwrap_or_else(|e| panic!("request {n}: {e}"));
        body.send_data(Bytes::from(common::chat_request("m")), true)
            .unwrap();
        let response = timeout(DEADLINE, response)
            .await
            .unwrap()
            .unwrap_or_else(|e| panic!("request {n}: {e}"));
        assert_eq!(response.status(), 200);
        let mut body = response.into_body();
        let mut got = Vec::new();
        while let Some(chunk) = timeout(DEADLINE, body.data()).await.unwrap() {
            let chunk = chunk.unwrap();
            let _ = body.flow_control().release_capacity(chunk.len());
            got.extend_from_slice(&chunk);
        }
        assert!(got.ends_with(b"data: [DONE]\n\n"), "request {n}: {got:?}");
    }
    drop(client);
    let _ = timeout(DEADLINE, driver).await;
}

/// With two event loops (`--workers 2`), requests are served, and shutdown waits for the second
/// loop's thread to drain and end.
#[tokio::test]
async fn two_event_loops_serve_and_drain() {
    let frames = vec![
        common::role_chunk(),
        common::chat_chunk("a"),
        common::done(),
    ];
    let up = upstream(move |_| Script::stream("text/event-stream", frames.clone())).await;
    let config = tokenmeter::Config {
        listen: "127.0.0.1:0".parse().unwrap(),
        admin: "127.0.0.1:0".parse().unwrap(),
        upstream: tokenmeter::Upstream::parse(&format!("http://{}", up.addr)).unwrap(),
        ..tokenmeter::Config::default()
    };
    let overrides = tokenmeter::Overrides {
        shards: Some(2),
        ..Default::default()
    };
    let running = tokenmeter::start(config, None, overrides).await.unwrap();
    let addr = running.listen;
    let mut clients = tokio::task::JoinSet::new();
    for _ in 0..20 {
        clients.spawn(async move {
            let mut stream = TcpStream::connect(addr).await.unwrap();
            let body = common::chat_request("m");
            let head = format!(
                "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nconnection: close\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                body.len()
            );
            stream.write_all(head.as_bytes()).await.unwrap();
            read_to_close(&mut stream).await
        });
    }
    while let Some(got) = clients.join_next().await {
        let got = String::from_utf8(got.unwrap()).unwrap();
        assert!(got.starts_with("HTTP/1.1 200"), "{got}");
        assert!(got.contains("data: [DONE]"), "{got}");
    }
    assert!(running
        .metrics_text()
        .contains("tokenmeter_requests_total{model=\"m\",outcome=\"ok\",route=\"default\"} 20"));
    running.shutdown();
    timeout(DEADLINE, running.wait())
        .await
        .expect("both loops drained and ended");
}
