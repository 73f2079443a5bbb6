//! The OTLP/HTTP receiver the `tokenmeter+otlp` way exports to: a hyper server on loopback, in
//! the bench's process, that decodes every body it is sent with the official protobuf
//! definitions (`opentelemetry-proto`, through prost), counts what it decoded and discards it,
//! answering 200 with an empty export response (an empty protobuf message is zero bytes). Its
//! CPU time is the bench's, not the proxy's: the way's cost is what tokenmeter spends to build,
//! encode and send, as it would be with a Collector on another machine.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

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
    pub(crate) data_points: AtomicU64,
    pub(crate) metric_exports: AtomicU64,
    pub(crate) bytes: AtomicU64,
    /// Bodies that did not decode, or came to another path: answered 400, decoded nothing.
    pub(crate) rejected: AtomicU64,
}

pub(crate) struct Sink {
    pub(crate) addr: SocketAddr,
    pub(crate) tally: Arc<Tally>,
}

impl Sink {
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
                let spans: usize = export
                    .resource_spans
                    .iter()
                    .flat_map(|r| &r.scope_spans)
                    .map(|s| s.spans.len())
                    .sum();
                tally.spans.fetch_add(spans as u64, Ordering::Relaxed);
                tally.trace_exports.fetch_add(1, Ordering::Relaxed);
            })
            .is_ok(),
        "/v1/metrics" => ExportMetricsServiceRequest::decode(body)
            .map(|export| {
                let points: usize = export
                    .resource_metrics
                    .iter()
                    .flat_map(|r| &r.scope_metrics)
                    .flat_map(|s| &s.metrics)
                    .map(|m| match &m.data {
                        Some(Data::Gauge(g)) => g.data_points.len(),
                        Some(Data::Sum(s)) => s.data_points.len(),
                        Some(Data::Histogram(h)) => h.data_points.len(),
                        Some(Data::ExponentialHistogram(h)) => h.data_points.len(),
                        Some(Data::Summary(s)) => s.data_points.len(),
                        None => 0,
                    })
                    .sum();
                tally
                    .data_points
                    .fetch_add(points as u64, Ordering::Relaxed);
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
