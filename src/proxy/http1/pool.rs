//! The pool of keep-alive connections to the model server, kept per shard, and the response
//! body ([`PooledBody`]) that reads an answer straight from its connection and gives the
//! connection back when the answer ends cleanly ([`Conn::rest`]). A connection is handed out
//! only while the server has not closed it ([`Conn::is_open`]) and it is younger than
//! [`IDLE_TIMEOUT`].

use std::collections::VecDeque;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tokio::net::TcpStream;
use tokio::time::Instant;

use super::body::{Decoder, Malformed};
use super::client::{Conn, UpstreamError};
use super::head::Framing;
use crate::proxy::shard;

/// How long an idle connection is kept: under the usual keep-alive timeouts of servers (uvicorn
/// 5 s is the exception, and its early closes are what the retry is for).
pub(super) const IDLE_TIMEOUT: Duration = Duration::from_secs(90);
/// How often the idle connections are swept for those past [`IDLE_TIMEOUT`] or closed by the
/// server, so that a proxy that has gone quiet after a burst does not keep the burst's sockets.
pub(crate) const IDLE_SWEEP: Duration = Duration::from_secs(15);

/// A connection taken from the pool (or just made) for one request.
pub(crate) struct Checkout {
    /// Boxed for its life, made once per connection: it goes from the pool to the request, to
    /// its response body and back, a pointer each time.
    pub(crate) conn: Box<Conn>,
    /// It carried a request before.
    pub(crate) reused: bool,
    /// How long connecting took, for a new connection.
    pub(crate) connect: Option<Duration>,
}

pub(super) struct Idle {
    pub(super) conn: Box<Conn>,
    since: Instant,
}

/// The idle connections to one upstream, kept per shard: a connection's socket is watched by
/// the `epoll` of the shard that made it, so only that shard's requests reuse it (another
/// shard's would be woken through the first one's thread, one more wake-up per frame).
pub(crate) struct Pool {
    /// `host:port`.
    authority: String,
    connect_timeout: Duration,
    /// Idle connections kept at most per shard; the oldest is closed when one more comes back.
    max_idle: usize,
    /// Oldest at the front.
    idle: Box<[Mutex<VecDeque<Idle>>]>,
}

/// Why no connection could be had.
#[derive(Debug)]
pub(crate) enum ConnectError {
    TimedOut(Duration),
    Io(io::Error),
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
        }
    }
}

impl std::error::Error for ConnectError {}

impl Pool {
    /// `max_idle`: the idle connections kept per shard (at least one).
    pub(crate) fn new(authority: String, connect_timeout: Duration, max_idle: usize) -> Pool {
        Pool {
            authority,
            connect_timeout,
            max_idle: max_idle.max(1),
            idle: (0..shard::MAX)
                .map(|_| Mutex::new(VecDeque::new()))
                .collect(),
        }
    }

    /// This shard's idle connections.
    pub(super) fn idle(&self) -> &Mutex<VecDeque<Idle>> {
        &self.idle[shard::current() % self.idle.len()]
    }

    /// The most recently used idle connection that is still open, else a new one (the
    /// forwarder does the same in two steps, see [`Pool::reuse`]).
    #[cfg(test)]
    pub(crate) async fn checkout(&self) -> Result<Checkout, ConnectError> {
        match self.reuse() {
            Some(checkout) => Ok(checkout),
            None => self.connect().await,
        }
    }

    /// The most recently used idle connection that is still open, if any: what
    /// [`Pool::checkout`] takes first, without waiting (a caller that waits for a new connection
    /// only when there is none keeps the connecting's state out of every request's future).
    pub(crate) fn reuse(&self) -> Option<Checkout> {
        let now = Instant::now();
        loop {
            let Idle { conn, since } = self
                .idle()
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .pop_back()?;
            if now.saturating_duration_since(since) <= IDLE_TIMEOUT && conn.is_open() {
                return Some(Checkout {
                    conn,
                    reused: true,
                    connect: None,
                });
            }
        }
    }

