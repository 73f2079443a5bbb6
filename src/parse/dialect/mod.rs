//! Giving events their meaning: one server dialect reads one event and says what it carried.
//!
//! A dialect sees an event as `(event_type, data)` — the SSE `event:` name (empty when there is
//! none, and always for NDJSON) and the payload — and answers with a [`Verdict`]. It knows
//! nothing of framing, event numbers or the summary; the reader does that bookkeeping. Adding a
//! server API means adding a variant here and a file beside this one. Until a dialect is known,
//! [`Interpreter::Sniffing`] asks `sniff` about the first few events.
//!
//! The JSON readers in this module never build a `serde_json::Value` and never copy a string:
//! the small shapes below look at the raw JSON text of a field (`RawValue`, borrowed from the
//! event) and keep only the one fact that matters (is it empty, which finish reason, which
//! count), so reading an event allocates nothing. Nested objects that a hot event carries are
//! read as small typed shapes rather than skipped, because skipping nested containers makes
//! serde_json allocate a stack.

mod anthropic;
mod llamacpp;
mod model;
mod ollama;
mod openai;
mod responses;
mod scan;
mod sglang;
mod sniff;
mod tgi;

use std::time::Duration;

use serde::de::{Deserializer, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;

pub(super) use self::model::response_model;
use super::event::{Dialect, FinishReason};
use super::report::{span, update, Engine, EngineReport};

/// How many events may pass before sniffing gives up and the stream stays unknown. The first
/// payload nearly always decides; the few after it allow for a keep-alive or a proxy's own
/// opening event.
const SNIFF_EVENTS: u8 = 8;

/// What one event carried, in the terms of the measurement contract.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct Verdict {
    /// Generated text of any kind: content, reasoning, refusal, tool-call arguments.
    pub output: bool,
    /// Visible content (not reasoning, not tool-call arguments). Implies `output`.
    pub content: bool,
    /// The dialect's end marker.
    pub end: bool,
    /// An error reported inside the stream.
    pub error: bool,
    pub finish: Option<FinishReason>,
    /// The stream's output token count so far (its total once the stream has ended).
    pub usage_output_tokens: Option<u64>,
    pub usage_prompt_tokens: Option<u64>,
    /// Tokens this output event carried, when cumulative counts on every event tell it.
    pub tokens: Option<u64>,
}

/// The dialect chosen for a response, with the state it keeps across events.
///
/// An enum rather than a trait object: the set is closed and small, dispatch is a jump, and a
/// dialect that needs state across events (cumulative counters, what was seen) keeps it in its
/// variant, inline: no allocation per stream beyond the reader itself.
#[derive(Debug)]
pub(super) enum Interpreter {
    OpenAiChat(openai::OpenAi),
    OpenAiCompletions(openai::OpenAi),
    OpenAiResponses(responses::Responses),
    Anthropic,
    Tgi,
    Ollama,
    LlamaCpp(llamacpp::LlamaCpp),
    SgLang(sglang::SgLang),
    /// The dialect is not known yet; `seen` events have not told it.
    Sniffing {
        seen: u8,
    },
    /// Events are not read.
    Off,
}

impl Interpreter {
    pub(super) fn new(dialect: Dialect) -> Self {
        match dialect {
            Dialect::OpenAiChat => Interpreter::OpenAiChat(openai::OpenAi::default()),
            Dialect::OpenAiCompletions => Interpreter::OpenAiCompletions(openai::OpenAi::default()),
            Dialect::OpenAiResponses => {
                Interpreter::OpenAiResponses(responses::Responses::default())
            }
            Dialect::Anthropic => Interpreter::Anthropic,
            Dialect::Tgi => Interpreter::Tgi,
            Dialect::Ollama => Interpreter::Ollama,
            Dialect::LlamaCpp => Interpreter::LlamaCpp(llamacpp::LlamaCpp::default()),
            Dialect::SgLang => Interpreter::SgLang(sglang::SgLang::default()),
            Dialect::Auto => Interpreter::Sniffing { seen: 0 },
            Dialect::Unknown => Interpreter::Off,
        }
    }

