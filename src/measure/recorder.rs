//! One request's measurement, from the complete request head to its single `finish`.
//!
//! A [`Recorder`] is created when the proxy has read a request head (`t_start`), learns the
//! response head, is shown every response frame as it is handed to the client, and finishes
//! exactly once, whatever ends the request: the body's end, an upstream failure, a generated
//! error response, or being dropped because the client went away. `finish` is the one place
//! where a request is published: figures computed, histograms observed, outcome counted and the
//! per-request record written. Definitions are those of `docs/MEASUREMENT.md`.
//!
//! The request's state lives in an `Option` that `finish` takes (as linkerd2-proxy's
//! `record_response.rs` does): after it, every call is a no-op, so nothing can touch a request
//! that has been published, the in-flight gauge included.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::{HeaderMap, Method, StatusCode};
use prometheus::local::LocalHistogram;
use tokio::time::Instant;

use super::engine_state::AtArrival;
use super::meter::Meter;
use super::model_slot::ModelSlot;
use crate::parse::{self, Dialect, EngineReport, FrameEvents, Framing, StreamReader};
use crate::policy::outcome::{End, Figures, Outcome};
use crate::policy::route::{Candidates, RouteInfo};
use crate::policy::slo::{self, Verdict};
use crate::publish::live::{self, GapSketch};
use crate::publish::metrics::{InFlight, RequestMetrics};
use crate::publish::otel::Finished;
use crate::publish::record::{Record, Timestamp};

/// How often a stream's inter-token gaps reach the shared ITL histogram while it goes on.
const ITL_FLUSH_EVERY: Duration = Duration::from_secs(1);
/// Inter-token gaps held before they are counted (see `Active::count_gaps`): as many as fill
/// [`PerEvent`]'s second cache line.
const GAPS_HELD: usize = 13;

/// The longest `x-request-id` copied into the record; longer ones are cut.
const MAX_REQUEST_ID: usize = 128;
/// The longest `tracestate` carried to a span; a longer one is left out (W3C Trace Context
/// asks that at least 512 characters be propagated).
const MAX_TRACESTATE: usize = 1024;

/// One request, from its head to its single `finish`.
pub struct Recorder {
    /// Where the request-body scanner puts the model; shared with the body, so it outlives
    /// the state.
    model: ModelSlot,
    /// `None` once finished. On the heap: the state is most of a response body's size, and a
    /// body is moved several times on its way to the connection (into the service's future,
    /// the response, the connection's box); a pointer moves instead of the state, each time.
    state: Option<Box<Active>>,
}

/// A request that has not finished yet.
struct Active {
    meter: Arc<Meter>,
    /// The routes still possible after the head, until the route is decided.
    candidates: Candidates,
    route: Option<Arc<RouteInfo>>,
    wall_start: SystemTime,
    method: Method,
    path: Box<str>,
    request_id: Option<Box<str>>,
    model: ModelSlot,
    /// Taken when the route is decided, released at finish, so a stream counts as in flight
    /// until it ends.
    in_flight: Option<InFlight>,
    in_flight_at_start: i64,
    /// The route's in-flight level as the request finished, itself included, for the live view.
    in_flight_at_finish: Option<i64>,

    status: Option<StatusCode>,
    handles: Option<Arc<RequestMetrics>>,
    /// The request's model may take a label of its own: the upstream answered with success.
    admit: bool,
    /// Boxed when the response head says what to read: inline, the reader would be most of the
    /// request's state, all of it copied into its box when the request starts, before it is
    /// sent upstream.
    reader: Option<Box<StreamReader>>,
    /// What the response head said to read the body as, until the reader is made: at the
    /// first frame, which is read after its write, or at finish: made at the head, the reader
    /// would be written (and copied) on the first token's way to the client.
    to_read: Option<(Framing, Dialect)>,
    /// What every frame reads or writes, together (see [`PerEvent`]).
    ev: PerEvent,
    /// Every inter-token gap, for the live view's ITL percentiles; merged once at finish.
    itl: GapSketch,
    /// The gaps for the ITL histogram, counted here without touching the shared family's
    /// atomics per event; flushed into it at most once a second and at finish, so a long
    /// stream's stutter still shows before it ends.
    itl_local: Option<LocalHistogram>,
    /// Keeps the request counted in the whole process's in-flight total until it finishes.
    _total: TotalGuard,
    in_flight_total_at_start: i64,
    read: Read,
    upstream: Option<Upstreamed>,
    /// The engine's state when the request arrived, from its own metrics.
    engine_at_arrival: AtArrival,
    /// What the response head said of the engine's timing (TGI's `x-*-time` headers), when
    /// it said anything: boxed, as most servers say nothing there.
    head_report: Option<Box<EngineReport>>,
    /// The caller's trace context, read only when OpenTelemetry export is on.
    caller: Option<Box<CallerTrace>>,
}

/// The caller's W3C trace context, for the request's span.
struct CallerTrace {
    parent: Option<parse::TraceParent>,
    tracestate: Option<Box<str>>,
}

