//! `tokenmeter sim`: vLLM's exact output shape, continuous-batching timing on paused time,
//! every fault flag, a departed client freeing its slot, and the proxy reading the sim's usage.

mod common;

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::{json, Value};
use tokio::time::Instant;

use tokenmeter::tools::sim::engine::{self, Event, Job, Timing};
use tokenmeter::tools::sim::{self, RunningSim, SimConfig};

/// A sim on port 0 with fast timings, changed by `tweak`.
async fn start(tweak: impl FnOnce(&mut SimConfig)) -> RunningSim {
    let mut config = SimConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        prefill_base: Duration::from_millis(1),
        prefill_per_token: Duration::ZERO,
        decode_step: Duration::from_millis(1),
        decode_step_per_request: Duration::ZERO,
        ..SimConfig::default()
    };
    tweak(&mut config);
    sim::start(config).await.unwrap()
}

fn url(sim: &RunningSim, path: &str) -> String {
    format!("http://{}{}", sim.addr, path)
}

/// The `data:` payloads of an SSE body, in order.
fn events(body: &[u8]) -> Vec<String> {
    String::from_utf8(body.to_vec())
        .unwrap()
        .split("\n\n")
        .filter(|e| !e.is_empty())
        .map(|e| {
            e.strip_prefix("data: ")
                .expect("every event is data")
                .to_string()
        })
        .collect()
}

fn parse(event: &str) -> Value {
    serde_json::from_str(event).unwrap_or_else(|e| panic!("{e}: {event}"))
}

/// "hello world" is 11 bytes: ceil(11 / 4) = 3 prompt tokens.
const PROMPT_TOKENS: u64 = 3;

fn chat(extra: Value) -> String {
    let mut body =
        json!({"model": "sim-llama", "messages": [{"role": "user", "content": "hello world"}]});
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body.to_string()
}

async fn post(sim: &RunningSim, path: &str, body: &str) -> common::Received {
    common::send(
        &url(sim, path),
        "POST",
        body,
        &[("content-type", "application/json")],
        false,
    )
    .await
}