    pub(super) fn dialect(&self) -> Dialect {
        match self {
            Interpreter::OpenAiChat(_) => Dialect::OpenAiChat,
            Interpreter::OpenAiCompletions(_) => Dialect::OpenAiCompletions,
            Interpreter::OpenAiResponses(_) => Dialect::OpenAiResponses,
            Interpreter::Anthropic => Dialect::Anthropic,
            Interpreter::Tgi => Dialect::Tgi,
            Interpreter::Ollama => Dialect::Ollama,
            Interpreter::LlamaCpp(_) => Dialect::LlamaCpp,
            Interpreter::SgLang(_) => Dialect::SgLang,
            Interpreter::Sniffing { .. } => Dialect::Auto,
            Interpreter::Off => Dialect::Unknown,
        }
    }

    pub(super) fn is_off(&self) -> bool {
        matches!(self, Interpreter::Off)
    }

    pub(super) fn is_sniffing(&self) -> bool {
        matches!(self, Interpreter::Sniffing { .. })
    }

    /// One streamed event. What it says about cache, reasoning and the engine's own timing goes
    /// into `report`, when it carries any of it.
    pub(super) fn event(
        &mut self,
        event_type: &[u8],
        data: &[u8],
        report: &mut EngineReport,
    ) -> Verdict {
        match self {
            Interpreter::OpenAiChat(s) => s.chat_event(event_type, data, report),
            Interpreter::OpenAiCompletions(s) => s.completions_event(event_type, data, report),
            Interpreter::OpenAiResponses(s) => s.event(event_type, data, report),
            Interpreter::Anthropic => anthropic::event(event_type, data, report),
            // TGI's stream carries no cache or timing facts; its timing is in the headers of a
            // non-streaming answer (`engine_headers`).
            Interpreter::Tgi => tgi::event(event_type, data),
            Interpreter::Ollama => ollama::event(event_type, data, report),
            Interpreter::LlamaCpp(s) => s.event(event_type, data, report),
            Interpreter::SgLang(s) => s.event(event_type, data, report),
            Interpreter::Sniffing { .. } => match sniff::sniff(event_type, data) {
                Some(dialect) => {
                    *self = Interpreter::new(dialect);
                    self.event(event_type, data, report)
                }
                None => {
                    self.skipped();
                    Verdict::default()
                }
            },
            Interpreter::Off => Verdict::default(),
        }
    }

    /// An event that could not be read (it was too large): while sniffing, it uses up one of
    /// the events the dialect may take to show itself.
    pub(super) fn skipped(&mut self) {
        if let Interpreter::Sniffing { seen } = self {
            *seen = seen.saturating_add(1);
            if *seen >= SNIFF_EVENTS {
                *self = Interpreter::Off;
            }
        }
    }

    /// A whole non-streaming body; what it says beyond its output goes into `report`.
    pub(super) fn body(&mut self, body: &[u8], report: &mut EngineReport) -> Verdict {
        match self {
            Interpreter::OpenAiChat(_) => openai::chat_body(body, report),
            Interpreter::OpenAiCompletions(_) => openai::completions_body(body, report),
            Interpreter::OpenAiResponses(_) => responses::body(body, report),
            Interpreter::Anthropic => anthropic::body(body, report),
            Interpreter::Tgi => tgi::body(body),
            Interpreter::Ollama => ollama::body(body, report),
            Interpreter::LlamaCpp(_) => llamacpp::body(body, report),
            Interpreter::SgLang(_) => sglang::body(body, report),
            Interpreter::Sniffing { .. } => match sniff::sniff(b"", body) {
                Some(dialect) => {
                    *self = Interpreter::new(dialect);
                    self.body(body, report)
                }
                // A body is the only payload there is: nothing else will tell.
                None => {
                    *self = Interpreter::Off;
                    Verdict::default()
                }
            },
            Interpreter::Off => Verdict::default(),
        }
    }
}

/// Whether the payload is the `[DONE]` sentinel of the OpenAI-style streams.
fn is_done(data: &[u8]) -> bool {
    data.trim_ascii() == b"[DONE]"
}

/// What a JSON field held, as far as "did it say anything" goes.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum Shape {
    /// The field was not there.
    #[default]
    Absent,
    Null,
    /// `""`, `[]`, `{}` or `false`.
    Empty,
    /// Anything else: a non-empty string, array or object, a number, `true`.
    Filled,
}

impl Shape {
    fn filled(self) -> bool {
        self == Shape::Filled
    }

