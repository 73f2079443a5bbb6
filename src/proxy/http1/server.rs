//! The HTTP/1.1 server side of a client connection, the proxy's own (HTTP/2 stays hyper's).
//!
//! Why its own: on this path every frame of every stream is written, and every keep-alive
//! connection waits between requests. hyper's server connection keeps a read buffer, a write
//! buffer and a cached header map for a connection's whole life, and puts its dispatcher
//! between the body and the socket on every frame. Here a connection holds no buffer while it
//! waits for a request (the read buffer is freed once the last head is consumed, as nginx
//! does), the head is read into a small buffer that grows only for a larger head, and the
//! frames of a response are written straight from the upstream's read buffer, gathered with
//! whatever else is ready into one `writev`; frames queued together go out as one chunk (one
//! chunk-size line, the frames, a CRLF), as nginx sends what it read at once. Every rule it
//! applies to the bytes is in [`super::headers`], [`super::head`] and [`super::body`].
//!
//! What it speaks (RFC 9112): request heads parsed by `httparse` (at most
//! `limits.max_request_head_bytes`, [`MAX_HEADERS`] fields; 431 beyond, 400 for what does not
//! parse); request bodies framed by `Transfer-Encoding: chunked` (which wins over a
//! `Content-Length`, and then the connection closes after the response) or `Content-Length`
//! (several that differ: 400); `Expect: 100-continue` answered when the body is first read;
//! responses framed by their `Content-Length`, an exact size, chunked for HTTP/1.1 (trailers sent
//! when the request said `TE: trailers`), or the close for HTTP/1.0; no body for `HEAD`, 1xx,
//! 204 and 304; a `date` field when the response has none. Keep-alive per HTTP/1.1 and
//! HTTP/1.0's `Connection: keep-alive`; a connection is reused only when the request body was
//! read to its end and the response ended cleanly. Pipelined requests are served in order.
//!
//! Bounds: an idle keep-alive connection is closed after `timeouts.client_idle`; a head must be
//! complete within `timeouts.request_head` of its first byte; a client that closes its side
//! while its request is served cancels it (as with hyper). An upstream body that breaks ends
//! the client's response without its last chunk, so the client sees it cut short.

use std::future::{poll_fn, Future};
use std::io;
use std::pin::{pin, Pin};
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use http::header::{self, HeaderMap, HeaderValue};
use http::{Request, Response, Version};
use http_body::Body;
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::time::Instant;

use super::head::{self, Exchange, Out, Refusal, RequestHead, TransferCodings};
use super::headers;
use super::request_body::{Handback, Streamed};
use super::socket::{self, Watcher};
use super::write::WriteQueue;
use crate::proxy::client_body::ClientBody;
use crate::proxy::lazy_timer::LazyTimer;
use crate::proxy::BoxError;
/// The read buffer's first size for a head: most requests' heads (and often their bodies) fit.
/// It doubles while a head does not fit, up to `limits.max_request_head_bytes`.
const READ_FIRST: usize = 1 << 10;

/// What bounds an HTTP/1.1 connection (from the listener's limits).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    /// For a request head, from its first byte.
    pub(crate) request_head: Duration,
    /// For a keep-alive connection waiting for its next request.
    pub(crate) client_idle: Duration,
    pub(crate) max_head_bytes: usize,
}

/// What this server calls for each request: the request's head comes boxed as it was parsed,
/// and a service that keeps it in that box moves a pointer from here to the upstream (made
/// into a `Request` before the call, the head would be copied at every step on the way).
pub(crate) trait Service {
    type Body: Body<Data = Bytes> + Written;
    type Error: Into<BoxError>;

    /// The answer, awaited in the connection's own future (not boxed: made in place).
    fn call(
        &self,
        parts: Box<http::request::Parts>,
        body: ClientBody,
    ) -> impl Future<Output = Result<Response<Self::Body>, Self::Error>> + Send;

    /// The server answered a request itself ([`Refusal`]) before any call: its head did not
    /// parse, was too large or framed its body in a way that cannot be served. A service that
    /// keeps records records it here; the connection closes after the answer.
    fn refused(&self, refusal: &Refusal) {
        let _ = refusal;
    }
}

/// A response body told by this server what it did with what the body handed it: the hook is
/// defined here, where it is called. The proxy's body implements it (`service::ProxyBody`);
/// every other body takes the defaults.
pub(crate) trait Written {
    /// Everything handed on so far has been written to the client.
    fn written(self: Pin<&mut Self>) {}
    /// Whether the body may have another frame ready without waiting for its source: when
    /// not, the server writes what it has before it polls again (the poll that finds nothing
    /// and waits then comes after the write). As if it had, by default: the server polls until
    /// the body waits.
    fn holds_more(&self) -> bool {
        true
    }
    /// The server has encoded the response's head and hands it over, before it polls the body.
    /// Dropped by default.
    fn head(self: Pin<&mut Self>, parts: http::response::Parts) {
        drop(parts);
    }
}

/// A body held whole (the proxy's and the admin port's own answers) has nothing to be told.
impl<D> Written for http_body_util::Full<D> {}

/// A hyper service, called by this server with the request made whole again (the admin port's
/// and the tests'); it stays one for HTTP/2.
#[derive(Clone)]
pub(crate) struct Hyper<S>(pub(crate) S);

impl<S, B> Service for Hyper<S>
where
    S: hyper::service::Service<Request<ClientBody>, Response = Response<B>>,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    B: Body<Data = Bytes> + Written,
{
    type Body = B;
    type Error = S::Error;

    fn call(
        &self,
        parts: Box<http::request::Parts>,
        body: ClientBody,
    ) -> impl Future<Output = Result<Response<B>, S::Error>> + Send {
        self.0.call(Request::from_parts(*parts, body))
    }
}

