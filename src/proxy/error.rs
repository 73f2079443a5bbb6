//! The one error type of the proxy path, and the single edge where it becomes an HTTP response.
//!
//! Upstream failures are answered by the proxy itself with a status that says what failed and a
//! short JSON body in the shape OpenAI-compatible clients already parse (`{"error": {...}}`).

use std::time::Duration;

use bytes::Bytes;
use http::{header, Response, StatusCode};
use http_body_util::Full;

/// Why a request could not be forwarded.
#[derive(Debug)]
// Every failure the proxy answers for itself today is the upstream's.
#[allow(clippy::enum_variant_names)]
pub(crate) enum Error {
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
            Error::UpstreamUnreachable { source, .. } | Error::UpstreamFailed { source, .. } => {
                Some(source.as_ref())
            }
            Error::UpstreamTimeout { .. } => None,
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
        }
    }

    fn kind(&self) -> &'static str {
        match self {
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
