//! A client's request body as the services see it, whichever protocol carried it: bytes that
//! came with an HTTP/1.1 head, an HTTP/1.1 body still on the socket
//! ([`Streamed`](super::http1::request_body::Streamed)), or an HTTP/2 stream's data (hyper's
//! `Incoming`).

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;

// The error types live beside the HTTP/1.1 body that makes most of them; HTTP/2's come from
// hyper through the same type.
pub(crate) use super::http1::request_body::{ClientBodyError, ClientFault, Streamed};

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
