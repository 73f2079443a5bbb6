//! The Prometheus metric families tokenmeter publishes, and the per-request handles into them.
//!
//! Names, labels and units follow `docs/MEASUREMENT.md`. Every label value is bounded: routes
//! come from the configuration, models from [`ModelLabels`], outcomes and finish reasons from
//! fixed sets. A request resolves its handles once ([`Metrics::request`]); nothing on the
//! per-frame path looks up a label.
//!
//! The registry lives as long as the process. A configuration reload ([`Metrics::reconfigure`])
//! updates the SLO gauges and the model-label policy, and replaces the histogram families only
//! when the configured thresholds changed their buckets; counters carry on.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock, RwLock};
use std::time::Duration;
use std::time::SystemTime;

use prometheus::core::Collector;
use prometheus::{
    exponential_buckets, Encoder, Gauge, GaugeVec, Histogram, HistogramOpts, HistogramVec,
    IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry, TextEncoder,
};

use crate::config::{Config, Slo};
use crate::policy::slo::Criterion;

/// Label value for a request whose body named no model (or whose model came too late).
pub(crate) const UNKNOWN_MODEL: &str = "unknown";
/// Why a request was sent upstream again: the reused connection was closed before the request
/// was written, or after it was written but before any byte of the answer.
pub(crate) const UPSTREAM_RETRY_REASONS: [&str; 2] = ["not_sent", "closed"];
/// Resolved handles by (route, model label).
type HandleCache = HashMap<(Arc<str>, Arc<str>), Arc<RequestMetrics>>;

/// The outcomes a request is counted under.
const OUTCOMES: [&str; 4] = ["ok", "error", "client_error", "cancelled"];
/// The bounded set of finish reasons.
const FINISH_REASONS: [&str; 7] = [
    "stop",
    "length",
    "tool_calls",
    "content_filter",
    "refusal",
    "error",
    "other",
];
/// Label value for models past the label limit.
pub(crate) const OTHER_MODEL: &str = "other";

/// Time to first token/byte/content: interactive thresholds sit between 100 ms and 2 s.
const FIRST_TOKEN_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0,
    5.0, 7.5, 10.0, 15.0, 20.0, 30.0, 60.0, 120.0,
];
/// Per-token gaps: decode steps are milliseconds to tens of milliseconds; stalls are seconds.
const TOKEN_GAP_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.06, 0.075, 0.1,
    0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0,
];
/// Whole requests: from a short answer to a long generation.
const DURATION_BUCKETS: &[f64] = &[
    0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 8.0, 10.0, 15.0, 20.0, 30.0, 45.0, 60.0, 90.0, 120.0,
    180.0, 300.0, 600.0,
];

/// Every family, registered in one registry.
pub(crate) struct Metrics {
    registry: Registry,
    requests: IntCounterVec,
    histograms: RwLock<Arc<Histograms>>,
    output_tokens_total: IntCounterVec,
    prompt_tokens_total: IntCounterVec,
    finish_reasons: IntCounterVec,
    in_flight: IntGaugeVec,
    slo_eligible: IntCounterVec,
    slo_good: IntCounterVec,
    slo_violations: IntCounterVec,
    slo_good_output_tokens: IntCounterVec,
    slo_objective: GaugeVec,
    slo_threshold: GaugeVec,
    config_reloads: IntCounterVec,
    config_last_success: Gauge,
    /// Records that could not be written because the writer fell behind.
    pub(crate) access_log_dropped: IntCounter,
    /// Requests sent upstream again, by why.
    upstream_retries: IntCounterVec,
    /// Scrapes of the engine's own metrics, by result.
    engine_scrapes: IntCounterVec,
    models: RwLock<Arc<ModelLabels>>,
    /// Every (route, model label)'s handles, resolved once: a request takes a read lock and a
    /// hash lookup, not a dozen label lookups. Bounded by routes × labels; emptied when a
    /// reload rebuilds families or removes a model's series.
    handles: RwLock<HandleCache>,
}

/// The histogram families, whose buckets depend on the configured thresholds.
struct Histograms {
    /// The thresholds these buckets were built for, to tell whether a reload changes them.
    thresholds: [Vec<f64>; 3],
    ttfb: HistogramVec,
    ttft: HistogramVec,
    ttfc: HistogramVec,
    tpot: HistogramVec,
    itl: HistogramVec,
    duration: HistogramVec,
    output_tokens: HistogramVec,
}

