//! Real clients through the proxy: curl (HTTP/1.1 and h2c) and the `openai` Python SDK.
//!
//! These prove what in-process tests cannot: that the clients users run read the proxied stream
//! exactly as they read the server's, and that the proxy's count agrees with the SDK's.

mod common;

use std::process::{Command, Stdio};

use common::*;
use serde_json::Value;

fn curl(args: &[&str]) -> std::process::Output {
    Command::new("curl")
        .args(["-sS", "--max-time", "20"])
        .args(args)
        .output()
        .expect("curl is needed (tests/run.sh installs it)")
}

/// curl, streaming with `-N`, receives the captured stream byte for byte over HTTP/1.1 and h2c.
#[tokio::test(flavor = "multi_thread")]
async fn curl_receives_the_stream_unchanged() {
    let data = std::fs::read(fixtures_dir().join("openai_chat_gpt4o_basic_usage.sse")).unwrap();
    let frames = split(&data, &mut Rng::new(7), None);
    let upstream = upstream(move |_| Script::stream("text/event-stream", frames.clone())).await;
    let proxy = proxy(upstream.addr, |_| {}).await;
    let url = proxy.url("/v1/chat/completions");
    let body = chat_request("gpt-4o");
    for h2 in [None, Some("--http2-prior-knowledge")] {
        let mut args = vec![
            "-N",
            "-H",
            "content-type: application/json",
            "--data",
            &body,
            &url,
        ];
        if let Some(flag) = h2 {
            args.insert(0, flag);
        }
        let owned: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        let out = tokio::task::spawn_blocking(move || {
            curl(&owned.iter().map(String::as_str).collect::<Vec<_>>())
        })
        .await
        .unwrap();
        assert!(
            out.status.success(),
            "{h2:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.stdout == data, "{h2:?}: curl received different bytes");
    }
    for r in proxy.records(2).await {
        assert_eq!(r["outcome"], "ok");
        assert_eq!(r["output_tokens"], 30);
        assert_eq!(r["model"], "gpt-4o");
    }
}

/// curl sees the proxy's own answer when the upstream is down: a 502 with a JSON reason.
#[tokio::test(flavor = "multi_thread")]
async fn curl_sees_a_clear_502() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let proxy = proxy(closed, |_| {}).await;
    let url = proxy.url("/v1/chat/completions");
    let out =
        tokio::task::spawn_blocking(move || curl(&["-w", "\n%{http_code}", "--data", "{}", &url]))
            .await
            .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap();
    assert_eq!(code, "502");
    let body: Value = serde_json::from_str(body).unwrap();
    assert_eq!(body["error"]["type"], "upstream_unreachable");
}

const OPENAI_CLIENT: &str = r#"
import json, sys
from openai import OpenAI
client = OpenAI(base_url=sys.argv[1], api_key="test", max_retries=0)
stream = client.chat.completions.create(
    model="gpt-4o",
    messages=[{"role": "user", "content": "Say something"}],
    stream=True,
    stream_options={"include_usage": True},
)
text, usage, chunks = "", None, 0
for chunk in stream:
    chunks += 1
    for choice in chunk.choices:
        text += choice.delta.content or ""
    if chunk.usage is not None:
        usage = chunk.usage.completion_tokens
print(json.dumps({"text": text, "usage": usage, "chunks": chunks}))
"#;

/// The openai SDK streams through the proxy as it would from the server: same text, same
/// usage, and the proxy's record counts what the SDK counts.
#[tokio::test(flavor = "multi_thread")]
async fn the_openai_sdk_reads_the_proxied_stream_and_agrees_on_tokens() {
    let data = std::fs::read(fixtures_dir().join("openai_chat_gpt4o_basic_usage.sse")).unwrap();
    // The text the server sent, from the capture itself.
    let expected_text: String = String::from_utf8_lossy(&data)
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter_map(|v| {
            v["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_owned)
        })
        .collect();
    let frames = split(&data, &mut Rng::new(11), None);
    let mut upstream = upstream(move |_| Script::stream("text/event-stream", frames.clone())).await;
    let proxy = proxy(upstream.addr, |_| {}).await;
    let base = proxy.url("/v1");
    let out = tokio::task::spawn_blocking(move || {
        Command::new("python3")
            .args(["-c", OPENAI_CLIENT, &base])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .output()
            .expect("python3 is needed (tests/run.sh installs the openai package)")
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "the openai SDK failed (is `pip install openai` done? tests/run.sh does it): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let said: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(said["text"], expected_text.as_str());
    assert_eq!(said["usage"], 30);
    let seen = upstream.seen.recv().await.unwrap();
    assert!(
        seen.head.starts_with("POST /v1/chat/completions HTTP/1.1"),
        "{}",
        seen.head
    );
    let r = &proxy.records(1).await[0];
    assert_eq!(r["outcome"], "ok");
    assert_eq!(r["output_tokens"], said["usage"]);
    assert_eq!(r["model"], "gpt-4o");
    assert_eq!(r["token_source"], "usage");
}
