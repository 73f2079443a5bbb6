//! Anthropic Messages (`/v1/messages`): typed SSE events, streamed or whole.
//!
//! An event's type is its SSE `event:` name, or the payload's `type`. Output is a
//! `content_block_delta` whose `text_delta.text`, `thinking_delta.thinking` or
//! `input_json_delta.partial_json` is non-empty; visible content is text only. Signature and
//! citation deltas, `ping`, block starts and stops carry nothing. `message_start` gives the
//! prompt count (`usage.input_tokens`); its `usage.output_tokens` is a placeholder (1, or a
//! few) sent before anything was generated and is never taken as the output count. The output
//! count is the cumulative `usage.output_tokens` of `message_delta`, which also carries the stop
//! reason (`end_turn`/`stop_sequence` are `stop`, `max_tokens` is `length`, `tool_use` is
//! `tool_calls`, `refusal` is `refusal`, `pause_turn` is `other`). `message_stop` is the end
//! marker; an `error` event (`{"type":"error","error":{...}}`) inside the 200 stream is an
//! error. Since the count arrives only at the end, events carry no per-event token counts.
//!
//! Prompt caching: `cache_read_input_tokens` (prompt tokens served from the cache) and
//! `cache_creation_input_tokens` (written to it) come in `message_start`'s usage, and current
//! servers repeat the whole usage in `message_delta`; the latest wins. llama.cpp's Anthropic
//! route sends `cache_read_input_tokens` in `message_start` too.
//!
//! A whole body is a `message` object: its content blocks say whether anything was generated
//! (text is content; thinking and tool use are output), with `stop_reason` and `usage`; or an
//! `error` object.

use serde::de::{Deserializer, SeqAccess, Visitor};
use serde::Deserialize;

use super::{update, Count, EngineReport, Finish, Name, Shape, Verdict};

#[derive(Deserialize)]
struct Event<'a> {
    #[serde(default, borrow, rename = "type")]
    kind: Name<'a>,
    #[serde(default, borrow)]
    delta: Option<Delta<'a>>,
    #[serde(default)]
    usage: Option<Usage>,
    #[serde(default)]
    message: Option<Start>,
}

/// A `content_block_delta`'s or a `message_delta`'s `delta`.
#[derive(Deserialize)]
struct Delta<'a> {
    #[serde(default, borrow, rename = "type")]
    kind: Name<'a>,
    #[serde(default)]
    text: Shape,
    #[serde(default)]
    thinking: Shape,
    #[serde(default)]
    partial_json: Shape,
    #[serde(default)]
    stop_reason: Finish,
}

#[derive(Deserialize)]
struct Usage {
    #[serde(default)]
    output_tokens: Count,
    #[serde(default)]
    input_tokens: Count,
    #[serde(default)]
    cache_read_input_tokens: Count,
    #[serde(default)]
    cache_creation_input_tokens: Count,
}

impl Usage {
    fn report(&self, report: &mut EngineReport) {
        update(&mut report.cached_tokens, self.cache_read_input_tokens.0);
        update(
            &mut report.cache_creation_tokens,
            self.cache_creation_input_tokens.0,
        );
    }
}

/// The `message` of `message_start`: only its usage matters.
#[derive(Deserialize)]
struct Start {
    #[serde(default)]
    usage: Option<Usage>,
}

pub(super) fn event(event_type: &[u8], data: &[u8], report: &mut EngineReport) -> Verdict {
    // Events that say everything by their name are not parsed.
    match event_type {
        b"ping" | b"content_block_start" | b"content_block_stop" => return Verdict::default(),
        b"message_stop" => {
            return Verdict {
                end: true,
                ..Verdict::default()
            }
        }
        b"error" => {
            return Verdict {
                error: true,
                ..Verdict::default()
            }
        }
        _ => {}
    }
    let Ok(e) = serde_json::from_slice::<Event>(data) else {
        return Verdict::default();
    };
    let kind = if event_type.is_empty() {
        e.kind.0
    } else {
        event_type
    };
    match kind {
        b"content_block_delta" => {
            let Some(d) = e.delta else {
                return Verdict::default();
            };
            let (output, content) = match d.kind.0 {
                b"text_delta" => (d.text.filled(), d.text.filled()),
                b"thinking_delta" => (d.thinking.filled(), false),
                b"input_json_delta" => (d.partial_json.filled(), false),
                // Signatures and citations are not generated text.
                b"signature_delta" | b"citations_delta" => (false, false),
                // A delta type we do not know: judge it by the fields it has.
                _ => (
                    d.text.filled() || d.thinking.filled() || d.partial_json.filled(),
                    d.text.filled(),
                ),
            };
            Verdict {
                output,
                content,
                ..Verdict::default()
            }
        }
        b"message_start" => {
            let usage = e.message.and_then(|m| m.usage);
            if let Some(u) = &usage {
                u.report(report);
            }
            Verdict {
                // The start's output count is a placeholder: only the prompt count is real.
                usage_prompt_tokens: usage.and_then(|u| u.input_tokens.0),
                ..Verdict::default()
            }
        }
        b"message_delta" => {
            let (usage_output_tokens, usage_prompt_tokens) = match &e.usage {
                Some(u) => {
                    u.report(report);
                    (u.output_tokens.0, u.input_tokens.0)
                }
                None => (None, None),
            };
            Verdict {
                finish: e.delta.and_then(|d| d.stop_reason.0),
                usage_output_tokens,
                usage_prompt_tokens,
                ..Verdict::default()
            }
        }
        b"message_stop" => Verdict {
            end: true,
            ..Verdict::default()
        },
        b"error" => Verdict {
            error: true,
            ..Verdict::default()
        },
        _ => Verdict::default(),
    }
}