impl Histograms {
    fn new(thresholds: [Vec<f64>; 3]) -> Histograms {
        let rm = &["route", "model"];
        let [ttft_t, gap_t, e2e_t] = &thresholds;
        let output_token_buckets =
            exponential_buckets(1.0, 2.0, 16).expect("token buckets are valid");
        Histograms {
            ttfb: histogram(
                "tokenmeter_time_to_first_byte_seconds",
                "From the complete request head to the first response body byte handed to the client.",
                FIRST_TOKEN_BUCKETS,
                ttft_t,
                rm,
            ),
            ttft: histogram(
                "tokenmeter_time_to_first_token_seconds",
                "From the complete request head to the first output-bearing event handed to the client.",
                FIRST_TOKEN_BUCKETS,
                ttft_t,
                rm,
            ),
            ttfc: histogram(
                "tokenmeter_time_to_first_content_seconds",
                "From the complete request head to the first event with visible content (not reasoning or tool arguments).",
                FIRST_TOKEN_BUCKETS,
                ttft_t,
                rm,
            ),
            tpot: histogram(
                "tokenmeter_time_per_output_token_seconds",
                "Per request: (last output event - first output event) / (output tokens - 1).",
                TOKEN_GAP_BUCKETS,
                gap_t,
                rm,
            ),
            itl: histogram(
                "tokenmeter_inter_token_latency_seconds",
                "Every gap between two consecutive output-bearing events, as handed to the client.",
                TOKEN_GAP_BUCKETS,
                gap_t,
                rm,
            ),
            duration: histogram(
                "tokenmeter_request_duration_seconds",
                "End-to-end: from the complete request head to the end of the response body.",
                DURATION_BUCKETS,
                e2e_t,
                rm,
            ),
            output_tokens: histogram(
                "tokenmeter_request_output_tokens",
                "Output tokens per request (from usage when the stream reports it, else output events).",
                &output_token_buckets,
                &[],
                rm,
            ),
            thresholds,
        }
    }

    fn collectors(&self) -> [&HistogramVec; 7] {
        [
            &self.ttfb,
            &self.ttft,
            &self.ttfc,
            &self.tpot,
            &self.itl,
            &self.duration,
            &self.output_tokens,
        ]
    }
}

/// One request's handles, resolved once when its route and model are known.
pub(crate) struct RequestMetrics {
    pub(crate) route: Arc<str>,
    pub(crate) model: Arc<str>,
    /// Per outcome, resolved on first use (only outcomes that happen get a series).
    outcomes: [OnceLock<IntCounter>; 4],
    /// Per failed criterion, resolved on first use.
    violations: [OnceLock<IntCounter>; 5],
    /// Per finish reason (labelled by route only), resolved on first use.
    finish_reasons: [OnceLock<IntCounter>; 7],
    requests_family: IntCounterVec,
    violations_family: IntCounterVec,
    finish_reasons_family: IntCounterVec,
    pub(crate) ttfb: Histogram,
    pub(crate) ttft: Histogram,
    pub(crate) ttfc: Histogram,
    pub(crate) tpot: Histogram,
    pub(crate) itl: Histogram,
    pub(crate) duration: Histogram,
    pub(crate) output_tokens: Histogram,
    pub(crate) output_tokens_total: IntCounter,
    pub(crate) prompt_tokens_total: IntCounter,
    pub(crate) slo_eligible: IntCounter,
    pub(crate) slo_good: IntCounter,
    pub(crate) slo_good_output_tokens: IntCounter,
}

impl RequestMetrics {
    /// Counts a finished request by its outcome.
    pub(crate) fn count_outcome(&self, outcome: &str) {
        let Some(index) = OUTCOMES.iter().position(|o| *o == outcome) else {
            return;
        };
        self.outcomes[index]
            .get_or_init(|| {
                self.requests_family
                    .with_label_values(&[&self.route, &self.model, outcome])
            })
            .inc();
    }

    /// Counts a failed SLO criterion.
    pub(crate) fn count_violation(&self, criterion: Criterion) {
        let index = Criterion::ALL
            .iter()
            .position(|c| *c == criterion)
            .unwrap_or(0);
        self.violations[index]
            .get_or_init(|| {
                self.violations_family.with_label_values(&[
                    &self.route,
                    &self.model,
                    criterion.as_str(),
                ])
            })
            .inc();
    }

    /// Counts a finish reason.
    pub(crate) fn count_finish_reason(&self, reason: &str) {
        let index = FINISH_REASONS.iter().position(|r| *r == reason);
        if let Some(cell) = index.and_then(|i| self.finish_reasons.get(i)) {
            cell.get_or_init(|| {
                self.finish_reasons_family
                    .with_label_values(&[&self.route, reason])
            })
            .inc();
        }
    }
}

/// The request's place in `tokenmeter_in_flight_requests`: it counts until dropped.
pub(crate) struct InFlight {
    gauge: IntGauge,
}

impl InFlight {
    /// Counts a request in `gauge` until dropped.
    pub(crate) fn new(gauge: IntGauge) -> InFlight {
        gauge.inc();
        InFlight { gauge }
    }

    /// The route's in-flight count, this request included.
    pub(crate) fn current(&self) -> i64 {
        self.gauge.get()
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.gauge.dec();
    }
}

fn histogram(
    name: &str,
    help: &str,
    buckets: &[f64],
    thresholds: &[f64],
    labels: &[&str],
) -> HistogramVec {
    let buckets = with_thresholds(buckets, thresholds);
    HistogramVec::new(HistogramOpts::new(name, help).buckets(buckets), labels)
        .expect("histogram definition is valid")
}

