//! Giving events their meaning: one server dialect reads one event and says what it carried.
//!
//! A dialect sees an event as `(event_type, data)` — the SSE `event:` name (empty when there is
//! none, and always for NDJSON) and the payload — and answers with a [`Verdict`]. It knows
//! nothing of framing, event numbers or the summary; the reader does that bookkeeping. Adding a
//! server API means adding a variant here and a file beside this one.
//!
//! The JSON readers in this module never build a `serde_json::Value` and never copy a string:
//! the small shapes below look at the raw JSON text of a field (`RawValue`, borrowed from the
//! event) and keep only the one fact that matters (is it empty, which finish reason, which
//! count), so reading an event allocates nothing.

mod openai;

use serde::{Deserialize, Deserializer};
use serde_json::value::RawValue;

use super::{Dialect, FinishReason};

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
    pub usage_output_tokens: Option<u64>,
    pub usage_prompt_tokens: Option<u64>,
}

/// The dialect chosen for a response.
///
/// An enum rather than a trait object: the set is closed and small, dispatch is a jump, and a
/// dialect that needs state across events (block kinds, cumulative counters) keeps it in its
/// variant.
#[derive(Debug)]
pub(super) enum Interpreter {
    OpenAiChat,
    OpenAiCompletions,
    /// Events are not read.
    Off,
}

impl Interpreter {
    pub(super) fn new(dialect: Dialect) -> Self {
        match dialect {
            Dialect::OpenAiChat => Interpreter::OpenAiChat,
            Dialect::OpenAiCompletions => Interpreter::OpenAiCompletions,
            Dialect::Unknown => Interpreter::Off,
        }
    }

    pub(super) fn is_off(&self) -> bool {
        matches!(self, Interpreter::Off)
    }

    /// One streamed event.
    pub(super) fn event(&mut self, event_type: &[u8], data: &[u8]) -> Verdict {
        match self {
            Interpreter::OpenAiChat => openai::chat_event(event_type, data),
            Interpreter::OpenAiCompletions => openai::completions_event(event_type, data),
            Interpreter::Off => Verdict::default(),
        }
    }

    /// A whole non-streaming body.
    pub(super) fn body(&mut self, body: &[u8]) -> Verdict {
        match self {
            Interpreter::OpenAiChat => openai::chat_body(body),
            Interpreter::OpenAiCompletions => openai::completions_body(body),
            Interpreter::Off => Verdict::default(),
        }
    }
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

    fn of(raw: &str) -> Shape {
        let raw = raw.as_bytes();
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
        Ok(Shape::of(raw.get()))
    }
}

/// A token count; anything that is not a non-negative number is no count at all, rather than a
/// reason to drop the whole event.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Count(Option<u64>);

impl<'de> Deserialize<'de> for Count {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = <&'de RawValue>::deserialize(d)?.get();
        if let Ok(n) = raw.parse::<u64>() {
            return Ok(Count(Some(n)));
        }
        // `20.0` from servers that count in floats.
        match raw.parse::<f64>() {
            // `as` saturates at `u64::MAX`, which no real count reaches.
            Ok(f) if f.is_finite() && f >= 0.0 => Ok(Count(Some(f as u64))),
            _ => Ok(Count(None)),
        }
    }
}

/// A `finish_reason` (or `stop_reason`): `None` for null, an empty string, or a missing field.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Finish(Option<FinishReason>);

impl<'de> Deserialize<'de> for Finish {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = <&'de RawValue>::deserialize(d)?.get().as_bytes();
        let reason = match raw {
            b"null" => None,
            // Some servers send `""` on every chunk that is not the last: not an end.
            b"\"\"" => None,
            [b'"', name @ .., b'"'] => Some(finish_reason(name)),
            // Not a string, but not null either: the server says it stopped, for some reason.
            _ => Some(FinishReason::Other),
        };
        Ok(Finish(reason))
    }
}

/// Maps a wire finish reason (of any dialect) to the bounded set.
fn finish_reason(name: &[u8]) -> FinishReason {
    match name {
        b"stop" | b"end_turn" | b"eos" | b"eos_token" | b"stop_sequence" => FinishReason::Stop,
        b"length" | b"max_tokens" => FinishReason::Length,
        b"tool_calls" | b"function_call" | b"tool_use" => FinishReason::ToolCalls,
        b"content_filter" => FinishReason::ContentFilter,
        b"refusal" => FinishReason::Refusal,
        b"error" => FinishReason::Error,
        _ => FinishReason::Other,
    }
}

/// A field that reports an error: a top-level `error` that says anything (not null, `""` or
/// `false`), or `"object": "error"` (vLLM's older stream errors).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Alarm(bool);

impl Alarm {
    fn error_field<'de, D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = <&'de RawValue>::deserialize(d)?.get();
        Ok(Alarm(!matches!(raw, "null" | "\"\"" | "false")))
    }

    fn object_field<'de, D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = <&'de RawValue>::deserialize(d)?.get();
        Ok(Alarm(raw == "\"error\""))
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
    fn finish_reasons_map_to_a_bounded_set() {
        let f = |json: &str| serde_json::from_str::<Finish>(json).ok().and_then(|f| f.0);
        assert_eq!(f("null"), None);
        assert_eq!(f("\"\""), None);
        assert_eq!(f("\"stop\""), Some(FinishReason::Stop));
        assert_eq!(f("\"eos\""), Some(FinishReason::Stop));
        assert_eq!(f("\"end_turn\""), Some(FinishReason::Stop));
        assert_eq!(f("\"stop_sequence\""), Some(FinishReason::Stop));
        assert_eq!(f("\"length\""), Some(FinishReason::Length));
        assert_eq!(f("\"max_tokens\""), Some(FinishReason::Length));
        assert_eq!(f("\"tool_calls\""), Some(FinishReason::ToolCalls));
        assert_eq!(f("\"function_call\""), Some(FinishReason::ToolCalls));
        assert_eq!(f("\"tool_use\""), Some(FinishReason::ToolCalls));
        assert_eq!(f("\"content_filter\""), Some(FinishReason::ContentFilter));
        assert_eq!(f("\"refusal\""), Some(FinishReason::Refusal));
        assert_eq!(f("\"error\""), Some(FinishReason::Error));
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
}
