//! One request's measurement, from the complete request head to its single `finish`.
//!
//! A [`Recorder`] is created when the proxy has read a request head (`t_start`), learns the
//! response head, is shown every response frame as it is handed to the client, and finishes
//! exactly once, whatever ends the request: the body's end, an upstream failure, a generated
//! error response, or being dropped because the client went away. `finish` is the one place
//! where a request is published: figures computed, histograms observed, outcome counted and the
//! per-request record written. Definitions are those of `docs/MEASUREMENT.md`.

use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::{HeaderMap, Method, StatusCode};
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::access_log::{AccessLogSink, Record};
use crate::forward::Forwarder;
use crate::live::{self, GapSketch};
use crate::metrics::{InFlight, Metrics, RequestMetrics};
use crate::route::{Candidates, RouteInfo, Router};
use crate::slo::{self, Verdict};
use crate::stream::{self, Dialect, FrameEvents, Framing, StreamReader};

/// The longest `x-request-id` copied into the record; longer ones are cut.
const MAX_REQUEST_ID: usize = 128;

/// What every request of one configuration shares: its routes and where it publishes.
pub struct Shared {
    pub router: Router,
    pub metrics: Arc<Metrics>,
    pub access_log: Option<AccessLogSink>,
    /// The upstream client; a reload that keeps the upstream keeps its connection pool.
    pub forwarder: Arc<Forwarder>,
    /// The live view's windows: one per process, carried across reloads.
    pub live: Arc<crate::live::LiveStats>,
    /// Events larger than this are forwarded but not parsed.
    pub max_event_bytes: usize,
}

/// The request's `model`, decided by the request-body scanner as the body streams past:
/// found, or known to be absent. Route matching may wait for it.
#[derive(Default)]
pub struct ModelCell {
    value: OnceLock<Option<Box<str>>>,
    decided: Notify,
}

impl ModelCell {
    /// Records the model (`None`: the body named none); only the first call counts.
    pub fn decide(&self, model: Option<&str>) {
        if self.value.set(model.map(Into::into)).is_ok() {
            self.decided.notify_waiters();
        }
    }

    /// The model, if the body named one and it has been read.
    pub fn get(&self) -> Option<&str> {
        self.value.get().and_then(|m| m.as_deref())
    }

    pub fn is_decided(&self) -> bool {
        self.value.get().is_some()
    }

    /// Resolves once the model is decided.
    pub async fn decided(&self) {
        loop {
            let notified = self.decided.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.is_decided() {
                return;
            }
            notified.await;
        }
    }
}

pub type ModelSlot = Arc<ModelCell>;

/// How a request ended, as the proxy saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// The response body ended cleanly.
    Complete,
    /// The upstream connection broke mid-body.
    UpstreamBroken,
    /// The proxy answered itself (502, 504) because the upstream could not.
    Failed(StatusCode),
    /// The client went away first.
    Cancelled,
}

/// The outcome of a request, per `docs/MEASUREMENT.md`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Ok,
    Error,
    ClientError,
    Cancelled,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Error => "error",
            Outcome::ClientError => "client_error",
            Outcome::Cancelled => "cancelled",
        }
    }
}

/// The figures of one finished request; durations are from `t_start`.
#[derive(Debug, Clone, PartialEq)]
pub struct Figures {
    pub outcome: Outcome,
    pub ttfb: Option<Duration>,
    pub ttft: Option<Duration>,
    pub ttfc: Option<Duration>,
    pub tpot: Option<Duration>,
    pub max_itl: Option<Duration>,
    pub e2e: Duration,
    pub output_tokens: u64,
    pub tokens_from_usage: bool,
    pub prompt_tokens: Option<u64>,
}

/// One request in flight.
pub struct Recorder {
    shared: Arc<Shared>,
    /// The routes still possible after the head, until the route is decided.
    candidates: Candidates,
    route: Option<Arc<RouteInfo>>,
    t_start: Instant,
    wall_start: SystemTime,
    method: Method,
    path: Box<str>,
    request_id: Option<Box<str>>,
    model: ModelSlot,
    /// Taken when the route is decided, released at finish, so a stream counts as in flight
    /// until it ends.
    in_flight: Option<InFlight>,
    in_flight_at_start: i64,