/// The standard buckets plus every configured threshold, exactly, so that the share of
/// requests within a threshold can be read from the buckets without interpolation.
pub(crate) fn with_thresholds(buckets: &[f64], thresholds: &[f64]) -> Vec<f64> {
    let mut all: Vec<f64> = buckets
        .iter()
        .chain(thresholds)
        .copied()
        .filter(|b| b.is_finite() && *b > 0.0)
        .collect();
    all.sort_by(f64::total_cmp);
    all.dedup();
    all
}

/// The configured thresholds that shape the buckets: TTFT (for the first-byte/token/content
/// histograms), per-token gaps (TPOT and max ITL) and E2E, each sorted, in seconds.
fn thresholds(config: &Config) -> [Vec<f64>; 3] {
    let pick = |f: &dyn Fn(&Slo) -> Vec<Option<Duration>>| {
        let mut v: Vec<f64> = config
            .routes
            .iter()
            .filter_map(|r| r.slo.as_ref())
            .flat_map(f)
            .flatten()
            .map(|d| d.as_secs_f64())
            .collect();
        v.sort_by(f64::total_cmp);
        v.dedup();
        v
    };
    [
        pick(&|s| vec![s.ttft]),
        pick(&|s| vec![s.tpot, s.max_itl]),
        pick(&|s| vec![s.e2e]),
    ]
}

fn counter(name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    IntCounterVec::new(Opts::new(name, help), labels).expect("counter definition is valid")
}

fn register(registry: &Registry, collector: impl Collector + Clone + 'static) {
    registry
        .register(Box::new(collector))
        .expect("metric names are unique");
}

impl Metrics {
    /// The registry, for families registered only when a feature starts (OpenTelemetry's).
    pub(crate) fn registry(&self) -> &Registry {
        &self.registry
    }

    /// Builds and registers every family for this configuration.
    pub(crate) fn new(config: &Config) -> Metrics {
        let rm = &["route", "model"];
        let m = Metrics {
            registry: Registry::new(),
            requests: counter(
                "tokenmeter_requests_total",
                "Finished requests by outcome (ok, error, client_error, cancelled).",
                &["route", "model", "outcome"],
            ),
            histograms: RwLock::new(Arc::new(Histograms::new(thresholds(config)))),
            output_tokens_total: counter(
                "tokenmeter_output_tokens_total",
                "Output tokens of finished requests.",
                rm,
            ),
            prompt_tokens_total: counter(
                "tokenmeter_prompt_tokens_total",
                "Prompt tokens of finished requests whose response reported usage.",
                rm,
            ),
            finish_reasons: counter(
                "tokenmeter_finish_reasons_total",
                "Why generation stopped, as the server reported it.",
                &["route", "reason"],
            ),
            in_flight: IntGaugeVec::new(
                Opts::new(
                    "tokenmeter_in_flight_requests",
                    "Requests whose response has not ended yet.",
                ),
                &["route"],
            )
            .expect("gauge definition is valid"),
            slo_eligible: counter(
                "tokenmeter_slo_eligible_requests_total",
                "Requests judged against their route's SLO (good + violated).",
                rm,
            ),
            slo_good: counter(
                "tokenmeter_slo_good_requests_total",
                "Requests that met every criterion of their route's SLO.",
                rm,
            ),
            slo_violations: counter(
                "tokenmeter_slo_violations_total",
                "Failed SLO criteria (ttft, tpot, e2e, max_itl, error); a request may fail several.",
                &["route", "model", "criterion"],
            ),
            slo_good_output_tokens: counter(
                "tokenmeter_slo_good_output_tokens_total",
                "Output tokens of requests that met their SLO (token goodput).",
                rm,
            ),
            slo_objective: GaugeVec::new(
                Opts::new(
                    "tokenmeter_slo_objective_ratio",
                    "The fraction of requests a route promises to be good.",
                ),
                &["route"],
            )
            .expect("gauge definition is valid"),
            slo_threshold: GaugeVec::new(
                Opts::new(
                    "tokenmeter_slo_threshold_seconds",
                    "A route's SLO threshold per criterion.",
                ),
                &["route", "criterion"],
            )
            .expect("gauge definition is valid"),
            config_reloads: counter(
                "tokenmeter_config_reloads_total",
                "Configuration reloads by result (success, error).",
                &["result"],
            ),
            config_last_success: Gauge::new(
                "tokenmeter_config_last_reload_success_timestamp_seconds",
                "When the running configuration was loaded (Unix time).",
            )
            .expect("gauge definition is valid"),
            access_log_dropped: IntCounter::new(
                "tokenmeter_access_log_dropped_total",
                "Per-request records dropped because the writer could not keep up or could not write them.",
            )
            .expect("counter definition is valid"),
            upstream_retries: counter(
                "tokenmeter_upstream_retries_total",
                "Requests sent upstream a second time because a reused connection closed before answering (reason: not_sent, closed).",
                &["reason"],
            ),
            engine_scrapes: counter(
                "tokenmeter_engine_metrics_scrapes_total",
                "Scrapes of the engine's own metrics (engine_metrics), by result (ok, connect, timeout, status, too_large, unknown_format).",
                &["result"],
            ),
            models: RwLock::new(Arc::new(ModelLabels::new(config))),
            handles: RwLock::new(HashMap::new()),
        };
        let build_info = IntGaugeVec::new(
            Opts::new(
                "tokenmeter_build_info",
                "The running tokenmeter's version; always 1.",
            ),
            &["version"],
        )
        .expect("gauge definition is valid");
        build_info
            .with_label_values(&[env!("CARGO_PKG_VERSION")])
            .set(1);
        let r = &m.registry;
        register(r, m.requests.clone());
        for h in m.histograms().collectors() {
            register(r, h.clone());
        }
        register(r, m.output_tokens_total.clone());
        register(r, m.prompt_tokens_total.clone());
        register(r, m.finish_reasons.clone());
        register(r, m.in_flight.clone());
        register(r, m.slo_eligible.clone());
        register(r, m.slo_good.clone());
        register(r, m.slo_violations.clone());
        register(r, m.slo_good_output_tokens.clone());
        register(r, m.slo_objective.clone());
        register(r, m.slo_threshold.clone());
        register(r, m.config_reloads.clone());
        register(r, m.config_last_success.clone());
        register(r, m.access_log_dropped.clone());
        register(r, m.upstream_retries.clone());
        register(r, m.engine_scrapes.clone());
        register(r, build_info);
        for reason in UPSTREAM_RETRY_REASONS {
            m.upstream_retries.with_label_values(&[reason]);
        }
        for result in ["success", "error"] {
            m.config_reloads.with_label_values(&[result]);
        }
        m.publish_config(config);
        #[cfg(target_os = "linux")]
        {
            // Process metrics are a convenience; a platform that cannot read them keeps serving.
            let _ = m.registry.register(Box::new(ProcessMetrics::default()));
        }
        m
    }