impl CallerTrace {
    /// `None` when the caller sent no valid `traceparent`: a `tracestate` alone means nothing.
    fn read(headers: &HeaderMap) -> Option<Box<CallerTrace>> {
        const TRACEPARENT: http::HeaderName = http::HeaderName::from_static("traceparent");
        const TRACESTATE: http::HeaderName = http::HeaderName::from_static("tracestate");
        let parent = parse::traceparent(headers.get(TRACEPARENT)?.as_bytes())?;
        // Several `tracestate` fields are one list (W3C Trace Context, 3.3.1.1).
        let mut state = String::new();
        for value in headers.get_all(TRACESTATE) {
            let Ok(v) = value.to_str() else { continue };
            if !state.is_empty() {
                state.push(',');
            }
            state.push_str(v.trim());
        }
        let tracestate =
            (!state.is_empty() && state.len() <= MAX_TRACESTATE).then(|| state.into_boxed_str());
        Some(Box::new(CallerTrace {
            parent: Some(parent),
            tracestate,
        }))
    }
}

/// What every frame of a response reads or writes, kept together in two cache lines (a size
/// test holds it there): the rest of a request's state is touched at its start and finish, and
/// a frame's wake-up finds little of it in cache (other streams' frames come between tokens). Moments
/// are nanoseconds since the request started (`origin`), [`NOT_YET`] until they happen; gaps
/// are held as nanoseconds in 32 bits (a longer one is counted at once).
#[derive(Debug)]
#[repr(C, align(64))]
struct PerEvent {
    /// When the request's head was read: `t_start` in `docs/MEASUREMENT.md`.
    origin: Instant,
    bytes: u64,
    first_byte: u64,
    first_token: u64,
    first_content: u64,
    last_token: u64,
    max_itl: u64,
    /// When the ITL counts are next flushed into the shared family (at the first gap after).
    itl_flush_at: u64,
    /// Gaps not yet counted into `itl` and `itl_local`, and how many.
    gaps_held: u32,
    gaps: [u32; GAPS_HELD],
}

/// A moment (or the largest gap) not seen yet.
const NOT_YET: u64 = u64::MAX;

impl PerEvent {
    fn new(origin: Instant) -> PerEvent {
        PerEvent {
            origin,
            bytes: 0,
            first_byte: NOT_YET,
            first_token: NOT_YET,
            first_content: NOT_YET,
            last_token: NOT_YET,
            max_itl: NOT_YET,
            itl_flush_at: ITL_FLUSH_EVERY.as_nanos() as u64,
            gaps_held: 0,
            gaps: [0; GAPS_HELD],
        }
    }

    /// `now` as nanoseconds since the start (584 years fit).
    fn at(&self, now: Instant) -> u64 {
        (now.saturating_duration_since(self.origin).as_nanos() as u64).min(NOT_YET - 1)
    }

    /// A moment's time since the start, if it happened.
    fn since(t: u64) -> Option<Duration> {
        (t != NOT_YET).then(|| Duration::from_nanos(t))
    }
}

/// How the response body was read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Read {
    /// No response body reached the proxy (it answered itself, or nothing came).
    None,
    /// Read event by event.
    Parsed,
    /// Compressed (`Content-Encoding` other than identity): forwarded untouched, not read.
    Encoded,
    /// A framing or dialect the reader does not know: measured by bytes only.
    Opaque,
}

impl Read {
    fn as_str(self) -> &'static str {
        match self {
            Read::None => "none",
            Read::Parsed => "parsed",
            Read::Encoded => "encoded",
            Read::Opaque => "opaque",
        }
    }
}

/// How the request reached the upstream, as the proxy tells the recorder.
#[derive(Debug, Clone, Copy)]
struct Upstreamed {
    reused: bool,
    connect: Option<Duration>,
    handed: Option<Instant>,
    retries: u8,
}

/// A request's place in the process-wide in-flight total.
struct TotalGuard(Arc<AtomicI64>);

impl Drop for TotalGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Recorder {
    /// Starts measuring a request whose head has just been read.
    pub fn start(meter: Arc<Meter>, method: &Method, uri: &http::Uri, headers: &HeaderMap) -> Self {
        let t_start = Instant::now();
        let candidates = meter.router.candidates(method, uri, headers);
        // A typed name: looking a header up by text parses the name on every call.
        const REQUEST_ID: http::HeaderName = http::HeaderName::from_static("x-request-id");
        let request_id = headers
            .get(REQUEST_ID)
            .and_then(|v| v.to_str().ok())
            .map(|v| {
                v.chars()
                    .take(MAX_REQUEST_ID)
                    .collect::<String>()
                    .into_boxed_str()
            });
        let model = ModelSlot::default();
        let in_flight_total_at_start = meter.in_flight_total.fetch_add(1, Ordering::Relaxed) + 1;
        let total = TotalGuard(meter.in_flight_total.clone());
        let engine_at_arrival = meter.engine.at(t_start);
        let caller = meter.otel.as_ref().and_then(|_| CallerTrace::read(headers));
        // Made in its box: built beside it and moved in, it would be copied twice on the
        // request's way upstream.
        let mut active = Box::new(Active {
            meter,
            candidates,
            route: None,
            wall_start: SystemTime::now(),
            method: method.clone(),
            // The query string is left out: it may carry keys or user data.
            path: uri.path().into(),
            request_id,
            model: model.clone(),
            in_flight: None,
            in_flight_at_start: 0,
            in_flight_at_finish: None,
            status: None,
            handles: None,
            admit: false,
            reader: None,
            to_read: None,
            ev: PerEvent::new(t_start),
            itl: GapSketch::default(),
            itl_local: None,
            _total: total,
            in_flight_total_at_start,
            read: Read::None,
            upstream: None,
            engine_at_arrival,
            head_report: None,
            caller,
        });
        if let Some(route) = active.meter.router.decided(&active.candidates) {
            active.take_route(route);
        }
        Recorder {
            model,
            state: Some(active),
        }
    }

