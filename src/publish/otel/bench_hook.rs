//! For `benches/otel_export.rs` only: the real exporter (its thread, queue, aggregation,
//! sampling, encoding and HTTP client), started and fed from plain values by a crate outside
//! this one. Not part of the public API (hidden from the docs); nothing in the proxy uses it.
//!
//! What must hold: [`BenchExporter::send`] does on the calling thread what the recorder does
//! for OpenTelemetry when a request finishes (build the [`Record`] and the [`Finished`] around
//! it, then one `try_send`), so the bench charges the request path with the same work.

#![doc(hidden)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use prometheus::Registry;

use super::{start, Finished, OtelSink};
use crate::config::{resolve_otel, Identity, Upstream};
use crate::parse::{Dialect, TraceParent};
use crate::publish::record::{Record, Timestamp};

/// One finished request, as the recorder knows it when the response ends. The fields the
/// exporter reads; the rest of the record takes neutral values.
#[derive(Debug, Clone)]
pub struct BenchRequest {
    pub start: SystemTime,
    pub request_id: Option<Box<str>>,
    pub route: Arc<str>,
    pub model: Option<Arc<str>>,
    pub path: Box<str>,
    pub status: Option<u16>,
    /// `ok`, `error`, `cancelled`.
    pub outcome: &'static str,
    /// `good`, `violated`, `excluded`.
    pub slo: Option<&'static str>,
    pub violated: Vec<&'static str>,
    pub finish_reason: Option<&'static str>,
    pub reason: Option<&'static str>,
    pub prompt_tokens: Option<u64>,
    pub output_tokens: u64,
    pub cached_tokens: Option<u64>,
    pub reasoning_tokens: Option<u64>,
    pub ttfb_ms: Option<f64>,
    pub ttft_ms: Option<f64>,
    pub tpot_ms: Option<f64>,
    pub max_itl_ms: Option<f64>,
    pub e2e_ms: f64,
    pub in_flight: i64,
    pub in_flight_total: i64,
    pub queue_ms: Option<f64>,
    pub queue_source: Option<&'static str>,
    pub engine_prefill_ms: Option<f64>,
    pub engine_decode_ms: Option<f64>,
    pub engine_waiting: Option<f64>,
    pub engine_kv_usage: Option<f64>,
    /// The caller's `traceparent`: trace id, parent span id, sampled flag.
    pub parent: Option<([u8; 16], [u8; 8], bool)>,
    pub tracestate: Option<Box<str>>,
    pub dialect: Option<Dialect>,
    pub stream: bool,
    pub response_model: Option<Box<str>>,
}

/// What the exporter counted, as `/metrics` would show it.
#[derive(Debug, Clone, Copy, Default)]
pub struct BenchCounts {
    pub spans_exported: u64,
    pub dropped_spans: u64,
    pub dropped_requests: u64,
    pub trace_exports: u64,
    pub metric_exports: u64,
    pub export_errors: u64,
}

/// The exporter thread, started as the proxy starts it, with its own registry.
pub struct BenchExporter {
    sink: OtelSink,
}

impl BenchExporter {
    /// Starts the exporter with the specification's defaults (queue 2048, batch 512, schedule
    /// delay 5 s), exponential histograms, metrics every `metric_interval` to
    /// `http://{collector}/v1/metrics` and every span kept (`always_on`) to `/v1/traces`.
    pub fn start(collector: SocketAddr, metric_interval: Duration) -> std::io::Result<Self> {
        // Resolved as the proxy resolves the variables, so the bench measures the settings a
        // user gets (the specification's defaults for everything not named here).
        let vars = [
            ("OTEL_EXPORTER_OTLP_ENDPOINT", format!("http://{collector}")),
            ("OTEL_TRACES_SAMPLER", "always_on".to_string()),
            (
                "OTEL_METRIC_EXPORT_INTERVAL",
                metric_interval.as_millis().max(1).to_string(),
            ),
        ];
        let env = |name: &str| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.clone())
        };
        let settings = resolve_otel(None, &env)
            .map_err(std::io::Error::other)?
            .ok_or_else(|| std::io::Error::other("export is off"))?;
        let upstream = Upstream::parse("http://127.0.0.1:8000").map_err(std::io::Error::other)?;
        let sink = start(settings, &upstream, &Identity::default(), &Registry::new())?;
        Ok(BenchExporter { sink })
    }

    /// What the request path does when a request finishes: builds the record and hands it over.
    pub fn send(&self, r: &BenchRequest) {
        let record = Record {
            ts: Timestamp(r.start),
            request_id: r.request_id.clone(),
            route: r.route.clone(),
            model: r.model.clone(),
            method: http::Method::POST,
            path: r.path.clone(),
            status: r.status,
            outcome: r.outcome,
            slo: r.slo,
            violated: r.violated.clone(),
            finish_reason: r.finish_reason,
            prompt_tokens: r.prompt_tokens,
            output_tokens: r.output_tokens,
            token_source: "usage",
            events: r.output_tokens + 2,
            ttfb_ms: r.ttfb_ms,
            ttft_ms: r.ttft_ms,
            ttfc_ms: r.ttft_ms,
            tpot_ms: r.tpot_ms,
            max_itl_ms: r.max_itl_ms,
            e2e_ms: r.e2e_ms,
            in_flight: r.in_flight,
            bytes: r.output_tokens * 180,
            in_flight_total: r.in_flight_total,
            reason: r.reason,
            read: "parsed",
            retries: 0,
            upstream_conn: Some("reused"),
            connect_ms: None,
            proxy_ms: Some(0.05),
            cached_tokens: r.cached_tokens,
            cache_creation_tokens: None,
            reasoning_tokens: r.reasoning_tokens,
            engine_queue_ms: None,
            engine_prefill_ms: r.engine_prefill_ms,
            engine_decode_ms: r.engine_decode_ms,
            engine_inference_ms: None,
            engine_load_ms: None,
            engine_total_ms: None,
            engine_prompt_n: None,
            engine_source: None,
            queue_ms: r.queue_ms,
            queue_source: r.queue_source,
            engine_running: None,
            engine_waiting: r.engine_waiting,
            engine_kv_usage: r.engine_kv_usage,
        };
        let model_label = r.model.clone().unwrap_or_else(|| Arc::from("other"));
        self.sink.send(Finished {
            record,
            model_label,
            parent: r.parent.map(|(trace_id, span_id, sampled)| TraceParent {
                trace_id,
                span_id,
                sampled,
            }),
            tracestate: r.tracestate.clone(),
            dialect: r.dialect,
            stream: r.stream,
            response_model: r.response_model.clone(),
        });
    }

    /// Exports what is held and stops the thread, waiting at most `within`.
    pub fn close_within(&self, within: Duration) -> bool {
        self.sink.close_within(within)
    }

    pub fn counts(&self) -> BenchCounts {
        let c = &self.sink.counters;
        BenchCounts {
            spans_exported: c.spans_exported.get(),
            dropped_spans: c.dropped.with_label_values(&["traces"]).get(),
            dropped_requests: c.dropped.with_label_values(&["metrics"]).get(),
            trace_exports: c.exports.with_label_values(&["traces"]).get(),
            metric_exports: c.exports.with_label_values(&["metrics"]).get(),
            export_errors: c.errors.with_label_values(&["traces"]).get()
                + c.errors.with_label_values(&["metrics"]).get(),
        }
    }
}
