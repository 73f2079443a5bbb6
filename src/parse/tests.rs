//! Tests of the whole reader: the captured fixtures replayed under every kind of frame split,
//! with the dialect from the path and from sniffing, non-streaming bodies of every dialect, and
//! properties that must hold for any bytes at all.
//!
//! The framers' own rules are tested beside them (`sse.rs`, `ndjson.rs`), with the [`Recorder`]
//! sink defined here; each dialect's rules beside it, in `dialect/`.

use std::path::PathBuf;
use std::time::Duration;

use proptest::prelude::*;

use super::event::EventSink;
use super::report::Engine;
use super::*;

/// The captured streams and their expected readings, shared with the rest of the project.
fn fixtures_dir() -> PathBuf {
    PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../shared/fixtures/streams"
    ))
}

/// This repository's own streams, written from the servers' documented formats.
fn own_fixtures_dir() -> PathBuf {
    PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/streams"
    ))
}

/// Engines' `/metrics` text, each file saying in its first line where it came from.
fn engine_metrics_dir() -> PathBuf {
    PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/engine_metrics"
    ))
}

/// An event as a framer handed it over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Ev {
    Event { kind: Vec<u8>, data: Vec<u8> },
    Oversized,
}

/// A sink that keeps what it was handed, to compare framers with a reference.
#[derive(Debug, Default)]
pub(super) struct Recorder {
    pub(super) events: Vec<Ev>,
}

impl EventSink for Recorder {
    fn event(&mut self, event_type: &[u8], data: &[u8]) {
        self.events.push(Ev::Event {
            kind: event_type.to_vec(),
            data: data.to_vec(),
        });
    }

    fn oversized(&mut self) {
        self.events.push(Ev::Oversized);
    }
}

/// Cuts `bytes` at the given points (in any order, out of range ignored) into frames.
pub(super) fn split_at_points<'a>(bytes: &'a [u8], points: &[usize]) -> Vec<&'a [u8]> {
    let mut cuts: Vec<usize> = points
        .iter()
        .copied()
        .filter(|&p| p > 0 && p < bytes.len())
        .collect();
    cuts.sort_unstable();
    cuts.dedup();
    let mut frames = Vec::with_capacity(cuts.len() + 1);
    let mut start = 0;
    for cut in cuts {
        frames.push(&bytes[start..cut]);
        start = cut;
    }
    frames.push(&bytes[start..]);
    frames
}

/// A small seeded generator, so a failing split can be replayed from its seed.
pub(super) struct XorShift(u64);

impl XorShift {
    pub(super) fn new(seed: u64) -> Self {
        XorShift(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub(super) fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    /// Random cut points for `len` bytes: few and long frames for some seeds, many and short for
    /// others.
    pub(super) fn cuts(&mut self, len: usize) -> Vec<usize> {
        if len == 0 {
            return Vec::new();
        }
        let density = 1 + self.next() % 64;
        let count = (len as u64 * density / 256) as usize + (self.next() % 4) as usize;
        (0..count)
            .map(|_| (self.next() % len as u64) as usize)
            .collect()
    }
}

/// What reading a body gave: the summary, the dialect read, whether an end marker was
/// expected, and what the frames said in total.
#[derive(Debug, Clone, PartialEq)]
struct Read {
    summary: StreamSummary,
    dialect: Dialect,
    expects_end_marker: bool,
    outputs: u64,
    content: bool,
    tokens: u64,
}

/// Feeds the frames, then finishes. Checks after every frame that the buffers stay within their
/// bound.
fn read(framing: Framing, dialect: Dialect, max: usize, frames: &[&[u8]]) -> Read {
    let mut reader = StreamReader::new(framing, dialect, max);
    let (mut outputs, mut content, mut tokens) = (0u64, false, 0u64);
    let mut add = |got: FrameEvents| {
        assert!(got.tokens >= got.output_events, "{got:?}");
        outputs += u64::from(got.output_events);
        content |= got.content;
        tokens += u64::from(got.tokens);
    };
    for frame in frames {
        add(reader.feed(frame));
        assert!(reader.buffered_capacity() <= max.saturating_add(MAX_EVENT_TYPE_BYTES));
    }
    add(reader.finish());
    Read {
        summary: reader.summary().clone(),
        dialect: reader.dialect(),
        expects_end_marker: reader.expects_end_marker(),
        outputs,
        content,
        tokens,
    }
}

/// The request path each dialect is served on, as the proxy would see it.
fn path_for(dialect: &str) -> &'static str {
    match dialect {
        "openai-chat" => "/v1/chat/completions",
        "openai-completions" => "/v1/completions",
        "openai-responses" => "/v1/responses",
        "anthropic" => "/v1/messages",
        "tgi" => "/generate_stream",
        "ollama" => "/api/generate",
        "llamacpp" => "/completion",
        "sglang" => "/generate",
        other => panic!("no path for dialect {other}"),
    }
}

fn content_type_of_file(name: &str) -> &'static str {
    if name.ends_with(".ndjson") {
        "application/x-ndjson"
    } else {
        "text/event-stream"
    }
}

/// How many events a captured stream holds: one per `data` line for SSE (every fixture's events
/// have one), one per non-blank line for NDJSON.
fn events_in(name: &str, bytes: &[u8]) -> u64 {
    let lines = bytes.split(|&b| b == b'\n');
    if name.ends_with(".ndjson") {
        lines.filter(|l| !l.trim_ascii().is_empty()).count() as u64
    } else {
        lines.filter(|l| l.starts_with(b"data")).count() as u64
    }
}

/// The outcome the recorder gives a 200 response that ended cleanly, from what the reader says.
fn outcome(r: &Read) -> &'static str {
    if r.summary.error || (r.expects_end_marker && !r.summary.end_marker) {
        "error"
    } else {
        "ok"
    }
}

/// Checks one reading of a fixture against its `expected.json` entry.
fn check_fixture(ctx: &str, want: &serde_json::Value, expected_events: u64, r: &Read) {
    let s = &r.summary;
    let dialect: Dialect = want["dialect"]
        .as_str()
        .and_then(|d| d.parse().ok())
        .expect("expected.json names a dialect");
    assert_eq!(r.dialect, dialect, "{ctx}: dialect");
    assert!(r.expects_end_marker, "{ctx}: a stream of a known dialect");
    assert_eq!(
        s.first_output_event,
        want["first_output_event"].as_u64(),
        "{ctx}: first output event"
    );
    assert_eq!(
        s.first_content_event,
        want["first_content_event"].as_u64(),
        "{ctx}: first content event"
    );
    assert_eq!(
        Some(s.output_events),
        want["output_events"].as_u64(),
        "{ctx}: output events"
    );
    assert_eq!(
        s.usage_output_tokens,
        want["usage_output_tokens"].as_u64(),
        "{ctx}: usage output tokens"
    );
    let tokens = s.usage_output_tokens.unwrap_or(s.output_events);
    assert_eq!(
        Some(tokens),
        want["output_tokens"].as_u64(),
        "{ctx}: tokens"
    );
    let source = if s.usage_output_tokens.is_some() {
        "usage"
    } else {
        "events"
    };
    assert_eq!(want["token_source"], source, "{ctx}: token source");
    assert_eq!(want["outcome"], outcome(r), "{ctx}: outcome");
    // Optional facts, given by this repository's own fixtures.
    if let Some(reason) = want.get("finish_reason") {
        assert_eq!(
            reason.as_str(),
            s.finish_reason.map(FinishReason::as_str),
            "{ctx}: finish reason"
        );
    }
    if let Some(prompt) = want.get("prompt_tokens") {
        assert_eq!(
            prompt.as_u64(),
            s.usage_prompt_tokens,
            "{ctx}: prompt tokens"
        );
    }
    if let Some(most) = want.get("max_tokens_per_event") {
        assert_eq!(
            most.as_u64(),
            s.max_tokens_per_event,
            "{ctx}: tokens per event"
        );
    }
    assert_eq!(s.events, expected_events, "{ctx}: events");
    assert_eq!(s.oversized_events, 0, "{ctx}");
    assert_eq!(r.outputs, s.output_events, "{ctx}: frames add up");
    assert_eq!(
        r.content,
        s.first_content_event.is_some(),
        "{ctx}: some frame said content"
    );
}