#[tokio::test]
async fn streamed_chat_has_vllms_exact_shape() {
    let sim = start(|_| {}).await;
    let r = post(
        &sim,
        "/v1/chat/completions",
        &chat(json!({"stream": true, "max_tokens": 5, "stream_options": {"include_usage": true}})),
    )
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.headers["content-type"], "text/event-stream");
    assert!(r.body_error.is_none());
    let events = events(&r.bytes());
    assert_eq!(events.len(), 1 + 5 + 1 + 1 + 1, "{events:?}");
    assert_eq!(events.last().unwrap(), "[DONE]");
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| parse(e))
        .collect();
    let id = chunks[0]["id"].as_str().unwrap();
    assert!(id.starts_with("chatcmpl-"), "{id}");
    for chunk in &chunks {
        assert_eq!(chunk["id"], id);
        assert_eq!(chunk["object"], "chat.completion.chunk");
        assert_eq!(chunk["model"], "sim-llama");
        assert!(chunk["created"].is_u64());
    }
    // The role chunk, exactly as vLLM writes it (keys in vLLM's order too).
    assert!(
        events[0].starts_with(r#"{"id":"chatcmpl-"#),
        "{}",
        events[0]
    );
    assert!(
        events[0].ends_with(r#""model":"sim-llama","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}"#),
        "{}",
        events[0]
    );
    let mut text = String::new();
    for chunk in &chunks[1..6] {
        let choice = &chunk["choices"][0];
        assert_eq!(choice["finish_reason"], Value::Null);
        assert_eq!(choice["delta"].as_object().unwrap().len(), 1, "{chunk}");
        text.push_str(choice["delta"]["content"].as_str().unwrap());
    }
    assert_eq!(text, " lorem ipsum dolor sit amet");
    assert_eq!(chunks[6]["choices"][0]["delta"], json!({}));
    assert_eq!(chunks[6]["choices"][0]["finish_reason"], "length");
    assert_eq!(chunks[7]["choices"], json!([]));
    assert_eq!(
        chunks[7]["usage"],
        json!({"prompt_tokens": PROMPT_TOKENS, "completion_tokens": 5, "total_tokens": PROMPT_TOKENS + 5})
    );
}

#[tokio::test]
async fn without_max_tokens_the_default_applies_and_ends_with_stop() {
    let sim = start(|c| c.default_max_tokens = 3).await;
    let r = post(&sim, "/v1/chat/completions", &chat(json!({"stream": true}))).await;
    let events = events(&r.bytes());
    // No usage chunk without include_usage.
    assert_eq!(events.len(), 1 + 3 + 1 + 1, "{events:?}");
    assert_eq!(parse(&events[4])["choices"][0]["finish_reason"], "stop");
}

#[tokio::test]
async fn non_streamed_chat_and_completions_carry_text_and_usage() {
    let sim = start(|_| {}).await;
    let r = post(
        &sim,
        "/v1/chat/completions",
        &chat(json!({"max_tokens": 2})),
    )
    .await;
    assert_eq!(r.status, 200);
    let v: Value = serde_json::from_slice(&r.bytes()).unwrap();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(
        v["choices"][0]["message"],
        json!({"role": "assistant", "content": " lorem ipsum"})
    );
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(
        v["usage"],
        json!({"prompt_tokens": PROMPT_TOKENS, "completion_tokens": 2, "total_tokens": PROMPT_TOKENS + 2})
    );

    let body = json!({"model": "m", "prompt": "hello world", "max_tokens": 3}).to_string();
    let r = post(&sim, "/v1/completions", &body).await;
    let v: Value = serde_json::from_slice(&r.bytes()).unwrap();
    assert_eq!(v["object"], "text_completion");
    assert!(v["id"].as_str().unwrap().starts_with("cmpl-"));
    assert_eq!(v["choices"][0]["text"], " lorem ipsum dolor");
    assert_eq!(v["usage"]["completion_tokens"], 3);
    assert_eq!(v["usage"]["prompt_tokens"], PROMPT_TOKENS);

    let body = json!({"prompt": "hello world", "max_tokens": 3, "stream": true,
        "stream_options": {"include_usage": true}})
    .to_string();
    let r = post(&sim, "/v1/completions", &body).await;
    let events = events(&r.bytes());
    // No role chunk for completions: 3 texts, the finish, the usage, [DONE].
    assert_eq!(events.len(), 3 + 1 + 1 + 1, "{events:?}");
    let text: String = events[..3]
        .iter()
        .map(|e| {
            let c = parse(e);
            assert_eq!(c["object"], "text_completion");
            assert_eq!(c["choices"][0]["finish_reason"], Value::Null);
            c["choices"][0]["text"].as_str().unwrap().to_string()
        })
        .collect();
    assert_eq!(text, " lorem ipsum dolor");
    let finish = parse(&events[3]);
    assert_eq!(finish["choices"][0]["text"], "");
    assert_eq!(finish["choices"][0]["finish_reason"], "length");
    assert_eq!(
        parse(&events[4])["usage"]["total_tokens"],
        PROMPT_TOKENS + 3
    );
    assert_eq!(events[5], "[DONE]");
}

#[tokio::test]
async fn models_health_and_unknown_paths() {
    let sim = start(|c| c.model = "tiny".into()).await;
    let r = common::send(&url(&sim, "/v1/models"), "GET", "", &[], false).await;
    assert_eq!(r.status, 200);
    let v: Value = serde_json::from_slice(&r.bytes()).unwrap();
    assert_eq!(v["object"], "list");
    assert_eq!(v["data"][0]["id"], "tiny");
    assert_eq!(v["data"][0]["object"], "model");
    let r = common::send(&url(&sim, "/health"), "GET", "", &[], false).await;
    assert_eq!(r.status, 200);
    let r = common::send(&url(&sim, "/v2/nothing"), "GET", "", &[], false).await;
    assert_eq!(r.status, 404);
    let v: Value = serde_json::from_slice(&r.bytes()).unwrap();
    assert_eq!(v["error"]["code"], 404);
    let r = post(&sim, "/v1/chat/completions", "not json").await;
    assert_eq!(r.status, 400);
}

/// The engine's timing parameters for the batching tests: prefill of a 20-token prompt is
/// 5 ms + 20 × 50 µs = 6 ms; a step of b requests is 10 ms + b × 2 ms.
fn timing(max_batch: usize) -> Timing {
    Timing {
        max_batch,
        prefill_base: Duration::from_millis(5),
        prefill_per_token: Duration::from_micros(50),
        decode_step: Duration::from_millis(10),
        decode_step_per_request: Duration::from_millis(2),
        stall: Duration::from_secs(1),
    }
}

/// Submits every job before the scheduler runs (so they all wait in the queue at t = 0) and
/// returns, per job, the milliseconds at which each token arrived.
async fn run_jobs(timing: Timing, jobs: usize, max_tokens: u32) -> Vec<Vec<u64>> {
    let t0 = Instant::now();
    let (queue, _engine) = engine::spawn(timing);
    let mut readers = Vec::new();
    for _ in 0..jobs {
        let (job, mut events) = Job::new(20, max_tokens, None);
        queue.try_send(job).unwrap();
        readers.push(tokio::spawn(async move {
            let mut times = Vec::new();
            while let Some(event) = events.recv().await {
                match event {
                    Event::Token(_) => times.push((Instant::now() - t0).as_millis() as u64),
                    Event::Done => break,
                    other => panic!("unexpected {other:?}"),
                }
            }
            times
        }));
    }
    let mut out = Vec::new();
    for reader in readers {
        out.push(reader.await.unwrap());
    }
    out
}

#[tokio::test(start_paused = true)]
async fn a_lone_request_pays_prefill_then_one_step_per_token() {
    // TTFT = prefill 6 + step(1) 12 = 18; then TPOT = step(1) = 12.
    assert_eq!(run_jobs(timing(2), 1, 3).await, vec![vec![18, 30, 42]]);
}

#[tokio::test(start_paused = true)]
async fn past_max_batch_requests_queue_and_tpot_grows_with_the_batch() {
    let times = run_jobs(timing(2), 4, 3).await;
    // The first two are admitted together: 2 × prefill 6 + step(2) 14 = 26; then 14 apart,
    // which is the lone TPOT (12) plus decode_step_per_request.
    assert_eq!(times[0], vec![26, 40, 54]);
    assert_eq!(times[1], vec![26, 40, 54]);
    // The other two wait for both slots to free at 54, then pay the same: TTFT 80 ≥ 54.
    assert_eq!(times[2], vec![80, 94, 108]);
    assert_eq!(times[3], vec![80, 94, 108]);
}

#[tokio::test]
async fn fail_rate_answers_with_the_fail_status_at_once() {
    let sim = start(|c| {
        c.fail_rate = 1.0;
        c.fail_status = 429;
    })
    .await;
    let r = post(&sim, "/v1/chat/completions", &chat(json!({"stream": true}))).await;
    assert_eq!(r.status, 429);
    let v: Value = serde_json::from_slice(&r.bytes()).unwrap();
    assert_eq!(v["error"]["code"], 429);
    assert_eq!(v["error"]["type"], "RateLimitError");
}

#[tokio::test]
async fn midstream_fail_rate_ends_the_stream_with_an_error_event() {
    let sim = start(|c| c.midstream_fail_rate = 1.0).await;
    let r = post(
        &sim,
        "/v1/chat/completions",
        &chat(json!({"stream": true, "max_tokens": 4})),
    )
    .await;
    assert_eq!(r.status, 200);
    assert!(r.body_error.is_none());
    let events = events(&r.bytes());
    // Role, half of the tokens, the error, [DONE]; no finish chunk.
    assert_eq!(events.len(), 1 + 2 + 1 + 1, "{events:?}");
    assert_eq!(parse(&events[3])["error"]["code"], 500);
    assert_eq!(events[4], "[DONE]");

    let r = post(
        &sim,
        "/v1/chat/completions",
        &chat(json!({"max_tokens": 4})),
    )
    .await;
    assert_eq!(r.status, 500, "not streamed: the error is the whole answer");
}

#[tokio::test]
async fn drop_rate_cuts_the_body_without_its_end() {
    let sim = start(|c| c.drop_rate = 1.0).await;
    let r = post(
        &sim,
        "/v1/chat/completions",
        &chat(json!({"stream": true, "max_tokens": 4})),
    )
    .await;
    assert_eq!(r.status, 200);
    assert!(r.body_error.is_some(), "the client must see a broken body");
    let events = events(&r.bytes());
    assert!(!events.iter().any(|e| e == "[DONE]"), "{events:?}");
    assert!(
        events.len() <= 3,
        "at most role + half the tokens: {events:?}"
    );
}

#[tokio::test]
async fn stall_rate_pauses_the_stream_once_for_the_stall_time() {
    let stall = Duration::from_millis(300);
    let sim = start(|c| {
        c.stall_rate = 1.0;
        c.stall = stall;
    })
    .await;
    let r = post(
        &sim,
        "/v1/chat/completions",
        &chat(json!({"stream": true, "max_tokens": 4})),
    )
    .await;
    assert!(r.body_error.is_none());
    // Arrival time of each content chunk (role chunk first, then 4 tokens).
    let mut times = Vec::new();
    for (at, bytes) in &r.frames {
        for e in events(bytes) {
            if e != "[DONE]"
                && parse(&e)["choices"][0]["delta"]["content"]
                    .as_str()
                    .is_some_and(|c| !c.is_empty())
            {
                times.push(*at);
            }
        }
    }
    assert_eq!(times.len(), 4);
    // The pause comes after half of the tokens, once.
    assert!(times[2] - times[1] >= stall, "{:?}", times[2] - times[1]);
    assert!(times[1] - times[0] < stall);
    assert!(times[3] - times[2] < stall);
}

/// Opens a streamed chat and returns its body, unread.
async fn open_stream(sim: &RunningSim, max_tokens: u32) -> hyper::body::Incoming {
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let request = http::Request::post(url(sim, "/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(chat(
            json!({"stream": true, "max_tokens": max_tokens}),
        ))))
        .unwrap();
    let response = client.request(request).await.unwrap();
    assert_eq!(response.status(), 200);
    response.into_body()
}

