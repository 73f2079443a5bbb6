//! The simulator's OpenAI-compatible surface: routing, reading a request, and writing the
//! answer in vLLM's exact shape.
//!
//! A generation request is read (bounded), its prompt tokens estimated, its faults drawn, and
//! handed to the engine. A streamed answer is a body that turns each engine event into one SSE
//! event in its own frame, the moment the engine produces it: for chat a role chunk, one chunk
//! per token, a finish chunk, a usage chunk when `stream_options.include_usage` is true, and
//! `data: [DONE]`; completions the same without the role chunk. Prompt tokens are estimated as
//! `ceil(bytes / 4)` of the prompt text (all message contents for chat; a completions prompt
//! given as token ids counts one per id), at least 1; usage reports exactly that number.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{ready, Context, Poll};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::{header, Method, Request, Response, StatusCode};
use http_body::{Body, Frame, SizeHint};
use http_body_util::{BodyExt, Limited};
use serde::Serialize;
use serde_json::Value;
use tokio::sync::mpsc;

use super::engine::{Event, Fault, Job};
use super::SimConfig;

/// The largest request body read; larger ones get 413.
const MAX_BODY: usize = 4 << 20;
/// The largest `max_tokens` accepted, which bounds each request's event channel.
pub const MAX_OUTPUT_TOKENS: u64 = 65_536;

/// The words generated, in turn; each token is one word with its leading space.
const WORDS: [&str; 16] = [
    " lorem",
    " ipsum",
    " dolor",
    " sit",
    " amet",
    " consectetur",
    " adipiscing",
    " elit",
    " sed",
    " do",
    " eiusmod",
    " tempor",
    " incididunt",
    " ut",
    " labore",
    " magna",
];

/// The text of token `index`.
pub fn token_text(index: u32) -> &'static str {
    WORDS[index as usize % WORDS.len()]
}

/// What every connection shares.
pub(super) struct State {
    pub config: SimConfig,
    pub jobs: mpsc::Sender<Job>,
    pub rng: Mutex<Rng>,
    pub next_id: AtomicU64,
    /// Microseconds every request waits before it is queued; set while running by
    /// [`super::RunningSim::set_extra_delay`].
    pub extra_delay_us: AtomicU64,
    /// The share of requests answered with an error status, as `f64` bits: the configured
    /// `fail_rate` until [`super::RunningSim::set_fail_rate`] changes it.
    pub fail_rate_bits: AtomicU64,
}

/// xorshift64*: small, seeded, so a run's faults reproduce with `--seed`.
pub(super) struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    /// A uniform number in [0, 1).
    fn unit(&mut self) -> f64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// What happens to a request, drawn when it arrives.
enum Fate {
    Fail,
    Run(Option<Fault>),
}

impl State {
    /// Draws every rate for every request, in a fixed order, so the sequence of fates depends
    /// only on the seed and the order of arrival.
    fn draw(&self) -> Fate {
        let mut rng = self.rng.lock().unwrap_or_else(|e| e.into_inner());
        let c = &self.config;
        let fail = rng.unit() < f64::from_bits(self.fail_rate_bits.load(Ordering::Relaxed));
        let midstream = rng.unit() < c.midstream_fail_rate;
        let drop = rng.unit() < c.drop_rate;
        let stall = rng.unit() < c.stall_rate;
        if fail {
            Fate::Fail
        } else if midstream {
            Fate::Run(Some(Fault::MidstreamError))
        } else if drop {
            Fate::Run(Some(Fault::Drop))
        } else if stall {
            Fate::Run(Some(Fault::Stall))
        } else {
            Fate::Run(None)
        }
    }
}

/// Answers one request.
pub(super) async fn handle<B>(
    request: Request<B>,
    state: Arc<State>,
) -> Result<Response<SimBody>, Infallible>
where
    B: Body<Data = Bytes>,
    B::Error: std::error::Error + Send + Sync + 'static,
{
    let (parts, body) = request.into_parts();
    let kind = match parts.uri.path() {
        "/health" if parts.method == Method::GET => {
            return Ok(whole(StatusCode::OK, "text/plain", Bytes::new()))
        }
        "/v1/models" if parts.method == Method::GET => return Ok(models(&state.config)),
        "/v1/chat/completions" if parts.method == Method::POST => Kind::Chat,
        "/v1/completions" if parts.method == Method::POST => Kind::Completion,
        "/health" | "/v1/models" | "/v1/chat/completions" | "/v1/completions" => {
            return Ok(error(StatusCode::METHOD_NOT_ALLOWED, "method not allowed"))
        }
        path => {
            return Ok(error(
                StatusCode::NOT_FOUND,
                &format!("no route for {path}"),
            ))
        }
    };
    Ok(generate(kind, body, &state).await)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Chat,
    Completion,
}

