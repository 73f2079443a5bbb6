//! The engine's own timing from its response headers: text-generation-inference (TGI) answers a
//! non-streaming request (`/generate`, `/`, and its OpenAI-compatible routes without `stream`)
//! with headers that say where the time went.
//!
//! From TGI's `router/src/server.rs` (`generate_internal`), in whole milliseconds as decimal
//! text: `x-total-time` (validation, queue and inference), `x-validation-time` (arrival to the
//! queue), `x-queue-time` (queued to the start of the batch that took it), `x-inference-time`
//! (that start to the last token: prefill and decode together, which TGI does not split) and
//! `x-time-per-token` (inference time over generated tokens); `x-compute-time` is the total in
//! seconds, with a fraction. A streamed answer (`/generate_stream`, `stream: true`) sends its
//! headers before any timing is known, so it carries none of these.
//!
//! Pure and allocation-free: the caller hands the headers over as `(name, value)` byte pairs, so
//! this floor needs no HTTP crate.

use std::time::Duration;

use super::report::{span, Engine, EngineReport};

/// Header values longer than this are not numbers any engine sends; they are ignored unread.
const MAX_VALUE_BYTES: usize = 32;

/// Reads an engine's timing headers into a report (`source` is the engine when any was found).
/// Header names are compared without regard to case; unknown headers and values that are not
/// non-negative decimal numbers are ignored. With `http`, the caller passes
/// `headers.iter().map(|(n, v)| (n.as_str(), v.as_bytes()))`.
pub fn engine_headers<I, N, V>(headers: I) -> EngineReport
where
    I: IntoIterator<Item = (N, V)>,
    N: AsRef<[u8]>,
    V: AsRef<[u8]>,
{
    let mut report = EngineReport::default();
    // `x-compute-time` only stands in for `x-total-time` when that is missing.
    let mut compute_time = None;
    let mut found = false;
    for (name, value) in headers {
        let name = name.as_ref();
        // Every header of interest starts with `x-`: most headers are rejected on two bytes.
        if !matches!(name, [b'x' | b'X', b'-', ..]) {
            continue;
        }
        let slot = if name.eq_ignore_ascii_case(b"x-queue-time") {
            &mut report.queue
        } else if name.eq_ignore_ascii_case(b"x-inference-time") {
            &mut report.inference
        } else if name.eq_ignore_ascii_case(b"x-validation-time") {
            &mut report.validation
        } else if name.eq_ignore_ascii_case(b"x-time-per-token") {
            &mut report.time_per_token
        } else if name.eq_ignore_ascii_case(b"x-total-time") {
            &mut report.total
        } else if name.eq_ignore_ascii_case(b"x-compute-time") {
            compute_time = number(value.as_ref(), 1).or(compute_time);
            continue;
        } else {
            continue;
        };
        if let Some(d) = number(value.as_ref(), 1_000) {
            *slot = Some(d);
            found = true;
        }
    }
    report.total = report.total.or(compute_time);
    // Told as it was read: comparing the report with an empty one was a dozen cache lines of
    // code on the way to every response's first byte.
    if found || compute_time.is_some() {
        report.source = Some(Engine::Tgi);
    }
    report
}

/// A header value as a count of `1/scale` seconds: ASCII decimal text, surrounding blanks
/// allowed.
fn number(value: &[u8], scale: u64) -> Option<Duration> {
    if value.len() > MAX_VALUE_BYTES {
        return None;
    }
    let text = std::str::from_utf8(value.trim_ascii()).ok()?;
    // Only plain decimals: `inf`, `nan` and the like are not numbers a server means.
    if !text.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        return None;
    }
    span(text, scale)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The headers of a real `/generate` answer, as TGI's `generate_internal` writes them.
    const TGI: [(&str, &str); 11] = [
        ("content-type", "application/json"),
        ("x-compute-type", "gpu+optimized"),
        ("x-compute-time", "1.502372"),
        ("x-compute-characters", "97"),
        ("x-total-time", "1502"),
        ("x-validation-time", "1"),
        ("x-queue-time", "217"),
        ("x-inference-time", "1283"),
        ("x-time-per-token", "64"),
        ("x-prompt-tokens", "23"),
        ("x-generated-tokens", "20"),
    ];

    #[test]
    fn tgi_generate_headers() {
        let r = engine_headers(TGI);
        assert_eq!(r.total, Some(Duration::from_millis(1502)));
        assert_eq!(r.validation, Some(Duration::from_millis(1)));
        assert_eq!(r.queue, Some(Duration::from_millis(217)));
        assert_eq!(r.inference, Some(Duration::from_millis(1283)));
        assert_eq!(r.time_per_token, Some(Duration::from_millis(64)));
        assert_eq!(r.source, Some(Engine::Tgi));
        // TGI does not split prefill from decode, and says nothing of caches.
        assert_eq!((r.prefill, r.decode, r.cached_tokens), (None, None, None));
    }

    #[test]
    fn compute_time_stands_in_for_a_missing_total() {
        let r = engine_headers([("X-Compute-Time", "0.25")]);
        assert_eq!(r.total, Some(Duration::from_millis(250)));
        let r = engine_headers([("x-compute-time", "0.25"), ("x-total-time", "300")]);
        assert_eq!(r.total, Some(Duration::from_millis(300)));
        let r = engine_headers([("x-total-time", "300"), ("x-compute-time", "0.25")]);
        assert_eq!(
            r.total,
            Some(Duration::from_millis(300)),
            "order does not matter"
        );
    }

    #[test]
    fn names_are_case_insensitive_and_values_may_be_padded() {
        let r = engine_headers([(b"X-Queue-Time".as_slice(), b" 7 ".as_slice())]);
        assert_eq!(r.queue, Some(Duration::from_millis(7)));
    }

    /// A streamed answer's headers, and anything else, report nothing and no engine.
    #[test]
    fn no_timing_headers_no_report() {
        let streamed = [
            ("x-compute-type", "gpu+optimized"),
            ("x-compute-characters", "97"),
            ("x-accel-buffering", "no"),
            ("content-type", "text/event-stream"),
        ];
        assert_eq!(engine_headers(streamed), EngineReport::default());
        assert_eq!(
            engine_headers(std::iter::empty::<(&[u8], &[u8])>()),
            EngineReport::default()
        );
    }

    #[test]
    fn odd_values_are_ignored() {
        let long = "1".repeat(MAX_VALUE_BYTES + 1);
        for bad in [
            "-5",
            "NaN",
            "inf",
            "1e3",
            "",
            "12ms",
            "\u{e9}",
            long.as_str(),
        ] {
            let r = engine_headers([("x-queue-time", bad)]);
            assert_eq!(r, EngineReport::default(), "{bad:?}");
        }
        let r = engine_headers([(b"x-queue-time".as_slice(), [0xff, b'1'].as_slice())]);
        assert_eq!(r, EngineReport::default());
    }
}