    status: Option<StatusCode>,
    handles: Option<RequestMetrics>,
    reader: Option<StreamReader>,
    t_first_byte: Option<Instant>,
    t_first_token: Option<Instant>,
    t_first_content: Option<Instant>,
    t_last_token: Option<Instant>,
    max_itl: Option<Duration>,
    /// Every inter-token gap, for the live view's ITL percentiles; merged once at finish.
    itl: GapSketch,
    bytes: u64,
    finished: bool,
}

impl Recorder {
    /// Starts measuring a request whose head has just been read.
    pub fn start(
        shared: Arc<Shared>,
        method: &Method,
        uri: &http::Uri,
        headers: &HeaderMap,
    ) -> Self {
        let t_start = Instant::now();
        let candidates = shared.router.candidates(method, uri, headers);
        let request_id = headers
            .get("x-request-id")
            .and_then(|v| v.to_str().ok())
            .map(|v| {
                v.chars()
                    .take(MAX_REQUEST_ID)
                    .collect::<String>()
                    .into_boxed_str()
            });
        let mut recorder = Recorder {
            shared,
            candidates,
            route: None,
            t_start,
            wall_start: SystemTime::now(),
            method: method.clone(),
            // The query string is left out: it may carry keys or user data.
            path: uri.path().into(),
            request_id,
            model: ModelSlot::default(),
            in_flight: None,
            in_flight_at_start: 0,
            status: None,
            handles: None,
            reader: None,
            t_first_byte: None,
            t_first_token: None,
            t_first_content: None,
            t_last_token: None,
            max_itl: None,
            itl: GapSketch::default(),
            bytes: 0,
            finished: false,
        };
        if let Some(route) = recorder.shared.router.decided(&recorder.candidates) {
            recorder.take_route(route);
        }
        recorder
    }

    /// Whether the route still waits for the request's model.
    pub fn route_pending(&self) -> bool {
        self.route.is_none()
    }

    /// Decides the route from what is known now (the model, if read) unless already decided.
    pub fn resolve_route(&mut self) {
        if self.route.is_none() {
            let route = self
                .shared
                .router
                .with_model(&self.candidates, self.model.get());
            self.take_route(route);
        }
    }

    fn take_route(&mut self, route: Arc<RouteInfo>) {
        let in_flight = self.shared.metrics.in_flight(&route.name);
        self.in_flight_at_start = in_flight.current();
        self.in_flight = Some(in_flight);
        self.route = Some(route);
    }

    fn route(&mut self) -> Arc<RouteInfo> {
        self.resolve_route();
        self.route.clone().expect("resolve_route always decides")
    }

    /// Where the request-body scanner puts the model it finds.
    pub fn model_slot(&self) -> ModelSlot {
        self.model.clone()
    }

    /// The response head arrived: choose how to read the body and resolve the metric handles.
    pub fn on_head(&mut self, status: StatusCode, headers: &HeaderMap) {
        let pinned = self.route().dialect;
        self.status = Some(status);
        let header = |name| {
            headers
                .get(name)
                .and_then(|v: &http::HeaderValue| v.to_str().ok())
        };
        let (framing, dialect) = stream::detect(
            &self.path,
            header(http::header::CONTENT_TYPE),
            header(http::header::CONTENT_ENCODING),
            pinned,
        );
        if status.is_success() && framing != Framing::Opaque && dialect != Dialect::Unknown {
            self.reader = Some(StreamReader::new(
                framing,
                dialect,
                self.shared.max_event_bytes,
            ));
        }
        self.resolve_handles();
    }

    fn resolve_handles(&mut self) -> &RequestMetrics {
        if self.handles.is_none() {
            let route = self.route().name.clone();
            let handles = self.shared.metrics.request(route, self.model.get());
            self.handles = Some(handles);
        }
        self.handles.as_ref().expect("set above")
    }

