//! Every record explains itself: cached and reasoning tokens, the engine's own timing and queue,
//! and the engine's state at arrival from its own metrics, each from what the proxy already
//! sees (the stream, the response head, one scrape per interval), never from an extra call per
//! request. Captured streams and headers of llama.cpp, Ollama, TGI and an OpenAI-style server
//! are replayed through the proxy; the real engine's are in tests/engine.rs.

mod common;

use std::path::Path;

use bytes::Bytes;
use common::{chat_request, proxy, send, upstream, Script};

fn fixture(name: &str) -> Bytes {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    Bytes::from(std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
}

/// One stream, replayed line by line as its own frames.
fn replay(content_type: &str, body: Bytes) -> Script {
    let mut frames = Vec::new();
    let mut start = 0;
    for (i, b) in body.iter().enumerate() {
        if *b == b'\n' {
            frames.push(body.slice(start..=i));
            start = i + 1;
        }
    }
    if start < body.len() {
        frames.push(body.slice(start..));
    }
    Script::stream(content_type, frames)
}

/// `engine_metrics` scraping `addr`'s /metrics every 100 ms.
fn engine_metrics(addr: std::net::SocketAddr) -> Option<tokenmeter::EngineMetrics> {
    tokenmeter::Config::parse(
        &format!("engine_metrics: {{url: http://{addr}/metrics, interval: 100ms}}\n"),
        "t.yaml",
    )
    .unwrap()
    .engine_metrics
}

fn num(r: &serde_json::Value, field: &str) -> f64 {
    r[field]
        .as_f64()
        .unwrap_or_else(|| panic!("no {field} in {r}"))
}

#[tokio::test]
async fn an_openai_stream_with_cached_and_reasoning_tokens() {
    let body = fixture("streams/openai_chat_o4mini_cached_reasoning.sse");
    let up = upstream(move |_| replay("text/event-stream", body.clone())).await;
    let p = proxy(up.addr, |_| {}).await;
    send(
        &p.url("/v1/chat/completions"),
        "POST",
        &chat_request("o4-mini"),
        &[],
        false,
    )
    .await;
    let r = &p.records(1).await[0];
    assert_eq!(r["cached_tokens"], 1792, "{r}");
    assert_eq!(r["reasoning_tokens"], 192, "{r}");
    assert_eq!(r["prompt_tokens"], 1854, "{r}");
    // An OpenAI-style server reports no timing of its own: nothing is made up.
    assert!(r["engine_source"].is_null(), "{r}");
    assert!(
        r["queue_ms"].is_null() && r["queue_source"].is_null(),
        "{r}"
    );
}

#[tokio::test]
async fn an_ollama_cold_load_says_so() {
    let body = fixture("streams/ollama_generate_cold_load.ndjson");
    let up = upstream(move |_| replay("application/x-ndjson", body.clone())).await;
    let p = proxy(up.addr, |_| {}).await;
    send(
        &p.url("/api/generate"),
        "POST",
        r#"{"model":"llama3.2","prompt":"hi"}"#,
        &[],
        false,
    )
    .await;
    let r = &p.records(1).await[0];
    assert_eq!(r["engine_source"], "ollama", "{r}");
    assert_eq!(num(r, "engine_load_ms"), 6338.219, "{r}");
    assert_eq!(num(r, "engine_prefill_ms"), 130.079, "{r}");
    assert_eq!(num(r, "engine_decode_ms"), 93.013, "{r}");
    assert_eq!(num(r, "engine_total_ms"), 6571.399, "{r}");
    // Ollama reports prefill, so the queue is derived, and says so.
    assert_eq!(r["queue_source"], "derived", "{r}");
}

#[tokio::test]
async fn a_llamacpp_stream_carries_its_timings() {
    let body = fixture("streams/llamacpp_real_chat_stream_usage.sse");
    let up = upstream(move |_| replay("text/event-stream", body.clone())).await;
    let p = proxy(up.addr, |_| {}).await;
    send(
        &p.url("/v1/chat/completions"),
        "POST",
        &chat_request("tiny"),
        &[],
        false,
    )
    .await;
    let r = &p.records(1).await[0];
    assert_eq!(r["engine_source"], "llamacpp", "{r}");
    assert!(num(r, "engine_prefill_ms") > 0.0, "{r}");
    assert!(num(r, "engine_decode_ms") > 0.0, "{r}");
    assert!(r["engine_prompt_n"].as_u64().is_some(), "{r}");
    assert!(r["cached_tokens"].as_u64().is_some(), "{r}");
    assert_eq!(r["queue_source"], "derived", "{r}");
    let queue = num(r, "queue_ms");
    let expected = num(r, "ttft_ms") - num(r, "engine_prefill_ms") - num(r, "proxy_ms");
    assert!((queue - expected.max(0.0)).abs() < 0.01, "{r}");
}

/// TGI puts its timing in the response headers of a non-streamed answer.
#[tokio::test]
async fn tgi_timing_headers_are_read() {
    let up = upstream(|_| {
        Script::json(
            200,
            r#"{"generated_text":"hi there","details":{"finish_reason":"length","generated_tokens":2}}"#,
        )
        .header("x-compute-type", "1-nvidia-a10g")
        .header("x-total-time", "1234")
        .header("x-validation-time", "1")
        .header("x-queue-time", "987")
        .header("x-inference-time", "246")
        .header("x-time-per-token", "123")
    })
    .await;
    let p = proxy(up.addr, |_| {}).await;
    send(
        &p.url("/generate"),
        "POST",
        r#"{"inputs":"hi"}"#,
        &[],
        false,
    )
    .await;
    let r = &p.records(1).await[0];
    assert_eq!(r["engine_source"], "tgi", "{r}");
    assert_eq!(num(r, "engine_queue_ms"), 987.0, "{r}");
    assert_eq!(num(r, "engine_inference_ms"), 246.0, "{r}");
    assert_eq!(num(r, "engine_total_ms"), 1234.0, "{r}");
    assert_eq!(num(r, "queue_ms"), 987.0, "{r}");
    assert_eq!(r["queue_source"], "engine", "{r}");
}

/// The engine's state at arrival, from its own `/metrics` (here llama.cpp's real text), sampled
/// once per interval; a request is stamped once a scrape has succeeded.
#[tokio::test]
async fn requests_carry_the_engine_state_at_arrival() {
    let metrics = String::from_utf8(fixture("engine_metrics/llamacpp.txt").to_vec())
        .unwrap()
        .replace(
            "llamacpp:requests_processing 0",
            "llamacpp:requests_processing 2",
        )
        .replace(
            "llamacpp:requests_deferred 0",
            "llamacpp:requests_deferred 5",
        );
    let up = upstream(move |seen| {
        if seen.head.starts_with("GET /metrics") {
            Script {
                status: 200,
                headers: vec![("content-type".into(), "text/plain; version=0.0.4".into())],
                chunked: false,
                steps: vec![common::Step::Write(Bytes::from(metrics.clone())), common::Step::End],
            }
        } else {
            Script::json(200, r#"{"choices":[{"message":{"content":"x"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1}}"#)
        }
    })
    .await;
    let addr = up.addr;
    let p = proxy(addr, move |c| c.engine_metrics = engine_metrics(addr)).await;
    common::eventually("a successful scrape", || {
        p.metrics()
            .contains("tokenmeter_engine_metrics_scrapes_total{result=\"ok\"}")
    })
    .await;
    send(
        &p.url("/v1/chat/completions"),
        "POST",
        &chat_request("m"),
        &[],
        false,
    )
    .await;
    let r = &p.records(1).await[0];
    assert_eq!(r["engine_running"], 2.0, "{r}");
    assert_eq!(r["engine_waiting"], 5.0, "{r}");
    assert!(
        r["engine_kv_usage"].is_null(),
        "llama.cpp exports no KV ratio: {r}"
    );
}

/// An engine without metrics costs nothing but a counted error: requests go on, unstamped.
#[tokio::test]
async fn a_broken_engine_metrics_endpoint_is_only_counted() {
    let up = upstream(|_| Script::json(404, "no such page")).await;
    let addr = up.addr;
    let p = proxy(addr, move |c| c.engine_metrics = engine_metrics(addr)).await;
    common::eventually("a failed scrape counted", || {
        p.metrics()
            .contains("tokenmeter_engine_metrics_scrapes_total{result=\"status\"}")
    })
    .await;
    let got = send(&p.url("/v1/models"), "GET", "", &[], false).await;
    assert_eq!(got.status, 404);
    let r = &p.records(1).await[0];
    assert!(r["engine_running"].is_null(), "{r}");
}
