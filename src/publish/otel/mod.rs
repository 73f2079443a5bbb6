//! OpenTelemetry export: GenAI metrics and a span per request, over OTLP/HTTP (protobuf).
//!
//! A finished request's record is handed to an exporter thread through a bounded queue: the
//! request path does one `try_send` and nothing else (no formatting, no span building, no
//! aggregation). The thread, with a single-threaded runtime of its own, aggregates the metrics
//! (cumulative, so a lost export loses nothing once the next one arrives), builds and samples
//! the spans, and sends each signal with at most one export in flight. What it cannot hold is
//! dropped and counted (`tokenmeter_otel_dropped_total{signal}`): a record when the queue is
//! full, spans beyond `OTEL_BSP_MAX_QUEUE_SIZE` and those of a failed export; so a collector
//! that is down, slow or refusing costs clients nothing and the process a bounded amount of
//! memory. At exit [`OtelSink::close_within`] exports what is held, within a bound.
//!
//! Names, units and attributes are those of [`semconv`]; the proto messages are the official
//! definitions (`opentelemetry-proto`).

pub mod bench_hook;
mod histogram;
pub(crate) mod semconv;
mod transport;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{
    any_value, AnyValue, ArrayValue, InstrumentationScope, KeyValue,
};
use opentelemetry_proto::tonic::metrics::v1::{
    metric, AggregationTemporality, ExponentialHistogram, Histogram as HistogramData, Metric,
    NumberDataPoint, ResourceMetrics, ScopeMetrics, Sum,
};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{
    span, status, ResourceSpans, ScopeSpans, Span, Status,
};
use prometheus::{IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry};
use prost::Message as _;
use tokio::sync::mpsc::{self, error::TrySendError};
use tokio::time::Instant;

use self::histogram::Histogram;
use self::semconv as sc;
use self::transport::HttpClient;
use crate::config::{
    Endpoint, HistogramAggregation, Identity, OtelSettings, Root, Sampler, Upstream,
};
use crate::parse::{Dialect, TraceParent};
use crate::publish::record::Record;

/// Finished requests waiting for the exporter thread; more are dropped and counted.
pub(crate) const QUEUE_DEPTH: usize = 4096;
/// Distinct `gen_ai.response.model` values the metrics carry beyond the request's own model;
/// a response naming yet another leaves the attribute off its points, so series stay bounded.
const MAX_RESPONSE_MODELS: usize = 32;
/// While requests keep finishing, how long they gather in the queue before the exporter takes
/// them together: [`QUEUE_DEPTH`] requests in this time is 40,960 a second, far past what one
/// model server finishes.
const GATHER: Duration = Duration::from_millis(100);
/// While exports fail, how often the log says so again.
const FAILURE_LOG_EVERY: Duration = Duration::from_secs(60);

/// What a finished request hands to the exporter: its record and what only the request knew.
pub(crate) struct Finished {
    pub(crate) record: Record,
    /// The bounded model label of the Prometheus series: metrics take it, so the number of
    /// series stays bounded; the span takes the request's own model.
    pub(crate) model_label: Arc<str>,
    pub(crate) parent: Option<TraceParent>,
    pub(crate) tracestate: Option<Box<str>>,
    pub(crate) dialect: Option<Dialect>,
    /// The response was a stream (SSE or NDJSON).
    pub(crate) stream: bool,
    /// The model the response named, when it named one.
    pub(crate) response_model: Option<Box<str>>,
}

enum Message {
    Finished(Box<Finished>),
    /// Export everything held, answer, and stop.
    Close(Instant, std::sync::mpsc::Sender<()>),
}

/// The counters and gauges of the exporter, on `/metrics`.
pub(crate) struct Counters {
    dropped: IntCounterVec,
    errors: IntCounterVec,
    exports: IntCounterVec,
    spans_exported: IntCounter,
    queued: IntGaugeVec,
}

impl Counters {
    fn register(registry: &Registry) -> Counters {
        let vec = |name: &str, help: &str| {
            IntCounterVec::new(Opts::new(name, help), &["signal"]).expect("valid counter")
        };
        let c = Counters {
            dropped: vec(
                "tokenmeter_otel_dropped_total",
                "OpenTelemetry data lost before export (queue full, span queue full, failed span export), by signal: requests for metrics, spans for traces.",
            ),
            errors: vec(
                "tokenmeter_otel_export_errors_total",
                "OTLP export requests that failed (refused, timed out, unreachable), by signal.",
            ),
            exports: vec(
                "tokenmeter_otel_exports_total",
                "OTLP export requests the collector accepted, by signal.",
            ),
            spans_exported: IntCounter::new(
                "tokenmeter_otel_spans_exported_total",
                "Spans the collector accepted.",
            )
            .expect("valid counter"),
            queued: IntGaugeVec::new(
                Opts::new(
                    "tokenmeter_otel_queued",
                    "What waits for the OpenTelemetry exporter: finished requests (queue=requests) and spans (queue=spans).",
                ),
                &["queue"],
            )
            .expect("valid gauge"),
        };
        for collector in [
            Box::new(c.dropped.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(c.errors.clone()),
            Box::new(c.exports.clone()),
            Box::new(c.spans_exported.clone()),
            Box::new(c.queued.clone()),
        ] {
            // Registered once per process; a second exporter (a test's) reuses nothing.
            let _ = registry.register(collector);
        }
        c
    }
}

/// The sending side: cheap to clone, never blocks.
#[derive(Clone)]
pub(crate) struct OtelSink {
    tx: mpsc::Sender<Message>,
    counters: Arc<Counters>,
    queued_requests: IntGauge,
    metrics_on: bool,
    traces_on: bool,
    thread: Arc<Mutex<Option<JoinHandle<()>>>>,
}

impl OtelSink {
    /// Queues a finished request, or drops and counts it when the exporter is behind.
    pub(crate) fn send(&self, finished: Finished) {
        match self.tx.try_send(Message::Finished(Box::new(finished))) {
            Ok(()) => self.queued_requests.inc(),
            Err(TrySendError::Full(_)) | Err(TrySendError::Closed(_)) => self.count_lost(),
        }
    }