/// Every fixture, shared and our own, reads as its `expected.json` says — with the dialect the
/// path gives and, separately, with the dialect sniffed from an unknown path — as one frame, one
/// byte per frame and under many random splits; every reading of a file is the same.
#[test]
fn fixtures_read_as_expected_under_every_split() {
    let mut checked = 0;
    for dir in [fixtures_dir(), own_fixtures_dir()] {
        let expected: serde_json::Value = serde_json::from_slice(
            &std::fs::read(dir.join("expected.json")).expect("expected.json is readable"),
        )
        .expect("expected.json is JSON");
        let expected = expected.as_object().expect("expected.json is an object");
        for (name, want) in expected {
            let bytes = std::fs::read(dir.join(name)).expect("fixture is readable");
            let dialect_name = want["dialect"].as_str().expect("a dialect name");
            let path = want
                .get("path")
                .and_then(|p| p.as_str())
                .unwrap_or_else(|| path_for(dialect_name));
            let content_type = Some(content_type_of_file(name));
            let events = events_in(name, &bytes);
            for (how, path) in [("path", path), ("sniffed", "/unknown")] {
                let (framing, dialect) = detect(path, content_type, None, None);
                if how == "sniffed" {
                    assert_eq!(dialect, Dialect::Auto, "{name}: an unknown path sniffs");
                }
                let whole = read(framing, dialect, 1 << 20, &[&bytes]);
                check_fixture(&format!("{name} ({how}, one frame)"), want, events, &whole);

                let bytewise: Vec<&[u8]> = bytes.chunks(1).collect();
                let by_byte = read(framing, dialect, 1 << 20, &bytewise);
                check_fixture(&format!("{name} ({how}, bytewise)"), want, events, &by_byte);
                assert_eq!(by_byte, whole, "{name} ({how}): byte-wise reading");

                for seed in 0..200 {
                    let cuts = XorShift::new(seed).cuts(bytes.len());
                    let frames = split_at_points(&bytes, &cuts);
                    let split = read(framing, dialect, 1 << 20, &frames);
                    assert_eq!(split, whole, "{name} ({how}): seed {seed}");
                }
            }
            checked += 1;
        }
    }
    assert!(checked >= 25, "only {checked} fixtures were checked");
}

/// Fixtures that carry a finish reason report the right one.
#[test]
fn fixture_finish_reasons() {
    let cases = [
        ("openai_chat_gpt4o_basic_usage.sse", FinishReason::Stop),
        ("openai_chat_gpt4o_max_tokens_1.sse", FinishReason::Length),
        (
            "openai_chat_gpt4o_parallel_tool_calls.sse",
            FinishReason::ToolCalls,
        ),
        ("cerebras_chat_no_done.sse", FinishReason::Length),
        ("openai_completions_babbage_usage.sse", FinishReason::Length),
        ("anthropic_messages_basic.sse", FinishReason::Stop),
        ("anthropic_messages_tool_use.sse", FinishReason::ToolCalls),
        ("openai_responses_two_messages.sse", FinishReason::Stop),
        (
            "openai_responses_error_then_failed.sse",
            FinishReason::Error,
        ),
        ("ollama_generate_stream.ndjson", FinishReason::Stop),
        (
            "ollama_generate_error_midstream.ndjson",
            FinishReason::Error,
        ),
        (
            "tgi_generate_stream_flant5_nospace.sse",
            FinishReason::Length,
        ),
    ];
    for (name, reason) in cases {
        let bytes = std::fs::read(fixtures_dir().join(name)).expect("fixture is readable");
        let framing = if name.ends_with(".ndjson") {
            Framing::Ndjson
        } else {
            Framing::Sse
        };
        let r = read(framing, Dialect::Auto, 1 << 20, &[&bytes]);
        assert_eq!(r.summary.finish_reason, Some(reason), "{name}");
    }
}

