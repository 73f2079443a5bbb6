//! One bench request, timed from just before it is sent to the end of its body.
//!
//! The body goes through the proxy's [`StreamReader`], and a frame is timestamped when it is
//! ready, so TTFT, ITL and TPOT here mean what they mean in the proxy's metrics.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use tokio::time::Instant;

use crate::{Dialect, Framing, StreamReader};

/// The client every worker shares (one connection pool).
pub type HttpClient = Client<HttpConnector, Full<Bytes>>;

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
    let mut request = http::Request::new(body);
    *request.method_mut() = http::Method::POST;
    *request.uri_mut() = uri.clone();
    request.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    request.headers_mut().insert(
        http::header::ACCEPT,
        http::HeaderValue::from_static("text/event-stream"),
    );
    request
}

/// Sends `request` and reads its whole response, abandoning it after `timeout`.
pub async fn send(
    client: &HttpClient,
    request: http::Request<Full<Bytes>>,
    timeout: Duration,
) -> Record {
    let started = Instant::now();
    let mut timing = Timing::new(started);
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
    reader: StreamReader,
    status: u16,
    first: Option<Instant>,
    last: Option<Instant>,
    itl: Vec<Duration>,
    max_itl: Duration,
    event_tokens: u64,
}

impl Timing {
    fn new(started: Instant) -> Timing {
        Timing {
            started,
            reader: StreamReader::new(Framing::Sse, Dialect::OpenAiChat, MAX_EVENT_BYTES),
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
