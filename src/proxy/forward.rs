//! Forwarding a request to the one upstream over a pooled keep-alive connection, and sending it
//! again, once, when a reused connection died before answering.
//!
//! The request keeps its method, path, query, headers and body; only the hop-by-hop headers of
//! RFC 9110 §7.6.1 are removed, in both directions, because they describe one connection and
//! not the message. The body streams through; nothing is buffered or rewritten.
//!
//! The retry: a keep-alive connection can be closed by the server while it sits in the pool
//! (llama.cpp closes it after every streamed response without saying `Connection: close`), and a
//! request written to it then fails although the server never read it. When a *reused*
//! connection fails before a single byte of the response arrived, and the request's body was kept
//! whole (at most `limits.retry_body_bytes`), the request is sent once more on a new connection.
//! No byte of an answer reached the proxy, so the client cannot see a duplicate; the worst case
//! is that an engine that did read the request computes it twice, which for inference has no
//! side effect. A request on a new connection is never retried: its failure is the upstream's.

use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::time::Duration;

use http::header::{self, HeaderValue};
use http::{Response, Uri, Version};
use http_body_util::Either;
use prometheus::IntCounter;
use tokio::time::Instant;

use super::error::Error;
use super::http1::client::{Outgoing, Unsent, UpstreamError};
use super::http1::head::Framing;
use super::http1::headers;
use super::http1::pool::{Checkout, ConnectError, Pool, PooledBody};
use super::request_body::{RequestBody, Retained, Upload};
use crate::config::{Limits, Timeouts, Upstream};

/// Retries by why they were needed, resolved once.
#[derive(Clone)]
pub(crate) struct RetryCounters {
    /// The reused connection was already closed when the request was handed to it.
    pub(crate) not_sent: IntCounter,
    /// The reused connection closed after the request was written, before any response byte.
    pub(crate) closed: IntCounter,
}

/// A pooled client bound to the configured upstream.
pub(crate) struct Forwarder {
    pool: Arc<Pool>,
    upstream: Upstream,
    upstream_text: String,
    response_head_timeout: Duration,
    retry_body_bytes: usize,
    retained_total: Arc<AtomicUsize>,
    retries: RetryCounters,
}

/// How a request got to the upstream.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Trip {
    /// The connection of the attempt that answered had carried requests before.
    pub(crate) reused: bool,
    /// How long connecting took, when that connection was new.
    pub(crate) connect: Option<Duration>,
    /// When the request was handed to that connection.
    pub(crate) handed: Option<Instant>,
    /// Attempts after the first.
    pub(crate) retries: u8,
}

impl Forwarder {
    pub(crate) fn new(
        upstream: &Upstream,
        timeouts: &Timeouts,
        limits: &Limits,
        retries: RetryCounters,
    ) -> Self {
        Forwarder {
            // As many idle connections as there may be clients: a burst's worth comes back
            // for the next one, within the half of the descriptors the clients leave.
            pool: Arc::new(Pool::new(
                upstream.authority.as_str().to_string(),
                timeouts.connect,
                super::listener::connection_cap(limits.max_connections),
            )),
            upstream: upstream.clone(),
            upstream_text: upstream.to_string(),
            response_head_timeout: timeouts.response_head,
            retry_body_bytes: limits.retry_body_bytes,
            retained_total: Arc::new(AtomicUsize::new(0)),
            retries,
        }
    }

    /// Closes the pool's idle connections that have expired or that the server closed.
    pub(crate) fn sweep_idle(&self) {
        self.pool.sweep(tokio::time::Instant::now());
    }

    /// Sends the request upstream and waits for the response head; `trip` learns how the
    /// request got there. The response-head timeout starts once the whole request body has been
    /// sent.
    pub(crate) async fn send(
        &self,
        mut parts: Box<http::request::Parts>,
        mut body: Box<RequestBody>,
        upload: &Upload,
        trip: &mut Trip,
    ) -> Result<Response<PooledBody>, Error> {
        // A new connection's wait on the heap, and only when it happens: inline, the connecting
        // made every request's future larger, copied to the heap on every request.
        let mut checkout = match self.pool.reuse() {
            Some(checkout) => checkout,
            None => Box::pin(self.pool.connect())
                .await
                .map_err(|e| self.unreachable(e))?,
        };
        // Only a reused connection can fail in the way a retry mends; keep what it needs.
        let retained = checkout.reused.then(|| {
            let retained = Retained::new(self.retry_body_bytes, self.retained_total.clone());
            body.retain(retained.clone());
            retained
        });
        self.upstream_request(&mut parts);
        let request = Outgoing {
            parts,
            body: Either::Left(body),
        };
        let received_before = checkout.conn.received();
        trip.reused = checkout.reused;
        trip.connect = checkout.connect;
        trip.handed = Some(Instant::now());
        let sent = self.await_head(&mut checkout, request, upload).await;
        let again = match sent {
            Ok(response) => {
                if let Some(retained) = &retained {
                    retained.release();
                }
                return Ok(self.answered(response, checkout));
            }
            Err(Failure::TimedOut) => return Err(self.timed_out()),
            Err(Failure::Upstream(Unsent {
                error,
                parts,
                written,
                body,
            })) => {
                let nothing_received = checkout.conn.received() == received_before;
                // The client's own fault is the client's, whatever the connection did.
                if let Some(fault) = upload.fault() {
                    return Err(Error::ClientBody {
                        fault,
                        source: Box::new(error),
                    });
                }
                // The head as it was sent goes again: only the body is to be had anew, from what
                // was kept of it and, when the client's upload was not over, the rest of it.
                let replay = match (*body, &retained) {
                    _ if !checkout.reused || !nothing_received => None,
                    (body, _) if written == 0 => {
                        self.retries.not_sent.inc();
                        Some(Outgoing { parts, body })
                    }
                    (Either::Left(rest), Some(retained)) => retained.resume(rest).map(|body| {
                        self.retries.closed.inc();
                        Outgoing {
                            parts,
                            body: Either::Right(body),
                        }
                    }),
                    _ => None,
                };
                match replay {
                    Some(request) => request,
                    None => {
                        tracing::debug!(
                            reused = checkout.reused,
                            nothing_received,
                            error = %error,
                            "an upstream exchange failed and is not sent again"
                        );
                        return Err(self.failed(error));
                    }
                }
            }
        };
        drop(retained);
        // On the heap, and only when it happens: inline, the second attempt's state (a new
        // connection, a second exchange and its deadline) would size every request's future.
        Box::pin(self.send_again(again, upload, trip)).await
    }