    /// A data frame is being handed to the client at `now`.
    pub fn on_data(&mut self, data: &Bytes, now: Instant) {
        if data.is_empty() {
            return;
        }
        self.bytes += data.len() as u64;
        if self.t_first_byte.is_none() {
            self.t_first_byte = Some(now);
        }
        if let Some(reader) = self.reader.as_mut() {
            let events = reader.feed(data);
            self.account(events, now);
        }
    }

    /// Output-bearing events handed on at `now`: the first starts TTFT, each one after it is
    /// an inter-token gap. Events that reach the client in the same frame arrive together, so
    /// the gaps between them are zero.
    fn account(&mut self, events: FrameEvents, now: Instant) {
        if events.output_events == 0 {
            return;
        }
        let gap = match self.t_last_token {
            Some(last) => Some(now.saturating_duration_since(last)),
            None => {
                self.t_first_token = Some(now);
                None
            }
        };
        let zero_gaps = events.output_events - 1;
        if gap.is_some() || zero_gaps > 0 {
            if let Some(gap) = gap {
                self.itl.add(gap);
            }
            self.itl.add_zeros(zero_gaps);
            let itl = &self.resolve_handles().itl;
            if let Some(gap) = gap {
                itl.observe(gap.as_secs_f64());
            }
            for _ in 0..zero_gaps {
                itl.observe(0.0);
            }
            let largest = gap.unwrap_or(Duration::ZERO);
            self.max_itl = Some(self.max_itl.map_or(largest, |m| m.max(largest)));
        }
        self.t_last_token = Some(now);
        if events.content && self.t_first_content.is_none() {
            self.t_first_content = Some(now);
        }
    }

    /// Ends the request; only the first call counts.
    pub fn finish(&mut self, end: End, now: Instant) {
        if self.finished {
            return;
        }
        self.finished = true;
        self.in_flight = None;
        if let End::Failed(status) = end {
            self.status = Some(status);
        }
        if end == End::Complete {
            if let Some(reader) = self.reader.as_mut() {
                let events = reader.finish();
                self.account(events, now);
            }
        }
        let figures = self.figures(end, now);
        self.publish(&figures);
    }

    /// Computes the request's figures as `docs/MEASUREMENT.md` defines them.
    fn figures(&self, end: End, now: Instant) -> Figures {
        let since = |t: Option<Instant>| t.map(|t| t.saturating_duration_since(self.t_start));
        let summary = self.reader.as_ref().map(StreamReader::summary);
        let outcome = match (end, self.status) {
            (End::Cancelled, _) => Outcome::Cancelled,
            (End::Failed(_) | End::UpstreamBroken, _) => Outcome::Error,
            (End::Complete, Some(s))
                if s.is_server_error() || s == StatusCode::TOO_MANY_REQUESTS =>
            {
                Outcome::Error
            }
            (End::Complete, Some(s)) if s.is_client_error() => Outcome::ClientError,
            (End::Complete, _) => match summary {
                Some(s) if s.error => Outcome::Error,
                Some(s)
                    if self
                        .reader
                        .as_ref()
                        .is_some_and(StreamReader::expects_end_marker)
                        && !s.end_marker =>
                {
                    Outcome::Error
                }
                _ => Outcome::Ok,
            },
        };
        let usage_tokens = summary.and_then(|s| s.usage_output_tokens);
        let output_tokens = usage_tokens.unwrap_or_else(|| summary.map_or(0, |s| s.output_events));
        let tpot = match (self.t_first_token, self.t_last_token) {
            (Some(first), Some(last)) if output_tokens >= 2 => Some(
                last.saturating_duration_since(first)
                    / (output_tokens - 1).min(u32::MAX as u64) as u32,
            ),
            _ => None,
        };
        Figures {
            outcome,
            ttfb: since(self.t_first_byte),
            ttft: since(self.t_first_token),
            ttfc: since(self.t_first_content),
            tpot,
            max_itl: self.max_itl,
            e2e: now.saturating_duration_since(self.t_start),
            output_tokens,
            tokens_from_usage: usage_tokens.is_some(),
            prompt_tokens: summary.and_then(|s| s.usage_prompt_tokens),
        }
    }

