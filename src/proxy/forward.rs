//! Forwarding a request to the one upstream over a pooled keep-alive client.
//!
//! The request keeps its method, path, query, headers and body; only the hop-by-hop headers of
//! RFC 9110 §7.6.1 are removed, in both directions, because they describe one connection and
//! not the message. The body streams through; nothing is buffered or rewritten.

use std::time::Duration;

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Request, Response, Uri, Version};
use hyper::body::Incoming;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};

use super::error::Error;
use super::request_body::ModelSniffBody;
use crate::config::{Timeouts, Upstream};

/// The body the proxy sends upstream.
pub(crate) type UpstreamBody = ModelSniffBody<Incoming>;

/// A pooled client bound to the configured upstream.
pub(crate) struct Forwarder {
    client: Client<HttpConnector, UpstreamBody>,
    upstream: Upstream,
    upstream_text: String,
    response_head_timeout: Duration,
}

impl Forwarder {
    pub(crate) fn new(upstream: &Upstream, timeouts: &Timeouts) -> Self {
        let mut connector = HttpConnector::new();
        // Without TCP_NODELAY, small SSE writes meet Nagle and delayed ACKs: a 40 ms stall.
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(timeouts.connect));
        connector.enforce_http(true);
        let client = Client::builder(TokioExecutor::new())
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(Duration::from_secs(90))
            .build(connector);
        Forwarder {
            client,
            upstream: upstream.clone(),
            upstream_text: upstream.to_string(),
            response_head_timeout: timeouts.response_head,
        }
    }

    /// Sends the request upstream and waits for the response head.
    pub(crate) async fn send(
        &self,
        parts: http::request::Parts,
        body: UpstreamBody,
    ) -> Result<Response<Incoming>, Error> {
        let request = self.upstream_request(parts, body);
        let upstream = || self.upstream_text.clone();
        match tokio::time::timeout(self.response_head_timeout, self.client.request(request)).await {
            Err(_) => Err(Error::UpstreamTimeout {
                upstream: upstream(),
                after: self.response_head_timeout,
            }),
            Ok(Err(e)) if e.is_connect() => Err(Error::UpstreamUnreachable {
                upstream: upstream(),
                source: Box::new(e),
            }),
            Ok(Err(e)) => Err(Error::UpstreamFailed {
                upstream: upstream(),
                source: Box::new(e),
            }),
            Ok(Ok(mut response)) => {
                strip_hop_by_hop(response.headers_mut());
                Ok(response)
            }
        }
    }

    fn upstream_request(
        &self,
        mut parts: http::request::Parts,
        body: UpstreamBody,
    ) -> Request<UpstreamBody> {
        // An h2 client names the host in :authority, which has no header of its own; keep it
        // as Host so the upstream sees the name the client used.
        if !parts.headers.contains_key(header::HOST) {
            if let Some(authority) = parts.uri.authority() {
                if let Ok(value) = HeaderValue::from_str(authority.as_str()) {
                    parts.headers.insert(header::HOST, value);
                }
            }
        }
        let mut uri = Uri::builder()
            .scheme(self.upstream.scheme.clone())
            .authority(self.upstream.authority.clone());
        if let Some(pq) = parts.uri.path_and_query() {
            uri = uri.path_and_query(pq.clone());
        } else {
            uri = uri.path_and_query("/");
        }
        parts.uri = uri.build().unwrap_or_else(|_| parts.uri.clone());
        // The upstream speaks HTTP/1.1 whatever the client spoke.
        parts.version = Version::HTTP_11;
        strip_hop_by_hop(&mut parts.headers);
        Request::from_parts(parts, body)
    }
}

/// Removes the headers that belong to one connection (RFC 9110 §7.6.1): those named by
/// `Connection`, and the fixed set that proxies must not forward.
pub(crate) fn strip_hop_by_hop(headers: &mut HeaderMap) {
    const FIXED: [&str; 6] = [
        "connection",
        "proxy-connection",
        "keep-alive",
        "te",
        "transfer-encoding",
        "upgrade",
    ];
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect();
    for name in named {
        headers.remove(name);
    }
    for name in FIXED {
        headers.remove(name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_by_hop_headers_are_removed_and_the_rest_kept() {
        let mut h = HeaderMap::new();
        h.insert("connection", HeaderValue::from_static("keep-alive, x-hop"));
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert("x-hop", HeaderValue::from_static("1"));
        h.insert("te", HeaderValue::from_static("trailers"));
        h.insert("transfer-encoding", HeaderValue::from_static("chunked"));
        h.insert("upgrade", HeaderValue::from_static("h2c"));
        h.insert(
            "content-type",
            HeaderValue::from_static("text/event-stream"),
        );
        h.insert("authorization", HeaderValue::from_static("Bearer x"));
        h.insert("x-request-id", HeaderValue::from_static("abc"));
        strip_hop_by_hop(&mut h);
        let mut left: Vec<_> = h.keys().map(|k| k.as_str()).collect();
        left.sort();
        assert_eq!(left, ["authorization", "content-type", "x-request-id"]);
    }
}