/// What each captured stream says beyond its output, read with the dialect its path gives:
/// cached and reasoning tokens and the engine's own timing, exactly as the stream reported them,
/// and nothing for streams that report none. (That a split or a sniffed dialect reads the same
/// is `fixtures_read_as_expected_under_every_split`'s business: the summary holds the report.)
#[test]
fn fixture_engine_reports() {
    let none = EngineReport::default();
    let ms = |micros: u64| Some(Duration::from_micros(micros));
    let ns = |nanos: u64| Some(Duration::from_nanos(nanos));
    let llamacpp =
        |cached: Option<u64>, prompt_n: u64, prefill_us: u64, decode_us: u64| EngineReport {
            cached_tokens: cached,
            prompt_processed: Some(prompt_n),
            prefill: ms(prefill_us),
            decode: ms(decode_us),
            source: Some(Engine::LlamaCpp),
            ..none
        };
    let cases: Vec<(PathBuf, &str, EngineReport)> = vec![
        // The shared captures.
        (fixtures_dir(), "anthropic_messages_basic.sse", none),
        (
            fixtures_dir(),
            "anthropic_messages_tool_use.sse",
            EngineReport {
                cached_tokens: Some(0),
                cache_creation_tokens: Some(0),
                ..none
            },
        ),
        // Cerebras' `time_info` is not read (see `dialect/openai.rs`).
        (fixtures_dir(), "cerebras_chat_no_done.sse", none),
        (fixtures_dir(), "ollama_generate_stream.ndjson", none),
        (
            fixtures_dir(),
            "openai_chat_gpt4o_basic_usage.sse",
            EngineReport {
                reasoning_tokens: Some(0),
                ..none
            },
        ),
        (fixtures_dir(), "openai_completions_babbage_usage.sse", none),
        (
            fixtures_dir(),
            "openai_responses_two_messages.sse",
            EngineReport {
                cached_tokens: Some(3072),
                reasoning_tokens: Some(64),
                ..none
            },
        ),
        (
            fixtures_dir(),
            "tgi_generate_stream_flant5_nospace.sse",
            none,
        ),
        (fixtures_dir(), "together_chat_text_and_delta.sse", none),
        // This repository's own.
        (
            own_fixtures_dir(),
            "anthropic_messages_prompt_cache.sse",
            EngineReport {
                cached_tokens: Some(3180),
                cache_creation_tokens: Some(412),
                ..none
            },
        ),
        (
            own_fixtures_dir(),
            "llamacpp_completion_stream.sse",
            llamacpp(None, 9, 48_312, 201_500),
        ),
        (
            own_fixtures_dir(),
            "llamacpp_real_chat_stream.sse",
            llamacpp(Some(26), 1, 5_883, 47_850),
        ),
        (
            own_fixtures_dir(),
            "llamacpp_real_chat_stream_usage.sse",
            llamacpp(Some(0), 27, 9_848, 59_046),
        ),
        (
            own_fixtures_dir(),
            "llamacpp_real_completions_stream_usage.sse",
            llamacpp(Some(0), 4, 7_258, 58_905),
        ),
        (
            own_fixtures_dir(),
            "llamacpp_real_native_completion_stream.sse",
            llamacpp(Some(3), 1, 6_631, 75_138),
        ),
        (
            own_fixtures_dir(),
            "ollama_chat_thinking.ndjson",
            EngineReport {
                load: ns(713_288_750),
                prefill: ns(96_318_500),
                decode: ns(398_841_208),
                total: ns(1_210_552_334),
                source: Some(Engine::Ollama),
                ..none
            },
        ),
        (
            own_fixtures_dir(),
            "ollama_generate_cold_load.ndjson",
            EngineReport {
                load: ns(6_338_219_291),
                prefill: ns(130_079_000),
                decode: ns(93_012_500),
                total: ns(6_571_398_812),
                source: Some(Engine::Ollama),
                ..none
            },
        ),
        (
            own_fixtures_dir(),
            "openai_chat_o4mini_cached_reasoning.sse",
            EngineReport {
                cached_tokens: Some(1792),
                reasoning_tokens: Some(192),
                ..none
            },
        ),
        (
            own_fixtures_dir(),
            "sglang_generate_stream.sse",
            EngineReport {
                cached_tokens: Some(1),
                total: ms(93_600),
                source: Some(Engine::SgLang),
                ..none
            },
        ),
        (
            own_fixtures_dir(),
            "sglang_generate_abort.sse",
            EngineReport {
                cached_tokens: Some(0),
                total: ms(120_000),
                source: Some(Engine::SgLang),
                ..none
            },
        ),
        (own_fixtures_dir(), "tgi_generate_stream_details.sse", none),
        (own_fixtures_dir(), "vllm_chat_continuous_usage.sse", none),
    ];
    for (dir, name, want) in cases {
        let expected: serde_json::Value = serde_json::from_slice(
            &std::fs::read(dir.join("expected.json")).expect("expected.json is readable"),
        )
        .expect("expected.json is JSON");
        let entry = &expected[name];
        let path = entry
            .get("path")
            .and_then(|p| p.as_str())
            .unwrap_or_else(|| path_for(entry["dialect"].as_str().expect("a dialect")));
        let bytes = std::fs::read(dir.join(name)).expect("fixture is readable");
        let (framing, dialect) = detect(path, Some(content_type_of_file(name)), None, None);
        let r = read(framing, dialect, 1 << 20, &[&bytes]);
        assert_eq!(r.summary.engine, want, "{name}");
    }
}

/// A real non-streaming answer of llama.cpp's `/v1/chat/completions`: usage and `timings` in
/// one body (the prompt was cached but for one token).
#[test]
fn json_body_of_a_real_llamacpp_chat() {
    let body = std::fs::read(own_fixtures_dir().join("llamacpp_real_chat.json"))
        .expect("fixture is readable");
    let (s, last) = read_json(Dialect::OpenAiChat, &body, 1 << 16);
    assert_eq!(last.output_events, 1);
    assert_eq!(
        (s.usage_output_tokens, s.usage_prompt_tokens),
        (Some(16), Some(27))
    );
    assert_eq!(
        s.engine,
        EngineReport {
            cached_tokens: Some(26),
            prompt_processed: Some(1),
            prefill: Some(Duration::from_micros(5_506)),
            decode: Some(Duration::from_micros(55_134)),
            source: Some(Engine::LlamaCpp),
            ..EngineReport::default()
        }
    );
}

/// Each engine's `/metrics` text, as its fixture holds it, reads as the values it shows.
#[test]
fn engine_metrics_fixtures() {
    let cases = [
        (
            "vllm.txt",
            EngineState {
                engine: Some(Engine::Vllm),
                running: Some(0.0),
                waiting: Some(0.0),
                kv_usage: Some(0.0),
            },
        ),
        (
            "vllm_docs.txt",
            EngineState {
                engine: Some(Engine::Vllm),
                running: Some(8.0),
                waiting: None,
                kv_usage: None,
            },
        ),
        (
            "sglang.txt",
            EngineState {
                engine: Some(Engine::SgLang),
                running: Some(162.0),
                waiting: Some(2826.0),
                kv_usage: Some(0.28),
            },
        ),
        (
            "tgi.txt",
            EngineState {
                engine: Some(Engine::Tgi),
                running: Some(5.0),
                waiting: Some(3.0),
                kv_usage: None,
            },
        ),
        (
            "llamacpp.txt",
            EngineState {
                engine: Some(Engine::LlamaCpp),
                running: Some(0.0),
                waiting: Some(0.0),
                kv_usage: None,
            },
        ),
    ];
    for (name, want) in cases {
        let text = std::fs::read(engine_metrics_dir().join(name)).expect("fixture is readable");
        assert!(
            text.starts_with(b"# source: "),
            "{name} says where it came from"
        );
        assert_eq!(engine_state(&text), Ok(want), "{name}");
        // CRLF line ends read the same.
        let crlf: Vec<u8> = text
            .split(|&b| b == b'\n')
            .flat_map(|line| line.iter().copied().chain(*b"\r\n"))
            .collect();
        assert_eq!(engine_state(&crlf), Ok(want), "{name} with CRLF");
    }
}

/// A stream of a dialect we do not read costs nothing and claims nothing, even when it is SSE.
#[test]
fn unknown_dialect_reads_nothing() {
    let bytes = std::fs::read(fixtures_dir().join("anthropic_messages_basic.sse"))
        .expect("fixture is readable");
    for framing in [
        Framing::Sse,
        Framing::Ndjson,
        Framing::Json,
        Framing::Opaque,
    ] {
        let r = read(framing, Dialect::Unknown, 1 << 20, &[&bytes]);
        assert_eq!(r.summary, StreamSummary::default(), "{framing:?}");
        assert_eq!(r.outputs, 0);
        assert!(!r.expects_end_marker);
    }
    let chat = std::fs::read(fixtures_dir().join("openai_chat_gpt4o_basic_usage.sse"))
        .expect("fixture is readable");
    for dialect in [Dialect::OpenAiChat, Dialect::Auto] {
        let r = read(Framing::Opaque, dialect, 1 << 20, &[&chat]);
        assert_eq!(
            r.summary,
            StreamSummary::default(),
            "opaque bodies are not read"
        );
        assert_eq!(r.dialect, Dialect::Unknown);
        assert!(!r.expects_end_marker);
    }
}