    /// Whether the route still waits for the request's model.
    pub(crate) fn route_pending(&self) -> bool {
        self.state.as_ref().is_some_and(|s| s.route.is_none())
    }

    /// Decides the route from what is known now (the model, if read) unless already decided,
    /// and counts the request in flight on it.
    pub(crate) fn resolve_route(&mut self) {
        if let Some(state) = self.state.as_mut() {
            state.route();
        }
    }

    /// Where the request-body scanner puts the model it finds.
    pub(crate) fn model_slot(&self) -> ModelSlot {
        self.model.clone()
    }

    /// The response head arrived: choose how to read the body, and whether the request's model
    /// may take a label of its own.
    pub fn on_head(&mut self, status: StatusCode, headers: &HeaderMap) {
        if let Some(state) = self.state.as_mut() {
            state.on_head(status, headers);
        }
    }

    /// The response's status arrived, its fields to be read later with [`Recorder::on_head`]
    /// (after the head's write: [`crate::measure::TimedBody::read_after_writes`]). Until then the
    /// request has its status, so a client gone before the write is recorded with it.
    pub fn on_status(&mut self, status: StatusCode) {
        if let Some(state) = self.state.as_mut() {
            state.on_status(status);
        }
    }

    /// How the request reached the upstream: over a reused connection or a new one (and how
    /// long connecting took), when it was handed to that connection, and after how many retries.
    pub(crate) fn on_upstream(
        &mut self,
        reused: bool,
        connect: Option<Duration>,
        handed: Option<Instant>,
        retries: u8,
    ) {
        if let Some(state) = self.state.as_mut() {
            state.upstream = Some(Upstreamed {
                reused,
                connect,
                handed,
                retries,
            });
        }
    }

    /// A data frame is being handed to the client at `now`.
    #[inline]
    pub fn on_data(&mut self, data: &Bytes, now: Instant) {
        if let Some(state) = self.state.as_mut() {
            state.on_data(data, now);
        }
    }

    /// Ends the request and publishes it; only the first call counts.
    pub(crate) fn finish(&mut self, end: End, now: Instant) {
        if let Some(state) = self.state.take() {
            state.finish(end, now);
        }
    }

    /// Whether the request has been published.
    #[cfg(test)]
    pub(crate) fn is_finished(&self) -> bool {
        self.state.is_none()
    }
}

impl Drop for Recorder {
    /// A request dropped before it finished was abandoned by its client.
    fn drop(&mut self) {
        self.finish(End::CLIENT_GONE, Instant::now());
    }
}

impl Active {
    fn take_route(&mut self, route: Arc<RouteInfo>) {
        let in_flight = self.meter.in_flight(&route);
        self.in_flight_at_start = in_flight.current();
        self.in_flight = Some(in_flight);
        self.route = Some(route);
    }

    /// The request's route, decided now from what is known if it was still pending.
    fn route(&mut self) -> Arc<RouteInfo> {
        if let Some(route) = &self.route {
            return route.clone();
        }
        let route = self
            .meter
            .router
            .with_model(&self.candidates, self.model.get());
        self.take_route(route.clone());
        route
    }

    /// The status, and with it whether the request's model may take a label of its own: only
    /// a model the upstream answered with success gets one, so names from requests it refused
    /// (a typo, junk) never take a slot.
    fn on_status(&mut self, status: StatusCode) {
        self.status = Some(status);
        self.admit = status.is_success();
    }

    fn on_head(&mut self, status: StatusCode, headers: &HeaderMap) {
        let pinned = self.route().dialect;
        self.on_status(status);
        let header = |name| {
            headers
                .get(name)
                .and_then(|v: &http::HeaderValue| v.to_str().ok())
        };
        let report = parse::engine_headers(
            headers
                .iter()
                .map(|(name, value)| (name.as_str(), value.as_bytes())),
        );
        self.head_report = report.source.is_some().then(|| Box::new(report));
        let encoding = header(http::header::CONTENT_ENCODING);
        let (framing, dialect) = parse::detect(
            &self.path,
            header(http::header::CONTENT_TYPE),
            encoding,
            pinned,
        );
        if status.is_success() && framing != Framing::Opaque && dialect != Dialect::Unknown {
            self.to_read = Some((framing, dialect));
            self.read = Read::Parsed;
        } else if encoding.is_some_and(|e| !e.trim().eq_ignore_ascii_case("identity")) {
            self.read = Read::Encoded;
        } else {
            self.read = Read::Opaque;
        }
    }

