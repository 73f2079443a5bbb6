//! llama.cpp server's native API: `/completion` (also `/completions` without `/v1`, and
//! `/infill`), SSE `data: {...}` events or one JSON body. Its OpenAI-compatible routes are plain
//! OpenAI chat and completions.
//!
//! An event carries output (and content) when its `content` is non-empty; a prompt-progress or
//! held-back event has empty content. The end marker is an event with `stop: true`, whose
//! `stop_type` gives the finish (`eos` and `word` are `stop`, `limit` is `length`). The output
//! count is `tokens_predicted` (else `timings.predicted_n`), the prompt count `tokens_evaluated`
//! (else `timings.prompt_n`). Current servers put the running `tokens_predicted` on every event,
//! so the tokens of an output event are its growth since the last output event of the same
//! `index` (several prompts stream interleaved); the count of a stream is the sum over indexes.
//! An event `{"error": {...}}` is an error.
//!
//! The final event (and every event with `timings_per_token`) carries the server's `timings`:
//! `cache_n` prompt tokens were served from the slot's cache, `prompt_n` were processed in
//! `prompt_ms`, and generation took `predicted_ms`. They go into the engine report; the latest
//! wins, so a batch of prompts reports the last one to finish.

use serde::Deserialize;

use super::{Alarm, Count, EngineReport, Finish, Flag, Index, Shape, Timings, Tracks, Verdict};

#[derive(Deserialize)]
struct Event {
    #[serde(default)]
    index: Index,
    #[serde(default)]
    content: Shape,
    #[serde(default)]
    stop: Flag,
    #[serde(default)]
    stop_type: Finish,
    #[serde(default)]
    tokens_predicted: Count,
    #[serde(default)]
    tokens_evaluated: Count,
    #[serde(default)]
    timings: Option<Timings>,
    #[serde(default, deserialize_with = "Alarm::error_field")]
    error: Alarm,
}

impl Event {
    fn predicted(&self) -> Option<u64> {
        self.tokens_predicted
            .0
            .or_else(|| self.timings.as_ref().and_then(|t| t.predicted_n.0))
    }

    fn prompt(&self) -> Option<u64> {
        self.tokens_evaluated
            .0
            .or_else(|| self.timings.as_ref().and_then(|t| t.prompt_n.0))
    }

    fn verdict(&self, report: &mut EngineReport) -> Verdict {
        if let Some(t) = &self.timings {
            t.report(report);
        }
        let output = self.content.filled();
        let stop = self.stop.0;
        Verdict {
            output,
            content: output,
            end: stop,
            error: self.error.0,
            // `none` is what a stopped event says when no reason applies.
            finish: if stop { self.stop_type.0 } else { None },
            usage_output_tokens: self.predicted(),
            usage_prompt_tokens: self.prompt(),
            tokens: None,
        }
    }
}

/// A llama.cpp stream: the running counts of its prompts.
#[derive(Debug, Default)]
pub(in crate::parse) struct LlamaCpp {
    tracks: Tracks,
}

impl LlamaCpp {
    pub(super) fn event(
        &mut self,
        event_type: &[u8],
        data: &[u8],
        report: &mut EngineReport,
    ) -> Verdict {
        let Ok(e) = serde_json::from_slice::<Event>(data) else {
            return Verdict {
                error: event_type == b"error",
                ..Verdict::default()
            };
        };
        let mut v = e.verdict(report);
        v.error |= event_type == b"error";
        if let Some(count) = e.predicted() {
            v.tokens = self.tracks.count(e.index.0, count, v.output);
            v.usage_output_tokens = Some(self.tracks.total().max(count));
        }
        v
    }
}

