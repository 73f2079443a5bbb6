//! Accepting connections: the client and admin listeners' accept loop, with a cap on open
//! connections answered by a clear 503, rate-limited warnings instead of a log line per failed
//! `accept`, and the drain at shutdown; whether the proxy takes new work; and the plain
//! [`accept`] the simulator uses.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Notify};
use tokio::task::JoinSet;

use super::connection;

/// Whether the proxy takes new work; `/readyz` reports it.
#[derive(Default)]
pub(crate) struct Health {
    ready: AtomicBool,
}

impl Health {
    /// A proxy that takes work.
    pub(crate) fn ready() -> Health {
        Health {
            ready: AtomicBool::new(true),
        }
    }

    /// From now on `/readyz` says the proxy is draining.
    pub(crate) fn set_draining(&self) {
        self.ready.store(false, Ordering::Relaxed);
    }

    pub(crate) fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Relaxed)
    }
}

/// Accepts the next connection with TCP_NODELAY set: every token is its own small write, and
/// Nagle with delayed ACKs would hold it back ~40 ms. Accept errors (out of file descriptors
/// and the like) are logged and retried after a short back-off instead of spinning.
pub async fn accept(listener: &TcpListener) -> TcpStream {
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                if let Err(e) = stream.set_nodelay(true) {
                    tracing::debug!(error = %e, "cannot set TCP_NODELAY");
                }
                return stream;
            }
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// Client connections open at once when the configuration does not say: half of the file
/// descriptors left after a reserve (each client connection may hold an upstream connection
/// too), so the proxy refuses clearly before the system refuses it `accept`.
pub(crate) fn connection_cap(configured: usize) -> usize {
    if configured > 0 {
        return configured;
    }
    let soft = std::fs::read_to_string("/proc/self/limits")
        .ok()
        .and_then(|limits| {
            limits
                .lines()
                .find(|l| l.starts_with("Max open files"))
                .and_then(|l| l.split_whitespace().nth(3))
                .and_then(|n| n.parse::<usize>().ok())
        })
        .unwrap_or(1024);
    (soft.saturating_sub(FD_RESERVE) / 2).clamp(16, 1 << 20)
}

/// File descriptors kept for everything but client connections: the listeners, the record's
/// file, the runtime, the admin port's own connections.
const FD_RESERVE: usize = 64 + ADMIN_MAX_CONNECTIONS;
/// The admin port's connection cap: a scraper, probes and a person or two.
pub(crate) const ADMIN_MAX_CONNECTIONS: usize = 64;
/// Refusals being written at once; past it an over-limit connection is closed without a word.
const MAX_REFUSING: usize = 64;
/// How often a repeated warning (refusals, accept errors) is logged, with its count.
const WARN_EVERY: Duration = Duration::from_secs(10);