#[tokio::test]
async fn a_client_that_goes_away_frees_its_slot_at_once() {
    // A departed client must never keep its slot until its full length is generated.
    let sim = start(|c| {
        c.max_batch = 1;
        c.decode_step = Duration::from_millis(10);
    })
    .await;
    let mut first = open_stream(&sim, 10_000).await;
    let mut seen = Vec::new();
    while events(&seen).len() < 3 {
        let frame = first.frame().await.unwrap().unwrap();
        seen.extend_from_slice(&frame.into_data().unwrap());
    }
    drop(first);
    let sent = Instant::now();
    let mut second = open_stream(&sim, 2).await;
    let mut ttft = None;
    let mut all = Vec::new();
    while let Some(frame) = second.frame().await {
        all.extend_from_slice(&frame.unwrap().into_data().unwrap());
        if ttft.is_none() && events(&all).len() >= 2 {
            ttft = Some(sent.elapsed());
        }
    }
    // The first request had 100 s of tokens left; the second starts within a few steps.
    let ttft = ttft.unwrap();
    assert!(ttft < Duration::from_secs(2), "{ttft:?}");
    assert_eq!(events(&all).last().unwrap(), "[DONE]");
}

#[tokio::test]
async fn the_proxy_records_the_sims_usage() {
    let sim = start(|_| {}).await;
    let proxy = common::proxy(sim.addr, |_| {}).await;
    let r = common::send(
        &proxy.url("/v1/chat/completions"),
        "POST",
        &chat(json!({"stream": true, "max_tokens": 6, "stream_options": {"include_usage": true}})),
        &[("content-type", "application/json")],
        false,
    )
    .await;
    assert_eq!(r.status, 200);
    let records = proxy.records(1).await;
    let record = &records[0];
    assert_eq!(record["status"], 200, "{record}");
    assert_eq!(record["prompt_tokens"], PROMPT_TOKENS, "{record}");
    assert_eq!(record["output_tokens"], 6, "{record}");
    assert_eq!(record["finish_reason"], "length", "{record}");
}

