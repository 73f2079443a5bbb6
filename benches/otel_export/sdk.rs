//! The same export work written with the official crates, the way their documentation sets them
//! up: `opentelemetry_sdk`'s `BatchSpanProcessor` and `PeriodicReader` (each on the SDK's own
//! background thread) with `opentelemetry-otlp`'s HTTP/protobuf exporters and the blocking
//! reqwest client their documentation names for those threads.
//!
//! What must hold for the comparison to be fair: the same instruments as tokenmeter's exporter
//! (`aggregate` and `metrics_request` in `src/publish/otel/mod.rs`: five base-2 exponential
//! histograms with at most 160 buckets from scale 20, four monotonic counters, cumulative, the
//! same attributes), metrics every second, and per request one span with the same name, kind,
//! times, ~30 attributes, first-token event and status as its `span()`; sampler always_on,
//! queue 2048, batch 512, schedule delay 5 s. Recording and span building run on the calling
//! thread, as with the SDK they run on the request's own task.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use opentelemetry::metrics::{Counter, Histogram, MeterProvider as _};
use opentelemetry::trace::{
    Event, Span as _, SpanBuilder, SpanContext, SpanId, SpanKind, Status, TraceContextExt as _,
    TraceFlags, TraceId, TraceState, Tracer as _, TracerProvider as _,
};
use opentelemetry::{Array, Context, InstrumentationScope, KeyValue, StringValue, Value};
use opentelemetry_otlp::{MetricExporter, Protocol, SpanExporter, WithExportConfig as _};
use opentelemetry_sdk::metrics::{
    Aggregation, Instrument, InstrumentKind, PeriodicReader, SdkMeterProvider, Stream, Temporality,
};
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, BatchSpanProcessor, Sampler, SdkTracer, SdkTracerProvider,
};
use opentelemetry_sdk::Resource;
use tokenmeter::otel_bench::BenchRequest;

const SCHEMA_URL: &str = "https://opentelemetry.io/schemas/1.41.0";

/// Both providers, their tracer and instruments.
pub(crate) struct Sdk {
    tracer_provider: SdkTracerProvider,
    meter_provider: SdkMeterProvider,
    tracer: SdkTracer,
    ttft: Histogram<f64>,
    tpot: Histogram<f64>,
    duration: Histogram<f64>,
    token_usage: Histogram<f64>,
    max_itl: Histogram<f64>,
    requests: Counter<u64>,
    slo_requests: Counter<u64>,
    slo_violations: Counter<u64>,
    goodput: Counter<u64>,
    server_address: Arc<str>,
    server_port: i64,
}

impl Sdk {
    pub(crate) fn start(collector: SocketAddr) -> Result<Sdk, String> {
        let resource = Resource::builder()
            .with_service_name("tokenmeter")
            .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
            .build();
        let scope = InstrumentationScope::builder("tokenmeter")
            .with_version(env!("CARGO_PKG_VERSION"))
            .with_schema_url(SCHEMA_URL)
            .build();

        let spans = SpanExporter::builder()
            .with_http()
            .with_protocol(Protocol::HttpBinary)
            .with_endpoint(format!("http://{collector}/v1/traces"))
            .with_timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| format!("span exporter: {e}"))?;
        let batch = BatchConfigBuilder::default()
            .with_max_queue_size(2048)
            .with_max_export_batch_size(512)
            .with_scheduled_delay(Duration::from_secs(5))
            .build();
        let tracer_provider = SdkTracerProvider::builder()
            .with_span_processor(
                BatchSpanProcessor::builder(spans)
                    .with_batch_config(batch)
                    .build(),
            )
            .with_sampler(Sampler::AlwaysOn)
            .with_resource(resource.clone())
            .build();
        let tracer = tracer_provider.tracer_with_scope(scope.clone());

