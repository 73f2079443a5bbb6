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
//!
//! `meta_info` also says what explains the figures: `cached_tokens` (prompt tokens served from
//! the radix cache) and, in newer servers, `reasoning_tokens`, on every event; the final event
//! adds `e2e_latency` (seconds, from the request's arrival to its end) and, when the server runs
//! with `--enable-metrics`, `inference_time` (seconds, from its first forward pass to its end).
//! SGLang reports no queue time in the body (`tokenizer_manager.py`, `req_time_stats.py`).

use serde::{Deserialize, Deserializer};

use super::{finish_reason, is_done, update, Alarm, Batch, Count, Engine, EngineReport};
use super::{FinishReason, Fold, Index, Name, Seconds, TextLen, Tracks, Verdict};

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
    #[serde(default)]
    cached_tokens: Count,
    #[serde(default)]
    reasoning_tokens: Count,
    #[serde(default)]
    e2e_latency: Seconds,
    #[serde(default)]
    inference_time: Seconds,
}

impl MetaInfo {
    fn report(&self, report: &mut EngineReport) {
        update(&mut report.cached_tokens, self.cached_tokens.0);
        update(&mut report.reasoning_tokens, self.reasoning_tokens.0);
        if self.e2e_latency.0.is_some() || self.inference_time.0.is_some() {
            update(&mut report.total, self.e2e_latency.0);
            update(&mut report.inference, self.inference_time.0);
            report.source = Some(Engine::SgLang);
        }
    }
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
    pub(super) fn event(
        &mut self,
        event_type: &[u8],
        data: &[u8],
        report: &mut EngineReport,
    ) -> Verdict {
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
        if let Some(m) = meta {
            m.report(report);
        }
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

/// A whole `/generate` answer: one result, or an array of them for a batch. A batch's cached
/// and reasoning tokens add up; its times are those of the slowest result.
pub(super) fn body(body: &[u8], report: &mut EngineReport) -> Verdict {
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
                let mut one = EngineReport::default();
                m.report(&mut one);
                fold_report(&mut self.0.report, &one);
                if let Some(reason) = m.finish_reason {
                    self.0.error |= reason == FinishReason::Error;
                    self.0.finish = Some(reason);
                }
                self.0.count(m.completion_tokens.0, m.prompt_tokens.0);
            }
        }
    }
    Batch::read::<All>(body, report)
}

/// Adds one result's report to a batch's.
fn fold_report(all: &mut EngineReport, one: &EngineReport) {
    let add = |sum: Option<u64>, n: Option<u64>| match (sum, n) {
        (Some(sum), Some(n)) => Some(sum.saturating_add(n)),
        (sum, n) => sum.or(n),
    };
    all.cached_tokens = add(all.cached_tokens, one.cached_tokens);
    all.reasoning_tokens = add(all.reasoning_tokens, one.reasoning_tokens);
    all.total = all.total.max(one.total);
    all.inference = all.inference.max(one.inference);
    all.source = all.source.or(one.source);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One event read by a fresh stream.
    fn one(data: &str) -> Verdict {
        SgLang::default().event(b"", data.as_bytes(), &mut EngineReport::default())
    }

    fn body(json: &[u8]) -> Verdict {
        super::body(json, &mut EngineReport::default())
    }

    fn chunk(text: &str, tokens: u64, finish: &str) -> String {
        format!(
            r#"{{"text":"{text}","output_ids":[1],"meta_info":{{"id":"a1","finish_reason":{finish},"prompt_tokens":6,"weight_version":"default","completion_tokens":{tokens},"cached_tokens":1,"cached_tokens_details":{{"device":1,"host":0}},"e2e_latency":0.05}}}}"#
        )
    }

    #[test]
    fn cumulative_text_and_counts() {
        let mut s = SgLang::default();
        let mut report = EngineReport::default();
        let mut ev = |data: String| s.event(b"", data.as_bytes(), &mut report);
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
        let v = one(&chunk("abc", 3, r#"{"type":"length","length":3}"#));
        assert!(v.output && v.end);
        assert_eq!(v.finish, Some(FinishReason::Length));
        let v = one(&chunk(
            "",
            0,
            r#"{"type":"abort","message":"The input is longer than the context length","status_code":400}"#,
        ));
        assert!(v.error && v.end && !v.output);
        assert_eq!(v.finish, Some(FinishReason::Error));
    }

    #[test]
    fn interleaved_sequences_have_their_own_counts() {
        let mut s = SgLang::default();
        let mut report = EngineReport::default();
        let mut ev = |i: u64, text: &str, n: u64| {
            s.event(
                b"",
                format!(r#"{{"text":"{text}","index":{i},"meta_info":{{"completion_tokens":{n},"finish_reason":null}}}}"#)
                    .as_bytes(),
                &mut report,
            )
        };
        assert!(ev(0, "a", 1).output);
        assert!(ev(1, "x", 1).output, "a new sequence starts from no text");
        assert_eq!(ev(0, "abc", 3).tokens, Some(2));
        let v = ev(1, "xy", 2);
        assert_eq!(v.tokens, Some(1));
        assert_eq!(v.usage_output_tokens, Some(5), "the sum over sequences");
    }

    /// `meta_info`: cached and reasoning tokens on every event, the end-to-end latency and
    /// (with `--enable-metrics`) the inference time in seconds on the last.
    #[test]
    fn meta_info_reports_cache_and_timing() {
        let mut s = SgLang::default();
        let mut r = EngineReport::default();
        s.event(
            b"",
            br#"{"text":" Paris","output_ids":[12366],"meta_info":{"id":"a","finish_reason":null,"prompt_tokens":7,"reasoning_tokens":0,"completion_tokens":1,"cached_tokens":5}}"#,
            &mut r,
        );
        assert_eq!((r.cached_tokens, r.reasoning_tokens), (Some(5), Some(0)));
        assert_eq!(r.source, None, "no timing yet");
        s.event(
            b"",
            br#"{"text":" Paris.","output_ids":[13],"meta_info":{"id":"a","finish_reason":{"type":"stop","matched":128009},"prompt_tokens":7,"reasoning_tokens":0,"completion_tokens":2,"cached_tokens":5,"e2e_latency":0.0936,"request_received_ts":1760000000.5,"inference_time":0.061,"decode_throughput":42.1}}"#,
            &mut r,
        );
        assert_eq!(r.total, Some(std::time::Duration::from_micros(93_600)));
        assert_eq!(r.inference, Some(std::time::Duration::from_millis(61)));
        assert_eq!(r.source, Some(crate::parse::report::Engine::SgLang));
        assert_eq!((r.queue, r.prefill, r.decode), (None, None, None));
    }

    #[test]
    fn a_batch_adds_its_caches_and_keeps_its_slowest_time() {
        let mut r = EngineReport::default();
        super::body(
            br#"[{"text":"a","meta_info":{"finish_reason":{"type":"stop"},"completion_tokens":3,"cached_tokens":4,"e2e_latency":0.5}},{"text":"b","meta_info":{"finish_reason":{"type":"stop"},"completion_tokens":4,"cached_tokens":6,"e2e_latency":0.75}}]"#,
            &mut r,
        );
        assert_eq!(r.cached_tokens, Some(10));
        assert_eq!(r.total, Some(std::time::Duration::from_millis(750)));
        assert_eq!(r.source, Some(crate::parse::report::Engine::SgLang));
    }

    #[test]
    fn errors() {
        let v = one(r#"{"error":{"message":"boom"}}"#);
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