    fn count_lost(&self) {
        if self.metrics_on {
            self.counters.dropped.with_label_values(&["metrics"]).inc();
        }
        if self.traces_on {
            self.counters.dropped.with_label_values(&["traces"]).inc();
        }
    }

    /// At exit: exports what is held (metrics once more, every queued span) and stops the
    /// thread, waiting at most `within`. Whether it finished in time.
    pub(crate) fn close_within(&self, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        let (done_tx, done) = std::sync::mpsc::channel();
        let tx = self.tx.clone();
        // The queue may be full: the message is handed over by a thread of its own, so that
        // the wait below keeps its bound.
        let handing = thread::Builder::new()
            .name("tokenmeter-otel-close".into())
            .spawn(move || {
                let _ = tx.blocking_send(Message::Close(deadline, done_tx));
            });
        if handing.is_err() {
            return false;
        }
        match done.recv_timeout(within) {
            Ok(()) | Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                let t = self.thread.lock().unwrap_or_else(|p| p.into_inner()).take();
                if let Some(t) = t {
                    let _ = t.join();
                }
                true
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                tracing::warn!("OpenTelemetry data still queued at exit was not exported in time");
                false
            }
        }
    }
}

/// Starts the exporter thread for `settings`, registering its counters in `registry`.
pub(crate) fn start(
    settings: OtelSettings,
    upstream: &Upstream,
    identity: &Identity,
    registry: &Registry,
) -> std::io::Result<OtelSink> {
    let counters = Arc::new(Counters::register(registry));
    let (tx, rx) = mpsc::channel(QUEUE_DEPTH);
    let queued_requests = counters.queued.with_label_values(&["requests"]);
    let mut resource: Vec<KeyValue> = settings
        .resource
        .iter()
        .map(|(k, v)| kv(k, string(v)))
        .collect();
    let has = |r: &Vec<KeyValue>, k: &str| r.iter().any(|a| a.key == k);
    if !has(&resource, "service.version") {
        resource.push(kv("service.version", string(env!("CARGO_PKG_VERSION"))));
    }
    // Who exports, from the same names the record uses, unless the resource says them.
    let identity = identity.from_environment().unwrap_or_default();
    for (key, value) in [
        ("k8s.pod.name", &identity.pod),
        ("k8s.namespace.name", &identity.namespace),
        ("k8s.deployment.name", &identity.deployment),
    ] {
        if let Some(v) = value {
            if !has(&resource, key) {
                resource.push(kv(key, string(v)));
            }
        }
    }
    // Each signal's client, built here so that a TLS file that cannot be used stops the start.
    let with_client = |endpoint: &Option<Endpoint>| {
        endpoint
            .as_ref()
            .map(|e| transport::client(e).map(|c| (e.clone(), c)))
            .transpose()
            .map_err(std::io::Error::other)
    };
    let metrics = with_client(&settings.metrics_endpoint)?;
    let traces = with_client(&settings.traces_endpoint)?;
    let server_address = upstream.authority.host().to_string();
    let server_port = i64::from(upstream.authority.port_u16().unwrap_or(80));
    let sink = OtelSink {
        tx,
        counters: counters.clone(),
        queued_requests: queued_requests.clone(),
        metrics_on: settings.metrics_endpoint.is_some(),
        traces_on: settings.traces_endpoint.is_some(),
        thread: Arc::new(Mutex::new(None)),
    };
    let exporter = Exporter {
        settings: Arc::new(settings),
        resource: Resource {
            attributes: resource,
            ..Default::default()
        },
        server_address,
        server_port,
        started: unix_nanos(SystemTime::now()),
        series: HashMap::new(),
        response_models: ResponseModels::default(),
        pending: Vec::new(),
        queued_spans: counters.queued.with_label_values(&["spans"]),
        counters,
        queued_requests,
        metrics,
        traces,
        failing: Arc::new(Mutex::new(None)),
    };
    let handle = thread::Builder::new()
        .name("tokenmeter-otel".into())
        .spawn(move || {
            let runtime = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(r) => r,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot start the OpenTelemetry exporter");
                    return;
                }
            };
            runtime.block_on(exporter.run(rx));
        })?;
    *sink.thread.lock().unwrap_or_else(|p| p.into_inner()) = Some(handle);
    Ok(sink)
}

/// The metric series of one (operation, provider, model label, route).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct SeriesKey {
    operation: &'static str,
    provider: &'static str,
    model: Arc<str>,
    /// `gen_ai.response.model`, bounded (see [`MAX_RESPONSE_MODELS`]).
    response_model: Option<Arc<str>>,
    route: Arc<str>,
}