/// A whole `/completion` answer.
pub(super) fn body(body: &[u8], report: &mut EngineReport) -> Verdict {
    match serde_json::from_slice::<Event>(body) {
        Ok(e) => Verdict {
            end: true,
            ..e.verdict(report)
        },
        Err(_) => Verdict::default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse::event::FinishReason;

    /// One event read by a fresh stream.
    fn ev(data: &str) -> Verdict {
        LlamaCpp::default().event(b"", data.as_bytes(), &mut EngineReport::default())
    }

    #[test]
    fn stream_events() {
        let mut s = LlamaCpp::default();
        let mut report = EngineReport::default();
        let mut ev = |data: &str| s.event(b"", data.as_bytes(), &mut report);
        let v = ev(
            r#"{"index":0,"content":"Hello","tokens":[15043],"stop":false,"id_slot":0,"tokens_predicted":1,"tokens_evaluated":6}"#,
        );
        assert!(v.output && v.content && !v.end);
        assert_eq!(v.tokens, None, "no earlier count");
        assert_eq!(v.usage_prompt_tokens, Some(6));
        // A held-back token: empty content, the count still grows.
        let v = ev(
            r#"{"index":0,"content":"","tokens":[1919],"stop":false,"id_slot":0,"tokens_predicted":2,"tokens_evaluated":6}"#,
        );
        assert!(!v.output);
        let v = ev(
            r#"{"index":0,"content":" world!","tokens":[3186],"stop":false,"id_slot":0,"tokens_predicted":3,"tokens_evaluated":6}"#,
        );
        assert_eq!(
            v.tokens,
            Some(2),
            "the held-back token shows with this text"
        );
        let v = ev(
            r#"{"index":0,"content":"","tokens":[],"id_slot":0,"stop":true,"model":"gpt-3.5-turbo","tokens_predicted":4,"tokens_evaluated":6,"generation_settings":{"n_predict":-1,"samplers":["top_k"]},"prompt":"<s> Hi","has_new_line":false,"truncated":false,"stop_type":"eos","stopping_word":"","tokens_cached":9,"timings":{"prompt_n":6,"prompt_ms":20.1,"predicted_n":4,"predicted_ms":40.2}}"#,
        );
        assert!(!v.output && v.end);
        assert_eq!(v.finish, Some(FinishReason::Stop));
        assert_eq!(v.usage_output_tokens, Some(4));
    }

    #[test]
    fn stop_types() {
        for (name, want) in [
            ("eos", FinishReason::Stop),
            ("word", FinishReason::Stop),
            ("limit", FinishReason::Length),
            ("none", FinishReason::Other),
        ] {
            let v = ev(&format!(
                r#"{{"content":"","stop":true,"stop_type":"{name}","tokens_predicted":8}}"#
            ));
            assert_eq!(v.finish, Some(want), "{name}");
        }
    }

    #[test]
    fn older_servers_count_in_timings() {
        let v = ev(
            r#"{"content":"","stop":true,"stop_type":"limit","timings":{"predicted_n":16,"prompt_n":4}}"#,
        );
        assert_eq!(
            (v.usage_output_tokens, v.usage_prompt_tokens),
            (Some(16), Some(4))
        );
    }

    #[test]
    fn errors() {
        let v = ev(
            r#"{"error":{"code":500,"message":"the request exceeds the available context size","type":"exceed_context_size_error"}}"#,
        );
        assert!(v.error && !v.output);
    }

    /// The final event's `timings` (current servers add `cache_n`); with `timings_per_token`
    /// every event has them and the last wins.
    #[test]
    fn timings_report_cache_prefill_and_decode() {
        let mut s = LlamaCpp::default();
        let mut r = EngineReport::default();
        s.event(
            b"",
            br#"{"index":0,"content":"Hi","tokens":[1],"stop":false,"id_slot":0,"tokens_predicted":1,"tokens_evaluated":40,"timings":{"cache_n":32,"prompt_n":8,"prompt_ms":50.5,"prompt_per_token_ms":6.3,"prompt_per_second":158.4,"predicted_n":1,"predicted_ms":0.001,"predicted_per_token_ms":0,"predicted_per_second":0}}"#,
            &mut r,
        );
        assert_eq!(r.decode, Some(std::time::Duration::from_micros(1)));
        s.event(
            b"",
            br#"{"index":0,"content":"","tokens":[],"id_slot":0,"stop":true,"model":"m","tokens_predicted":4,"tokens_evaluated":40,"stop_type":"eos","stopping_word":"","tokens_cached":43,"timings":{"cache_n":32,"prompt_n":8,"prompt_ms":50.5,"prompt_per_token_ms":6.3,"prompt_per_second":158.4,"predicted_n":4,"predicted_ms":75.25,"predicted_per_token_ms":25.08,"predicted_per_second":39.87}}"#,
            &mut r,
        );
        assert_eq!(r.cached_tokens, Some(32), "cache_n, not tokens_cached");
        assert_eq!(r.prompt_processed, Some(8));
        assert_eq!(r.prefill, Some(std::time::Duration::from_micros(50_500)));
        assert_eq!(r.decode, Some(std::time::Duration::from_micros(75_250)));
        assert_eq!(r.source, Some(crate::parse::report::Engine::LlamaCpp));
        // Events without timings report nothing.
        let mut r = EngineReport::default();
        LlamaCpp::default().event(
            b"",
            br#"{"index":0,"content":"Hi","tokens":[1],"stop":false,"tokens_predicted":1}"#,
            &mut r,
        );
        assert!(r.is_empty());
    }

    #[test]
    fn whole_body() {
        let v = body(
            br#"{"index":0,"content":"Paris.","tokens":[],"id_slot":0,"stop":true,"tokens_predicted":3,"tokens_evaluated":8,"stop_type":"eos","timings":{"predicted_n":3}}"#,
            &mut EngineReport::default(),
        );
        assert!(v.output && v.content && v.end);
        assert_eq!(v.usage_output_tokens, Some(3));
        assert_eq!(v.finish, Some(FinishReason::Stop));
    }
}
