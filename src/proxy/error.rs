//! The one error type of the proxy path, and the single edge where it becomes an HTTP response.
//!
//! Failures are answered by the proxy itself with a status that says what failed and a short JSON
//! body in the shape OpenAI-compatible clients already parse (`{"error": {...}}`): 502 and 504
//! for the upstream's faults, 4xx for the client's own (which never count against the SLO).

use std::time::Duration;

use bytes::Bytes;
use http::{header, Response, StatusCode};
use http_body_util::Full;

use super::client_body::ClientFault;
use crate::policy::outcome::End;

/// Why a request could not be forwarded: the upstream's fault, or the client's.
#[derive(Debug)]
pub(crate) enum Error {
    /// The client's request body failed: malformed, cut short, or stalled.
    ClientBody {
        fault: ClientFault,
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The request cannot be forwarded as it is (RFC 9112 §3.2 `Host` rules, and the like).
    BadRequest { message: &'static str },
    /// A method the proxy does not forward.
    MethodNotAllowed { method: http::Method },
    /// The upstream refused the connection or could not be reached.
    UpstreamUnreachable {
        upstream: String,
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// No response head arrived within the configured time.
    UpstreamTimeout { upstream: String, after: Duration },
    /// The upstream connection failed after it was established, before a response head.
    UpstreamFailed {
        upstream: String,
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::ClientBody { fault, source } => {
                let what = match fault {
                    ClientFault::Malformed => "the request body is malformed",
                    ClientFault::Gone => {
                        "the client went away before its request body was complete"
                    }
                    ClientFault::Stalled => "the client stopped sending its request body",
                };
                write!(f, "{what}: {}", chain(source.as_ref()))
            }
            Error::BadRequest { message } => f.write_str(message),
            Error::MethodNotAllowed { method } => {
                write!(f, "{method} is not forwarded: tokenmeter does not tunnel")
            }
            Error::UpstreamUnreachable { upstream, source } => {
                write!(
                    f,
                    "upstream {upstream} is unreachable: {}",
                    chain(source.as_ref())
                )
            }
            Error::UpstreamTimeout { upstream, after } => write!(
                f,
                "upstream {upstream} sent no response head within {}",
                humantime::format_duration(*after)
            ),
            Error::UpstreamFailed { upstream, source } => {
                write!(
                    f,
                    "upstream {upstream} failed before responding: {}",
                    chain(source.as_ref())
                )
            }
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::UpstreamUnreachable { source, .. }
            | Error::UpstreamFailed { source, .. }
            | Error::ClientBody { source, .. } => Some(source.as_ref()),
            Error::UpstreamTimeout { .. }
            | Error::BadRequest { .. }
            | Error::MethodNotAllowed { .. } => None,
        }
    }
}

/// An error and its causes on one line, so a log or a response body says the root cause
/// ("connection refused"), not only the outermost wrapper ("client error (Connect)").
pub(crate) fn chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

impl Error {
    /// The status the client gets.
    pub(crate) fn status(&self) -> StatusCode {
        match self {
            Error::UpstreamUnreachable { .. } | Error::UpstreamFailed { .. } => {
                StatusCode::BAD_GATEWAY
            }
            Error::UpstreamTimeout { .. } => StatusCode::GATEWAY_TIMEOUT,
            Error::ClientBody {
                fault: ClientFault::Stalled,
                ..
            } => StatusCode::REQUEST_TIMEOUT,
            Error::ClientBody { .. } | Error::BadRequest { .. } => StatusCode::BAD_REQUEST,
            Error::MethodNotAllowed { .. } => StatusCode::METHOD_NOT_ALLOWED,
        }
    }

    /// How the request ended, for its record: the upstream's failures are `error`, the
    /// client's own are `client_error`, and a client gone midway is `cancelled`.
    pub(crate) fn end(&self) -> End {
        let status = self.status();
        let reason = self.kind();
        match self {
            Error::UpstreamUnreachable { .. }
            | Error::UpstreamFailed { .. }
            | Error::UpstreamTimeout { .. } => End::Failed { status, reason },
            Error::ClientBody {
                fault: ClientFault::Gone,
                ..
            } => End::Cancelled { reason },
            Error::ClientBody { .. }
            | Error::BadRequest { .. }
            | Error::MethodNotAllowed { .. } => End::Refused { status, reason },
        }
    }

    /// A short name of what failed: the JSON body's `type` and the record's `reason`.
    fn kind(&self) -> &'static str {
        match self {
            Error::ClientBody { fault, .. } => match fault {
                ClientFault::Malformed => "client_body_error",
                ClientFault::Gone => "client_gone",
                ClientFault::Stalled => "client_body_timeout",
            },
            Error::BadRequest { .. } => "bad_request",
            Error::MethodNotAllowed { .. } => "method_not_allowed",
            Error::UpstreamUnreachable { .. } => "upstream_unreachable",
            Error::UpstreamTimeout { .. } => "upstream_timeout",
            Error::UpstreamFailed { .. } => "upstream_failed",
        }
    }

    /// The response the proxy sends in place of the upstream's.
    pub(crate) fn to_response(&self) -> Response<Full<Bytes>> {
        let body = serde_json::json!({
            "error": {
                "type": self.kind(),
                "message": self.to_string(),
                "source": "tokenmeter",
            }
        });
        let mut response = Response::new(Full::new(Bytes::from(body.to_string())));
        *response.status_mut() = self.status();
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            header::HeaderValue::from_static("application/json"),
        );
        response
    }
}