/// The frame that completes the first output-bearing event is the one that reports it: this is
/// what TTFT is stamped on.
#[test]
fn output_is_reported_by_the_frame_that_completes_the_event() {
    let mut reader = StreamReader::new(Framing::Sse, Dialect::OpenAiChat, 1 << 16);
    let role = reader.feed(b"data: {\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\n\n");
    assert_eq!(role, FrameEvents::default());
    let start = reader.feed(b"data: {\"choices\":[{\"delta\":{\"content\":\"Hel");
    assert_eq!(
        start,
        FrameEvents::default(),
        "the event is not complete yet"
    );
    let line_done = reader.feed(b"lo\"}}]}\n");
    assert_eq!(line_done, FrameEvents::default(), "no blank line yet");
    let done = reader.feed(b"\ndata: {\"choices\":[{\"delta\":{\"reasoning\":\"r\"}}]}\n\n");
    assert_eq!(
        done,
        FrameEvents {
            output_events: 2,
            content: true,
            tokens: 2,
        }
    );
    let s = reader.summary();
    assert_eq!((s.events, s.output_events), (3, 2));
    assert_eq!(s.first_output_event, Some(2));
    assert_eq!(s.first_content_event, Some(2));
    assert!(!s.end_marker);
    let end = reader.feed(b"data: [DONE]\n\n");
    assert_eq!(end, FrameEvents::default());
    assert!(reader.summary().end_marker);
    assert_eq!(reader.finish(), FrameEvents::default());
}

/// Reasoning first, content later: TTFT and TTFC fall on different events.
#[test]
fn reasoning_then_content() {
    let stream = b"data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n\
        data: {\"choices\":[{\"delta\":{\"reasoning_content\":\"Let me think\"}}]}\n\n\
        data: {\"choices\":[{\"delta\":{\"reasoning_content\":\".\"}}]}\n\n\
        data: {\"choices\":[{\"delta\":{\"content\":\"42\"}}]}\n\n\
        data: {\"choices\":[{\"delta\":{},\"finish_reason\":\"stop\"}],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":4}}\n\n";
    let s = read(Framing::Sse, Dialect::OpenAiChat, 1 << 16, &[stream]).summary;
    assert_eq!(s.first_output_event, Some(2));
    assert_eq!(s.first_content_event, Some(4));
    assert_eq!(s.output_events, 3);
    assert_eq!(s.usage_output_tokens, Some(4));
    assert_eq!(s.usage_prompt_tokens, Some(3));
    assert!(
        s.end_marker,
        "a finish reason ends the stream without [DONE]"
    );
    assert_eq!(s.finish_reason, Some(FinishReason::Stop));
}

/// With usage on every chunk (vLLM's continuous usage stats) the latest count wins.
#[test]
fn cumulative_usage_keeps_the_latest() {
    let mut stream = Vec::new();
    for n in 1..=5 {
        stream.extend_from_slice(
            format!(
                "data: {{\"choices\":[{{\"delta\":{{\"content\":\"t{n}\"}}}}],\"usage\":{{\"prompt_tokens\":7,\"completion_tokens\":{n}}}}}\n\n"
            )
            .as_bytes(),
        );
    }
    stream.extend_from_slice(b"data: [DONE]\n\n");
    let s = read(Framing::Sse, Dialect::OpenAiChat, 1 << 16, &[&stream]).summary;
    assert_eq!(s.usage_output_tokens, Some(5));
    assert_eq!(s.output_events, 5);
}

/// An error chunk inside a 200 stream marks the stream as failed, whatever comes after it.
#[test]
fn error_inside_a_stream() {
    let stream = b"data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n\
        data: {\"error\":{\"message\":\"upstream overloaded\",\"code\":503}}\n\n\
        data: {\"choices\":[{\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n\
        data: [DONE]\n\n";
    let s = read(Framing::Sse, Dialect::OpenAiChat, 1 << 16, &[stream]).summary;
    assert!(s.error);
    assert!(s.end_marker);
    assert_eq!(s.finish_reason, Some(FinishReason::Error));
    assert_eq!(s.output_events, 1);
}

/// Payloads that are not JSON are skipped, not errors, and do not upset the numbering.
#[test]
fn garbage_payloads_are_ignored() {
    let stream = b"data: {not json\n\ndata: \xff\xfe\xfd\n\nevent: ping\n\n\
        data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\n";
    let s = read(Framing::Sse, Dialect::OpenAiChat, 1 << 16, &[stream]).summary;
    assert_eq!(s.events, 4);
    assert_eq!(s.first_output_event, Some(4));
    assert!(!s.error);
}

/// An oversized event is counted, skipped, and the next event is read as usual.
#[test]
fn oversized_event_is_skipped_and_reading_resumes() {
    let big = format!(
        "data: {{\"choices\":[{{\"delta\":{{\"content\":\"{}\"}}}}]}}\n\n",
        "x".repeat(500)
    );
    let small = b"data: {\"choices\":[{\"delta\":{\"content\":\"y\"}}]}\n\ndata: [DONE]\n\n";
    let mut stream = big.into_bytes();
    stream.extend_from_slice(small);
    for frames in [
        vec![&stream[..]],
        stream.chunks(1).collect::<Vec<_>>(),
        stream.chunks(7).collect(),
    ] {
        let Read {
            summary: s,
            outputs,
            ..
        } = read(Framing::Sse, Dialect::OpenAiChat, 256, &frames);
        assert_eq!(s.oversized_events, 1);
        assert_eq!(s.events, 3);
        assert_eq!(s.output_events, 1);
        assert_eq!(outputs, 1);
        assert_eq!(s.first_output_event, Some(2));
        assert!(s.end_marker);
    }
}

/// Chat over NDJSON (some gateways do this) reads like SSE, one line per event.
#[test]
fn ndjson_chat() {
    let stream = b"{\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\r\n\
        {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\
        \n   \n\
        {\"choices\":[{\"delta\":{\"content\":\"b\"},\"finish_reason\":\"stop\"}]}";
    for frames in [vec![&stream[..]], stream.chunks(1).collect::<Vec<_>>()] {
        let Read {
            summary: s,
            outputs,
            ..
        } = read(Framing::Ndjson, Dialect::OpenAiChat, 1 << 16, &frames);
        assert_eq!(s.events, 3, "blank lines are not events");
        assert_eq!(s.output_events, 2);
        assert_eq!(outputs, 2);
        assert_eq!(s.first_output_event, Some(2));
        assert!(
            s.end_marker,
            "the last line, without LF, is flushed at the end"
        );
    }
}

fn read_json(dialect: Dialect, body: &[u8], max: usize) -> (StreamSummary, FrameEvents) {
    let mut reader = StreamReader::new(Framing::Json, dialect, max);
    // Frames of a JSON body report nothing until the body is whole.
    for frame in body.chunks(13) {
        assert_eq!(reader.feed(frame), FrameEvents::default());
    }
    let last = reader.finish();
    (reader.summary().clone(), last)
}

