//! Accepting connections, for every listener (the client one, admin, and the simulator's), and
//! whether the proxy takes new work.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};

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
