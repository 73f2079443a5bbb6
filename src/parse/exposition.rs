//! An inference engine's state, read from the Prometheus text its `/metrics` serves: how many
//! requests it is running, how many wait, and how full its KV cache is.
//!
//! The gauges, by their real names:
//!
//! | engine | running | waiting | KV-cache usage (0..1) |
//! |---|---|---|---|
//! | vLLM | `vllm:num_requests_running` | `vllm:num_requests_waiting` | `vllm:kv_cache_usage_perc` (older: `vllm:gpu_cache_usage_perc`) |
//! | SGLang | `sglang:num_running_reqs` | `sglang:num_queue_reqs` | `sglang:token_usage` |
//! | TGI | `tgi_batch_current_size` | `tgi_queue_size` | none |
//! | llama.cpp | `llamacpp:requests_processing` | `llamacpp:requests_deferred` | `llamacpp:kv_cache_usage_ratio` (older servers only) |
//!
//! A gauge may come in several series: one per engine of a data-parallel vLLM (`engine="0"`,
//! `engine="1"`), per model, per SGLang data-parallel rank. Counts of requests add up over them;
//! but when SGLang reports one series per `priority` beside an aggregate with an empty
//! `priority=""` label, the aggregate alone counts (adding the buckets to it would count every
//! request twice). A usage ratio is never added up: the fullest series is taken, the pressure
//! the next request may meet. (SGLang exports the scheduler's gauges from one tensor-parallel
//! rank per data-parallel group by default; with `--enable-metrics-for-all-schedulers` every rank
//! repeats them and the counts here are that many times too large.)
//!
//! The text is read once, line by line, in place: nothing is allocated, comments (`# HELP`,
//! `# TYPE`, `# EOF`), timestamps and exemplars are skipped, a line that cannot be read is
//! ignored, and input over [`MAX_EXPOSITION_BYTES`] is refused whole rather than read in part.
//! Only the gauges of the first engine named in the text are read.

use std::fmt;

use super::report::Engine;

/// The most text [`engine_state`] reads. A vLLM with every histogram enabled serves well under
/// a megabyte; anything much larger is not a metrics page worth reading at every scrape.
pub const MAX_EXPOSITION_BYTES: usize = 4 << 20;

/// An engine's state at one scrape; `None` for what its text did not report.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct EngineState {
    /// The engine whose gauges were found; `None` when the text held none of them.
    pub engine: Option<Engine>,
    /// Requests being processed (in a running batch, in a slot).
    pub running: Option<f64>,
    /// Requests waiting for a place in a batch or a slot.
    pub waiting: Option<f64>,
    /// KV-cache usage, 0 (empty) to 1 (full).
    pub kv_usage: Option<f64>,
}

/// Why a metrics text was not read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExpositionError {
    /// The text is larger than [`MAX_EXPOSITION_BYTES`].
    TooLarge { bytes: usize, limit: usize },
}

impl fmt::Display for ExpositionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ExpositionError::TooLarge { bytes, limit } => {
                write!(
                    f,
                    "metrics text of {bytes} bytes is over the {limit}-byte limit"
                )
            }
        }
    }
}

impl std::error::Error for ExpositionError {}

/// What a gauge measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Quantity {
    Running,
    Waiting,
    Kv,
    /// A KV usage under an older name, read only when the current name is absent.
    KvFormerly,
}

/// The gauges read, by their exact names (`vllm:num_requests_waiting_by_reason` is not
/// `vllm:num_requests_waiting`).
const GAUGES: [(&[u8], Engine, Quantity); 12] = [
    (
        b"vllm:num_requests_running",
        Engine::Vllm,
        Quantity::Running,
    ),
    (
        b"vllm:num_requests_waiting",
        Engine::Vllm,
        Quantity::Waiting,
    ),
    (b"vllm:kv_cache_usage_perc", Engine::Vllm, Quantity::Kv),
    (
        b"vllm:gpu_cache_usage_perc",
        Engine::Vllm,
        Quantity::KvFormerly,
    ),
    (
        b"sglang:num_running_reqs",
        Engine::SgLang,
        Quantity::Running,
    ),
    (b"sglang:num_queue_reqs", Engine::SgLang, Quantity::Waiting),
    (b"sglang:token_usage", Engine::SgLang, Quantity::Kv),
    (b"tgi_batch_current_size", Engine::Tgi, Quantity::Running),
    (b"tgi_queue_size", Engine::Tgi, Quantity::Waiting),
    (
        b"llamacpp:requests_processing",
        Engine::LlamaCpp,
        Quantity::Running,
    ),
    (
        b"llamacpp:requests_deferred",
        Engine::LlamaCpp,
        Quantity::Waiting,
    ),
    (
        b"llamacpp:kv_cache_usage_ratio",
        Engine::LlamaCpp,
        Quantity::Kv,
    ),
];

