//! The proxy service: one request in, measured, forwarded, its response handed back timed.
//!
//! For each request it starts a [`Recorder`] once (route, in-flight gauge, start time), sends the
//! request upstream with its body read in passing for `model`, and either wraps the upstream
//! response body in a [`TimedBody`] or answers with the proxy's own error response. This is the
//! one edge where an [`Error`](super::error::Error) becomes HTTP.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{header, HeaderMap, Method, Request, Response, StatusCode, Version};
use http_body::{Body, Frame, SizeHint};
use http_body_util::Full;
use pin_project_lite::pin_project;
use tokio::time::Instant;

use super::client_body::ClientBody;
use super::error::Error;
use super::forward::Trip;
use super::generation::Generations;
use super::http1::head::Refusal;
use super::http1::pool::PooledBody;
use super::http1::server::Written;
use super::request_body::{RequestBody, Upload};
use super::BoxError;
use crate::measure::{Recorder, TimedBody};
use crate::policy::outcome::End;

pin_project! {
    /// What the client receives: the upstream's body, timed, or the proxy's own error body.
    /// Its own type rather than `http_body_util::Either`, so that the HTTP/1.1 server can reach
    /// the timed body through it ([`Written`]). The timed body is boxed where it is made: inline
    /// (with the upstream connection's body, its timer and the frames it holds unread) it would
    /// be copied at every step from the answer to the client's connection, on the path of the
    /// first token.
    #[project = ProxyBodyProj]
    pub(crate) enum ProxyBody {
        Timed { body: Pin<Box<TimedBody<PooledBody>>> },
        Own { #[pin] body: Full<Bytes> },
    }
}

impl ProxyBody {
    pub(crate) fn own(body: Full<Bytes>) -> ProxyBody {
        ProxyBody::Own { body }
    }
}

impl Body for ProxyBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.project() {
            ProxyBodyProj::Timed { body } => body.as_mut().poll_frame(cx).map_err(Into::into),
            ProxyBodyProj::Own { body } => body.poll_frame(cx).map_err(|e| match e {}),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            ProxyBody::Timed { body } => body.is_end_stream(),
            ProxyBody::Own { body } => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            ProxyBody::Timed { body } => body.size_hint(),
            ProxyBody::Own { body } => body.size_hint(),
        }
    }
}

/// The one implementation of the HTTP/1.1 server's hook: the timed body reads what was written
/// and the head handed over; the upstream's body lets its request go and says whether it holds
/// more.
impl Written for ProxyBody {
    fn written(self: Pin<&mut Self>) {
        if let ProxyBodyProj::Timed { body } = self.project() {
            body.as_mut().written();
            body.as_mut().inner_pin_mut().get_mut().written();
        }
    }

    fn holds_more(&self) -> bool {
        match self {
            ProxyBody::Timed { body } => body.inner().holds_more(),
            ProxyBody::Own { .. } => true,
        }
    }

    fn head(self: Pin<&mut Self>, parts: http::response::Parts) {
        if let ProxyBodyProj::Timed { body } = self.project() {
            body.as_mut().hand_head(parts);
        }
    }
}

/// The proxy as a hyper service; cheap to clone per connection.
#[derive(Clone)]
pub(crate) struct Proxy {
    generations: Arc<Generations>,
}

impl Proxy {
    pub(crate) fn new(generations: Arc<Generations>) -> Self {
        Proxy { generations }
    }
}

/// A request the proxy will not forward as it is: `CONNECT` (it does not tunnel), and an
/// HTTP/1.1 request without exactly one valid `Host` (RFC 9112 §3.2).
fn refusal(request: &http::request::Parts) -> Option<Error> {
    if request.method == Method::CONNECT {
        return Some(Error::MethodNotAllowed {
            method: request.method.clone(),
        });
    }
    let mut hosts = request.headers.get_all(header::HOST).iter();
    match (hosts.next(), hosts.next()) {
        (Some(_), Some(_)) => Some(Error::BadRequest {
            message: "more than one Host header (RFC 9112 §3.2)",
        }),
        (None, _) if request.version == Version::HTTP_11 => Some(Error::BadRequest {
            message: "an HTTP/1.1 request needs a Host header (RFC 9112 §3.2)",
        }),
        (Some(host), None)
            if host
                .to_str()
                .ok()
                .and_then(|h| h.parse::<http::uri::Authority>().ok())
                .is_none_or(|a| a.as_str().contains('@')) =>
        {
            Some(Error::BadRequest {
                message: "the Host header is not a valid host[:port] (RFC 9112 §3.2)",
            })
        }
        _ => None,
    }
}

/// What the proxy's answer to one request is while it is worked out.
pub(crate) type ProxyFuture =
    Pin<Box<dyn Future<Output = Result<Response<ProxyBody>, Infallible>> + Send>>;

/// The connections call the proxy as a hyper service, directly: through hyper_util's adapter
/// from a tower service, each call would be a `Oneshot` holding the whole request until its
/// first poll, moved with it into the connection's future for the answer.
impl hyper::service::Service<Request<ClientBody>> for Proxy {
    type Response = Response<ProxyBody>;
    type Error = Infallible;
    type Future = ProxyFuture;

