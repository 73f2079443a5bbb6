//! The connections to the model server: a pool of HTTP/1.1 keep-alive connections, and the
//! response body that gives its connection back to the pool when it ends.
//!
//! The pool is the proxy's own (hyper's `client::conn`, not hyper-util's pooled client) because
//! the proxy must know, for every request, whether its connection was new or reused, how long
//! connecting took, and whether the connection received any byte of the response: a reused
//! connection that the server closed while it sat idle (llama.cpp closes every kept-alive
//! connection after a streamed response, without saying so) fails a request that the server
//! never saw, and only then may the request be sent again (see `forward.rs`).

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
const MAX_IDLE: usize = 256;
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

/// A connection taken from the pool (or just made) for one request.
pub(crate) struct Checkout {
    pub(crate) sender: SendRequest<UpstreamBody>,
    pub(crate) info: Arc<ConnInfo>,
    /// It carried a request before.
    pub(crate) reused: bool,
    /// How long connecting took, for a new connection.
    pub(crate) connect: Option<Duration>,
}

struct Idle {
    sender: SendRequest<UpstreamBody>,
    info: Arc<ConnInfo>,
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
            let Some(mut idle) = idle else { break };
            if idle.sender.is_closed() || now.saturating_duration_since(idle.since) > IDLE_TIMEOUT {
                continue;
            }
            // A connection comes back as soon as its response ended, a moment before hyper's
            // connection task is ready for the next request: wait that moment, not longer.
            if !idle.sender.is_ready()
                && !matches!(
                    tokio::time::timeout(READY_WAIT, idle.sender.ready()).await,
                    Ok(Ok(()))
                )
            {
                continue;
            }
            return Ok(Checkout {
                sender: idle.sender,
                info: idle.info,
                reused: true,
                connect: None,
            });
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
            let (sender, connection) = hyper::client::conn::http1::Builder::new()
                .max_buf_size(READ_BUFFER)
                .handshake(io)
                .await
                .map_err(ConnectError::Handshake)?;
            tokio::spawn(async move {
                if let Err(e) = connection.await {
                    tracing::debug!(error = %e, "upstream connection ended with an error");
                }
            });
            Ok((sender, info))
        };
        let (sender, info) = tokio::time::timeout(self.connect_timeout, connecting)
            .await
            .map_err(|_| ConnectError::TimedOut(self.connect_timeout))??;
        Ok(Checkout {
            sender,
            info,
            reused: false,
            connect: Some(started.elapsed()),
        })
    }

    /// A connection whose response ended cleanly comes back for the next request.
    fn checkin(&self, sender: SendRequest<UpstreamBody>, info: Arc<ConnInfo>) {
        if sender.is_closed() {
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
        idle.push(Idle {
            sender,
            info,
            since: now,
        });
    }
}

pin_project! {
    /// The upstream's response body; when it ends cleanly its connection goes back to the pool.
    /// Dropped before its end (the client went away), the connection is closed with it, which
    /// stops the model server's generation.
    pub(crate) struct PooledBody {
        #[pin]
        inner: Incoming,
        back: Option<(Arc<Pool>, SendRequest<UpstreamBody>, Arc<ConnInfo>)>,
    }
}

impl PooledBody {
    pub(crate) fn new(
        inner: Incoming,
        pool: Arc<Pool>,
        sender: SendRequest<UpstreamBody>,
        info: Arc<ConnInfo>,
    ) -> Self {
        let mut body = PooledBody {
            inner,
            back: Some((pool, sender, info)),
        };
        if body.inner.is_end_stream() {
            body.give_back();
        }
        body
    }

    fn give_back(&mut self) {
        if let Some((pool, sender, info)) = self.back.take() {
            pool.checkin(sender, info);
        }
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
        let polled = std::task::ready!(this.inner.as_mut().poll_frame(cx));
        let ended = match &polled {
            None => true,
            Some(Ok(frame)) => frame.is_trailers() || this.inner.is_end_stream(),
            Some(Err(_)) => {
                this.back.take();
                false
            }
        };
        if ended {
            if let Some((pool, sender, info)) = this.back.take() {
                pool.checkin(sender, info);
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