impl<S: hyper::service::Service<Request<ClientBody>>> hyper::service::Service<Request<ClientBody>>
    for Hyper<S>
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn call(&self, request: Request<ClientBody>) -> S::Future {
        self.0.call(request)
    }
}

/// Serves HTTP/1.1 on `stream` (whose first bytes, already read, are `prefix`) until the client
/// closes, an idle or head timeout, an error, or `shutdown` (the request in progress finishes
/// first, with `connection: close`).
pub(crate) async fn serve<S>(
    stream: TcpStream,
    prefix: &[u8],
    limits: Limits,
    service: S,
    shutdown: &mut watch::Receiver<bool>,
) where
    S: Service,
    <S::Body as Body>::Error: Into<BoxError>,
{
    let mut client = Client {
        stream: Arc::new(stream),
        read: BytesMut::from(prefix),
        side: ReadSide::Here,
        max_head: limits.max_head_bytes,
        timer: LazyTimer::default(),
    };
    let mut closing = *shutdown.borrow();
    loop {
        let head = match client.read_head(&limits, shutdown, &mut closing).await {
            Ok(Some(head)) => head,
            Ok(None) => return,
            Err(refusal) => {
                service.refused(&refusal);
                client.refuse(&refusal, limits.request_head).await;
                return;
            }
        };
        let exchange = head.exchange;
        let (parts, body) = client.request(head);
        // The answer is awaited here, in the connection's own future: what it holds across the
        // wait is the service's future (the proxy's is a pointer) and, for a head without a
        // body, its writer, both smaller than the stream that follows; no box is made and
        // freed for it on every request.
        let answered = {
            let mut call = pin!(service.call(parts, body));
            // Until the response head: the client closing its side cancels the request.
            poll_fn(|cx| {
                if let Poll::Ready(answer) = call.as_mut().poll(cx) {
                    return Poll::Ready(Some(answer.map_err(Into::<BoxError>::into)));
                }
                match client.poll_watch(cx) {
                    Poll::Ready(()) => Poll::Ready(None),
                    Poll::Pending => Poll::Pending,
                }
            })
            .await
        };
        let closing_now = *shutdown.borrow();
        let keep = match client.ready(answered, &exchange, closing_now) {
            Ready::Close => false,
            Ready::Bodiless(head) => {
                let mut writer = head.writer;
                client.flush(&mut writer).await && head.keep
            }
            // The body on the heap, once: the task holds a pointer to it, and nothing of a
            // response while it waits for the next request.
            Ready::Stream(head, mut body) => client.stream(body.as_mut(), head, &exchange).await,
        };
        closing |= *shutdown.borrow();
        if !keep || (closing && client.read.is_empty()) {
            return;
        }
    }
}

impl Client {
    /// The head to write for the service's answer, and its body boxed if it has one to stream.
    /// The head goes to the body once encoded ([`Written::head`]).
    fn ready<B: Body<Data = Bytes> + Written>(
        &mut self,
        answered: Option<Result<Response<B>, BoxError>>,
        exchange: &Exchange,
        closing: bool,
    ) -> Ready<B> {
        let response = match answered {
            Some(Ok(response)) => response,
            Some(Err(e)) => {
                tracing::debug!(error = %e, "the service failed a request; closing the connection");
                return Ready::Close;
            }
            None => return Ready::Close,
        };
        let (parts, body) = response.into_parts();
        let head = self.head(&parts, &body, exchange, closing);
        if head.bodiless {
            pin!(body).head(parts);
            return Ready::Bodiless(head);
        }
        let mut body = Box::pin(body);
        body.as_mut().head(parts);
        Ready::Stream(head, body)
    }
}

/// How far a response body has been sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sent {
    /// Frames may come.
    Open,
    /// It ended cleanly: its last chunk is queued.
    Ended,
    /// It failed, or said more than its length: the client's response is cut short.
    Broken,
}

impl Sent {
    /// The body ended; a body already broken stays broken.
    fn end(&mut self) {
        if *self == Sent::Open {
            *self = Sent::Ended;
        }
    }
}

/// Who reads the client's socket.
enum ReadSide {
    /// The connection: heads, and the watch while a request is served.
    Here,
    /// The client closed its side.
    Closed,
    /// A request body reading it, which hands back what it read past its end once it ended.
    Lent(Arc<Handback>),
}

/// The service's answer made ready to write.
enum Ready<B> {
    Close,
    Bodiless(ReadyHead),
    Stream(ReadyHead, std::pin::Pin<Box<B>>),
}

/// A response head ready to go, and how its body is framed.
struct ReadyHead {
    writer: WriteQueue,
    framing: Out,
    keep: bool,
    bodiless: bool,
}

/// The client's connection: the socket (shared with a request body that reads it) and what was
/// read of the next request.
struct Client {
    stream: Arc<TcpStream>,
    read: BytesMut,
    side: ReadSide,
    max_head: usize,
    /// The idle and request-head deadlines' timer, for the connection's life.
    timer: LazyTimer,
}

impl Client {
    /// Whether the read side is the connection's: not while a request body is reading it.
    fn reading(&self) -> bool {
        !matches!(self.side, ReadSide::Lent(_))
    }

    /// Whether the client closed its side.
    fn closed(&self) -> bool {
        matches!(self.side, ReadSide::Closed)
    }