/// What a generation request asked for.
struct Ask {
    prompt_tokens: u32,
    max_tokens: u32,
    /// `length` when the client's `max_tokens` ended it; `stop` when the default did, as if the
    /// model had ended on its own.
    finish_reason: &'static str,
    stream: bool,
    include_usage: bool,
}

async fn generate<B>(kind: Kind, body: B, state: &State) -> Response<SimBody>
where
    B: Body<Data = Bytes>,
    B::Error: std::error::Error + Send + Sync + 'static,
{
    let bytes = match Limited::new(body, MAX_BODY).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(e) => {
            return error(
                StatusCode::PAYLOAD_TOO_LARGE,
                &format!("cannot read the request body: {e}"),
            )
        }
    };
    let ask = match parse(kind, &bytes, state.config.default_max_tokens) {
        Ok(ask) => ask,
        Err(message) => return error(StatusCode::BAD_REQUEST, &message),
    };
    let fault = match state.draw() {
        Fate::Fail => {
            let status = StatusCode::from_u16(state.config.fail_status)
                .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            return error(status, "injected failure (--fail-rate)");
        }
        Fate::Run(fault) => fault,
    };
    // Before the engine sees the request, so the batch's timing stays the engine's own.
    let extra = state.extra_delay_us.load(Ordering::Relaxed);
    if extra > 0 {
        tokio::time::sleep(Duration::from_micros(extra)).await;
    }
    let (job, mut events) = Job::new(ask.prompt_tokens, ask.max_tokens, fault);
    match state.jobs.try_send(job) {
        Ok(()) => {}
        Err(mpsc::error::TrySendError::Full(_)) => {
            return error(StatusCode::TOO_MANY_REQUESTS, "the queue is full")
        }
        Err(mpsc::error::TrySendError::Closed(_)) => {
            return error(StatusCode::SERVICE_UNAVAILABLE, "the engine has stopped")
        }
    }
    let n = state.next_id.fetch_add(1, Ordering::Relaxed);
    let reply = Reply {
        kind,
        id: match kind {
            Kind::Chat => format!("chatcmpl-sim-{n}"),
            Kind::Completion => format!("cmpl-sim-{n}"),
        },
        created: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
        model: state.config.model.clone(),
        prompt_tokens: ask.prompt_tokens,
        finish_reason: ask.finish_reason,
        include_usage: ask.include_usage,
    };
    if ask.stream {
        let mut out = VecDeque::with_capacity(4);
        if kind == Kind::Chat {
            out.push_back(reply.sse(&reply.chat_chunk(Some("assistant"), Some(""), None)));
        }
        let body = SimBody(Inner::Stream(Box::new(EventStream {
            reply,
            events,
            out,
            emitted: 0,
            ended: false,
        })));
        return Response::builder()
            .status(StatusCode::OK)
            .header(header::CONTENT_TYPE, "text/event-stream")
            .header(header::CACHE_CONTROL, "no-cache")
            .body(body)
            .unwrap_or_else(|_| internal());
    }
    // Not streamed: wait for the whole generation. If the client goes away meanwhile, hyper
    // drops this future and with it the receiver, which frees the slot.
    let mut text = String::new();
    let mut completion_tokens = 0;
    loop {
        match events.recv().await {
            Some(Event::Token(i)) => {
                text.push_str(token_text(i));
                completion_tokens += 1;
            }
            Some(Event::Done) => break,
            Some(Event::Failed) => {
                return error(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "injected failure during generation (--midstream-fail-rate)",
                )
            }
            Some(Event::Dropped) | None => {
                return Response::builder()
                    .status(StatusCode::OK)
                    .header(header::CONTENT_TYPE, "application/json")
                    .body(SimBody(Inner::Broken))
                    .unwrap_or_else(|_| internal())
            }
        }
    }
    let usage = Usage::new(reply.prompt_tokens, completion_tokens);
    let json = match kind {
        Kind::Chat => serde_json::to_vec(&Whole {
            id: &reply.id,
            object: "chat.completion",
            created: reply.created,
            model: &reply.model,
            choices: [ChatChoice {
                index: 0,
                message: Message {
                    role: "assistant",
                    content: &text,
                },
                logprobs: None,
                finish_reason: reply.finish_reason,
            }],
            usage,
        }),
        Kind::Completion => serde_json::to_vec(&Whole {
            id: &reply.id,
            object: "text_completion",
            created: reply.created,
            model: &reply.model,
            choices: [TextChoice {
                index: 0,
                text: &text,
                logprobs: None,
                finish_reason: Some(reply.finish_reason),
            }],
            usage,
        }),
    };
    whole(
        StatusCode::OK,
        "application/json",
        Bytes::from(json.unwrap_or_default()),
    )
}

