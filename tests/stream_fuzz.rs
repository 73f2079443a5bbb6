//! Fuzzing the response reader with arbitrary bytes cut into arbitrary frames, for every framing
//! and every dialect (`auto` and `unknown` included): nothing panics; after every frame the
//! reader holds at most `max_event_bytes + MAX_EVENT_TYPE_BYTES` bytes of buffers (the documented
//! bound: one event's data plus the cap on an SSE event type); what it reads does not depend on
//! where the frames were cut; and, driven through the real [`TimedBody`] and [`Recorder`], the
//! client receives exactly the frames the upstream sent, byte for byte.
//!
//! The inputs mix the pieces of every dialect's events (names, payloads, line ends, `[DONE]`,
//! comments, BOMs, multi-byte characters) with random bytes, so that both the parsers' happy
//! paths and their refusals are exercised, and the limits are small (64 to 4096 bytes) so that
//! oversized events and the buffer bound are exercised too.
//!
//! Cases per property: `PROPTEST_CASES`, else [`DEFAULT_CASES`] so that `cargo test` stays quick.
//! A long run: `PROPTEST_CASES=500000 cargo test --release --test stream_fuzz -- --nocapture`
//! (two properties, so a million cases; each reports its count and time). Failures are not
//! written to a regressions file (nothing may appear at the repository's top level): a failure
//! prints the failing input, minimised, and the seed that replays the run
//! (`STREAM_FUZZ_SEED=...`).

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll, Wake, Waker};

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, StatusCode, Uri};
use http_body::{Body, Frame};
use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestRng, TestRunner};
use tokenmeter::TimedBody;
use tokenmeter::{
    Dialect, FrameEvents, Framing, StreamReader, StreamSummary, MAX_EVENT_TYPE_BYTES,
};
use tokenmeter::{Meter, Recorder, TimedBodyError};

/// Cases per property when `PROPTEST_CASES` is not set.
const DEFAULT_CASES: u32 = 5000;

/// The event limits the cases use; small, so that the limit is hit often.
const LIMITS: [usize; 5] = [64, 100, 257, 1024, 4096];

fn config() -> Config {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(DEFAULT_CASES);
    Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    }
}

/// Payloads of each dialect's events: output, lifecycle, usage, end markers, errors.
fn payloads(dialect: Dialect) -> Vec<&'static [u8]> {
    match dialect {
        Dialect::OpenAiChat => vec![
            br#"{"object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":""}}],"usage":{"completion_tokens":0}}"#,
            br#"{"choices":[{"index":0,"delta":{"content":"h\u00e9"}}],"usage":{"completion_tokens":3}}"#,
            br#"{"choices":[{"index":0,"delta":{"content":"x"}}],"usage":{"completion_tokens":5}}"#,
            br#"{"choices":[{"delta":{"reasoning_content":"r"},"finish_reason":null}]}"#,
            br#"{"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{"}}]}}]}"#,
            br#"{"choices":[],"usage":{"completion_tokens":9,"prompt_tokens":2}}"#,
            br#"{"choices":[{"delta":{},"finish_reason":"stop"}],"obfuscation":"xx"}"#,
            br#"{"error":{"message":"overloaded"}}"#,
            b"[DONE]",
        ],
        Dialect::OpenAiCompletions => vec![
            br#"{"object":"text_completion","choices":[{"text":" a","finish_reason":null}]}"#,
            br#"{"choices":[{"text":"","finish_reason":"length"}],"usage":{"completion_tokens":4}}"#,
            b"[DONE]",
        ],
        Dialect::OpenAiResponses => vec![
            br#"{"type":"response.created","response":{"status":"in_progress"}}"#,
            br#"{"type":"response.output_text.delta","delta":"x"}"#,
            br#"{"type":"response.reasoning_text.delta","delta":"r"}"#,
            br#"{"type":"response.incomplete","response":{"status":"incomplete","incomplete_details":{"reason":"max_output_tokens"},"usage":{"output_tokens":4}}}"#,
            br#"{"type":"response.completed","response":{"status":"completed","usage":{"output_tokens":7}}}"#,
            br#"{"type":"error","code":"server_error"}"#,
        ],
        Dialect::Anthropic => vec![
            br#"{"type":"message_start","message":{"usage":{"input_tokens":3,"output_tokens":1}}}"#,
            br#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hi"}}"#,
            br#"{"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"t"}}"#,
            br#"{"type":"content_block_delta","index":0,"delta":{"type":"signature_delta","signature":"s"}}"#,
            br#"{"type":"message_delta","delta":{"stop_reason":"max_tokens"},"usage":{"output_tokens":6}}"#,
            br#"{"type":"message_stop"}"#,
            br#"{"type":"error","error":{"type":"overloaded_error"}}"#,
        ],
        Dialect::Tgi => vec![
            br#"{"index":1,"token":{"id":3,"text":" ","special":false},"generated_text":null,"details":null}"#,
            br#"{"token":{"id":2,"special":true},"generated_text":"","details":{"finish_reason":"eos_token","generated_tokens":2}}"#,
            br#"{"error":"Request failed during generation","error_type":"generation"}"#,
            br#"[{"generated_text":"a","details":{"generated_tokens":2}}]"#,
        ],
        Dialect::Ollama => vec![
            br#"{"model":"m","created_at":"t","response":"a","done":false}"#,
            br#"{"model":"m","created_at":"t","message":{"content":"","thinking":"t"},"done":false}"#,
            br#"{"model":"m","created_at":"t","message":{"content":""},"done":true,"done_reason":"load","eval_count":9}"#,
            br#"{"error":"an error was encountered while running the model"}"#,
        ],
        Dialect::LlamaCpp => vec![
            br#"{"index":0,"content":"x","stop":false,"tokens_predicted":2}"#,
            br#"{"index":0,"content":"","stop":false,"tokens_predicted":3}"#,
            br#"{"index":0,"content":"yz","stop":false,"tokens_predicted":5}"#,
            br#"{"content":"","stop":true,"stop_type":"limit","tokens_predicted":6,"timings":{"predicted_n":6}}"#,
        ],
        Dialect::SgLang | Dialect::Auto | Dialect::Unknown => vec![
            br#"{"text":"ab","meta_info":{"completion_tokens":2,"finish_reason":null}}"#,
            br#"{"text":"abcd","meta_info":{"completion_tokens":5,"finish_reason":null}}"#,
            br#"{"text":"abcd","index":1,"meta_info":{"completion_tokens":5,"finish_reason":{"type":"abort"}}}"#,
            br#"{"text":"abcde","meta_info":{"completion_tokens":6,"finish_reason":{"type":"stop"}}}"#,
            b"[DONE]",
        ],
    }
}