/// Everything aggregated for one [`SeriesKey`], cumulative since the exporter started.
struct Series {
    ttft: Histogram,
    tpot: Histogram,
    max_itl: Histogram,
    input_tokens: Histogram,
    output_tokens: Histogram,
    /// By `error.type` (none for a request that went well).
    duration: HashMap<Option<Box<str>>, Histogram>,
    /// By outcome and finish reason.
    requests: HashMap<(&'static str, Option<&'static str>), u64>,
    /// By verdict.
    slo: HashMap<&'static str, u64>,
    /// By criterion.
    violations: HashMap<&'static str, u64>,
    good_output_tokens: u64,
}

/// The response models the metrics name that are not a request's own model, at most
/// [`MAX_RESPONSE_MODELS`].
#[derive(Default)]
struct ResponseModels(HashSet<Arc<str>>);

impl ResponseModels {
    /// `gen_ai.response.model` as the metrics carry it: the request's bounded model label when
    /// the response names the model the request asked for (the usual case), else the name
    /// itself while fewer than [`MAX_RESPONSE_MODELS`] others have been seen, else nothing.
    fn label(
        &mut self,
        named: Option<&str>,
        requested: Option<&str>,
        model_label: &Arc<str>,
    ) -> Option<Arc<str>> {
        let named = named?;
        if requested == Some(named) {
            return Some(model_label.clone());
        }
        if let Some(known) = self.0.get(named) {
            return Some(known.clone());
        }
        if self.0.len() >= MAX_RESPONSE_MODELS {
            return None;
        }
        let label: Arc<str> = Arc::from(named);
        self.0.insert(label.clone());
        Some(label)
    }
}

/// When the exporter next exports, and the exports in flight (at most one per signal).
struct Timers {
    next_metrics: Instant,
    spans_due: Option<Instant>,
    metrics_export: Option<tokio::task::JoinHandle<()>>,
    spans_export: Option<tokio::task::JoinHandle<()>>,
}

impl Timers {
    fn due(&self) -> Instant {
        self.spans_due
            .unwrap_or(self.next_metrics)
            .min(self.next_metrics)
    }
}

fn idle(export: &Option<tokio::task::JoinHandle<()>>) -> bool {
    export.as_ref().is_none_or(|h| h.is_finished())
}

/// The exporter thread's state.
struct Exporter {
    settings: Arc<OtelSettings>,
    resource: Resource,
    server_address: String,
    server_port: i64,
    /// Cumulative series start here.
    started: u64,
    series: HashMap<SeriesKey, Series>,
    response_models: ResponseModels,
    /// Spans sampled and waiting for export, at most `max_queue_size`.
    pending: Vec<Span>,
    counters: Arc<Counters>,
    queued_requests: IntGauge,
    /// `tokenmeter_otel_queued{queue="spans"}`, resolved once: it is set per request.
    queued_spans: IntGauge,
    /// Where each signal goes and the client that sends it; `None`: not exported.
    metrics: Option<(Endpoint, HttpClient)>,
    traces: Option<(Endpoint, HttpClient)>,
    /// When exports started failing and when the log last said so.
    failing: Arc<Mutex<Option<Instant>>>,
}

/// One instrument being exported: name, unit, description and its points by attributes.
type Instrument<'a, T> = (&'a str, &'a str, &'a str, Vec<(Vec<KeyValue>, T)>);

impl Exporter {
    async fn run(mut self, mut rx: mpsc::Receiver<Message>) {
        let mut timers = Timers {
            next_metrics: Instant::now() + self.settings.metric_export_interval,
            spans_due: None,
            metrics_export: None,
            spans_export: None,
        };
        loop {
            tokio::select! {
                message = rx.recv() => {
                    let Some(message) = message else { return };
                    if self.handle(message, &mut timers).await {
                        return;
                    }
                    // Busy: rather than be woken by each finished request (a context switch
                    // on the proxy's cores per request), let the next ones gather for a while
                    // and take them together; back to waiting once a turn finds none.
                    loop {
                        self.gather(&mut timers).await;
                        self.on_time(&mut timers);
                        let mut took = 0;
                        while let Ok(message) = rx.try_recv() {
                            took += 1;
                            if self.handle(message, &mut timers).await {
                                return;
                            }
                        }
                        if took == 0 {
                            break;
                        }
                    }
                }
                _ = tokio::time::sleep_until(timers.due()) => self.on_time(&mut timers),
            }
        }
    }

    /// Waits out one turn of [`GATHER`]. Meanwhile a span export that ends while a full batch
    /// waits starts the next one at once, so exports run back to back however the requests
    /// arrive: waiting for the next turn instead would cap export at one batch a turn.
    async fn gather(&mut self, timers: &mut Timers) {
        let turn = (Instant::now() + GATHER).min(timers.due());
        loop {
            let backlog = self.pending.len() >= self.settings.max_export_batch_size;
            let in_flight = timers.spans_export.as_mut().filter(|_| backlog);
            match in_flight {
                Some(export) => {
                    tokio::select! {
                        _ = tokio::time::sleep_until(turn) => return,
                        _ = export => timers.spans_export = self.export_spans(),
                    }
                }
                None => {
                    tokio::time::sleep_until(turn).await;
                    return;
                }
            }
        }
    }

