//! The proxy end to end: scripted upstreams on port 0, a proxy started from the library, clients
//! that read frame by frame. Transparency, timing, every outcome and failure, drain.

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::*;
use serde_json::Value;

const CHAT: &str = "/v1/chat/completions";

fn ms(record: &Value, field: &str) -> f64 {
    record[field]
        .as_f64()
        .unwrap_or_else(|| panic!("{field} missing in {record}"))
}

/// The bytes a client receives must equal what the upstream sent, however the upstream cut
/// them, for every captured stream, over HTTP/1.1 and h2c.
#[tokio::test]
async fn every_fixture_passes_through_byte_for_byte_however_it_is_cut() {
    let expected: Value = serde_json::from_str(
        &std::fs::read_to_string(fixtures_dir().join("expected.json")).unwrap(),
    )
    .unwrap();
    let mut files: Vec<_> = std::fs::read_dir(fixtures_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            matches!(
                p.extension().and_then(|e| e.to_str()),
                Some("sse" | "ndjson")
            )
        })
        .collect();
    files.sort();
    assert!(files.len() >= 16, "fixtures missing: {files:?}");

    for (n, file) in files.iter().enumerate() {
        let name = file.file_name().unwrap().to_str().unwrap().to_string();
        let data = std::fs::read(file).unwrap();
        let content_type = if name.ends_with(".ndjson") {
            "application/x-ndjson"
        } else {
            "text/event-stream"
        };
        let dialect = expected[&name]["dialect"].as_str().unwrap().to_string();
        let path = match dialect.as_str() {
            "openai-chat" => "/v1/chat/completions",
            "openai-completions" => "/v1/completions",
            _ => "/replay",
        };
        let mut rng = Rng::new(n as u64 + 1);
        let mut cuts: Vec<(String, Vec<Bytes>)> = vec![
            ("one frame".into(), vec![Bytes::from(data.clone())]),
            ("single bytes".into(), split(&data, &mut rng, Some(1))),
            ("3-byte frames".into(), split(&data, &mut rng, Some(3))),
        ];
        for seed in 0..3 {
            cuts.push((format!("random seed {seed}"), split(&data, &mut rng, None)));
        }
        for (how, frames) in cuts {
            let upstream = upstream({
                let frames = frames.clone();
                let ct = content_type.to_string();
                move |_| Script::stream(&ct, frames.clone())
            })
            .await;
            let proxy = proxy(upstream.addr, |_| {}).await;
            for h2 in [false, true] {
                let got = send(&proxy.url(path), "POST", &chat_request("m"), &[], h2).await;
                assert_eq!(got.status, 200, "{name} ({how})");
                assert!(
                    got.body_error.is_none(),
                    "{name} ({how}): {:?}",
                    got.body_error
                );
                assert!(got.bytes() == data, "{name} ({how}, h2={h2}): bytes differ");
            }
            let records = proxy.records(2).await;
            // Every dialect is read: by its path, or (on `/replay`) sniffed from its first events.
            let want = &expected[&name];
            for r in &records {
                assert_eq!(r["outcome"], want["outcome"], "{name} ({how}): {r}");
                assert_eq!(
                    r["output_tokens"], want["output_tokens"],
                    "{name} ({how}): {r}"
                );
                assert_eq!(
                    r["token_source"], want["token_source"],
                    "{name} ({how}): {r}"
                );
                assert_eq!(
                    r["bytes"].as_u64(),
                    Some(data.len() as u64),
                    "{name} ({how})"
                );
            }
        }
    }
}