    /// The metric handles, resolved once, when first needed: at the first inter-token gap or
    /// at finish, not on the way to the first token (two locks and two hash lookups there).
    fn resolve_handles(&mut self) -> &RequestMetrics {
        if self.handles.is_none() {
            let route = self.route().name.clone();
            let handles = self
                .meter
                .metrics
                .request(route, self.model.get(), self.admit);
            self.handles = Some(handles);
        }
        self.handles.as_ref().expect("set above")
    }

    #[inline]
    fn on_data(&mut self, data: &Bytes, now: Instant) {
        if data.is_empty() {
            return;
        }
        self.ev.bytes += data.len() as u64;
        let now = self.ev.at(now);
        if self.ev.first_byte == NOT_YET {
            self.ev.first_byte = now;
        }
        if let Some(reader) = self.reader() {
            let events = reader.feed(data);
            self.account(events, now);
        }
    }

    /// The body's reader, made now if the head named one and it is not made yet.
    #[inline]
    fn reader(&mut self) -> Option<&mut StreamReader> {
        if self.to_read.is_some() {
            self.make_reader();
        }
        self.reader.as_deref_mut()
    }

    #[cold]
    #[inline(never)]
    fn make_reader(&mut self) {
        if let Some((framing, dialect)) = self.to_read.take() {
            self.reader = Some(Box::new(StreamReader::new(
                framing,
                dialect,
                self.meter.max_event_bytes,
            )));
        }
    }

    /// Output-bearing events handed on at `now` (nanoseconds since the start): the first starts
    /// TTFT, each one after it is an inter-token gap. Events that reach the client in the same
    /// frame arrive together, so the gaps between them are zero.
    fn account(&mut self, events: FrameEvents, now: u64) {
        if events.output_events == 0 {
            return;
        }
        let gap = match self.ev.last_token {
            NOT_YET => {
                self.ev.first_token = now;
                None
            }
            last => Some(now.saturating_sub(last)),
        };
        let zero_gaps = events.output_events - 1;
        if gap.is_some() || zero_gaps > 0 {
            if let Some(gap) = gap {
                self.hold_gap(gap);
            }
            for _ in 0..zero_gaps {
                self.hold_gap(0);
            }
            if now >= self.ev.itl_flush_at {
                self.flush_gaps();
                self.ev.itl_flush_at = now + ITL_FLUSH_EVERY.as_nanos() as u64;
            }
            let largest = gap.unwrap_or(0);
            self.ev.max_itl = match self.ev.max_itl {
                NOT_YET => largest,
                max => max.max(largest),
            };
        }
        self.ev.last_token = now;
        if events.content && self.ev.first_content == NOT_YET {
            self.ev.first_content = now;
        }
    }

    /// Holds one inter-token gap (nanoseconds) until [`GAPS_HELD`] are here (or the ITL flush,
    /// or the finish); one too long to hold is counted at once.
    fn hold_gap(&mut self, gap: u64) {
        let Ok(gap) = u32::try_from(gap) else {
            self.count([Duration::from_nanos(gap)]);
            return;
        };
        if self.ev.gaps_held as usize == GAPS_HELD {
            self.count_gaps();
        }
        self.ev.gaps[self.ev.gaps_held as usize] = gap;
        self.ev.gaps_held += 1;
    }

    /// Counts the held gaps into the live view's sketch and the ITL histogram, together: their
    /// code and data are touched once for many events instead of once per event, when they
    /// are cold again (at 20 ms a token, the events of other streams come between).
    fn count_gaps(&mut self) {
        let held = self.ev.gaps_held as usize;
        if held == 0 {
            return;
        }
        let gaps = self.ev.gaps;
        self.count(
            gaps[..held]
                .iter()
                .map(|&nanos| Duration::from_nanos(u64::from(nanos))),
        );
        self.ev.gaps_held = 0;
    }

    /// Counts gaps into the live view's sketch and the ITL histogram.
    fn count(&mut self, gaps: impl IntoIterator<Item = Duration>) {
        let histogram = match self.itl_local.take() {
            Some(histogram) => histogram,
            None => self.resolve_handles().itl.local(),
        };
        for gap in gaps {
            let secs = gap.as_secs_f64();
            self.itl.add_secs(secs);
            histogram.observe(secs);
        }
        self.itl_local = Some(histogram);
    }

    /// Counts the held gaps and hands the ITL counts to the shared histogram.
    fn flush_gaps(&mut self) {
        self.count_gaps();
        if let Some(itl) = &self.itl_local {
            itl.flush();
        }
    }

    /// Publishes the request, consuming what is left of it. A route still pending is decided
    /// here without counting the request in flight: it is no longer in flight.
    fn finish(mut self: Box<Self>, end: End, now: Instant) {
        if self.route.is_none() {
            self.route = Some(
                self.meter
                    .router
                    .with_model(&self.candidates, self.model.get()),
            );
        }
        self.in_flight_at_finish = self.in_flight.as_ref().map(InFlight::current);
        drop(self.in_flight.take());
        if let End::Failed { status, .. } | End::Refused { status, .. } = end {
            self.status = Some(status);
        }
        // A body that sent nothing is still read as the head said: its reader tells what was
        // missing.
        let reader = self.reader();
        if end == End::Complete {
            if let Some(reader) = reader {
                let events = reader.finish();
                self.account(events, self.ev.at(now));
            }
        }
        let figures = self.figures(end, now);
        self.publish(&figures, end);
    }

