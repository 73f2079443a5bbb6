//! The connections to the model server: an HTTP/1.1 client of the proxy's own (its pool of
//! keep-alive connections, and the response body that gives its connection back to the pool
//! when it ends, are in [`super::pool`]).
//!
//! The client is the proxy's own, not hyper's, for two reasons. The proxy must know, for every
//! request, whether its connection was new or reused, how long connecting took, and whether the
//! connection received any byte of the response: a reused connection that the server closed while
//! it sat idle (llama.cpp closes every kept-alive connection after a streamed response, without
//! saying so) fails a request that the server never saw, and only then may the request be sent
//! again (see `forward.rs`). And it is the path of every frame: here a frame is read from the
//! upstream socket, cut out of the read buffer (no copy) and handed to the client's connection
//! in the same poll of the same task, without a connection task, a body channel and the
//! wake-ups between them (`docs/performance-history.md` has what that saved per frame).
//!
//! What it speaks (RFC 9112): the request head in origin form, its body framed by its
//! `Content-Length` or chunked; the response head parsed by `httparse` (1xx answers skipped), its
//! body framed by `Transfer-Encoding: chunked` (trailers handed on), `Content-Length`, or the
//! connection's close; no body for `HEAD`, 204 and 304. A connection is reused only when the
//! exchange ended cleanly on both sides and the response allowed it (HTTP/1.1, no
//! `Connection: close`, not framed by the close). A response that arrives before the request
//! body was all sent ends the sending (the server has decided) and the connection is not reused.
//!
//! A connection is driven only by the request that uses it; an idle one is not polled at all
//! until its next checkout, which looks (`MSG_PEEK`) whether the server closed it meanwhile, or
//! the pool's sweep every [`IDLE_SWEEP`], which closes those the server closed or that expired.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::{Bytes, BytesMut};
use http::header;
use http::{Method, Response};
use http_body::Body;
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

use super::head::{self, Framing};
use super::socket;
use super::write::{put_field, WriteQueue};
use crate::proxy::lazy_timer::LazyTimer;
use crate::proxy::request_body::UpstreamBody;
/// The read buffer's first size, enough for most response heads and several SSE events; it
/// doubles while reads fill it, up to [`READ_BUFFER_MAX`], and is freed when the connection
/// goes idle. Each open stream holds one, so it starts small: memory per open stream is a
/// figure the overhead bench reports against nginx's.
const READ_BUFFER_MIN: usize = 1 << 10;
/// The largest read: response heads must fit in it, and frames handed on are at most this large.
const READ_BUFFER_MAX: usize = 64 << 10;

/// Why an exchange with the upstream failed.
#[derive(Debug)]
pub(crate) enum UpstreamError {
    /// The socket failed.
    Io(io::Error),
    /// The upstream closed the connection before the response, or its body, was complete.
    Closed,
    /// The response does not parse as HTTP/1.1.
    Invalid(&'static str),
    /// The request body could not be read (the client's side; see `Upload::fault`).
    RequestBody(Box<dyn std::error::Error + Send + Sync>),
}

impl std::fmt::Display for UpstreamError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            UpstreamError::Io(e) => write!(f, "{e}"),
            UpstreamError::Closed => {
                f.write_str("the connection closed before the response was complete")
            }
            UpstreamError::Invalid(what) => write!(f, "invalid response: {what}"),
            UpstreamError::RequestBody(e) => write!(f, "the request body failed: {e}"),
        }
    }
}

impl std::error::Error for UpstreamError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            UpstreamError::Io(e) => Some(e),
            UpstreamError::RequestBody(e) => Some(e.as_ref()),
            UpstreamError::Closed | UpstreamError::Invalid(_) => None,
        }
    }
}

/// A request on its way upstream: its head, boxed once where the proxy took it apart, so that
/// each step on the way to the upstream moves a pointer (an async step that held the head
/// inline would keep a copy of its own in its future, copied again at each step), and its body.
pub(crate) struct Outgoing {
    pub(crate) parts: Box<http::request::Parts>,
    pub(crate) body: UpstreamBody,
}

