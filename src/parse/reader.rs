//! Reading a response body as it streams past, to learn which frames carried output.
//!
//! The proxy shows every data frame to a [`StreamReader`] by reference, after deciding once per
//! response how the body is framed ([`Framing`]) and which server dialect speaks in it
//! ([`Dialect`]), with [`detect`](fn@super::detect). When the path does not tell the dialect, the reader learns it
//! from the first events themselves ([`Dialect::Auto`]). The reader never sees a frame it could
//! change, keeps state across frames (an event may be split at any byte) and never panics,
//! whatever the bytes.
//!
//! Two layers, kept apart so that a new server API is a small unit: a *framer* cuts the bytes
//! into events (`sse`, `ndjson`, `json_body`) and knows nothing of what they mean; a *dialect*
//! (`dialect`) reads one event at a time and says whether it carried output, visible content,
//! an end marker, usage or an error, and writes what explains the figures (cache, reasoning, the
//! engine's own timing) into the summary's [`EngineReport`](super::EngineReport) when the event
//! carries any. This file owns the bookkeeping between the two: event
//! numbers, first output and content events, tokens per event, and what each frame carried.
//!
//! Memory per stream is bounded: the framers never hold more than `max_event_bytes` of one event
//! plus [`MAX_EVENT_TYPE_BYTES`](super::MAX_EVENT_TYPE_BYTES) of its SSE type, and the dialects keep a fixed-size state.
//!
//! The contract for what counts as output, visible content, an end marker, usage and an error is
//! `docs/MEASUREMENT.md`.

use super::dialect::{Interpreter, Verdict};
use super::event::{Dialect, EventSink, FinishReason, FrameEvents, Framing, StreamSummary};
use super::{json_body, ndjson, sse};

enum Framer {
    Sse(sse::SseFramer),
    Ndjson(ndjson::NdjsonFramer),
    Json(json_body::JsonBody),
    /// Opaque framing or an unknown dialect: nothing is read, so nothing is buffered.
    Off,
}

impl Framer {
    fn capacity(&self) -> usize {
        match self {
            Framer::Sse(f) => f.capacity(),
            Framer::Ndjson(f) => f.capacity(),
            Framer::Json(f) => f.capacity(),
            Framer::Off => 0,
        }
    }
}

/// Reads one response body, frame by frame, and keeps its [`StreamSummary`].
pub struct StreamReader {
    framing: Framing,
    framer: Framer,
    interpreter: Interpreter,
    summary: StreamSummary,
    finished: bool,
}

impl StreamReader {
    /// `dialect` may be [`Dialect::Auto`]: the first events decide it (see [`detect`](fn@super::detect)).
    ///
    /// `max_event_bytes`: an event (SSE event / NDJSON line / JSON body) larger than this is
    /// skipped for parsing (counted in `summary.oversized_events`), so the memory a stream holds
    /// stays bounded: see [`StreamReader::buffered_capacity`].
    pub fn new(framing: Framing, dialect: Dialect, max_event_bytes: usize) -> Self {
        let interpreter = Interpreter::new(dialect);
        // An unknown dialect gives no meaning to events, so cutting them out would be wasted work
        // on the hot path: the caller measures such a stream by bytes.
        let framer = match (framing, interpreter.is_off()) {
            (_, true) | (Framing::Opaque, _) => Framer::Off,
            (Framing::Sse, false) => Framer::Sse(sse::SseFramer::new(max_event_bytes)),
            (Framing::Ndjson, false) => Framer::Ndjson(ndjson::NdjsonFramer::new(max_event_bytes)),
            (Framing::Json, false) => Framer::Json(json_body::JsonBody::new(max_event_bytes)),
        };
        let interpreter = match framer {
            Framer::Off => Interpreter::new(Dialect::Unknown),
            _ => interpreter,
        };
        StreamReader {
            framing,
            framer,
            interpreter,
            summary: StreamSummary::default(),
            finished: false,
        }
    }

    /// Shows one body data frame, by reference. Returns what the events *completed* in this
    /// frame carried.
    pub fn feed(&mut self, data: &[u8]) -> FrameEvents {
        if self.finished {
            return FrameEvents::default();
        }
        let mut sink = Tally {
            interpreter: &mut self.interpreter,
            summary: &mut self.summary,
            frame: FrameEvents::default(),
        };
        match &mut self.framer {
            Framer::Sse(f) => f.feed(data, &mut sink),
            Framer::Ndjson(f) => f.feed(data, &mut sink),
            Framer::Json(f) => f.feed(data),
            Framer::Off => {}
        }
        let frame = sink.frame;
        self.stop_if_unknown();
        frame
    }

    /// The body ended cleanly. Flushes a final event that had no trailing blank line or newline
    /// (WHATWG discards such an event, but servers do omit the last blank line and the event is
    /// real), and for [`Framing::Json`] parses the whole body now. Returns what that carried.
    /// Calling it again does nothing. A dialect still undecided now stays unknown.
    pub fn finish(&mut self) -> FrameEvents {
        if self.finished {
            return FrameEvents::default();
        }
        self.finished = true;
        let mut sink = Tally {
            interpreter: &mut self.interpreter,
            summary: &mut self.summary,
            frame: FrameEvents::default(),
        };
        match &mut self.framer {
            Framer::Sse(f) => f.finish(&mut sink),
            Framer::Ndjson(f) => f.finish(&mut sink),
            Framer::Json(f) => {
                match f.body() {
                    json_body::Body::Empty => {}
                    json_body::Body::Oversized => sink.oversized(),
                    json_body::Body::Whole(body) => sink.body(body),
                }
                // A non-streaming body that arrived whole is complete, whatever it says.
                if !sink.interpreter.is_off() {
                    sink.summary.end_marker = true;
                }
            }
            Framer::Off => {}
        }
        let frame = sink.frame;
        if self.interpreter.is_sniffing() {
            // Nothing in the body told the dialect: it stays unknown, measured by bytes.
            self.interpreter = Interpreter::new(Dialect::Unknown);
            self.summary = StreamSummary::default();
            return FrameEvents::default();
        }
        self.stop_if_unknown();
        frame
    }