    /// Closes the idle connections, on every shard, that are past [`IDLE_TIMEOUT`] at `now` or
    /// that the server has closed. Returns how many are left.
    pub(crate) fn sweep(&self, now: Instant) -> usize {
        let mut left = 0;
        for idle in self.idle.iter() {
            let mut idle = idle.lock().unwrap_or_else(|p| p.into_inner());
            idle.retain(|i| {
                now.saturating_duration_since(i.since) <= IDLE_TIMEOUT && i.conn.is_open()
            });
            left += idle.len();
        }
        left
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
            Ok(Box::new(Conn::new(stream)))
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

    /// A connection whose exchange ended cleanly comes back for the next request, its read
    /// buffer freed (an idle connection holds no memory but its socket).
    pub(super) fn checkin(&self, mut conn: Box<Conn>) {
        if !conn.rest() {
            return;
        }
        let mut idle = self.idle().lock().unwrap_or_else(|p| p.into_inner());
        // The oldest is at the front. Those past their time go in the sweep.
        if idle.len() >= self.max_idle {
            idle.pop_front();
        }
        idle.push_back(Idle {
            conn,
            since: Instant::now(),
        });
    }
}

/// The upstream's response body, read straight from its connection: each frame is a slice of
/// the read buffer. When it ends cleanly its connection goes back to the pool. Dropped before
/// its end (the client went away), the connection is closed with it, which stops the model
/// server's generation.
pub(crate) struct PooledBody {
    pub(super) conn: Option<Box<Conn>>,
    pool: Arc<Pool>,
    decoder: Decoder,
    // An error held back for one poll (see poll_frame).
    failed: Option<UpstreamError>,
    // Its server says when what it handed on was written (`keep_request_until_written`): the
    // request is dropped then. Otherwise (hyper's HTTP/2) it is dropped at the first poll.
    deferred: bool,
}

impl PooledBody {
    pub(crate) fn new(conn: Box<Conn>, framing: Framing, pool: Arc<Pool>) -> Self {
        let decoder = match framing {
            Framing::Empty => Decoder::empty(),
            Framing::Length(n) => Decoder::length(n),
            Framing::Chunked => Decoder::chunked(),
            Framing::Close => Decoder::until_close(),
        };
        let mut body = PooledBody {
            conn: Some(conn),
            pool,
            decoder,
            failed: None,
            deferred: false,
        };
        body.settle();
        body
    }

    /// Once the body is over, its connection goes back to the pool.
    fn settle(&mut self) {
        if self.decoder.is_done() {
            if let Some(conn) = self.conn.take() {
                self.pool.checkin(conn);
            }
        }
    }

    /// The next frame the buffer holds, if any.
    fn decode(&mut self) -> Result<Option<Frame<Bytes>>, UpstreamError> {
        let Some(conn) = self.conn.as_mut() else {
            return Ok(None);
        };
        self.decoder
            .next(&mut conn.read)
            .map_err(|Malformed(what)| UpstreamError::Invalid(what))
    }
}

impl Body for PooledBody {
    type Data = Bytes;
    type Error = UpstreamError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, UpstreamError>>> {
        let this = &mut *self;
        if let Some(error) = this.failed.take() {
            return Poll::Ready(Some(Err(error)));
        }
        if !this.deferred {
            if let Some(conn) = this.conn.as_mut() {
                conn.spent = None;
            }
        }
        loop {
            match this.decode() {
                Ok(Some(frame)) => {
                    this.settle();
                    return Poll::Ready(Some(Ok(frame)));
                }
                Ok(None) if this.decoder.is_done() => {
                    this.settle();
                    return Poll::Ready(None);
                }
                Ok(None) => {}
                Err(error) => return this.fail(error, cx),
            }
            let Some(conn) = this.conn.as_mut() else {
                return Poll::Ready(None);
            };
            match ready!(conn.poll_fill(cx)) {
                Ok(0) => {
                    this.conn = None;
                    if this.decoder.close() {
                        // The close is this body's end; the connection goes with it.
                        return Poll::Ready(None);
                    }
                    return this.fail(UpstreamError::Closed, cx);
                }
                Ok(_) => {}
                Err(e) => return this.fail(UpstreamError::Io(e), cx),
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.decoder.is_done() && self.failed.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        self.decoder.size_hint()
    }
}

impl PooledBody {
    /// Its server will say when what it handed on was written ([`PooledBody::written`]): the
    /// request its answer is for is dropped then, not at the first poll.
    pub(crate) fn keep_request_until_written(&mut self) {
        self.deferred = true;
    }

    /// What it handed on was written: the request goes once its answer's first frames are out.
    pub(crate) fn written(&mut self) {
        if let Some(conn) = self.conn.as_mut() {
            conn.spent = None;
        }
    }

    /// Whether the next frame may be ready without reading the socket: not when the read
    /// buffer is empty and the body is not over.
    pub(crate) fn holds_more(&self) -> bool {
        match &self.conn {
            Some(conn) => self.failed.is_some() || !conn.read.is_empty() || self.decoder.is_done(),
            None => true,
        }
    }
}

impl PooledBody {
    /// The frames handed on before a break may still sit in hyper's write buffer, which an
    /// error would discard with the client connection: give it one turn to send them (it
    /// flushes when the body is pending), then report the error.
    fn fail(
        &mut self,
        error: UpstreamError,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, UpstreamError>>> {
        self.conn = None;
        self.decoder.abandon();
        self.failed = Some(error);
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}