/// Reads an engine's running and waiting requests and KV-cache usage from its `/metrics` text.
/// Text that names none of the known gauges reads as an [`EngineState`] with no engine.
pub fn engine_state(text: &[u8]) -> Result<EngineState, ExpositionError> {
    if text.len() > MAX_EXPOSITION_BYTES {
        return Err(ExpositionError::TooLarge {
            bytes: text.len(),
            limit: MAX_EXPOSITION_BYTES,
        });
    }
    let mut engine = None;
    let (mut running, mut waiting) = (Count::default(), Count::default());
    let (mut kv, mut kv_formerly) = (None::<f64>, None::<f64>);
    for line in text.split(|&b| b == b'\n') {
        let Some((gauge_engine, quantity, rest)) = gauge(line) else {
            continue;
        };
        if *engine.get_or_insert(gauge_engine) != gauge_engine {
            continue;
        }
        let Some(sample) = sample(rest) else {
            continue;
        };
        match quantity {
            Quantity::Running => running.add(sample),
            Quantity::Waiting => waiting.add(sample),
            Quantity::Kv => kv = Some(kv.map_or(sample.value, |m| m.max(sample.value))),
            Quantity::KvFormerly => {
                kv_formerly = Some(kv_formerly.map_or(sample.value, |m| m.max(sample.value)))
            }
        }
    }
    Ok(EngineState {
        engine,
        running: running.value(),
        waiting: waiting.value(),
        kv_usage: kv.or(kv_formerly),
    })
}

/// A count of requests over its series.
#[derive(Debug, Default)]
struct Count {
    all: Option<f64>,
    /// The series labelled `priority=""`: SGLang's aggregate over its priority buckets.
    aggregate: Option<f64>,
}

impl Count {
    fn add(&mut self, sample: Sample) {
        self.all = Some(self.all.unwrap_or(0.0) + sample.value);
        if sample.aggregate {
            self.aggregate = Some(self.aggregate.unwrap_or(0.0) + sample.value);
        }
    }

    fn value(&self) -> Option<f64> {
        self.aggregate.or(self.all)
    }
}

/// One sample line's value, and whether its series is a priority aggregate.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Sample {
    value: f64,
    aggregate: bool,
}

/// The gauge a line is a sample of, and the rest of the line after the name; `None` for
/// comments, blank lines and every other metric.
fn gauge(line: &[u8]) -> Option<(Engine, Quantity, &[u8])> {
    let line = line.trim_ascii_start();
    let name_len = line
        .iter()
        .position(|&b| !(b.is_ascii_alphanumeric() || b == b'_' || b == b':'))
        .unwrap_or(line.len());
    let (name, rest) = line.split_at(name_len);
    GAUGES
        .iter()
        .find(|(gauge, _, _)| *gauge == name)
        .map(|&(_, engine, quantity)| (engine, quantity, rest))
}

/// The labels and value that follow a gauge's name: `{a="b",priority=""} 3.0 1712345678000`.
/// `None` when the line is cut short or the value is not a finite non-negative number (a count
/// or a ratio cannot be negative; `NaN` reports nothing).
fn sample(rest: &[u8]) -> Option<Sample> {
    let (aggregate, rest) = match rest.first() {
        Some(b'{') => labels(rest.get(1..)?)?,
        _ => (false, rest),
    };
    let rest = rest.trim_ascii_start();
    let end = rest
        .iter()
        .position(u8::is_ascii_whitespace)
        .unwrap_or(rest.len());
    let value: f64 = std::str::from_utf8(rest.get(..end)?).ok()?.parse().ok()?;
    (value.is_finite() && value >= 0.0).then_some(Sample { value, aggregate })
}

