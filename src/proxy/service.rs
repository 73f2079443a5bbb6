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
use http::{Request, Response};
use http_body_util::{Either, Full};
use hyper::body::Incoming;
use tokio::time::Instant;

use super::generation::Generations;
use super::request_body::ModelSniffBody;
use crate::measure::{Recorder, TimedBody};
use crate::policy::outcome::End;

/// What the client receives: the upstream's body, timed, or the proxy's own error body.
pub(crate) type ProxyBody = Either<TimedBody<Incoming>, Full<Bytes>>;

/// The proxy as a tower service; cheap to clone per connection.
#[derive(Clone)]
pub(crate) struct Proxy {
    generations: Arc<Generations>,
}

impl Proxy {
    pub(crate) fn new(generations: Arc<Generations>) -> Self {
        Proxy { generations }
    }
}

impl tower::Service<Request<Incoming>> for Proxy {
    type Response = Response<ProxyBody>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Incoming>) -> Self::Future {
        // The request keeps this configuration to its end, whatever a reload does meanwhile.
        let generation = self.generations.current();
        let forwarder = generation.forwarder.clone();
        let mut recorder = Recorder::start(
            generation.meter.clone(),
            request.method(),
            request.uri(),
            request.headers(),
        );
        let (parts, body) = request.into_parts();
        let model = recorder.model_slot();
        let body = ModelSniffBody::new(body, model.clone());
        Box::pin(async move {
            // If the client goes away while we wait, this future is dropped and so is the
            // recorder, which then counts the request as cancelled.
            let send = forwarder.send(parts, body);
            tokio::pin!(send);
            let sent = if recorder.route_pending() {
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
            };
            match sent {
                Ok(response) => {
                    recorder.on_head(response.status(), response.headers());
                    let (parts, body) = response.into_parts();
                    let body = TimedBody::new(body, recorder);
                    Ok(Response::from_parts(parts, Either::Left(body)))
                }
                Err(error) => {
                    tracing::warn!(error = %error, "answering the client with {}", error.status());
                    recorder.finish(End::Failed(error.status()), Instant::now());
                    Ok(error.to_response().map(Either::Right))
                }
            }
        })
    }
}