    /// One message; `true` once the exporter has closed.
    async fn handle(&mut self, message: Message, timers: &mut Timers) -> bool {
        match message {
            Message::Finished(f) => {
                self.queued_requests.dec();
                self.take(*f);
                if timers.spans_due.is_none() && !self.pending.is_empty() {
                    timers.spans_due = Some(Instant::now() + self.settings.schedule_delay);
                }
                if self.pending.len() >= self.settings.max_export_batch_size
                    && idle(&timers.spans_export)
                {
                    timers.spans_export = self.export_spans();
                    timers.spans_due = None;
                }
                false
            }
            Message::Close(deadline, done) => {
                let in_flight = [timers.metrics_export.take(), timers.spans_export.take()];
                self.close(deadline, in_flight).await;
                let _ = done.send(());
                true
            }
        }
    }

    /// Exports what is due.
    fn on_time(&mut self, timers: &mut Timers) {
        let now = Instant::now();
        if now >= timers.next_metrics {
            timers.next_metrics = now + self.settings.metric_export_interval;
            // One export in flight: a slow collector skips a turn, and the next export carries
            // the same cumulative totals.
            if idle(&timers.metrics_export) {
                timers.metrics_export = self.export_metrics();
            }
        }
        if timers.spans_due.is_some_and(|d| now >= d) {
            if idle(&timers.spans_export) {
                timers.spans_export = self.export_spans();
                timers.spans_due = None;
            } else {
                timers.spans_due = Some(now + self.settings.schedule_delay);
            }
        }
    }

    /// Exports what is held, within `deadline`: exports in flight finish first, then metrics
    /// once and every pending span.
    async fn close(
        &mut self,
        deadline: Instant,
        in_flight: [Option<tokio::task::JoinHandle<()>>; 2],
    ) {
        let work = async {
            for h in in_flight.into_iter().flatten() {
                let _ = h.await;
            }
            if let Some(h) = self.export_metrics() {
                let _ = h.await;
            }
            while !self.pending.is_empty() {
                if let Some(h) = self.export_spans() {
                    let _ = h.await;
                }
            }
        };
        if tokio::time::timeout_at(deadline, work).await.is_err() {
            let lost = self.pending.len() as u64;
            self.counters
                .dropped
                .with_label_values(&["traces"])
                .inc_by(lost);
        }
    }

    /// Aggregates one finished request and samples its span.
    fn take(&mut self, f: Finished) {
        let r = &f.record;
        let (operation, provider) = operation_and_provider(&r.path, f.dialect);
        if self.metrics.is_some() {
            self.aggregate(&f, operation, provider);
        }
        if self.traces.is_some() {
            let trace_id = f.parent.map_or_else(random_trace_id, |p| p.trace_id);
            // Failed and violating requests are always kept; the sampler decides the rest.
            let important = r.outcome != "ok" || r.slo == Some("violated");
            if important || sampled(self.settings.sampler, f.parent.as_ref(), &trace_id) {
                if self.pending.len() >= self.settings.max_queue_size {
                    self.counters.dropped.with_label_values(&["traces"]).inc();
                } else {
                    let span = self.span(&f, trace_id, operation, provider);
                    self.pending.push(span);
                }
            }
            self.queued_spans.set(self.pending.len() as i64);
        }
    }

    fn new_histogram(&self, bounds: &'static [f64]) -> Histogram {
        match self.settings.histogram {
            HistogramAggregation::Exponential => Histogram::exponential(),
            HistogramAggregation::Explicit => Histogram::explicit(bounds),
        }
    }

    fn aggregate(&mut self, f: &Finished, operation: &'static str, provider: &'static str) {
        let r = &f.record;
        let key = SeriesKey {
            operation,
            provider,
            model: f.model_label.clone(),
            response_model: self.response_models.label(
                f.response_model.as_deref(),
                f.record.model.as_deref(),
                &f.model_label,
            ),
            route: r.route.clone(),
        };
        if !self.series.contains_key(&key) {
            let series = Series {
                ttft: self.new_histogram(sc::TTFT_BOUNDS),
                tpot: self.new_histogram(sc::TPOT_BOUNDS),
                max_itl: self.new_histogram(sc::TPOT_BOUNDS),
                input_tokens: self.new_histogram(sc::TOKEN_BOUNDS),
                output_tokens: self.new_histogram(sc::TOKEN_BOUNDS),
                duration: HashMap::new(),
                requests: HashMap::new(),
                slo: HashMap::new(),
                violations: HashMap::new(),
                good_output_tokens: 0,
            };
            self.series.insert(key.clone(), series);
        }
        let fresh_duration = self.new_histogram(sc::DURATION_BOUNDS);
        let s = self.series.get_mut(&key).expect("inserted above");
        let secs = |ms: f64| ms / 1e3;
        if let Some(ms) = r.ttft_ms {
            s.ttft.record(secs(ms));
        }
        if let Some(ms) = r.tpot_ms {
            s.tpot.record(secs(ms));
        }
        if let Some(ms) = r.max_itl_ms {
            s.max_itl.record(secs(ms));
        }
        if let Some(p) = r.prompt_tokens {
            s.input_tokens.record(p as f64);
        }
        if r.ttft_ms.is_some() || r.output_tokens > 0 {
            s.output_tokens.record(r.output_tokens as f64);
        }
        s.duration
            .entry(error_type(r).map(Into::into))
            .or_insert(fresh_duration)
            .record(secs(r.e2e_ms));
        *s.requests.entry((r.outcome, r.finish_reason)).or_default() += 1;
        if let Some(verdict) = r.slo {
            *s.slo.entry(verdict).or_default() += 1;
            if verdict == "good" {
                s.good_output_tokens += r.output_tokens;
            }
        }
        for criterion in &r.violated {
            *s.violations.entry(criterion).or_default() += 1;
        }
    }