    /// Present and not null.
    fn present(self) -> bool {
        matches!(self, Shape::Empty | Shape::Filled)
    }

    /// The shape of a value's raw JSON text.
    fn of(raw: &[u8]) -> Shape {
        match raw.first() {
            None => Shape::Absent,
            Some(b'n') => Shape::Null,
            Some(b'f') => Shape::Empty,
            // Any escape or character makes a string longer than its two quotes.
            Some(b'"') if raw.len() <= 2 => Shape::Empty,
            Some(b'[' | b'{') => {
                let inner = raw.get(1..raw.len().saturating_sub(1)).unwrap_or(&[]);
                if inner.iter().all(u8::is_ascii_whitespace) {
                    Shape::Empty
                } else {
                    Shape::Filled
                }
            }
            Some(_) => Shape::Filled,
        }
    }
}

impl<'de> Deserialize<'de> for Shape {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // Raw text borrowed from the event: no string is unescaped or copied.
        let raw = <&'de RawValue>::deserialize(d)?;
        Ok(Shape::of(raw.get().as_bytes()))
    }
}

/// A token count; anything that is not a non-negative number is no count at all, rather than a
/// reason to drop the whole event.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Count(Option<u64>);

impl Count {
    /// The count a JSON value's text gives, whatever reads it (serde_json or the cursor).
    fn of(raw: &[u8]) -> Count {
        let Ok(raw) = std::str::from_utf8(raw) else {
            return Count(None);
        };
        if let Ok(n) = raw.parse::<u64>() {
            return Count(Some(n));
        }
        // `20.0` from servers that count in floats.
        match raw.parse::<f64>() {
            // `as` saturates at `u64::MAX`, which no real count reaches.
            Ok(f) if f.is_finite() && f >= 0.0 => Count(Some(f as u64)),
            _ => Count(None),
        }
    }
}

impl<'de> Deserialize<'de> for Count {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = <&'de RawValue>::deserialize(d)?.get();
        Ok(Count::of(raw.as_bytes()))
    }
}

/// A time span as a JSON number in some unit (`SCALE` of them in a second); anything that is not
/// a finite non-negative number is no duration at all, rather than a reason to drop the event.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Span<const SCALE: u64>(Option<Duration>);

/// Milliseconds (llama.cpp's `timings.prompt_ms`, `predicted_ms`).
type Millis = Span<1_000>;
/// Seconds (SGLang's `meta_info.e2e_latency`, `inference_time`).
type Seconds = Span<1>;
/// Nanoseconds (Ollama's `*_duration`).
type Nanos = Span<1_000_000_000>;

impl<'de, const SCALE: u64> Deserialize<'de> for Span<SCALE> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = <&'de RawValue>::deserialize(d)?.get();
        Ok(Span(span(raw, SCALE)))
    }
}

/// `usage.prompt_tokens_details` (OpenAI chat and completions) and
/// `usage.input_tokens_details` (Responses API): only the cached count is read.
#[derive(Deserialize, Debug, Default, Clone, Copy, PartialEq, Eq)]
struct PromptDetails {
    #[serde(default)]
    cached_tokens: Count,
}

/// `usage.completion_tokens_details` (OpenAI chat and completions) and
/// `usage.output_tokens_details` (Responses API): only the reasoning count is read.
#[derive(Deserialize, Debug, Default, Clone, Copy, PartialEq, Eq)]
struct OutputDetails {
    #[serde(default)]
    reasoning_tokens: Count,
}

/// The cached and reasoning counts of an OpenAI-style usage, into `report`.
fn report_details(
    prompt: Option<&PromptDetails>,
    output: Option<&OutputDetails>,
    report: &mut EngineReport,
) {
    if let Some(p) = prompt {
        update(&mut report.cached_tokens, p.cached_tokens.0);
    }
    if let Some(o) = output {
        update(&mut report.reasoning_tokens, o.reasoning_tokens.0);
    }
}

