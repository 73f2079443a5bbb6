//! The OpenAI dialects: chat completions and legacy completions, streamed or whole.
//!
//! Chat: an event carries output when some choice's `delta` (or, in a whole body, `message`)
//! has non-empty `content`, `refusal`, `reasoning_content` or `reasoning`, or any `tool_calls`
//! (or legacy `function_call`); visible content is `content` and `refusal`, which a reader sees,
//! never reasoning or tool-call arguments. Together also sends a completions-style `text` on chat
//! chunks, beside `delta.content`: it counts as content, and the event still counts once, since
//! one event is one verdict. With `n > 1` choices interleave; an event with output in any choice
//! is one output event.
//!
//! Completions: output and content are a non-empty `choices[].text`.
//!
//! Both: `[DONE]` or any non-null `finish_reason` is the end marker (Cerebras never sends
//! `[DONE]`); `usage` may come in a trailing `choices: []` chunk, inside the finish chunk, or
//! cumulatively on every chunk; a top-level `error` (or `"object": "error"`, or an SSE event
//! named `error`) is an error. A payload that is not JSON is ignored, not an error: a stream is
//! judged by its end marker, not by one odd line.

use serde::de::{Deserializer, SeqAccess, Visitor};
use serde::Deserialize;

use super::{Alarm, Count, Finish, FinishReason, Shape, Verdict};

/// One chunk of a stream, or a whole body: only the fields that matter here. Everything else
/// (`id`, `logprobs`, `system_fingerprint`, `obfuscation`, ...) is skipped by serde unread.
#[derive(Deserialize)]
struct Chunk {
    #[serde(default)]
    choices: Choices,
    #[serde(default)]
    usage: Option<Usage>,
    #[serde(default, deserialize_with = "Alarm::error_field")]
    error: Alarm,
    #[serde(default, deserialize_with = "Alarm::object_field")]
    object: Alarm,
}

#[derive(Deserialize)]
struct Usage {
    #[serde(default)]
    completion_tokens: Count,
    #[serde(default)]
    prompt_tokens: Count,
}

/// One element of `choices`.
#[derive(Deserialize)]
struct Choice {
    #[serde(default)]
    delta: Option<Message>,
    #[serde(default)]
    message: Option<Message>,
    #[serde(default)]
    text: Shape,
    #[serde(default)]
    finish_reason: Finish,
}

/// A chat `delta` (streamed) or `message` (whole body).
#[derive(Deserialize)]
struct Message {
    #[serde(default)]
    content: Shape,
    #[serde(default)]
    refusal: Shape,
    #[serde(default)]
    reasoning_content: Shape,
    #[serde(default)]
    reasoning: Shape,
    #[serde(default)]
    tool_calls: ToolCalls,
    #[serde(default)]
    function_call: Shape,
}

impl Message {
    fn content(&self) -> bool {
        self.content.filled() || self.refusal.filled()
    }

    fn output(&self) -> bool {
        self.content()
            || self.reasoning_content.filled()
            || self.reasoning.filled()
            || self.tool_calls.0
            || self.function_call.filled()
    }
}

/// Whether `tool_calls` holds at least one call.
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

/// All choices of one chunk, folded as they are read: no `Vec` is built for them.
#[derive(Debug, Default)]
struct Choices {
    /// Some chat message carried output.
    message_output: bool,
    /// Some chat message carried visible content.
    message_content: bool,
    /// Some choice had a non-empty `text`.
    text: bool,
    /// The last non-null finish reason among the choices.
    finish: Option<FinishReason>,
}

impl<'de> Deserialize<'de> for Choices {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(ChoicesVisitor)
    }
}

struct ChoicesVisitor;

impl<'de> Visitor<'de> for ChoicesVisitor {
    type Value = Choices;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("an array of choices or null")
    }

    fn visit_unit<E>(self) -> Result<Choices, E> {
        Ok(Choices::default())
    }

    fn visit_none<E>(self) -> Result<Choices, E> {
        Ok(Choices::default())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Choices, A::Error> {
        let mut all = Choices::default();
        while let Some(choice) = seq.next_element::<Choice>()? {
            for message in [&choice.delta, &choice.message].into_iter().flatten() {
                all.message_output |= message.output();
                all.message_content |= message.content();
            }
            all.text |= choice.text.filled();
            if choice.finish_reason.0.is_some() {
                all.finish = choice.finish_reason.0;
            }
        }
        Ok(all)
    }
}

/// Which fields of a choice count, per dialect.
#[derive(Clone, Copy)]
enum Flavour {
    Chat,
    Completions,
}