    fn base_attributes(&self, key: &SeriesKey) -> Vec<KeyValue> {
        let mut a = vec![
            kv(sc::OPERATION_NAME, string(key.operation)),
            kv(sc::PROVIDER_NAME, string(key.provider)),
            kv(sc::REQUEST_MODEL, string(&key.model)),
            kv(sc::SERVER_ADDRESS, string(&self.server_address)),
            kv(sc::SERVER_PORT, int(self.server_port)),
            kv(sc::ROUTE, string(&key.route)),
        ];
        if let Some(m) = &key.response_model {
            a.push(kv(sc::RESPONSE_MODEL, string(m)));
        }
        a
    }

    /// Every series as it stands, as one OTLP request.
    fn metrics_request(&self) -> ExportMetricsServiceRequest {
        let now = unix_nanos(SystemTime::now());
        let start = self.started;
        let mut hist: Vec<Instrument<&Histogram>> = vec![
            (
                sc::TIME_TO_FIRST_TOKEN,
                sc::SECONDS,
                "Time to the first output token, as the client received it.",
                vec![],
            ),
            (
                sc::TIME_PER_OUTPUT_TOKEN,
                sc::SECONDS,
                "Time per output token after the first, as the client received them.",
                vec![],
            ),
            (
                sc::REQUEST_DURATION,
                sc::SECONDS,
                "Request duration, arrival to the last byte handed to the client.",
                vec![],
            ),
            (
                sc::TOKEN_USAGE,
                sc::TOKENS,
                "Input and output tokens per request.",
                vec![],
            ),
            (
                sc::MAX_INTER_TOKEN_LATENCY,
                sc::SECONDS,
                "The longest gap between two output tokens of a request.",
                vec![],
            ),
        ];
        let mut sums: Vec<Instrument<u64>> = vec![
            (
                sc::REQUESTS,
                sc::REQUESTS_UNIT,
                "Finished requests by outcome and finish reason; outcome cancelled is abandonment.",
                vec![],
            ),
            (
                sc::SLO_REQUESTS,
                sc::REQUESTS_UNIT,
                "Requests judged against their route's SLO, by verdict.",
                vec![],
            ),
            (
                sc::SLO_VIOLATIONS,
                sc::REQUESTS_UNIT,
                "SLO violations by criterion (a request may violate several).",
                vec![],
            ),
            (
                sc::GOODPUT_OUTPUT_TOKENS,
                sc::TOKENS,
                "Output tokens of requests that met their SLO (goodput).",
                vec![],
            ),
        ];
        for (key, s) in &self.series {
            let base = self.base_attributes(key);
            let with = |extra: Vec<KeyValue>| {
                let mut a = base.clone();
                a.extend(extra);
                a
            };
            if s.ttft.count() > 0 {
                hist[0].3.push((base.clone(), &s.ttft));
            }
            if s.tpot.count() > 0 {
                hist[1].3.push((base.clone(), &s.tpot));
            }
            for (error, h) in &s.duration {
                let extra = error
                    .iter()
                    .map(|e| kv(sc::ERROR_TYPE, string(e)))
                    .collect();
                hist[2].3.push((with(extra), h));
            }
            if s.input_tokens.count() > 0 {
                hist[3].3.push((
                    with(vec![kv(sc::TOKEN_TYPE, string("input"))]),
                    &s.input_tokens,
                ));
            }
            if s.output_tokens.count() > 0 {
                hist[3].3.push((
                    with(vec![kv(sc::TOKEN_TYPE, string("output"))]),
                    &s.output_tokens,
                ));
            }
            if s.max_itl.count() > 0 {
                hist[4].3.push((base.clone(), &s.max_itl));
            }
            for ((outcome, reason), n) in &s.requests {
                let mut extra = vec![kv(sc::OUTCOME, string(outcome))];
                extra.extend(reason.map(|r| kv(sc::FINISH_REASON, string(r))));
                sums[0].3.push((with(extra), *n));
            }
            for (verdict, n) in &s.slo {
                sums[1]
                    .3
                    .push((with(vec![kv(sc::SLO_VERDICT, string(verdict))]), *n));
            }
            for (criterion, n) in &s.violations {
                sums[2]
                    .3
                    .push((with(vec![kv(sc::SLO_CRITERION, string(criterion))]), *n));
            }
            if s.slo.contains_key("good") {
                sums[3].3.push((base.clone(), s.good_output_tokens));
            }
        }
        let cumulative = AggregationTemporality::Cumulative as i32;
        let exponential = self.settings.histogram == HistogramAggregation::Exponential;
        let mut metrics: Vec<Metric> = Vec::new();
        for (name, unit, description, points) in hist {
            if points.is_empty() {
                continue;
            }
            let data = if exponential {
                metric::Data::ExponentialHistogram(ExponentialHistogram {
                    data_points: points
                        .into_iter()
                        .filter_map(|(a, h)| h.exponential_point(a, start, now))
                        .collect(),
                    aggregation_temporality: cumulative,
                })
            } else {
                metric::Data::Histogram(HistogramData {
                    data_points: points
                        .into_iter()
                        .filter_map(|(a, h)| h.explicit_point(a, start, now))
                        .collect(),
                    aggregation_temporality: cumulative,
                })
            };
            metrics.push(Metric {
                name: name.into(),
                description: description.into(),
                unit: unit.into(),
                data: Some(data),
                ..Default::default()
            });
        }
        for (name, unit, description, points) in sums {
            if points.is_empty() {
                continue;
            }
            metrics.push(Metric {
                name: name.into(),
                description: description.into(),
                unit: unit.into(),
                data: Some(metric::Data::Sum(Sum {
                    data_points: points
                        .into_iter()
                        .map(|(attributes, n)| NumberDataPoint {
                            attributes,
                            start_time_unix_nano: start,
                            time_unix_nano: now,
                            value: Some(
                                opentelemetry_proto::tonic::metrics::v1::number_data_point::Value::AsInt(
                                    n as i64,
                                ),
                            ),
                            ..Default::default()
                        })
                        .collect(),
                    aggregation_temporality: cumulative,
                    is_monotonic: true,
                })),
                ..Default::default()
            });
        }
        ExportMetricsServiceRequest {
            resource_metrics: vec![ResourceMetrics {
                resource: Some(self.resource.clone()),
                scope_metrics: vec![ScopeMetrics {
                    scope: Some(scope()),
                    metrics,
                    schema_url: sc::SCHEMA_URL.into(),
                }],
                schema_url: sc::SCHEMA_URL.into(),
            }],
        }
    }

