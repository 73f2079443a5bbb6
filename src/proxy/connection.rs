//! One client connection, from accept to close: which HTTP version it speaks, the limits it is
//! served with, and when it is closed.
//!
//! Every connection is bounded in time and memory, whatever the client does:
//! - the first bytes must come within `timeouts.request_head` (they decide between HTTP/1.1 and
//!   the HTTP/2 preface, so a client that sends nothing or a partial preface is closed);
//! - HTTP/1.1 (the proxy's own server, [`h1`]): a request head must be complete within
//!   `timeouts.request_head` of its first byte and may be at most
//!   `limits.max_request_head_bytes`; a keep-alive connection waiting longer than
//!   `timeouts.client_idle` for its next request is closed;
//! - HTTP/2: at most `limits.max_concurrent_streams` streams, a send buffer of
//!   [`H2_SEND_BUFFER`] per stream, bounded flow-control windows, and a GOAWAY when the
//!   connection has had no request in progress for `timeouts.client_idle`, or when its client
//!   cancels more than [`RESET_BUDGET`] requests in [`RESET_WINDOW`] (rapid reset);
//! - the kernel's send buffer is [`SEND_BUFFER`], so a client that stops reading stops the
//!   proxy from handing it frames soon after (`docs/MEASUREMENT.md` states the bound).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use pin_project_lite::pin_project;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::{watch, Notify};
use tokio::time::Instant;

use super::client_body::ClientBody;
use super::http1::server as h1;
use super::http1::server::Written;

/// The HTTP/2 connection preface (RFC 9113 §3.4).
const H2_PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// The kernel send buffer asked for on every client socket (Linux doubles it). Small, so that a
/// client that stops reading holds back the proxy within a bounded number of bytes.
pub(crate) const SEND_BUFFER: usize = 64 << 10;
/// What HTTP/2 may buffer per stream ahead of the client's flow-control window.
pub(crate) const H2_SEND_BUFFER: usize = 64 << 10;
/// HTTP/2 flow-control windows the proxy grants for request bodies: a stream, and the whole
/// connection. Uploads beyond them wait for the upstream to read.
const H2_STREAM_WINDOW: u32 = 256 << 10;
const H2_CONNECTION_WINDOW: u32 = 1 << 20;
/// Cancelled requests one connection may have in [`RESET_WINDOW`] before it is sent GOAWAY.
pub(crate) const RESET_BUDGET: u32 = 200;
pub(crate) const RESET_WINDOW: Duration = Duration::from_secs(10);

/// How one listener serves its connections.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    pub(crate) request_head: Duration,
    pub(crate) client_idle: Duration,
    pub(crate) max_head_bytes: usize,
    pub(crate) max_streams: u32,
}

/// What a connection's requests tell the connection: how many are in progress, and whether its
/// client is abusing cancellation.
pub(crate) struct ConnState {
    active: AtomicUsize,
    changed: Notify,
    /// Set when the connection should be closed gracefully (too many cancellations).
    closing: AtomicBool,
    resets: Mutex<(Instant, u32)>,
}

impl ConnState {
    fn new() -> Arc<ConnState> {
        Arc::new(ConnState {
            active: AtomicUsize::new(0),
            changed: Notify::new(),
            closing: AtomicBool::new(false),
            resets: Mutex::new((Instant::now(), 0)),
        })
    }

    /// A request started; it is in progress until the guard is dropped.
    pub(crate) fn start(self: &Arc<Self>) -> ActiveGuard {
        self.active.fetch_add(1, Ordering::Relaxed);
        ActiveGuard {
            conn: self.clone(),
            completed: false,
        }
    }

    fn note_cancel(&self) {
        let now = Instant::now();
        let mut resets = self.resets.lock().unwrap_or_else(|p| p.into_inner());
        if now.saturating_duration_since(resets.0) > RESET_WINDOW {
            *resets = (now, 0);
        }
        resets.1 += 1;
        if resets.1 > RESET_BUDGET && !self.closing.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                cancelled = resets.1,
                "a client cancelled too many requests on one connection; closing it (GOAWAY)"
            );
            self.changed.notify_waiters();
        }
    }

    /// Resolves when the connection should close gracefully: no request in progress for `idle`,
    /// or its client is abusing cancellation.
    async fn should_close(&self, idle: Duration) {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if self.closing.load(Ordering::Relaxed) {
                return;
            }
            if self.active.load(Ordering::Relaxed) == 0 {
                tokio::select! {
                    // A request that started meanwhile does not notify (only the last to end
                    // does): check again before closing.
                    () = tokio::time::sleep(idle) => {
                        if self.active.load(Ordering::Relaxed) == 0 {
                            return;
                        }
                    }
                    () = changed => {}
                }
            } else {
                changed.await;
            }
        }
    }
}