/// The known dialects, whose payloads make up the bodies.
const KNOWN: [Dialect; 8] = [
    Dialect::OpenAiChat,
    Dialect::OpenAiCompletions,
    Dialect::OpenAiResponses,
    Dialect::Anthropic,
    Dialect::Tgi,
    Dialect::Ollama,
    Dialect::LlamaCpp,
    Dialect::SgLang,
];

/// Noise between and inside events: the framing's own syntax and random bytes.
fn noise() -> impl Strategy<Value = Vec<u8>> {
    let syntax: Vec<&'static [u8]> = vec![
        b"data: ",
        b"data:",
        b"data",
        b"event: ",
        b"event: error",
        b"event: message_stop",
        b": ping",
        b"id: 7",
        b"retry: 10",
        b"\n",
        b"\r",
        b"\r\n",
        b"\n\n",
        b" ",
        b"[DONE]",
        b"\xEF\xBB\xBF",
        "é€🚀".as_bytes(),
    ];
    prop_oneof![
        3 => proptest::sample::select(syntax).prop_map(<[u8]>::to_vec),
        // A payload cut short, or with a byte changed: JSON that almost parses.
        1 => (proptest::sample::select(KNOWN.to_vec()), any::<prop::sample::Index>(), any::<usize>(), any::<u8>())
            .prop_map(|(d, which, at, b)| {
                let mut p = which.get(&payloads(d)).to_vec();
                let at = at % p.len();
                if b % 2 == 0 {
                    p.truncate(at);
                } else if let Some(byte) = p.get_mut(at) {
                    *byte = b;
                }
                p
            }),
        2 => proptest::collection::vec(any::<u8>(), 0..16),
    ]
}