    /// Computes the request's figures as `docs/MEASUREMENT.md` defines them.
    fn figures(&self, end: End, now: Instant) -> Figures {
        let summary = self.reader.as_ref().map(|r| r.summary());
        let outcome = match (end, self.status) {
            (End::Cancelled { .. }, _) => Outcome::Cancelled,
            (End::Failed { .. } | End::UpstreamBroken | End::UpstreamIdle, _) => Outcome::Error,
            (End::Refused { .. }, _) => Outcome::ClientError,
            (End::Complete, Some(s))
                if s.is_server_error() || s == StatusCode::TOO_MANY_REQUESTS =>
            {
                Outcome::Error
            }
            // 4xx, and a redirect (3xx): the request's own URL or content decided, not the
            // server's health; `ok` is 2xx only (docs/MEASUREMENT.md).
            (End::Complete, Some(s)) if !s.is_success() => Outcome::ClientError,
            (End::Complete, _) => match summary {
                Some(s) if s.error => Outcome::Error,
                Some(s)
                    if self.reader.as_ref().is_some_and(|r| r.expects_end_marker())
                        && !s.end_marker =>
                {
                    Outcome::Error
                }
                _ => Outcome::Ok,
            },
        };
        let usage_tokens = summary.and_then(|s| s.usage_output_tokens);
        let output_tokens = usage_tokens.unwrap_or_else(|| summary.map_or(0, |s| s.output_events));
        // With every token handed on at one instant (a non-streaming body) no time per token was
        // seen: TPOT is undefined, not zero (docs/MEASUREMENT.md).
        let tpot = match (self.ev.first_token, self.ev.last_token) {
            (first, last) if last != NOT_YET && output_tokens >= 2 && last > first => Some(
                Duration::from_nanos(last - first)
                    / (output_tokens - 1).min(u32::MAX as u64) as u32,
            ),
            _ => None,
        };
        Figures {
            outcome,
            ttfb: PerEvent::since(self.ev.first_byte),
            ttft: PerEvent::since(self.ev.first_token),
            ttfc: PerEvent::since(self.ev.first_content),
            tpot,
            max_itl: PerEvent::since(self.ev.max_itl),
            e2e: now.saturating_duration_since(self.ev.origin),
            output_tokens,
            tokens_from_usage: usage_tokens.is_some(),
            prompt_tokens: summary.and_then(|s| s.usage_prompt_tokens),
        }
    }

