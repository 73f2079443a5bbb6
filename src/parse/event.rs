//! What a response stream is and what it said: the framing, the server dialect, the events a
//! frame carried and the summary of the whole stream. Plain values shared by the framers, the
//! dialects and the reader, and the [`EventSink`] through which a framer hands over its events.

use std::fmt;
use std::str::FromStr;

use super::report::EngineReport;

/// The longest SSE `event:` name the reader holds; an event with a longer type is oversized.
/// Real names are short (`response.function_call_arguments.delta` is 38 bytes): the cap keeps
/// the type buffer from doubling the memory a stream may hold.
pub const MAX_EVENT_TYPE_BYTES: usize = 128;

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
    /// OpenAI Responses API (`/v1/responses`).
    OpenAiResponses,
    /// Anthropic Messages (`/v1/messages`).
    Anthropic,
    /// Hugging Face text-generation-inference native API (`/generate_stream`, `/generate`).
    Tgi,
    /// Ollama native API (`/api/generate`, `/api/chat`).
    Ollama,
    /// llama.cpp server native API (`/completion`).
    LlamaCpp,
    /// SGLang native API (`/generate`).
    SgLang,
    /// Not decided yet: the first events of the body decide.
    Auto,
    /// Not recognised: bytes are measured, events are not read.
    Unknown,
}

impl Dialect {
    /// Every dialect, in the order of their names in [`Dialect::as_str`].
    pub const ALL: [Dialect; 10] = [
        Dialect::OpenAiChat,
        Dialect::OpenAiCompletions,
        Dialect::OpenAiResponses,
        Dialect::Anthropic,
        Dialect::Tgi,
        Dialect::Ollama,
        Dialect::LlamaCpp,
        Dialect::SgLang,
        Dialect::Auto,
        Dialect::Unknown,
    ];

    /// The name used in configuration, records and logs; [`FromStr`] reads it back.
    pub fn as_str(self) -> &'static str {
        match self {
            Dialect::OpenAiChat => "openai-chat",
            Dialect::OpenAiCompletions => "openai-completions",
            Dialect::OpenAiResponses => "openai-responses",
            Dialect::Anthropic => "anthropic",
            Dialect::Tgi => "tgi",
            Dialect::Ollama => "ollama",
            Dialect::LlamaCpp => "llamacpp",
            Dialect::SgLang => "sglang",
            Dialect::Auto => "auto",
            Dialect::Unknown => "unknown",
        }
    }

    /// Whether events of this dialect can be read: neither undecided nor unknown.
    pub fn is_known(self) -> bool {
        !matches!(self, Dialect::Auto | Dialect::Unknown)
    }
}

impl fmt::Display for Dialect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A dialect name that is not one of [`Dialect::as_str`]'s.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownDialect(pub String);

impl fmt::Display for UnknownDialect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "unknown dialect `{}`; expected one of ", self.0)?;
        for (i, d) in Dialect::ALL.iter().enumerate() {
            let sep = if i == 0 { "" } else { ", " };
            write!(f, "{sep}`{}`", d.as_str())?;
        }
        Ok(())
    }
}

impl std::error::Error for UnknownDialect {}

impl FromStr for Dialect {
    type Err = UnknownDialect;

    /// Reads the names of [`Dialect::as_str`], exactly (they are configuration values).
    fn from_str(name: &str) -> Result<Self, Self::Err> {
        Dialect::ALL
            .into_iter()
            .find(|d| d.as_str() == name)
            .ok_or_else(|| UnknownDialect(name.to_owned()))
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
    /// Tokens those events carried: from the differences of the stream's cumulative usage when
    /// it reports one on every event (vLLM's continuous usage stats, SGLang, llama.cpp), else one
    /// per event. At least `output_events`.
    pub tokens: u32,
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
    /// The latest output token count the stream's own usage reported (its final count once the
    /// stream has ended; placeholders such as Anthropic's `message_start` count are not taken).
    pub usage_output_tokens: Option<u64>,
    /// The latest prompt token count the stream's own usage reported.
    pub usage_prompt_tokens: Option<u64>,
    /// The largest number of tokens one output event carried, as cumulative usage differences
    /// showed; `None` when the stream does not report usage on every event.
    pub max_tokens_per_event: Option<u64>,
    /// The dialect's end marker was seen (or a non-streaming body arrived whole).
    pub end_marker: bool,
    /// The stream carried an error event.
    pub error: bool,
    /// The last finish reason seen; `Error` once an error was seen, whatever follows.
    pub finish_reason: Option<FinishReason>,
    /// Events larger than `max_event_bytes`: counted as events, never parsed.
    pub oversized_events: u64,
    /// What the stream said that explains its figures: cached prompt tokens, reasoning tokens,
    /// the engine's own timing.
    pub engine: EngineReport,
    /// The model the response named (`gen_ai.response.model`): looked for in the events up to
    /// the first output event and in a whole body, never after, so about once per response.
    pub response_model: Option<Box<str>>,
}

/// Where a framer hands the events it cut out of the body.
///
/// Framers call this while they hold borrows of the frame or of their own buffer, which is why
/// the event arrives as slices rather than as an owned value.
pub(super) trait EventSink {
    /// One complete event. `event_type` is empty when the framing has none (NDJSON) or the event
    /// did not name one.
    fn event(&mut self, event_type: &[u8], data: &[u8]);
    /// One event that was larger than the limit; its bytes were skipped.
    fn oversized(&mut self);
}

/// Appends `bytes` to `buf`, growing it geometrically but never to a capacity past `limit`, so
/// a buffer that may hold `limit` bytes never costs twice that. Callers check that the bytes fit.
pub(super) fn extend_bounded(buf: &mut Vec<u8>, bytes: &[u8], limit: usize) {
    let need = buf.len().saturating_add(bytes.len());
    if need > buf.capacity() {
        // A small first step, then doubling: amortised growth for events split into many small
        // frames, capped at the limit.
        let target = buf
            .capacity()
            .saturating_mul(2)
            .max(need)
            .max(64)
            .min(limit.max(need));
        buf.reserve_exact(target - buf.len());
    }
    buf.extend_from_slice(bytes);
}