/// A failed exchange: why, the request's head (as it was sent, for sending it again without
/// a copy of it made for every request), how many bytes of the request were written, and its
/// body as far as it was not taken (all of it when nothing was written).
pub(crate) struct Unsent {
    pub(crate) error: UpstreamError,
    pub(crate) parts: Box<http::request::Parts>,
    pub(crate) written: u64,
    pub(crate) body: Box<UpstreamBody>,
}

/// One upstream connection.
pub(crate) struct Conn {
    stream: TcpStream,
    pub(super) read: BytesMut,
    /// The next read's size.
    read_size: usize,
    /// Bytes received on the connection so far.
    received: u64,
    /// It may carry another request once the current exchange ends.
    reusable: bool,
    /// The response-head deadline's timer, for the connection's life: taken out for each
    /// exchange by the forwarder, which puts it back.
    pub(crate) head_timer: LazyTimer,
    /// The request its answer is for, kept from the response head until the answer's first
    /// write ([`PooledBody::written`]) or its end: dropped when the head came, its head's map and
    /// body freed on the first token's way to the client.
    pub(super) spent: Option<Outgoing>,
}

impl Conn {
    pub(super) fn new(stream: TcpStream) -> Conn {
        Conn {
            stream,
            read: BytesMut::new(),
            read_size: READ_BUFFER_MIN,
            received: 0,
            reusable: true,
            head_timer: LazyTimer::default(),
            spent: None,
        }
    }

    /// Bytes received on the connection so far.
    pub(crate) fn received(&self) -> u64 {
        self.received
    }

    /// Whether the server has closed an idle connection (or sent something unasked): see
    /// [`socket::is_open`] (nginx's keep-alive cache relies on its event loop the same way).
    pub(super) fn is_open(&self) -> bool {
        socket::is_open(&self.stream)
    }

    /// Readies a connection whose exchange ended for the pool: whether it may carry another
    /// request (the exchange ended cleanly, the response allowed it, nothing unasked was read).
    /// Its read buffer and the spent request are freed: an idle connection holds its socket.
    pub(super) fn rest(&mut self) -> bool {
        self.spent = None;
        if !self.reusable || !self.read.is_empty() {
            return false;
        }
        self.read = BytesMut::new();
        self.read_size = READ_BUFFER_MIN;
        true
    }

    /// Reads what the socket has into the buffer; `Ok(0)` is the end of the stream.
    ///
    /// Room is made once bytes are there to read: by then the frames handed on from the buffer
    /// have usually been written and dropped, and the room is made in the buffer they leave
    /// (a new one for every few frames otherwise, while the last frame waits to be written).
    pub(super) fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        if self.read.capacity() - self.read.len() < self.read_size / 2 {
            ready!(self.stream.poll_read_ready(cx))?;
            self.read.reserve(self.read_size);
        }
        let room = self.read.capacity() - self.read.len();
        let read = self.stream.read_buf(&mut self.read);
        tokio::pin!(read);
        let n = ready!(read.poll(cx))?;
        self.received += n as u64;
        if n == room && self.read_size < READ_BUFFER_MAX {
            self.read_size *= 2;
        }
        Poll::Ready(Ok(n))
    }

    /// Sends the request and waits for its response head (1xx answers skipped); the body
    /// follows with [`PooledBody`]. A request that failed before any byte of it was written is
    /// handed back, for sending elsewhere.
    pub(crate) async fn exchange(
        &mut self,
        request: Outgoing,
    ) -> Result<(Response<()>, Framing), Unsent> {
        let Outgoing { parts, mut body } = request;
        let is_head = parts.method == Method::HEAD;
        let mut sending = Sending::new(&parts, &body);
        let result = std::future::poll_fn(|cx| {
            // Send what can be sent now; then see whether the answer has come.
            if !sending.done {
                match sending.poll(&mut self.stream, &mut body, cx) {
                    Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                    Poll::Ready(Ok(())) | Poll::Pending => {}
                }
            }
            loop {
                match head::parse_response(&mut self.read, is_head) {
                    Err(e) => return Poll::Ready(Err(UpstreamError::Invalid(e.0))),
                    Ok(Some(head)) => return Poll::Ready(Ok(head)),
                    Ok(None) if self.read.len() >= READ_BUFFER_MAX => {
                        return Poll::Ready(Err(UpstreamError::Invalid(
                            "a response head larger than 64 KiB",
                        )))
                    }
                    Ok(None) => {}
                }
                match ready!(self.poll_fill(cx)) {
                    Ok(0) => return Poll::Ready(Err(UpstreamError::Closed)),
                    Ok(_) => {}
                    Err(e) => return Poll::Ready(Err(UpstreamError::Io(e))),
                }
            }
        })
        .await;
        match result {
            Ok((response, framing, keep_alive)) => {
                // An answer before the whole request was sent ends the sending: the server has
                // decided, and what it did not read leaves the connection unusable.
                self.reusable = keep_alive && sending.done && framing != Framing::Close;
                self.spent = Some(Outgoing { parts, body });
                Ok((response, framing))
            }
            Err(error) => {
                self.reusable = false;
                Err(Unsent {
                    error,
                    parts,
                    written: sending.written(),
                    body: Box::new(body),
                })
            }
        }
    }
}