    fn publish(&mut self, f: &Figures, end: End) {
        let meter = self.meter.clone();
        let route = self.route();
        let finish_reason = self
            .reader
            .as_ref()
            .and_then(|r| r.summary().finish_reason)
            .map(|r| r.as_str());
        self.flush_gaps();
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
        h.count_outcome(f.outcome.as_str());
        if let Some(reason) = finish_reason {
            h.count_finish_reason(reason);
        }
        // A compressed stream was not read: zero tokens there say nothing, so it is not judged.
        let verdict = route.slo.as_ref().map(|slo| match self.read {
            Read::Encoded if f.outcome == Outcome::Ok => Verdict::Excluded,
            _ => slo::judge(slo, f),
        });
        meter.live.record(
            self.ev.origin + f.e2e,
            &route.name,
            &live::Sample {
                outcome: f.outcome,
                verdict: verdict.as_ref(),
                prompt_tokens: f.prompt_tokens,
                output_tokens: f.output_tokens,
                ttft: f.ttft,
                tpot: f.tpot,
                e2e: f.e2e,
                itl: &self.itl,
                model: &self.handles.as_ref().expect("resolved above").model,
                in_flight: self.in_flight_at_finish,
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
                    h.count_violation(*c);
                }
            }
            Some(Verdict::Excluded) | None => {}
        }
        match (&meter.access_log, &meter.otel) {
            (Some(log), None) => log.send(self.record(f, end, finish_reason, verdict.as_ref())),
            (log, Some(otel)) => {
                let record = self.record(f, end, finish_reason, verdict.as_ref());
                if let Some(log) = log {
                    log.send(record.clone());
                }
                otel.send(self.finished(record));
            }
            (None, None) => {}
        }
    }

    /// What OpenTelemetry export needs beyond the record. Called after the handles are
    /// resolved.
    fn finished(&mut self, record: Record) -> Finished {
        let caller = self.caller.take();
        Finished {
            record,
            model_label: self
                .handles
                .as_ref()
                .map_or_else(|| Arc::from(""), |h| h.model.clone()),
            parent: caller.as_ref().and_then(|c| c.parent),
            tracestate: caller.and_then(|c| c.tracestate),
            dialect: self.reader.as_ref().map(|r| r.dialect()),
            stream: self
                .reader
                .as_ref()
                .is_some_and(|r| matches!(r.framing(), Framing::Sse | Framing::Ndjson)),
            response_model: self
                .reader
                .as_ref()
                .and_then(|r| r.summary().response_model.clone()),
        }
    }

    fn record(
        &mut self,
        f: &Figures,
        end: End,
        finish_reason: Option<&'static str>,
        verdict: Option<&Verdict>,
    ) -> Record {
        let ms = |d: Duration| (d.as_secs_f64() * 1e6).round() / 1e3;
        let proxy_share = self
            .upstream
            .and_then(|u| u.handed)
            .map(|h| h.saturating_duration_since(self.ev.origin));
        let proxy_ms = proxy_share.map(ms);
        // The stream's own report first, then what the response head said.
        let engine = self
            .reader
            .as_ref()
            .map_or_else(EngineReport::default, |r| r.summary().engine)
            .or(self.head_report.as_deref().copied().unwrap_or_default());
        // Queue time: the engine's own when it reports one; else TTFT less the engine's prefill
        // (and model load, when it says), and the proxy's share, when all are known. Never
        // guessed otherwise.
        let (queue_ms, queue_source) = match (engine.queue, f.ttft, engine.prefill, proxy_share) {
            (Some(queue), ..) => (Some(ms(queue)), Some("engine")),
            (None, Some(ttft), Some(prefill), Some(share)) => (
                Some(ms(ttft
                    .saturating_sub(prefill)
                    .saturating_sub(engine.load.unwrap_or_default())
                    .saturating_sub(share))),
                Some("derived"),
            ),
            _ => (None, None),
        };
        Record {
            ts: Timestamp(self.wall_start),
            // Moved out: the request is published once and dropped right after.
            request_id: self.request_id.take(),
            route: self
                .route
                .as_ref()
                .map_or_else(|| Arc::from(""), |r| r.name.clone()),
            model: self.model.shared(),
            method: self.method.clone(),
            path: std::mem::take(&mut self.path),
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
            bytes: self.ev.bytes,
            in_flight_total: self.in_flight_total_at_start,
            reason: end.reason().or(match self.read {
                Read::Encoded => Some("encoded_stream"),
                _ => None,
            }),
            read: self.read.as_str(),
            retries: self.upstream.map_or(0, |u| u.retries),
            upstream_conn: self
                .upstream
                .map(|u| if u.reused { "reused" } else { "new" }),
            connect_ms: self.upstream.and_then(|u| u.connect).map(ms),
            proxy_ms,
            cached_tokens: engine.cached_tokens,
            cache_creation_tokens: engine.cache_creation_tokens,
            reasoning_tokens: engine.reasoning_tokens,
            engine_queue_ms: engine.queue.map(ms),
            engine_prefill_ms: engine.prefill.map(ms),
            engine_decode_ms: engine.decode.map(ms),
            engine_inference_ms: engine.inference.map(ms),
            engine_load_ms: engine.load.map(ms),
            engine_total_ms: engine.total.map(ms),
            engine_prompt_n: engine.prompt_processed,
            engine_source: engine.source.map(|e| e.as_str()),
            queue_ms,
            queue_source,
            engine_running: self.engine_at_arrival.running,
            engine_waiting: self.engine_at_arrival.waiting,
            engine_kv_usage: self.engine_at_arrival.kv_usage,
        }
    }
}

#[cfg(test)]
mod tests {
    //! The recorder alone, on paused time: one finish whatever ends a request, nothing after it.

    use std::time::Duration;

    use http::{HeaderMap, HeaderValue, Method, StatusCode, Uri};

    use super::*;
    use crate::config::Config;
    use crate::publish::record::{Record, RecordSink};

    /// A meter with `routes` (YAML), recording into a channel.
    fn meter(routes: &str) -> (Arc<Meter>, std::sync::mpsc::Receiver<Record>) {
        let config = Config::parse(routes, "test.yaml").expect("the test config is valid");
        let mut meter = Meter::detached(1 << 20);
        meter.router = crate::policy::route::Router::new(&config.routes);
        let (sink, records) = RecordSink::channel(8, meter.metrics.access_log_dropped.clone());
        meter.access_log = Some(sink);
        (Arc::new(meter), records)
    }

    fn start(meter: &Arc<Meter>) -> Recorder {
        let uri: Uri = "/v1/chat/completions".parse().unwrap();
        Recorder::start(meter.clone(), &Method::POST, &uri, &HeaderMap::new())
    }

