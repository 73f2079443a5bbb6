//! The admin listener: `/metrics`, `/healthz`, `/readyz`, and the live view (`/stats` as JSON,
//! `/` as a page that refreshes itself), apart from client traffic.
//!
//! It only reads what requests have published; nothing here is on a request's path.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{header, Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::service::service_fn;
use tokio::net::TcpListener;
use tokio::sync::watch;

use super::client_body::ClientBody;
use super::connection;
use super::generation::{Generation, Generations};
use super::http1::server as h1;
use super::listener::{self, Health};
use crate::publish::live::{self, RouteView};

const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Serves the admin endpoints until the task is aborted, with the client listener's timeouts
/// and limits of its own: a scraper and probes need few connections and small heads.
pub(crate) async fn serve(
    listener: TcpListener,
    generations: Arc<Generations>,
    health: Arc<Health>,
    request_head: Duration,
    client_idle: Duration,
) {
    let limits = connection::Limits {
        request_head,
        client_idle,
        max_head_bytes: 16 << 10,
        max_streams: 16,
    };
    // The admin port serves through the drain (so /readyz can say 503) until aborted.
    let (_never, shutdown) = watch::channel(false);
    let make = move |_conn| {
        let (generations, health) = (generations.clone(), health.clone());
        h1::Hyper(service_fn(move |req| {
            let response = respond(&req, &generations.current(), &health);
            async move { Ok::<_, Infallible>(response) }
        }))
    };
    let _ = listener::serve_listener(
        listener,
        listener::Cap::new(listener::ADMIN_MAX_CONNECTIONS),
        0,
        limits,
        make,
        shutdown,
    )
    .await;
}

fn respond(
    req: &Request<ClientBody>,
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
        "/stats" => stats(generation, false),
        "/stats/series" => stats(generation, true),
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
            "not found: try /, /stats, /stats/series, /metrics, /healthz or /readyz\n",
        ),
    }
}

/// The live view's numbers (`series`: its per-slot points) for every configured route (the
/// default included) and any other route seen in the last hour.
fn stats(generation: &Generation, series: bool) -> Response<Full<Bytes>> {
    let routes: Vec<RouteView> = generation
        .meter
        .router
        .routes()
        .map(|r| {
            let in_flight = generation.meter.metrics.in_flight_now(&r.name);
            RouteView::new(&r.name, r.slo.as_ref(), in_flight)
        })
        .collect();
    let (live, now) = (&generation.meter.live, tokio::time::Instant::now());
    let body = if series {
        serde_json::to_vec(&live.series(now, &routes))
    } else {
        serde_json::to_vec(&live.snapshot(now, &routes))
    };
    let Ok(body) = body else {
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