/// One request in progress on a connection.
pub(crate) struct ActiveGuard {
    conn: Arc<ConnState>,
    completed: bool,
}

impl Drop for ActiveGuard {
    fn drop(&mut self) {
        if self.conn.active.fetch_sub(1, Ordering::Relaxed) == 1 {
            self.conn.changed.notify_waiters();
        }
        if !self.completed {
            self.conn.note_cancel();
        }
    }
}

pin_project! {
    /// A response body that keeps its request counted as in progress on its connection until it
    /// ends; dropped before its end, the request was cancelled by the client.
    pub(crate) struct Tracked<B> {
        #[pin]
        inner: B,
        guard: ActiveGuard,
    }
}

impl<B: Body<Data = Bytes>> Body for Tracked<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = self.project();
        let mut inner = this.inner;
        let polled = std::task::ready!(inner.as_mut().poll_frame(cx));
        match &polled {
            None | Some(Err(_)) => this.guard.completed = true,
            Some(Ok(frame)) if frame.is_trailers() => this.guard.completed = true,
            // The servers poll no more once the body says it has ended: its last frame completes it.
            Some(Ok(_)) if inner.is_end_stream() => this.guard.completed = true,
            Some(Ok(_)) => {}
        }
        Poll::Ready(polled)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A per-connection service: the listener's service, with each request counted on its
/// connection.
#[derive(Clone)]
pub(crate) struct Counted<S> {
    inner: S,
    conn: Arc<ConnState>,
}

impl<S, B> hyper::service::Service<Request<ClientBody>> for Counted<S>
where
    S: hyper::service::Service<Request<ClientBody>, Response = Response<B>>,
    S::Future: Send + 'static,
    B: Body<Data = Bytes>,
{
    type Response = Response<Tracked<B>>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, S::Error>> + Send>>;

    fn call(&self, request: Request<ClientBody>) -> Self::Future {
        let mut guard = self.conn.start();
        let response = self.inner.call(request);
        Box::pin(async move {
            let response = response.await?;
            if response.body().is_end_stream() {
                guard.completed = true;
            }
            Ok(response.map(|inner| Tracked { inner, guard }))
        })
    }
}

/// A service over [`ClientBody`] as hyper's HTTP/2 connection needs it: over `Incoming`.
struct Http2<S>(S);

impl<S: hyper::service::Service<Request<ClientBody>>> hyper::service::Service<Request<Incoming>>
    for Http2<S>
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn call(&self, request: Request<Incoming>) -> Self::Future {
        self.0.call(request.map(ClientBody::http2))
    }
}

/// The client's bytes read while telling HTTP/1.1 from HTTP/2, handed back before the rest.
struct Prefixed {
    prefix: [u8; 24],
    start: usize,
    end: usize,
    stream: TcpStream,
}

