//! Reading a response body as it streams past, to learn which frames carried output.
//!
//! The proxy shows every data frame to a [`StreamReader`] by reference, after deciding once per
//! response how the body is framed ([`Framing`]) and which server dialect speaks in it
//! ([`Dialect`]), with [`detect`]. The reader never sees a frame it could change, keeps state
//! across frames (an event may be split at any byte) and never panics, whatever the bytes.
//!
//! Two layers, kept apart so that a new server API is a small unit: a *framer* cuts the bytes
//! into events (`sse`, `ndjson`, `json_body`) and knows nothing of what they mean; a *dialect*
//! (`dialect`) reads one event at a time and says whether it carried output, visible content,
//! an end marker, usage or an error. This file owns the bookkeeping between the two: event
//! numbers, first output and content events, and what each frame carried.
//!
//! The contract for what counts as output, visible content, an end marker, usage and an error is
//! `docs/MEASUREMENT.md`.

mod detect;
mod dialect;
mod json_body;
mod ndjson;
mod sse;

#[cfg(test)]
mod tests;

pub use detect::detect;

use dialect::{Interpreter, Verdict};

/// How a response body is cut into events.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Framing {
    /// `text/event-stream`, WHATWG rules.
    Sse,
    /// One JSON document per line (`application/x-ndjson`, `application/jsonl`).
    Ndjson,
    /// A single JSON document (non-streaming response).
    Json,
    /// Anything else: passed through, measured by bytes only.
    Opaque,
}

/// Which server API produced the events.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Dialect {
    /// OpenAI chat completions (`/v1/chat/completions`) and the many servers that copy it.
    OpenAiChat,
    /// OpenAI legacy completions (`/v1/completions`).
    OpenAiCompletions,
    /// Not recognised: bytes are measured, events are not read.
    Unknown,
}

impl Dialect {
    /// The name used in records and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Dialect::OpenAiChat => "openai-chat",
            Dialect::OpenAiCompletions => "openai-completions",
            Dialect::Unknown => "unknown",
        }
    }
}

/// Why generation stopped, as a bounded set (anything else is `Other`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FinishReason {
    Stop,
    Length,
    ToolCalls,
    ContentFilter,
    Refusal,
    Error,
    Other,
}

impl FinishReason {
    /// The label value used in metrics and records; a bounded set.
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::ToolCalls => "tool_calls",
            FinishReason::ContentFilter => "content_filter",
            FinishReason::Refusal => "refusal",
            FinishReason::Error => "error",
            FinishReason::Other => "other",
        }
    }
}

/// What one frame (or the end of the body) carried, for timestamping.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct FrameEvents {
    /// Output-bearing events completed in this frame.
    pub output_events: u32,
    /// Whether any of them carried visible content (not reasoning, not tool-call arguments).
    pub content: bool,
}

/// What the whole stream said so far.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct StreamSummary {
    /// Events dispatched, comments not included (`[DONE]` is an event; so is an oversized one).
    pub events: u64,
    /// Events that carried output of any kind.
    pub output_events: u64,
    /// 1-based number (counted as `events`) of the first output-bearing event.
    pub first_output_event: Option<u64>,
    /// 1-based number of the first event with visible content.
    pub first_content_event: Option<u64>,
    /// The latest output token count the stream's own usage reported.
    pub usage_output_tokens: Option<u64>,
    /// The latest prompt token count the stream's own usage reported.
    pub usage_prompt_tokens: Option<u64>,
    /// The dialect's end marker was seen (or a non-streaming body arrived whole).
    pub end_marker: bool,
    /// The stream carried an error event.
    pub error: bool,
    /// The last finish reason seen; `Error` once an error was seen, whatever follows.
    pub finish_reason: Option<FinishReason>,
    /// Events larger than `max_event_bytes`: counted as events, never parsed.
    pub oversized_events: u64,
}

/// Where a framer hands the events it cut out of the body.
///
/// Framers call this while they hold borrows of the frame or of their own buffer, which is why
/// the event arrives as slices rather than as an owned value.
trait EventSink {
    /// One complete event. `event_type` is empty when the framing has none (NDJSON) or the event
    /// did not name one.
    fn event(&mut self, event_type: &[u8], data: &[u8]);
    /// One event that was larger than the limit; its bytes were skipped.
    fn oversized(&mut self);
}

/// The framer chosen for a response.
enum Framer {
    Sse(sse::SseFramer),
    Ndjson(ndjson::NdjsonFramer),
    Json(json_body::JsonBody),
    /// Opaque framing or an unknown dialect: nothing is read, so nothing is buffered.
    Off,
}

/// Reads one response body, frame by frame, and keeps its [`StreamSummary`].
pub struct StreamReader {
    framer: Framer,
    interpreter: Interpreter,
    summary: StreamSummary,
    finished: bool,
}

impl StreamReader {
    /// `max_event_bytes`: an event (SSE event / NDJSON line / JSON body) larger than this is
    /// skipped for parsing (counted in `summary.oversized_events`), so the memory a stream holds
    /// stays bounded by about this much.
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
        StreamReader {
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
        sink.frame
    }

    /// The body ended cleanly. Flushes a final event that had no trailing blank line or newline
    /// (WHATWG discards such an event, but servers do omit the last blank line and the event is
    /// real), and for [`Framing::Json`] parses the whole body now. Returns what that carried.
    /// Calling it again does nothing.
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
                    json_body::Body::Whole(body) => {
                        sink.summary.events = sink.summary.events.saturating_add(1);
                        let verdict = sink.interpreter.body(body);
                        sink.apply(verdict);
                    }
                }
                // A non-streaming body that arrived whole is complete, whatever it says.
                sink.summary.end_marker = true;
            }
            Framer::Off => {}
        }
        sink.frame
    }

    /// What the stream said so far.
    pub fn summary(&self) -> &StreamSummary {
        &self.summary
    }
}

/// Numbers the events a framer hands over, asks the dialect about each and keeps the score.
struct Tally<'a> {
    interpreter: &'a mut Interpreter,
    summary: &'a mut StreamSummary,
    frame: FrameEvents,
}

impl Tally<'_> {
    fn apply(&mut self, verdict: Verdict) {
        let s = &mut *self.summary;
        let number = s.events;
        // Visible content is output too, whatever the dialect forgot to say.
        if verdict.output || verdict.content {
            s.output_events = s.output_events.saturating_add(1);
            s.first_output_event.get_or_insert(number);
            self.frame.output_events = self.frame.output_events.saturating_add(1);
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
        self.summary.events = self.summary.events.saturating_add(1);
        let verdict = self.interpreter.event(event_type, data);
        self.apply(verdict);
    }

    fn oversized(&mut self) {
        // Still an event, so the numbers of the events after it stay those of the stream.
        self.summary.events = self.summary.events.saturating_add(1);
        self.summary.oversized_events = self.summary.oversized_events.saturating_add(1);
    }
}
