//! A client's request body as the services see it, whichever protocol carried it: bytes that
//! came with an HTTP/1.1 head, an HTTP/1.1 body still on the socket
//! ([`Streamed`](super::http1::request_body::Streamed)), or an HTTP/2 stream's data (hyper's
//! `Incoming`).

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;

use super::http1::request_body::Streamed;

/// The request body handed to the services.
pub(crate) struct ClientBody {
    kind: Kind,
}

enum Kind {
    /// All of it was read with the head (or there is none).
    Whole(Option<Bytes>),
    Streamed(Streamed),
    Http2(Incoming),
}

impl ClientBody {
    /// A body whose bytes are all here (`None`: no body at all).
    pub(crate) fn whole(data: Option<Bytes>) -> ClientBody {
        ClientBody {
            kind: Kind::Whole(data.filter(|d| !d.is_empty())),
        }
    }

    pub(crate) fn streamed(body: Streamed) -> ClientBody {
        ClientBody {
            kind: Kind::Streamed(body),
        }
    }

    pub(crate) fn http2(body: Incoming) -> ClientBody {
        ClientBody {
            kind: Kind::Http2(body),
        }
    }
}

/// How a client failed its own request body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ClientFault {
    /// The body was not valid HTTP (a bad chunk size, a length that lies).
    Malformed,
    /// The client went away before its body was complete.
    Gone,
    /// The client paused longer than `timeouts.request_body`.
    Stalled,
}

/// How the client failed its body.
#[derive(Debug)]
pub(crate) enum ClientBodyError {
    /// Bytes that are not valid HTTP/1.1 body framing.
    Malformed(&'static str),
    /// The client closed or broke the connection before its body was complete.
    Gone(Option<std::io::Error>),
    Http2(hyper::Error),
}

impl ClientBodyError {
    pub(crate) fn fault(&self) -> ClientFault {
        match self {
            ClientBodyError::Malformed(_) => ClientFault::Malformed,
            ClientBodyError::Gone(_) => ClientFault::Gone,
            ClientBodyError::Http2(e) => classify(e),
        }
    }
}

/// How hyper says a client's body failed: bytes that are not valid framing (a parse error, or an
/// I/O error of kind `InvalidData` or `InvalidInput`), or a client gone.
fn classify(error: &hyper::Error) -> ClientFault {
    if error.is_parse() {
        return ClientFault::Malformed;
    }
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        if let Some(io) = cause.downcast_ref::<std::io::Error>() {
            if matches!(
                io.kind(),
                std::io::ErrorKind::InvalidData | std::io::ErrorKind::InvalidInput
            ) {
                return ClientFault::Malformed;
            }
        }
        source = cause.source();
    }
    ClientFault::Gone
}

impl std::fmt::Display for ClientBodyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ClientBodyError::Malformed(what) => write!(f, "malformed body: {what}"),
            ClientBodyError::Gone(None) => f.write_str("the client closed the connection"),
            ClientBodyError::Gone(Some(e)) => write!(f, "the client's connection failed: {e}"),
            ClientBodyError::Http2(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for ClientBodyError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ClientBodyError::Gone(Some(e)) => Some(e),
            ClientBodyError::Http2(e) => Some(e),
            _ => None,
        }
    }
}

impl Body for ClientBody {
    type Data = Bytes;
    type Error = ClientBodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, ClientBodyError>>> {
        match &mut self.kind {
            Kind::Whole(data) => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
            Kind::Streamed(body) => Pin::new(body).poll_frame(cx),
            Kind::Http2(body) => Pin::new(body)
                .poll_frame(cx)
                .map_err(ClientBodyError::Http2),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Whole(data) => data.is_none(),
            Kind::Streamed(body) => body.is_end_stream(),
            Kind::Http2(body) => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Whole(data) => SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64)),
            Kind::Streamed(body) => body.size_hint(),
            Kind::Http2(body) => body.size_hint(),
        }
    }
}