/// Reads what the simulator needs from a request body.
fn parse(kind: Kind, bytes: &[u8], default_max_tokens: u32) -> Result<Ask, String> {
    let request: Value =
        serde_json::from_slice(bytes).map_err(|e| format!("the request body is not JSON: {e}"))?;
    let request = request
        .as_object()
        .ok_or("the request body is not a JSON object")?;
    let prompt_bytes_or_ids = match kind {
        Kind::Chat => {
            let messages = request
                .get("messages")
                .and_then(Value::as_array)
                .ok_or("`messages` is required and must be an array")?;
            let mut bytes = 0usize;
            for message in messages {
                bytes += content_bytes(message.get("content").unwrap_or(&Value::Null));
            }
            (bytes, 0usize)
        }
        Kind::Completion => match request.get("prompt") {
            Some(Value::String(s)) => (s.len(), 0),
            Some(Value::Array(items)) => items.iter().fold((0, 0), |(b, ids), item| match item {
                Value::String(s) => (b + s.len(), ids),
                Value::Number(_) => (b, ids + 1),
                _ => (b, ids),
            }),
            _ => return Err("`prompt` is required and must be a string or an array".into()),
        },
    };
    let (bytes, ids) = prompt_bytes_or_ids;
    let prompt_tokens = u32::try_from(bytes.div_ceil(4) + ids)
        .unwrap_or(u32::MAX)
        .max(1);
    let asked = match request
        .get("max_completion_tokens")
        .filter(|v| !v.is_null())
        .or_else(|| request.get("max_tokens").filter(|v| !v.is_null()))
    {
        None => None,
        Some(v) => match v.as_u64() {
            Some(n) if (1..=MAX_OUTPUT_TOKENS).contains(&n) => Some(n as u32),
            _ => {
                return Err(format!(
                    "`max_tokens` must be an integer from 1 to {MAX_OUTPUT_TOKENS}"
                ))
            }
        },
    };
    let (max_tokens, finish_reason) = match asked {
        Some(n) => (n, "length"),
        None => (default_max_tokens.max(1), "stop"),
    };
    Ok(Ask {
        prompt_tokens,
        max_tokens,
        finish_reason,
        stream: request
            .get("stream")
            .and_then(Value::as_bool)
            .unwrap_or(false),
        include_usage: request
            .get("stream_options")
            .and_then(|o| o.get("include_usage"))
            .and_then(Value::as_bool)
            .unwrap_or(false),
    })
}

/// The bytes of text in a message's content: a string, or the `text` of its parts.
fn content_bytes(content: &Value) -> usize {
    match content {
        Value::String(s) => s.len(),
        Value::Array(parts) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .map(str::len)
            .sum(),
        _ => 0,
    }
}

/// What a response carries on every chunk.
struct Reply {
    kind: Kind,
    id: String,
    created: u64,
    model: String,
    prompt_tokens: u32,
    finish_reason: &'static str,
    include_usage: bool,
}

#[derive(Serialize)]
struct Chunk<'a, C> {
    id: &'a str,
    object: &'static str,
    created: u64,
    model: &'a str,
    choices: C,
    #[serde(skip_serializing_if = "Option::is_none")]
    usage: Option<Usage>,
}

#[derive(Serialize)]
struct DeltaChoice<'a> {
    index: u32,
    delta: Delta<'a>,
    logprobs: Option<()>,
    finish_reason: Option<&'a str>,
}

#[derive(Serialize)]
struct Delta<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    role: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    content: Option<&'a str>,
}

#[derive(Serialize)]
struct TextChoice<'a> {
    index: u32,
    text: &'a str,
    logprobs: Option<()>,
    finish_reason: Option<&'a str>,
}