#[test]
fn json_chat_completion() {
    let body = br#"{"id":"chatcmpl-B9MBs8CjcvOU2jLn4n570S5qMJKcT","object":"chat.completion","created":1741569952,"model":"gpt-4.1-2025-04-14","choices":[{"index":0,"message":{"role":"assistant","content":"Hello! How can I assist you today?","refusal":null,"annotations":[]},"logprobs":null,"finish_reason":"stop"}],"usage":{"prompt_tokens":19,"completion_tokens":10,"total_tokens":29,"prompt_tokens_details":{"cached_tokens":0,"audio_tokens":0},"completion_tokens_details":{"reasoning_tokens":0,"audio_tokens":0,"accepted_prediction_tokens":0,"rejected_prediction_tokens":0}},"service_tier":"default"}"#;
    let (s, last) = read_json(Dialect::OpenAiChat, body, 1 << 16);
    assert_eq!(
        last,
        FrameEvents {
            output_events: 1,
            content: true,
            tokens: 1,
        }
    );
    assert_eq!(s.events, 1);
    assert_eq!(s.output_events, 1);
    assert_eq!(s.first_output_event, Some(1));
    assert_eq!(s.first_content_event, Some(1));
    assert_eq!(s.usage_output_tokens, Some(10));
    assert_eq!(s.usage_prompt_tokens, Some(19));
    assert_eq!(s.finish_reason, Some(FinishReason::Stop));
    assert!(s.end_marker && !s.error);
}

#[test]
fn json_chat_completion_with_reasoning_only() {
    let body = br#"{"object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":null,"reasoning_content":"Thinking..."},"finish_reason":"length"}],"usage":{"prompt_tokens":5,"completion_tokens":16}}"#;
    let (s, last) = read_json(Dialect::OpenAiChat, body, 1 << 16);
    assert_eq!(
        last,
        FrameEvents {
            output_events: 1,
            content: false,
            tokens: 1,
        }
    );
    assert_eq!(s.first_output_event, Some(1));
    assert_eq!(s.first_content_event, None);
    assert_eq!(s.finish_reason, Some(FinishReason::Length));
}

#[test]
fn json_completion() {
    let body = br#"{"id":"cmpl-uqkvlQyYK7bGYrRHQ0eXlWi7","object":"text_completion","created":1589478378,"model":"gpt-3.5-turbo-instruct","system_fingerprint":"fp_44709d6fcb","choices":[{"text":"\n\nThis is indeed a test","index":0,"logprobs":null,"finish_reason":"length"}],"usage":{"prompt_tokens":5,"completion_tokens":7,"total_tokens":12}}"#;
    let (s, last) = read_json(Dialect::OpenAiCompletions, body, 1 << 16);
    assert_eq!(
        last,
        FrameEvents {
            output_events: 1,
            content: true,
            tokens: 1,
        }
    );
    assert_eq!(s.usage_output_tokens, Some(7));
    assert_eq!(s.finish_reason, Some(FinishReason::Length));
    assert!(s.end_marker && !s.error);
}

#[test]
fn json_error_body() {
    let body = br#"{
    "error": {
        "message": "You exceeded your current quota, please check your plan and billing details.",
        "type": "insufficient_quota",
        "param": null,
        "code": "insufficient_quota"
    }
}"#;
    let (s, last) = read_json(Dialect::OpenAiChat, body, 1 << 16);
    assert_eq!(last, FrameEvents::default());
    assert!(s.error);
    assert!(s.end_marker, "the body arrived whole");
    assert_eq!(s.finish_reason, Some(FinishReason::Error));
    assert_eq!(s.output_events, 0);
}

#[test]
fn json_body_that_is_not_json_is_still_complete() {
    let (s, last) = read_json(
        Dialect::OpenAiChat,
        b"<html>502 Bad Gateway</html>",
        1 << 16,
    );
    assert_eq!(last, FrameEvents::default());
    assert!(s.end_marker && !s.error);
    assert_eq!(s.events, 1);
    let (s, _) = read_json(Dialect::OpenAiChat, b"", 1 << 16);
    assert!(s.end_marker);
    assert_eq!(s.events, 0);
}

#[test]
fn json_body_over_the_limit_is_counted_not_read() {
    let body = br#"{"choices":[{"message":{"content":"a long answer"},"finish_reason":"stop"}]}"#;
    let (s, last) = read_json(Dialect::OpenAiChat, body, 20);
    assert_eq!(last, FrameEvents::default());
    assert_eq!(s.oversized_events, 1);
    assert_eq!(s.output_events, 0);
    assert!(s.end_marker);
}

#[test]
fn finish_is_once() {
    let mut reader = StreamReader::new(Framing::Sse, Dialect::OpenAiChat, 1 << 16);
    reader.feed(b"data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}");
    assert_eq!(reader.finish().output_events, 1);
    assert_eq!(reader.finish(), FrameEvents::default());
    assert_eq!(reader.feed(b"\n\n"), FrameEvents::default());
    assert_eq!(reader.summary().events, 1);
}

/// The tokens each frame reports follow the cumulative usage: vLLM's continuous usage stats with
/// speculative decoding put three tokens in one chunk.
#[test]
fn frames_report_tokens_from_cumulative_usage() {
    let bytes = std::fs::read(own_fixtures_dir().join("vllm_chat_continuous_usage.sse"))
        .expect("fixture is readable");
    let mut reader = StreamReader::new(Framing::Sse, Dialect::OpenAiChat, 1 << 16);
    let per_event: Vec<u32> = bytes
        .split_inclusive(|&b| b == b'\n')
        .map(|line| reader.feed(line))
        .filter(|f| f.output_events > 0)
        .map(|f| f.tokens)
        .collect();
    reader.finish();
    assert_eq!(per_event, [1, 3, 1, 1, 1]);
    let s = reader.summary();
    assert_eq!(s.max_tokens_per_event, Some(3));
    assert_eq!(s.usage_output_tokens, Some(8));
    // Without running counts, tokens are one per event and the largest is unknown.
    let plain = std::fs::read(fixtures_dir().join("openai_chat_gpt4o_basic_usage.sse"))
        .expect("fixture is readable");
    let r = read(Framing::Sse, Dialect::OpenAiChat, 1 << 20, &[&plain]);
    assert_eq!(r.tokens, r.outputs);
    assert_eq!(r.summary.max_tokens_per_event, None);
}

/// Anthropic's `message_start` says `output_tokens: 1` before anything was generated; a stream
/// cut before `message_delta` must never report that placeholder as its output count.
#[test]
fn anthropic_placeholder_is_never_the_count() {
    let stream = b"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":11,\"output_tokens\":1}}}\n\n\
        event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hel\"}}\n\n\
        event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"lo\"}}\n\n";
    let r = read(Framing::Sse, Dialect::Anthropic, 1 << 16, &[stream]);
    assert_eq!(r.summary.usage_output_tokens, None);
    assert_eq!(r.summary.usage_prompt_tokens, Some(11));
    assert_eq!(r.summary.output_events, 2);
    assert_eq!(outcome(&r), "error", "cut before message_stop");
}

