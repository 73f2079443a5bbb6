//! The connections to the model server: a pool of HTTP/1.1 keep-alive connections, and the
//! response body that gives its connection back to the pool when it ends.
//!
//! The pool is the proxy's own (hyper's `client::conn`, not hyper-util's pooled client) because
//! the proxy must know, for every request, whether its connection was new or reused, how long
//! connecting took, and whether the connection received any byte of the response: a reused
//! connection that the server closed while it sat idle (llama.cpp closes every kept-alive
//! connection after a streamed response, without saying so) fails a request that the server
//! never saw, and only then may the request be sent again (see `forward.rs`).
//!
//! A connection is driven by the request that uses it, not by a task of its own: the request's
//! future polls it while waiting for the head, and the response body polls it before each frame.
//! A frame then goes from the upstream socket to the client socket within one task, with one
//! wake-up instead of two (a connection task, then the client's), and a client that stops reading
//! stops the upstream reads with it. An idle connection is not polled at all until its next
//! checkout, which notices if the server closed it meanwhile.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use pin_project_lite::pin_project;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::Instant;

use super::request_body::UpstreamBody;

/// How long an idle connection is kept: under the usual keep-alive timeouts of servers (uvicorn
/// 5 s is the exception, and its early closes are what the retry is for).
const IDLE_TIMEOUT: Duration = Duration::from_secs(90);
/// Idle connections kept at most; more are closed when they come back.
const MAX_IDLE: usize = 1024;
/// How long a pooled connection may take to become ready for its next request.
const READY_WAIT: Duration = Duration::from_millis(100);
/// hyper's read buffer for a response: response chunks handed on are at most this large.
const READ_BUFFER: usize = 64 << 10;

/// What the proxy knows of one upstream connection.
pub(crate) struct ConnInfo {
    /// Bytes received on the connection so far.
    received: AtomicU64,
}

impl ConnInfo {
    pub(crate) fn received(&self) -> u64 {
        self.received.load(Ordering::Relaxed)
    }
}

/// hyper's side of one upstream connection: the future that reads and writes its socket.
type Connection = hyper::client::conn::http1::Connection<TokioIo<Counted>, UpstreamBody>;

/// One upstream connection: the handle to send on and the connection to drive.
pub(crate) struct Conn {
    pub(crate) sender: SendRequest<UpstreamBody>,
    driver: Pin<Box<Connection>>,
    /// The connection future has finished: the connection is closed.
    ended: bool,
    pub(crate) info: Arc<ConnInfo>,
}

impl Conn {
    /// Drives the connection: reads and writes whatever its socket allows now.
    pub(crate) fn drive(&mut self, cx: &mut Context<'_>) {
        if !self.ended {
            if let Poll::Ready(result) = self.driver.as_mut().poll(cx) {
                if let Err(e) = result {
                    tracing::debug!(error = %e, "upstream connection ended with an error");
                }
                self.ended = true;
            }
        }
    }

    fn is_open(&self) -> bool {
        !self.ended && !self.sender.is_closed()
    }
}

/// A connection taken from the pool (or just made) for one request.
pub(crate) struct Checkout {
    pub(crate) conn: Conn,
    /// It carried a request before.
    pub(crate) reused: bool,
    /// How long connecting took, for a new connection.
    pub(crate) connect: Option<Duration>,
}

struct Idle {
    conn: Conn,
    since: Instant,
}

/// The idle connections to one upstream.
pub(crate) struct Pool {
    /// `host:port`.
    authority: String,
    connect_timeout: Duration,
    idle: Mutex<Vec<Idle>>,
}

/// Why no connection could be had.
#[derive(Debug)]
pub(crate) enum ConnectError {
    TimedOut(Duration),
    Io(std::io::Error),
    Handshake(hyper::Error),
}