/// A whole `message` object, or an error body.
pub(super) fn body(body: &[u8], report: &mut EngineReport) -> Verdict {
    #[derive(Deserialize)]
    struct Message<'a> {
        #[serde(default, borrow, rename = "type")]
        kind: Name<'a>,
        #[serde(default)]
        content: Blocks,
        #[serde(default)]
        stop_reason: Finish,
        #[serde(default)]
        usage: Option<Usage>,
    }
    let Ok(m) = serde_json::from_slice::<Message>(body) else {
        return Verdict::default();
    };
    let (usage_output_tokens, usage_prompt_tokens) = match &m.usage {
        Some(u) => {
            u.report(report);
            (u.output_tokens.0, u.input_tokens.0)
        }
        None => (None, None),
    };
    Verdict {
        output: m.content.output,
        content: m.content.content,
        end: true,
        error: m.kind.0 == b"error",
        finish: m.stop_reason.0,
        usage_output_tokens,
        usage_prompt_tokens,
        tokens: None,
    }
}

/// The content blocks of a whole message, folded as they are read.
#[derive(Debug, Default)]
struct Blocks {
    output: bool,
    content: bool,
}

#[derive(Deserialize)]
struct Block<'a> {
    #[serde(default, borrow, rename = "type")]
    kind: Name<'a>,
    #[serde(default)]
    text: Shape,
    #[serde(default)]
    thinking: Shape,
}