/// A request on its way out: the head, then the body as it comes, each chunk written with
/// vectored writes and never copied.
struct Sending {
    queue: WriteQueue,
    chunked: bool,
    /// The body has ended (its last bytes may still be queued).
    body_done: bool,
    /// Everything was written.
    done: bool,
}

impl Sending {
    fn new(parts: &http::request::Parts, body: &UpstreamBody) -> Sending {
        let mut head = Vec::with_capacity(256);
        head.extend_from_slice(parts.method.as_str().as_bytes());
        head.push(b' ');
        let target = parts.uri.path_and_query().map_or("/", |p| p.as_str());
        head.extend_from_slice(target.as_bytes());
        head.extend_from_slice(b" HTTP/1.1\r\n");
        for (name, value) in &parts.headers {
            put_field(&mut head, name, value);
        }
        // The body's framing: the client's Content-Length when it gave one (the transfer coding
        // was its connection's and is gone), else the body's known length, else chunked.
        let mut chunked = false;
        let empty = body.is_end_stream();
        if !parts.headers.contains_key(header::CONTENT_LENGTH) {
            match body.size_hint().exact() {
                Some(0) if empty && !carries_body(&parts.method) => {}
                Some(n) => {
                    head.extend_from_slice(format!("content-length: {n}\r\n").as_bytes());
                }
                None => {
                    head.extend_from_slice(b"transfer-encoding: chunked\r\n");
                    chunked = true;
                }
            }
        }
        head.extend_from_slice(b"\r\n");
        let mut queue = WriteQueue::with_capacity(4);
        queue.bytes(Bytes::from(head));
        Sending {
            queue,
            chunked,
            body_done: empty,
            done: false,
        }
    }

    /// Writes until the socket is full or the request is all sent. The body's frames that are
    /// ready are gathered before each write, so a head and a body that arrived with it leave in
    /// one `writev` (in two, a server reads the head alone and waits for the body: one more
    /// wake-up on its side before it can start).
    fn poll(
        &mut self,
        stream: &mut TcpStream,
        body: &mut UpstreamBody,
        cx: &mut Context<'_>,
    ) -> Poll<Result<(), UpstreamError>> {
        loop {
            let mut body_pending = false;
            while !self.body_done && self.queue.has_room() {
                match Pin::new(&mut *body).poll_frame(cx) {
                    Poll::Pending => {
                        body_pending = true;
                        break;
                    }
                    Poll::Ready(Some(Ok(frame))) => {
                        // Request trailers are not forwarded.
                        if let Ok(data) = frame.into_data() {
                            self.queue.data(data, self.chunked);
                        }
                    }
                    Poll::Ready(Some(Err(e))) => {
                        return Poll::Ready(Err(UpstreamError::RequestBody(e)))
                    }
                    Poll::Ready(None) => {
                        self.body_done = true;
                        if self.chunked {
                            self.queue.fixed(b"0\r\n\r\n");
                        }
                    }
                }
            }
            if self.queue.is_empty() {
                if self.body_done {
                    self.done = true;
                    return Poll::Ready(Ok(()));
                }
                if body_pending {
                    return Poll::Pending;
                }
                continue;
            }
            ready!(self.queue.poll_write(stream, cx)).map_err(UpstreamError::Io)?;
        }
    }

