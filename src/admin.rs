//! The admin listener: `/metrics`, `/healthz` and `/readyz`, apart from client traffic.
//!
//! It only reads what requests have published; nothing here is on a request's path.

use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use http::{header, Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;

use crate::recorder::Shared;
use crate::reload::Generations;
use crate::server::Health;

const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Serves the admin endpoints until the task is aborted.
pub async fn serve(listener: TcpListener, generations: Arc<Generations>, health: Arc<Health>) {
    let builder = auto::Builder::new(TokioExecutor::new());
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                tracing::warn!(error = %e, "admin accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let (generations, health) = (generations.clone(), health.clone());
        let service = service_fn(move |req| {
            let response = respond(&req, &generations.current(), &health);
            async move { Ok::<_, Infallible>(response) }
        });
        let connection = builder
            .serve_connection(TokioIo::new(stream), service)
            .into_owned();
        tokio::spawn(async move {
            let _ = connection.await;
        });
    }
}

fn respond(req: &Request<Incoming>, shared: &Shared, health: &Health) -> Response<Full<Bytes>> {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return text(StatusCode::METHOD_NOT_ALLOWED, "only GET and HEAD\n");
    }
    match req.uri().path() {
        "/metrics" => {
            let mut response = Response::new(Full::new(Bytes::from(shared.metrics.render())));
            response.headers_mut().insert(
                header::CONTENT_TYPE,
                header::HeaderValue::from_static(PROMETHEUS_TEXT),
            );
            response
        }
        "/healthz" => text(StatusCode::OK, "ok\n"),
        "/readyz" if health.is_ready() => text(StatusCode::OK, "ready\n"),
        "/readyz" => text(StatusCode::SERVICE_UNAVAILABLE, "draining\n"),
        _ => text(
            StatusCode::NOT_FOUND,
            "not found: try /metrics, /healthz or /readyz\n",
        ),
    }
}

fn text(status: StatusCode, body: &'static str) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}
