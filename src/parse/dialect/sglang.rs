//! SGLang's native API: `/generate`, SSE `data: {...}` events ending in `data: [DONE]`, or one
//! JSON body (an array for a batch).
//!
//! Each event repeats the *cumulative* `text` so far and `meta_info` with the running
//! `completion_tokens`, `prompt_tokens` and `finish_reason` (null until the end, then
//! `{"type": "stop" | "length" | "abort", ...}`). The text cannot be kept (the reader holds no
//! text), so an event carries output (and content: no reasoning is separated) when its `text` is
//! longer, as written in the JSON, than the same sequence's was: JSON escapes each character on
//! its own, so appended text is always longer. Without `text`, growth of `completion_tokens`
//! decides. The tokens of an output event are the growth of `completion_tokens` since the
//! sequence's last output event; sequences are told apart by `index` (batches and `n > 1`
//! interleave), and the stream's count is the sum of their latest counts.
//!
//! The end marker is `[DONE]` or a non-null `finish_reason`. A finish of type `abort` means the
//! server gave up on the request inside a 200 stream (it was aborted, or rejected after the
//! stream began, e.g. an input too long): that is an error, not a normal stop. An event
//! `{"error": {...}}` is an error too. SGLang's `--incremental-streaming-output` mode (each
//! `text` holds only the new piece) is not the default and is not read here: its events would
//! count as output only when their piece is longer than the previous one; usage is still right.

use serde::{Deserialize, Deserializer};

use super::{finish_reason, is_done, Alarm, Batch, Count, FinishReason, Fold, Index, Name};
use super::{TextLen, Tracks, Verdict};

#[derive(Deserialize)]
struct Event {
    #[serde(default)]
    text: TextLen,
    #[serde(default)]
    index: Index,
    #[serde(default)]
    meta_info: Option<MetaInfo>,
    #[serde(default, deserialize_with = "Alarm::error_field")]
    error: Alarm,
}

#[derive(Deserialize)]
struct MetaInfo {
    #[serde(default)]
    completion_tokens: Count,
    #[serde(default)]
    prompt_tokens: Count,
    #[serde(default, deserialize_with = "finish")]
    finish_reason: Option<FinishReason>,
}

/// `finish_reason`: null, or an object whose `type` is the reason. `abort` is an error.
fn finish<'de, D: Deserializer<'de>>(d: D) -> Result<Option<FinishReason>, D::Error> {
    #[derive(Deserialize)]
    struct Reason<'a> {
        #[serde(default, borrow, rename = "type")]
        kind: Name<'a>,
    }
    let reason = Option::<Reason>::deserialize(d)?;
    Ok(reason.map(|r| match r.kind.0 {
        b"abort" => FinishReason::Error,
        name => finish_reason(name),
    }))
}

/// An SGLang stream: the running counts and text lengths of its sequences.
#[derive(Debug, Default)]
pub(in crate::parse) struct SgLang {
    tracks: Tracks,
}

impl SgLang {
    pub(super) fn event(&mut self, event_type: &[u8], data: &[u8]) -> Verdict {
        let base = Verdict {
            error: event_type == b"error",
            ..Verdict::default()
        };
        if is_done(data) {
            return Verdict { end: true, ..base };
        }
        let Ok(e) = serde_json::from_slice::<Event>(data) else {
            return base;
        };
        let index = e.index.0;
        let meta = e.meta_info.as_ref();
        let count = meta.and_then(|m| m.completion_tokens.0);
        let output = match (e.text.0, count) {
            (Some(len), _) => self.tracks.text_grew(index, len),
            (None, Some(n)) => n > self.tracks.latest(index).unwrap_or(0),
            (None, None) => false,
        };
        let tokens = count.and_then(|n| self.tracks.count(index, n, output));
        let finish = meta.and_then(|m| m.finish_reason);
        Verdict {
            output,
            content: output,
            end: finish.is_some(),
            error: base.error || e.error.0 || finish == Some(FinishReason::Error),
            finish,
            usage_output_tokens: count.map(|n| self.tracks.total().max(n)),
            usage_prompt_tokens: meta.and_then(|m| m.prompt_tokens.0),
            tokens,
        }
    }
}

