//! One bench request, timed from just before it is sent to the end of its body.
//!
//! The body goes through the proxy's [`StreamReader`], and a frame is timestamped when it is
//! ready, so TTFT, ITL and TPOT here mean what they mean in the proxy's metrics.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use tokio::time::Instant;

use crate::{Dialect, Framing, StreamReader};

/// The client every worker shares (one connection pool), for http:// and https:// alike.
pub type HttpClient = Client<HttpsConnector<HttpConnector>, Full<Bytes>>;

/// The API a request speaks, and whether its answer streams.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Api {
    pub endpoint: Endpoint,
    /// `false` with `--no-stream`: one JSON body, whose first token is seen only when it has
    /// arrived whole, so TTFT is the time to the end of the body and TPOT and ITL are unknown.
    pub stream: bool,
}

impl Default for Api {
    fn default() -> Self {
        Api {
            endpoint: Endpoint::Chat,
            stream: true,
        }
    }
}

/// OpenAI's chat completions or legacy completions endpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Endpoint {
    /// `/v1/chat/completions`: `messages` in, `delta.content` out.
    Chat,
    /// `/v1/completions`: `prompt` in, `text` out.
    Completions,
}

impl Endpoint {
    /// The path a bare server address gets.
    pub fn path(self) -> &'static str {
        match self {
            Endpoint::Chat => "/v1/chat/completions",
            Endpoint::Completions => "/v1/completions",
        }
    }

    /// The endpoint a URL's path names: `/completions` not under `/chat/` is the legacy one;
    /// anything else is taken as chat.
    pub fn of_path(path: &str) -> Endpoint {
        let path = path.trim_end_matches('/');
        if path.ends_with("/completions") && !path.ends_with("/chat/completions") {
            Endpoint::Completions
        } else {
            Endpoint::Chat
        }
    }

    fn dialect(self) -> Dialect {
        match self {
            Endpoint::Chat => Dialect::OpenAiChat,
            Endpoint::Completions => Dialect::OpenAiCompletions,
        }
    }
}

/// The largest SSE event the reader parses; bigger ones are counted, not parsed.
const MAX_EVENT_BYTES: usize = 1 << 20;

/// The most ITL gaps one request keeps, so memory is bounded whatever the server sends.
pub const MAX_GAPS: usize = 65_536;

/// Where the output token count came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenSource {
    /// The stream's own final usage.
    Usage,
    /// Counted from output events (one per event unless cumulative usage said otherwise).
    Events,
}

impl TokenSource {
    pub fn as_str(self) -> &'static str {
        match self {
            TokenSource::Usage => "usage",
            TokenSource::Events => "events",
        }
    }
}

/// Which server a request went to: `--url` (A) or `--compare` (B).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Target {
    #[default]
    A,
    B,
}

impl Target {
    pub fn as_str(self) -> &'static str {
        match self {
            Target::A => "A",
            Target::B => "B",
        }
    }
}

/// What one request measured.
#[derive(Clone, Debug, PartialEq)]
pub struct Record {
    /// The request's index within its level (and target): the same index is the same request.
    pub request_id: u32,
    /// Closed loop: the level's concurrency. Open loop: the requests in flight (this one
    /// included) when it was sent.
    pub concurrency: u32,
    /// The offered rate of its level (requests/s), for an open-loop level.
    pub rate: Option<f64>,
    pub target: Target,
    /// The `max_tokens` it asked for.
    pub max_tokens: u32,
    /// When it was sent, from the start of its level.
    pub start: Duration,
    /// The prompt tokens the server reported, if it did.
    pub prompt_tokens: Option<u64>,
    pub output_tokens: u64,
    pub token_source: TokenSource,
    pub ttft: Option<Duration>,
    /// `None` with fewer than two output tokens or no output.
    pub tpot: Option<Duration>,
    pub e2e: Duration,
    /// Gaps between consecutive output-bearing frames (at most [`MAX_GAPS`] of them).
    pub itl: Vec<Duration>,
    /// The largest gap, even past the cap; `None` with fewer than two output frames.
    pub max_itl: Option<Duration>,
    /// The HTTP status; 0 when no response arrived.
    pub status: u16,
    /// Why the request failed; `None` when it succeeded.
    pub error: Option<String>,
}

