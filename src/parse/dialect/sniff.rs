//! Telling the dialect from an event, when the request path did not.
//!
//! The SSE event name says it for the typed dialects (`response.*` is the Responses API,
//! `message_start` and the `content_block_*` events are Anthropic). Otherwise the payload's
//! top-level keys do, each dialect having a shape no other has:
//!
//! | payload | dialect |
//! |---|---|
//! | `"object": "chat.completion.chunk"` or `"chat.completion"` | OpenAI chat |
//! | `"object": "text_completion"` | OpenAI completions |
//! | `"object": "response"`, or a `type` of `response.*` | OpenAI Responses |
//! | a `type` of `message_start`, `message`, `content_block_*`, `message_delta` | Anthropic |
//! | `meta_info` | SGLang |
//! | `token` (an object) or `generated_text` | TGI |
//! | `done` with `created_at` or `model` | Ollama |
//! | `stop` with `content`, or `tokens_predicted` | llama.cpp |
//! | `choices` whose first element has `delta`/`message` (chat) or `text` (completions) | OpenAI |
//!
//! A payload that is not JSON, `[DONE]`, or an error alone says nothing: sniffing goes on with
//! the next event. A JSON array (a batch body) is judged by its first element. This runs on the
//! first events of a stream only, so it may parse more than the hot path does.

use serde::Deserialize;
use serde_json::value::RawValue;

use super::{Name, Shape};
use crate::parse::event::Dialect;

/// The keys that tell dialects apart.
#[derive(Deserialize, Default)]
struct Probe<'a> {
    #[serde(default, borrow)]
    object: Name<'a>,
    #[serde(default, borrow, rename = "type")]
    kind: Name<'a>,
    #[serde(default, borrow)]
    choices: Option<Vec<&'a RawValue>>,
    #[serde(default)]
    meta_info: Shape,
    #[serde(default)]
    token: Shape,
    #[serde(default)]
    generated_text: Shape,
    #[serde(default)]
    done: Shape,
    #[serde(default)]
    created_at: Shape,
    #[serde(default)]
    model: Shape,
    #[serde(default)]
    stop: Shape,
    #[serde(default)]
    content: Shape,
    #[serde(default)]
    tokens_predicted: Shape,
}

/// The keys of a choice that tell chat from completions.
#[derive(Deserialize)]
struct ChoiceProbe {
    #[serde(default)]
    delta: Shape,
    #[serde(default)]
    message: Shape,
    #[serde(default)]
    text: Shape,
}

/// The dialect an event shows, if it shows one.
pub(super) fn sniff(event_type: &[u8], data: &[u8]) -> Option<Dialect> {
    if let Some(dialect) = by_event_name(event_type) {
        return Some(dialect);
    }
    let data = data.trim_ascii();
    let probe = match data.first() {
        Some(b'{') => serde_json::from_slice::<Probe>(data).ok()?,
        Some(b'[') => serde_json::from_slice::<Vec<&RawValue>>(data)
            .ok()?
            .first()
            .and_then(|first| serde_json::from_str::<Probe>(first.get()).ok())?,
        _ => return None,
    };
    by_keys(&probe)
}

fn by_event_name(name: &[u8]) -> Option<Dialect> {
    if name.starts_with(b"response.") {
        return Some(Dialect::OpenAiResponses);
    }
    match name {
        b"message_start"
        | b"content_block_start"
        | b"content_block_delta"
        | b"content_block_stop"
        | b"message_delta"
        | b"message_stop" => Some(Dialect::Anthropic),
        _ => None,
    }
}