    fn histograms(&self) -> Arc<Histograms> {
        self.histograms
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Applies a reloaded configuration: SLO gauges, the model-label policy, and new histogram
    /// families when the thresholds moved (requests in flight finish into the old ones).
    pub(crate) fn reconfigure(&self, config: &Config) {
        let wanted = thresholds(config);
        let current = self.histograms();
        if current.thresholds != wanted {
            let next = Arc::new(Histograms::new(wanted));
            for (old, new) in current.collectors().into_iter().zip(next.collectors()) {
                let _ = self.registry.unregister(Box::new(old.clone()));
                register(&self.registry, new.clone());
            }
            *self.histograms.write().unwrap_or_else(|p| p.into_inner()) = next;
            self.forget_handles();
        }
        let models = ModelLabels::new(config);
        let mut current = self.models.write().unwrap_or_else(|p| p.into_inner());
        if !current.same_policy(&models) {
            // Names the old policy labelled keep their label if the new one allows them; the
            // series of the others are removed, so reloads never grow the series set.
            let dropped = models.inherit(&current);
            *current = Arc::new(models);
            drop(current);
            self.remove_models(&dropped);
            self.forget_handles();
        } else {
            drop(current);
        }
        self.publish_config(config);
    }

    /// Counts a reload attempt.
    pub(crate) fn count_reload(&self, ok: bool) {
        self.config_reloads
            .with_label_values(&[if ok { "success" } else { "error" }])
            .inc();
        if ok {
            self.mark_loaded();
        }
    }

    fn mark_loaded(&self) {
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default();
        self.config_last_success.set(now.as_secs_f64());
    }

    /// Sets the objective and threshold gauges from the configuration's routes.
    fn publish_config(&self, config: &Config) {
        self.mark_loaded();
        self.slo_objective.reset();
        self.slo_threshold.reset();
        for route in &config.routes {
            let Some(slo) = &route.slo else { continue };
            if let Some(objective) = slo.objective {
                self.slo_objective
                    .with_label_values(&[&route.name])
                    .set(objective);
            }
            for (criterion, threshold) in [
                (Criterion::Ttft, slo.ttft),
                (Criterion::Tpot, slo.tpot),
                (Criterion::E2e, slo.e2e),
                (Criterion::MaxItl, slo.max_itl),
            ] {
                if let Some(t) = threshold {
                    self.slo_threshold
                        .with_label_values(&[&route.name, criterion.as_str()])
                        .set(t.as_secs_f64());
                }
            }
        }
    }

    /// Counts a request in flight on its route until the returned guard is dropped.
    /// Drops the resolved handles, after a reload changed what they point to. Requests in
    /// flight keep theirs (counts into replaced families go unseen, as before).
    fn forget_handles(&self) {
        self.handles
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
    }

    /// Removes every series labelled with one of `models`.
    fn remove_models(&self, models: &[Arc<str>]) {
        if models.is_empty() {
            return;
        }
        fn remove<T: prometheus::core::MetricVecBuilder>(
            vec: &prometheus::core::MetricVec<T>,
            models: &[Arc<str>],
        ) {
            for family in vec.collect() {
                for metric in family.get_metric() {
                    let labels: std::collections::HashMap<&str, &str> = metric
                        .get_label()
                        .iter()
                        .map(|l| (l.name(), l.value()))
                        .collect();
                    if labels
                        .get("model")
                        .is_some_and(|m| models.iter().any(|d| **d == **m))
                    {
                        let _ = vec.remove(&labels);
                    }
                }
            }
        }
        for h in self.histograms().collectors() {
            remove(h, models);
        }
        for c in [
            &self.requests,
            &self.output_tokens_total,
            &self.prompt_tokens_total,
            &self.slo_eligible,
            &self.slo_good,
            &self.slo_violations,
            &self.slo_good_output_tokens,
        ] {
            remove(c, models);
        }
    }

    /// Counts a scrape of the engine's metrics by its result.
    pub(crate) fn count_engine_scrape(&self, result: &str) {
        self.engine_scrapes.with_label_values(&[result]).inc();
    }

    /// The retry counter for `reason` (one of [`UPSTREAM_RETRY_REASONS`]).
    pub(crate) fn upstream_retries(&self, reason: &str) -> IntCounter {
        self.upstream_retries.with_label_values(&[reason])
    }

    /// A route's series of `tokenmeter_in_flight_requests`, for resolving once per route.
    pub(crate) fn in_flight_gauge(&self, route: &str) -> IntGauge {
        self.in_flight.with_label_values(&[route])
    }

    /// The route's in-flight count now.
    pub(crate) fn in_flight_now(&self, route: &str) -> i64 {
        self.in_flight.with_label_values(&[route]).get()
    }

    /// Resolves one request's handles.
    /// A request's handles; `admit`: its model may take a new label.
    pub(crate) fn request(
        &self,
        route: Arc<str>,
        model: Option<&str>,
        admit: bool,
    ) -> Arc<RequestMetrics> {
        let model = self
            .models
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .label(model, admit);
        let key = (route, model);
        if let Some(handles) = self
            .handles
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&key)
        {
            return handles.clone();
        }
        let (route, model) = key;
        let h = self.histograms();
        let labels = [&*route, &*model];
        let handles = Arc::new(RequestMetrics {
            ttfb: h.ttfb.with_label_values(&labels),
            ttft: h.ttft.with_label_values(&labels),
            ttfc: h.ttfc.with_label_values(&labels),
            tpot: h.tpot.with_label_values(&labels),
            itl: h.itl.with_label_values(&labels),
            duration: h.duration.with_label_values(&labels),
            output_tokens: h.output_tokens.with_label_values(&labels),
            output_tokens_total: self.output_tokens_total.with_label_values(&labels),
            prompt_tokens_total: self.prompt_tokens_total.with_label_values(&labels),
            slo_eligible: self.slo_eligible.with_label_values(&labels),
            slo_good: self.slo_good.with_label_values(&labels),
            slo_good_output_tokens: self.slo_good_output_tokens.with_label_values(&labels),
            outcomes: Default::default(),
            violations: Default::default(),
            finish_reasons: Default::default(),
            requests_family: self.requests.clone(),
            violations_family: self.slo_violations.clone(),
            finish_reasons_family: self.finish_reasons.clone(),
            route: route.clone(),
            model: model.clone(),
        });
        self.handles
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert((route, model), handles.clone());
        handles
    }

