//! Every captured stream, replayed through the proxy with a delay before each event and random
//! frame splits, yields what `expected.json` says in the per-request record: the first output
//! event (read back from `ttft_ms`), the first content event (`ttfc_ms`), `output_tokens`,
//! `token_source` and `outcome`. Shared captures and this repository's own are both replayed.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;
use serde_json::Value;

/// The spacing between events: event `k` reaches the client `(k - 1) × GAP` after event 1.
/// A reading is off only if scheduling jitter exceeds half of it, so it is generous.
const GAP: Duration = Duration::from_millis(40);

/// The request path each dialect is served on.
fn path_for(dialect: &str) -> &'static str {
    match dialect {
        "openai-chat" => "/v1/chat/completions",
        "openai-completions" => "/v1/completions",
        "openai-responses" => "/v1/responses",
        "anthropic" => "/v1/messages",
        "tgi" => "/generate_stream",
        "ollama" => "/api/generate",
        "ollama-chat" => "/api/chat",
        "llamacpp" => "/completion",
        "sglang" => "/generate",
        other => panic!("no path for dialect {other}"),
    }
}

/// Cuts a captured stream into its events: SSE events end at a blank line (comment-only blocks
/// travel with the next event, as they are not events); NDJSON events are lines.
fn events(data: &[u8], ndjson: bool) -> Vec<Vec<u8>> {
    let mut out: Vec<Vec<u8>> = Vec::new();
    let mut pending: Vec<u8> = Vec::new();
    let mut i = 0;
    let is_event = |block: &[u8]| {
        block
            .split(|&b| b == b'\n' || b == b'\r')
            .any(|line| !line.is_empty() && !line.starts_with(b":"))
    };
    while i < data.len() {
        let end = if ndjson {
            data[i..]
                .iter()
                .position(|&b| b == b'\n')
                .map_or(data.len(), |p| i + p + 1)
        } else {
            ["\r\n\r\n", "\n\n", "\r\r"]
                .iter()
                .filter_map(|sep| {
                    data[i..]
                        .windows(sep.len())
                        .position(|w| w == sep.as_bytes())
                        .map(|p| i + p + sep.len())
                })
                .min()
                .unwrap_or(data.len())
        };
        pending.extend_from_slice(&data[i..end]);
        if ndjson || is_event(&data[i..end]) || end == data.len() {
            out.push(std::mem::take(&mut pending));
        }
        i = end;
    }
    out
}

fn fixture_dirs() -> Vec<PathBuf> {
    vec![
        fixtures_dir(),
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/streams"),
    ]
}

async fn replay(dir: PathBuf, name: String, want: Value, seed: u64) -> Result<(), String> {
    let data = std::fs::read(dir.join(&name)).unwrap();
    let ndjson = name.ends_with(".ndjson");
    let content_type = if ndjson {
        "application/x-ndjson"
    } else {
        "text/event-stream"
    };
    let dialect = want["dialect"].as_str().unwrap();
    let path = want
        .get("path")
        .and_then(Value::as_str)
        .unwrap_or_else(|| path_for(dialect))
        .to_string();
    let mut rng = Rng::new(seed);
    let mut steps = Vec::new();
    for (k, event) in events(&data, ndjson).into_iter().enumerate() {
        steps.push(Step::At(GAP * (k as u32 + 1)));
        steps.extend(split(&event, &mut rng, None).into_iter().map(Step::Write));
    }
    steps.push(Step::End);
    let script = Script {
        status: 200,
        headers: vec![("content-type".into(), content_type.into())],
        chunked: true,
        steps,
    };
    let upstream = upstream(move |_| script.clone()).await;
    let proxy = proxy(upstream.addr, |_| {}).await;
    let got = send(&proxy.url(&path), "POST", &chat_request("m"), &[], false).await;
    let r = &proxy.records(1).await[0];
    let mut problems = Vec::new();
    if got.bytes() != data {
        problems.push("bytes differ".to_string());
    }
    // Event 1 carries the first byte, so an event's number is its distance from the first byte
    // in gaps, plus one; measuring from the first byte cancels how long the replay took to start.
    let first_byte = r["ttfb_ms"].as_f64().unwrap_or(f64::NAN);
    let event_at = |field: &str| {
        r[field]
            .as_f64()
            .map(|ms| ((ms - first_byte) / (GAP.as_secs_f64() * 1e3)).round() as u64 + 1)
    };
    for (field, expected) in [
        ("ttft_ms", "first_output_event"),
        ("ttfc_ms", "first_content_event"),
    ] {
        if event_at(field) != want[expected].as_u64() {
            problems.push(format!(
                "{expected}: want {}, record has {field} {}",
                want[expected], r[field]
            ));
        }
    }
    for field in ["output_tokens", "token_source", "outcome"] {
        if r[field] != want[field] {
            problems.push(format!("{field}: want {}, got {}", want[field], r[field]));
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "{name} (seed {seed}, {path}): {} — record {r}",
            problems.join("; ")
        ))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_capture_reads_as_expected_through_the_proxy() {
    // A few replays at a time: dozens at once on a small machine stall long enough to blur
    // the gaps that encode event numbers.
    let slots = std::sync::Arc::new(tokio::sync::Semaphore::new(4));
    let mut runs = Vec::new();
    for dir in fixture_dirs() {
        let expected: Value = match std::fs::read_to_string(dir.join("expected.json")) {
            Ok(text) => serde_json::from_str(&text).unwrap(),
            Err(_) => continue,
        };
        for (name, want) in expected.as_object().unwrap() {
            for seed in 1..=2 {
                let (slots, dir, name, want) =
                    (slots.clone(), dir.clone(), name.clone(), want.clone());
                runs.push(tokio::spawn(async move {
                    let _slot = slots.acquire_owned().await.expect("semaphore open");
                    replay(dir, name, want, seed).await
                }));
            }
        }
    }
    assert!(runs.len() >= 32, "fixtures missing");
    let mut failures = Vec::new();
    for run in runs {
        if let Err(e) = tokio::time::timeout(Duration::from_secs(120), run)
            .await
            .unwrap()
            .unwrap()
        {
            failures.push(e);
        }
    }
    assert!(
        failures.is_empty(),
        "{} replays disagree with expected.json:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn events_are_cut_where_the_contract_counts_them() {
    let sse = b": ping\r\n\r\ndata: a\r\n\r\nevent: x\ndata: b\n\ndata: c";
    let e = events(sse, false);
    assert_eq!(e.len(), 3);
    assert_eq!(e[0], b": ping\r\n\r\ndata: a\r\n\r\n");
    assert_eq!(e[2], b"data: c");
    assert_eq!(events(b"{}\n{}\n{}", true).len(), 3);
}