/// What an over-limit client reads before its connection closes.
const REFUSAL: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nconnection: close\r\nretry-after: 1\r\ncontent-length: 113\r\n\r\n{\"error\":{\"type\":\"too_many_connections\",\"message\":\"the proxy's connection limit is reached\",\"source\":\"tokenmeter\"}}";

/// A warning logged at most every [`WARN_EVERY`], with how many times it happened.
struct Throttled {
    what: &'static str,
    last: Option<tokio::time::Instant>,
    count: u64,
}

impl Throttled {
    fn new(what: &'static str) -> Self {
        Throttled {
            what,
            last: None,
            count: 0,
        }
    }

    fn hit(&mut self, detail: &dyn std::fmt::Display) {
        self.count += 1;
        let now = tokio::time::Instant::now();
        if self
            .last
            .is_none_or(|last| now.saturating_duration_since(last) >= WARN_EVERY)
        {
            tracing::warn!(count = self.count, "{}: {detail}", self.what);
            self.last = Some(now);
            self.count = 0;
        }
    }
}

/// Accepts connections until `shutdown` turns true, serving each with [`connection::serve`]
/// within `cap` (shared by the shards that accept from one listener), and only while at least
/// `spill_at` connections are open (see [`SPILL`]); returns the connections still open, for the
/// drain.
pub(crate) async fn serve_listener<S, B, F>(
    listener: TcpListener,
    cap: Arc<Cap>,
    spill_at: usize,
    limits: connection::Limits,
    make: F,
    mut shutdown: watch::Receiver<bool>,
) -> JoinSet<()>
where
    F: Fn(Arc<connection::ConnState>) -> S + Send + Sync + 'static,
    S: hyper::service::Service<
            http::Request<super::client_body::ClientBody>,
            Response = http::Response<B>,
        > + super::http1::server::Service<Body = B>
        + Send
        + 'static,
    <S as hyper::service::Service<http::Request<super::client_body::ClientBody>>>::Future:
        Send + 'static,
    <S as hyper::service::Service<http::Request<super::client_body::ClientBody>>>::Error:
        Into<Box<dyn std::error::Error + Send + Sync>>,
    B: http_body::Body<Data = bytes::Bytes> + super::http1::server::Written + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let make = Arc::new(make);
    let mut connections = JoinSet::new();
    let refusing = Arc::new(AtomicUsize::new(0));
    let mut refused = Throttled::new("connection limit reached; refusing new connections with 503");
    let mut accept_failed = Throttled::new("accept failed");
    loop {
        // Made before the count is read, so a crossing in between still wakes this loop.
        let grown = cap.grown.notified();
        let accepting = cap.open.load(Ordering::Relaxed) >= spill_at;
        tokio::select! {
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            () = grown, if !accepting => {}
            accepted = listener.accept(), if accepting => match accepted {
                Ok((stream, _)) => {
                    if let Err(e) = stream.set_nodelay(true) {
                        tracing::debug!(error = %e, "cannot set TCP_NODELAY");
                    }
                    let Some(open) = cap.take() else {
                        refused.hit(&format_args!("{} open", cap.max));
                        refuse(stream, &refusing);
                        continue;
                    };
                    let make = make.clone();
                    let shutdown = shutdown.clone();
                    connections.spawn(async move {
                        let _open = open;
                        connection::serve(stream, limits, move |conn| make(conn), shutdown).await;
                    });
                }
                Err(e) => {
                    accept_failed.hit(&e);
                    // Out of file descriptors, the error repeats at once: wait a little.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            changed = shutdown.changed() => {
                if changed.is_err() || *shutdown.borrow() {
                    break;
                }
            }
        }
    }
    connections
}

/// Open connections per shard before the next shard starts accepting: shard `k` accepts once
/// `k × SPILL` connections are open. Below that one event loop serves everything, which costs
/// the least CPU per frame (a frame that finds its thread awake rides the same `epoll_wait` as
/// others; two half-idle threads each wake for fewer; `docs/performance-history.md` has the
/// figures). Past it, the shards share the load, which is what holds up at saturation. nginx
/// behaves alike: Linux wakes the most
/// recently waiting worker first, so one worker takes connections until it is busy.
pub(crate) const SPILL: usize = 512;

/// The open connections of one listener, at most `max`, counted across the shards that accept
/// from it.
pub(crate) struct Cap {
    max: usize,
    open: AtomicUsize,
    /// Notified when the count grows.
    grown: Notify,
}

impl Cap {
    pub(crate) fn new(max: usize) -> Arc<Cap> {
        Arc::new(Cap {
            max,
            open: AtomicUsize::new(0),
            grown: Notify::new(),
        })
    }

    /// A place for one more connection, held until the guard is dropped; `None` at the cap.
    fn take(self: &Arc<Self>) -> Option<Open> {
        let before = self.open.fetch_add(1, Ordering::Relaxed);
        if before >= self.max {
            self.open.fetch_sub(1, Ordering::Relaxed);
            return None;
        }
        // Shards waiting for their spill count look again (once per accepted connection).
        self.grown.notify_waiters();
        Some(Open(self.clone()))
    }
}

/// One open connection counted in its listener's [`Cap`].
struct Open(Arc<Cap>);

impl Drop for Open {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Answers an over-limit connection with a 503 and closes it, within a second; past
/// [`MAX_REFUSING`] refusals at once it is closed without a word.
fn refuse(mut stream: TcpStream, refusing: &Arc<AtomicUsize>) {
    use std::sync::atomic::Ordering::Relaxed;
    if refusing.fetch_add(1, Relaxed) >= MAX_REFUSING {
        refusing.fetch_sub(1, Relaxed);
        return;
    }
    let refusing = refusing.clone();
    tokio::spawn(async move {
        use tokio::io::AsyncWriteExt;
        let _ = tokio::time::timeout(Duration::from_secs(1), async {
            stream.write_all(REFUSAL).await?;
            stream.shutdown().await
        })
        .await;
        refusing.fetch_sub(1, Relaxed);
    });
}

/// Waits for the connections to finish their in-flight responses (they were asked to close
/// gracefully), up to `deadline`; whatever is still open then is cut.
pub(crate) async fn drain(mut connections: JoinSet<()>, deadline: Duration) {
    tracing::info!(deadline = %humantime::format_duration(deadline), open = connections.len(), "draining: listener closed, waiting for in-flight responses");
    let all_done = async { while connections.join_next().await.is_some() {} };
    if tokio::time::timeout(deadline, all_done).await.is_ok() {
        tracing::info!("drained");
    } else {
        tracing::warn!(
            open = connections.len(),
            "drain deadline passed; cutting the connections still open"
        );
        connections.shutdown().await;
    }
}

#[cfg(test)]
mod tests {
    //! Two accept loops on one listening socket, as two shards run them.

    use std::convert::Infallible;
    use std::sync::atomic::AtomicUsize;

    use http_body_util::Full;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    /// An accept loop that counts the connections it served, answering each request with 200.
    fn shard(
        listener: TcpListener,
        cap: Arc<Cap>,
        spill_at: usize,
        served: Arc<AtomicUsize>,
        shutdown: watch::Receiver<bool>,
    ) -> tokio::task::JoinHandle<JoinSet<()>> {
        let limits = connection::Limits {
            request_head: Duration::from_secs(5),
            client_idle: Duration::from_secs(5),
            max_head_bytes: 16 << 10,
            max_streams: 8,
        };
        let make = move |_conn| {
            served.fetch_add(1, Ordering::Relaxed);
            super::super::http1::server::Hyper(hyper::service::service_fn(|_request| async {
                Ok::<_, Infallible>(http::Response::new(Full::new(bytes::Bytes::from_static(
                    b"ok",
                ))))
            }))
        };
        tokio::spawn(serve_listener(
            listener, cap, spill_at, limits, make, shutdown,
        ))
    }

    /// Opens a connection and completes one request on it, leaving it open.
    async fn served_connection(addr: std::net::SocketAddr) -> TcpStream {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        stream
            .write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .unwrap();
        let mut buf = [0u8; 256];
        let mut seen = Vec::new();
        while !seen.ends_with(b"ok") {
            let n = stream.read(&mut buf).await.unwrap();
            assert!(n > 0, "closed before answering");
            seen.extend_from_slice(&buf[..n]);
        }
        stream
    }

    #[tokio::test]
    async fn the_next_shard_accepts_only_once_the_spill_count_is_open() {
        let first = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = first.local_addr().unwrap();
        let copy = socket2::SockRef::from(&first).try_clone().unwrap();
        let second = TcpListener::from_std(copy.into()).unwrap();
        let cap = Cap::new(100);
        let (served_first, served_second) =
            (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let (stop_first, first_rx) = watch::channel(false);
        let (_stop_second, second_rx) = watch::channel(false);
        let shard_first = shard(first, cap.clone(), 0, served_first.clone(), first_rx);
        let _shard_second = shard(second, cap.clone(), 2, served_second.clone(), second_rx);
        // Below the spill count only the first shard accepts.
        let mut open = vec![served_connection(addr).await, served_connection(addr).await];
        assert_eq!(served_first.load(Ordering::Relaxed), 2);
        assert_eq!(served_second.load(Ordering::Relaxed), 0);
        // Two are open: the second shard accepts too. With the first one's loop stopped, the
        // next connection can only be the second's.
        stop_first.send(true).unwrap();
        // Its loop has ended (its connections close too: they were told to by the same signal).
        drop(shard_first.await.unwrap());
        open.push(served_connection(addr).await);
        assert_eq!(served_second.load(Ordering::Relaxed), 1);
        assert_eq!(served_first.load(Ordering::Relaxed), 2);
    }

    #[tokio::test]
    async fn the_cap_is_shared_by_the_shards() {
        let cap = Cap::new(2);
        let a = cap.take().expect("first");
        let b = cap.take().expect("second");
        assert!(cap.take().is_none(), "a third is refused");
        drop(a);
        let c = cap.take().expect("a place came free");
        assert_eq!(cap.open.load(Ordering::Relaxed), 2);
        drop((b, c));
        assert_eq!(cap.open.load(Ordering::Relaxed), 0);
    }
}