#[derive(Serialize)]
struct Whole<'a, C> {
    id: &'a str,
    object: &'static str,
    created: u64,
    model: &'a str,
    choices: C,
    usage: Usage,
}

#[derive(Serialize)]
struct ChatChoice<'a> {
    index: u32,
    message: Message<'a>,
    logprobs: Option<()>,
    finish_reason: &'a str,
}

#[derive(Serialize)]
struct Message<'a> {
    role: &'static str,
    content: &'a str,
}

#[derive(Serialize, Clone, Copy)]
struct Usage {
    prompt_tokens: u32,
    completion_tokens: u32,
    total_tokens: u32,
}

impl Usage {
    fn new(prompt_tokens: u32, completion_tokens: u32) -> Usage {
        Usage {
            prompt_tokens,
            completion_tokens,
            total_tokens: prompt_tokens.saturating_add(completion_tokens),
        }
    }
}

impl Reply {
    fn object(&self) -> &'static str {
        match self.kind {
            Kind::Chat => "chat.completion.chunk",
            Kind::Completion => "text_completion",
        }
    }

    fn chunk<C: Serialize>(&self, choices: C, usage: Option<Usage>) -> Chunk<'_, C> {
        Chunk {
            id: &self.id,
            object: self.object(),
            created: self.created,
            model: &self.model,
            choices,
            usage,
        }
    }

    fn chat_chunk(
        &self,
        role: Option<&str>,
        content: Option<&str>,
        finish_reason: Option<&str>,
    ) -> Vec<u8> {
        let choice = DeltaChoice {
            index: 0,
            delta: Delta { role, content },
            logprobs: None,
            finish_reason,
        };
        serde_json::to_vec(&self.chunk([choice], None)).unwrap_or_default()
    }

    fn text_chunk(&self, text: &str, finish_reason: Option<&str>) -> Vec<u8> {
        let choice = TextChoice {
            index: 0,
            text,
            logprobs: None,
            finish_reason,
        };
        serde_json::to_vec(&self.chunk([choice], None)).unwrap_or_default()
    }

    fn token(&self, index: u32) -> Bytes {
        let text = token_text(index);
        self.sse(&match self.kind {
            Kind::Chat => self.chat_chunk(None, Some(text), None),
            Kind::Completion => self.text_chunk(text, None),
        })
    }

    fn finish(&self) -> Bytes {
        self.sse(&match self.kind {
            Kind::Chat => self.chat_chunk(None, None, Some(self.finish_reason)),
            Kind::Completion => self.text_chunk("", Some(self.finish_reason)),
        })
    }

    fn usage(&self, completion_tokens: u32) -> Bytes {
        let usage = Usage::new(self.prompt_tokens, completion_tokens);
        let empty: [(); 0] = [];
        self.sse(&serde_json::to_vec(&self.chunk(empty, Some(usage))).unwrap_or_default())
    }

    fn sse(&self, json: &[u8]) -> Bytes {
        let mut out = Vec::with_capacity(json.len() + 8);
        out.extend_from_slice(b"data: ");
        out.extend_from_slice(json);
        out.extend_from_slice(b"\n\n");
        Bytes::from(out)
    }
}

/// A response body: whole, streamed from the engine, or broken on purpose.
pub struct SimBody(Inner);

enum Inner {
    Whole(Option<Bytes>),
    Stream(Box<EventStream>),
    /// Fails at once, so hyper closes the connection without ending the body.
    Broken,
    Failed,
}

/// A streamed answer: each engine event becomes SSE events, one per frame.
struct EventStream {
    reply: Reply,
    events: mpsc::Receiver<Event>,
    /// Events made but not yet handed on: at most the ending's three.
    out: VecDeque<Bytes>,
    emitted: u32,
    ended: bool,
}

fn dropped() -> io::Error {
    io::Error::new(
        io::ErrorKind::ConnectionAborted,
        "injected connection drop (--drop-rate)",
    )
}