    /// The Prometheus text exposition of every family.
    pub(crate) fn render(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(16 * 1024);
        // Encoding into a Vec cannot fail for well-formed families.
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut out);
        out
    }
}

/// Turns a client-chosen model name into a bounded label, so a client's typo cannot create
/// series forever: with `models` configured, those names get their own label; otherwise the
/// first `model_label_limit` distinct names do. Everything else is `other`.
pub(crate) struct ModelLabels {
    listed: Option<Vec<Arc<str>>>,
    limit: usize,
    seen: RwLock<Vec<Arc<str>>>,
    unknown: Arc<str>,
    other: Arc<str>,
}

impl ModelLabels {
    pub(crate) fn new(config: &Config) -> Self {
        ModelLabels {
            listed: config
                .models
                .as_ref()
                .map(|names| names.iter().map(|n| Arc::from(n.as_str())).collect()),
            limit: config.model_label_limit,
            seen: RwLock::new(Vec::new()),
            unknown: Arc::from(UNKNOWN_MODEL),
            other: Arc::from(OTHER_MODEL),
        }
    }

    fn same_policy(&self, other: &ModelLabels) -> bool {
        self.listed == other.listed && self.limit == other.limit
    }

    /// Takes over the names `old` admitted that this policy still allows (up to its limit);
    /// returns the names `old` labelled that this policy no longer does.
    fn inherit(&self, old: &ModelLabels) -> Vec<Arc<str>> {
        let old_names: Vec<Arc<str>> = match &old.listed {
            Some(listed) => listed.clone(),
            None => old.seen.read().unwrap_or_else(|p| p.into_inner()).clone(),
        };
        let mut dropped = Vec::new();
        let mut seen = self.seen.write().unwrap_or_else(|p| p.into_inner());
        for name in old_names {
            let kept = match &self.listed {
                Some(listed) => listed.contains(&name),
                None if seen.len() < self.limit => {
                    seen.push(name.clone());
                    true
                }
                None => false,
            };
            if !kept {
                dropped.push(name);
            }
        }
        dropped
    }

