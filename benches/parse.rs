//! CPU cost of reading streams: the response parser per event, for every captured stream of every
//! dialect, and the request `model` scanner per byte. Run with `cargo bench --bench parse`. It
//! measures; it asserts nothing about speed beyond the parser still finding what it must.
//!
//! The response parser is fed one frame per event, as servers write them, on one core (the bench
//! is single-threaded), so "events per second" is per core. Each fixture is read with the dialect
//! its path gives and, separately, from an unknown path, where the dialect is sniffed from the
//! first events. The tables are Markdown, for docs/performance.md.

// Wall-clock CPU measurement of pure functions: tokio's clock is for the proxy's own timestamps.
#![allow(clippy::disallowed_types, clippy::disallowed_methods)]

use std::collections::BTreeMap;
use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use tokenmeter::ModelScanner;
use tokenmeter::{detect, Dialect, Framing, StreamReader};

/// How long each measurement runs, at least; the median of several runs is reported.
const TARGET: Duration = Duration::from_millis(60);
const RUNS: usize = 7;

fn main() {
    openai_chat_frame_sizes();
    every_fixture();
    model_scanner();
}

/// The fixtures' directories: the shared captures and this repository's own.
fn fixture_dirs() -> [PathBuf; 2] {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    [
        root.join("../shared/fixtures/streams"),
        root.join("tests/fixtures/streams"),
    ]
}

/// Cuts a stream into its events as servers write them: an SSE event ends at a blank line
/// (comment-only blocks travel with the next event); an NDJSON event is a line.
fn events_of(bytes: &[u8], ndjson: bool) -> Vec<&[u8]> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut i = 0;
    while i < bytes.len() {
        let end = if ndjson {
            match bytes[i..].iter().position(|&b| b == b'\n') {
                Some(p) => i + p + 1,
                None => bytes.len(),
            }
        } else {
            ["\r\n\r\n", "\n\n", "\r\r"]
                .iter()
                .filter_map(|sep| {
                    bytes[i..]
                        .windows(sep.len())
                        .position(|w| w == sep.as_bytes())
                        .map(|p| i + p + sep.len())
                })
                .min()
                .unwrap_or(bytes.len())
        };
        let block = &bytes[i..end];
        let is_event = ndjson
            || block
                .split(|&b| b == b'\n' || b == b'\r')
                .any(|line| !line.is_empty() && !line.starts_with(b":"));
        if is_event || end == bytes.len() {
            out.push(&bytes[start..end]);
            start = end;
        }
        i = end;
    }
    out
}

/// Reads `frames` once; returns the output events found and the dialect read.
fn read_once(framing: Framing, dialect: Dialect, frames: &[&[u8]]) -> (u64, Dialect) {
    let mut reader = StreamReader::new(framing, dialect, 1 << 20);
    let mut output = 0u64;
    for frame in frames {
        output += u64::from(reader.feed(black_box(frame)).output_events);
    }
    output += u64::from(reader.finish().output_events);
    black_box(reader.summary());
    (output, reader.dialect())
}

/// Nanoseconds per event: the median of several runs, each long enough to time well.
fn ns_per_event(framing: Framing, dialect: Dialect, frames: &[&[u8]], events: u64) -> f64 {
    // Find how many rounds fill the target time, then time that many, several times.
    let mut rounds = 1u64;
    loop {
        let start = Instant::now();
        for _ in 0..rounds {
            read_once(framing, dialect, frames);
        }
        if start.elapsed() >= TARGET / 4 || rounds >= 1 << 30 {
            break;
        }
        rounds *= 2;
    }
    rounds *= 4;
    let mut per_event: Vec<f64> = (0..RUNS)
        .map(|_| {
            let start = Instant::now();
            for _ in 0..rounds {
                read_once(framing, dialect, frames);
            }
            start.elapsed().as_nanos() as f64 / (rounds * events.max(1)) as f64
        })
        .collect();
    per_event.sort_by(f64::total_cmp);
    per_event[RUNS / 2]
}

/// The OpenAI chat capture under three frame sizes: the zero-copy path (one event per frame),
/// a whole stream in one frame, and events split across 17-byte frames (the buffered path).
fn openai_chat_frame_sizes() {
    let fixture = fixture_dirs()[0].join("openai_chat_gpt4o_basic_usage.sse");
    let bytes = std::fs::read(&fixture).expect("the shared fixtures are beside the repository");
    let events = events_of(&bytes, false);
    let n_events = events.len() as u64;
    println!(
        "## Response parser, OpenAI chat, {} bytes per event\n",
        bytes.len() as u64 / n_events
    );
    println!("| frames | ns per event |");
    println!("|---|---:|");
    for (how, frames) in [
        ("one frame per event", events.clone()),
        ("whole stream in one frame", vec![&bytes[..]]),
        ("frames of 17 bytes", bytes.chunks(17).collect()),
    ] {
        assert_eq!(
            read_once(Framing::Sse, Dialect::OpenAiChat, &frames).0,
            30,
            "the parser must still find every token"
        );
        let ns = ns_per_event(Framing::Sse, Dialect::OpenAiChat, &frames, n_events);
        println!("| {how} | {ns:.0} |");
    }
    println!();
}

/// One measured fixture.
struct Measured {
    name: String,
    /// The dialect read, whether the path said it or the first events did.
    dialect: Dialect,
    /// The path did not say it (`/generate`): sniffed in both columns.
    path_sniffs: bool,
    events: u64,
    bytes: u64,
    ns: f64,
    ns_sniffed: f64,
}