impl Body for SimBody {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        let this = self.get_mut();
        match &mut this.0 {
            Inner::Whole(bytes) => Poll::Ready(bytes.take().map(|b| Ok(Frame::data(b)))),
            Inner::Broken => {
                this.0 = Inner::Failed;
                Poll::Ready(Some(Err(dropped())))
            }
            Inner::Failed => Poll::Ready(None),
            Inner::Stream(s) => loop {
                if let Some(bytes) = s.out.pop_front() {
                    return Poll::Ready(Some(Ok(Frame::data(bytes))));
                }
                if s.ended {
                    return Poll::Ready(None);
                }
                match ready!(s.events.poll_recv(cx)) {
                    Some(Event::Token(i)) => {
                        s.out.push_back(s.reply.token(i));
                        s.emitted += 1;
                    }
                    Some(Event::Done) => {
                        s.out.push_back(s.reply.finish());
                        if s.reply.include_usage {
                            s.out.push_back(s.reply.usage(s.emitted));
                        }
                        s.out.push_back(Bytes::from_static(b"data: [DONE]\n\n"));
                        s.ended = true;
                    }
                    Some(Event::Failed) => {
                        // vLLM's mid-stream error: an error event, then [DONE].
                        let json = serde_json::to_vec(&error_json(
                            StatusCode::INTERNAL_SERVER_ERROR,
                            "injected failure during generation (--midstream-fail-rate)",
                        ))
                        .unwrap_or_default();
                        s.out.push_back(s.reply.sse(&json));
                        s.out.push_back(Bytes::from_static(b"data: [DONE]\n\n"));
                        s.ended = true;
                    }
                    Some(Event::Dropped) | None => {
                        this.0 = Inner::Failed;
                        return Poll::Ready(Some(Err(dropped())));
                    }
                }
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.0 {
            Inner::Whole(bytes) => bytes.is_none(),
            Inner::Failed => true,
            _ => false,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.0 {
            Inner::Whole(Some(bytes)) => SizeHint::with_exact(bytes.len() as u64),
            Inner::Whole(None) => SizeHint::with_exact(0),
            _ => SizeHint::default(),
        }
    }
}

fn whole(status: StatusCode, content_type: &str, body: Bytes) -> Response<SimBody> {
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, content_type)
        .body(SimBody(Inner::Whole(Some(body))))
        .unwrap_or_else(|_| internal())
}

fn internal() -> Response<SimBody> {
    let mut response = Response::new(SimBody(Inner::Whole(None)));
    *response.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
    response
}

/// An OpenAI-style error object, as vLLM writes it.
fn error_json(status: StatusCode, message: &str) -> Value {
    let kind = match status.as_u16() {
        400 => "BadRequestError",
        404 => "NotFoundError",
        405 => "MethodNotAllowedError",
        413 => "RequestTooLargeError",
        429 => "RateLimitError",
        503 => "ServiceUnavailableError",
        _ => "InternalServerError",
    };
    serde_json::json!({
        "error": {
            "object": "error",
            "message": message,
            "type": kind,
            "param": null,
            "code": status.as_u16(),
        }
    })
}

fn error(status: StatusCode, message: &str) -> Response<SimBody> {
    let json = serde_json::to_vec(&error_json(status, message)).unwrap_or_default();
    whole(status, "application/json", Bytes::from(json))
}

fn models(config: &SimConfig) -> Response<SimBody> {
    let json = serde_json::json!({
        "object": "list",
        "data": [{
            "id": config.model,
            "object": "model",
            "created": 0,
            "owned_by": "tokenmeter-sim",
        }]
    });
    whole(
        StatusCode::OK,
        "application/json",
        Bytes::from(serde_json::to_vec(&json).unwrap_or_default()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompt_tokens_are_a_quarter_of_the_bytes_rounded_up() {
        let body = br#"{"messages":[{"role":"user","content":"12345"},{"role":"user","content":[{"type":"text","text":"abc"}]}]}"#;
        let ask = parse(Kind::Chat, body, 64).map_err(|e| e.to_string());
        assert_eq!(ask.as_ref().map(|a| a.prompt_tokens), Ok(2));
        let ask = parse(
            Kind::Completion,
            br#"{"prompt":[1,2,3],"max_tokens":5}"#,
            64,
        );
        let ask = ask.map_err(|e| e.to_string());
        assert_eq!(
            ask.map(|a| (a.prompt_tokens, a.max_tokens, a.finish_reason)),
            Ok((3, 5, "length"))
        );
    }

    #[test]
    fn bad_requests_are_refused_with_a_reason() {
        assert!(parse(Kind::Chat, b"nope", 64).is_err());
        assert!(parse(Kind::Chat, br#"{"prompt":"x"}"#, 64).is_err());
        assert!(parse(Kind::Completion, br#"{"prompt":"x","max_tokens":0}"#, 64).is_err());
        assert!(parse(Kind::Completion, br#"{"prompt":"x","max_tokens":1e9}"#, 64).is_err());
    }
}
