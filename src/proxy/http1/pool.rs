//! The pool of keep-alive connections to the model server, kept per shard. A connection goes
//! back only when its exchange ended cleanly ([`Conn::rest`]); one is handed out only while the
//! server has not closed it ([`Conn::is_open`]) and it is younger than [`IDLE_TIMEOUT`].

use std::collections::VecDeque;
use std::io;
use std::sync::Mutex;
use std::time::Duration;

use tokio::net::TcpStream;
use tokio::time::Instant;

use super::client::Conn;
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