/// A stream whose first events match no dialect stays unknown: it claims nothing, expects no
/// end marker, and gives its buffers back.
#[test]
fn sniffing_that_finds_nothing_leaves_the_stream_unknown() {
    let mut stream = Vec::new();
    for i in 0..20 {
        stream.extend_from_slice(format!("data: {{\"tick\":{i}}}\n\n").as_bytes());
    }
    stream.extend_from_slice(b"data: {\"choices\":[{\"delta\":{\"content\":\"late\"}}]}\n\n");
    let r = read(Framing::Sse, Dialect::Auto, 1 << 16, &[&stream]);
    assert_eq!(r.summary, StreamSummary::default());
    assert_eq!(r.dialect, Dialect::Unknown);
    assert!(!r.expects_end_marker);
    let mut reader = StreamReader::new(Framing::Sse, Dialect::Auto, 1 << 16);
    for chunk in stream.chunks(5) {
        reader.feed(chunk);
    }
    assert_eq!(reader.dialect(), Dialect::Unknown);
    assert_eq!(reader.buffered_capacity(), 0);

    // Undecided when the body ends: unknown too, whatever was counted.
    let r = read(
        Framing::Ndjson,
        Dialect::Auto,
        1 << 16,
        &[b"{\"a\":1}\n[DONE]\n"],
    );
    assert_eq!(r.summary, StreamSummary::default());
    assert_eq!(r.dialect, Dialect::Unknown);
    // Nothing came at all.
    let r = read(Framing::Sse, Dialect::Auto, 1 << 16, &[]);
    assert_eq!((r.dialect, r.expects_end_marker), (Dialect::Unknown, false));
}

/// Events before the one that shows the dialect keep their numbers: TTFT falls on the right one.
#[test]
fn sniffing_keeps_event_numbers() {
    let stream = b"data: {\"keepalive\":true}\n\n: comment\n\n\
        data: {\"model\":\"m\",\"created_at\":\"t\",\"response\":\"Hi\",\"done\":false}\n\n\
        data: {\"model\":\"m\",\"created_at\":\"t\",\"response\":\"\",\"done\":true,\"eval_count\":1}\n\n";
    let r = read(Framing::Sse, Dialect::Auto, 1 << 16, &[stream]);
    assert_eq!(r.dialect, Dialect::Ollama);
    assert_eq!(r.summary.events, 3);
    assert_eq!(r.summary.first_output_event, Some(2));
    assert!(r.summary.end_marker && r.expects_end_marker);
}

/// A body over the limit, split into small frames, never makes the reader hold more than the
/// limit (plus the event type's cap), for every framing.
#[test]
fn memory_stays_bounded_for_every_framing() {
    let max = 4096;
    let mut sse = b"event: message_start\ndata: ".to_vec();
    sse.extend_from_slice(&[b'x'; 100_000]);
    sse.extend_from_slice(b"\n\ndata: [DONE]\n\n");
    let mut ndjson = vec![b'{'; 100_000];
    ndjson.extend_from_slice(b"\n{}\n");
    let json = vec![b' '; 100_000];
    for (framing, bytes) in [
        (Framing::Sse, &sse),
        (Framing::Ndjson, &ndjson),
        (Framing::Json, &json),
    ] {
        for dialect in [Dialect::OpenAiChat, Dialect::Auto] {
            let mut reader = StreamReader::new(framing, dialect, max);
            let mut most = 0;
            for frame in bytes.chunks(7) {
                reader.feed(frame);
                most = most.max(reader.buffered_capacity());
            }
            reader.finish();
            assert!(
                most <= max + MAX_EVENT_TYPE_BYTES,
                "{framing:?} {dialect:?}: {most}"
            );
            assert!(most > 0, "{framing:?} {dialect:?}: something was buffered");
        }
    }
}

/// Non-streaming bodies of every dialect, told by sniffing (an unknown path) and by their path.
#[test]
fn json_bodies_of_every_dialect() {
    /// Path, body, the dialect it is, its output count, whether it carried output.
    type Case = (&'static str, &'static [u8], Dialect, Option<u64>, bool);
    let cases: [Case; 8] = [
        (
            "/v1/responses",
            br#"{"id":"resp_1","object":"response","status":"completed","output":[{"type":"message","content":[{"type":"output_text","text":"Hi"}]}],"usage":{"input_tokens":5,"output_tokens":2}}"#,
            Dialect::OpenAiResponses,
            Some(2),
            true,
        ),
        (
            "/v1/messages",
            br#"{"id":"msg_1","type":"message","role":"assistant","content":[{"type":"text","text":"Hi"}],"stop_reason":"end_turn","usage":{"input_tokens":5,"output_tokens":3}}"#,
            Dialect::Anthropic,
            Some(3),
            true,
        ),
        (
            "/generate",
            br#"{"generated_text":"Hi there","details":{"finish_reason":"length","generated_tokens":4,"seed":null}}"#,
            Dialect::Tgi,
            Some(4),
            true,
        ),
        (
            "/generate",
            br#"{"text":" Paris.","output_ids":[1,2],"meta_info":{"id":"x","finish_reason":{"type":"stop","matched":2},"prompt_tokens":5,"completion_tokens":3}}"#,
            Dialect::SgLang,
            Some(3),
            true,
        ),
        (
            "/api/chat",
            br#"{"model":"llama3.2","created_at":"2024-01-01T00:00:00Z","message":{"role":"assistant","content":"Hi"},"done":true,"done_reason":"stop","prompt_eval_count":8,"eval_count":5}"#,
            Dialect::Ollama,
            Some(5),
            true,
        ),
        (
            "/completion",
            br#"{"index":0,"content":"Paris","tokens":[],"id_slot":0,"stop":true,"tokens_predicted":6,"tokens_evaluated":4,"stop_type":"eos"}"#,
            Dialect::LlamaCpp,
            Some(6),
            true,
        ),
        (
            "/v1/chat/completions",
            br#"{"object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"Hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":7}}"#,
            Dialect::OpenAiChat,
            Some(7),
            true,
        ),
        (
            "/v1/completions",
            br#"{"object":"text_completion","choices":[{"text":"","index":0,"finish_reason":"length"}],"usage":{"prompt_tokens":3,"completion_tokens":0}}"#,
            Dialect::OpenAiCompletions,
            Some(0),
            false,
        ),
    ];
    for (path, body, dialect, tokens, output) in cases {
        for path in [path, "/unknown"] {
            let (framing, detected) = detect(path, Some("application/json"), None, None);
            if path == "/unknown" {
                assert_eq!(detected, Dialect::Auto);
            }
            let (s, last) = read_json(detected, body, 1 << 16);
            let ctx = format!("{dialect:?} at {path}");
            assert_eq!(framing, Framing::Json, "{ctx}");
            assert_eq!(s.usage_output_tokens, tokens, "{ctx}");
            assert_eq!(last.output_events, u32::from(output), "{ctx}");
            assert!(s.end_marker && !s.error, "{ctx}");
            let mut reader = StreamReader::new(framing, detected, 1 << 16);
            reader.feed(body);
            reader.finish();
            assert_eq!(reader.dialect(), dialect, "{ctx}");
            assert!(
                !reader.expects_end_marker(),
                "{ctx}: a whole body expects no marker"
            );
        }
    }
    // A JSON body nothing recognises is unknown, and claims nothing.
    let mut reader = StreamReader::new(Framing::Json, Dialect::Auto, 1 << 16);
    reader.feed(b"<html>502</html>");
    reader.finish();
    assert_eq!(reader.dialect(), Dialect::Unknown);
    assert_eq!(reader.summary(), &StreamSummary::default());
}