    /// The label for a request's model; called once per request. A name not seen before takes a
    /// slot only when `admit` (the upstream answered the request with success).
    pub(crate) fn label(&self, model: Option<&str>, admit: bool) -> Arc<str> {
        let Some(model) = model.filter(|m| !m.is_empty()) else {
            return self.unknown.clone();
        };
        if let Some(listed) = &self.listed {
            return listed
                .iter()
                .find(|l| ***l == *model)
                .cloned()
                .unwrap_or_else(|| self.other.clone());
        }
        if let Some(known) = self
            .seen
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .find(|s| ***s == *model)
        {
            return known.clone();
        }
        if !admit {
            return self.other.clone();
        }
        let mut seen = self.seen.write().unwrap_or_else(|p| p.into_inner());
        if let Some(known) = seen.iter().find(|s| ***s == *model) {
            return known.clone();
        }
        if !admit || seen.len() >= self.limit || model == OTHER_MODEL || model == UNKNOWN_MODEL {
            return self.other.clone();
        }
        let label: Arc<str> = Arc::from(model);
        seen.push(label.clone());
        label
    }
}

/// The standard `process_*` families, with `process_cpu_seconds_total` to the clock tick.
///
/// The `prometheus` crate's process collector divides the CPU ticks by the tick rate in
/// integers, so a sidecar that has used 0.9 s of CPU publishes 0, and a light one's CPU panel
/// stays flat for its first seconds of CPU. This wraps that collector, keeping its other
/// families (memory, file descriptors, threads, start time) exactly, and replaces the CPU value
/// with `utime + stime` from `/proc/self/stat` divided by the tick rate as a float. That sum
/// covers every thread the process ever had, exited ones included, so it never goes down (a
/// sum over `/proc/self/task/*/schedstat`, finer, would drop when a thread exits).
#[cfg(target_os = "linux")]
struct ProcessMetrics(prometheus::process_collector::ProcessCollector);

#[cfg(target_os = "linux")]
impl Default for ProcessMetrics {
    fn default() -> ProcessMetrics {
        ProcessMetrics(prometheus::process_collector::ProcessCollector::for_self())
    }
}

#[cfg(target_os = "linux")]
impl Collector for ProcessMetrics {
    fn desc(&self) -> Vec<&prometheus::core::Desc> {
        self.0.desc()
    }

    fn collect(&self) -> Vec<prometheus::proto::MetricFamily> {
        let mut families = self.0.collect();
        let seconds = process_cpu_seconds();
        for family in &mut families {
            if family.name() != "process_cpu_seconds_total" {
                continue;
            }
            match seconds {
                Some(seconds) => {
                    for metric in family.mut_metric() {
                        let mut counter = prometheus::proto::Counter::default();
                        counter.set_value(seconds);
                        metric.set_counter(counter);
                    }
                }
                // Unreadable here means unreadable for the inner collector too, which then
                // publishes no CPU family; never publish its whole seconds instead.
                None => family.set_metric(Vec::new()),
            }
        }
        families.retain(|f| !f.get_metric().is_empty());
        families
    }
}

/// CPU time (user + system) of the whole process so far, in seconds, to the clock tick.
#[cfg(target_os = "linux")]
fn process_cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let ticks = cpu_ticks(&stat)?;
    Some(ticks as f64 / clock_ticks_per_second() as f64)
}

/// `utime + stime` from a `/proc/PID/stat` line (fields 14 and 15, proc(5)). The command name,
/// field 2, is in parentheses and may itself hold spaces and parentheses, so the fields are
/// counted from the last `)`.
fn cpu_ticks(stat: &str) -> Option<u64> {
    let after_name = &stat[stat.rfind(')')? + 1..];
    // After the name, field 3 (state) comes first: field N is at index N - 3.
    let mut fields = after_name.split_whitespace().skip(14 - 3);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(utime + stime)
}

/// The unit of `/proc/PID/stat`'s times, `USER_HZ`: what `sysconf(_SC_CLK_TCK)` returns, which
/// glibc reads from the `AT_CLKTCK` entry the kernel puts in every process's auxiliary vector.
/// Read here from `/proc/self/auxv` (native-endian word pairs of key and value), so no `unsafe`
/// call is needed. Without it, 100: the `USER_HZ` of every architecture Linux builds for except
/// alpha.
#[cfg(target_os = "linux")]
fn clock_ticks_per_second() -> u64 {
    static TICKS: OnceLock<u64> = OnceLock::new();
    *TICKS.get_or_init(|| {
        std::fs::read("/proc/self/auxv")
            .ok()
            .and_then(|auxv| auxv_entry(&auxv, AT_CLKTCK))
            .filter(|&ticks| ticks > 0)
            .unwrap_or(100)
    })
}

/// The auxiliary vector's key for the clock tick (`<elf.h>`).
const AT_CLKTCK: u64 = 17;