/// A streamed chat completions POST of `body` to `uri`.
pub fn build(uri: &http::Uri, body: Full<Bytes>) -> http::Request<Full<Bytes>> {
    build_with(uri, body, Api::default(), &http::HeaderMap::new())
}

/// A POST of `body` to `uri` for `api`, with `extra` headers (`--header`) added last: one
/// that names `Content-Type` or `Accept` replaces bench's own.
pub fn build_with(
    uri: &http::Uri,
    body: Full<Bytes>,
    api: Api,
    extra: &http::HeaderMap,
) -> http::Request<Full<Bytes>> {
    let mut request = http::Request::new(body);
    *request.method_mut() = http::Method::POST;
    *request.uri_mut() = uri.clone();
    let headers = request.headers_mut();
    headers.insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    headers.insert(
        http::header::ACCEPT,
        http::HeaderValue::from_static(if api.stream {
            "text/event-stream"
        } else {
            "application/json"
        }),
    );
    for name in extra.keys() {
        headers.remove(name);
    }
    for (name, value) in extra {
        headers.append(name, value.clone());
    }
    request
}

/// Sends `request` and reads its whole response, abandoning it after `timeout`.
pub async fn send(
    client: &HttpClient,
    request: http::Request<Full<Bytes>>,
    timeout: Duration,
) -> Record {
    send_with(client, request, Api::default(), timeout).await
}

/// [`send`] for `api`: the body is read as SSE, or as one JSON document with `--no-stream`.
pub async fn send_with(
    client: &HttpClient,
    request: http::Request<Full<Bytes>>,
    api: Api,
    timeout: Duration,
) -> Record {
    let started = Instant::now();
    let mut timing = Timing::new(started, api);
    let outcome = tokio::time::timeout(timeout, exchange(client, request, &mut timing)).await;
    let e2e = started.elapsed();
    let error = match outcome {
        Ok(Ok(())) => timing.stream_error(),
        Ok(Err(e)) => Some(e),
        Err(_) => Some(format!(
            "timed out after {}",
            humantime::format_duration(timeout)
        )),
    };
    timing.into_record(e2e, error)
}

/// The request's clock and the reader of its body.
struct Timing {
    started: Instant,
    stream: bool,
    reader: StreamReader,
    status: u16,
    first: Option<Instant>,
    last: Option<Instant>,
    itl: Vec<Duration>,
    max_itl: Duration,
    event_tokens: u64,
}

impl Timing {
    fn new(started: Instant, api: Api) -> Timing {
        let framing = if api.stream {
            Framing::Sse
        } else {
            Framing::Json
        };
        Timing {
            started,
            stream: api.stream,
            reader: StreamReader::new(framing, api.endpoint.dialect(), MAX_EVENT_BYTES),
            status: 0,
            first: None,
            last: None,
            itl: Vec::new(),
            max_itl: Duration::ZERO,
            event_tokens: 0,
        }
    }

    /// Notes what a frame (or the end of the body) carried, at `now`.
    fn observe(&mut self, events: crate::FrameEvents, now: Instant) {
        if events.output_events == 0 {
            return;
        }
        self.event_tokens += u64::from(events.tokens);
        if self.first.is_none() {
            self.first = Some(now);
        }
        if let Some(last) = self.last {
            let gap = now - last;
            self.max_itl = self.max_itl.max(gap);
            // A server can send any number of events; past the cap only the maximum is kept.
            if self.itl.len() < MAX_GAPS {
                self.itl.push(gap);
            }
        }
        self.last = Some(now);
    }