    /// Bytes written so far.
    fn written(&self) -> u64 {
        self.queue.written()
    }
}

/// Methods whose empty body is still announced with `Content-Length: 0`.
fn carries_body(method: &Method) -> bool {
    !matches!(
        *method,
        Method::GET | Method::HEAD | Method::DELETE | Method::OPTIONS | Method::TRACE
    )
}

#[cfg(test)]
mod tests {
    //! The client against a raw socket that answers with exact bytes: framing, trailers, 1xx,
    //! HEAD, close-delimited bodies, early answers, and what goes back to the pool.

    use http_body_util::BodyExt;
    use tokio::io::AsyncWriteExt;
    use tokio::net::TcpListener;

    use std::time::Duration;

    use http::header::HeaderValue;
    use http::StatusCode;
    use tokio::time::Instant;

    use std::sync::Arc;

    use http_body::Frame;

    use super::super::pool::{ConnectError, Pool, PooledBody, IDLE_TIMEOUT};
    use super::*;
    use crate::proxy::request_body::ReplayBody;

    /// A server that reads one request head (and `body` more bytes), then writes `answer` in
    /// the given pieces; returns what it read.
    async fn server(
        answer: Vec<&'static [u8]>,
        close: bool,
    ) -> (String, tokio::task::JoinHandle<Vec<u8>>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let task = tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut seen = Vec::new();
            let mut buf = [0u8; 4096];
            while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = socket.read(&mut buf).await.unwrap();
                if n == 0 {
                    break;
                }
                seen.extend_from_slice(&buf[..n]);
            }
            for piece in answer {
                socket.write_all(piece).await.unwrap();
                socket.flush().await.unwrap();
                tokio::task::yield_now().await;
            }
            if close {
                socket.shutdown().await.unwrap();
            } else {
                // Keep the connection open until the client is done with it.
                let _ = socket.read(&mut buf).await;
            }
            seen
        });
        (addr, task)
    }

    fn request(method: Method, body: Vec<Bytes>) -> Outgoing {
        let mut request = http::Request::new(http_body_util::Either::Right(ReplayBody::of(body)));
        *request.method_mut() = method;
        *request.uri_mut() = "/v1/chat/completions?x=1".parse().unwrap();
        request
            .headers_mut()
            .insert(header::HOST, HeaderValue::from_static("upstream"));
        let (parts, body) = request.into_parts();
        Outgoing {
            parts: Box::new(parts),
            body,
        }
    }

    async fn fetch(
        pool: &Arc<Pool>,
        method: Method,
    ) -> Result<(Response<()>, Vec<Frame<Bytes>>), UpstreamError> {
        let mut checkout = pool.checkout().await.unwrap();
        let (head, framing) = checkout
            .conn
            .exchange(request(method, Vec::new()))
            .await
            .map_err(|unsent| unsent.error)?;
        let mut body = PooledBody::new(checkout.conn, framing, pool.clone());
        let mut frames = Vec::new();
        while let Some(frame) = body.frame().await {
            frames.push(frame?);
        }
        assert!(body.is_end_stream());
        Ok((head, frames))
    }

    fn idle(pool: &Pool) -> usize {
        pool.idle().lock().unwrap().len()
    }

    fn data(frames: &[Frame<Bytes>]) -> Vec<u8> {
        frames
            .iter()
            .filter_map(|f| f.data_ref())
            .flat_map(|d| d.iter().copied())
            .collect()
    }

    /// A pool of at most `cap` idle connections after `n` new ones came back to it, the
    /// server's ends of all `n`, and the pool's local ports, oldest first.
    async fn pool_of_returned(cap: usize, n: usize) -> (Pool, Vec<TcpStream>, Vec<u16>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let accepting = tokio::spawn(async move {
            let mut held = Vec::new();
            for _ in 0..n {
                held.push(listener.accept().await.unwrap().0);
            }
            held
        });
        let pool = Pool::new(addr, Duration::from_secs(5), cap);
        let mut ports = Vec::new();
        for _ in 0..n {
            let checkout = pool.connect().await.unwrap();
            ports.push(checkout.conn.stream.local_addr().unwrap().port());
            pool.checkin(checkout.conn);
        }
        (pool, accepting.await.unwrap(), ports)
    }

    /// Waits (up to 10 s) for the pool's end of `server`'s connection to be closed.
    async fn assert_closed_by_the_pool(server: &mut TcpStream) {
        let mut byte = [0u8; 1];
        let read = tokio::time::timeout(Duration::from_secs(10), server.read(&mut byte));
        assert_eq!(read.await.expect("closed by the pool").unwrap(), 0);
    }

    /// The pool keeps at most its cap of idle connections, closing the oldest, and hands out
    /// the most recently used first.
    #[tokio::test]
    async fn the_oldest_idle_connection_goes_past_the_cap() {
        let (pool, mut held, ports) = pool_of_returned(2, 3).await;
        assert_eq!(idle(&pool), 2);
        assert_closed_by_the_pool(&mut held[0]).await;
        for expected in [ports[2], ports[1]] {
            let checkout = pool.checkout().await.unwrap();
            assert!(checkout.reused);
            assert_eq!(checkout.conn.stream.local_addr().unwrap().port(), expected);
        }
        assert_eq!(idle(&pool), 0);
    }

    /// The sweep closes the idle connections the server closed, and those past their time,
    /// without waiting for a request to meet them.
    #[tokio::test]
    async fn the_sweep_closes_idle_connections_the_server_closed_or_that_expired() {
        let (pool, mut held, _) = pool_of_returned(16, 2).await;
        assert_eq!(pool.sweep(Instant::now()), 2);
        drop(held.pop());
        // The close reaches the pool's socket through the event loop.
        tokio::time::timeout(Duration::from_secs(10), async {
            while pool.sweep(Instant::now()) != 1 {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("the closed connection swept");
        let later = Instant::now() + IDLE_TIMEOUT + Duration::from_secs(1);
        assert_eq!(pool.sweep(later), 0);
        assert_closed_by_the_pool(&mut held[0]).await;
    }

    /// The request an answer is for is kept until the answer's first frames were written when
    /// its server says so (the HTTP/1.1 server), and dropped at the first poll otherwise; never
    /// on the way from the response head to the first write.
    #[tokio::test]
    async fn the_request_is_dropped_after_the_first_write_or_at_the_first_poll() {
        for deferred in [true, false] {
            let (addr, _server) = server(
                vec![b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nhi\r\n"],
                false,
            )
            .await;
            let pool = Arc::new(Pool::new(addr, Duration::from_secs(5), 4));
            let mut checkout = pool.checkout().await.unwrap();
            let (_, framing) = checkout
                .conn
                .exchange(request(Method::POST, vec![Bytes::from_static(b"{}")]))
                .await
                .map_err(|unsent| unsent.error)
                .unwrap();
            assert!(
                checkout.conn.spent.is_some(),
                "dropped with the response head"
            );
            let mut body = Box::pin(PooledBody::new(checkout.conn, framing, pool.clone()));
            if deferred {
                body.keep_request_until_written();
            }
            let frame = body.frame().await.unwrap().unwrap();
            assert_eq!(frame.into_data().unwrap(), "hi");
            let spent = |body: &PooledBody| body.conn.as_ref().unwrap().spent.is_some();
            assert_eq!(spent(&body), deferred, "deferred: {deferred}");
            body.written();
            assert!(!spent(&body));
        }
    }

    #[tokio::test]
    async fn a_chunked_body_in_pieces_with_extensions_and_trailers() {
        let (addr, server) = server(
            vec![
                b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ncontent-type: text/event-stream\r\n\r\n5;ext=1\r\nhel",
                b"lo\r\n",
                b"6\r\n world\r\n0\r\nx-checksum: 1\r\n\r\n",
            ],
            false,
        )
        .await;
        let pool = Arc::new(Pool::new(addr, Duration::from_secs(5), 16));
        let (head, frames) = fetch(&pool, Method::POST).await.unwrap();
        assert_eq!(head.status(), StatusCode::OK);
        assert_eq!(head.headers()["content-type"], "text/event-stream");
        assert_eq!(data(&frames), b"hello world");
        let trailers = frames
            .last()
            .and_then(|f| f.trailers_ref())
            .expect("trailers");
        assert_eq!(trailers["x-checksum"], "1");
        assert_eq!(idle(&pool), 1, "a clean exchange keeps its connection");
        server.abort();
    }

    #[tokio::test]
    async fn the_last_chunk_in_the_same_read_ends_the_body_with_its_frame() {
        let (addr, server) = server(
            vec![b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n4\r\ndata\r\n0\r\n\r\n"],
            false,
        )
        .await;
        let pool = Arc::new(Pool::new(addr, Duration::from_secs(5), 16));
        let mut checkout = pool.checkout().await.unwrap();
        let (_, framing) = checkout
            .conn
            .exchange(request(Method::POST, Vec::new()))
            .await
            .map_err(|unsent| unsent.error)
            .unwrap();
        let mut body = PooledBody::new(checkout.conn, framing, pool.clone());
        // The head may come alone; wait for the data frame.
        let frame = body.frame().await.unwrap().unwrap();
        assert_eq!(frame.data_ref().unwrap(), "data");
        assert!(
            body.is_end_stream(),
            "hyper stops polling at the last frame"
        );
        assert_eq!(idle(&pool), 1);
        server.abort();
    }

    #[tokio::test]
    async fn informational_answers_are_skipped_and_content_length_bodies_kept_whole() {
        let (addr, server) = server(
            vec![
                b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nlink: </a>\r\n\r\n",
                b"HTTP/1.1 201 Created\r\ncontent-length: 7\r\n\r\nabc",
                b"defg",
            ],
            false,
        )
        .await;
        let pool = Arc::new(Pool::new(addr, Duration::from_secs(5), 16));
        let (head, frames) = fetch(&pool, Method::POST).await.unwrap();
        assert_eq!(head.status(), StatusCode::CREATED);
        assert_eq!(data(&frames), b"abcdefg");
        assert_eq!(idle(&pool), 1);
        server.abort();
    }

    #[tokio::test]
    async fn a_head_answer_has_no_body_whatever_its_length() {
        let (addr, server) = server(
            vec![b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n"],
            false,
        )
        .await;
        let pool = Arc::new(Pool::new(addr, Duration::from_secs(5), 16));
        let (head, frames) = fetch(&pool, Method::HEAD).await.unwrap();
        assert_eq!(head.headers()["content-length"], "100");
        assert!(frames.is_empty());
        assert_eq!(idle(&pool), 1);
        server.abort();
    }

    #[tokio::test]
    async fn a_body_framed_by_the_close_is_read_to_the_end_and_not_kept() {
        let (addr, server) = server(vec![b"HTTP/1.1 200 OK\r\n\r\nuntil ", b"the end"], true).await;
        let pool = Arc::new(Pool::new(addr, Duration::from_secs(5), 16));
        let (_, frames) = fetch(&pool, Method::GET).await.unwrap();
        assert_eq!(data(&frames), b"until the end");
        assert_eq!(idle(&pool), 0);
        server.await.unwrap();
    }

    #[tokio::test]
    async fn connection_close_and_http_1_0_are_not_kept() {
        for answer in [
            &b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 2\r\n\r\nok"[..],
            b"HTTP/1.0 200 OK\r\ncontent-length: 2\r\n\r\nok",
        ] {
            let (addr, server) = server(vec![answer], false).await;
            let pool = Arc::new(Pool::new(addr, Duration::from_secs(5), 16));
            let (_, frames) = fetch(&pool, Method::GET).await.unwrap();
            assert_eq!(data(&frames), b"ok");
            assert_eq!(idle(&pool), 0, "{}", String::from_utf8_lossy(answer));
            server.abort();
        }
    }

    #[tokio::test]
    async fn a_body_cut_short_is_an_error_and_a_bad_chunk_size_too() {
        for answer in [
            &b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nshort"[..],
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n",
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n",
        ] {
            let (addr, server) = server(vec![answer], true).await;
            let pool = Arc::new(Pool::new(addr, Duration::from_secs(5), 16));
            let result = fetch(&pool, Method::GET).await;
            assert!(result.is_err(), "{}", String::from_utf8_lossy(answer));
            assert_eq!(idle(&pool), 0);
            server.abort();
        }
    }

    #[tokio::test]
    async fn malformed_heads_are_refused_with_what_was_wrong() {
        for (answer, expected) in [
            (
                &b"HTTP/1.1 200 OK\r\ncontent-length: 1\r\ncontent-length: 2\r\n\r\nx"[..],
                "differ",
            ),
            (
                b"HTTP/1.1 200 OK\r\ncontent-length: lots\r\n\r\n",
                "not a number",
            ),
            (b"HTTP/1.1 101 Switching Protocols\r\n\r\n", "101"),
            (b"SSH-2.0-OpenSSH\r\n\r\n", "malformed"),
        ] {
            let (addr, server) = server(vec![answer], true).await;
            let pool = Arc::new(Pool::new(addr, Duration::from_secs(5), 16));
            let error = fetch(&pool, Method::GET).await.unwrap_err();
            assert!(error.to_string().contains(expected), "{error}");
            server.abort();
        }
    }

    #[tokio::test]
    async fn the_request_goes_out_in_origin_form_with_its_body_framed() {
        let (addr, server) = server(vec![b"HTTP/1.1 204 No Content\r\n\r\n"], true).await;
        let pool = Arc::new(Pool::new(addr, Duration::from_secs(5), 16));
        let mut checkout = pool.checkout().await.unwrap();
        let body = vec![
            Bytes::from_static(b"{\"model\":"),
            Bytes::from_static(b"\"m\"}"),
        ];
        let (head, framing) = checkout
            .conn
            .exchange(request(Method::POST, body))
            .await
            .map_err(|unsent| unsent.error)
            .unwrap();
        assert_eq!(head.status(), StatusCode::NO_CONTENT);
        assert_eq!(framing, Framing::Empty);
        let seen = String::from_utf8(server.await.unwrap()).unwrap();
        assert!(
            seen.starts_with("POST /v1/chat/completions?x=1 HTTP/1.1\r\nhost: upstream\r\ncontent-length: 13\r\n\r\n"),
            "{seen}"
        );
        // The server stops reading at the end of the head: the body came in the same write.
        assert!(
            seen.ends_with("{\"model\":\"m\"}"),
            "the head and the body leave in one writev: {seen}"
        );
    }

    #[tokio::test]
    async fn an_idle_connection_the_server_closed_is_not_handed_out() {
        let (addr, server) = server(
            vec![b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"],
            true,
        )
        .await;
        let pool = Arc::new(Pool::new(addr.clone(), Duration::from_secs(5), 16));
        // The server closes after answering, without saying so (llama.cpp's habit).
        let (_, frames) = fetch(&pool, Method::GET).await.unwrap();
        assert_eq!(data(&frames), b"ok");
        server.await.unwrap();
        assert_eq!(idle(&pool), 1);
        // Its FIN has arrived by now: the peek sees it and a new connection is made instead.
        let mut closed = false;
        for _ in 0..100 {
            let open = pool.idle().lock().unwrap()[0].conn.is_open();
            if !open {
                closed = true;
                break;
            }
            tokio::task::yield_now().await;
        }
        assert!(closed, "the server's close is visible to the peek");
        let listener_gone = pool.checkout().await;
        assert!(
            matches!(listener_gone, Err(ConnectError::Io(_))),
            "the closed connection was not reused; connecting anew found no listener"
        );
    }

    /// A stream's frames are cut from the connection's read buffer. Made room for while the
    /// last frame was still queued for the client (the poll after a frame, which finds nothing
    /// to read), the buffer was shared, and a new one was taken every few frames; made room for
    /// once bytes are there, it is the same buffer for the whole stream.
    #[tokio::test]
    async fn a_stream_reads_into_the_buffer_its_written_frames_leave() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (go, mut went) = tokio::sync::mpsc::channel::<Vec<u8>>(1);
        let server = tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut buf = [0u8; 4096];
            let _ = socket.read(&mut buf).await.unwrap();
            while let Some(piece) = went.recv().await {
                socket.write_all(&piece).await.unwrap();
            }
        });
        let mut conn = Conn::new(TcpStream::connect(addr).await.unwrap());
        go.send(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n".to_vec())
            .await
            .unwrap();
        let (_, framing) = conn
            .exchange(request(Method::POST, Vec::new()))
            .await
            .map_err(|unsent| unsent.error)
            .unwrap();
        let pool = Arc::new(Pool::new(addr.to_string(), Duration::from_secs(5), 16));
        let mut body = PooledBody::new(Box::new(conn), framing, pool);
        let event = format!(
            "data: {{\"choices\":[{{\"delta\":{{\"content\":\"{}\"}}}}]}}\n\n",
            "x".repeat(60)
        );
        let mut buffers: Vec<usize> = Vec::new();
        for _ in 0..40 {
            go.send(format!("{:x}\r\n{event}\r\n", event.len()).into_bytes())
                .await
                .unwrap();
            let frame = body.frame().await.unwrap().unwrap();
            let data = frame.into_data().unwrap();
            assert_eq!(data, event.as_bytes());
            // As the connection loop does: poll on (nothing more yet) with the frame queued,
            // then write it and drop it.
            let pending = std::future::poll_fn(|cx| {
                Poll::Ready(Pin::new(&mut body).poll_frame(cx).is_pending())
            })
            .await;
            assert!(pending);
            let at = data.as_ptr() as usize;
            if !buffers
                .iter()
                .any(|&seen| seen.abs_diff(at) < READ_BUFFER_MIN)
            {
                buffers.push(at);
            }
            drop(data);
        }
        assert_eq!(
            buffers.len(),
            1,
            "40 frames of {} bytes came from {} buffers",
            event.len(),
            buffers.len()
        );
        server.abort();
    }

    /// An upload to an upstream that does not read used to be taken from the client 16 frames
    /// at a time, whatever their size: what is taken beyond what the socket took must stay
    /// within the write queue's bound.
    #[tokio::test]
    async fn an_upstream_that_does_not_read_holds_the_body_back() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let accept = tokio::spawn(async move { listener.accept().await.unwrap().0 });
        let mut stream = TcpStream::connect(addr).await.unwrap();
        // Accepted and never read.
        let _peer = accept.await.unwrap();
        let frame = Bytes::from(vec![b'x'; 64 << 10]);
        let total = 256 * frame.len() as u64;
        let Outgoing { parts, mut body } = request(Method::POST, vec![frame; 256]);
        let mut sending = Sending::new(&parts, &body);
        let head = sending.queue.queued() as u64;
        let polled =
            std::future::poll_fn(|cx| Poll::Ready(sending.poll(&mut stream, &mut body, cx))).await;
        assert!(polled.is_pending(), "the socket filled up");
        let taken = total - body.size_hint().exact().unwrap();
        let sent = sending.written() - head;
        assert!(
            // At most 16 KiB queued, plus the one frame that went past it.
            taken - sent <= 80 << 10,
            "{} KiB taken from the client beyond the {} KiB the socket took",
            (taken - sent) >> 10,
            sent >> 10
        );
    }
}