/// llama.cpp's `timings` object, on the final event of every endpoint (native `/completion`,
/// `/v1/completions`, `/v1/chat/completions`, `/v1/responses`; on every event with
/// `timings_per_token`): `cache_n` prompt tokens came from the cache, `prompt_n` were processed
/// in `prompt_ms`, `predicted_n` were generated in `predicted_ms` (`server_slot_stats::to_json`
/// in `tools/server/server-common.cpp`).
#[derive(Deserialize, Debug, Clone, Copy)]
struct Timings {
    #[serde(default)]
    cache_n: Count,
    #[serde(default)]
    prompt_n: Count,
    #[serde(default)]
    prompt_ms: Millis,
    #[serde(default)]
    predicted_n: Count,
    #[serde(default)]
    predicted_ms: Millis,
}

impl Timings {
    fn report(&self, report: &mut EngineReport) {
        update(&mut report.cached_tokens, self.cache_n.0);
        update(&mut report.prompt_processed, self.prompt_n.0);
        update(&mut report.prefill, self.prompt_ms.0);
        update(&mut report.decode, self.predicted_ms.0);
        report.source = Some(Engine::LlamaCpp);
    }
}

/// A sequence's `index` (of a choice, of a prompt in a batch): a plain non-negative integer,
/// else 0. Read by serde_json's own number parser rather than through the raw text as [`Count`]
/// is, because it is on every chunk of every OpenAI stream and this is cheaper; the price is that
/// a number too large for a float (`1e400`) fails the whole event, which no server sends as an
/// index.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Index(u64);

impl<'de> Deserialize<'de> for Index {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Index;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an index")
            }
            fn visit_u64<E>(self, n: u64) -> Result<Index, E> {
                Ok(Index(n))
            }
            fn visit_i64<E>(self, n: i64) -> Result<Index, E> {
                Ok(Index(u64::try_from(n).unwrap_or(0)))
            }
            fn visit_f64<E>(self, _: f64) -> Result<Index, E> {
                Ok(Index(0))
            }
            fn visit_bool<E>(self, _: bool) -> Result<Index, E> {
                Ok(Index(0))
            }
            fn visit_str<E>(self, _: &str) -> Result<Index, E> {
                Ok(Index(0))
            }
            fn visit_unit<E>(self) -> Result<Index, E> {
                Ok(Index(0))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Index, A::Error> {
                while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {}
                Ok(Index(0))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Index, A::Error> {
                while map
                    .next_entry::<serde::de::IgnoredAny, serde::de::IgnoredAny>()?
                    .is_some()
                {}
                Ok(Index(0))
            }
        }
        d.deserialize_any(V)
    }
}

/// A JSON `true`; anything else (`false`, null, a string) is false.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Flag(bool);

impl<'de> Deserialize<'de> for Flag {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = <&'de RawValue>::deserialize(d)?.get();
        Ok(Flag(raw == "true"))
    }
}

/// A JSON string's raw text between its quotes, borrowed from the event: escapes are left as
/// they are, which is fine for the plain ASCII names it is compared with. Empty when the field
/// is absent or not a string.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Name<'a>(&'a [u8]);

impl<'de: 'a, 'a> Deserialize<'de> for Name<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = <&'de RawValue>::deserialize(d)?.get().as_bytes();
        Ok(Name(match raw {
            [b'"', inner @ .., b'"'] => inner,
            _ => &[],
        }))
    }
}

/// The length of a JSON string as it stands in the event (escapes counted as written), without
/// keeping it; `None` when the field is absent or not a string. A string that grew by appending
/// is longer in this measure too, since JSON escapes each character on its own.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct TextLen(Option<usize>);

impl<'de> Deserialize<'de> for TextLen {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = <&'de RawValue>::deserialize(d)?.get().as_bytes();
        Ok(TextLen(match raw {
            [b'"', inner @ .., b'"'] => Some(inner.len()),
            _ => None,
        }))
    }
}

/// A `finish_reason` (or `stop_reason`, `done_reason`, `stop_type`): `None` for null, an empty
/// string, or a missing field.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Finish(Option<FinishReason>);

impl<'de> Deserialize<'de> for Finish {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = <&'de RawValue>::deserialize(d)?.get().as_bytes();
        Ok(Finish::of(raw))
    }
}

impl Finish {
    /// The finish reason a value's raw JSON text gives.
    fn of(raw: &[u8]) -> Finish {
        Finish(match raw {
            b"null" => None,
            // Some servers send `""` on every chunk that is not the last: not an end.
            b"\"\"" => None,
            [b'"', name @ .., b'"'] => Some(finish_reason(name)),
            // Not a string, but not null either: the server says it stopped, for some reason.
            _ => Some(FinishReason::Other),
        })
    }
}

