//! CPU cost of reading streams: the response parser per event and the request `model` scanner
//! per byte. Run with `cargo bench --bench parse`. It measures; it asserts nothing about speed.

// Wall-clock CPU measurement of pure functions: tokio's clock is for the proxy's own timestamps.
#![allow(clippy::disallowed_types, clippy::disallowed_methods)]

use std::hint::black_box;
use std::path::Path;
use std::time::Instant;

use tokenmeter::request_model::ModelScanner;
use tokenmeter::stream::{Dialect, Framing, StreamReader};

fn main() {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../shared/fixtures/streams/openai_chat_gpt4o_basic_usage.sse");
    let bytes = std::fs::read(&fixture).expect("the shared fixtures are beside the repository");
    let events: Vec<&[u8]> = bytes
        .split_inclusive(|&b| b == b'\n')
        .collect::<Vec<_>>()
        .chunks(2)
        .map(|pair| {
            let start = pair[0].as_ptr() as usize - bytes.as_ptr() as usize;
            &bytes[start..start + pair.iter().map(|l| l.len()).sum::<usize>()]
        })
        .collect();
    let n_events = events.len() as u64;
    let rounds = 20_000u64;
    println!(
        "response parser, OpenAI chat, {} bytes per event:",
        bytes.len() as u64 / n_events
    );
    for (how, frames) in [
        ("one frame per event", events.clone()),
        ("whole stream in one frame", vec![&bytes[..]]),
        ("frames of 17 bytes", bytes.chunks(17).collect()),
    ] {
        let start = Instant::now();
        let mut output = 0u64;
        for _ in 0..rounds {
            let mut reader = StreamReader::new(Framing::Sse, Dialect::OpenAiChat, 1 << 20);
            for frame in &frames {
                output += u64::from(reader.feed(black_box(frame)).output_events);
            }
            reader.finish();
        }
        let per_event = start.elapsed().as_nanos() as f64 / (rounds * n_events) as f64;
        assert_eq!(
            output,
            rounds * 30,
            "the parser must still find every token"
        );
        println!("  {how:<28} {per_event:>6.0} ns per event");
    }

    println!("request model scanner, 4 MiB bodies in 16 KiB frames, model last:");
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
            "  {name:<28} {:>6.2} ms median, {:.1} GB/s",
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