/// Sends a streamed chat and returns (TTFT, end, gaps between tokens), measured from `t0`.
async fn timed_chat(
    sim_url: String,
    t0: Instant,
    max_tokens: u32,
) -> (Duration, Duration, Vec<Duration>) {
    let r = common::send(
        &sim_url,
        "POST",
        &chat(json!({"stream": true, "max_tokens": max_tokens})),
        &[("content-type", "application/json")],
        false,
    )
    .await;
    let mut tokens = Vec::new();
    for (at, bytes) in &r.frames {
        for e in events(bytes) {
            if e != "[DONE]"
                && parse(&e)["choices"][0]["delta"]["content"]
                    .as_str()
                    .is_some_and(|c| !c.is_empty())
            {
                tokens.push(*at - t0);
            }
        }
    }
    assert_eq!(tokens.len(), max_tokens as usize);
    let end = r.frames.last().unwrap().0 - t0;
    let gaps = tokens.windows(2).map(|w| w[1] - w[0]).collect();
    (tokens[0], end, gaps)
}

#[tokio::test(start_paused = true)]
async fn over_http_on_paused_time_a_lone_request_is_timed_exactly() {
    let sim = sim::start(SimConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        ..SimConfig::default()
    })
    .await
    .unwrap();
    let (ttft, _, gaps) = timed_chat(url(&sim, "/v1/chat/completions"), Instant::now(), 4).await;
    // Defaults: prefill 5 ms + 3 × 50 µs, plus one step of one request, 10 + 2 ms: 17.15 ms,
    // which tokio's timer (1 ms resolution) rounds up.
    assert_eq!(ttft, Duration::from_millis(18));
    assert_eq!(gaps, vec![Duration::from_millis(12); 3]);
}

