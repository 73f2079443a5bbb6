//! Accepting connections: the client and admin listeners' accept loop, with a cap on open
//! connections answered by a clear 503, rate-limited warnings instead of a log line per failed
//! `accept`, and the drain at shutdown; whether the proxy takes new work; and the plain
//! [`accept`] the simulator uses.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
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
/// within `cap` (shared by the shards that accept from one listener); returns the connections
/// still open, for the drain.
pub(crate) async fn serve_listener<S, B, F>(
    listener: TcpListener,
    cap: Arc<Cap>,
    limits: connection::Limits,
    make: F,
    mut shutdown: watch::Receiver<bool>,
) -> JoinSet<()>
where
    F: Fn(Arc<connection::ConnState>) -> S + Send + Sync + 'static,
    S: hyper::service::Service<http::Request<hyper::body::Incoming>, Response = http::Response<B>>
        + Send
        + 'static,
    S::Future: Send + 'static,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    B: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let make = Arc::new(make);
    let mut connections = JoinSet::new();
    let refusing = Arc::new(AtomicUsize::new(0));
    let mut refused = Throttled::new("connection limit reached; refusing new connections with 503");
    let mut accept_failed = Throttled::new("accept failed");
    loop {
        tokio::select! {
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            accepted = listener.accept() => match accepted {
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

/// The open connections of one listener, at most `max`, counted across the shards that accept
/// from it.
pub(crate) struct Cap {
    max: usize,
    open: AtomicUsize,
}

impl Cap {
    pub(crate) fn new(max: usize) -> Arc<Cap> {
        Arc::new(Cap {
            max,
            open: AtomicUsize::new(0),
        })
    }

    /// A place for one more connection, held until the guard is dropped; `None` at the cap.
    fn take(self: &Arc<Self>) -> Option<Open> {
        if self.open.fetch_add(1, Ordering::Relaxed) >= self.max {
            self.open.fetch_sub(1, Ordering::Relaxed);
            return None;
        }
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
