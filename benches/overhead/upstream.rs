//! The overhead bench's mock upstream: a paced chat completions endpoint in the bench's own
//! process, streaming small OpenAI chat chunks the way vLLM spaces them.
//!
//! Each request says what it wants, so the mock keeps no state between levels: `max_tokens` in
//! the body is how many token chunks to send and the `x-bench-interval-us` header is the gap
//! between them. Every token chunk carries the time it was handed to hyper (`sent_ns`, since the
//! bench's epoch), so the client can tell per-event latency with the one clock of this process.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderValue, CACHE_CONTROL, CONTENT_TYPE};
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Either, Full};
use hyper::body::{Body, Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use memchr::memmem;
use tokio::net::TcpListener;
use tokio::time::{Instant, Sleep};

/// The request header that sets the gap between token chunks, in microseconds.
pub(crate) const INTERVAL_HEADER: &str = "x-bench-interval-us";

/// The key under which the upstream writes its send time into each token chunk.
pub(crate) const SENT_KEY: &[u8] = b"\"sent_ns\":";

/// SSE events per stream besides the tokens: role, finish, usage and `[DONE]`.
pub(crate) const FRAMING_EVENTS: usize = 4;

/// The running upstream: where it listens, and how many connections it has accepted, so that
/// a way that keeps reconnecting shows.
pub(crate) struct Upstream {
    pub(crate) addr: SocketAddr,
    accepted: Arc<AtomicU64>,
}

impl Upstream {
    /// Serves `POST /v1/chat/completions` on 127.0.0.1:0 over HTTP/1.1.
    pub(crate) async fn start(epoch: Instant) -> Result<Upstream, String> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| format!("cannot bind the upstream: {e}"))?;
        let addr = listener
            .local_addr()
            .map_err(|e| format!("upstream address: {e}"))?;
        let accepted = Arc::new(AtomicU64::new(0));
        let count = accepted.clone();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                count.fetch_add(1, Ordering::Relaxed);
                // Each token must leave as its own segment, as it does from a real model server.
                let _ = stream.set_nodelay(true);
                tokio::spawn(async move {
                    let service =
                        service_fn(move |request: Request<Incoming>| answer(request, epoch));
                    // hyper's 30 s header-read timeout also closes idle keep-alive
                    // connections, racing a pool that picks one just then: a failed stream
                    // that says nothing about the proxy. Connections to the mock stay open.
                    let _ = hyper::server::conn::http1::Builder::new()
                        .timer(TokioTimer::new())
                        .header_read_timeout(None)
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Ok(Upstream { addr, accepted })
    }

    pub(crate) fn accepted(&self) -> u64 {
        self.accepted.load(Ordering::Relaxed)
    }
}

type UpstreamBody = Either<TokenStream, Full<Bytes>>;

async fn answer(
    request: Request<Incoming>,
    epoch: Instant,
) -> Result<Response<UpstreamBody>, Infallible> {
    if request.method() != Method::POST || request.uri().path() != "/v1/chat/completions" {
        return Ok(plain(StatusCode::NOT_FOUND));
    }
    let interval_us = request
        .headers()
        .get(INTERVAL_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(20_000)
        .clamp(100, 1_000_000);
    // A model server reads the whole request before it answers.
    let Ok(body) = request.into_body().collect().await else {
        return Ok(plain(StatusCode::BAD_REQUEST));
    };
    let tokens = max_tokens(&body.to_bytes()).unwrap_or(64).clamp(1, 100_000);
    let stream = TokenStream::new(epoch, tokens, Duration::from_micros(interval_us));
    let mut response = Response::new(Either::Left(stream));
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    Ok(response)
}

/// The number after `"max_tokens":` in a request body the bench wrote itself.
fn max_tokens(body: &[u8]) -> Option<usize> {
    const KEY: &[u8] = b"\"max_tokens\":";
    let at = memmem::find(body, KEY)? + KEY.len();
    let digits = &body[at..];
    let len = digits.iter().take_while(|b| b.is_ascii_digit()).count();
    std::str::from_utf8(&digits[..len]).ok()?.parse().ok()
}

fn plain(status: StatusCode) -> Response<UpstreamBody> {
    let mut response = Response::new(Either::Right(Full::new(Bytes::new())));
    *response.status_mut() = status;
    response
}

/// A chat completion stream as vLLM sends it, with every field tokenmeter does not read left
/// out so each event is small: a role chunk, then one chunk per token, a finish chunk, a usage
/// chunk and `data: [DONE]`, each its own body frame.
///
/// The first token follows the role chunk at once (prefill costs nothing here), so TTFT holds no
/// timer jitter, only the ways. Each later token waits `interval` after the one before it, so
/// tokens leave in separate writes.
struct TokenStream {
    epoch: Instant,
    tokens: usize,
    interval: Duration,
    next: Next,
    due: Pin<Box<Sleep>>,
}

#[derive(Clone, Copy)]
enum Next {
    Role,
    Token(usize),
    Finish,
    Usage,
    Done,
    End,
}

impl TokenStream {
    fn new(epoch: Instant, tokens: usize, interval: Duration) -> Self {
        TokenStream {
            epoch,
            tokens,
            interval,
            next: Next::Role,
            due: Box::pin(tokio::time::sleep(Duration::ZERO)),
        }
    }
}

impl Body for TokenStream {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = self.get_mut();
        let chunk = match this.next {
            Next::Role => {
                this.next = Next::Token(0);
                Bytes::from_static(
                    b"data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n",
                )
            }
            Next::Token(i) => {
                if i > 0 {
                    ready!(this.due.as_mut().poll(cx));
                }
                // Stamped when ready, never on Pending: this is the frame hyper writes next.
                let now = Instant::now();
                // The next token is due one interval after this one was due, not after it was
                // sent: tokio's timer fires up to a millisecond late, and that lateness must not
                // pile up into a slower stream. One that fell a whole interval behind restarts.
                let on_schedule = this.due.deadline() + this.interval;
                let next = if i > 0 && on_schedule > now {
                    on_schedule
                } else {
                    now + this.interval
                };
                this.due.as_mut().reset(next);
                this.next = if i + 1 == this.tokens {
                    Next::Finish
                } else {
                    Next::Token(i + 1)
                };
                Bytes::from(format!(
                    "data: {{\"choices\":[{{\"delta\":{{\"content\":\" t{i}\"}}}}],\"sent_ns\":{}}}\n\n",
                    (now - this.epoch).as_nanos()
                ))
            }
            Next::Finish => {
                this.next = Next::Usage;
                Bytes::from_static(
                    b"data: {\"choices\":[{\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n",
                )
            }
            Next::Usage => {
                this.next = Next::Done;
                Bytes::from(format!(
                    "data: {{\"choices\":[],\"usage\":{{\"prompt_tokens\":12,\"completion_tokens\":{}}}}}\n\n",
                    this.tokens
                ))
            }
            Next::Done => {
                this.next = Next::End;
                Bytes::from_static(b"data: [DONE]\n\n")
            }
            Next::End => return Poll::Ready(None),
        };
        Poll::Ready(Some(Ok(Frame::data(chunk))))
    }

    fn is_end_stream(&self) -> bool {
        matches!(self.next, Next::End)
    }
}