/// Byte pieces that make SSE-like input of every dialect likely, with random bytes mixed in.
fn sse_piece() -> impl Strategy<Value = Vec<u8>> {
    let payloads: Vec<&'static [u8]> = vec![
        br#"{"choices":[{"delta":{"content":"h\u00e9"}}]}"#,
        br#"{"choices":[{"delta":{"reasoning":"r"},"finish_reason":null}]}"#,
        br#"{"choices":[],"usage":{"completion_tokens":3,"prompt_tokens":2}}"#,
        br#"{"choices":[{"index":0,"delta":{"content":"a"}}],"usage":{"completion_tokens":5}}"#,
        br#"{"choices":[{"delta":{},"finish_reason":"stop"}]}"#,
        br#"{"object":"chat.completion.chunk","choices":[]}"#,
        br#"{"error":{"message":"x"}}"#,
        br#"{"type":"message_start","message":{"usage":{"input_tokens":3,"output_tokens":1}}}"#,
        br#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hi"}}"#,
        br#"{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":6}}"#,
        br#"{"type":"response.output_text.delta","delta":"x"}"#,
        br#"{"type":"response.completed","response":{"status":"completed","usage":{"output_tokens":4}}}"#,
        br#"{"index":1,"token":{"id":3,"text":" ","special":false},"generated_text":null,"details":null}"#,
        br#"{"token":{"special":true},"generated_text":"","details":{"finish_reason":"length","generated_tokens":1}}"#,
        br#"{"model":"m","created_at":"t","response":"a","done":false}"#,
        br#"{"model":"m","created_at":"t","message":{"thinking":"t"},"done":true,"eval_count":9}"#,
        br#"{"content":"x","stop":false,"tokens_predicted":2}"#,
        br#"{"content":"","stop":true,"stop_type":"eos","tokens_predicted":4}"#,
        br#"{"text":"ab","meta_info":{"completion_tokens":2,"finish_reason":null}}"#,
        br#"{"text":"abcd","meta_info":{"completion_tokens":5,"finish_reason":{"type":"abort"}}}"#,
        // What explains the figures: details, timings, durations, meta_info.
        br#"{"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":4,"prompt_tokens_details":{"cached_tokens":8},"completion_tokens_details":{"reasoning_tokens":2}}}"#,
        br#"{"choices":[],"usage":{"completion_tokens":1},"timings":{"cache_n":3,"prompt_n":1,"prompt_ms":6.6,"predicted_n":1,"predicted_ms":-1}}"#,
        br#"{"type":"message_start","message":{"usage":{"input_tokens":3,"cache_read_input_tokens":2048,"cache_creation_input_tokens":null}}}"#,
        br#"{"model":"m","response":"","done":true,"total_duration":1e30,"load_duration":6338219291,"eval_duration":"x"}"#,
        br#"{"text":"ab","meta_info":{"completion_tokens":2,"cached_tokens":1,"e2e_latency":0.5,"inference_time":null}}"#,
        br#"{"type":"response.completed","response":{"usage":{"input_tokens_details":{"cached_tokens":1}}},"timings":{}}"#,
    ];
    prop_oneof![
        4 => prop_oneof![
            Just(b"data: ".to_vec()),
            Just(b"data:".to_vec()),
            Just(b"data".to_vec()),
            Just(b"event: error".to_vec()),
            Just(b"event: message_stop".to_vec()),
            Just(b"event: response.output_text.delta".to_vec()),
            Just(b"event".to_vec()),
            Just(b": ping".to_vec()),
            Just(b"id: 7".to_vec()),
            Just(b"\n".to_vec()),
            Just(b"\r".to_vec()),
            Just(b"\r\n".to_vec()),
            Just(b"\n\n".to_vec()),
            Just(b" ".to_vec()),
            Just(b"[DONE]".to_vec()),
            Just("é€".as_bytes().to_vec()),
            Just(vec![0xEF, 0xBB, 0xBF]),
        ],
        3 => proptest::sample::select(payloads).prop_map(<[u8]>::to_vec),
        1 => proptest::collection::vec(any::<u8>(), 0..12),
    ]
}

fn sse_like() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        proptest::collection::vec(sse_piece(), 0..40).prop_map(|pieces| pieces.concat()),
        proptest::collection::vec(any::<u8>(), 0..300),
    ]
}

fn any_dialect() -> impl Strategy<Value = Dialect> {
    proptest::sample::select(Dialect::ALL.to_vec())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Whatever the bytes, the dialect and wherever the frames are cut, the reader never panics,
    /// stays within its memory bound and reads exactly what it reads from one frame; the frames'
    /// reports add up to the summary.
    #[test]
    fn split_invariance(
        bytes in sse_like(),
        points in proptest::collection::vec(any::<usize>(), 0..24),
        max in prop_oneof![Just(1usize << 16), 0usize..120],
        framing in prop_oneof![Just(Framing::Sse), Just(Framing::Ndjson), Just(Framing::Json)],
        dialect in any_dialect(),
    ) {
        let points: Vec<usize> = points.iter().map(|p| p % (bytes.len() + 1)).collect();
        let frames = split_at_points(&bytes, &points);
        let whole = read(framing, dialect, max, &[&bytes]);
        let split = read(framing, dialect, max, &frames);
        prop_assert_eq!(&split, &whole);
        prop_assert_eq!(whole.outputs, whole.summary.output_events);
        prop_assert_eq!(whole.content, whole.summary.first_content_event.is_some());
        prop_assert!(whole.tokens >= whole.outputs);
        let bytewise: Vec<&[u8]> = bytes.chunks(1).collect();
        let by_byte = read(framing, dialect, max, &bytewise);
        prop_assert_eq!(&by_byte, &whole);
    }
}