    fn export_metrics(&self) -> Option<tokio::task::JoinHandle<()>> {
        let (endpoint, client) = self.metrics.as_ref()?;
        if self.series.is_empty() {
            return None;
        }
        let body = transport::encode(endpoint, self.metrics_request().encode_to_vec());
        let post = Self::post(
            &self.failing,
            &self.counters,
            client,
            endpoint,
            body,
            "metrics",
            0,
        );
        Some(tokio::spawn(post))
    }

    fn export_spans(&mut self) -> Option<tokio::task::JoinHandle<()>> {
        let (endpoint, client) = self.traces.as_ref()?;
        if self.pending.is_empty() {
            return None;
        }
        let n = self.pending.len().min(self.settings.max_export_batch_size);
        let spans: Vec<Span> = self.pending.drain(..n).collect();
        self.queued_spans.set(self.pending.len() as i64);
        let request = ExportTraceServiceRequest {
            resource_spans: vec![ResourceSpans {
                resource: Some(self.resource.clone()),
                scope_spans: vec![ScopeSpans {
                    scope: Some(scope()),
                    spans,
                    schema_url: sc::SCHEMA_URL.into(),
                }],
                schema_url: sc::SCHEMA_URL.into(),
            }],
        };
        let body = transport::encode(endpoint, request.encode_to_vec());
        let post = Self::post(
            &self.failing,
            &self.counters,
            client,
            endpoint,
            body,
            "traces",
            n as u64,
        );
        Some(tokio::spawn(post))
    }

