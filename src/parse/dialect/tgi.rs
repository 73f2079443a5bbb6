//! Hugging Face text-generation-inference's native API: `/generate_stream` (SSE) and
//! `/generate` (one JSON body, or an array of them).
//!
//! Each stream event carries one generated `token`; it is output (and content: TGI does not
//! separate reasoning) unless `token.special` is true. The last event also has a non-null
//! `generated_text` and `details`: that is the end marker, `details.generated_tokens` the output
//! count, `details.input_length` (newer servers) the prompt count and `details.finish_reason`
//! the finish (`length`; `eos_token` and `stop_sequence` are `stop`). An event
//! `{"error": ..., "error_type": ...}` is an error. With one token per event, events carry no
//! separate token counts. TGI's OpenAI-compatible Messages API (`/v1/chat/completions`) is
//! plain OpenAI chat.
//!
//! Neither the stream nor the body says anything of caches or timing: TGI reports its queue and
//! inference times in the response headers of a non-streaming answer, which
//! [`engine_headers`](fn@crate::parse::engine_headers) reads.

use serde::Deserialize;

use super::{Alarm, Batch, Count, EngineReport, Finish, Flag, Fold, Shape, Verdict};

#[derive(Deserialize)]
struct Event {
    #[serde(default)]
    token: Option<Token>,
    #[serde(default)]
    generated_text: Shape,
    #[serde(default)]
    details: Option<Details>,
    #[serde(default, deserialize_with = "Alarm::error_field")]
    error: Alarm,
}

#[derive(Deserialize)]
struct Token {
    #[serde(default)]
    special: Flag,
}

#[derive(Deserialize)]
struct Details {
    #[serde(default)]
    finish_reason: Finish,
    #[serde(default)]
    generated_tokens: Count,
    #[serde(default)]
    input_length: Count,
}

pub(super) fn event(event_type: &[u8], data: &[u8]) -> Verdict {
    let base = Verdict {
        error: event_type == b"error",
        ..Verdict::default()
    };
    let Ok(e) = serde_json::from_slice::<Event>(data) else {
        return base;
    };
    let output = e.token.as_ref().is_some_and(|t| !t.special.0);
    let (finish, usage_output_tokens, usage_prompt_tokens) = match &e.details {
        Some(d) => (d.finish_reason.0, d.generated_tokens.0, d.input_length.0),
        None => (None, None, None),
    };
    Verdict {
        output,
        content: output,
        end: e.generated_text.present() || e.details.is_some(),
        error: base.error || e.error.0,
        finish,
        usage_output_tokens,
        usage_prompt_tokens,
        tokens: None,
    }
}

/// `/generate`'s answer: `{"generated_text": ..., "details": {...}}`, or an array of them.
pub(super) fn body(body: &[u8]) -> Verdict {
    #[derive(Deserialize)]
    struct Result {
        #[serde(default)]
        generated_text: Shape,
        #[serde(default)]
        details: Option<Details>,
        #[serde(default, deserialize_with = "Alarm::error_field")]
        error: Alarm,
    }
    #[derive(Default)]
    struct All(Batch);
    impl From<All> for Batch {
        fn from(all: All) -> Batch {
            all.0
        }
    }
    impl Fold for All {
        type Item = Result;
        fn fold(&mut self, r: Result) {
            self.0.output |= r.generated_text.filled();
            self.0.error |= r.error.0;
            if let Some(d) = r.details {
                self.0.finish = d.finish_reason.0.or(self.0.finish);
                self.0.count(d.generated_tokens.0, d.input_length.0);
            }
        }
    }
    // The body says nothing beyond its output: TGI's timing is in the response headers.
    Batch::read::<All>(body, &mut EngineReport::default())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse::event::FinishReason;

    fn ev(data: &str) -> Verdict {
        event(b"", data.as_bytes())
    }

    #[test]
    fn tokens_are_output_unless_special() {
        let v = ev(
            r#"{"index":1,"token":{"id":450,"text":" The","logprob":-0.3,"special":false},"generated_text":null,"details":null,"top_tokens":null}"#,
        );
        assert!(v.output && v.content && !v.end);
        let v = ev(
            r#"{"index":2,"token":{"id":2,"text":"</s>","logprob":-0.1,"special":true},"generated_text":null,"details":null}"#,
        );
        assert!(!v.output);
    }

    #[test]
    fn last_event_ends_with_details() {
        let v = ev(
            r#"{"index":20,"token":{"id":29889,"text":".","logprob":-0.2,"special":false},"generated_text":"The sky is blue.","details":{"finish_reason":"eos_token","generated_tokens":20,"seed":null,"input_length":7}}"#,
        );
        assert!(v.output && v.end);
        assert_eq!(v.finish, Some(FinishReason::Stop));
        assert_eq!(
            (v.usage_output_tokens, v.usage_prompt_tokens),
            (Some(20), Some(7))
        );
        let v = ev(
            r#"{"index":5,"token":{"id":1,"text":"x","special":false},"generated_text":"abcde","details":{"finish_reason":"length","generated_tokens":5}}"#,
        );
        assert_eq!(v.finish, Some(FinishReason::Length));
        let v = ev(
            r#"{"token":{"id":1,"text":"x","special":false},"generated_text":"x","details":{"finish_reason":"stop_sequence","generated_tokens":1}}"#,
        );
        assert_eq!(v.finish, Some(FinishReason::Stop));
    }

    #[test]
    fn error_events() {
        let v = ev(
            r#"{"error":"Request failed during generation: Server error: CUDA out of memory","error_type":"generation"}"#,
        );
        assert!(v.error && !v.output && !v.end);
    }

    #[test]
    fn whole_bodies() {
        let v = body(
            br#"{"generated_text":"Deep learning is","details":{"finish_reason":"length","generated_tokens":3,"seed":null,"prefill":[],"tokens":[{"id":1,"text":"Deep","logprob":-1.0,"special":false}]}}"#,
        );
        assert!(v.output && v.content && v.end);
        assert_eq!(v.usage_output_tokens, Some(3));
        assert_eq!(v.finish, Some(FinishReason::Length));
        let v = body(br#"[{"generated_text":"a","details":{"generated_tokens":2}},{"generated_text":"b","details":{"generated_tokens":3}}]"#);
        assert!(v.output);
        assert_eq!(v.usage_output_tokens, Some(5));
        let v = body(br#"[{"generated_text":"Hi there"}]"#);
        assert!(v.output);
        assert_eq!(v.usage_output_tokens, None);
        let v = body(br#"{"error":"Input validation error","error_type":"validation"}"#);
        assert!(v.error && !v.output);
    }
}