/// Byte pieces that make `/metrics`-like text likely: the gauges' names, label syntax with its
/// escapes, numbers of every kind, comments and line ends, with random bytes mixed in.
fn exposition_piece() -> impl Strategy<Value = Vec<u8>> {
    let names: Vec<&'static [u8]> = vec![
        b"vllm:num_requests_running",
        b"vllm:num_requests_waiting",
        b"vllm:kv_cache_usage_perc",
        b"vllm:gpu_cache_usage_perc",
        b"sglang:num_running_reqs",
        b"sglang:num_queue_reqs",
        b"sglang:token_usage",
        b"tgi_queue_size",
        b"tgi_batch_current_size",
        b"llamacpp:requests_processing",
        b"llamacpp:requests_deferred",
        b"llamacpp:kv_cache_usage_ratio",
        b"vllm:num_requests_waiting_by_reason",
    ];
    prop_oneof![
        3 => proptest::sample::select(names).prop_map(<[u8]>::to_vec),
        4 => prop_oneof![
            Just(b"{".to_vec()),
            Just(b"}".to_vec()),
            Just(b"engine=\"0\"".to_vec()),
            Just(b",".to_vec()),
            Just(b"priority=\"\"".to_vec()),
            Just(b"a=\"\\\"}\"".to_vec()),
            Just(b"\"".to_vec()),
            Just(b"\\".to_vec()),
            Just(b" ".to_vec()),
            Just(b"\t".to_vec()),
            Just(b"\n".to_vec()),
            Just(b"\r\n".to_vec()),
            Just(b"# HELP ".to_vec()),
            Just(b"# TYPE x gauge\n".to_vec()),
            Just(b" 3.0".to_vec()),
            Just(b" 0.25".to_vec()),
            Just(b" -1".to_vec()),
            Just(b" NaN".to_vec()),
            Just(b" +Inf".to_vec()),
            Just(b" 1e308".to_vec()),
            Just(b" 1712345678000".to_vec()),
            Just(b" # {trace_id=\"a\"} 1.0".to_vec()),
            Just("\u{e9}".as_bytes().to_vec()),
        ],
        1 => proptest::collection::vec(any::<u8>(), 0..12),
    ]
}

fn exposition_like() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        proptest::collection::vec(exposition_piece(), 0..60).prop_map(|pieces| pieces.concat()),
        proptest::collection::vec(any::<u8>(), 0..400),
    ]
}

/// Header names the engine-header reader knows, and some it does not.
fn header_name() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        proptest::sample::select(vec![
            "x-queue-time",
            "X-Inference-Time",
            "x-validation-time",
            "x-time-per-token",
            "x-total-time",
            "x-compute-time",
            "x-compute-type",
            "content-type",
            "x-",
            "",
        ])
        .prop_map(|n| n.as_bytes().to_vec()),
        proptest::collection::vec(any::<u8>(), 0..20),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Whatever the text, reading an engine's state never panics, and what it reports is sane:
    /// no figures without an engine, counts and ratios finite and never negative. Comments and
    /// blank lines added between lines change nothing.
    #[test]
    fn exposition_never_panics(text in exposition_like()) {
        let state = engine_state(&text);
        prop_assert!(state.is_ok(), "small text is always read");
        let state = state.unwrap_or_default();
        if state.engine.is_none() {
            prop_assert_eq!(state, EngineState::default());
        }
        for v in [state.running, state.waiting, state.kv_usage].into_iter().flatten() {
            prop_assert!(v.is_finite() && v >= 0.0, "{:?}", state);
        }
        let mut padded = b"# HELP x y\n\n".to_vec();
        for line in text.split(|&b| b == b'\n') {
            padded.extend_from_slice(line);
            padded.extend_from_slice(b"\n# TYPE z gauge\n\n");
        }
        prop_assert_eq!(engine_state(&padded).unwrap_or_default(), state);
    }

    /// Whatever the headers, reading them never panics; the engine is named exactly when some
    /// figure was read, and a figure is only read from a plain decimal value.
    #[test]
    fn engine_headers_never_panic(
        headers in proptest::collection::vec(
            (header_name(), prop_oneof![
                Just(b"12".to_vec()),
                Just(b"0.5".to_vec()),
                Just(b" 7 ".to_vec()),
                Just(b"-1".to_vec()),
                Just(b"1e3".to_vec()),
                Just(b"99999999999999999999999".to_vec()),
                proptest::collection::vec(any::<u8>(), 0..40),
            ]),
            0..12,
        ),
    ) {
        let report = engine_headers(headers.iter().map(|(n, v)| (n.as_slice(), v.as_slice())));
        let figures = EngineReport { source: None, ..report };
        prop_assert_eq!(report.source.is_some(), !figures.is_empty());
        prop_assert_eq!(report.cached_tokens, None);
    }
}

/// Every captured stream names the model its first events name, read as serde_json reads them
/// (a top-level `model`, Anthropic's `message.model`, the Responses API's `response.model`), and
/// no model it names only after its first output event: that part of a stream is the hot path.
#[test]
fn fixtures_name_the_model_their_first_events_name() {
    fn named(data: &[u8]) -> Option<String> {
        let v: serde_json::Value = serde_json::from_slice(data).ok()?;
        let found = [&v["model"], &v["message"]["model"], &v["response"]["model"]]
            .into_iter()
            .find_map(|m| m.as_str().filter(|m| !m.is_empty()).map(String::from));
        found
    }
    let mut named_some = 0;
    for dir in [fixtures_dir(), own_fixtures_dir()] {
        let expected: serde_json::Value = serde_json::from_slice(
            &std::fs::read(dir.join("expected.json")).expect("expected.json is readable"),
        )
        .expect("expected.json is JSON");
        for (name, want) in expected.as_object().expect("an object") {
            let bytes = std::fs::read(dir.join(name)).expect("fixture is readable");
            let dialect_name = want["dialect"].as_str().expect("a dialect name");
            let path = want
                .get("path")
                .and_then(|p| p.as_str())
                .unwrap_or_else(|| path_for(dialect_name));
            let (framing, dialect) = detect(path, Some(content_type_of_file(name)), None, None);
            let r = read(framing, dialect, 1 << 20, &[&bytes]);
            // The events as a reference cuts them: each fixture event is one `data:` line
            // (or one NDJSON line, or the whole body).
            let events: Vec<&[u8]> = match framing {
                Framing::Json => vec![&bytes[..]],
                _ => bytes
                    .split(|&b| b == b'\n')
                    .map(|l| l.strip_suffix(b"\r").unwrap_or(l))
                    .filter_map(|l| match framing {
                        Framing::Sse => l
                            .strip_prefix(b"data:")
                            .map(|d| d.strip_prefix(b" ").unwrap_or(d)),
                        _ => (!l.trim_ascii().is_empty()).then_some(l),
                    })
                    .collect(),
            };
            let last = r.summary.first_output_event.unwrap_or(u64::MAX);
            let want = events
                .iter()
                .take(usize::try_from(last).unwrap_or(usize::MAX))
                .find_map(|e| named(e));
            assert_eq!(
                r.summary.response_model.as_deref(),
                want.as_deref(),
                "{name}"
            );
            named_some += usize::from(want.is_some());
        }
    }
    assert!(named_some >= 20, "only {named_some} fixtures name a model");
    let model = |name: &str| {
        let bytes = std::fs::read(fixtures_dir().join(name)).expect("fixture is readable");
        let (framing, dialect) =
            detect(path_for("anthropic"), Some("text/event-stream"), None, None);
        read(framing, dialect, 1 << 20, &[&bytes])
            .summary
            .response_model
    };
    assert_eq!(
        model("anthropic_messages_basic.sse").as_deref(),
        Some("claude-3-opus-latest")
    );
}