/// Maps a wire finish reason (of any dialect) to the bounded set.
fn finish_reason(name: &[u8]) -> FinishReason {
    match name {
        // OpenAI, Anthropic, TGI (`eos_token`, `stop_sequence`), llama.cpp (`eos`, `word`).
        b"stop" | b"end_turn" | b"eos" | b"eos_token" | b"stop_sequence" | b"word" => {
            FinishReason::Stop
        }
        // llama.cpp says `limit`; Anthropic's context window running out is a length stop too.
        b"length"
        | b"max_tokens"
        | b"limit"
        | b"max_output_tokens"
        | b"model_context_window_exceeded" => FinishReason::Length,
        b"tool_calls" | b"function_call" | b"tool_use" => FinishReason::ToolCalls,
        b"content_filter" => FinishReason::ContentFilter,
        b"refusal" => FinishReason::Refusal,
        b"error" => FinishReason::Error,
        // Anthropic `pause_turn`, Ollama `load`/`unload`, and anything new.
        _ => FinishReason::Other,
    }
}

/// A field that reports an error: a top-level `error` that says anything (not null, `""` or
/// `false`), or `"object": "error"` (vLLM's older stream errors).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Alarm(bool);

impl Alarm {
    fn error_field<'de, D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(Alarm::error(
            <&'de RawValue>::deserialize(d)?.get().as_bytes(),
        ))
    }

    fn object_field<'de, D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(Alarm::object(
            <&'de RawValue>::deserialize(d)?.get().as_bytes(),
        ))
    }

    /// An `error` field, from its raw JSON text.
    fn error(raw: &[u8]) -> Alarm {
        Alarm(!matches!(raw, b"null" | b"\"\"" | b"false" | b"{}"))
    }

    /// An `object` field, from its raw JSON text.
    fn object(raw: &[u8]) -> Alarm {
        Alarm(raw == b"\"error\"")
    }
}

/// Whether `tool_calls` holds at least one call (OpenAI deltas and messages, Ollama messages).
///
/// Each call is read as a small typed object rather than skipped whole: to skip nested containers
/// serde_json keeps a stack that allocates, once per event, and tool-call streams would pay it on
/// every chunk.
#[derive(Debug, Default)]
struct ToolCalls(bool);

/// One tool call; nothing of it is kept, only its nesting is walked.
#[derive(Deserialize)]
struct ToolCall {
    #[serde(default, rename = "function")]
    _function: Option<Walked>,
}

/// An object whose fields are all skipped (they are scalars, so skipping needs no stack).
#[derive(Deserialize)]
struct Walked {}

impl<'de> Deserialize<'de> for ToolCalls {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(ToolCallsVisitor)
    }
}

struct ToolCallsVisitor;

impl<'de> Visitor<'de> for ToolCallsVisitor {
    type Value = ToolCalls;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("an array of tool calls or null")
    }

    fn visit_unit<E>(self) -> Result<ToolCalls, E> {
        Ok(ToolCalls(false))
    }

    fn visit_none<E>(self) -> Result<ToolCalls, E> {
        Ok(ToolCalls(false))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<ToolCalls, A::Error> {
        let mut any = false;
        while seq.next_element::<ToolCall>()?.is_some() {
            any = true;
        }
        Ok(ToolCalls(any))
    }
}

/// A non-streaming body that is one result object or an array of them (TGI and SGLang answer a
/// batch with an array): each result is folded into `T` as it is read, without a `Vec`.
#[derive(Debug, Default)]
struct OneOrMany<T>(T);

/// What the results of a whole (non-streaming) batch add up to; TGI and SGLang fold each of
/// their results into it and differ only in where the fields are.
#[derive(Debug, Default)]
struct Batch {
    output: bool,
    error: bool,
    finish: Option<FinishReason>,
    tokens: Option<u64>,
    prompt: Option<u64>,
    /// What the results said beyond their output, folded as each dialect sees fit.
    report: EngineReport,
}