    /// An error the stream itself carried, judged once the body ended cleanly.
    fn stream_error(&self) -> Option<String> {
        let summary = self.reader.summary();
        if summary.error {
            Some("the stream carried an error event".into())
        } else if !self.stream {
            // One JSON document has no end marker; a body cut short does not parse, and so
            // carries no output.
            (summary.output_events == 0).then(|| "the response body held no completion".to_string())
        } else if !summary.end_marker {
            Some("the stream ended without [DONE]".into())
        } else {
            None
        }
    }

    fn into_record(self, e2e: Duration, error: Option<String>) -> Record {
        let summary = self.reader.summary();
        let (output_tokens, token_source) = match summary.usage_output_tokens {
            Some(n) => (n, TokenSource::Usage),
            None => (self.event_tokens, TokenSource::Events),
        };
        let tpot = match (self.first, self.last) {
            // A whole body at once says nothing about the pace of its tokens.
            _ if !self.stream => None,
            (Some(first), Some(last)) if output_tokens > 1 => {
                let divisor = u32::try_from(output_tokens - 1).unwrap_or(u32::MAX);
                Some((last - first) / divisor)
            }
            _ => None,
        };
        Record {
            request_id: 0,
            concurrency: 0,
            rate: None,
            target: Target::A,
            max_tokens: 0,
            start: Duration::ZERO,
            prompt_tokens: summary.usage_prompt_tokens,
            output_tokens,
            token_source,
            ttft: self.first.map(|t| t - self.started),
            tpot,
            e2e,
            max_itl: (!self.itl.is_empty()).then_some(self.max_itl),
            itl: self.itl,
            status: self.status,
            error,
        }
    }
}

/// Why a request got no response, worded so that [`cause`] can group it: `connection
/// refused: ..`, `connect failed: ..` (DNS, TLS, unreachable) or `request failed: ..` (the
/// connection broke while sending or before the response head).
fn sending_error(e: &hyper_util::client::legacy::Error) -> String {
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(e);
    let mut refused = false;
    let mut detail = e.to_string();
    while let Some(s) = source {
        if let Some(io) = s.downcast_ref::<std::io::Error>() {
            refused |= io.kind() == std::io::ErrorKind::ConnectionRefused;
        }
        detail = s.to_string();
        source = s.source();
    }
    if refused {
        format!("connection refused: {detail}")
    } else if e.is_connect() {
        format!("connect failed: {detail}")
    } else {
        format!("request failed: {detail}")
    }
}

/// The cause of a failed request, for the error summary: the words before the first `:` of
/// its error (see [`sending_error`]), `HTTP status N`, `timeout`, or the stream's own failure.
pub fn cause(record: &Record) -> Option<String> {
    let error = record.error.as_deref()?;
    Some(if error.starts_with("status ") {
        format!("HTTP status {}", record.status)
    } else if error.starts_with("timed out") {
        "timeout".into()
    } else if error.starts_with("body failed") {
        "broken stream".into()
    } else if let Some((head, _)) = error.split_once(':') {
        head.to_string()
    } else {
        error.to_string()
    })
}

async fn exchange(
    client: &HttpClient,
    request: http::Request<Full<Bytes>>,
    timing: &mut Timing,
) -> Result<(), String> {
    let response = client
        .request(request)
        .await
        .map_err(|e| sending_error(&e))?;
    timing.status = response.status().as_u16();
    if !response.status().is_success() {
        // The error body is not read: it says nothing bench reports, and it may be large.
        return Err(format!("status {}", response.status().as_u16()));
    }
    let mut body = response.into_body();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| format!("body failed: {e}"))?;
        if let Some(data) = frame.data_ref() {
            let now = Instant::now();
            let events = timing.reader.feed(data);
            timing.observe(events, now);
        }
    }
    let events = timing.reader.finish();
    timing.observe(events, Instant::now());
    Ok(())
}
