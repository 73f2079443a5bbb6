//! What explains a request's figures, as the engine itself reported them: prompt tokens served
//! from cache, reasoning tokens, and the engine's own timing (queue, prefill, decode, load).
//!
//! The dialects fill an [`EngineReport`] in passing from the events that carry these facts (a
//! final usage, llama.cpp's `timings`, Ollama's `done` line, SGLang's `meta_info`), TGI's
//! response headers fill another ([`engine_headers`](fn@super::engine_headers)), and the recorder
//! writes them into the per-request record. Every figure is what an engine said, never a guess:
//! a field the engine did not report stays `None`. Which engine reports what is listed on each
//! field and, per engine, in the dialect files.

use std::fmt;
use std::time::Duration;

/// An inference engine whose own figures (timing in a response, gauges on `/metrics`) tokenmeter
/// knows how to read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Engine {
    LlamaCpp,
    Ollama,
    Tgi,
    Vllm,
    SgLang,
}

impl Engine {
    /// The name used in records and logs (`engine_source`).
    pub fn as_str(self) -> &'static str {
        match self {
            Engine::LlamaCpp => "llamacpp",
            Engine::Ollama => "ollama",
            Engine::Tgi => "tgi",
            Engine::Vllm => "vllm",
            Engine::SgLang => "sglang",
        }
    }
}

impl fmt::Display for Engine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What the engine said about one request beyond its output. Plain values; `None` is "not
/// reported". When a stream reports a figure more than once (usage on every chunk, llama.cpp's
/// `timings_per_token`), the latest report wins, as it does for the token counts.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct EngineReport {
    /// Prompt tokens served from a cache: OpenAI-style `usage.prompt_tokens_details.cached_tokens`
    /// (chat, completions; vLLM and SGLang when they are asked to report it, llama.cpp), the
    /// Responses API's `usage.input_tokens_details.cached_tokens`, Anthropic's
    /// `cache_read_input_tokens`, llama.cpp's `timings.cache_n`, SGLang's `meta_info.cached_tokens`,
    /// DeepSeek's `usage.prompt_cache_hit_tokens`.
    pub cached_tokens: Option<u64>,
    /// Prompt tokens written to a cache for later requests: Anthropic's
    /// `cache_creation_input_tokens`.
    pub cache_creation_tokens: Option<u64>,
    /// Output tokens spent on reasoning: `usage.completion_tokens_details.reasoning_tokens`, the
    /// Responses API's `usage.output_tokens_details.reasoning_tokens`, SGLang's
    /// `usage.reasoning_tokens` and `meta_info.reasoning_tokens`.
    pub reasoning_tokens: Option<u64>,
    /// Prompt tokens the engine actually processed, cache hits excluded: llama.cpp's
    /// `timings.prompt_n`.
    pub prompt_processed: Option<u64>,
    /// Time the request waited in the engine's queue: TGI's `x-queue-time`.
    pub queue: Option<Duration>,
    /// Time the engine spent on the prompt: llama.cpp's `timings.prompt_ms`, Ollama's
    /// `prompt_eval_duration`.
    pub prefill: Option<Duration>,
    /// Time the engine spent generating: llama.cpp's `timings.predicted_ms`, Ollama's
    /// `eval_duration`.
    pub decode: Option<Duration>,
    /// Time in the engine after its queue, prefill and decode together, for engines that do not
    /// split them: TGI's `x-inference-time` (from the batch that took the request to its last
    /// token), SGLang's `meta_info.inference_time` (with `--enable-metrics`).
    pub inference: Option<Duration>,
    /// Time the engine spent validating and tokenizing the request: TGI's `x-validation-time`.
    pub validation: Option<Duration>,
    /// The engine's own mean time per output token: TGI's `x-time-per-token`.
    pub time_per_token: Option<Duration>,
    /// Time spent loading the model for this request (large when it was cold): Ollama's
    /// `load_duration`.
    pub load: Option<Duration>,
    /// The engine's whole time for the request: Ollama's `total_duration`, TGI's `x-total-time`,
    /// SGLang's `meta_info.e2e_latency`.
    pub total: Option<Duration>,
    /// The engine whose own timing (or processed-prompt count) is in this report; `None` when
    /// it holds only usage counts, which OpenAI-style servers all report alike.
    pub source: Option<Engine>,
}

impl EngineReport {
    /// Whether nothing was reported.
    pub fn is_empty(&self) -> bool {
        *self == EngineReport::default()
    }