/// UTF-8 characters and CRLF pairs cut at every possible byte still arrive intact and are
/// still read right.
#[tokio::test]
async fn splits_inside_utf8_and_crlf_change_nothing() {
    let stream = "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\"}}]}\r\n\r\n\
                  data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"héllo → 世界 🦀\"}}]}\r\n\r\n\
                  data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"ü\"},\"finish_reason\":\"stop\"}]}\r\n\r\n\
                  data: [DONE]\r\n\r\n";
    let data = stream.as_bytes();
    for cut in 1..data.len() {
        let frames = vec![
            Bytes::copy_from_slice(&data[..cut]),
            Bytes::copy_from_slice(&data[cut..]),
        ];
        let upstream = upstream(move |_| Script::stream("text/event-stream", frames.clone())).await;
        let proxy = proxy(upstream.addr, |_| {}).await;
        let got = send(&proxy.url(CHAT), "POST", &chat_request("m"), &[], false).await;
        assert_eq!(got.bytes(), data, "cut at {cut}");
        let r = &proxy.records(1).await[0];
        assert_eq!(r["outcome"], "ok", "cut at {cut}: {r}");
        assert_eq!(r["output_tokens"], 2, "cut at {cut}: {r}");
        assert_eq!(r["finish_reason"], "stop", "cut at {cut}: {r}");
    }
}

/// TTFB, TTFT, TPOT, ITL and E2E are taken when frames are handed to the client. The upstream
/// sends the role chunk at once, then three tokens 200 ms, 260 ms and 320 ms later.
#[tokio::test]
async fn timing_is_taken_where_the_client_sees_it() {
    let upstream = upstream(|_| {
        let mut s = Script::stream("text/event-stream", vec![]);
        s.steps = vec![
            Step::Write(role_chunk()),
            Step::Wait(Duration::from_millis(200)),
            Step::Write(chat_chunk("a")),
            Step::Wait(Duration::from_millis(60)),
            Step::Write(chat_chunk("b")),
            Step::Wait(Duration::from_millis(60)),
            Step::Write(chat_chunk("c")),
            Step::Write(finish_chunk("stop", Some(3))),
            Step::Write(done()),
            Step::End,
        ];
        s
    })
    .await;
    let proxy = proxy(upstream.addr, |_| {}).await;
    let sent = tokio::time::Instant::now();
    let got = send(
        &proxy.url(CHAT),
        "POST",
        &chat_request("llama"),
        &[("x-request-id", "req-7")],
        false,
    )
    .await;
    assert_eq!(got.status, 200);
    let r = &proxy.records(1).await[0];
    assert_eq!(r["request_id"], "req-7");
    assert_eq!(r["model"], "llama");
    assert_eq!(r["outcome"], "ok");
    assert_eq!(r["output_tokens"], 3);
    assert_eq!(r["prompt_tokens"], 7);
    assert_eq!(r["token_source"], "usage");
    assert_eq!(r["finish_reason"], "stop");
    // Generous tolerances: the machine may be loaded; the structure is what is checked.
    let (ttfb, ttft, ttfc, tpot, max_itl, e2e) = (
        ms(r, "ttfb_ms"),
        ms(r, "ttft_ms"),
        ms(r, "ttfc_ms"),
        ms(r, "tpot_ms"),
        ms(r, "max_itl_ms"),
        ms(r, "e2e_ms"),
    );
    assert!(ttfb < 150.0, "role chunk was immediate: ttfb {ttfb}");
    assert!((200.0..450.0).contains(&ttft), "ttft {ttft}");
    assert_eq!(ttft, ttfc, "first token is content");
    assert!((50.0..200.0).contains(&tpot), "tpot {tpot}");
    assert!((55.0..250.0).contains(&max_itl), "max itl {max_itl}");
    assert!(e2e >= ttft + 110.0 && e2e < 1500.0, "e2e {e2e}");
    // The client's own reading of the first token agrees with the proxy's.
    let client_ttft = got
        .frames
        .iter()
        .find(|(_, b)| b.windows(3).any(|w| w == b"\"a\""))
        .map(|(t, _)| t.duration_since(sent).as_secs_f64() * 1e3)
        .unwrap();
    assert!(
        client_ttft >= ttft && client_ttft - ttft < 100.0,
        "client {client_ttft} vs proxy {ttft}"
    );

    let m = proxy.metrics();
    for line in [
        "tokenmeter_inter_token_latency_seconds_count{model=\"llama\",route=\"default\"} 2",
        "tokenmeter_time_to_first_token_seconds_count{model=\"llama\",route=\"default\"} 1",
        "tokenmeter_time_per_output_token_seconds_count{model=\"llama\",route=\"default\"} 1",
        "tokenmeter_requests_total{model=\"llama\",outcome=\"ok\",route=\"default\"} 1",
        "tokenmeter_output_tokens_total{model=\"llama\",route=\"default\"} 3",
        "tokenmeter_prompt_tokens_total{model=\"llama\",route=\"default\"} 7",
        "tokenmeter_finish_reasons_total{reason=\"stop\",route=\"default\"} 1",
        "tokenmeter_in_flight_requests{route=\"default\"} 0",
    ] {
        assert!(m.contains(line), "missing `{line}` in\n{m}");
    }
}