    fn publish(&mut self, f: &Figures) {
        let shared = self.shared.clone();
        let finish_reason = self
            .reader
            .as_ref()
            .and_then(|r| r.summary().finish_reason)
            .map(|r| r.as_str());
        let h = self.resolve_handles();
        let secs = |d: Duration| d.as_secs_f64();
        if let Some(d) = f.ttfb {
            h.ttfb.observe(secs(d));
        }
        if let Some(d) = f.ttft {
            h.ttft.observe(secs(d));
        }
        if let Some(d) = f.ttfc {
            h.ttfc.observe(secs(d));
        }
        if let Some(d) = f.tpot {
            h.tpot.observe(secs(d));
        }
        h.duration.observe(secs(f.e2e));
        if f.ttft.is_some() || f.output_tokens > 0 {
            h.output_tokens.observe(f.output_tokens as f64);
        }
        h.output_tokens_total.inc_by(f.output_tokens);
        if let Some(p) = f.prompt_tokens {
            h.prompt_tokens_total.inc_by(p);
        }
        shared
            .metrics
            .count_request(&h.route, &h.model, f.outcome.as_str());
        if let Some(reason) = finish_reason {
            shared.metrics.count_finish_reason(&h.route, reason);
        }
        let verdict = self.route().slo.as_ref().map(|slo| slo::judge(slo, f));
        shared.live.record(
            self.t_start + f.e2e,
            &self.route().name,
            &live::Sample {
                outcome: f.outcome,
                verdict: verdict.as_ref(),
                prompt_tokens: f.prompt_tokens,
                output_tokens: f.output_tokens,
                ttft: f.ttft,
                tpot: f.tpot,
                e2e: f.e2e,
                itl: &self.itl,
            },
        );
        let h = self.resolve_handles();
        match &verdict {
            Some(Verdict::Good) => {
                h.slo_eligible.inc();
                h.slo_good.inc();
                h.slo_good_output_tokens.inc_by(f.output_tokens);
            }
            Some(Verdict::Violated(criteria)) => {
                h.slo_eligible.inc();
                for c in criteria {
                    shared.metrics.count_violation(&h.route, &h.model, *c);
                }
            }
            Some(Verdict::Excluded) | None => {}
        }
        if let Some(log) = &shared.access_log {
            log.send(self.record(f, finish_reason, verdict.as_ref()));
        }
    }

    fn record(
        &self,
        f: &Figures,
        finish_reason: Option<&'static str>,
        verdict: Option<&Verdict>,
    ) -> Record {
        let ms = |d: Duration| (d.as_secs_f64() * 1e6).round() / 1e3;
        Record {
            ts: humantime::format_rfc3339_millis(self.wall_start).to_string(),
            request_id: self.request_id.as_deref().map(str::to_owned),
            route: self
                .route
                .as_ref()
                .map_or_else(String::new, |r| r.name.to_string()),
            model: self.model.get().map(str::to_owned),
            method: self.method.to_string(),
            path: self.path.to_string(),
            status: self.status.map(|s| s.as_u16()),
            outcome: f.outcome.as_str(),
            slo: verdict.map(Verdict::as_str),
            violated: match verdict {
                Some(Verdict::Violated(criteria)) => criteria.iter().map(|c| c.as_str()).collect(),
                _ => Vec::new(),
            },
            finish_reason,
            prompt_tokens: f.prompt_tokens,
            output_tokens: f.output_tokens,
            token_source: if f.tokens_from_usage {
                "usage"
            } else {
                "events"
            },
            events: self.reader.as_ref().map_or(0, |r| r.summary().events),
            ttfb_ms: f.ttfb.map(ms),
            ttft_ms: f.ttft.map(ms),
            ttfc_ms: f.ttfc.map(ms),
            tpot_ms: f.tpot.map(ms),
            max_itl_ms: f.max_itl.map(ms),
            e2e_ms: ms(f.e2e),
            in_flight: self.in_flight_at_start,
            bytes: self.bytes,
        }
    }
}

impl Drop for Recorder {
    /// A request dropped before it finished was abandoned by its client.
    fn drop(&mut self) {
        if !self.finished {
            self.finish(End::Cancelled, Instant::now());
        }
    }
}