        let metrics = MetricExporter::builder()
            .with_http()
            .with_protocol(Protocol::HttpBinary)
            .with_endpoint(format!("http://{collector}/v1/metrics"))
            .with_timeout(Duration::from_secs(10))
            .with_temporality(Temporality::Cumulative)
            .build()
            .map_err(|e| format!("metric exporter: {e}"))?;
        let reader = PeriodicReader::builder(metrics)
            .with_interval(Duration::from_secs(1))
            .build();
        // Every histogram base-2 exponential, as tokenmeter's default aggregation.
        let exponential = |i: &Instrument| {
            (i.kind() == InstrumentKind::Histogram).then(|| {
                Stream::builder()
                    .with_aggregation(Aggregation::Base2ExponentialHistogram {
                        max_size: 160,
                        max_scale: 20,
                        record_min_max: true,
                    })
                    .build()
                    .ok()
            })?
        };
        let meter_provider = SdkMeterProvider::builder()
            .with_reader(reader)
            .with_view(exponential)
            .with_resource(resource)
            .build();
        let meter = meter_provider.meter_with_scope(scope);
        let histogram = |name: &'static str, unit: &'static str, description: &'static str| {
            meter
                .f64_histogram(name)
                .with_unit(unit)
                .with_description(description)
                .build()
        };
        let counter = |name: &'static str, unit: &'static str, description: &'static str| {
            meter
                .u64_counter(name)
                .with_unit(unit)
                .with_description(description)
                .build()
        };
        Ok(Sdk {
            ttft: histogram(
                "gen_ai.server.time_to_first_token",
                "s",
                "Time to the first output token, as the client received it.",
            ),
            tpot: histogram(
                "gen_ai.server.time_per_output_token",
                "s",
                "Time per output token after the first, as the client received them.",
            ),
            duration: histogram(
                "gen_ai.server.request.duration",
                "s",
                "Request duration, arrival to the last byte handed to the client.",
            ),
            token_usage: histogram(
                "gen_ai.client.token.usage",
                "{token}",
                "Input and output tokens per request.",
            ),
            max_itl: histogram(
                "tokenmeter.request.max_inter_token_latency",
                "s",
                "The longest gap between two output tokens of a request.",
            ),
            requests: counter(
                "tokenmeter.requests",
                "{request}",
                "Finished requests by outcome and finish reason; outcome cancelled is abandonment.",
            ),
            slo_requests: counter(
                "tokenmeter.slo.requests",
                "{request}",
                "Requests judged against their route's SLO, by verdict.",
            ),
            slo_violations: counter(
                "tokenmeter.slo.violations",
                "{request}",
                "SLO violations by criterion (a request may violate several).",
            ),
            goodput: counter(
                "tokenmeter.goodput.output_tokens",
                "{token}",
                "Output tokens of requests that met their SLO (goodput).",
            ),
            tracer_provider,
            meter_provider,
            tracer,
            server_address: Arc::from("127.0.0.1"),
            server_port: 8000,
        })
    }

    /// What a request's task does when the request finishes: records the metrics and builds,
    /// then ends, its span.
    pub(crate) fn finish(&self, r: &BenchRequest) {
        let (operation, provider) = operation_and_provider(&r.path);
        let error_type = error_type(r);
        self.record_metrics(r, operation, provider, error_type.as_deref());
        self.span(r, operation, provider, error_type);
    }

    fn record_metrics(
        &self,
        r: &BenchRequest,
        operation: &'static str,
        provider: &'static str,
        error_type: Option<&str>,
    ) {
        let mut base = vec![
            KeyValue::new("gen_ai.operation.name", operation),
            KeyValue::new("gen_ai.provider.name", provider),
            KeyValue::new(
                "gen_ai.request.model",
                r.model.clone().unwrap_or_else(|| Arc::from("other")),
            ),
            KeyValue::new("server.address", self.server_address.clone()),
            KeyValue::new("server.port", self.server_port),
            KeyValue::new("tokenmeter.route", r.route.clone()),
        ];
        if let Some(m) = &r.response_model {
            base.push(KeyValue::new("gen_ai.response.model", m.to_string()));
        }
        let with = |extra: &[KeyValue]| -> Vec<KeyValue> {
            let mut a = Vec::with_capacity(base.len() + extra.len());
            a.extend_from_slice(&base);
            a.extend_from_slice(extra);
            a
        };
        let secs = |ms: f64| ms / 1e3;
        if let Some(ms) = r.ttft_ms {
            self.ttft.record(secs(ms), &base);
        }
        if let Some(ms) = r.tpot_ms {
            self.tpot.record(secs(ms), &base);
        }
        if let Some(ms) = r.max_itl_ms {
            self.max_itl.record(secs(ms), &base);
        }
        if let Some(p) = r.prompt_tokens {
            self.token_usage.record(
                p as f64,
                &with(&[KeyValue::new("gen_ai.token.type", "input")]),
            );
        }
        if r.ttft_ms.is_some() || r.output_tokens > 0 {
            self.token_usage.record(
                r.output_tokens as f64,
                &with(&[KeyValue::new("gen_ai.token.type", "output")]),
            );
        }
        match error_type {
            Some(e) => self.duration.record(
                secs(r.e2e_ms),
                &with(&[KeyValue::new("error.type", e.to_string())]),
            ),
            None => self.duration.record(secs(r.e2e_ms), &base),
        }
        let mut outcome = vec![KeyValue::new("tokenmeter.outcome", r.outcome)];
        if let Some(f) = r.finish_reason {
            outcome.push(KeyValue::new("tokenmeter.finish_reason", f));
        }
        self.requests.add(1, &with(&outcome));
        if let Some(verdict) = r.slo {
            self.slo_requests.add(
                1,
                &with(&[KeyValue::new("tokenmeter.slo.verdict", verdict)]),
            );
            if verdict == "good" {
                self.goodput.add(r.output_tokens, &base);
            }
        }
        for criterion in &r.violated {
            self.slo_violations.add(
                1,
                &with(&[KeyValue::new("tokenmeter.slo.criterion", *criterion)]),
            );
        }
    }

    fn span(
        &self,
        r: &BenchRequest,
        operation: &'static str,
        provider: &'static str,
        error_type: Option<String>,
    ) {
        let start = r.start;
        let at_ms = |ms: f64| start + Duration::from_nanos((ms * 1e6) as u64);
        let secs = |ms: f64| ms / 1e3;
        let mut a = Vec::with_capacity(40);
        a.extend([
            KeyValue::new("gen_ai.operation.name", operation),
            KeyValue::new("gen_ai.provider.name", provider),
            KeyValue::new("server.address", self.server_address.clone()),
            KeyValue::new("server.port", self.server_port),
            KeyValue::new("http.request.method", "POST"),
            KeyValue::new("url.path", r.path.to_string()),
            KeyValue::new("tokenmeter.route", r.route.clone()),
            KeyValue::new("tokenmeter.outcome", r.outcome),
            KeyValue::new("gen_ai.request.stream", r.stream),
            KeyValue::new("gen_ai.usage.output_tokens", r.output_tokens as i64),
            KeyValue::new("tokenmeter.e2e", secs(r.e2e_ms)),
            KeyValue::new("tokenmeter.in_flight", r.in_flight),
            KeyValue::new("tokenmeter.in_flight_total", r.in_flight_total),
        ]);
        let mut opt = |key: &'static str, value: Option<Value>| {
            if let Some(v) = value {
                a.push(KeyValue::new(key, v));
            }
        };
        opt("gen_ai.request.model", r.model.clone().map(Value::from));
        opt(
            "gen_ai.response.model",
            r.response_model
                .as_deref()
                .map(|m| Value::from(m.to_string())),
        );
        opt(
            "http.response.status_code",
            r.status.map(|s| Value::I64(i64::from(s))),
        );
        opt("error.type", error_type.clone().map(Value::from));
        opt("tokenmeter.reason", r.reason.map(Value::from));
        opt(
            "tokenmeter.request_id",
            r.request_id
                .as_deref()
                .map(|id| Value::from(id.to_string())),
        );
        opt(
            "gen_ai.usage.input_tokens",
            r.prompt_tokens.map(|n| Value::I64(n as i64)),
        );
        opt(
            "gen_ai.usage.cache_read.input_tokens",
            r.cached_tokens.map(|n| Value::I64(n as i64)),
        );
        opt(
            "gen_ai.usage.reasoning.output_tokens",
            r.reasoning_tokens.map(|n| Value::I64(n as i64)),
        );
        opt(
            "gen_ai.response.finish_reasons",
            r.finish_reason
                .map(|f| Value::Array(Array::String(vec![StringValue::from(f)]))),
        );
        opt(
            "gen_ai.response.time_to_first_chunk",
            r.ttfb_ms.map(|ms| Value::F64(secs(ms))),
        );
        opt("tokenmeter.ttft", r.ttft_ms.map(|ms| Value::F64(secs(ms))));
        opt("tokenmeter.tpot", r.tpot_ms.map(|ms| Value::F64(secs(ms))));
        opt(
            "tokenmeter.max_itl",
            r.max_itl_ms.map(|ms| Value::F64(secs(ms))),
        );
        opt("tokenmeter.slo.verdict", r.slo.map(Value::from));
        opt(
            "tokenmeter.slo.violated",
            (!r.violated.is_empty()).then(|| {
                Value::Array(Array::String(
                    r.violated.iter().map(|c| StringValue::from(*c)).collect(),
                ))
            }),
        );
        opt(
            "tokenmeter.queue",
            r.queue_ms.map(|ms| Value::F64(secs(ms))),
        );
        opt("tokenmeter.queue.source", r.queue_source.map(Value::from));
        opt(
            "tokenmeter.engine.prefill",
            r.engine_prefill_ms.map(|ms| Value::F64(secs(ms))),
        );
        opt(
            "tokenmeter.engine.decode",
            r.engine_decode_ms.map(|ms| Value::F64(secs(ms))),
        );
        opt(
            "tokenmeter.engine.waiting",
            r.engine_waiting.map(Value::F64),
        );
        opt(
            "tokenmeter.engine.kv_usage",
            r.engine_kv_usage.map(Value::F64),
        );
        let name = match &r.model {
            Some(model) => format!("{operation} {model}"),
            None => operation.to_string(),
        };
        let events = r
            .ttft_ms
            .map(|ms| Event::new("tokenmeter.first_token", at_ms(ms), Vec::new(), 0))
            .into_iter()
            .collect();
        // The caller's span, as a propagator would have extracted it at the request's start.
        let parent = match r.parent {
            Some((trace_id, span_id, sampled)) => {
                let flags = if sampled {
                    TraceFlags::SAMPLED
                } else {
                    TraceFlags::default()
                };
                let state = r
                    .tracestate
                    .as_deref()
                    .and_then(|s| s.parse::<TraceState>().ok())
                    .unwrap_or_default();
                Context::new().with_remote_span_context(SpanContext::new(
                    TraceId::from_bytes(trace_id),
                    SpanId::from_bytes(span_id),
                    flags,
                    true,
                    state,
                ))
            }
            None => Context::new(),
        };
        let builder = SpanBuilder::from_name(name)
            .with_kind(SpanKind::Client)
            .with_start_time(start)
            .with_attributes(a)
            .with_events(events);
        let mut span = self.tracer.build_with_context(builder, &parent);
        if r.outcome == "error" {
            span.set_status(Status::error(error_type.unwrap_or_default()));
        }
        span.end_with_timestamp(at_ms(r.e2e_ms));
    }

    /// Exports what is held (spans and a last collection of metrics) and stops both threads.
    pub(crate) fn shutdown(&self) -> Result<(), String> {
        let spans = self.tracer_provider.shutdown();
        let metrics = self.meter_provider.shutdown();
        spans.map_err(|e| format!("tracer provider shutdown: {e}"))?;
        metrics.map_err(|e| format!("meter provider shutdown: {e}"))
    }
}

/// `gen_ai.operation.name` and `gen_ai.provider.name` for the paths the bench sends, as
/// tokenmeter's `operation_and_provider` reads them.
fn operation_and_provider(path: &str) -> (&'static str, &'static str) {
    if path.ends_with("/chat/completions") {
        ("chat", "openai")
    } else if path.ends_with("/completions") {
        ("text_completion", "openai")
    } else {
        ("chat", "openai")
    }
}

/// `error.type` as tokenmeter's `error_type`: the reason, else the status, else the outcome.
fn error_type(r: &BenchRequest) -> Option<String> {
    if r.outcome == "ok" {
        return None;
    }
    Some(match (r.reason, r.status) {
        (Some(reason), _) => reason.to_string(),
        (None, Some(status)) if status >= 400 => status.to_string(),
        _ => r.outcome.to_string(),
    })
}
