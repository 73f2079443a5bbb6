//! The admin listener: `/metrics`, `/healthz`, `/readyz`, and the live view (`/stats` as JSON,
//! `/` as a page that refreshes itself), apart from client traffic.
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

use super::generation::{Generation, Generations};
use super::listener::{accept, Health};
use crate::publish::live::{self, RouteView};

const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Serves the admin endpoints until the task is aborted.
pub(crate) async fn serve(
    listener: TcpListener,
    generations: Arc<Generations>,
    health: Arc<Health>,
) {
    let builder = auto::Builder::new(TokioExecutor::new());
    loop {
        let stream = accept(&listener).await;
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

fn respond(
    req: &Request<Incoming>,
    generation: &Generation,
    health: &Health,
) -> Response<Full<Bytes>> {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return text(StatusCode::METHOD_NOT_ALLOWED, "only GET and HEAD\n");
    }
    match req.uri().path() {
        "/metrics" => {
            let mut response =
                Response::new(Full::new(Bytes::from(generation.meter.metrics.render())));
            response.headers_mut().insert(
                header::CONTENT_TYPE,
                header::HeaderValue::from_static(PROMETHEUS_TEXT),
            );
            response
        }
        "/stats" => stats(generation),
        "/" => {
            let mut response = Response::new(Full::new(Bytes::from_static(live::PAGE.as_bytes())));
            response.headers_mut().insert(
                header::CONTENT_TYPE,
                header::HeaderValue::from_static("text/html; charset=utf-8"),
            );
            response
        }
        "/healthz" => text(StatusCode::OK, "ok\n"),
        "/readyz" if health.is_ready() => text(StatusCode::OK, "ready\n"),
        "/readyz" => text(StatusCode::SERVICE_UNAVAILABLE, "draining\n"),
        _ => text(
            StatusCode::NOT_FOUND,
            "not found: try /, /stats, /metrics, /healthz or /readyz\n",
        ),
    }
}

/// The live view's numbers for every configured route (the default included) and any other
/// route seen in the last hour.
fn stats(generation: &Generation) -> Response<Full<Bytes>> {
    let routes: Vec<RouteView> = generation
        .meter
        .router
        .routes()
        .map(|r| RouteView {
            name: r.name.to_string(),
            objective: r.slo.and_then(|s| s.objective),
            in_flight: generation.meter.metrics.in_flight_now(&r.name),
        })
        .collect();
    let snapshot = generation
        .meter
        .live
        .snapshot(tokio::time::Instant::now(), &routes);
    let Ok(body) = serde_json::to_vec(&snapshot) else {
        return text(StatusCode::INTERNAL_SERVER_ERROR, "cannot encode /stats\n");
    };
    let mut response = Response::new(Full::new(Bytes::from(body)));
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    // Each fetch must see the numbers of that moment.
    headers.insert(
        header::CACHE_CONTROL,
        header::HeaderValue::from_static("no-store"),
    );
    response
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
