//! Tests of the whole reader: the captured fixtures replayed under every kind of frame split,
//! non-streaming bodies, and properties that must hold for any bytes at all.
//!
//! The framers' own rules are tested beside them (`sse.rs`, `ndjson.rs`), with the [`Recorder`]
//! sink defined here.

use std::path::PathBuf;

use proptest::prelude::*;

use super::*;

/// The captured streams and their expected readings, shared with the rest of the project.
fn fixtures_dir() -> PathBuf {
    PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../shared/fixtures/streams"
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

/// Feeds the frames, then finishes; returns the summary and what the frames said in total.
fn read(
    framing: Framing,
    dialect: Dialect,
    max: usize,
    frames: &[&[u8]],
) -> (StreamSummary, u64, bool) {
    let mut reader = StreamReader::new(framing, dialect, max);
    let mut outputs = 0u64;
    let mut content = false;
    for frame in frames {
        let got = reader.feed(frame);
        outputs += u64::from(got.output_events);
        content |= got.content;
    }
    let got = reader.finish();
    outputs += u64::from(got.output_events);
    content |= got.content;
    (reader.summary().clone(), outputs, content)
}

fn dialect_named(name: &str) -> Option<Dialect> {
    match name {
        "openai-chat" => Some(Dialect::OpenAiChat),
        "openai-completions" => Some(Dialect::OpenAiCompletions),
        _ => None,
    }
}

fn framing_of_file(name: &str) -> Framing {
    if name.ends_with(".ndjson") {
        Framing::Ndjson
    } else {
        Framing::Sse
    }
}

/// Every fixture of the OpenAI dialects reads as `expected.json` says, as one frame, one byte per
/// frame and under many random splits, and the frames' own reports add up to the summary.
#[test]
fn fixtures_read_as_expected_under_every_split() {
    let dir = fixtures_dir();
    let expected: serde_json::Value = serde_json::from_slice(
        &std::fs::read(dir.join("expected.json")).expect("expected.json is readable"),
    )
    .expect("expected.json is JSON");
    let expected = expected.as_object().expect("expected.json is an object");
    let mut checked = 0;
    for (name, want) in expected {
        let Some(dialect) = want["dialect"].as_str().and_then(dialect_named) else {
            continue;
        };
        let bytes = std::fs::read(dir.join(name)).expect("fixture is readable");
        let framing = framing_of_file(name);
        let data_lines = bytes
            .split(|&b| b == b'\n')
            .filter(|line| line.starts_with(b"data"))
            .count() as u64;

        let whole = read(framing, dialect, 1 << 20, &[&bytes]);
        let check = |how: &str, (summary, outputs, content): &(StreamSummary, u64, bool)| {
            let ctx = format!("{name} ({how})");
            assert_eq!(
                summary.first_output_event,
                want["first_output_event"].as_u64(),
                "{ctx}: first output event"
            );
            assert_eq!(
                summary.first_content_event,
                want["first_content_event"].as_u64(),
                "{ctx}: first content event"
            );
            assert_eq!(
                Some(summary.output_events),
                want["output_events"].as_u64(),
                "{ctx}: output events"
            );
            assert_eq!(
                summary.usage_output_tokens,
                want["usage_output_tokens"].as_u64(),
                "{ctx}: usage output tokens"
            );
            let tokens = summary.usage_output_tokens.unwrap_or(summary.output_events);
            assert_eq!(
                Some(tokens),
                want["output_tokens"].as_u64(),
                "{ctx}: tokens"
            );
            let ok = summary.end_marker && !summary.error;
            assert_eq!(ok, want["outcome"] == "ok", "{ctx}: outcome");
            assert_eq!(summary.events, data_lines, "{ctx}: one event per data line");
            assert_eq!(summary.oversized_events, 0, "{ctx}");
            assert_eq!(*outputs, summary.output_events, "{ctx}: frames add up");
            assert_eq!(
                *content,
                summary.first_content_event.is_some(),
                "{ctx}: some frame said content"
            );
        };
        check("one frame", &whole);

        let bytewise: Vec<&[u8]> = bytes.chunks(1).collect();
        let by_byte = read(framing, dialect, 1 << 20, &bytewise);
        check("one byte per frame", &by_byte);
        assert_eq!(by_byte.0, whole.0, "{name}: byte-wise summary");

        for seed in 0..300 {
            let cuts = XorShift::new(seed).cuts(bytes.len());
            let frames = split_at_points(&bytes, &cuts);
            let split = read(framing, dialect, 1 << 20, &frames);
            check(&format!("seed {seed}"), &split);
            assert_eq!(split.0, whole.0, "{name}: seed {seed} summary");
        }
        checked += 1;
    }
    assert!(checked >= 9, "only {checked} fixtures were checked");
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
    ];
    for (name, reason) in cases {
        let bytes = std::fs::read(fixtures_dir().join(name)).expect("fixture is readable");
        let dialect = if name.contains("completions") {
            Dialect::OpenAiCompletions
        } else {
            Dialect::OpenAiChat
        };
        let (summary, _, _) = read(Framing::Sse, dialect, 1 << 20, &[&bytes]);
        assert_eq!(summary.finish_reason, Some(reason), "{name}");
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
        let (summary, outputs, _) = read(framing, Dialect::Unknown, 1 << 20, &[&bytes]);
        assert_eq!(summary, StreamSummary::default(), "{framing:?}");
        assert_eq!(outputs, 0);
    }
    let chat = std::fs::read(fixtures_dir().join("openai_chat_gpt4o_basic_usage.sse"))
        .expect("fixture is readable");
    let (summary, _, _) = read(Framing::Opaque, Dialect::OpenAiChat, 1 << 20, &[&chat]);
    assert_eq!(
        summary,
        StreamSummary::default(),
        "opaque bodies are not read"
    );
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
            content: true
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
    let (s, _, _) = read(Framing::Sse, Dialect::OpenAiChat, 1 << 16, &[stream]);
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
    let (s, _, _) = read(Framing::Sse, Dialect::OpenAiChat, 1 << 16, &[&stream]);
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
    let (s, _, _) = read(Framing::Sse, Dialect::OpenAiChat, 1 << 16, &[stream]);
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
    let (s, _, _) = read(Framing::Sse, Dialect::OpenAiChat, 1 << 16, &[stream]);
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
        let (s, outputs, _) = read(Framing::Sse, Dialect::OpenAiChat, 256, &frames);
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
        let (s, outputs, _) = read(Framing::Ndjson, Dialect::OpenAiChat, 1 << 16, &frames);
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
            content: true
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
            content: false
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
            content: true
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

/// Byte pieces that make SSE-like input likely, with random bytes mixed in.
fn sse_piece() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        Just(b"data: ".to_vec()),
        Just(b"data:".to_vec()),
        Just(b"data".to_vec()),
        Just(b"event: error".to_vec()),
        Just(b"event".to_vec()),
        Just(b": ping".to_vec()),
        Just(b"id: 7".to_vec()),
        Just(b"\n".to_vec()),
        Just(b"\r".to_vec()),
        Just(b"\r\n".to_vec()),
        Just(b"\n\n".to_vec()),
        Just(b" ".to_vec()),
        Just(b"[DONE]".to_vec()),
        Just(br#"{"choices":[{"delta":{"content":"h\u00e9"}}]}"#.to_vec()),
        Just(br#"{"choices":[{"delta":{"reasoning":"r"},"finish_reason":null}]}"#.to_vec()),
        Just(br#"{"choices":[],"usage":{"completion_tokens":3,"prompt_tokens":2}}"#.to_vec()),
        Just(br#"{"choices":[{"delta":{},"finish_reason":"stop"}]}"#.to_vec()),
        Just(br#"{"error":{"message":"x"}}"#.to_vec()),
        Just("é€".as_bytes().to_vec()),
        Just(vec![0xEF, 0xBB, 0xBF]),
        proptest::collection::vec(any::<u8>(), 0..12),
    ]
}

fn sse_like() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        proptest::collection::vec(sse_piece(), 0..40).prop_map(|pieces| pieces.concat()),
        proptest::collection::vec(any::<u8>(), 0..300),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Whatever the bytes and wherever the frames are cut, the reader never panics and reads
    /// exactly what it reads from one frame; the frames' reports add up to the summary.
    #[test]
    fn split_invariance(
        bytes in sse_like(),
        points in proptest::collection::vec(any::<usize>(), 0..24),
        max in prop_oneof![Just(1usize << 16), 0usize..120],
        framing in prop_oneof![Just(Framing::Sse), Just(Framing::Ndjson), Just(Framing::Json)],
    ) {
        let points: Vec<usize> = points.iter().map(|p| p % (bytes.len() + 1)).collect();
        let frames = split_at_points(&bytes, &points);
        let whole = read(framing, Dialect::OpenAiChat, max, &[&bytes]);
        let split = read(framing, Dialect::OpenAiChat, max, &frames);
        prop_assert_eq!(&split.0, &whole.0);
        prop_assert_eq!(split.1, split.0.output_events);
        prop_assert_eq!(whole.1, whole.0.output_events);
        prop_assert_eq!(split.2, split.0.first_content_event.is_some());
        let bytewise: Vec<&[u8]> = bytes.chunks(1).collect();
        let by_byte = read(framing, Dialect::OpenAiChat, max, &bytewise);
        prop_assert_eq!(&by_byte.0, &whole.0);
    }
}