#[tokio::test(start_paused = true)]
async fn over_http_on_paused_time_requests_past_max_batch_wait_for_a_slot() {
    let sim = sim::start(SimConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        max_batch: 2,
        ..SimConfig::default()
    })
    .await
    .unwrap();
    let t0 = Instant::now();
    let clients: Vec<_> = (0..4)
        .map(|_| tokio::spawn(timed_chat(url(&sim, "/v1/chat/completions"), t0, 8)))
        .collect();
    let mut results = Vec::new();
    for c in clients {
        results.push(c.await.unwrap());
    }
    results.sort();
    let (first_end, second_end) = (
        results[0].1.min(results[1].1),
        results[0].1.max(results[1].1),
    );
    // Two slots: the third starts only once one of the first two has ended, the fourth once both.
    assert!(results[2].0 > first_end, "{results:?}");
    assert!(results[3].0 > second_end, "{results:?}");
    // While two run, a token takes the lone step (12 ms) plus decode_step_per_request.
    assert!(
        results[0].2.contains(&Duration::from_millis(14)),
        "{results:?}"
    );
    assert!(results
        .iter()
        .flat_map(|r| &r.2)
        .all(|g| *g >= Duration::from_millis(12)));
}

#[tokio::test(start_paused = true)]
async fn an_extra_delay_set_while_running_adds_to_ttft_until_cleared() {
    let sim = sim::start(SimConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        ..SimConfig::default()
    })
    .await
    .unwrap();
    let chat_url = url(&sim, "/v1/chat/completions");
    sim.set_extra_delay(Duration::from_millis(250));
    let (ttft, _, gaps) = timed_chat(chat_url.clone(), Instant::now(), 3).await;
    // The lone request's 18 ms (see above) plus the delay; decoding is untouched.
    assert_eq!(ttft, Duration::from_millis(268));
    assert_eq!(gaps, vec![Duration::from_millis(12); 2]);
    sim.set_extra_delay(Duration::ZERO);
    let (ttft, _, _) = timed_chat(chat_url, Instant::now(), 3).await;
    assert_eq!(ttft, Duration::from_millis(18));
}
