//! An HTTP/1.1 request body that did not all come with its head, read from the client's socket
//! as the upstream takes it ([`Streamed`]): framed by the one decoder ([`super::body`]), never
//! read past its end (what follows is the next request's, handed back to the connection), and
//! `100 Continue` written before its first read when the client waits for it (RFC 9110 §10.1.1).

use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{ready, Context, Poll};

use bytes::{BufMut, Bytes, BytesMut};
use http_body::{Body, Frame, SizeHint};
use tokio::net::TcpStream;

use super::body::{Decoder, Malformed};

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

/// The most read at once of a request body that did not come with its head.
const BODY_READ: usize = 16 << 10;
const CONTINUE: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\n";

/// Where a request body read from the socket leaves what it read past its end, once it has
/// ended: the connection takes it back for the next request.
#[derive(Default)]
pub(crate) struct Handback {
    rest: Mutex<Option<BytesMut>>,
}

impl Handback {
    /// What the body read past its end, once it has ended.
    pub(crate) fn take(&self) -> Option<BytesMut> {
        self.rest.lock().unwrap_or_else(|p| p.into_inner()).take()
    }
}

/// A request body that did not all come with its head, read from the client's socket as it is
/// polled (so at the pace the upstream takes it).
pub(crate) struct Streamed {
    stream: Arc<TcpStream>,
    buf: BytesMut,
    decoder: Decoder,
    handback: Arc<Handback>,
    /// What is left to write of a `100 Continue`, owed before the first read.
    expect_continue: Option<&'static [u8]>,
    handed: bool,
    failed: bool,
}

impl Streamed {
    /// The body framed by `decoder`, whose first bytes (if any) are in `buf`; `expect_continue`:
    /// the client waits for `100 Continue` before it sends the body.
    pub(crate) fn new(
        stream: Arc<TcpStream>,
        buf: BytesMut,
        decoder: Decoder,
        expect_continue: bool,
    ) -> (Streamed, Arc<Handback>) {
        let handback = Arc::new(Handback::default());
        // Owed only while the client waits for it: nothing of the body sent yet.
        let expect_continue = (expect_continue && buf.is_empty()).then_some(CONTINUE);
        let body = Streamed {
            stream,
            buf,
            decoder,
            handback: handback.clone(),
            expect_continue,
            handed: false,
            failed: false,
        };
        (body, handback)
    }

    fn hand_back(&mut self) {
        if std::mem::replace(&mut self.handed, true) {
            return;
        }
        let rest = std::mem::take(&mut self.buf);
        *self.handback.rest.lock().unwrap_or_else(|p| p.into_inner()) = Some(rest);
    }

    fn fail(
        &mut self,
        error: ClientBodyError,
    ) -> Poll<Option<Result<Frame<Bytes>, ClientBodyError>>> {
        self.failed = true;
        Poll::Ready(Some(Err(error)))
    }
}

impl Body for Streamed {
    type Data = Bytes;
    type Error = ClientBodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, ClientBodyError>>> {
        let this = &mut *self;
        loop {
            if this.failed {
                return Poll::Ready(None);
            }
            match this.decoder.next(&mut this.buf) {
                Ok(Some(frame)) => {
                    if this.decoder.is_done() {
                        this.hand_back();
                    }
                    return Poll::Ready(Some(Ok(frame)));
                }
                Ok(None) if this.decoder.is_done() => {
                    this.hand_back();
                    return Poll::Ready(None);
                }
                Ok(None) => {}
                Err(Malformed(what)) => return this.fail(ClientBodyError::Malformed(what)),
            }
            if let Some(owed) = this.expect_continue {
                if let Err(e) = ready!(this.stream.poll_write_ready(cx)) {
                    return this.fail(ClientBodyError::Gone(Some(e)));
                }
                match this.stream.try_write(owed) {
                    Ok(n) => this.expect_continue = (n < owed.len()).then(|| &owed[n..]),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) => return this.fail(ClientBodyError::Gone(Some(e))),
                }
                continue;
            }
            if let Err(e) = ready!(this.stream.poll_read_ready(cx)) {
                return this.fail(ClientBodyError::Gone(Some(e)));
            }
            // Never past a Content-Length body's end: what follows is the next request's.
            let want = this
                .decoder
                .left()
                .map_or(BODY_READ, |left| left.min(BODY_READ as u64) as usize);
            if this.buf.capacity() - this.buf.len() < want {
                this.buf.reserve(want);
            }
            match this.stream.try_read_buf(&mut (&mut this.buf).limit(want)) {
                Ok(0) => return this.fail(ClientBodyError::Gone(None)),
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return this.fail(ClientBodyError::Gone(Some(e))),
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.failed || self.decoder.is_done()
    }

    fn size_hint(&self) -> SizeHint {
        self.decoder.size_hint()
    }
}