    /// One export request; its result counted (and, for spans, what it carried counted as
    /// exported or dropped).
    fn post(
        failing: &Arc<Mutex<Option<Instant>>>,
        counters: &Arc<Counters>,
        client: &HttpClient,
        endpoint: &Endpoint,
        body: Bytes,
        signal: &'static str,
        spans: u64,
    ) -> impl std::future::Future<Output = ()> + Send + 'static {
        let client = client.clone();
        let endpoint = endpoint.clone();
        let counters = counters.clone();
        let failing = failing.clone();
        async move {
            let result = transport::post(&client, &endpoint, body).await;
            match result {
                Ok(()) => {
                    counters.exports.with_label_values(&[signal]).inc();
                    counters.spans_exported.inc_by(spans);
                    let was = failing.lock().unwrap_or_else(|p| p.into_inner()).take();
                    if was.is_some() {
                        tracing::info!(%endpoint, "OTLP export works again");
                    }
                }
                Err(e) => {
                    counters.errors.with_label_values(&[signal]).inc();
                    if spans > 0 {
                        counters
                            .dropped
                            .with_label_values(&["traces"])
                            .inc_by(spans);
                    }
                    let mut failing = failing.lock().unwrap_or_else(|p| p.into_inner());
                    let now = Instant::now();
                    if failing.is_none_or(|at| now.duration_since(at) >= FAILURE_LOG_EVERY) {
                        *failing = Some(now);
                        tracing::warn!(%endpoint, signal, error = %e, "OTLP export failed; spans of a failed export are dropped and counted, metrics go with the next export");
                    }
                }
            }
        }
    }

    /// The span of one request: from its arrival to its finish, the caller's span's child.
    fn span(
        &self,
        f: &Finished,
        trace_id: [u8; 16],
        operation: &'static str,
        provider: &'static str,
    ) -> Span {
        let r = &f.record;
        let start = unix_nanos(r.ts.0);
        let at_ms = |ms: f64| start + (ms * 1e6) as u64;
        let secs = |ms: f64| double(ms / 1e3);
        let mut a = vec![
            kv(sc::OPERATION_NAME, string(operation)),
            kv(sc::PROVIDER_NAME, string(provider)),
            kv(sc::SERVER_ADDRESS, string(&self.server_address)),
            kv(sc::SERVER_PORT, int(self.server_port)),
            kv(sc::HTTP_REQUEST_METHOD, string(r.method.as_str())),
            kv(sc::URL_PATH, string(&r.path)),
            kv(sc::ROUTE, string(&r.route)),
            kv(sc::OUTCOME, string(r.outcome)),
            kv(
                sc::REQUEST_STREAM,
                AnyValue {
                    value: Some(any_value::Value::BoolValue(f.stream)),
                },
            ),
            kv(sc::USAGE_OUTPUT_TOKENS, int(r.output_tokens as i64)),
            kv(sc::E2E, secs(r.e2e_ms)),
            kv(sc::IN_FLIGHT, int(r.in_flight)),
            kv(sc::IN_FLIGHT_TOTAL, int(r.in_flight_total)),
        ];
        let mut opt = |key: &'static str, value: Option<AnyValue>| {
            if let Some(v) = value {
                a.push(kv(key, v));
            }
        };
        opt(sc::REQUEST_MODEL, r.model.as_deref().map(string));
        opt(sc::RESPONSE_MODEL, f.response_model.as_deref().map(string));
        opt(
            sc::HTTP_RESPONSE_STATUS_CODE,
            r.status.map(|s| int(i64::from(s))),
        );
        opt(sc::ERROR_TYPE, error_type(r).map(|e| string(&e)));
        opt(sc::REASON, r.reason.map(string));
        opt(sc::REQUEST_ID, r.request_id.as_deref().map(string));
        opt(
            sc::USAGE_INPUT_TOKENS,
            r.prompt_tokens.map(|n| int(n as i64)),
        );
        opt(
            sc::USAGE_CACHE_READ_INPUT_TOKENS,
            r.cached_tokens.map(|n| int(n as i64)),
        );
        opt(
            sc::USAGE_REASONING_OUTPUT_TOKENS,
            r.reasoning_tokens.map(|n| int(n as i64)),
        );
        opt(
            sc::RESPONSE_FINISH_REASONS,
            r.finish_reason.map(|f| AnyValue {
                value: Some(any_value::Value::ArrayValue(ArrayValue {
                    values: vec![string(f)],
                })),
            }),
        );
        opt(sc::RESPONSE_TIME_TO_FIRST_CHUNK, r.ttfb_ms.map(secs));
        opt(sc::TTFT, r.ttft_ms.map(secs));
        opt(sc::TPOT, r.tpot_ms.map(secs));
        opt(sc::MAX_ITL, r.max_itl_ms.map(secs));
        opt(sc::SLO_VERDICT, r.slo.map(string));
        opt(
            sc::SLO_VIOLATED,
            (!r.violated.is_empty()).then(|| AnyValue {
                value: Some(any_value::Value::ArrayValue(ArrayValue {
                    values: r.violated.iter().map(|c| string(c)).collect(),
                })),
            }),
        );
        opt(sc::QUEUE, r.queue_ms.map(secs));
        opt(sc::QUEUE_SOURCE, r.queue_source.map(string));
        opt(sc::ENGINE_PREFILL, r.engine_prefill_ms.map(secs));
        opt(sc::ENGINE_DECODE, r.engine_decode_ms.map(secs));
        opt(sc::ENGINE_WAITING, r.engine_waiting.map(double));
        opt(sc::ENGINE_KV_USAGE, r.engine_kv_usage.map(double));
        let name = match &r.model {
            Some(model) => format!("{operation} {model}"),
            None => operation.to_string(),
        };
        let events = r
            .ttft_ms
            .map(|ms| span::Event {
                time_unix_nano: at_ms(ms),
                name: sc::FIRST_TOKEN_EVENT.into(),
                ..Default::default()
            })
            .into_iter()
            .collect();
        let status = if r.outcome == "error" {
            Status {
                code: status::StatusCode::Error as i32,
                message: error_type(r).unwrap_or_default(),
            }
        } else {
            Status::default()
        };
        // Bits 0-7: W3C trace flags (sampled); bit 8: whether the parent is remote is known;
        // bit 9: it is.
        let flags = 0x01 | 0x100 | if f.parent.is_some() { 0x200 } else { 0 };
        Span {
            trace_id: trace_id.to_vec(),
            span_id: random_span_id().to_vec(),
            trace_state: f.tracestate.as_deref().unwrap_or_default().to_string(),
            parent_span_id: f.parent.map(|p| p.span_id.to_vec()).unwrap_or_default(),
            flags,
            name,
            kind: span::SpanKind::Client as i32,
            start_time_unix_nano: start,
            end_time_unix_nano: at_ms(r.e2e_ms),
            attributes: a,
            events,
            status: Some(status),
            ..Default::default()
        }
    }
}

/// `gen_ai.operation.name` and `gen_ai.provider.name` from the request's path and the dialect
/// its response was read as. Self-hosted engines that speak OpenAI's API are `openai`, the API
/// they speak; the others are named by their own API.
pub(crate) fn operation_and_provider(
    path: &str,
    dialect: Option<Dialect>,
) -> (&'static str, &'static str) {
    let operation = if path.ends_with("/embeddings") {
        "embeddings"
    } else if path.ends_with("/chat/completions")
        || path.ends_with("/messages")
        || path.ends_with("/responses")
        || path.ends_with("/api/chat")
    {
        "chat"
    } else if path.ends_with("/completions")
        || path.ends_with("/completion")
        || path.ends_with("/generate")
        || path.ends_with("/generate_stream")
    {
        "text_completion"
    } else {
        match dialect {
            Some(
                Dialect::OpenAiCompletions | Dialect::Tgi | Dialect::LlamaCpp | Dialect::SgLang,
            ) => "text_completion",
            _ => "chat",
        }
    };
    let provider = match dialect {
        Some(Dialect::Anthropic) => "anthropic",
        Some(Dialect::Tgi) => "tgi",
        Some(Dialect::Ollama) => "ollama",
        Some(Dialect::LlamaCpp) => "llama.cpp",
        Some(Dialect::SgLang) => "sglang",
        _ if path.ends_with("/v1/messages") => "anthropic",
        _ if path.starts_with("/api/") => "ollama",
        _ => "openai",
    };
    (operation, provider)
}