/// Walks a label set from just after its `{` to just after its `}`, honouring quoted values with
/// escapes. Returns whether it holds an empty `priority` label, and what follows the set.
fn labels(mut rest: &[u8]) -> Option<(bool, &[u8])> {
    let mut aggregate = false;
    loop {
        rest = rest.trim_ascii_start();
        match rest.first()? {
            b'}' => return Some((aggregate, rest.get(1..)?)),
            b',' => {
                rest = rest.get(1..)?;
                continue;
            }
            _ => {}
        }
        let name_len = rest
            .iter()
            .position(|&b| !(b.is_ascii_alphanumeric() || b == b'_'))
            .unwrap_or(rest.len());
        let name = rest.get(..name_len)?;
        rest = rest.get(name_len..)?.trim_ascii_start();
        rest = rest.strip_prefix(b"=")?.trim_ascii_start();
        rest = rest.strip_prefix(b"\"")?;
        let value_len = quoted_len(rest)?;
        aggregate |= name == b"priority" && value_len == 0;
        // Past the value and its closing quote.
        rest = rest.get(value_len + 1..)?;
    }
}

/// The length of a quoted label value up to (not including) its closing quote, skipping
/// escaped characters; `None` if the line ends first.
fn quoted_len(value: &[u8]) -> Option<usize> {
    let mut i = 0;
    loop {
        match value.get(i)? {
            b'"' => return Some(i),
            b'\\' => i += 2,
            _ => i += 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(text: &str) -> EngineState {
        engine_state(text.as_bytes()).expect("within the limit")
    }

    #[test]
    fn counts_add_up_over_series_and_ratios_take_the_fullest() {
        let s = state(concat!(
            "vllm:num_requests_running{engine=\"0\",model_name=\"m\"} 4.0\n",
            "vllm:num_requests_running{engine=\"1\",model_name=\"m\"} 2.0\n",
            "vllm:num_requests_waiting{engine=\"0\",model_name=\"m\"} 1.0\n",
            "vllm:num_requests_waiting{engine=\"1\",model_name=\"m\"} 5.0\n",
            "vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"m\"} 0.25\n",
            "vllm:kv_cache_usage_perc{engine=\"1\",model_name=\"m\"} 0.5\n",
        ));
        assert_eq!(s.engine, Some(Engine::Vllm));
        assert_eq!(s.running, Some(6.0));
        assert_eq!(s.waiting, Some(6.0));
        assert_eq!(s.kv_usage, Some(0.5));
    }

    /// A series with a longer name that starts like a gauge's must never be added to it.
    #[test]
    fn names_match_exactly() {
        let s = state(concat!(
            "vllm:num_requests_waiting{engine=\"0\"} 2.0\n",
            "vllm:num_requests_waiting_by_reason{engine=\"0\",reason=\"capacity\"} 9.0\n",
            "vllm:num_requests_running_total 100\n",
            "xvllm:num_requests_running 7\n",
        ));
        assert_eq!(s.waiting, Some(2.0));
        assert_eq!(s.running, None);
    }

    /// SGLang with priority scheduling: one series per bucket and an aggregate with
    /// `priority=""`; the aggregate is the count, the buckets are not added to it.
    #[test]
    fn the_priority_aggregate_is_the_count() {
        let s = state(concat!(
            "sglang:num_running_reqs{engine_type=\"unified\",model_name=\"m\",tp_rank=\"0\",pp_rank=\"0\",priority=\"\"} 14\n",
            "sglang:num_running_reqs{engine_type=\"unified\",model_name=\"m\",tp_rank=\"0\",pp_rank=\"0\",priority=\"-1\"} 0\n",
            "sglang:num_running_reqs{engine_type=\"unified\",model_name=\"m\",tp_rank=\"0\",pp_rank=\"0\",priority=\"0\"} 14\n",
            "sglang:num_queue_reqs{engine_type=\"unified\",model_name=\"m\",tp_rank=\"0\",pp_rank=\"0\",priority=\"0\"} 3\n",
            "sglang:num_queue_reqs{engine_type=\"unified\",model_name=\"m\",tp_rank=\"0\",pp_rank=\"0\",priority=\"5\"} 2\n",
        ));
        assert_eq!(s.engine, Some(Engine::SgLang));
        assert_eq!(s.running, Some(14.0));
        assert_eq!(s.waiting, Some(5.0), "no aggregate: the buckets add up");
    }

    #[test]
    fn older_vllm_names_the_kv_usage_differently() {
        let s = state("vllm:gpu_cache_usage_perc{model_name=\"m\"} 0.3\n");
        assert_eq!(s.kv_usage, Some(0.3));
        let both = state(concat!(
            "vllm:gpu_cache_usage_perc{model_name=\"m\"} 0.3\n",
            "vllm:kv_cache_usage_perc{model_name=\"m\"} 0.4\n",
        ));
        assert_eq!(both.kv_usage, Some(0.4), "the current name wins");
    }

    #[test]
    fn comments_timestamps_exemplars_and_blanks_are_skipped() {
        let s = state(concat!(
            "# HELP tgi_queue_size Current queue size\n",
            "# TYPE tgi_queue_size gauge\n",
            "\n",
            "   \t\n",
            "# tgi_queue_size 99\n",
            "tgi_queue_size 3 1712345678000\r\n",
            "  tgi_batch_current_size{} 2 # {trace_id=\"abc\"} 1.0 1712345678.0\n",
            "# EOF\n",
        ));
        assert_eq!(s.engine, Some(Engine::Tgi));
        assert_eq!(s.waiting, Some(3.0));
        assert_eq!(s.running, Some(2.0));
        assert_eq!(s.kv_usage, None, "TGI has no KV gauge");
    }

    #[test]
    fn label_values_may_hold_anything_quoted() {
        let s = state(concat!(
            "vllm:num_requests_running{model_name=\"a \\\"b\\\" } {c}, d=\\\\\",engine=\"0\"} 3\n",
            "vllm:num_requests_running{model_name=\"\u{e9}t\u{e9}\"} 1\n",
            "vllm:num_requests_running{ model_name = \"x\" , } 1\n",
        ));
        assert_eq!(s.running, Some(5.0));
    }

    #[test]
    fn lines_that_cannot_be_read_are_ignored() {
        let s = state(concat!(
            "llamacpp:requests_processing 2\n",
            "llamacpp:requests_processing{slot=\"1\" 5\n",
            "llamacpp:requests_processing{slot=\"1} 5\n",
            "llamacpp:requests_processing{slot=1} 5\n",
            "llamacpp:requests_processing\n",
            "llamacpp:requests_processing NaN\n",
            "llamacpp:requests_processing +Inf\n",
            "llamacpp:requests_processing -1\n",
            "llamacpp:requests_processing 0x10\n",
            "llamacpp:requests_deferred 1e0\n",
        ));
        assert_eq!(s.engine, Some(Engine::LlamaCpp));
        assert_eq!(s.running, Some(2.0));
        assert_eq!(s.waiting, Some(1.0));
    }

    /// Dynamo-style pages carry several engines' metrics; the first engine named is read.
    #[test]
    fn one_engine_per_text() {
        let s = state(concat!(
            "sglang:num_queue_reqs 4\n",
            "vllm:num_requests_waiting 9\n",
            "vllm:num_requests_running 9\n",
        ));
        assert_eq!(s.engine, Some(Engine::SgLang));
        assert_eq!((s.running, s.waiting), (None, Some(4.0)));
    }

    #[test]
    fn unknown_text_has_no_engine() {
        for text in [
            "",
            "# HELP x\n",
            "process_cpu_seconds_total 3\n",
            "<html></html>",
        ] {
            assert_eq!(state(text), EngineState::default(), "{text:?}");
        }
        assert_eq!(
            engine_state(&[0xff, 0xfe, b'\n', 0x80]).expect("small"),
            EngineState::default()
        );
    }

    #[test]
    fn text_over_the_limit_is_refused() {
        let mut text = b"tgi_queue_size 1\n".to_vec();
        text.resize(MAX_EXPOSITION_BYTES + 1, b'\n');
        let err = engine_state(&text).expect_err("over the limit");
        assert_eq!(
            err,
            ExpositionError::TooLarge {
                bytes: MAX_EXPOSITION_BYTES + 1,
                limit: MAX_EXPOSITION_BYTES
            }
        );
        assert!(err.to_string().contains("limit"));
        text.truncate(MAX_EXPOSITION_BYTES);
        assert_eq!(state_of(&text).waiting, Some(1.0));
    }

    fn state_of(text: &[u8]) -> EngineState {
        engine_state(text).expect("within the limit")
    }
}