fn stream_of(frames: Vec<Bytes>) -> Script {
    Script::stream("text/event-stream", frames)
}

/// Each way a request can end gets the outcome MEASUREMENT.md gives it.
#[tokio::test]
async fn each_ending_gets_its_outcome() {
    let error_event = Bytes::from_static(
        b"data: {\"error\":{\"message\":\"engine died\",\"type\":\"server_error\"}}\n\n",
    );
    let non_streaming = r#"{"id":"x","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"Hello there"},"finish_reason":"stop"}],"usage":{"prompt_tokens":5,"completion_tokens":2,"total_tokens":7}}"#;
    let cases: Vec<(&str, &str, Script, &str)> = vec![
        (
            "complete stream",
            CHAT,
            stream_of(vec![
                role_chunk(),
                chat_chunk("a"),
                finish_chunk("stop", None),
                done(),
            ]),
            "ok",
        ),
        (
            "finish_reason without [DONE]",
            CHAT,
            stream_of(vec![chat_chunk("a"), finish_chunk("length", Some(1))]),
            "ok",
        ),
        (
            "server error",
            CHAT,
            Script::json(500, r#"{"error":"boom"}"#),
            "error",
        ),
        (
            "rate limited",
            CHAT,
            Script::json(429, r#"{"error":"slow down"}"#),
            "error",
        ),
        (
            "bad request",
            CHAT,
            Script::json(400, r#"{"error":"bad"}"#),
            "client_error",
        ),
        (
            "not found",
            CHAT,
            Script::json(404, r#"{"error":"no"}"#),
            "client_error",
        ),
        (
            "truncated stream",
            CHAT,
            stream_of(vec![role_chunk(), chat_chunk("a")]),
            "error",
        ),
        (
            "error event in a 200",
            CHAT,
            stream_of(vec![chat_chunk("a"), error_event]),
            "error",
        ),
        (
            "non-streaming completion",
            CHAT,
            Script::json(200, non_streaming),
            "ok",
        ),
        (
            "not an LLM call",
            "/v1/models",
            Script::json(200, r#"{"data":[]}"#),
            "ok",
        ),
    ];
    for (name, path, script, outcome) in cases {
        let upstream = upstream(move |_| script.clone()).await;
        let proxy = proxy(upstream.addr, |_| {}).await;
        let got = send(&proxy.url(path), "POST", &chat_request("m"), &[], false).await;
        assert!(got.body_error.is_none(), "{name}: {:?}", got.body_error);
        let r = &proxy.records(1).await[0];
        assert_eq!(r["outcome"], outcome, "{name}: {r}");
        assert_eq!(r["status"].as_u64(), Some(got.status as u64), "{name}");
        if name == "non-streaming completion" {
            assert_eq!(r["output_tokens"], 2, "{r}");
            assert_eq!(r["token_source"], "usage", "{r}");
            assert_eq!(r["ttft_ms"], r["e2e_ms"], "non-streaming TTFT is E2E: {r}");
        }
        let m = proxy.metrics();
        // A model name gets a label of its own only once the upstream answered it with success;
        // before that its failures count under `other`.
        let model = if (200..300).contains(&got.status) {
            "m"
        } else {
            "other"
        };
        let line = format!(
            "tokenmeter_requests_total{{model=\"{model}\",outcome=\"{outcome}\",route=\"default\"}} 1"
        );
        assert!(m.contains(&line), "{name}: missing {line}");
    }
}

/// An upstream that dies mid-body must end the client's response as an error, never as a
/// clean end the client would take for a complete answer.
#[tokio::test]
async fn upstream_dying_mid_body_is_an_error_for_the_client_too() {
    for (how, last) in [("closed", Step::Close), ("reset", Step::Reset)] {
        let upstream = upstream(move |_| {
            let mut s = stream_of(vec![]);
            s.steps = vec![
                Step::Write(role_chunk()),
                Step::Write(chat_chunk("a")),
                last.clone(),
            ];
            s
        })
        .await;
        let proxy = proxy(upstream.addr, |_| {}).await;
        for h2 in [false, true] {
            let got = send(&proxy.url(CHAT), "POST", &chat_request("m"), &[], h2).await;
            assert_eq!(got.status, 200);
            assert!(
                got.body_error.is_some(),
                "{how}, h2={h2}: the client saw a clean end"
            );
        }
        for r in proxy.records(2).await {
            assert_eq!(r["outcome"], "error", "{how}: {r}");
            assert_eq!(r["output_tokens"], 1, "{how}: {r}");
        }
    }
}

/// A client that goes away mid-stream must stop the model server's work at once.
#[tokio::test]
async fn a_client_going_away_cancels_the_upstream_request() {
    let mut upstream = upstream(|_| {
        let mut s = stream_of(vec![]);
        s.steps = vec![
            Step::Write(role_chunk()),
            Step::Write(chat_chunk("a")),
            Step::Wait(Duration::from_secs(30)),
            Step::Write(chat_chunk("never")),
            Step::End,
        ];
        s
    })
    .await;
    let proxy = proxy(upstream.addr, |_| {}).await;
    for h2 in [false, true] {
        let mut builder =
            hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new());
        builder.http2_only(h2);
        let client: hyper_util::client::legacy::Client<_, http_body_util::Full<Bytes>> =
            builder.build_http();
        let request = http::Request::post(proxy.url(CHAT))
            .body(http_body_util::Full::new(Bytes::from(chat_request("m"))))
            .unwrap();
        let response = client.request(request).await.unwrap();
        let mut body = response.into_body();
        use http_body_util::BodyExt;
        let first = body.frame().await.unwrap().unwrap();
        assert!(first.is_data());
        drop(body);
        drop(client);
        tokio::time::timeout(Duration::from_secs(5), upstream.disconnects.recv())
            .await
            .unwrap_or_else(|_| panic!("h2={h2}: the upstream was not told within 5 s"));
    }
    for r in proxy.records(2).await {
        assert_eq!(r["outcome"], "cancelled", "{r}");
    }
}

/// No upstream listening: the client gets 502 with a body saying so, counted as an error.
#[tokio::test]
async fn an_unreachable_upstream_is_a_502() {
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let proxy = proxy(closed, |_| {}).await;
    let got = send(&proxy.url(CHAT), "POST", &chat_request("m"), &[], false).await;
    assert_eq!(got.status, 502);
    let body: Value = serde_json::from_slice(&got.bytes()).unwrap();
    assert_eq!(body["error"]["type"], "upstream_unreachable");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains(&closed.to_string()),
        "{body}"
    );
    let r = &proxy.records(1).await[0];
    assert_eq!(r["outcome"], "error");
    assert_eq!(r["status"], 502);
    // The body was never sent, so it was never read: the model is unknown, not guessed.
    assert_eq!(r["model"], Value::Null);
}

/// No response head within `timeouts.response_head`: 504, and the upstream request is dropped.
#[tokio::test]
async fn a_silent_upstream_is_a_504() {
    let mut upstream = upstream(|_| Script::silent()).await;
    let proxy = proxy(upstream.addr, |c| {
        c.timeouts.response_head = Duration::from_millis(300)
    })
    .await;
    let got = send(&proxy.url(CHAT), "POST", &chat_request("m"), &[], false).await;
    assert_eq!(got.status, 504);
    let body: Value = serde_json::from_slice(&got.bytes()).unwrap();
    assert_eq!(body["error"]["type"], "upstream_timeout");
    let r = &proxy.records(1).await[0];
    assert_eq!(r["outcome"], "error");
    assert_eq!(r["status"], 504);
    assert!(ms(r, "e2e_ms") >= 300.0);
    tokio::time::timeout(Duration::from_secs(5), upstream.disconnects.recv())
        .await
        .expect("the upstream request was dropped");
}

/// A reused upstream connection keeps its response-head timer from one exchange to the next
/// (armed at the first's deadline, moved on only when it fires): the second exchange still gets
/// its own full deadline, not what was left of the first's.
#[tokio::test]
async fn a_reused_connection_s_next_request_gets_its_own_response_head_deadline() {
    let answered = std::sync::atomic::AtomicBool::new(false);
    let mut upstream = upstream(move |_| {
        if answered.swap(true, std::sync::atomic::Ordering::SeqCst) {
            Script::silent()
        } else {
            Script::json(200, "{}")
        }
    })
    .await;
    let proxy = proxy(upstream.addr, |c| {
        c.timeouts.response_head = Duration::from_millis(600)
    })
    .await;
    let first = send(&proxy.url(CHAT), "POST", &chat_request("m"), &[], false).await;
    assert_eq!(first.status, 200);
    // Most of the first exchange's deadline passes before the second starts: a timer that
    // fired at the first's deadline would end the second after about 200 ms.
    tokio::time::sleep(Duration::from_millis(400)).await;
    let second = send(&proxy.url(CHAT), "POST", &chat_request("m"), &[], false).await;
    assert_eq!(second.status, 504);
    let records = proxy.records(2).await;
    assert_eq!(records[1]["upstream_conn"], "reused", "{}", records[1]);
    assert_eq!(records[1]["status"], 504);
    assert!(ms(&records[1], "e2e_ms") >= 600.0, "{}", records[1]);
    tokio::time::timeout(Duration::from_secs(5), upstream.disconnects.recv())
        .await
        .expect("the upstream request was dropped");
}

/// The request body streams through unchanged, however large, and its `model` is read even
/// when it comes after a long prompt.
#[tokio::test]
async fn request_bodies_stream_through_and_their_model_is_read() {
    let mut upstream = upstream(|_| {
        Script::json(
            200,
            r#"{"choices":[{"message":{"content":"ok"},"finish_reason":"stop"}]}"#,
        )
    })
    .await;
    let proxy = proxy(upstream.addr, |_| {}).await;
    let prompt = "lorem \\\"ipsum\\\" {\\\"model\\\": \\\"fake\\\"} ".repeat(100_000);
    let body = format!(
        r#"{{"messages":[{{"role":"user","content":"{prompt}","model":"nested"}}],"model":"big-model","stream":false}}"#
    );
    assert!(body.len() > 3_000_000);
    let got = send(&proxy.url(CHAT), "POST", &body, &[], false).await;
    assert_eq!(got.status, 200);
    let seen = upstream.seen.recv().await.unwrap();
    assert!(
        seen.body == body.as_bytes(),
        "request body changed on the way"
    );
    let r = &proxy.records(1).await[0];
    assert_eq!(r["model"], "big-model");
    assert!(proxy.metrics().contains("model=\"big-model\""));
}

/// Hop-by-hop headers (RFC 9110 §7.6.1) stay on their hop; end-to-end headers pass.
#[tokio::test]
async fn hop_by_hop_headers_stay_on_their_hop() {
    let mut upstream = upstream(|_| {
        Script::json(200, "{}")
            .header("keep-alive", "timeout=5")
            .header("connection", "x-resp-hop")
            .header("x-resp-hop", "1")
            .header("x-upstream", "yes")
    })
    .await;
    let proxy = proxy(upstream.addr, |_| {}).await;
    let got = send(
        &proxy.url("/v1/models?x=1"),
        "GET",
        "",
        &[
            ("connection", "x-req-hop"),
            ("x-req-hop", "1"),
            ("authorization", "Bearer k"),
            ("x-end", "2"),
        ],
        false,
    )
    .await;
    assert_eq!(got.headers.get("x-upstream").unwrap(), "yes");
    assert!(got.headers.get("x-resp-hop").is_none());
    assert!(got.headers.get("keep-alive").is_none());
    let seen = upstream.seen.recv().await.unwrap();
    assert!(
        seen.head.starts_with("GET /v1/models?x=1 HTTP/1.1\r\n"),
        "{}",
        seen.head
    );
    assert_eq!(seen.header("authorization").as_deref(), Some("Bearer k"));
    assert_eq!(seen.header("x-end").as_deref(), Some("2"));
    assert_eq!(seen.header("x-req-hop"), None);
    // The record never carries the query string.
    assert_eq!(proxy.records(1).await[0]["path"], "/v1/models");
}

/// Draining: /readyz turns 503, the listener closes, the open stream finishes, then it stops.
#[tokio::test]
async fn drain_lets_open_streams_finish() {
    let upstream = upstream(|_| {
        let mut s = stream_of(vec![]);
        s.steps = vec![Step::Write(role_chunk())];
        for t in ["a", "b", "c"] {
            s.steps.push(Step::Wait(Duration::from_millis(100)));
            s.steps.push(Step::Write(chat_chunk(t)));
        }
        s.steps.extend([
            Step::Write(finish_chunk("stop", None)),
            Step::Write(done()),
            Step::End,
        ]);
        s
    })
    .await;
    let proxy = proxy(upstream.addr, |c| {
        c.timeouts.drain = Duration::from_secs(10)
    })
    .await;
    let url = proxy.url(CHAT);
    let stream =
        tokio::spawn(async move { send(&url, "POST", &chat_request("m"), &[], false).await });
    let in_flight = "tokenmeter_in_flight_requests{route=\"default\"} 1";
    eventually("the stream in flight", || {
        proxy.metrics().contains(in_flight)
    })
    .await;
    proxy.running.shutdown();
    let ready = send(&proxy.admin_url("/readyz"), "GET", "", &[], false).await;
    assert_eq!(ready.status, 503);
    let health = send(&proxy.admin_url("/healthz"), "GET", "", &[], false).await;
    assert_eq!(health.status, 200);
    // The listener is closed once the accept loop has seen the shutdown.
    let listen = proxy.running.listen;
    eventually("the listener closed", || {
        std::net::TcpStream::connect(listen).is_err()
    })
    .await;
    let got = stream.await.unwrap();
    assert!(got.body_error.is_none());
    assert!(got.bytes().ends_with(b"data: [DONE]\n\n"));
    let records = proxy.records.clone();
    tokio::time::timeout(Duration::from_secs(5), proxy.running.wait())
        .await
        .expect("drained");
    let r = &wait_for_records(&records, 1).await[0];
    assert_eq!(r["outcome"], "ok", "{r}");
}

/// A stream that never ends must not hold shutdown beyond the drain deadline.
#[tokio::test]
async fn the_drain_deadline_bounds_shutdown() {
    let upstream = upstream(|_| {
        let mut s = stream_of(vec![]);
        s.steps = vec![Step::Write(role_chunk()), Step::Hang];
        s
    })
    .await;
    let proxy = proxy(upstream.addr, |c| {
        c.timeouts.drain = Duration::from_millis(300)
    })
    .await;
    let url = proxy.url(CHAT);
    let stream =
        tokio::spawn(async move { send(&url, "POST", &chat_request("m"), &[], false).await });
    let in_flight = "tokenmeter_in_flight_requests{route=\"default\"} 1";
    eventually("the stream in flight", || {
        proxy.metrics().contains(in_flight)
    })
    .await;
    let started = tokio::time::Instant::now();
    proxy.running.shutdown();
    let records = proxy.records.clone();
    tokio::time::timeout(Duration::from_secs(5), proxy.running.wait())
        .await
        .expect("stopped");
    assert!(started.elapsed() >= Duration::from_millis(300));
    let got = stream.await.unwrap();
    assert!(
        got.body_error.is_some(),
        "a cut stream must not look complete"
    );
    let r = &wait_for_records(&records, 1).await[0];
    assert_eq!(r["outcome"], "cancelled", "{r}");
}

/// What /metrics exposes is valid Prometheus text: `promtool check metrics` has nothing to say.
#[tokio::test]
async fn metrics_pass_promtool() {
    let upstream = upstream(|_| {
        stream_of(vec![
            role_chunk(),
            chat_chunk("a"),
            chat_chunk("b"),
            finish_chunk("stop", Some(2)),
            done(),
        ])
    })
    .await;
    let proxy = proxy(upstream.addr, |_| {}).await;
    for model in ["a", "b"] {
        send(&proxy.url(CHAT), "POST", &chat_request(model), &[], false).await;
    }
    proxy.records(2).await;
    let got = send(&proxy.admin_url("/metrics"), "GET", "", &[], false).await;
    assert_eq!(got.status, 200);
    assert!(got.headers["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/plain; version=0.0.4"));
    let mut child = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("promtool is needed (Debian package `prometheus`; .ci/run installs it)");
    use std::io::Write;
    child.stdin.take().unwrap().write_all(&got.bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && said.trim().is_empty(),
        "promtool: {said}"
    );
}

/// Requests take the first route that matches, a model glob included, the rest `default`;
/// metrics and records carry the route.
#[tokio::test]
async fn requests_take_the_first_matching_route() {
    let upstream =
        upstream(|_| stream_of(vec![chat_chunk("a"), finish_chunk("stop", Some(1)), done()])).await;
    let proxy = proxy(upstream.addr, |c| {
        c.routes = routes("routes:\n  - name: llama\n    match: {model: \"llama-*\"}\n  - name: chat\n    match: {path_prefix: /v1/chat/}\n");
    })
    .await;
    for (path, model) in [
        (CHAT, "llama-3"),
        (CHAT, "gpt-4o"),
        ("/v1/completions", "gpt-4o"),
    ] {
        send(&proxy.url(path), "POST", &chat_request(model), &[], false).await;
    }
    let records = proxy.records(3).await;
    let routes: Vec<_> = records
        .iter()
        .map(|r| (r["model"].as_str().unwrap(), r["route"].as_str().unwrap()))
        .collect();
    for want in [
        ("llama-3", "llama"),
        ("gpt-4o", "chat"),
        ("gpt-4o", "default"),
    ] {
        assert!(routes.contains(&want), "{want:?} not in {routes:?}");
    }
    let m = proxy.metrics();
    for route in ["llama", "chat", "default"] {
        assert!(
            m.contains(&format!(
                "tokenmeter_in_flight_requests{{route=\"{route}\"}} 0"
            )),
            "{route}\n{m}"
        );
    }
}

/// Half the load answers its first token in 20 ms, half in 400 ms, against `ttft: 200ms`:
/// exactly half is good, the other half is counted as TTFT violations, and every record agrees.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_half_slow_load_is_exactly_half_good() {
    let upstream = upstream(|seen| {
        let slow = String::from_utf8_lossy(&seen.body).contains("\"slow\"");
        let mut s = stream_of(vec![]);
        s.steps = vec![
            Step::Write(role_chunk()),
            Step::Wait(Duration::from_millis(if slow { 400 } else { 20 })),
            Step::Write(chat_chunk("a")),
            Step::Wait(Duration::from_millis(5)),
            Step::Write(chat_chunk("b")),
            Step::Write(finish_chunk("stop", Some(2))),
            Step::Write(done()),
            Step::End,
        ];
        s
    })
    .await;
    let proxy = proxy(upstream.addr, |c| {
        c.routes = routes("routes:\n  - name: chat\n    match: {path_prefix: /v1/chat/}\n    slo: {ttft: 200ms, objective: 0.99}\n");
    })
    .await;
    let url = proxy.url(CHAT);
    let sends: Vec<_> = (0..20)
        .map(|i| {
            let url = url.clone();
            tokio::spawn(async move {
                let model = if i % 2 == 0 { "fast" } else { "slow" };
                send(&url, "POST", &chat_request(model), &[], false).await
            })
        })
        .collect();
    for s in sends {
        assert_eq!(s.await.unwrap().status, 200);
    }
    let records = proxy.records(20).await;
    for r in &records {
        let ttft = ms(r, "ttft_ms");
        match r["model"].as_str().unwrap() {
            "fast" => {
                assert!(ttft < 200.0, "{r}");
                assert_eq!(r["slo"], "good", "{r}");
                assert_eq!(r["violated"], serde_json::json!([]), "{r}");
            }
            _ => {
                assert!(ttft > 200.0, "{r}");
                assert_eq!(r["slo"], "violated", "{r}");
                assert_eq!(r["violated"], serde_json::json!(["ttft"]), "{r}");
            }
        }
    }
    let m = proxy.metrics();
    for line in [
        "tokenmeter_slo_eligible_requests_total{model=\"fast\",route=\"chat\"} 10",
        "tokenmeter_slo_eligible_requests_total{model=\"slow\",route=\"chat\"} 10",
        "tokenmeter_slo_good_requests_total{model=\"fast\",route=\"chat\"} 10",
        "tokenmeter_slo_good_requests_total{model=\"slow\",route=\"chat\"} 0",
        "tokenmeter_slo_violations_total{criterion=\"ttft\",model=\"slow\",route=\"chat\"} 10",
        "tokenmeter_slo_good_output_tokens_total{model=\"fast\",route=\"chat\"} 20",
        "tokenmeter_slo_objective_ratio{route=\"chat\"} 0.99",
        "tokenmeter_slo_threshold_seconds{criterion=\"ttft\",route=\"chat\"} 0.2",
        // The threshold is a bucket bound: attainment reads exactly from the histogram.
        "tokenmeter_time_to_first_token_seconds_bucket{model=\"fast\",route=\"chat\",le=\"0.2\"} 10",
        "tokenmeter_time_to_first_token_seconds_bucket{model=\"slow\",route=\"chat\",le=\"0.2\"} 0",
    ] {
        assert!(m.contains(line), "missing {line}\n{m}");
    }
    assert!(
        !m.contains("tokenmeter_slo_violations_total{criterion=\"ttft\",model=\"fast\""),
        "{m}"
    );
}

/// A route can pin the dialect: a TGI stream served on a path that says nothing is read as
/// TGI, and a route pinned to `unknown` is measured by bytes only.
#[tokio::test]
async fn a_route_can_pin_the_dialect() {
    let tgi = std::fs::read(fixtures_dir().join("tgi_generate_stream_flant5_nospace.sse")).unwrap();
    let upstream = upstream(move |_| stream_of(vec![Bytes::from(tgi.clone())])).await;
    let proxy = proxy(upstream.addr, |c| {
        c.routes = routes("routes:\n  - name: tgi\n    match: {path: /custom}\n    dialect: tgi\n  - name: bytes\n    dialect: unknown\n    match: {path: /v1/chat/completions}\n");
    })
    .await;
    send(&proxy.url("/custom"), "POST", "{}", &[], false).await;
    send(&proxy.url(CHAT), "POST", "{}", &[], false).await;
    let records = proxy.records(2).await;
    let by_route = |name: &str| records.iter().find(|r| r["route"] == name).unwrap().clone();
    let tgi = by_route("tgi");
    assert_eq!(tgi["output_tokens"], 1, "{tgi}");
    assert_eq!(tgi["token_source"], "usage", "{tgi}");
    assert_eq!(tgi["finish_reason"], "length", "{tgi}");
    let bytes = by_route("bytes");
    assert_eq!(bytes["ttft_ms"], Value::Null, "{bytes}");
    assert_eq!(bytes["outcome"], "ok", "{bytes}");
}