/// One whole event of `source`'s dialect as `framing` carries it (most of the time), else of
/// any dialect or any framing.
fn event(framing: Framing, source: Dialect) -> impl Strategy<Value = Vec<u8>> {
    let names: Vec<&'static [u8]> = match source {
        Dialect::Anthropic => vec![
            b"event: content_block_delta\n",
            b"event: message_stop\n",
            b"",
        ],
        Dialect::OpenAiResponses => vec![
            b"event: response.output_text.delta\n",
            b"event: response.completed\n",
            b"",
        ],
        _ => vec![b"", b"", b"event: error\n"],
    };
    let (heads, ends): (Vec<&'static [u8]>, Vec<&'static [u8]>) = match framing {
        Framing::Ndjson => (vec![b""], vec![b"\n", b"\r\n"]),
        _ => (
            vec![b"data: ", b"data:"],
            vec![b"\n\n", b"\r\n\r\n", b"\r\r", b"\n"],
        ),
    };
    let any_payload = proptest::sample::select(KNOWN.to_vec())
        .prop_flat_map(|d| proptest::sample::select(payloads(d)));
    let payload = prop_oneof![
        4 => proptest::sample::select(payloads(source)),
        1 => any_payload,
    ];
    (
        proptest::sample::select(names),
        proptest::sample::select(heads),
        payload,
        proptest::sample::select(ends),
    )
        .prop_map(move |(name, head, payload, end)| {
            let name: &[u8] = if framing == Framing::Ndjson {
                b""
            } else {
                name
            };
            [name, head, payload, end].concat()
        })
}

/// A body for `framing` and `dialect`: mostly that dialect's events in that framing with some
/// noise, sometimes plain random bytes, sometimes one long event that outgrows the limit.
fn body(framing: Framing, dialect: Dialect) -> impl Strategy<Value = Vec<u8>> {
    let source = if dialect.is_known() {
        Just(dialect).boxed()
    } else {
        proptest::sample::select(KNOWN.to_vec()).boxed()
    };
    let events = source.prop_flat_map(move |source| {
        proptest::collection::vec(
            prop_oneof![5 => event(framing, source), 1 => noise()],
            0..48,
        )
        .prop_map(|p| p.concat())
    });
    prop_oneof![
        8 => events,
        1 => proptest::collection::vec(any::<u8>(), 0..512),
        1 => (proptest::sample::select(vec![&b"data: "[..], &b"event: "[..], &b"{"[..]]), 0usize..6000)
            .prop_map(|(head, n)| {
                let mut b = head.to_vec();
                b.resize(head.len() + n, b'x');
                b.extend_from_slice(b"\n\ndata: [DONE]\n\n");
                b
            }),
    ]
}

/// A framing, a dialect, and a body made for them.
fn case() -> impl Strategy<Value = (Framing, Dialect, Vec<u8>)> {
    (framing(), proptest::sample::select(Dialect::ALL.to_vec())).prop_flat_map(
        |(framing, dialect)| {
            // An opaque or JSON body is made like an SSE one: it has no lines of its own.
            let made_as = match framing {
                Framing::Ndjson => Framing::Ndjson,
                _ => Framing::Sse,
            };
            (Just(framing), Just(dialect), body(made_as, dialect))
        },
    )
}

/// Cuts `bytes` at the given points (in any order, out of range ignored) into frames.
fn split(bytes: &[u8], points: &[usize]) -> Vec<Bytes> {
    let mut cuts: Vec<usize> = points
        .iter()
        .map(|p| p % (bytes.len() + 1))
        .filter(|&p| p > 0 && p < bytes.len())
        .collect();
    cuts.sort_unstable();
    cuts.dedup();
    let whole = Bytes::copy_from_slice(bytes);
    let mut frames = Vec::with_capacity(cuts.len() + 1);
    let mut start = 0;
    for cut in cuts {
        frames.push(whole.slice(start..cut));
        start = cut;
    }
    if start < bytes.len() || frames.is_empty() {
        frames.push(whole.slice(start..));
    }
    frames
}

/// Everything a reading gave, to compare readings of the same bytes.
#[derive(Debug, PartialEq)]
struct Reading {
    summary: StreamSummary,
    dialect: Dialect,
    expects_end_marker: bool,
    output_events: u64,
    tokens: u64,
    content: bool,
}

fn read(framing: Framing, dialect: Dialect, max: usize, frames: &[Bytes]) -> Reading {
    let mut reader = StreamReader::new(framing, dialect, max);
    let mut reading = Reading {
        summary: StreamSummary::default(),
        dialect,
        expects_end_marker: false,
        output_events: 0,
        tokens: 0,
        content: false,
    };
    let add = |f: FrameEvents, r: &mut Reading| {
        assert!(f.tokens >= f.output_events, "{f:?}");
        r.output_events += u64::from(f.output_events);
        r.tokens += u64::from(f.tokens);
        r.content |= f.content;
    };
    for frame in frames {
        add(reader.feed(frame), &mut reading);
        let held = reader.buffered_capacity();
        assert!(
            held <= max + MAX_EVENT_TYPE_BYTES,
            "holds {held} bytes with a limit of {max}"
        );
    }
    add(reader.finish(), &mut reading);
    assert!(reader.buffered_capacity() <= max + MAX_EVENT_TYPE_BYTES);
    reading.summary = reader.summary().clone();
    reading.dialect = reader.dialect();
    reading.expects_end_marker = reader.expects_end_marker();
    reading
}