    fn sse_head() -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(
            "content-type",
            HeaderValue::from_static("text/event-stream"),
        );
        headers
    }

    fn chunk(text: &str) -> Bytes {
        Bytes::from(format!(
            "data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{text}\"}}}}]}}\n\n"
        ))
    }

    /// Every `tokenmeter_requests_total` sample added up: how many times requests were published.
    fn requests_counted(meter: &Meter) -> u64 {
        String::from_utf8(meter.metrics.render())
            .unwrap()
            .lines()
            .filter(|l| l.starts_with("tokenmeter_requests_total{"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .sum()
    }

    fn gauge(meter: &Meter, route: &str) -> i64 {
        meter.metrics.in_flight_now(route)
    }

    const MODEL_ROUTE: &str = "routes:\n  - name: llama\n    match: {model: \"llama*\"}\n";

    /// Regression: a request finished while its route still waited for the model must not be
    /// counted in flight again by the finish itself (it used to raise the gauge after finishing).
    #[tokio::test(start_paused = true)]
    async fn finishing_with_the_route_pending_leaves_nothing_in_flight() {
        let (meter, records) = meter(MODEL_ROUTE);
        let mut recorder = start(&meter);
        assert!(recorder.route_pending());
        recorder.model_slot().decide(Some("llama-3"));
        recorder.finish(
            End::Failed {
                status: StatusCode::BAD_GATEWAY,
                reason: "upstream_failed",
            },
            Instant::now(),
        );
        assert_eq!(gauge(&meter, "llama"), 0);
        let record = records
            .recv_timeout(Duration::from_secs(5))
            .expect("one record");
        assert_eq!(&*record.route, "llama");
        assert_eq!(record.outcome, "error");
        assert_eq!(record.status, Some(502));
        drop(recorder);
        assert_eq!(gauge(&meter, "llama"), 0);
        assert_eq!(requests_counted(&meter), 1, "published once");
    }

    #[tokio::test(start_paused = true)]
    async fn a_decided_route_counts_in_flight_until_finish() {
        let (meter, records) = meter(MODEL_ROUTE);
        let mut recorder = start(&meter);
        recorder.model_slot().decide(Some("llama-3"));
        recorder.resolve_route();
        assert!(!recorder.route_pending());
        assert_eq!(gauge(&meter, "llama"), 1);
        recorder.on_head(StatusCode::OK, &sse_head());
        recorder.on_data(&chunk("a"), Instant::now());
        recorder.finish(End::Complete, Instant::now());
        assert_eq!(gauge(&meter, "llama"), 0);
        let record = records
            .recv_timeout(Duration::from_secs(5))
            .expect("one record");
        assert_eq!(record.in_flight, 1);
        assert_eq!(record.model.as_deref(), Some("llama-3"));
    }

    /// Nothing reaches a request after its finish: frames, heads and a second finish are ignored.
    #[tokio::test(start_paused = true)]
    async fn only_a_model_the_upstream_answered_takes_a_label() {
        // The handles are resolved after the response head (at the first gap or at finish),
        // with what the head said.
        let (meter, _records) = meter("");
        for (model, status) in [("typo", StatusCode::NOT_FOUND), ("llama-3", StatusCode::OK)] {
            let mut recorder = start(&meter);
            recorder.model_slot().decide(Some(model));
            recorder.on_head(status, &sse_head());
            recorder.on_data(&chunk("a"), Instant::now());
            tokio::time::advance(Duration::from_millis(20)).await;
            recorder.on_data(&chunk("b"), Instant::now());
            recorder.finish(End::Complete, Instant::now());
        }
        let text = String::from_utf8(meter.metrics.render()).unwrap();
        assert!(text.contains(r#"model="llama-3""#), "{text}");
        assert!(!text.contains(r#"model="typo""#), "{text}");
    }

    /// The ITL histogram's count and sum, all series added up.
    fn itl(meter: &Meter) -> (u64, f64) {
        let text = String::from_utf8(meter.metrics.render()).unwrap();
        let total = |name: &str| -> f64 {
            text.lines()
                .filter(|l| l.starts_with(name))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum()
        };
        (
            total("tokenmeter_inter_token_latency_seconds_count{") as u64,
            total("tokenmeter_inter_token_latency_seconds_sum{"),
        )
    }

    /// Gaps are held and counted in batches, yet every one reaches the ITL histogram (count and
    /// sum exact), a long stream's within a second of their time, a frame's zero gaps too.
    #[tokio::test(start_paused = true)]
    async fn every_gap_reaches_the_itl_histogram_a_long_streams_each_second() {
        let (meter, _records) = meter("");
        let mut recorder = start(&meter);
        recorder.model_slot().decide(Some("m"));
        recorder.on_head(StatusCode::OK, &sse_head());
        recorder.on_data(&chunk("a"), Instant::now());
        // 40 gaps of 10 ms, more than are held at once, all within the first second.
        for _ in 0..40 {
            tokio::time::advance(Duration::from_millis(10)).await;
            recorder.on_data(&chunk("b"), Instant::now());
        }
        assert_eq!(itl(&meter).0, 0, "not flushed within the first second");
        // A gap past the first second: everything so far shows.
        tokio::time::advance(Duration::from_millis(700)).await;
        recorder.on_data(&chunk("c"), Instant::now());
        let (count, sum) = itl(&meter);
        assert_eq!(count, 41);
        assert!((sum - 1.1).abs() < 1e-9, "{sum}");
        // One frame of three events: a 10 ms gap and two zero gaps, held until the finish.
        tokio::time::advance(Duration::from_millis(10)).await;
        let three = [chunk("d"), chunk("e"), chunk("f")].concat();
        recorder.on_data(&Bytes::from(three), Instant::now());
        assert_eq!(itl(&meter).0, 41);
        recorder.finish(End::Complete, Instant::now());
        let (count, sum) = itl(&meter);
        assert_eq!(count, 44);
        assert!((sum - 1.11).abs() < 1e-9, "{sum}");
    }

    /// What a frame touches of a request is two cache lines, no more.
    #[test]
    fn a_frames_fields_fill_two_cache_lines() {
        assert_eq!(std::mem::size_of::<PerEvent>(), 128);
        assert_eq!(std::mem::align_of::<PerEvent>(), 64);
    }

    /// Gaps are held as 32-bit nanoseconds; one longer than that (4.29 s) is counted whole, as
    /// is the largest gap.
    #[tokio::test(start_paused = true)]
    async fn a_gap_too_long_to_hold_is_counted_whole() {
        let (meter, records) = meter("");
        let mut recorder = start(&meter);
        recorder.model_slot().decide(Some("m"));
        recorder.on_head(StatusCode::OK, &sse_head());
        recorder.on_data(&chunk("a"), Instant::now());
        tokio::time::advance(Duration::from_millis(20)).await;
        recorder.on_data(&chunk("b"), Instant::now());
        tokio::time::advance(Duration::from_millis(6_500)).await;
        recorder.on_data(&chunk("c"), Instant::now());
        tokio::time::advance(Duration::from_millis(30)).await;
        recorder.on_data(&chunk("d"), Instant::now());
        recorder.finish(End::Complete, Instant::now());
        let (count, sum) = itl(&meter);
        assert_eq!(count, 3);
        assert!((sum - 6.55).abs() < 1e-9, "{sum}");
        let record = records
            .recv_timeout(Duration::from_secs(5))
            .expect("one record");
        assert_eq!(record.max_itl_ms, Some(6_500.0));
        assert_eq!(record.e2e_ms, 6_550.0);
    }

    #[tokio::test(start_paused = true)]
    async fn nothing_touches_a_finished_request() {
        let (meter, records) = meter("");
        let mut recorder = start(&meter);
        recorder.on_head(StatusCode::OK, &sse_head());
        tokio::time::advance(Duration::from_millis(100)).await;
        recorder.on_data(&chunk("a"), Instant::now());
        tokio::time::advance(Duration::from_millis(50)).await;
        recorder.finish(End::CLIENT_GONE, Instant::now());
        assert!(recorder.is_finished());
        tokio::time::advance(Duration::from_millis(50)).await;
        recorder.on_data(&chunk("b"), Instant::now());
        recorder.on_head(StatusCode::INTERNAL_SERVER_ERROR, &sse_head());
        recorder.finish(End::Complete, Instant::now());
        drop(recorder);
        let record = records
            .recv_timeout(Duration::from_secs(5))
            .expect("one record");
        assert_eq!(requests_counted(&meter), 1, "published once");
        assert_eq!(record.outcome, "cancelled");
        assert_eq!(record.status, Some(200));
        assert_eq!(record.output_tokens, 1);
        assert_eq!(record.ttft_ms, Some(100.0));
        assert_eq!(record.e2e_ms, 150.0);
        assert_eq!(gauge(&meter, "default"), 0);
        let metrics = String::from_utf8(meter.metrics.render()).unwrap();
        assert!(metrics.contains(
            "tokenmeter_requests_total{model=\"unknown\",outcome=\"cancelled\",route=\"default\"} 1"
        ));
    }

    /// A recorder dropped before its finish is the client going away: cancelled, once.
    #[tokio::test(start_paused = true)]
    async fn a_dropped_recorder_is_cancelled_once() {
        let (meter, records) = meter("");
        let mut recorder = start(&meter);
        assert_eq!(gauge(&meter, "default"), 1);
        tokio::time::advance(Duration::from_millis(30)).await;
        recorder.on_head(StatusCode::OK, &sse_head());
        drop(recorder);
        let record = records
            .recv_timeout(Duration::from_secs(5))
            .expect("one record");
        assert_eq!(requests_counted(&meter), 1, "published once");
        assert_eq!(record.outcome, "cancelled");
        assert_eq!(record.e2e_ms, 30.0);
        assert_eq!(record.ttft_ms, None);
        assert_eq!(gauge(&meter, "default"), 0);
    }

    /// TTFT, TPOT and the largest gap follow the frames' timestamps; two events in one frame are
    /// one zero gap.
    #[tokio::test(start_paused = true)]
    async fn figures_follow_the_frame_timestamps() {
        let (meter, records) = meter("");
        let mut recorder = start(&meter);
        recorder.on_head(StatusCode::OK, &sse_head());
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        recorder.on_data(&chunk("a"), at(200));
        recorder.on_data(&chunk("b"), at(260));
        recorder.on_data(&Bytes::from([chunk("c"), chunk("d")].concat()), at(300));
        recorder.on_data(&Bytes::from_static(b"data: [DONE]\n\n"), at(310));
        recorder.finish(End::Complete, at(320));
        let record = records
            .recv_timeout(Duration::from_secs(5))
            .expect("one record");
        assert_eq!(record.outcome, "ok");
        assert_eq!(record.ttft_ms, Some(200.0));
        assert_eq!(record.output_tokens, 4);
        // (300 - 200) / (4 - 1), rounded to the microsecond.
        assert_eq!(record.tpot_ms, Some(33.333));
        assert_eq!(record.max_itl_ms, Some(60.0));
        assert_eq!(record.e2e_ms, 320.0);
    }
}