impl<'de> Deserialize<'de> for Blocks {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Blocks;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("content blocks")
            }
            fn visit_unit<E>(self) -> Result<Blocks, E> {
                Ok(Blocks::default())
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Blocks, A::Error> {
                let mut all = Blocks::default();
                while let Some(b) = seq.next_element::<Block>()? {
                    match b.kind.0 {
                        b"text" => {
                            all.output |= b.text.filled();
                            all.content |= b.text.filled();
                        }
                        b"thinking" => all.output |= b.thinking.filled(),
                        b"redacted_thinking" | b"tool_use" | b"server_tool_use" => {
                            all.output = true
                        }
                        // Tool results and the like were not generated by the model.
                        _ => {}
                    }
                }
                Ok(all)
            }
        }
        d.deserialize_any(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse::event::FinishReason;

    fn ev(name: &str, data: &str) -> Verdict {
        event(
            name.as_bytes(),
            data.as_bytes(),
            &mut EngineReport::default(),
        )
    }

    fn body(json: &[u8]) -> Verdict {
        super::body(json, &mut EngineReport::default())
    }

    #[test]
    fn deltas() {
        let v = ev(
            "content_block_delta",
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hello"}}"#,
        );
        assert!(v.output && v.content);
        let v = ev(
            "content_block_delta",
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"Let me see"}}"#,
        );
        assert!(v.output && !v.content);
        let v = ev(
            "content_block_delta",
            r#"{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"{\"loc"}}"#,
        );
        assert!(v.output && !v.content);
        for empty in [
            r#"{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":""}}"#,
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":""}}"#,
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"signature_delta","signature":"EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl1pkiMOYds"}}"#,
        ] {
            assert_eq!(
                ev("content_block_delta", empty),
                Verdict::default(),
                "{empty}"
            );
        }
    }

    #[test]
    fn start_gives_the_prompt_not_the_placeholder() {
        let v = ev(
            "message_start",
            r#"{"type":"message_start","message":{"id":"m","type":"message","role":"assistant","content":[],"model":"claude","stop_reason":null,"usage":{"input_tokens":11,"output_tokens":1}}}"#,
        );
        assert_eq!(v.usage_prompt_tokens, Some(11));
        assert_eq!(
            v.usage_output_tokens, None,
            "the placeholder is not a count"
        );
        assert!(!v.output && !v.end);
    }

    #[test]
    fn message_delta_carries_the_count_and_the_reason() {
        for (reason, want) in [
            ("end_turn", FinishReason::Stop),
            ("stop_sequence", FinishReason::Stop),
            ("max_tokens", FinishReason::Length),
            ("tool_use", FinishReason::ToolCalls),
            ("refusal", FinishReason::Refusal),
            ("pause_turn", FinishReason::Other),
        ] {
            let data = format!(
                r#"{{"type":"message_delta","delta":{{"stop_reason":"{reason}","stop_sequence":null}},"usage":{{"output_tokens":65}}}}"#
            );
            let v = ev("message_delta", &data);
            assert_eq!(v.finish, Some(want), "{reason}");
            assert_eq!(v.usage_output_tokens, Some(65));
            assert!(!v.end, "message_stop ends the stream, not message_delta");
        }
    }

    #[test]
    fn end_error_and_nothing() {
        assert!(ev("message_stop", r#"{"type":"message_stop"}"#).end);
        let v = ev(
            "error",
            r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#,
        );
        assert!(v.error);
        for (name, data) in [
            ("ping", r#"{"type": "ping"}"#),
            (
                "content_block_start",
                r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#,
            ),
            (
                "content_block_stop",
                r#"{"type":"content_block_stop","index":0}"#,
            ),
        ] {
            assert_eq!(ev(name, data), Verdict::default(), "{name}");
        }
    }

    #[test]
    fn type_from_the_payload_when_the_name_is_missing() {
        let v = ev(
            "",
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hi"}}"#,
        );
        assert!(v.output && v.content);
        assert!(ev("", r#"{"type":"message_stop"}"#).end);
        assert!(ev("", r#"{"type":"error","error":{"type":"api_error"}}"#).error);
    }

    /// Prompt caching: both counts in `message_start`; current servers repeat the whole usage
    /// in `message_delta`, which wins.
    #[test]
    fn cache_counts_from_start_and_delta() {
        let mut r = EngineReport::default();
        event(
            b"message_start",
            br#"{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","content":[],"model":"claude-sonnet-4-5","stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":12,"cache_creation_input_tokens":0,"cache_read_input_tokens":2048,"cache_creation":{"ephemeral_5m_input_tokens":0,"ephemeral_1h_input_tokens":0},"output_tokens":1,"service_tier":"standard"}}}"#,
            &mut r,
        );
        assert_eq!(
            (r.cached_tokens, r.cache_creation_tokens),
            (Some(2048), Some(0))
        );
        // A delta without cache counts keeps them.
        event(
            b"message_delta",
            br#"{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":30}}"#,
            &mut r,
        );
        assert_eq!(
            (r.cached_tokens, r.cache_creation_tokens),
            (Some(2048), Some(0))
        );
        event(
            b"message_delta",
            br#"{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"input_tokens":12,"cache_creation_input_tokens":310,"cache_read_input_tokens":2048,"output_tokens":30,"server_tool_use":{"web_search_requests":0}}}"#,
            &mut r,
        );
        assert_eq!(
            (r.cached_tokens, r.cache_creation_tokens),
            (Some(2048), Some(310))
        );
        assert_eq!(r.source, None);
        let mut r = EngineReport::default();
        super::body(
            br#"{"type":"message","content":[{"type":"text","text":"Hi"}],"stop_reason":"end_turn","usage":{"input_tokens":3,"cache_creation_input_tokens":1500,"cache_read_input_tokens":0,"output_tokens":2}}"#,
            &mut r,
        );
        assert_eq!(
            (r.cached_tokens, r.cache_creation_tokens),
            (Some(0), Some(1500))
        );
    }

    #[test]
    fn whole_bodies() {
        let v = body(
            br#"{"id":"msg_1","type":"message","role":"assistant","model":"claude","content":[{"type":"thinking","thinking":"Hmm","signature":"x"},{"type":"text","text":"Hi!"}],"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":10,"output_tokens":25}}"#,
        );
        assert!(v.output && v.content && v.end && !v.error);
        assert_eq!(v.finish, Some(FinishReason::Stop));
        assert_eq!(
            (v.usage_output_tokens, v.usage_prompt_tokens),
            (Some(25), Some(10))
        );

        let v = body(
            br#"{"type":"message","content":[{"type":"tool_use","id":"t","name":"f","input":{"a":{"b":1}}}],"stop_reason":"tool_use","usage":{"input_tokens":3,"output_tokens":40}}"#,
        );
        assert!(v.output && !v.content);
        assert_eq!(v.finish, Some(FinishReason::ToolCalls));

        let v =
            body(br#"{"type":"error","error":{"type":"invalid_request_error","message":"bad"}}"#);
        assert!(v.error && !v.output);
    }
}