fn framing() -> impl Strategy<Value = Framing> {
    proptest::sample::select(vec![
        Framing::Sse,
        Framing::Ndjson,
        Framing::Json,
        Framing::Opaque,
    ])
}

/// Runs `test` on the configured number of cases of `strategy`, from a seed that is printed
/// (and can be given back with `STREAM_FUZZ_SEED` to replay a run), and reports how many cases
/// passed and how long they took.
fn run<S: Strategy>(name: &str, strategy: S, test: impl Fn(S::Value) -> Result<(), TestCaseError>) {
    let seed = std::env::var("STREAM_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .unwrap_or_else(|| {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default();
            now.as_nanos() as u64 ^ u64::from(std::process::id()).rotate_left(32)
        });
    let mut seed_bytes = [0u8; 32];
    for (i, b) in seed_bytes.iter_mut().enumerate() {
        *b = seed.rotate_left(8 * (i as u32 % 8)).to_le_bytes()[0] ^ (i as u8);
    }
    let rng = TestRng::from_seed(RngAlgorithm::ChaCha, &seed_bytes);
    let mut runner = TestRunner::new_with_rng(config(), rng);
    let cases = std::cell::Cell::new(0u64);
    let start = tokio::time::Instant::now();
    let result = runner.run(&strategy, |value| {
        cases.set(cases.get() + 1);
        test(value)
    });
    if let Err(e) = result {
        panic!("{name} failed (replay with STREAM_FUZZ_SEED={seed}): {e}");
    }
    eprintln!(
        "{name}: {} cases passed in {:.1?} (STREAM_FUZZ_SEED={seed})",
        cases.get(),
        start.elapsed()
    );
}

/// The reader alone: bounded after every frame, and the same reading however the bytes are cut
/// (one frame, random frames, one byte per frame for short bodies).
#[test]
fn reader_is_bounded_and_split_invariant() {
    let strategy = (
        case(),
        proptest::collection::vec(any::<usize>(), 0..32),
        proptest::sample::select(LIMITS.to_vec()),
    );
    run(
        "reader_is_bounded_and_split_invariant",
        strategy,
        |((framing, dialect, bytes), points, max)| {
            let whole = read(framing, dialect, max, &split(&bytes, &[]));
            let cut = read(framing, dialect, max, &split(&bytes, &points));
            prop_assert_eq!(&cut, &whole);
            prop_assert_eq!(whole.output_events, whole.summary.output_events);
            prop_assert_eq!(whole.content, whole.summary.first_content_event.is_some());
            prop_assert!(whole.tokens >= whole.output_events);
            if !whole.dialect.is_known() {
                prop_assert_eq!(&whole.summary, &StreamSummary::default());
                prop_assert!(!whole.expects_end_marker);
            }
            if bytes.len() <= 700 {
                let every: Vec<usize> = (1..bytes.len()).collect();
                let bytewise = read(framing, dialect, max, &split(&bytes, &every));
                prop_assert_eq!(&bytewise, &whole);
            }
            Ok(())
        },
    );
}

/// The proxy's body wrapper with the recorder behind it: every frame reaches the client as it
/// came, in order, whatever the bytes, the status, the content type and the path.
#[test]
fn the_client_receives_exactly_what_the_upstream_sent() {
    let head = (
        proptest::sample::select(vec![
            Some("text/event-stream"),
            Some("text/event-stream; charset=utf-8"),
            Some("application/x-ndjson"),
            Some("application/json"),
            Some("text/plain"),
            None,
        ]),
        proptest::bool::weighted(0.1),
        proptest::sample::select(vec![
            "/v1/chat/completions",
            "/v1/completions",
            "/v1/responses",
            "/v1/messages",
            "/generate_stream",
            "/generate",
            "/api/generate",
            "/api/chat",
            "/completion",
            "/unknown",
        ]),
        proptest::sample::select(vec![200u16, 200, 200, 429, 500, 404]),
    );
    let strategy = (
        case(),
        proptest::collection::vec(any::<usize>(), 0..32),
        head,
        0..LIMITS.len(),
        proptest::sample::select(vec![Ending::Clean, Ending::Broken, Ending::Dropped]),
    );
    run(
        "the_client_receives_exactly_what_the_upstream_sent",
        strategy,
        |((_, _, bytes), points, (content_type, gzip, path, status), limit, ending)| {
            let frames = split(&bytes, &points);
            let got = forward(&frames, path, content_type, gzip, status, limit, ending);
            let sent = match ending {
                Ending::Dropped => &frames[..frames.len() / 2],
                _ => &frames[..],
            };
            prop_assert_eq!(got, sent);
            Ok(())
        },
    );
}