    /// Reads into `read` (at most `limit` bytes held); `Ok(0)` at the client's close.
    fn poll_fill(&mut self, cx: &mut Context<'_>, limit: usize) -> Poll<io::Result<usize>> {
        loop {
            ready!(self.stream.poll_read_ready(cx))?;
            // Space only once there is something to read: a waiting connection holds none.
            if self.read.capacity() == self.read.len() {
                let grow = self.read.capacity().max(READ_FIRST);
                let room = limit.saturating_sub(self.read.len());
                if room == 0 {
                    return Poll::Ready(Err(io::Error::other("request head too large")));
                }
                self.read.reserve(grow.min(room));
            }
            let room = limit.saturating_sub(self.read.len());
            let space = room.min(self.read.capacity() - self.read.len());
            match self.stream.try_read_buf(&mut (&mut self.read).limit(room)) {
                Ok(n) => {
                    // A read that left room took all the socket held: forget the readiness
                    // now, as tokio's own `poll_read` does. Kept, the next poll (the watch on
                    // the client while its request is served) spent a `recv` on `EAGAIN`, on
                    // every request, between sending it upstream and sleeping. Readiness that
                    // came after this read is not lost: the event loop has not run since, and
                    // new bytes raise a new edge-triggered event.
                    if n > 0 && n < space {
                        socket::forget_readable(&self.stream);
                    }
                    return Poll::Ready(Ok(n));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }

    /// Waits for a whole request head. `None`: the client closed, went idle too long, sent a
    /// head too slowly, or the proxy is shutting down with nothing of a request here.
    async fn read_head(
        &mut self,
        limits: &Limits,
        shutdown: &mut watch::Receiver<bool>,
        closing: &mut bool,
    ) -> Result<Option<RequestHead>, Refusal> {
        let mut deadline = if self.read.is_empty() {
            Instant::now() + limits.client_idle
        } else {
            Instant::now() + limits.request_head
        };
        loop {
            if !self.read.is_empty() {
                if let Some(head) = head::parse_request(&mut self.read)? {
                    if self.read.is_empty() {
                        // Whatever is left of the allocation goes with the head's bytes.
                        self.read = BytesMut::new();
                    }
                    return Ok(Some(head));
                }
                if self.read.len() >= self.max_head {
                    return Err(Refusal::too_large());
                }
            }
            if self.closed() || (*closing && self.read.is_empty()) {
                return Ok(None);
            }
            let was_empty = self.read.is_empty();
            // Out of `self` while the socket is read; every way out of the wait but the ones
            // that end the connection puts it back.
            let mut timer = std::mem::take(&mut self.timer);
            // A copy: the read's arm moves `deadline` on while the timer's wait holds this.
            let until = deadline;
            tokio::select! {
                biased;
                filled = poll_fn(|cx| self.poll_fill(cx, self.max_head)) => match filled {
                    Ok(0) => self.side = ReadSide::Closed,
                    Ok(_) => {
                        if was_empty {
                            deadline = Instant::now() + limits.request_head;
                        }
                    }
                    Err(_) if self.read.len() >= self.max_head => {
                        return Err(Refusal::too_large())
                    }
                    Err(_) => return Ok(None),
                },
                () = poll_fn(|cx| timer.poll_until(until, cx)) => return Ok(None),
                changed = shutdown.changed(), if !*closing => {
                    if changed.is_err() || *shutdown.borrow() {
                        *closing = true;
                    }
                }
            }
            self.timer = timer;
        }
    }

    /// The request for the service: its body is what came with the head when all of it did,
    /// otherwise read from the socket as the upstream takes it.
    fn request(&mut self, head: RequestHead) -> (Box<http::request::Parts>, ClientBody) {
        let RequestHead {
            parts,
            mut body,
            expect_continue,
            ..
        } = head;
        let whole = match body.size_hint().exact() {
            Some(0) => Some(None),
            Some(n) if (self.read.len() as u64) >= n => match body.next(&mut self.read) {
                Ok(frame) => Some(frame.and_then(|f| f.into_data().ok())),
                Err(_) => None,
            },
            _ => None,
        };
        let body = match whole {
            Some(data) => {
                if self.read.is_empty() {
                    self.read = BytesMut::new();
                }
                ClientBody::whole(data)
            }
            None => {
                let (body, handback) = Streamed::new(
                    self.stream.clone(),
                    std::mem::take(&mut self.read),
                    body,
                    expect_continue,
                );
                self.side = ReadSide::Lent(handback);
                ClientBody::streamed(body)
            }
        };
        (parts, body)
    }

    /// Takes the read side back from a request body that has ended.
    fn reclaim(&mut self) {
        let ReadSide::Lent(handback) = &self.side else {
            return;
        };
        if let Some(rest) = handback.take() {
            self.read = rest;
            self.side = ReadSide::Here;
        }
    }

    /// Watches the client while its request is served: what it sends is kept for the next
    /// request; `Ready` when it closed or broke the connection.
    fn poll_watch(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        self.reclaim();
        if !self.reading() {
            return Poll::Pending;
        }
        loop {
            if self.closed() {
                return Poll::Ready(());
            }
            if self.read.len() >= self.max_head {
                // A pipelining client waits for its turn.
                return Poll::Pending;
            }
            match ready!(self.poll_fill(cx, self.max_head)) {
                Ok(0) => self.side = ReadSide::Closed,
                Ok(_) => {}
                Err(_) => return Poll::Ready(()),
            }
        }
    }

    /// [`Client::poll_watch`] for a streaming response, whose wake-ups are nearly all the
    /// upstream's frames: the client's socket is polled again only once it has woken the task
    /// (or the task's waker changed, or the read side came back from a request body), not on
    /// every frame, where tokio's readiness check and waker registration cost as much as a
    /// tenth of forwarding the frame.
    fn poll_watched(&mut self, cx: &mut Context<'_>, watcher: &mut Option<Watcher>) -> Poll<()> {
        let watcher = match watcher {
            Some(w) if w.wakes(cx.waker()) => {
                if w.armed && !w.take_woken() {
                    return Poll::Pending;
                }
                w
            }
            _ => watcher.insert(Watcher::new(cx.waker())),
        };
        watcher.armed = false;
        let polled = self.poll_watch(&mut Context::from_waker(watcher.waker()));
        // Pending with the read side here: the socket holds the watcher's waker (or a
        // pipelined head fills the buffer, which only the response's end changes).
        watcher.armed = polled.is_pending() && self.reading();
        polled
    }

    /// The response head and its framing: its `Content-Length`, an exact size, chunked, or
    /// the close; none for HEAD, 1xx, 204 and 304.
    fn head<B: Body>(
        &mut self,
        parts: &http::response::Parts,
        body: &B,
        exchange: &Exchange,
        closing: bool,
    ) -> ReadyHead {
        let status = parts.status;
        // A length that does not parse is none: the body's own size or chunks frame it.
        let lengths = parts.headers.get_all(header::CONTENT_LENGTH).iter();
        let declared = headers::content_length(lengths.map(HeaderValue::as_bytes))
            .ok()
            .flatten();
        let framing = Out::of(status, declared, body.size_hint().exact(), exchange);
        self.reclaim();
        let keep = exchange.keep_alive && !closing && framing != Out::Close && self.reading();
        // Room for the head and two frames from the start, instead of growing it while the
        // first frames go out.
        let mut writer = WriteQueue::with_capacity(8);
        writer.bytes(head::encode_response(
            exchange.version,
            status,
            &parts.headers,
            framing,
            keep,
            exchange.keep_alive,
            parts.extensions.get::<TransferCodings>(),
        ));
        ReadyHead {
            writer,
            framing,
            keep,
            bodiless: exchange.head_method || head::no_body(status),
        }
    }

    /// Writes the head and streams the body; whether the connection may serve another request.
    async fn stream<B>(
        &mut self,
        mut body: std::pin::Pin<&mut B>,
        head: ReadyHead,
        exchange: &Exchange,
    ) -> bool
    where
        B: Body<Data = Bytes> + Written,
        B::Error: Into<BoxError>,
    {
        let ReadyHead {
            mut writer,
            framing,
            keep,
            ..
        } = head;
        let mut left = match framing {
            Out::Length(n) | Out::Exact(n) => Some(n),
            _ => None,
        };
        let mut state = Sent::Open;
        if body.is_end_stream() {
            state = Sent::Ended;
            end_body(&mut writer, framing, None, exchange.trailers);
        }
        let mut watcher = None;
        let finished = poll_fn(|cx| loop {
            let mut body_pending = false;
            while state == Sent::Open && writer.has_room() {
                match body.as_mut().poll_frame(cx) {
                    Poll::Ready(Some(Ok(frame))) => {
                        match frame.into_data() {
                            Ok(mut data) => {
                                if let Some(left) = left.as_mut() {
                                    // More than the length said: cut, and close after.
                                    let take = (data.len() as u64).min(*left);
                                    *left -= take;
                                    if take < data.len() as u64 {
                                        data.truncate(take as usize);
                                        state = Sent::Broken;
                                    }
                                }
                                writer.data(data, framing == Out::Chunked);
                            }
                            Err(frame) => {
                                state.end();
                                let trailers = frame.into_trailers().ok();
                                end_body(&mut writer, framing, trailers, exchange.trailers);
                                break;
                            }
                        }
                        if body.is_end_stream() {
                            state.end();
                            end_body(&mut writer, framing, None, exchange.trailers);
                        } else if !body.holds_more() {
                            // What the body had read goes out before it reads its source
                            // again: that poll finds nothing and waits (a timed body arms its
                            // timer on its first wait), on the first token's way to the client
                            // when it came first.
                            break;
                        }
                    }
                    Poll::Ready(None) => {
                        state.end();
                        end_body(&mut writer, framing, None, exchange.trailers);
                    }
                    Poll::Ready(Some(Err(e))) => {
                        let e: BoxError = e.into();
                        tracing::debug!(error = %e, "a response body failed; cutting the client's response short");
                        state = Sent::Broken;
                    }
                    Poll::Pending => body_pending = true,
                }
                if body_pending {
                    break;
                }
            }
            // Nothing new to write when the body waits with the queue empty.
            let wrote = (body_pending && writer.is_empty())
                || match writer.poll_write(&self.stream, cx) {
                    Poll::Ready(Ok(())) => {
                        body.as_mut().written();
                        true
                    }
                    Poll::Ready(Err(_)) => return Poll::Ready(false),
                    Poll::Pending => false,
                };
            if wrote && state != Sent::Open {
                return Poll::Ready(state == Sent::Ended);
            }
            // The client is watched when the task is to wait (for the body or the client's
            // socket); a body that had more is polled again first.
            if !wrote || body_pending {
                if self.poll_watched(cx, &mut watcher).is_ready() {
                    return Poll::Ready(false);
                }
                return Poll::Pending;
            }
        })
        .await;
        if !finished || left.is_some_and(|left| left > 0) {
            return false;
        }
        self.reclaim();
        keep && self.reading()
    }

    /// Writes what is queued; whether all of it went.
    async fn flush(&mut self, writer: &mut WriteQueue) -> bool {
        poll_fn(|cx| writer.poll_write(&self.stream, cx))
            .await
            .is_ok()
    }

    /// Answers a head that cannot be served, and the connection closes.
    async fn refuse(&mut self, refusal: &Refusal, within: Duration) {
        let mut writer = WriteQueue::default();
        writer.bytes(head::encode_response(
            Version::HTTP_11,
            refusal.status,
            &HeaderMap::new(),
            Out::Exact(0),
            false,
            false,
            None,
        ));
        let _ = tokio::time::timeout(within, self.flush(&mut writer)).await;
    }
}

/// The end of a body: for a chunked one, the last chunk and the trailers if the client takes
/// them ([`head::encode_last_chunk`]).
fn end_body(
    queue: &mut WriteQueue,
    framing: Out,
    trailers: Option<HeaderMap>,
    send_trailers: bool,
) {
    if framing != Out::Chunked {
        return;
    }
    match head::encode_last_chunk(trailers, send_trailers) {
        None => queue.fixed(b"0\r\n\r\n"),
        Some(last) => queue.bytes(last),
    }
}

#[cfg(test)]
mod tests {
    //! The server against a raw client socket: exact bytes in, exact bytes out.

    use std::collections::VecDeque;
    use std::convert::Infallible;
    use std::sync::atomic::{AtomicBool, Ordering};

    use http::StatusCode;
    use http_body::Frame;
    use http_body_util::BodyExt;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    use super::*;

    const DEADLINE: Duration = Duration::from_secs(10);

    /// The upstream's `date` goes through as it was; an answer without one gets one, once.
    #[test]
    fn a_head_has_one_date_the_upstreams_if_it_sent_one() {
        let text = |headers: &HeaderMap| {
            let head = head::encode_response(
                Version::HTTP_11,
                StatusCode::OK,
                headers,
                Out::Chunked,
                true,
                false,
                None,
            );
            String::from_utf8(head.to_vec()).unwrap()
        };
        let mut headers = HeaderMap::new();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/event-stream"),
        );
        let added = text(&headers);
        assert_eq!(added.matches("date: ").count(), 1, "{added}");
        headers.insert(
            header::DATE,
            HeaderValue::from_static("Tue, 24 Nov 2026 10:00:00 GMT"),
        );
        let kept = text(&headers);
        assert_eq!(kept.matches("date: ").count(), 1, "{kept}");
        assert!(
            kept.contains("date: Tue, 24 Nov 2026 10:00:00 GMT\r\n"),
            "{kept}"
        );
    }

    /// A response body of given frames (an `Err` breaks it), of unknown length.
    struct Frames(VecDeque<Result<Frame<Bytes>, io::Error>>);

    impl Written for Frames {}

    impl Body for Frames {
        type Data = Bytes;
        type Error = io::Error;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
            Poll::Ready(self.0.pop_front())
        }
    }

    fn limits() -> Limits {
        Limits {
            request_head: Duration::from_secs(5),
            client_idle: Duration::from_secs(5),
            max_head_bytes: 8 << 10,
        }
    }

    /// A server for one connection whose service answers each request with `answer`; the
    /// client's socket.
    async fn connect<F>(limits: Limits, answer: F) -> (TcpStream, tokio::task::JoinHandle<()>)
    where
        F: Fn(http::request::Parts, Bytes) -> Response<Frames> + Send + Sync + 'static,
    {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (stream, _) = listener.accept().await.unwrap();
        let answer = Arc::new(answer);
        let server = tokio::spawn(async move {
            let (_keep, mut shutdown) = watch::channel(false);
            let service = hyper::service::service_fn(move |request: Request<ClientBody>| {
                let answer = answer.clone();
                async move {
                    let (parts, body) = request.into_parts();
                    let body = body.collect().await.map(|b| b.to_bytes());
                    Ok::<_, Infallible>(answer(parts, body.unwrap_or_default()))
                }
            });
            serve(stream, b"", limits, Hyper(service), &mut shutdown).await;
        });
        (client, server)
    }

    /// Echoes the method, path and body, chunked.
    fn echo(parts: http::request::Parts, body: Bytes) -> Response<Frames> {
        let text = format!(
            "{} {} {}",
            parts.method,
            parts.uri,
            String::from_utf8_lossy(&body)
        );
        Response::new(Frames(VecDeque::from([Ok(Frame::data(Bytes::from(text)))])))
    }

    /// Reads until `pattern` has been seen `times` times, or the connection closes.
    async fn read_until(client: &mut TcpStream, pattern: &str, times: usize) -> String {
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        while String::from_utf8_lossy(&got).matches(pattern).count() < times {
            let n = tokio::time::timeout(DEADLINE, client.read(&mut buf))
                .await
                .expect("an answer in time")
                .unwrap_or(0);
            if n == 0 {
                break;
            }
            got.extend_from_slice(&buf[..n]);
        }
        String::from_utf8_lossy(&got).into_owned()
    }

    async fn read_to_close(client: &mut TcpStream) -> String {
        read_until(client, "\u{0}never", 1).await
    }

    /// What a body has read is written before the body is polled again when it holds nothing
    /// more: the poll that finds nothing and waits (a timed body arms its timer on its first
    /// wait) must not come between the first token and its write.
    #[tokio::test]
    async fn what_a_body_read_is_written_before_it_is_polled_again() {
        type Log = Arc<std::sync::Mutex<Vec<&'static str>>>;
        struct Logged(Log, u8);
        impl Written for Logged {
            fn written(self: Pin<&mut Self>) {
                self.0.lock().unwrap().push("written");
            }
            fn holds_more(&self) -> bool {
                false
            }
        }
        impl Body for Logged {
            type Data = Bytes;
            type Error = io::Error;
            fn poll_frame(
                mut self: Pin<&mut Self>,
                cx: &mut Context<'_>,
            ) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
                self.1 += 1;
                let step = self.1;
                let mut log = self.0.lock().unwrap();
                match step {
                    1 => {
                        log.push("frame");
                        Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(b"a")))))
                    }
                    2 => {
                        log.push("waits");
                        cx.waker().wake_by_ref();
                        Poll::Pending
                    }
                    _ => {
                        log.push("end");
                        Poll::Ready(None)
                    }
                }
            }
        }
        let log = Log::default();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut client = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (stream, _) = listener.accept().await.unwrap();
        let served = log.clone();
        let _server = tokio::spawn(async move {
            let (_keep, mut shutdown) = watch::channel(false);
            let service = hyper::service::service_fn(move |_: Request<ClientBody>| {
                let body = Logged(served.clone(), 0);
                async move { Ok::<_, Infallible>(Response::new(body)) }
            });
            serve(stream, b"", limits(), Hyper(service), &mut shutdown).await;
        });
        client
            .write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .unwrap();
        let got = read_until(&mut client, "0\r\n\r\n", 1).await;
        assert!(got.contains("\r\n1\r\na\r\n"), "{got}");
        assert_eq!(
            log.lock().unwrap()[..3],
            ["frame", "written", "waits"],
            "the frame was not written before the body was polled again"
        );
    }

    /// Every field of a head reaches the request, with the value it had, whether the head
    /// carries fewer fields than are placed on the stack or more.
    #[test]
    fn heads_with_few_or_many_fields_keep_every_field() {
        for fields in [1, 24, 25, headers::MAX_HEADERS] {
            let mut text = String::from("POST /v1/x?y=1 HTTP/1.1\r\nhost: h\r\n");
            for i in 1..fields {
                text.push_str(&format!("x-field-{i}: value {i}\r\n"));
            }
            text.push_str("\r\nbody");
            let mut buf = BytesMut::from(text.as_bytes());
            let head = head::parse_request(&mut buf)
                .ok()
                .flatten()
                .expect("a head");
            assert_eq!(&buf[..], b"body");
            assert_eq!(head.parts.uri, "/v1/x?y=1");
            assert_eq!(head.parts.headers.len(), fields, "{fields} fields");
            assert_eq!(head.parts.headers["host"], "h");
            for i in 1..fields {
                assert_eq!(
                    head.parts.headers[format!("x-field-{i}").as_str()],
                    format!("value {i}").as_str()
                );
            }
        }
    }

    #[tokio::test]
    async fn pipelined_requests_are_answered_in_order() {
        let (mut client, _server) = connect(limits(), echo).await;
        client
            .write_all(b"GET /a HTTP/1.1\r\nhost: x\r\n\r\nPOST /b HTTP/1.1\r\nhost: x\r\ncontent-length: 3\r\n\r\nxyzGET /c HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .unwrap();
        let got = read_until(&mut client, "0\r\n\r\n", 3).await;
        let a = got.find("GET /a ").unwrap();
        let b = got.find("POST /b xyz").unwrap();
        let c = got.find("GET /c ").unwrap();
        assert!(a < b && b < c, "{got}");
        assert_eq!(got.matches("HTTP/1.1 200 OK\r\n").count(), 3, "{got}");
        assert!(got.contains("transfer-encoding: chunked\r\n"), "{got}");
        assert!(got.contains("\r\ndate: "), "{got}");
    }

    /// A head longer than the first read is read whole from what the socket already holds:
    /// only a read that left room forgets the socket's readiness (no new event would come for
    /// the bytes still waiting), and one that did is still woken by the bytes that follow.
    #[tokio::test]
    async fn a_head_longer_than_the_first_read_is_read_from_what_waits() {
        let (mut client, _server) = connect(limits(), echo).await;
        let long = "v".repeat(3 * READ_FIRST);
        client
            .write_all(
                format!("GET /long HTTP/1.1\r\nhost: x\r\nx-long: {long}\r\n\r\n").as_bytes(),
            )
            .await
            .unwrap();
        let got = read_until(&mut client, "0\r\n\r\n", 1).await;
        assert!(got.contains("GET /long "), "{got}");
        // A head in two writes, the second after the first was read (a short read).
        client
            .write_all(b"GET /split HTTP/1.1\r\nho")
            .await
            .unwrap();
        tokio::task::yield_now().await;
        client.write_all(b"st: x\r\n\r\n").await.unwrap();
        let got = read_until(&mut client, "0\r\n\r\n", 1).await;
        assert!(got.contains("GET /split "), "{got}");
    }

    /// A body that did not come with its head is read from the socket as the service reads
    /// it, and what follows it is the next request.
    #[tokio::test]
    async fn a_body_after_its_head_is_read_and_what_follows_is_the_next_request() {
        let (mut client, _server) = connect(limits(), echo).await;
        client
            .write_all(b"POST /one HTTP/1.1\r\nhost: x\r\ncontent-length: 10\r\n\r\n01234")
            .await
            .unwrap();
        tokio::task::yield_now().await;
        client
            .write_all(b"56789GET /two HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .unwrap();
        let got = read_until(&mut client, "0\r\n\r\n", 2).await;
        assert!(got.contains("POST /one 0123456789"), "{got}");
        assert!(got.contains("GET /two "), "{got}");
        // Chunked, with trailers, in pieces; then one more request on the same connection.
        client
            .write_all(b"POST /three HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n")
            .await
            .unwrap();
        tokio::task::yield_now().await;
        client
            .write_all(b"2;ext\r\nde\r\n0\r\nx-t: 1\r\n\r\nGET /four HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .unwrap();
        let got = read_until(&mut client, "0\r\n\r\n", 2).await;
        assert!(got.contains("POST /three abcde"), "{got}");
        assert!(got.contains("GET /four "), "{got}");
    }

    #[tokio::test]
    async fn expect_100_continue_is_answered_before_the_body_is_read() {
        let (mut client, _server) = connect(limits(), echo).await;
        client
            .write_all(
                b"POST /e HTTP/1.1\r\nhost: x\r\nexpect: 100-continue\r\ncontent-length: 2\r\n\r\n",
            )
            .await
            .unwrap();
        let interim = read_until(&mut client, "\r\n\r\n", 1).await;
        assert_eq!(interim, "HTTP/1.1 100 Continue\r\n\r\n");
        client.write_all(b"ok").await.unwrap();
        let got = read_until(&mut client, "0\r\n\r\n", 1).await;
        assert!(got.contains("POST /e ok"), "{got}");
    }

    /// HTTP/1.0 has no chunked framing: a body of unknown length ends with the connection.
    #[tokio::test]
    async fn http_1_0_gets_its_version_and_a_close_delimited_body() {
        let (mut client, _server) = connect(limits(), echo).await;
        client
            .write_all(b"GET /old HTTP/1.0\r\n\r\n")
            .await
            .unwrap();
        let got = read_to_close(&mut client).await;
        assert!(got.starts_with("HTTP/1.0 200 OK\r\n"), "{got}");
        assert!(!got.contains("transfer-encoding"), "{got}");
        assert!(got.contains("connection: close\r\n"), "{got}");
        assert!(got.ends_with("\r\n\r\nGET /old "), "{got}");
    }

    /// A HEAD response has the length a GET would have, and no body.
    #[tokio::test]
    async fn a_head_response_has_a_length_and_no_body() {
        let (mut client, _server) = connect(limits(), |_, _| {
            Response::new(Frames(VecDeque::from([Ok(Frame::data(
                Bytes::from_static(b"12345"),
            ))])))
            .map(|b| b)
        })
        .await;
        client
            .write_all(b"HEAD / HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\n\r\nGET / HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .unwrap();
        let got = read_until(&mut client, "0\r\n\r\n", 1).await;
        let second = got[1..]
            .find("HTTP/1.1 200")
            .map(|i| i + 1)
            .expect("two answers");
        let (head, get) = got.split_at(second);
        assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{got}");
        assert!(
            head.ends_with("\r\n\r\n") && !head.contains("12345"),
            "{got}"
        );
        assert!(get.ends_with("5\r\n12345\r\n0\r\n\r\n"), "{got}");
    }

    #[tokio::test]
    async fn bad_and_oversized_heads_are_refused_and_closed() {
        let (mut client, _server) = connect(limits(), echo).await;
        client
            .write_all(b"GET / HTTP/1.1\r\nbad header\r\n\r\n")
            .await
            .unwrap();
        let got = read_to_close(&mut client).await;
        assert!(got.starts_with("HTTP/1.1 400 Bad Request\r\n"), "{got}");
        assert!(got.contains("connection: close\r\n"), "{got}");

        let (mut client, _server) = connect(limits(), echo).await;
        let long = format!("GET / HTTP/1.1\r\nx: {}\r\n\r\n", "a".repeat(9 << 10));
        let _ = client.write_all(long.as_bytes()).await;
        let got = read_to_close(&mut client).await;
        assert!(got.starts_with("HTTP/1.1 431 "), "{got}");

        let (mut client, _server) = connect(limits(), echo).await;
        client
            .write_all(
                b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 1\r\ncontent-length: 2\r\n\r\n",
            )
            .await
            .unwrap();
        assert!(read_to_close(&mut client)
            .await
            .starts_with("HTTP/1.1 400 "));
    }

    /// With both framings the chunked one is read and the length removed (the upstream must
    /// not frame the body by it); another transfer coding is not served.
    #[tokio::test]
    async fn chunked_wins_over_a_length_and_other_codings_are_refused() {
        let (mut client, _server) = connect(limits(), |parts, body| {
            let length = parts.headers.get(header::CONTENT_LENGTH).is_some();
            let text = format!("{} cl={length}", String::from_utf8_lossy(&body));
            echo(parts, Bytes::from(text))
        })
        .await;
        client
            .write_all(b"POST /x HTTP/1.1\r\nhost: x\r\ncontent-length: 3\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n")
            .await
            .unwrap();
        let got = read_to_close(&mut client).await;
        assert!(got.contains("POST /x hello cl=false"), "{got}");
        assert!(got.contains("connection: close\r\n"), "{got}");

        let (mut client, _server) = connect(limits(), echo).await;
        client
            .write_all(
                b"POST /x HTTP/1.1\r\nhost: x\r\ntransfer-encoding: gzip, chunked\r\n\r\n0\r\n\r\n",
            )
            .await
            .unwrap();
        let got = read_to_close(&mut client).await;
        assert!(got.starts_with("HTTP/1.1 501 "), "{got}");
    }

    /// A body's length: the same length given twice is one length; lengths that differ, a
    /// list, or one that is not a number, are refused, even beside a chunked coding. `Connection: close` from the client closes after the response.
    #[tokio::test]
    async fn lengths_are_judged_as_one_and_a_close_is_kept() {
        let answer = |request: &'static [u8]| async move {
            let (mut client, _server) = connect(limits(), echo).await;
            client.write_all(request).await.unwrap();
            read_to_close(&mut client).await
        };
        let got = answer(
            b"POST /a HTTP/1.1\r\nhost: x\r\ncontent-length: 3\r\ncontent-length: 3\r\nconnection: close\r\n\r\nabc",
        )
        .await;
        assert!(got.starts_with("HTTP/1.1 200 "), "{got}");
        assert!(got.contains("POST /a abc"), "{got}");
        assert!(got.contains("connection: close\r\n"), "{got}");
        for refused in [
            &b"POST /b HTTP/1.1\r\nhost: x\r\ncontent-length: 3\r\ncontent-length: 4\r\n\r\nabcd"[..],
            b"POST /b HTTP/1.1\r\nhost: x\r\ncontent-length: 3x\r\n\r\nabc",
            b"POST /b HTTP/1.1\r\nhost: x\r\ncontent-length: 3,\r\n\r\nabc",
            b"POST /b HTTP/1.1\r\nhost: x\r\ncontent-length: 3, 3\r\n\r\nabc",
        ] {
            let got = answer(refused).await;
            assert!(got.starts_with("HTTP/1.1 400 "), "{got}");
        }
        // Beside a chunked coding, a length is dropped, but one that does not parse is refused.
        let got = answer(b"POST /c HTTP/1.1\r\nhost: x\r\ncontent-length: 3\r\ntransfer-encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\n\r\n").await;
        assert!(got.contains("POST /c hi"), "{got}");
        let got = answer(b"POST /c HTTP/1.1\r\nhost: x\r\ncontent-length: 3x\r\ntransfer-encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\n\r\n").await;
        assert!(got.starts_with("HTTP/1.1 400 "), "{got}");
    }

    /// A body that breaks ends the client's response without its last chunk, and the
    /// connection closes: the client can tell it was cut short.
    #[tokio::test]
    async fn a_broken_body_cuts_the_response_short() {
        let (mut client, _server) = connect(limits(), |_, _| {
            Response::new(Frames(VecDeque::from([
                Ok(Frame::data(Bytes::from_static(b"part"))),
                Err(io::Error::other("upstream broke")),
            ])))
        })
        .await;
        client
            .write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .unwrap();
        let got = read_to_close(&mut client).await;
        assert!(got.ends_with("\r\n4\r\npart\r\n"), "{got}");
    }

    #[tokio::test]
    async fn trailers_go_to_clients_that_asked_for_them() {
        let with_trailers = |_, _| {
            let mut trailers = HeaderMap::new();
            trailers.insert("x-sum", HeaderValue::from_static("7"));
            Response::new(Frames(VecDeque::from([
                Ok(Frame::data(Bytes::from_static(b"ab"))),
                Ok(Frame::trailers(trailers)),
            ])))
        };
        let (mut client, _server) = connect(limits(), with_trailers).await;
        client
            .write_all(b"GET / HTTP/1.1\r\nhost: x\r\nte: trailers\r\n\r\nGET / HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .unwrap();
        let got = read_until(&mut client, "\r\n0\r\n", 2).await;
        let got = read_until_more(&mut client, got).await;
        assert!(
            got.contains("2\r\nab\r\n0\r\nx-sum: 7\r\n\r\nHTTP/1.1"),
            "{got}"
        );
        assert!(got.ends_with("2\r\nab\r\n0\r\n\r\n"), "{got}");
    }

    /// Reads what else arrives within a moment of `got` (the end of a last answer).
    async fn read_until_more(client: &mut TcpStream, mut got: String) -> String {
        while !got.ends_with("\r\n\r\n") {
            let mut buf = [0u8; 1024];
            let n = tokio::time::timeout(DEADLINE, client.read(&mut buf))
                .await
                .expect("the rest in time")
                .unwrap();
            if n == 0 {
                break;
            }
            got.push_str(&String::from_utf8_lossy(&buf[..n]));
        }
        got
    }

    /// A client that closes while its request waits for an answer cancels it.
    #[tokio::test]
    async fn a_client_gone_while_waiting_cancels_the_request() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut client = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (stream, _) = listener.accept().await.unwrap();
        let dropped = Arc::new(AtomicBool::new(false));
        struct SetOnDrop(Arc<AtomicBool>);
        impl Drop for SetOnDrop {
            fn drop(&mut self) {
                self.0.store(true, Ordering::SeqCst);
            }
        }
        let flag = dropped.clone();
        let service = hyper::service::service_fn(move |_: Request<ClientBody>| {
            let guard = SetOnDrop(flag.clone());
            async move {
                std::future::pending::<()>().await;
                drop(guard);
                Ok::<_, Infallible>(Response::new(Frames(VecDeque::new())))
            }
        });
        let server = tokio::spawn(async move {
            let (_keep, mut shutdown) = watch::channel(false);
            serve(stream, b"", limits(), Hyper(service), &mut shutdown).await;
        });
        client
            .write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .unwrap();
        drop(client);
        tokio::time::timeout(DEADLINE, server)
            .await
            .expect("the connection ends")
            .unwrap();
        assert!(dropped.load(Ordering::SeqCst));
    }

    /// A keep-alive connection with no request closes after `client_idle`.
    #[tokio::test]
    async fn an_idle_keep_alive_connection_is_closed() {
        let mut short = limits();
        // The head timeout is far past the deadline: only the idle timeout can close it.
        short.request_head = Duration::from_secs(60);
        short.client_idle = Duration::from_millis(200);
        let (mut client, server) = connect(short, echo).await;
        client
            .write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .unwrap();
        let got = read_to_close(&mut client).await;
        assert!(got.starts_with("HTTP/1.1 200 OK\r\n"), "{got}");
        assert!(got.ends_with("0\r\n\r\n"), "{got}");
        tokio::time::timeout(DEADLINE, server)
            .await
            .unwrap()
            .unwrap();
    }

    /// While it waits for a request, a connection holds no read buffer; a whole body that came
    /// with its head is handed over without one either.
    #[tokio::test]
    async fn a_waiting_connection_holds_no_buffer() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut peer = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (stream, _) = listener.accept().await.unwrap();
        let mut client = Client {
            stream: Arc::new(stream),
            read: BytesMut::new(),
            side: ReadSide::Here,
            max_head: 8 << 10,
            timer: LazyTimer::default(),
        };
        peer.write_all(b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\nhi")
            .await
            .unwrap();
        let (_keep, mut shutdown) = watch::channel(false);
        let head = client
            .read_head(&limits(), &mut shutdown, &mut false)
            .await
            .unwrap()
            .unwrap();
        let (_, body) = client.request(head);
        assert_eq!(client.read.capacity(), 0);
        let body = body.collect().await.unwrap().to_bytes();
        assert_eq!(&body[..], b"hi");
    }
}