    /// Each figure of `self` where it has one, else `other`'s: how the stream's report and the
    /// response headers' report combine.
    pub fn or(self, other: EngineReport) -> EngineReport {
        EngineReport {
            cached_tokens: self.cached_tokens.or(other.cached_tokens),
            cache_creation_tokens: self.cache_creation_tokens.or(other.cache_creation_tokens),
            reasoning_tokens: self.reasoning_tokens.or(other.reasoning_tokens),
            prompt_processed: self.prompt_processed.or(other.prompt_processed),
            queue: self.queue.or(other.queue),
            prefill: self.prefill.or(other.prefill),
            decode: self.decode.or(other.decode),
            inference: self.inference.or(other.inference),
            validation: self.validation.or(other.validation),
            time_per_token: self.time_per_token.or(other.time_per_token),
            load: self.load.or(other.load),
            total: self.total.or(other.total),
            source: self.source.or(other.source),
        }
    }
}

/// `raw` (a JSON number, a header value) as a count of `1/scale` seconds; `scale` divides 10^9.
/// Anything that is not a finite non-negative number is no duration. Whole numbers are read
/// exactly: nanoseconds do not survive a trip through a float beyond 104 days' worth.
pub(super) fn span(raw: &str, scale: u64) -> Option<Duration> {
    if let Ok(n) = raw.parse::<u64>() {
        let scale = scale.clamp(1, 1_000_000_000);
        // `n % scale < scale <= 10^9`, so the nanosecond part fits a `u32`.
        let nanos = (n % scale).saturating_mul(1_000_000_000 / scale);
        return Some(Duration::new(n / scale, u32::try_from(nanos).ok()?));
    }
    match raw.parse::<f64>() {
        Ok(f) if f.is_finite() && f >= 0.0 => Duration::try_from_secs_f64(f / scale as f64).ok(),
        _ => None,
    }
}

/// Replaces `slot` with `value` when there is one: the latest report wins, an event that does
/// not carry a figure leaves it alone.
pub(super) fn update<T>(slot: &mut Option<T>, value: Option<T>) {
    if value.is_some() {
        *slot = value;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engine_names_are_stable() {
        let all = [
            (Engine::LlamaCpp, "llamacpp"),
            (Engine::Ollama, "ollama"),
            (Engine::Tgi, "tgi"),
            (Engine::Vllm, "vllm"),
            (Engine::SgLang, "sglang"),
        ];
        for (engine, name) in all {
            assert_eq!(engine.as_str(), name);
            assert_eq!(engine.to_string(), name);
        }
    }

    #[test]
    fn or_prefers_the_first_report_field_by_field() {
        let stream = EngineReport {
            cached_tokens: Some(3),
            prefill: Some(Duration::from_millis(5)),
            ..EngineReport::default()
        };
        let headers = EngineReport {
            cached_tokens: Some(9),
            queue: Some(Duration::from_millis(7)),
            source: Some(Engine::Tgi),
            ..EngineReport::default()
        };
        let both = stream.or(headers);
        assert_eq!(both.cached_tokens, Some(3));
        assert_eq!(both.prefill, Some(Duration::from_millis(5)));
        assert_eq!(both.queue, Some(Duration::from_millis(7)));
        assert_eq!(both.source, Some(Engine::Tgi));
        assert!(!both.is_empty());
        assert!(EngineReport::default().is_empty());
    }

    #[test]
    fn spans_are_exact_for_whole_numbers_and_lenient_otherwise() {
        assert_eq!(
            span("130079000", 1_000_000_000),
            Some(Duration::from_nanos(130_079_000))
        );
        assert_eq!(span("48.312", 1_000), Some(Duration::from_micros(48_312)));
        assert_eq!(span("12", 1_000), Some(Duration::from_millis(12)));
        assert_eq!(span("0.25", 1), Some(Duration::from_millis(250)));
        assert_eq!(span("1e3", 1_000), Some(Duration::from_secs(1)));
        assert_eq!(
            span("18446744073709551615", 1_000_000_000),
            Some(Duration::from_nanos(u64::MAX))
        );
        for bad in ["-1", "NaN", "inf", "1e400", "\"3\"", "null", "", "{}"] {
            assert_eq!(span(bad, 1_000), None, "{bad}");
        }
        assert_eq!(span("1e300", 1), None, "too long for a Duration");
    }

    #[test]
    fn update_keeps_what_an_event_did_not_carry() {
        let mut slot = Some(4);
        update(&mut slot, None);
        assert_eq!(slot, Some(4));
        update(&mut slot, Some(6));
        assert_eq!(slot, Some(6));
    }
}