impl Batch {
    /// Adds one result's output and prompt counts, when it reports them.
    fn count(&mut self, tokens: Option<u64>, prompt: Option<u64>) {
        let add = |sum: Option<u64>, n: Option<u64>| match n {
            Some(n) => Some(sum.unwrap_or(0).saturating_add(n)),
            None => sum,
        };
        self.tokens = add(self.tokens, tokens);
        self.prompt = add(self.prompt, prompt);
    }

    /// Reads a one-or-many body whose results fold into a `Batch` through `T`; the batch's
    /// report is merged into `report`.
    fn read<T: Fold + Into<Batch>>(body: &[u8], report: &mut EngineReport) -> Verdict {
        let Ok(OneOrMany(all)) = serde_json::from_slice::<OneOrMany<T>>(body) else {
            return Verdict::default();
        };
        let all: Batch = all.into();
        *report = all.report.or(*report);
        Verdict {
            output: all.output,
            content: all.output,
            end: true,
            error: all.error,
            finish: all.finish,
            usage_output_tokens: all.tokens,
            usage_prompt_tokens: all.prompt,
            tokens: None,
        }
    }
}

/// What a result type adds to the running fold.
trait Fold: Default {
    type Item: for<'de> Deserialize<'de>;
    fn fold(&mut self, item: Self::Item);
}

impl<'de, T: Fold> Deserialize<'de> for OneOrMany<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(OneOrManyVisitor(std::marker::PhantomData))
    }
}

struct OneOrManyVisitor<T>(std::marker::PhantomData<T>);

impl<'de, T: Fold> Visitor<'de> for OneOrManyVisitor<T> {
    type Value = OneOrMany<T>;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a result object or an array of them")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        let item = T::Item::deserialize(serde::de::value::MapAccessDeserializer::new(map))?;
        let mut all = T::default();
        all.fold(item);
        Ok(OneOrMany(all))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut all = T::default();
        while let Some(item) = seq.next_element::<T::Item>()? {
            all.fold(item);
        }
        Ok(OneOrMany(all))
    }
}

/// How many sequences (choices of `n > 1`, prompts of a batch) get their own cumulative counts;
/// the events of any more are read without per-event token counts.
const TRACKS: usize = 8;

/// One sequence's cumulative counts.
#[derive(Debug, Default, Clone, Copy)]
struct Track {
    index: u64,
    /// The latest cumulative output count reported.
    latest: u64,
    /// The count already attributed to output events (or seen before the first of them).
    counted: Option<u64>,
    /// Length of its cumulative text as last seen (SGLang).
    text: usize,
}

/// Per-sequence cumulative counts, for the streams that report a running output count on every
/// event: the tokens of one output event are the growth of its sequence's count since the last
/// output event of that sequence. Growth seen on events without output (a held-back stop string,
/// a partial character) is carried into the next output event, which shows that text. Fixed
/// size, inline: a stream's state does not grow with its length.
#[derive(Debug, Default)]
struct Tracks {
    slots: [Track; TRACKS],
    used: usize,
}

impl Tracks {
    fn slot(&mut self, index: u64) -> Option<&mut Track> {
        let used = self.used.min(TRACKS);
        let found = self
            .slots
            .get(..used)
            .and_then(|slots| slots.iter().position(|t| t.index == index));
        let at = match found {
            Some(at) => at,
            None if used < TRACKS => {
                self.used = used + 1;
                let slot = self.slots.get_mut(used)?;
                *slot = Track {
                    index,
                    ..Track::default()
                };
                used
            }
            None => return None,
        };
        self.slots.get_mut(at)
    }

    /// Sequence `index` reports `cumulative` output tokens on an event. Returns the tokens the
    /// event carried, when it is an output event and an earlier count of its sequence is known.
    fn count(&mut self, index: u64, cumulative: u64, output: bool) -> Option<u64> {
        let track = self.slot(index)?;
        track.latest = cumulative;
        let carried = match (output, track.counted) {
            (true, Some(before)) => Some(cumulative.saturating_sub(before)),
            _ => None,
        };
        if output || track.counted.is_none() {
            track.counted = Some(cumulative);
        }
        carried
    }

    /// The latest count of sequence `index`, if it is tracked and reported one.
    fn latest(&self, index: u64) -> Option<u64> {
        self.slots
            .iter()
            .take(self.used)
            .find(|t| t.index == index && t.counted.is_some())
            .map(|t| t.latest)
    }