/// `error.type` of a request that did not go well: why it ended (`upstream_idle`, ...), else
/// its status code, else its outcome. `None` for one that went well.
fn error_type(r: &Record) -> Option<String> {
    if r.outcome == "ok" {
        return None;
    }
    Some(match (r.reason, r.status) {
        (Some(reason), _) => reason.to_string(),
        (None, Some(status)) if status >= 400 => status.to_string(),
        _ => r.outcome.to_string(),
    })
}

/// Whether the sampler keeps a request that went well. The ratio samplers keep a trace when
/// the trace id's last 56 bits (its random part under W3C Trace Context level 2) fall below
/// the ratio, so every service of a trace that samples by ratio agrees.
fn sampled(sampler: Sampler, parent: Option<&TraceParent>, trace_id: &[u8; 16]) -> bool {
    let ratio = |r: f64| {
        let mut bits = [0u8; 8];
        bits[1..].copy_from_slice(&trace_id[9..]);
        let random = u64::from_be_bytes(bits);
        (random as f64) < r * (1u64 << 56) as f64
    };
    let root = |root: Root| match root {
        Root::AlwaysOn => true,
        Root::AlwaysOff => false,
        Root::TraceIdRatio(r) => ratio(r),
    };
    match sampler {
        Sampler::AlwaysOn => true,
        Sampler::AlwaysOff => false,
        Sampler::TraceIdRatio(r) => ratio(r),
        Sampler::ParentBased(r) => match parent {
            Some(p) => p.sampled,
            None => root(r),
        },
    }
}

fn scope() -> InstrumentationScope {
    InstrumentationScope {
        name: "tokenmeter".into(),
        version: env!("CARGO_PKG_VERSION").into(),
        ..Default::default()
    }
}

fn random_trace_id() -> [u8; 16] {
    let id = fastrand::u128(1..);
    id.to_be_bytes()
}

fn random_span_id() -> [u8; 8] {
    fastrand::u64(1..).to_be_bytes()
}

fn unix_nanos(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

fn kv(key: &str, value: AnyValue) -> KeyValue {
    KeyValue {
        key: key.into(),
        value: Some(value),
        ..Default::default()
    }
}

fn string(s: &str) -> AnyValue {
    AnyValue {
        value: Some(any_value::Value::StringValue(s.into())),
    }
}

fn int(n: i64) -> AnyValue {
    AnyValue {
        value: Some(any_value::Value::IntValue(n)),
    }
}

fn double(x: f64) -> AnyValue {
    AnyValue {
        value: Some(any_value::Value::DoubleValue(x)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operation_and_provider_follow_the_path_and_dialect() {
        assert_eq!(
            operation_and_provider("/v1/chat/completions", Some(Dialect::OpenAiChat)),
            ("chat", "openai")
        );
        assert_eq!(
            operation_and_provider("/v1/completions", None),
            ("text_completion", "openai")
        );
        assert_eq!(
            operation_and_provider("/v1/messages", None),
            ("chat", "anthropic")
        );
        assert_eq!(
            operation_and_provider("/generate_stream", Some(Dialect::Tgi)),
            ("text_completion", "tgi")
        );
        assert_eq!(
            operation_and_provider("/v1/embeddings", None),
            ("embeddings", "openai")
        );
    }

    #[test]
    fn response_models_on_metrics_stay_bounded() {
        let mut models = ResponseModels::default();
        let label: Arc<str> = Arc::from("other");
        // The request's own model takes the request's bounded label, however many there are.
        assert_eq!(
            models.label(Some("m-0"), Some("m-0"), &label).as_deref(),
            Some("other")
        );
        assert_eq!(models.label(None, Some("m-0"), &label), None);
        for i in 0..MAX_RESPONSE_MODELS {
            let name = format!("served-{i}");
            assert_eq!(
                models.label(Some(&name), Some("alias"), &label).as_deref(),
                Some(name.as_str())
            );
        }
        // Past the bound a new name is left off; the ones already named keep their points.
        assert_eq!(models.label(Some("one-more"), Some("alias"), &label), None);
        assert_eq!(
            models.label(Some("served-0"), None, &label).as_deref(),
            Some("served-0")
        );
        assert_eq!(models.0.len(), MAX_RESPONSE_MODELS);
    }

    #[test]
    fn the_ratio_keeps_its_share_and_the_parent_decides_when_there_is_one() {
        let kept = (0..10_000)
            .filter(|_| sampled(Sampler::TraceIdRatio(0.25), None, &random_trace_id()))
            .count();
        assert!((2_000..3_000).contains(&kept), "{kept}");
        let id = random_trace_id();
        assert!(!sampled(Sampler::TraceIdRatio(0.0), None, &id));
        assert!(sampled(Sampler::TraceIdRatio(1.0), None, &id));
        let parent = |sampled| TraceParent {
            trace_id: id,
            span_id: [1; 8],
            sampled,
        };
        let p = Sampler::ParentBased(Root::AlwaysOff);
        assert!(sampled(p, Some(&parent(true)), &id));
        assert!(!sampled(p, Some(&parent(false)), &id));
        assert!(!sampled(p, None, &id));
    }
}