impl AsyncRead for Prefixed {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = &mut *self;
        if this.start < this.end {
            let n = (this.end - this.start).min(buf.remaining());
            buf.put_slice(&this.prefix[this.start..this.start + n]);
            this.start += n;
            // The rest of what the client sent comes in the same read: handed over alone, the
            // prefix would leave the reader's buffer short for its next read, and a reader that
            // doubles a buffer that fills would keep the larger one for the connection's life.
            // A socket error here shows again on the next read.
            if this.start == this.end && buf.remaining() > 0 {
                let _ = Pin::new(&mut this.stream).poll_read(cx, buf);
            }
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Prefixed {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

/// Which protocol the first bytes announce.
enum Protocol {
    Http1,
    Http2,
}

/// Reads until the first bytes tell HTTP/1.1 from the HTTP/2 preface; `None` when the client
/// closed or sent too little in time.
async fn detect(stream: &mut TcpStream, within: Duration) -> Option<(Protocol, [u8; 24], usize)> {
    let mut prefix = [0u8; 24];
    let mut len = 0;
    let read = async {
        loop {
            let n = stream.read(&mut prefix[len..]).await.ok()?;
            if n == 0 {
                return None;
            }
            len += n;
            if prefix[..len] != H2_PREFACE[..len] {
                return Some(Protocol::Http1);
            }
            if len == H2_PREFACE.len() {
                return Some(Protocol::Http2);
            }
        }
    };
    let protocol = tokio::time::timeout(within, read).await.ok()??;
    Some((protocol, prefix, len))
}

/// Serves one accepted connection to its end: `make` builds the connection's service from its
/// state; `shutdown` turning true asks for a graceful close (in-flight responses finish).
pub(crate) async fn serve<S, B, F>(
    mut stream: TcpStream,
    limits: Limits,
    make: F,
    mut shutdown: watch::Receiver<bool>,
) where
    F: FnOnce(Arc<ConnState>) -> S,
    S: hyper::service::Service<Request<ClientBody>, Response = Response<B>>
        + h1::Service<Body = B>
        + Send
        + 'static,
    <S as hyper::service::Service<Request<ClientBody>>>::Future: Send + 'static,
    <S as hyper::service::Service<Request<ClientBody>>>::Error:
        Into<Box<dyn std::error::Error + Send + Sync>>,
    B: Body<Data = Bytes> + Written + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let socket = socket2::SockRef::from(&stream);
    if let Err(e) = socket.set_send_buffer_size(SEND_BUFFER) {
        tracing::debug!(error = %e, "cannot set the client socket's send buffer");
    }
    let Some((protocol, prefix, end)) = detect(&mut stream, limits.request_head).await else {
        return;
    };
    let conn = ConnState::new();
    match protocol {
        Protocol::Http1 => {
            let limits = h1::Limits {
                request_head: limits.request_head,
                client_idle: limits.client_idle,
                max_head_bytes: limits.max_head_bytes,
            };
            // One request at a time, and no cancellation to count (that is HTTP/2's rapid
            // reset): the service as it is, without the per-request count and body wrapper.
            h1::serve(stream, &prefix[..end], limits, make(conn), &mut shutdown).await;
        }
        // Boxed: hyper's HTTP/2 connection state would otherwise size every connection's task,
        // HTTP/1.1 ones included.
        Protocol::Http2 => {
            Box::pin(serve_http2(
                stream,
                prefix,
                end,
                limits,
                make(conn.clone()),
                conn,
                shutdown,
            ))
            .await
        }
    }
}

/// Serves an HTTP/2 connection with hyper.
async fn serve_http2<S, B>(
    stream: TcpStream,
    prefix: [u8; 24],
    end: usize,
    limits: Limits,
    service: S,
    conn: Arc<ConnState>,
    mut shutdown: watch::Receiver<bool>,
) where
    S: hyper::service::Service<Request<ClientBody>, Response = Response<B>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let service = Counted {
        inner: service,
        conn: conn.clone(),
    };
    let io = TokioIo::new(Prefixed {
        prefix,
        start: 0,
        end,
        stream,
    });
    let connection = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
        .timer(TokioTimer::new())
        .max_concurrent_streams(limits.max_streams)
        .max_send_buf_size(H2_SEND_BUFFER)
        .initial_stream_window_size(H2_STREAM_WINDOW)
        .initial_connection_window_size(H2_CONNECTION_WINDOW)
        .max_header_list_size(limits.max_head_bytes as u32)
        .serve_connection(io, Http2(service));
    tokio::pin!(connection);
    drive(connection, &conn, Some(limits.client_idle), &mut shutdown).await;
}

/// A connection hyper serves, which can be asked to close gracefully.
trait Graceful: Future<Output = Result<(), hyper::Error>> {
    fn close_gracefully(self: Pin<&mut Self>);
}

impl<I, S, B, E> Graceful for hyper::server::conn::http2::Connection<I, S, E>
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin,
    S: hyper::service::HttpService<Incoming, ResBody = B>,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    B: Body + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    E: hyper::rt::bounds::Http2ServerConnExec<S::Future, B>,
{
    fn close_gracefully(self: Pin<&mut Self>) {
        self.graceful_shutdown();
    }
}

/// Runs a connection to its end, closing it gracefully on shutdown, and (with `idle`) when it
/// should close by [`ConnState::should_close`].
async fn drive<C: Graceful>(
    mut connection: Pin<&mut C>,
    conn: &ConnState,
    idle: Option<Duration>,
    shutdown: &mut watch::Receiver<bool>,
) {
    let mut closing = *shutdown.borrow();
    if closing {
        connection.as_mut().close_gracefully();
    }
    let watch_idle = async {
        match idle {
            Some(idle) => conn.should_close(idle).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(watch_idle);
    // After an idle or abuse GOAWAY, how long the client has to finish what it had in flight;
    // a client that never acknowledges the GOAWAY's PING would otherwise keep it open.
    let grace = tokio::time::sleep(Duration::MAX);
    tokio::pin!(grace);
    let mut graced = false;
    loop {
        // Biased: the connection first, as it is what wakes this task for every frame; the
        // rest are checked after it, in order, without drawing a random number per wake-up.
        tokio::select! {
            biased;
            ended = connection.as_mut() => {
                if let Err(e) = ended {
                    tracing::debug!(error = %e, "client connection ended with an error");
                }
                return;
            }
            () = &mut watch_idle, if !closing => {
                tracing::debug!("closing an idle or abusive HTTP/2 connection");
                connection.as_mut().close_gracefully();
                closing = true;
                graced = true;
                let idle = idle.unwrap_or(Duration::ZERO);
                grace.as_mut().reset(Instant::now() + idle);
            }
            () = &mut grace, if graced => {
                if conn.active.load(Ordering::Relaxed) == 0 {
                    tracing::debug!("the client did not close after GOAWAY; dropping the connection");
                    return;
                }
                let idle = idle.unwrap_or(Duration::ZERO);
                grace.as_mut().reset(Instant::now() + idle);
            }
            changed = shutdown.changed(), if !closing => {
                if changed.is_err() || *shutdown.borrow() {
                    connection.as_mut().close_gracefully();
                    closing = true;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    /// The bytes read while telling the protocols apart come back together with what followed
    /// them: handed over alone, they made hyper double its read buffer for the connection's life.
    #[tokio::test]
    async fn the_prefix_and_what_followed_come_in_one_read() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut client = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (mut server, _) = listener.accept().await.unwrap();
        client
            .write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .unwrap();
        let mut prefix = [0u8; 24];
        server.read_exact(&mut prefix).await.unwrap();
        server.readable().await.unwrap();
        let mut io = Prefixed {
            prefix,
            start: 0,
            end: 24,
            stream: server,
        };
        let mut space = [0u8; 8192];
        let mut buf = ReadBuf::new(&mut space);
        std::future::poll_fn(|cx| Pin::new(&mut io).poll_read(cx, &mut buf))
            .await
            .unwrap();
        assert_eq!(buf.filled(), b"GET / HTTP/1.1\r\nhost: x\r\n\r\n");
    }

    /// A connection's task is as large as its largest state, for the connection's whole life:
    /// the state of a response being sent (its body, the recorder) and hyper's HTTP/2 connection
    /// are on the heap only while used, so an idle keep-alive connection stays small.
    #[tokio::test]
    async fn a_connections_task_stays_small() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let _client = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (server, _) = listener.accept().await.unwrap();
        let (_keep, shutdown) = watch::channel(false);
        let limits = Limits {
            request_head: Duration::from_secs(1),
            client_idle: Duration::from_secs(1),
            max_head_bytes: 8 << 10,
            max_streams: 1,
        };
        let service = hyper::service::service_fn(|_: Request<ClientBody>| async {
            let body =
                super::super::service::ProxyBody::own(http_body_util::Full::new(Bytes::new()));
            Ok::<_, std::convert::Infallible>(Response::new(body))
        });
        let task = serve(server, limits, move |_| h1::Hyper(service), shutdown);
        let size = std::mem::size_of_val(&task);
        assert!(size < 2048, "a connection's task takes {size} bytes");
    }
}
