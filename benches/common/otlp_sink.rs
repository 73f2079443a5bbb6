//! The OTLP/HTTP receiver the benches export to (`overhead`'s `tokenmeter+otlp` way, both of
//! `otel_export`'s pipelines): a hyper server on 127.0.0.1:0 in the bench's own process, so its
//! CPU time is never charged to what is measured (as with a Collector on another machine), that
//! decodes every body with the official protobuf definitions (`opentelemetry-proto`) and
//! discards it, answering 200 with an empty export response (an empty protobuf message is zero
//! bytes). Beside the counts it keeps the shape of what it decoded (each metric's name, kind and
//! points in the latest export; attributes and events per span), so a report can show that two
//! pipelines sent the same thing.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::metrics::v1::metric::Data;
use prost::Message;
use tokio::net::TcpListener;

/// What the sink decoded so far.
#[derive(Default)]
pub(crate) struct Tally {
    pub(crate) spans: AtomicU64,
    pub(crate) trace_exports: AtomicU64,
    /// Data points over every metrics export decoded.
    pub(crate) data_points: AtomicU64,
    pub(crate) metric_exports: AtomicU64,
    pub(crate) bytes: AtomicU64,
    /// Bodies that did not decode, or came to another path: answered 400.
    pub(crate) rejected: AtomicU64,
    /// Attributes and events over every span decoded.
    pub(crate) span_attributes: AtomicU64,
    pub(crate) span_events: AtomicU64,
    /// The latest metrics export: name to (kind, data points).
    pub(crate) last_metrics: Mutex<BTreeMap<String, (&'static str, usize)>>,
}

pub(crate) struct Sink {
    pub(crate) addr: SocketAddr,
    pub(crate) tally: Arc<Tally>,
}

/// Listens on 127.0.0.1:0 and serves until the runtime ends.
pub(crate) async fn start() -> Result<Sink, String> {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| format!("OTLP sink: cannot bind: {e}"))?;
    let addr = listener
        .local_addr()
        .map_err(|e| format!("OTLP sink: no address: {e}"))?;
    let tally = Arc::new(Tally::default());
    let served = tally.clone();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let _ = stream.set_nodelay(true);
            let tally = served.clone();
            tokio::spawn(async move {
                let service = service_fn(move |request| answer(tally.clone(), request));
                let _ = http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    Ok(Sink { addr, tally })
}

async fn answer(
    tally: Arc<Tally>,
    request: Request<hyper::body::Incoming>,
) -> Result<Response<Full<Bytes>>, hyper::Error> {
    let path = request.uri().path().to_owned();
    let body = request.into_body().collect().await?.to_bytes();
    tally.bytes.fetch_add(body.len() as u64, Ordering::Relaxed);
    let decoded = match path.as_str() {
        "/v1/traces" => ExportTraceServiceRequest::decode(body)
            .map(|export| {
                let spans = export
                    .resource_spans
                    .iter()
                    .flat_map(|r| &r.scope_spans)
                    .flat_map(|s| &s.spans);
                let (mut n, mut attributes, mut events) = (0u64, 0u64, 0u64);
                for span in spans {
                    n += 1;
                    attributes += span.attributes.len() as u64;
                    events += span.events.len() as u64;
                }
                tally.spans.fetch_add(n, Ordering::Relaxed);
                tally
                    .span_attributes
                    .fetch_add(attributes, Ordering::Relaxed);
                tally.span_events.fetch_add(events, Ordering::Relaxed);
                tally.trace_exports.fetch_add(1, Ordering::Relaxed);
            })
            .is_ok(),
        "/v1/metrics" => ExportMetricsServiceRequest::decode(body)
            .map(|export| {
                let mut shape = BTreeMap::new();
                let mut all_points = 0u64;
                let metrics = export
                    .resource_metrics
                    .iter()
                    .flat_map(|r| &r.scope_metrics)
                    .flat_map(|s| &s.metrics);
                for m in metrics {
                    let (kind, points) = match &m.data {
                        Some(Data::Gauge(g)) => ("gauge", g.data_points.len()),
                        Some(Data::Sum(s)) => ("sum", s.data_points.len()),
                        Some(Data::Histogram(h)) => ("histogram", h.data_points.len()),
                        Some(Data::ExponentialHistogram(h)) => {
                            ("exponential_histogram", h.data_points.len())
                        }
                        Some(Data::Summary(s)) => ("summary", s.data_points.len()),
                        None => ("none", 0),
                    };
                    all_points += points as u64;
                    shape.insert(m.name.clone(), (kind, points));
                }
                tally.data_points.fetch_add(all_points, Ordering::Relaxed);
                *tally.last_metrics.lock().unwrap_or_else(|p| p.into_inner()) = shape;
                tally.metric_exports.fetch_add(1, Ordering::Relaxed);
            })
            .is_ok(),
        _ => false,
    };
    let status = if decoded {
        StatusCode::OK
    } else {
        tally.rejected.fetch_add(1, Ordering::Relaxed);
        StatusCode::BAD_REQUEST
    };
    let response = Response::builder()
        .status(status)
        .header("content-type", "application/x-protobuf")
        .body(Full::new(Bytes::new()))
        .expect("a static response is valid");
    Ok(response)
}