    /// What the stream said so far.
    pub fn summary(&self) -> &StreamSummary {
        &self.summary
    }

    /// How the body is framed, as its head said.
    pub fn framing(&self) -> Framing {
        self.framing
    }

    /// The dialect being read: the one given, or the one the first events showed; `Auto` while
    /// they have not shown it yet, `Unknown` once they could not.
    pub fn dialect(&self) -> Dialect {
        self.interpreter.dialect()
    }

    /// Whether a body that ends without the dialect's end marker was cut short: the dialect is
    /// known and the body is a stream (SSE or NDJSON). A stream whose dialect was never learned
    /// is judged by its bytes and expects nothing.
    pub fn expects_end_marker(&self) -> bool {
        self.dialect().is_known() && matches!(self.framing, Framing::Sse | Framing::Ndjson)
    }

    /// The bytes the reader holds in its buffers now (their capacities, not their lengths).
    /// Never more than `max_event_bytes + MAX_EVENT_TYPE_BYTES`.
    pub fn buffered_capacity(&self) -> usize {
        self.framer.capacity()
    }

    /// Once sniffing has given up, nothing more is read and the buffers are given back.
    fn stop_if_unknown(&mut self) {
        if self.interpreter.is_off() && !matches!(self.framer, Framer::Off) {
            self.framer = Framer::Off;
        }
    }
}

/// Numbers the events a framer hands over, asks the dialect about each and keeps the score.
struct Tally<'a> {
    interpreter: &'a mut Interpreter,
    summary: &'a mut StreamSummary,
    frame: FrameEvents,
}

impl Tally<'_> {
    /// A whole non-streaming body: one event.
    fn body(&mut self, body: &[u8]) {
        if self.interpreter.is_off() {
            return;
        }
        self.summary.events = self.summary.events.saturating_add(1);
        self.look_for_model(body);
        let verdict = self.interpreter.body(body, &mut self.summary.engine);
        self.after(verdict);
    }

    /// Reads the model the response names, until it is known or the first output event has
    /// passed: a stream that has not named its model by then never does (TGI's native API,
    /// SGLang's), and the events after it are the hot path.
    fn look_for_model(&mut self, data: &[u8]) {
        if self.summary.response_model.is_none() && self.summary.first_output_event.is_none() {
            self.summary.response_model = super::dialect::response_model(data);
        }
    }

    /// Applies a verdict, unless the event was the one that made sniffing give up: then the
    /// stream is unknown and claims nothing, not even the events counted so far.
    fn after(&mut self, verdict: Verdict) {
        if self.interpreter.is_off() {
            *self.summary = StreamSummary::default();
            self.frame = FrameEvents::default();
        } else {
            self.apply(verdict);
        }
    }

    fn apply(&mut self, verdict: Verdict) {
        let s = &mut *self.summary;
        let number = s.events;
        // Visible content is output too, whatever the dialect forgot to say.
        if verdict.output || verdict.content {
            s.output_events = s.output_events.saturating_add(1);
            s.first_output_event.get_or_insert(number);
            self.frame.output_events = self.frame.output_events.saturating_add(1);
            // An event with output carries at least one token, whatever a lagging count says.
            let tokens = verdict.tokens.unwrap_or(1).max(1);
            let narrow = u32::try_from(tokens).unwrap_or(u32::MAX);
            self.frame.tokens = self.frame.tokens.saturating_add(narrow);
            if verdict.tokens.is_some() {
                s.max_tokens_per_event =
                    Some(s.max_tokens_per_event.map_or(tokens, |m| m.max(tokens)));
            }
        }
        if verdict.content {
            s.first_content_event.get_or_insert(number);
            self.frame.content = true;
        }
        if verdict.end {
            s.end_marker = true;
        }
        if verdict.error {
            s.error = true;
            s.finish_reason = Some(FinishReason::Error);
        } else if let Some(reason) = verdict.finish {
            // An error says more about the request than any reason a later chunk gives.
            if s.finish_reason != Some(FinishReason::Error) {
                s.finish_reason = Some(reason);
            }
        }
        // Usage may be cumulative on every chunk (vLLM's continuous usage stats): the latest wins.
        if let Some(n) = verdict.usage_output_tokens {
            s.usage_output_tokens = Some(n);
        }
        if let Some(n) = verdict.usage_prompt_tokens {
            s.usage_prompt_tokens = Some(n);
        }
    }
}

impl EventSink for Tally<'_> {
    fn event(&mut self, event_type: &[u8], data: &[u8]) {
        if self.interpreter.is_off() {
            return;
        }
        self.summary.events = self.summary.events.saturating_add(1);
        self.look_for_model(data);
        let verdict = self
            .interpreter
            .event(event_type, data, &mut self.summary.engine);
        self.after(verdict);
    }

    fn oversized(&mut self) {
        if self.interpreter.is_off() {
            return;
        }
        // Still an event, so the numbers of the events after it stay those of the stream.
        self.summary.events = self.summary.events.saturating_add(1);
        self.summary.oversized_events = self.summary.oversized_events.saturating_add(1);
        self.interpreter.skipped();
        self.after(Verdict::default());
    }
}