    fn call(&self, request: Request<ClientBody>) -> Self::Future {
        let (parts, body) = request.into_parts();
        // Boxed once, here: every step on the way upstream moves a pointer to it. hyper drops
        // the head once encoded: it is read before it is handed over.
        Box::pin(self.answer(Box::new(parts), body, false))
    }
}

/// The proxy's own HTTP/1.1 server hands it the head boxed as it was parsed, and awaits the
/// answer in its own future.
impl super::http1::server::Service for Proxy {
    type Body = ProxyBody;
    type Error = Infallible;

    fn call(
        &self,
        parts: Box<http::request::Parts>,
        body: ClientBody,
    ) -> impl Future<Output = Result<Response<ProxyBody>, Infallible>> + Send {
        // The server hands the response head back once it has encoded it ([`Written::head`]).
        self.answer(parts, body, true)
    }

    /// A request the server refused at its head is recorded like any other refusal: the
    /// client's fault (`client_error`), with the method and path when they parsed.
    fn refused(&self, refusal: &Refusal) {
        let generation = self.generations.current();
        let method = refusal
            .method
            .clone()
            .unwrap_or_else(|| Method::from_bytes(b"-").unwrap_or_default());
        let uri = refusal
            .path
            .as_deref()
            .and_then(|p| p.parse::<http::Uri>().ok())
            .unwrap_or_default();
        let mut recorder =
            Recorder::start(generation.meter.clone(), &method, &uri, &HeaderMap::new());
        let reason = match refusal.status {
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE => "head_too_large",
            StatusCode::NOT_IMPLEMENTED => "not_implemented",
            _ => "bad_request",
        };
        tracing::debug!(status = %refusal.status, why = refusal.reason, "refused a request head");
        recorder.finish(
            End::Refused {
                status: refusal.status,
                reason,
            },
            Instant::now(),
        );
    }
}

impl Proxy {
    /// One request's answer. Not boxed here: the HTTP/1.1 server awaits it in the connection's
    /// own future, where it is made in place (boxed, its state would be written beside its box
    /// and copied in, on every request's way upstream). With `head_back`, the server says what
    /// it wrote and hands the response head to the body once it has encoded it: the frames and
    /// the head's fields are read after the writes ([`TimedBody::read_after_writes`]).
    fn answer(
        &self,
        parts: Box<http::request::Parts>,
        body: ClientBody,
        head_back: bool,
    ) -> impl Future<Output = Result<Response<ProxyBody>, Infallible>> + Send + 'static {
        // The request keeps this configuration to its end, whatever a reload does meanwhile.
        let generation = self.generations.current();
        async move {
            let mut recorder = Recorder::start(
                generation.meter.clone(),
                &parts.method,
                &parts.uri,
                &parts.headers,
            );
            if let Some(error) = refusal(&parts) {
                tracing::debug!(error = %error, "refusing a request");
                recorder.finish(error.end(), Instant::now());
                return Ok(error.to_response().map(ProxyBody::own));
            }
            let model = recorder.model_slot();
            let upload = Arc::new(Upload::default());
            let body = Box::new(RequestBody::new(
                body,
                model.clone(),
                upload.clone(),
                generation.timeouts.request_body,
            ));
            // If the client goes away while we wait, this future is dropped and so is the
            // recorder, which then counts the request as cancelled.
            let mut trip = Trip::default();
            let sent = {
                let send = generation.forwarder.send(parts, body, &upload, &mut trip);
                tokio::pin!(send);
                if recorder.route_pending() {
                    // A route matches on the model: decide it as soon as the body has named it,
                    // so the request counts as in flight on its route while it waits upstream.
                    tokio::select! {
                        biased;
                        sent = &mut send => sent,
                        () = model.decided() => {
                            recorder.resolve_route();
                            send.await
                        }
                    }
                } else {
                    send.await
                }
            };
            recorder.on_upstream(trip.reused, trip.connect, trip.handed, trip.retries);
            match sent {
                Ok(response) => {
                    let (parts, mut body) = response.into_parts();
                    let idle = Some(generation.timeouts.idle);
                    let body = Box::pin(if head_back && !body.is_end_stream() {
                        // The proxy's HTTP/1.1 server says what it wrote and hands the head
                        // back: the request, the frames and the head are let go and read
                        // after the writes, off the way to the client.
                        body.keep_request_until_written();
                        recorder.on_status(parts.status);
                        TimedBody::read_after_writes(body, recorder, idle)
                    } else {
                        recorder.on_head(parts.status, &parts.headers);
                        TimedBody::new(body, recorder, idle)
                    });
                    Ok(Response::from_parts(parts, ProxyBody::Timed { body }))
                }
                Err(error) => {
                    let end = error.end();
                    if matches!(end, crate::policy::outcome::End::Failed { .. }) {
                        tracing::warn!(error = %error, "answering the client with {}", error.status());
                    } else {
                        tracing::debug!(error = %error, "the client's request failed on its side");
                    }
                    recorder.finish(end, Instant::now());
                    Ok(error.to_response().map(ProxyBody::own))
                }
            }
        }
    }
}