/// Every fixture, one frame per event, with its path's dialect and sniffed.
fn every_fixture() {
    let mut measured = Vec::new();
    for dir in fixture_dirs() {
        let Ok(text) = std::fs::read_to_string(dir.join("expected.json")) else {
            continue;
        };
        let expected: serde_json::Value =
            serde_json::from_str(&text).expect("expected.json is JSON");
        let expected = expected.as_object().expect("expected.json is an object");
        for (name, want) in expected {
            let bytes = std::fs::read(dir.join(name)).expect("the fixture is readable");
            let ndjson = name.ends_with(".ndjson");
            let content_type = if ndjson {
                "application/x-ndjson"
            } else {
                "text/event-stream"
            };
            let dialect_name = want["dialect"].as_str().expect("a dialect");
            let path = want
                .get("path")
                .and_then(|p| p.as_str())
                .unwrap_or_else(|| path_for(dialect_name));
            let (framing, dialect) = detect(path, Some(content_type), None, None);
            let (_, auto) = detect("/unknown", Some(content_type), None, None);
            let frames = events_of(&bytes, ndjson);
            let events = frames.len() as u64;
            let want_output = want["output_events"].as_u64().expect("output events");
            let (output, read_as) = read_once(framing, dialect, &frames);
            assert_eq!(output, want_output, "{name}");
            assert_eq!(
                read_once(framing, auto, &frames),
                (want_output, read_as),
                "{name}"
            );
            assert_eq!(read_as.as_str(), dialect_name, "{name}");
            measured.push(Measured {
                name: name.clone(),
                dialect: read_as,
                path_sniffs: dialect == Dialect::Auto,
                events,
                bytes: bytes.len() as u64,
                ns: ns_per_event(framing, dialect, &frames, events),
                ns_sniffed: ns_per_event(framing, auto, &frames, events),
            });
        }
    }

    println!("## Response parser per dialect, one frame per event, one core\n");
    println!("| dialect | fixtures | events | bytes per event | ns per event | events per second per core |");
    println!("|---|---:|---:|---:|---:|---:|");
    let mut by_dialect: BTreeMap<&str, Vec<&Measured>> = BTreeMap::new();
    for m in &measured {
        by_dialect.entry(m.dialect.as_str()).or_default().push(m);
    }
    for (dialect, ms) in &by_dialect {
        let events: u64 = ms.iter().map(|m| m.events).sum();
        let bytes: u64 = ms.iter().map(|m| m.bytes).sum();
        // Weighted by events: the time all of this dialect's events take, over their number.
        let ns = ms.iter().map(|m| m.ns * m.events as f64).sum::<f64>() / events as f64;
        println!(
            "| {dialect} | {} | {events} | {} | {ns:.0} | {} |",
            ms.len(),
            bytes / events,
            thousands(1e9 / ns)
        );
    }
    println!("\n## Response parser per captured stream\n");
    println!(
        "| stream | dialect | events | bytes per event | ns per event | ns per event, sniffed |"
    );
    println!("|---|---|---:|---:|---:|---:|");
    for m in &measured {
        println!(
            "| `{}` | {}{} | {} | {} | {:.0} | {:.0} |",
            m.name,
            m.dialect.as_str(),
            if m.path_sniffs { " (sniffed)" } else { "" },
            m.events,
            m.bytes / m.events,
            m.ns,
            m.ns_sniffed
        );
    }
    println!();
}

/// The path each dialect's fixtures are served on.
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

/// `1234567.8` as `1,234,568`.
fn thousands(x: f64) -> String {
    let digits = format!("{:.0}", x);
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn model_scanner() {
    println!("## Request model scanner, 4 MiB bodies in 16 KiB frames, model last\n");
    println!("| body | median | throughput |");
    println!("|---|---:|---:|");
    let bodies = [
        (
            "prose",
            prompt_body(4 << 20, "The quick brown fox jumps over the lazy dog. "),
        ),
        (
            "code, four escapes a line",
            prompt_body(
                4 << 20,
                r#"    print(\"hello\", path=\"C:\\tmp\")  # say hello\n"#,
            ),
        ),
        ("token ids", token_body(4 << 20)),
    ];
    for (name, body) in &bodies {
        let mut times = Vec::new();
        for _ in 0..30 {
            let start = Instant::now();
            let mut scanner = ModelScanner::new(usize::MAX);
            for frame in body.chunks(16 * 1024) {
                scanner.feed(black_box(frame));
            }
            black_box(scanner.finish());
            times.push(start.elapsed());
        }
        times.sort_unstable();
        let median = times[times.len() / 2];
        println!(
            "| {name} | {:.2} ms | {:.1} GB/s |",
            median.as_secs_f64() * 1e3,
            body.len() as f64 / median.as_secs_f64() / 1e9
        );
    }
}

/// A chat request of about `size` bytes whose prompt repeats `line`, with `model` at the end
/// as Python's openai SDK writes it.
fn prompt_body(size: usize, line: &str) -> Vec<u8> {
    let mut body = br#"{"messages":["#.to_vec();
    while body.len() < size {
        if !body.ends_with(b"[") {
            body.push(b',');
        }
        body.extend_from_slice(br#"{"role":"user","content":""#);
        for _ in 0..50 {
            body.extend_from_slice(line.as_bytes());
        }
        body.extend_from_slice(br#""}"#);
    }
    body.extend_from_slice(br#"],"stream":true,"model":"llama-3-8b"}"#);
    body
}

/// A completions request whose prompt is token ids.
fn token_body(size: usize) -> Vec<u8> {
    let mut body = br#"{"prompt":[0"#.to_vec();
    let mut n = 0u32;
    while body.len() < size {
        n = n.wrapping_mul(1_103_515_245).wrapping_add(12_345);
        body.extend_from_slice(format!(",{}", n % 128_000).as_bytes());
    }
    body.extend_from_slice(br#"],"model":"llama-3-8b"}"#);
    body
}
