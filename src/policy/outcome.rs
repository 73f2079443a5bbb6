//! The plain values of a finished request: how it ended, its outcome and its figures. The
//! recorder computes them; the SLO verdict, the metrics, the live view and the record read them.

use std::time::Duration;

use http::StatusCode;

/// How a request ended, as the proxy saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum End {
    /// The response body ended cleanly (trailers included).
    Complete,
    /// The upstream connection broke mid-body.
    UpstreamBroken,
    /// The upstream sent nothing for `timeouts.idle` mid-body; the proxy ended the response.
    UpstreamIdle,
    /// The proxy answered itself (502, 504) because the upstream could not: `error`.
    Failed {
        status: StatusCode,
        reason: &'static str,
    },
    /// The proxy refused the request (400, 405, 408) for the client's own fault: `client_error`.
    Refused {
        status: StatusCode,
        reason: &'static str,
    },
    /// The client went away first.
    Cancelled { reason: &'static str },
}

impl End {
    /// The client went away: the response (or the whole request) was dropped.
    pub(crate) const CLIENT_GONE: End = End::Cancelled {
        reason: "client_gone",
    };

    /// Why the request did not end normally, for the record; `None` for a clean end.
    pub(crate) fn reason(self) -> Option<&'static str> {
        match self {
            End::Complete => None,
            End::UpstreamBroken => Some("upstream_reset"),
            End::UpstreamIdle => Some("upstream_idle"),
            End::Failed { reason, .. }
            | End::Refused { reason, .. }
            | End::Cancelled { reason } => Some(reason),
        }
    }
}

/// The outcome of a request, per `docs/MEASUREMENT.md`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    Ok,
    Error,
    ClientError,
    Cancelled,
}

impl Outcome {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Error => "error",
            Outcome::ClientError => "client_error",
            Outcome::Cancelled => "cancelled",
        }
    }
}

/// The figures of one finished request; durations are from `t_start`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Figures {
    pub(crate) outcome: Outcome,
    pub(crate) ttfb: Option<Duration>,
    pub(crate) ttft: Option<Duration>,
    pub(crate) ttfc: Option<Duration>,
    pub(crate) tpot: Option<Duration>,
    pub(crate) max_itl: Option<Duration>,
    pub(crate) e2e: Duration,
    pub(crate) output_tokens: u64,
    pub(crate) tokens_from_usage: bool,
    pub(crate) prompt_tokens: Option<u64>,
}