    /// The one retry: the request again, on a new connection.
    async fn send_again(
        &self,
        again: Outgoing,
        upload: &Upload,
        trip: &mut Trip,
    ) -> Result<Response<PooledBody>, Error> {
        tracing::debug!("a reused upstream connection closed before answering; sending again");
        trip.retries += 1;
        let mut checkout = self.pool.connect().await.map_err(|e| self.unreachable(e))?;
        trip.reused = false;
        trip.connect = checkout.connect;
        trip.handed = Some(Instant::now());
        match self.await_head(&mut checkout, again, upload).await {
            Ok(response) => Ok(self.answered(response, checkout)),
            Err(Failure::TimedOut) => Err(self.timed_out()),
            Err(Failure::Upstream(Unsent { error, .. })) => match upload.fault() {
                Some(fault) => Err(Error::ClientBody {
                    fault,
                    source: Box::new(error),
                }),
                None => Err(self.failed(error)),
            },
        }
    }

    fn answered(
        &self,
        (response, framing): (Response<()>, Framing),
        checkout: Checkout,
    ) -> Response<PooledBody> {
        // The head's hop-by-hop fields were left out as it was parsed (`upstream::parse_head`).
        response.map(|()| PooledBody::new(checkout.conn, framing, self.pool.clone()))
    }

    fn unreachable(&self, error: ConnectError) -> Error {
        Error::UpstreamUnreachable {
            upstream: self.upstream_text.clone(),
            source: Box::new(error),
        }
    }

    fn failed(&self, error: UpstreamError) -> Error {
        Error::UpstreamFailed {
            upstream: self.upstream_text.clone(),
            source: Box::new(error),
        }
    }

    fn timed_out(&self) -> Error {
        Error::UpstreamTimeout {
            upstream: self.upstream_text.clone(),
            after: self.response_head_timeout,
        }
    }

    /// Sends the request on the connection and waits for the head, at most the response-head
    /// timeout after the upload completed.
    async fn await_head(
        &self,
        checkout: &mut Checkout,
        request: Outgoing,
        upload: &Upload,
    ) -> Result<(Response<()>, Framing), Failure> {
        // The connection's own timer: no timer is made and dropped for each exchange.
        let mut timer = std::mem::take(&mut checkout.conn.head_timer);
        let sent = checkout.conn.exchange(request);
        let deadline = async {
            upload.complete().await;
            let until = tokio::time::Instant::now() + self.response_head_timeout;
            std::future::poll_fn(|cx| timer.poll_until(until, cx)).await;
        };
        let result = tokio::select! {
            biased;
            sent = sent => sent.map_err(Failure::Upstream),
            () = deadline => Err(Failure::TimedOut),
        };
        checkout.conn.head_timer = timer;
        result
    }

    /// Makes a client's request head one for the upstream, in place.
    fn upstream_request(&self, parts: &mut http::request::Parts) {
        // An h2 client names the host in :authority, which has no header of its own; keep it
        // as Host so the upstream sees the name the client used.
        if !parts.headers.contains_key(header::HOST) {
            let host = parts
                .uri
                .authority()
                .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
                .unwrap_or_else(|| {
                    HeaderValue::from_str(self.upstream.authority.as_str())
                        .unwrap_or(HeaderValue::from_static("localhost"))
                });
            parts.headers.insert(header::HOST, host);
        }
        // HTTP/1.1 to the upstream takes the origin form: the path and query only.
        let path = parts
            .uri
            .path_and_query()
            .cloned()
            .unwrap_or_else(|| http::uri::PathAndQuery::from_static("/"));
        parts.uri = Uri::from(path);
        // The upstream speaks HTTP/1.1 whatever the client spoke.
        parts.version = Version::HTTP_11;
        headers::strip_hop_by_hop(&mut parts.headers);
        // The proxy answers `100 Continue` itself and sends the body at once, so the expectation
        // goes no further (as nginx does). Forwarded, an upstream that answers a final status
        // without reading the body and keeps the connection open leaves the body on a pooled
        // connection, where it prefixes the next user's request (CVE-2024-24791 in Go's proxy).
        parts.headers.remove(header::EXPECT);
    }
}

/// How one attempt failed.
enum Failure {
    TimedOut,
    /// The exchange failed; its head comes back, and its body when none of it was written.
    Upstream(Unsent),
}