fn by_keys(p: &Probe) -> Option<Dialect> {
    match p.object.0 {
        b"chat.completion.chunk" | b"chat.completion" => return Some(Dialect::OpenAiChat),
        b"text_completion" => return Some(Dialect::OpenAiCompletions),
        b"response" => return Some(Dialect::OpenAiResponses),
        _ => {}
    }
    if p.kind.0.starts_with(b"response.") {
        return Some(Dialect::OpenAiResponses);
    }
    if let b"message_start"
    | b"message"
    | b"content_block_start"
    | b"content_block_delta"
    | b"content_block_stop"
    | b"message_delta"
    | b"message_stop" = p.kind.0
    {
        return Some(Dialect::Anthropic);
    }
    if p.meta_info.present() {
        return Some(Dialect::SgLang);
    }
    if p.token.present() || p.generated_text.present() {
        return Some(Dialect::Tgi);
    }
    if p.done.present() && (p.created_at.present() || p.model.present()) {
        return Some(Dialect::Ollama);
    }
    if (p.stop.present() && p.content.present()) || p.tokens_predicted.present() {
        return Some(Dialect::LlamaCpp);
    }
    let first = p.choices.as_ref()?.first()?;
    let choice = serde_json::from_str::<ChoiceProbe>(first.get()).ok()?;
    if choice.delta.present() || choice.message.present() {
        Some(Dialect::OpenAiChat)
    } else if choice.text.present() {
        Some(Dialect::OpenAiCompletions)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(data: &str) -> Option<Dialect> {
        sniff(b"", data.as_bytes())
    }

    #[test]
    fn event_names() {
        assert_eq!(
            sniff(b"response.created", b"{}"),
            Some(Dialect::OpenAiResponses)
        );
        assert_eq!(sniff(b"message_start", b"{}"), Some(Dialect::Anthropic));
        assert_eq!(sniff(b"ping", b"{}"), None);
        assert_eq!(sniff(b"error", b"{\"error\":{}}"), None);
    }

    #[test]
    fn payload_shapes() {
        assert_eq!(
            s(r#"{"id":"c","object":"chat.completion.chunk","choices":[]}"#),
            Some(Dialect::OpenAiChat)
        );
        assert_eq!(
            s(r#"{"object":"text_completion","choices":[{"text":"a"}]}"#),
            Some(Dialect::OpenAiCompletions)
        );
        assert_eq!(
            s(r#"{"type":"response.created","response":{"object":"response"}}"#),
            Some(Dialect::OpenAiResponses)
        );
        assert_eq!(
            s(r#"{"id":"resp_1","object":"response","status":"completed","output":[]}"#),
            Some(Dialect::OpenAiResponses)
        );
        assert_eq!(
            s(r#"{"type":"message_start","message":{"usage":{"input_tokens":1}}}"#),
            Some(Dialect::Anthropic)
        );
        assert_eq!(
            s(r#"{"id":"m","type":"message","role":"assistant","content":[]}"#),
            Some(Dialect::Anthropic)
        );
        assert_eq!(
            s(
                r#"{"index":1,"token":{"id":3,"text":" ","special":false},"generated_text":null,"details":null}"#
            ),
            Some(Dialect::Tgi)
        );
        assert_eq!(s(r#"[{"generated_text":"hi"}]"#), Some(Dialect::Tgi));
        assert_eq!(
            s(r#"{"text":" Paris","meta_info":{"completion_tokens":1}}"#),
            Some(Dialect::SgLang)
        );
        assert_eq!(
            s(
                r#"{"model":"llama3.2","created_at":"2024-01-01T00:00:00Z","response":"The","done":false}"#
            ),
            Some(Dialect::Ollama)
        );
        assert_eq!(
            s(r#"{"index":0,"content":"Hello","tokens":[1],"stop":false,"id_slot":0}"#),
            Some(Dialect::LlamaCpp)
        );
        assert_eq!(
            s(r#"{"choices":[{"index":0,"delta":{"content":"x"}}]}"#),
            Some(Dialect::OpenAiChat)
        );
        assert_eq!(
            s(r#"{"choices":[{"index":0,"text":"x"}]}"#),
            Some(Dialect::OpenAiCompletions)
        );
    }

    #[test]
    fn payloads_that_say_nothing() {
        for data in [
            "[DONE]",
            "",
            "not json",
            "{}",
            "[]",
            r#"{"error":{"message":"x"}}"#,
            r#"{"type":"error","error":{}}"#,
            r#"{"type":"ping"}"#,
            r#"{"choices":[]}"#,
            r#"{"content":"x"}"#,
            "{\"object\":\"chat.completion.chunk\"",
        ] {
            assert_eq!(s(data), None, "{data}");
        }
    }
}