/// How the upstream body ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ending {
    Clean,
    /// The upstream connection breaks after the last frame.
    Broken,
    /// The client goes away halfway through.
    Dropped,
}

/// An upstream body that yields its frames at once, then ends or fails.
struct Scripted {
    frames: VecDeque<Bytes>,
    broken: bool,
}

#[derive(Debug)]
struct Broken;

impl Body for Scripted {
    type Data = Bytes;
    type Error = Broken;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Broken>>> {
        match self.frames.pop_front() {
            Some(bytes) => Poll::Ready(Some(Ok(Frame::data(bytes)))),
            None if self.broken => {
                self.broken = false;
                Poll::Ready(Some(Err(Broken)))
            }
            None => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.frames.is_empty() && !self.broken
    }
}

/// A waker for a body that is always ready: nothing ever needs waking.
struct Never;

impl Wake for Never {
    fn wake(self: Arc<Self>) {}
}

/// One `Meter` per limit, built once: metrics registries are not free, and the cases only add
/// to their counters.
fn meter(limit: usize) -> Arc<Meter> {
    static ALL: OnceLock<Vec<Arc<Meter>>> = OnceLock::new();
    let all = ALL.get_or_init(|| {
        LIMITS
            .iter()
            .map(|&max_event_bytes| Arc::new(Meter::detached(max_event_bytes)))
            .collect()
    });
    all[limit].clone()
}

/// Plays `frames` through a `TimedBody` as the proxy would and returns the data frames the client
/// received, in order.
fn forward(
    frames: &[Bytes],
    path: &str,
    content_type: Option<&'static str>,
    gzip: bool,
    status: u16,
    limit: usize,
    ending: Ending,
) -> Vec<Bytes> {
    let uri: Uri = path.parse().expect("the paths are valid");
    let mut recorder = Recorder::start(meter(limit), &Method::POST, &uri, &HeaderMap::new());
    let mut headers = HeaderMap::new();
    if let Some(ct) = content_type {
        headers.insert(http::header::CONTENT_TYPE, HeaderValue::from_static(ct));
    }
    if gzip {
        headers.insert(
            http::header::CONTENT_ENCODING,
            HeaderValue::from_static("gzip"),
        );
    }
    let status = StatusCode::from_u16(status).expect("the statuses are valid");
    recorder.on_head(status, &headers);
    let upstream = Scripted {
        frames: frames.iter().cloned().collect(),
        broken: ending == Ending::Broken,
    };
    let mut body = Box::pin(TimedBody::new(upstream, recorder, None));
    let waker = Waker::from(Arc::new(Never));
    let mut cx = Context::from_waker(&waker);
    let mut got = Vec::new();
    let keep = match ending {
        Ending::Dropped => frames.len() / 2,
        _ => usize::MAX,
    };
    while got.len() < keep {
        match body.as_mut().poll_frame(&mut cx) {
            Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                Ok(data) => got.push(data),
                Err(_) => panic!("only data frames were sent"),
            },
            Poll::Ready(Some(Err(TimedBodyError::Upstream(Broken)))) => {
                assert_eq!(ending, Ending::Broken);
                break;
            }
            Poll::Ready(Some(Err(TimedBodyError::Idle(_)))) => {
                panic!("no idle timeout was set")
            }
            Poll::Ready(None) => break,
            Poll::Pending => panic!("the scripted body is always ready"),
        }
    }
    // Dropping the body finishes the request (as cancelled when it had not ended).
    drop(body);
    got
}

/// The split helper keeps every byte, in order.
#[test]
fn split_keeps_every_byte() {
    let bytes = b"data: abc\n\n";
    for points in [vec![], vec![3, 1, 3, 100], (0..20).collect()] {
        let frames = split(bytes, &points);
        assert_eq!(frames.concat(), bytes);
        assert!(frames.iter().all(|f| !f.is_empty()));
    }
    assert_eq!(split(b"", &[1, 2]), vec![Bytes::new()]);
}