    /// The latest counts of all sequences, added up: the stream's output tokens so far.
    fn total(&self) -> u64 {
        self.slots
            .iter()
            .take(self.used)
            .fold(0u64, |sum, t| sum.saturating_add(t.latest))
    }

    /// Whether the cumulative text of sequence `index`, now `len` bytes as written, grew. A
    /// sequence past the tracked ones grows whenever it has text.
    fn text_grew(&mut self, index: u64, len: usize) -> bool {
        match self.slot(index) {
            Some(track) => {
                let grew = len > track.text;
                track.text = len;
                grew
            }
            None => len > 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes() {
        let s = |json: &str| serde_json::from_str::<Shape>(json).ok();
        assert_eq!(s("null"), Some(Shape::Null));
        assert_eq!(s("\"\""), Some(Shape::Empty));
        assert_eq!(s("[]"), Some(Shape::Empty));
        assert_eq!(s("[ \n ]"), Some(Shape::Empty));
        assert_eq!(s("{}"), Some(Shape::Empty));
        assert_eq!(s("false"), Some(Shape::Empty));
        assert_eq!(s("\"x\""), Some(Shape::Filled));
        assert_eq!(s("\"\\n\""), Some(Shape::Filled));
        assert_eq!(s("[{}]"), Some(Shape::Filled));
        assert_eq!(s("{\"a\":1}"), Some(Shape::Filled));
        assert_eq!(s("0"), Some(Shape::Filled));
        assert_eq!(s("true"), Some(Shape::Filled));
    }

    #[test]
    fn counts_are_lenient() {
        let c = |json: &str| serde_json::from_str::<Count>(json).ok().and_then(|c| c.0);
        assert_eq!(c("20"), Some(20));
        assert_eq!(c("20.0"), Some(20));
        assert_eq!(c("-1"), None);
        assert_eq!(c("null"), None);
        assert_eq!(c("\"20\""), None);
        assert_eq!(c("1e400"), None);
    }

    #[test]
    fn indexes_are_lenient() {
        let i = |json: &str| serde_json::from_str::<Index>(json).ok().map(|i| i.0);
        assert_eq!(i("3"), Some(3));
        assert_eq!(i("-1"), Some(0));
        assert_eq!(i("1.5"), Some(0));
        assert_eq!(i("\"2\""), Some(0));
        assert_eq!(i("null"), Some(0));
        assert_eq!(i("[1,[2]]"), Some(0));
        assert_eq!(i("{\"a\":{}}"), Some(0));
    }

    #[test]
    fn names_and_lengths_are_borrowed_raw() {
        let n = |json: &str| {
            serde_json::from_str::<Name>(json)
                .map(|n| n.0.to_vec())
                .ok()
        };
        assert_eq!(n("\"message_start\""), Some(b"message_start".to_vec()));
        assert_eq!(n("\"\""), Some(Vec::new()));
        assert_eq!(n("3"), Some(Vec::new()));
        let l = |json: &str| serde_json::from_str::<TextLen>(json).ok().and_then(|l| l.0);
        assert_eq!(l("\"\""), Some(0));
        assert_eq!(l("\"ab\\n\""), Some(4));
        assert_eq!(l("null"), None);
        let f = |json: &str| serde_json::from_str::<Flag>(json).ok().map(|f| f.0);
        assert_eq!(f("true"), Some(true));
        assert_eq!(f("false"), Some(false));
        assert_eq!(f("\"true\""), Some(false));
    }

    #[test]
    fn finish_reasons_map_to_a_bounded_set() {
        let f = |json: &str| serde_json::from_str::<Finish>(json).ok().and_then(|f| f.0);
        assert_eq!(f("null"), None);
        assert_eq!(f("\"\""), None);
        assert_eq!(f("\"stop\""), Some(FinishReason::Stop));
        assert_eq!(f("\"eos\""), Some(FinishReason::Stop));
        assert_eq!(f("\"word\""), Some(FinishReason::Stop));
        assert_eq!(f("\"eos_token\""), Some(FinishReason::Stop));
        assert_eq!(f("\"end_turn\""), Some(FinishReason::Stop));
        assert_eq!(f("\"stop_sequence\""), Some(FinishReason::Stop));
        assert_eq!(f("\"length\""), Some(FinishReason::Length));
        assert_eq!(f("\"limit\""), Some(FinishReason::Length));
        assert_eq!(f("\"max_tokens\""), Some(FinishReason::Length));
        assert_eq!(f("\"max_output_tokens\""), Some(FinishReason::Length));
        assert_eq!(
            f("\"model_context_window_exceeded\""),
            Some(FinishReason::Length)
        );
        assert_eq!(f("\"tool_calls\""), Some(FinishReason::ToolCalls));
        assert_eq!(f("\"function_call\""), Some(FinishReason::ToolCalls));
        assert_eq!(f("\"tool_use\""), Some(FinishReason::ToolCalls));
        assert_eq!(f("\"content_filter\""), Some(FinishReason::ContentFilter));
        assert_eq!(f("\"refusal\""), Some(FinishReason::Refusal));
        assert_eq!(f("\"error\""), Some(FinishReason::Error));
        assert_eq!(f("\"pause_turn\""), Some(FinishReason::Other));
        assert_eq!(f("\"load\""), Some(FinishReason::Other));
        assert_eq!(f("\"abort\""), Some(FinishReason::Other));
        assert_eq!(f("3"), Some(FinishReason::Other));
    }

    #[test]
    fn finish_reason_names_are_stable() {
        let all = [
            (FinishReason::Stop, "stop"),
            (FinishReason::Length, "length"),
            (FinishReason::ToolCalls, "tool_calls"),
            (FinishReason::ContentFilter, "content_filter"),
            (FinishReason::Refusal, "refusal"),
            (FinishReason::Error, "error"),
            (FinishReason::Other, "other"),
        ];
        for (reason, name) in all {
            assert_eq!(reason.as_str(), name);
            // Every name but `other` reads back as itself.
            if reason != FinishReason::Other {
                assert_eq!(finish_reason(name.as_bytes()), reason);
            }
        }
    }

    #[test]
    fn tracks_attribute_growth_to_output_events() {
        let mut t = Tracks::default();
        // A role chunk reports 0 before any output: the baseline.
        assert_eq!(t.count(0, 0, false), None);
        assert_eq!(t.count(0, 1, true), Some(1));
        assert_eq!(t.count(0, 3, true), Some(2));
        // Growth on an event without output goes to the next output event.
        assert_eq!(t.count(0, 4, false), None);
        assert_eq!(t.count(0, 6, true), Some(3));
        // Another sequence has its own count; the total adds them up.
        assert_eq!(t.count(1, 2, true), None, "no earlier count of sequence 1");
        assert_eq!(t.count(1, 5, true), Some(3));
        assert_eq!(t.total(), 11);
        // A count that goes back is no negative token.
        assert_eq!(t.count(0, 5, true), Some(0));
    }

    #[test]
    fn tracks_are_bounded() {
        let mut t = Tracks::default();
        for i in 0..100 {
            t.count(i, 1, false);
            assert!(t.text_grew(i, 3) || i >= TRACKS as u64);
        }
        assert_eq!(t.total(), TRACKS as u64);
        assert_eq!(
            t.count(99, 5, true),
            None,
            "untracked sequences carry no count"
        );
    }

    #[test]
    fn sniffing_gives_up_after_a_few_events() {
        let mut i = Interpreter::new(Dialect::Auto);
        let mut report = EngineReport::default();
        for _ in 0..SNIFF_EVENTS - 1 {
            assert_eq!(
                i.event(b"", b"{\"hello\":1}", &mut report),
                Verdict::default()
            );
            assert!(i.is_sniffing());
        }
        i.event(b"", b"[DONE]", &mut report);
        assert!(i.is_off());
        assert_eq!(i.dialect(), Dialect::Unknown);
    }

    #[test]
    fn sniffing_reads_the_event_that_decided() {
        let mut i = Interpreter::new(Dialect::Auto);
        let mut report = EngineReport::default();
        assert_eq!(i.event(b"", b": not json", &mut report), Verdict::default());
        let v = i.event(
            b"",
            br#"{"object":"chat.completion.chunk","choices":[{"delta":{"content":"Hi"}}]}"#,
            &mut report,
        );
        assert_eq!(i.dialect(), Dialect::OpenAiChat);
        assert!(v.output && v.content);
    }
}