impl std::fmt::Display for ConnectError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConnectError::TimedOut(after) => write!(
                f,
                "connecting timed out after {}",
                humantime::format_duration(*after)
            ),
            ConnectError::Io(e) => write!(f, "{e}"),
            ConnectError::Handshake(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for ConnectError {}

impl Pool {
    pub(crate) fn new(authority: String, connect_timeout: Duration) -> Pool {
        Pool {
            authority,
            connect_timeout,
            idle: Mutex::new(Vec::new()),
        }
    }

    /// The most recently used idle connection that is still open, else a new one.
    pub(crate) async fn checkout(&self) -> Result<Checkout, ConnectError> {
        let now = Instant::now();
        loop {
            let idle = self.idle.lock().unwrap_or_else(|p| p.into_inner()).pop();
            let Some(Idle { mut conn, since }) = idle else {
                break;
            };
            if now.saturating_duration_since(since) > IDLE_TIMEOUT {
                continue;
            }
            // Not polled while idle: drive it now, to learn whether the server closed it and to
            // let hyper make it ready for the next request (a moment after the last response).
            let ready = tokio::time::timeout(
                READY_WAIT,
                std::future::poll_fn(|cx| {
                    conn.drive(cx);
                    if !conn.is_open() {
                        return Poll::Ready(false);
                    }
                    conn.sender.poll_ready(cx).map(|r| r.is_ok())
                }),
            )
            .await;
            if matches!(ready, Ok(true)) && conn.is_open() {
                return Ok(Checkout {
                    conn,
                    reused: true,
                    connect: None,
                });
            }
        }
        self.connect().await
    }

    /// A new connection, whatever is idle.
    pub(crate) async fn connect(&self) -> Result<Checkout, ConnectError> {
        let started = Instant::now();
        let connecting = async {
            let stream = TcpStream::connect(&self.authority)
                .await
                .map_err(ConnectError::Io)?;
            // Without TCP_NODELAY, small SSE writes meet Nagle and delayed ACKs: a 40 ms stall.
            stream.set_nodelay(true).map_err(ConnectError::Io)?;
            let info = Arc::new(ConnInfo {
                received: AtomicU64::new(0),
            });
            let io = TokioIo::new(Counted {
                stream,
                info: info.clone(),
            });
            let (sender, driver) = hyper::client::conn::http1::Builder::new()
                .max_buf_size(READ_BUFFER)
                .handshake(io)
                .await
                .map_err(ConnectError::Handshake)?;
            Ok(Conn {
                sender,
                driver: Box::pin(driver),
                ended: false,
                info,
            })
        };
        let conn = tokio::time::timeout(self.connect_timeout, connecting)
            .await
            .map_err(|_| ConnectError::TimedOut(self.connect_timeout))??;
        Ok(Checkout {
            conn,
            reused: false,
            connect: Some(started.elapsed()),
        })
    }

    /// A connection whose response ended cleanly comes back for the next request.
    fn checkin(&self, conn: Conn) {
        if !conn.is_open() {
            return;
        }
        let now = Instant::now();
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        // The oldest are at the front: drop those past their time, and any beyond the cap.
        let expired = idle
            .iter()
            .take_while(|i| now.saturating_duration_since(i.since) > IDLE_TIMEOUT)
            .count();
        idle.drain(..expired);
        if idle.len() >= MAX_IDLE {
            idle.remove(0);
        }
        idle.push(Idle { conn, since: now });
    }
}

pin_project! {
    /// The upstream's response body, driving its connection before each frame; when it ends
    /// cleanly its connection goes back to the pool. Dropped before its end (the client went
    /// away), the connection is closed with it, which stops the model server's generation.
    pub(crate) struct PooledBody {
        #[pin]
        inner: Incoming,
        conn: Option<Conn>,
        pool: Arc<Pool>,
        // An error held back for one poll (see poll_frame).
        failed: Option<hyper::Error>,
    }
}

impl PooledBody {
    pub(crate) fn new(inner: Incoming, pool: Arc<Pool>, conn: Conn) -> Self {
        let mut body = PooledBody {
            inner,
            conn: Some(conn),
            pool,
            failed: None,
        };
        if body.inner.is_end_stream() {
            if let Some(conn) = body.conn.take() {
                body.pool.checkin(conn);
            }
        }
        body
    }
}

impl Body for PooledBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let mut this = self.project();
        if let Some(error) = this.failed.take() {
            return Poll::Ready(Some(Err(error)));
        }
        if let Some(conn) = this.conn.as_mut() {
            conn.drive(cx);
        }
        let polled = std::task::ready!(this.inner.as_mut().poll_frame(cx));
        let ended = match polled {
            None => true,
            Some(Ok(ref frame)) => frame.is_trailers() || this.inner.is_end_stream(),
            Some(Err(error)) => {
                this.conn.take();
                // The frames handed on before the break may still sit in hyper's write buffer,
                // which an error would discard with the connection: give it one turn to send
                // them (it flushes when the body is pending), then report the error.
                *this.failed = Some(error);
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
        };
        if ended {
            if let Some(conn) = this.conn.take() {
                this.pool.checkin(conn);
            }
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

/// The upstream socket, counting what it receives.
struct Counted {
    stream: TcpStream,
    info: Arc<ConnInfo>,
}

impl AsyncRead for Counted {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let this = &mut *self;
        let polled = Pin::new(&mut this.stream).poll_read(cx, buf);
        let got = buf.filled().len() - before;
        if got > 0 {
            this.info.received.fetch_add(got as u64, Ordering::Relaxed);
        }
        polled
    }
}

impl AsyncWrite for Counted {
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