/// A whole `/generate` answer: one result, or an array of them for a batch.
pub(super) fn body(body: &[u8]) -> Verdict {
    #[derive(Default)]
    struct All(Batch);
    impl From<All> for Batch {
        fn from(all: All) -> Batch {
            all.0
        }
    }
    impl Fold for All {
        type Item = Event;
        fn fold(&mut self, e: Event) {
            self.0.output |= e.text.0.is_some_and(|len| len > 0);
            self.0.error |= e.error.0;
            if let Some(m) = e.meta_info {
                if let Some(reason) = m.finish_reason {
                    self.0.error |= reason == FinishReason::Error;
                    self.0.finish = Some(reason);
                }
                self.0.count(m.completion_tokens.0, m.prompt_tokens.0);
            }
        }
    }
    Batch::read::<All>(body)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(text: &str, tokens: u64, finish: &str) -> String {
        format!(
            r#"{{"text":"{text}","output_ids":[1],"meta_info":{{"id":"a1","finish_reason":{finish},"prompt_tokens":6,"weight_version":"default","completion_tokens":{tokens},"cached_tokens":1,"cached_tokens_details":{{"device":1,"host":0}},"e2e_latency":0.05}}}}"#
        )
    }

    #[test]
    fn cumulative_text_and_counts() {
        let mut s = SgLang::default();
        let mut ev = |data: String| s.event(b"", data.as_bytes());
        let v = ev(chunk(" Paris", 1, "null"));
        assert!(v.output && v.content && !v.end);
        assert_eq!((v.tokens, v.usage_output_tokens), (None, Some(1)));
        assert_eq!(v.usage_prompt_tokens, Some(6));
        let v = ev(chunk(" Paris.", 2, "null"));
        assert_eq!(v.tokens, Some(1));
        // Two tokens in one event (speculative decoding).
        let v = ev(chunk(" Paris. It is", 4, "null"));
        assert_eq!(v.tokens, Some(2));
        // A token that adds no text (a partial character) is not output...
        let v = ev(chunk(" Paris. It is", 5, "null"));
        assert!(!v.output);
        // ...and shows with the next text.
        let v = ev(chunk(" Paris. It is \\u00e9", 6, "null"));
        assert_eq!(v.tokens, Some(2));
        let v = ev(chunk(
            " Paris. It is \\u00e9",
            7,
            r#"{"type":"stop","matched":128009}"#,
        ));
        assert!(!v.output && v.end && !v.error);
        assert_eq!(v.finish, Some(FinishReason::Stop));
        assert_eq!(v.usage_output_tokens, Some(7));
        assert!(ev("[DONE]".into()).end);
    }

    #[test]
    fn length_and_abort() {
        let v = SgLang::default().event(
            b"",
            chunk("abc", 3, r#"{"type":"length","length":3}"#).as_bytes(),
        );
        assert!(v.output && v.end);
        assert_eq!(v.finish, Some(FinishReason::Length));
        let v = SgLang::default().event(
            b"",
            chunk(
                "",
                0,
                r#"{"type":"abort","message":"The input is longer than the context length","status_code":400}"#,
            )
            .as_bytes(),
        );
        assert!(v.error && v.end && !v.output);
        assert_eq!(v.finish, Some(FinishReason::Error));
    }

    #[test]
    fn interleaved_sequences_have_their_own_counts() {
        let mut s = SgLang::default();
        let mut ev = |i: u64, text: &str, n: u64| {
            s.event(
                b"",
                format!(r#"{{"text":"{text}","index":{i},"meta_info":{{"completion_tokens":{n},"finish_reason":null}}}}"#)
                    .as_bytes(),
            )
        };
        assert!(ev(0, "a", 1).output);
        assert!(ev(1, "x", 1).output, "a new sequence starts from no text");
        assert_eq!(ev(0, "abc", 3).tokens, Some(2));
        let v = ev(1, "xy", 2);
        assert_eq!(v.tokens, Some(1));
        assert_eq!(v.usage_output_tokens, Some(5), "the sum over sequences");
    }

    #[test]
    fn errors() {
        let v = SgLang::default().event(b"", br#"{"error":{"message":"boom"}}"#);
        assert!(v.error);
    }

    #[test]
    fn whole_bodies() {
        let v = body(chunk(" Paris. It is", 32, r#"{"type":"length","length":32}"#).as_bytes());
        assert!(v.output && v.end);
        assert_eq!(v.usage_output_tokens, Some(32));
        assert_eq!(v.finish, Some(FinishReason::Length));
        let v = body(
            format!(
                "[{},{}]",
                chunk("a", 3, r#"{"type":"stop"}"#),
                chunk("b", 4, r#"{"type":"stop"}"#)
            )
            .as_bytes(),
        );
        assert_eq!(v.usage_output_tokens, Some(7));
    }
}