pub(super) fn chat_event(event_type: &[u8], data: &[u8]) -> Verdict {
    event(Flavour::Chat, event_type, data)
}

pub(super) fn completions_event(event_type: &[u8], data: &[u8]) -> Verdict {
    event(Flavour::Completions, event_type, data)
}

pub(super) fn chat_body(body: &[u8]) -> Verdict {
    parse(Flavour::Chat, body, Verdict::default())
}

pub(super) fn completions_body(body: &[u8]) -> Verdict {
    parse(Flavour::Completions, body, Verdict::default())
}

fn event(flavour: Flavour, event_type: &[u8], data: &[u8]) -> Verdict {
    let base = Verdict {
        error: event_type == b"error",
        ..Verdict::default()
    };
    if data.trim_ascii() == b"[DONE]" {
        return Verdict { end: true, ..base };
    }
    parse(flavour, data, base)
}

fn parse(flavour: Flavour, json: &[u8], base: Verdict) -> Verdict {
    let Ok(chunk) = serde_json::from_slice::<Chunk>(json) else {
        return base;
    };
    let choices = &chunk.choices;
    let (output, content) = match flavour {
        Flavour::Chat => {
            let content = choices.message_content || choices.text;
            (content || choices.message_output, content)
        }
        Flavour::Completions => (choices.text, choices.text),
    };
    let (usage_output_tokens, usage_prompt_tokens) = match &chunk.usage {
        Some(usage) => (usage.completion_tokens.0, usage.prompt_tokens.0),
        None => (None, None),
    };
    Verdict {
        output,
        content,
        end: choices.finish.is_some(),
        error: base.error || chunk.error.0 || chunk.object.0,
        finish: choices.finish,
        usage_output_tokens,
        usage_prompt_tokens,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat(data: &str) -> Verdict {
        chat_event(b"", data.as_bytes())
    }

    #[test]
    fn chat_output_kinds() {
        let v = chat(r#"{"choices":[{"index":0,"delta":{"content":"Hi"}}]}"#);
        assert!(v.output && v.content && !v.end);

        let v = chat(r#"{"choices":[{"index":0,"delta":{"content":"\"\u00e9\n"}}]}"#);
        assert!(v.output && v.content, "escaped content is content");

        let v = chat(r#"{"choices":[{"delta":{"reasoning_content":"hmm"}}]}"#);
        assert!(v.output && !v.content, "reasoning is output, not content");

        let v = chat(r#"{"choices":[{"delta":{"reasoning":"hmm","content":null}}]}"#);
        assert!(v.output && !v.content);

        let v = chat(r#"{"choices":[{"delta":{"refusal":"I can't"}}]}"#);
        assert!(v.output && v.content, "a refusal is read by the user");

        let v = chat(
            r#"{"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"arguments":""}}]}}]}"#,
        );
        assert!(
            v.output && !v.content,
            "a tool call is output even with empty arguments"
        );

        let v = chat(r#"{"choices":[{"delta":{"function_call":{"arguments":"{"}}}]}"#);
        assert!(v.output && !v.content);
    }

    #[test]
    fn chat_events_without_output() {
        for data in [
            r#"{"choices":[{"index":0,"delta":{"role":"assistant","content":"","refusal":null}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"role":"assistant","content":null}}]}"#,
            r#"{"choices":[{"delta":{"tool_calls":null,"content":""}}]}"#,
            r#"{"choices":[{"delta":{"tool_calls":[]}}]}"#,
            r#"{"choices":[{"delta":{},"finish_reason":"stop"}]}"#,
            r#"{"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":2}}"#,
            r#"{"choices":null}"#,
            r#"{}"#,
            "[DONE]",
            "not json",
            "",
        ] {
            let v = chat(data);
            assert!(!v.output && !v.content && !v.error, "{data}");
        }
    }

    #[test]
    fn chat_end_markers() {
        assert!(chat("[DONE]").end);
        assert!(chat(" [DONE] ").end);
        assert!(!chat("[DONE]x").end);
        let v = chat(r#"{"choices":[{"delta":{},"finish_reason":"length"}]}"#);
        assert!(v.end);
        assert_eq!(v.finish, Some(FinishReason::Length));
        let v = chat(r#"{"choices":[{"delta":{"content":"x"},"finish_reason":null}]}"#);
        assert!(!v.end);
        assert_eq!(v.finish, None);
        let v = chat(r#"{"choices":[{"delta":{"content":"x"},"finish_reason":""}]}"#);
        assert!(!v.end, "an empty finish reason is no reason");
    }

    #[test]
    fn chat_usage_anywhere() {
        let v = chat(r#"{"choices":[],"usage":{"prompt_tokens":79,"completion_tokens":1}}"#);
        assert_eq!(
            (v.usage_output_tokens, v.usage_prompt_tokens),
            (Some(1), Some(79))
        );
        let v = chat(
            r#"{"choices":[{"delta":{"content":"a"}}],"usage":{"prompt_tokens":5,"completion_tokens":3,"total_tokens":8}}"#,
        );
        assert!(v.output);
        assert_eq!(v.usage_output_tokens, Some(3));
        let v = chat(r#"{"choices":[{"delta":{"content":"a"}}],"usage":null}"#);
        assert_eq!(v.usage_output_tokens, None);
    }

    #[test]
    fn chat_errors() {
        let v = chat(r#"{"error":{"message":"overloaded","type":"server_error"}}"#);
        assert!(v.error && !v.output);
        let v = chat(r#"{"object":"error","message":"boom","type":"BadRequestError"}"#);
        assert!(v.error);
        let v = chat_event(b"error", br#"{"message":"boom"}"#);
        assert!(v.error);
        let v = chat(r#"{"choices":[{"delta":{"content":"x"}}],"error":null}"#);
        assert!(!v.error && v.content);
        let v = chat(r#"{"object":"chat.completion.chunk","choices":[]}"#);
        assert!(!v.error);
    }

    #[test]
    fn interleaved_choices_are_one_event() {
        let v = chat(
            r#"{"choices":[{"index":0,"delta":{"content":""}},{"index":1,"delta":{"reasoning":"r"}},{"index":2,"delta":{},"finish_reason":"stop"}]}"#,
        );
        assert!(v.output && !v.content && v.end);
        assert_eq!(v.finish, Some(FinishReason::Stop));
    }

    #[test]
    fn together_text_and_delta() {
        let v = chat(
            r#"{"choices":[{"index":0,"text":"Deep","finish_reason":null,"delta":{"token_id":34564,"role":"assistant","content":"Deep","tool_calls":null}}]}"#,
        );
        assert!(v.output && v.content);
    }

    #[test]
    fn completions() {
        let c = |data: &str| completions_event(b"", data.as_bytes());
        let v = c(r#"{"choices":[{"text":" +","index":0,"logprobs":null,"finish_reason":null}]}"#);
        assert!(v.output && v.content && !v.end);
        let v = c(r#"{"choices":[{"text":"","index":0,"finish_reason":"length"}]}"#);
        assert!(!v.output && v.end);
        assert_eq!(v.finish, Some(FinishReason::Length));
        let v = c(r#"{"choices":[{"delta":{"content":"x"}}]}"#);
        assert!(!v.output, "completions read text only");
        assert!(c("[DONE]").end);
    }

    #[test]
    fn whole_chat_body() {
        let body = br#"{
          "id": "chatcmpl-123",
          "object": "chat.completion",
          "created": 1727346171,
          "model": "gpt-4o-2024-08-06",
          "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": "Hello there!", "refusal": null},
            "logprobs": null,
            "finish_reason": "stop"
          }],
          "usage": {"prompt_tokens": 9, "completion_tokens": 12, "total_tokens": 21}
        }"#;
        let v = chat_body(body);
        assert!(v.output && v.content && v.end && !v.error);
        assert_eq!(v.finish, Some(FinishReason::Stop));
        assert_eq!(v.usage_output_tokens, Some(12));
        assert_eq!(v.usage_prompt_tokens, Some(9));

        let body = br#"{"object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"f","arguments":"{}"}}]},"finish_reason":"tool_calls"}],"usage":{"prompt_tokens":50,"completion_tokens":15}}"#;
        let v = chat_body(body);
        assert!(v.output && !v.content);
        assert_eq!(v.finish, Some(FinishReason::ToolCalls));

        let body = br#"{"error":{"message":"The model `x` does not exist","type":"invalid_request_error","param":null,"code":"model_not_found"}}"#;
        let v = chat_body(body);
        assert!(v.error && !v.output);
    }

    #[test]
    fn whole_completions_body() {
        let body = br#"{"id":"cmpl-1","object":"text_completion","created":1,"model":"gpt-3.5-turbo-instruct","choices":[{"text":"\n\nThis is a test.","index":0,"logprobs":null,"finish_reason":"length"}],"usage":{"prompt_tokens":5,"completion_tokens":7,"total_tokens":12}}"#;
        let v = completions_body(body);
        assert!(v.output && v.content && v.end);
        assert_eq!(v.finish, Some(FinishReason::Length));
        assert_eq!(v.usage_output_tokens, Some(7));
    }
}