/// The value of `key` in an auxiliary vector: pairs of native words, ended by a zero key.
fn auxv_entry(auxv: &[u8], key: u64) -> Option<u64> {
    const WORD: usize = std::mem::size_of::<usize>();
    let word = |bytes: &[u8]| -> Option<u64> {
        let bytes: [u8; WORD] = bytes.try_into().ok()?;
        u64::try_from(usize::from_ne_bytes(bytes)).ok()
    };
    for pair in auxv.chunks_exact(2 * WORD) {
        let k = word(&pair[..WORD])?;
        if k == 0 {
            return None;
        }
        if k == key {
            return word(&pair[WORD..]);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_ticks_are_read_after_the_command_name() {
        // A command name may hold spaces and parentheses; fields count from the last `)`.
        let line = "4242 (a (b) c) S 1 4242 4242 0 -1 4194560 1 0 0 0 37 5 0 0 20 0 9 0 100 0 0";
        assert_eq!(cpu_ticks(line), Some(42));
        assert_eq!(cpu_ticks("4242 (x) S 1 2"), None);
        assert_eq!(cpu_ticks("garbage"), None);
    }

    #[test]
    fn the_clock_tick_is_found_in_an_auxiliary_vector() {
        let mut auxv = Vec::new();
        for (k, v) in [(6usize, 4096usize), (17, 250), (0, 0)] {
            auxv.extend_from_slice(&k.to_ne_bytes());
            auxv.extend_from_slice(&v.to_ne_bytes());
        }
        assert_eq!(auxv_entry(&auxv, AT_CLKTCK), Some(250));
        assert_eq!(auxv_entry(&auxv, 99), None);
        assert_eq!(auxv_entry(&auxv[..3], AT_CLKTCK), None);
    }

    /// A light sidecar's CPU must show before it has used a whole second: the published value
    /// is the process's CPU time to the clock tick, not its whole seconds.
    #[cfg(target_os = "linux")]
    #[test]
    fn process_cpu_seconds_has_sub_second_precision() {
        let registry = Registry::new();
        registry
            .register(Box::new(ProcessMetrics::default()))
            .unwrap();
        let published = || {
            registry
                .gather()
                .iter()
                .find(|f| f.name() == "process_cpu_seconds_total")
                .map(|f| f.get_metric()[0].get_counter().get_value())
                .expect("process_cpu_seconds_total is published")
        };
        let start = published();
        let start_exact = process_cpu_seconds().unwrap();
        // Burn about 0.3 s of CPU on this thread, bounded by wall time on a loaded machine.
        let deadline = SystemTime::now() + Duration::from_secs(30);
        let mut x = 1u64;
        while process_cpu_seconds().unwrap() < start_exact + 0.3 && SystemTime::now() < deadline {
            for _ in 0..100_000 {
                x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
            }
        }
        let before = process_cpu_seconds().unwrap();
        let value = published();
        let after = process_cpu_seconds().unwrap();
        assert!(
            value - start > 0.2,
            "{start} s, then {value} s after 0.3 s of CPU"
        );
        // Not whole seconds: the value lies between two exact readings taken around it.
        assert!(
            (before..=after).contains(&value),
            "published {value} s, the process had used {before}..{after} s"
        );
    }

    #[test]
    fn model_labels_are_bounded() {
        let mut config = Config {
            model_label_limit: 2,
            ..Config::default()
        };
        let labels = ModelLabels::new(&config);
        assert_eq!(&*labels.label(Some("a"), true), "a");
        assert_eq!(&*labels.label(Some("b"), true), "b");
        assert_eq!(&*labels.label(Some("c"), true), "other");
        assert_eq!(&*labels.label(Some("a"), true), "a");
        assert_eq!(&*labels.label(None, true), "unknown");
        assert_eq!(&*labels.label(Some(""), true), "unknown");
        config.models = Some(vec!["x".into(), "y".into()]);
        let listed = ModelLabels::new(&config);
        assert_eq!(&*listed.label(Some("y"), true), "y");
        assert_eq!(&*listed.label(Some("a"), true), "other");
    }

    /// Model names from requests the upstream refused (a typo, junk) used to take every label
    /// slot until restart.
    #[test]
    fn only_answered_models_take_a_label() {
        let config = Config {
            model_label_limit: 2,
            ..Config::default()
        };
        let labels = ModelLabels::new(&config);
        for junk in ["j1", "j2", "j3"] {
            assert_eq!(&*labels.label(Some(junk), false), "other");
        }
        assert_eq!(&*labels.label(Some("a"), true), "a");
        assert_eq!(
            &*labels.label(Some("a"), false),
            "a",
            "a known name keeps its label"
        );
        assert_eq!(&*labels.label(Some("b"), true), "b");
        assert_eq!(&*labels.label(Some("c"), true), "other");
    }

    /// Reloads that change the label policy used to start a fresh table each time, so every
    /// reload could add a new set of model series.
    #[test]
    fn reloads_that_change_the_label_policy_do_not_grow_the_series() {
        let m = Metrics::new(&Config {
            model_label_limit: 4,
            ..Config::default()
        });
        let series = |m: &Metrics| {
            String::from_utf8(m.render())
                .unwrap()
                .lines()
                .filter(|l| l.starts_with("tokenmeter_requests_total{"))
                .count()
        };
        for round in 0..10 {
            let names: Vec<String> = (0..4).map(|i| format!("m{round}-{i}")).collect();
            m.reconfigure(&Config {
                models: Some(names.clone()),
                ..Config::default()
            });
            for name in &names {
                m.request(Arc::from("default"), Some(name), true)
                    .count_outcome("ok");
            }
            assert!(series(&m) <= 4, "round {round}: {} series", series(&m));
        }
        // Back to a limit: the last list's names keep their labels, the limit still holds.
        m.reconfigure(&Config {
            model_label_limit: 2,
            ..Config::default()
        });
        let text = String::from_utf8(m.render()).unwrap();
        assert!(series(&m) <= 2, "{text}");
        assert_eq!(
            &*m.request(Arc::from("default"), Some("m9-0"), true).model,
            "m9-0"
        );
        assert_eq!(
            &*m.request(Arc::from("default"), Some("new"), true).model,
            "other"
        );
    }

    #[test]
    fn a_reload_that_moves_thresholds_rebuilds_the_buckets_and_keeps_counters() {
        let one =
            Config::parse("routes:\n  - name: a\n    slo: {ttft: 333ms}\n", "t.yaml").unwrap();
        let two =
            Config::parse("routes:\n  - name: a\n    slo: {ttft: 444ms}\n", "t.yaml").unwrap();
        let m = Metrics::new(&one);
        m.request(Arc::from("a"), Some("x"), true)
            .count_outcome("ok");
        let old = m.request(Arc::from("a"), Some("x"), true);
        m.reconfigure(&two);
        // A request that started before the reload finishes into the old family, unseen.
        old.ttft.observe(0.1);
        m.request(Arc::from("a"), Some("x"), true).ttft.observe(0.4);
        let text = String::from_utf8(m.render()).unwrap();
        assert!(text.contains("le=\"0.444\""), "{text}");
        assert!(!text.contains("le=\"0.333\""), "{text}");
        assert!(text
            .contains("tokenmeter_time_to_first_token_seconds_count{model=\"x\",route=\"a\"} 1"));
        assert!(
            text.contains("tokenmeter_requests_total{model=\"x\",outcome=\"ok\",route=\"a\"} 1")
        );
        assert!(
            text.contains("tokenmeter_slo_threshold_seconds{criterion=\"ttft\",route=\"a\"} 0.444")
        );
        m.count_reload(false);
        let text = String::from_utf8(m.render()).unwrap();
        assert!(text.contains("tokenmeter_config_reloads_total{result=\"error\"} 1"));
    }

    #[test]
    fn configured_thresholds_are_bucket_bounds_exactly() {
        let config = Config::parse(
            "routes:\n  - name: a\n    slo: {ttft: 333ms, tpot: 37ms, e2e: 7s, max_itl: 2s, objective: 0.995}\n",
            "t.yaml",
        )
        .unwrap();
        let m = Metrics::new(&config);
        let r = m.request(Arc::from("a"), Some("x"), true);
        r.ttft.observe(0.333);
        r.tpot.observe(0.037);
        r.duration.observe(7.0);
        let text = String::from_utf8(m.render()).unwrap();
        for line in [
            "tokenmeter_time_to_first_token_seconds_bucket{model=\"x\",route=\"a\",le=\"0.333\"} 1",
            "tokenmeter_time_per_output_token_seconds_bucket{model=\"x\",route=\"a\",le=\"0.037\"} 1",
            "tokenmeter_inter_token_latency_seconds_bucket{model=\"x\",route=\"a\",le=\"2\"} 0",
            "tokenmeter_request_duration_seconds_bucket{model=\"x\",route=\"a\",le=\"7\"} 1",
            "tokenmeter_slo_objective_ratio{route=\"a\"} 0.995",
            "tokenmeter_slo_threshold_seconds{criterion=\"ttft\",route=\"a\"} 0.333",
            "tokenmeter_slo_threshold_seconds{criterion=\"max_itl\",route=\"a\"} 2",
        ] {
            assert!(text.contains(line), "missing {line}\n{text}");
        }
        assert_eq!(
            with_thresholds(&[0.1, 0.3], &[0.3, 0.2, f64::NAN]),
            vec![0.1, 0.2, 0.3]
        );
    }

    #[test]
    fn exposition_names_every_family() {
        let m = Metrics::new(&Config::default());
        let r = m.request(Arc::from("default"), Some("llama"), true);
        r.ttft.observe(0.2);
        m.request(Arc::from("default"), Some("llama"), true)
            .count_outcome("ok");
        let _g = InFlight::new(m.in_flight_gauge("default"));
        let text = String::from_utf8(m.render()).unwrap();
        for name in [
            "tokenmeter_requests_total{model=\"llama\",outcome=\"ok\",route=\"default\"} 1",
            "tokenmeter_time_to_first_token_seconds_bucket{model=\"llama\",route=\"default\",le=\"0.2\"} 1",
            "tokenmeter_in_flight_requests{route=\"default\"} 1",
            "tokenmeter_build_info{version=",
        ] {
            assert!(text.contains(name), "missing {name} in\n{text}");
        }
    }
}
