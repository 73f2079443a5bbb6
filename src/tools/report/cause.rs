//! Why one request was slow, in words: each cause the record can support, with the figures that
//! support it and the route's typical values beside them, ranked by how many milliseconds the
//! cause plausibly added. A cause is named only from the record's own fields and its route's
//! distribution; where the fields cannot tell, the answer is "unknown", never a guess.
//!
//! "The route" here is the record's route and model: a route serving two models has two
//! typical speeds.
//!
//! This module reads only a record and its route's [`Baseline`]; the analysis builds the
//! baseline and calls it, never the other way round.

use serde::Serialize;

use super::figures::{ms, Spread};
use super::read::{Fields, Request};

/// A queue is a cause when it took at least this long ...
const QUEUE_FLOOR_MS: f64 = 20.0;
/// ... and at least this share of the request's TTFT.
const QUEUE_SHARE_OF_TTFT: f64 = 0.25;
/// Without a queue figure, a TTFT this many times the typical one, with more requests in
/// flight than usual, is read as queueing.
const SLOW_TTFT_FACTOR: f64 = 1.5;
/// Prefill counts as long from twice the route's median and at least this long.
const PREFILL_FLOOR_MS: f64 = 20.0;
/// Loading the model for this long means it was cold (a warm Ollama reports a few ms).
const COLD_LOAD_MS: f64 = 250.0;
/// The route's median share of prompt tokens served from cache counts as "others hit" from here.
const HIGH_CACHED_SHARE: f64 = 0.3;
/// A gap between tokens is a stall from this many times the route's p99 TPOT ...
const STALL_FACTOR: f64 = 3.0;
/// ... and this long.
const STALL_FLOOR_MS: f64 = 50.0;
/// The proxy's share or the connect time is large from this many times the route's median ...
const OVERHEAD_FACTOR: f64 = 5.0;
/// ... and this long (proxy share, connect).
const PROXY_FLOOR_MS: f64 = 10.0;
const CONNECT_FLOOR_MS: f64 = 20.0;

/// One likely cause of a request's latency.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Cause {
    /// One of: `failed`, `queued`, `long prompt`, `long answer`, `cold model`, `no cache hit`,
    /// `stall`, `proxy or connection`, `unknown`.
    pub cause: &'static str,
    /// About how many milliseconds it added, where the record lets that be estimated; the
    /// ranking key.
    pub ms: Option<f64>,
    /// The figures behind it, in words.
    pub evidence: String,
}

impl std::fmt::Display for Cause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.cause, self.evidence)
    }
}

/// What is typical on one route and model, for comparing a request against.
#[derive(Clone, Debug, Default)]
pub struct Baseline {
    /// The last concurrency level before the bend (in flight on the route at arrival).
    pub knee: Option<u64>,
    pub in_flight_p50: Option<f64>,
    /// Median TTFT of successful requests at or below the bend (all of them without one):
    /// what a request that did not queue waits.
    pub typical_ttft: Option<f64>,
    pub prompt: Spread,
    pub output: Spread,
    pub tpot: Spread,
    pub prefill: Spread,
    pub proxy_p50: Option<f64>,
    pub connect_p50: Option<f64>,
    pub cached_share_p50: Option<f64>,
}

/// A count that may have come as a float (engine gauges): no decimals when whole.
fn count(value: f64) -> String {
    if value.fract() == 0.0 {
        format!("{value:.0}")
    } else {
        format!("{value:.1}")
    }
}

/// The likely causes of `request`'s latency, most telling first; `unknown` when none shows.
pub fn explain(request: &Request, baseline: &Baseline) -> Vec<Cause> {
    let f = &request.fields;
    let mut found: Vec<Cause> = [
        queued(f, baseline),
        long_prompt(f, baseline),
        long_answer(f, baseline),
        cold_model(f),
        no_cache_hit(f, baseline),
        stall(f, baseline),
        overhead(f, baseline),
    ]
    .into_iter()
    .flatten()
    .collect();
    // Larger estimated cost first; a cause whose cost cannot be estimated after those.
    found.sort_by(|a, b| match (a.ms, b.ms) {
        (Some(x), Some(y)) => y.total_cmp(&x),
        (Some(_), None) => std::cmp::Ordering::Less,
        (None, Some(_)) => std::cmp::Ordering::Greater,
        (None, None) => std::cmp::Ordering::Equal,
    });
    // A failure says most about the request, whatever else was slow.
    if !request.ok() {
        found.insert(0, failed(f));
    }
    if found.is_empty() {
        found.push(unknown(f, baseline));
    }
    found
}

/// Why a request failed, in words: its outcome, status and the proxy's reason.
pub fn failure(f: &Fields) -> String {
    let mut parts = vec![format!(
        "outcome {}",
        f.outcome.as_deref().unwrap_or("unknown")
    )];
    if let Some(status) = f.status {
        parts.push(format!("status {status}"));
    }
    if let Some(reason) = f.reason.as_deref().filter(|r| !r.is_empty()) {
        parts.push(reason.to_string());
    }
    parts.join(", ")
}

fn failed(f: &Fields) -> Cause {
    Cause {
        cause: "failed",
        ms: None,
        evidence: failure(f),
    }
}

fn queued(f: &Fields, b: &Baseline) -> Option<Cause> {
    let slow_ttft = match (f.ttft_ms, b.typical_ttft) {
        (Some(t), Some(typical)) => t > typical * SLOW_TTFT_FACTOR,
        _ => false,
    };
    let crowded = f.in_flight.filter(|&n| match b.knee {
        Some(k) => n > k as i64,
        None => b.in_flight_p50.is_some_and(|m| n as f64 > m) && slow_ttft,
    });
    let waiting = f.engine_waiting.filter(|&w| w > 0.0);
    let long_queue = f
        .queue_ms
        .filter(|&q| q >= QUEUE_FLOOR_MS && f.ttft_ms.is_none_or(|t| q >= t * QUEUE_SHARE_OF_TTFT));
    // A measured queue decides; the crowd at arrival and the engine's gauge (sampled, so
    // possibly stale) only speak when there is no queue figure.
    let queued = match f.queue_ms {
        Some(_) => long_queue.is_some(),
        None => crowded.is_some() || waiting.is_some(),
    };
    if !queued {
        return None;
    }
    let mut parts = Vec::new();
    if let Some(n) = f.in_flight {
        let mut context = Vec::new();
        if let Some(m) = b.in_flight_p50 {
            context.push(format!("route median {}", count(m.round())));
        }
        if let Some(k) = b.knee {
            context.push(format!("bend at {k}"));
        }
        if context.is_empty() {
            parts.push(format!("{n} in flight at arrival"));
        } else {
            parts.push(format!("{n} in flight at arrival ({})", context.join(", ")));
        }
    }
    if let Some(w) = waiting {
        parts.push(format!("engine waiting {}", count(w)));
    }
    let estimate = match f.queue_ms {
        Some(q) => {
            let source = f.queue_source.as_deref().unwrap_or("reported");
            parts.push(format!("queue {} ({source})", ms(q)));
            Some(q)
        }
        None => {
            let excess = match (f.ttft_ms, b.typical_ttft) {
                (Some(t), Some(typical)) => {
                    parts.push(format!("TTFT {} against {} typical", ms(t), ms(typical)));
                    Some((t - typical).max(0.0))
                }
                _ => None,
            };
            excess
        }
    };
    Some(Cause {
        cause: "queued",
        ms: estimate,
        evidence: parts.join(", "),
    })
}

fn long_prompt(f: &Fields, b: &Baseline) -> Option<Cause> {
    let prompt = f.prompt_tokens.map(|p| p as f64);
    let by_tokens = match (prompt, b.prompt.p95, b.prompt.p50) {
        (Some(p), Some(p95), Some(p50)) => p >= p95 && p > p50,
        _ => false,
    };
    let by_prefill = match (f.engine_prefill_ms, b.prefill.p95, b.prefill.p50) {
        (Some(t), Some(p95), Some(p50)) => t >= p95 && t >= 2.0 * p50 && t >= PREFILL_FLOOR_MS,
        _ => false,
    };
    if !(by_tokens || by_prefill) {
        return None;
    }
    let mut parts = Vec::new();
    if let (Some(p), Some(p95), Some(p50)) = (prompt, b.prompt.p95, b.prompt.p50) {
        parts.push(format!(
            "{p:.0} prompt tokens (route p95 {p95:.0}, median {p50:.0})"
        ));
    }
    let estimate = match (f.engine_prefill_ms, b.prefill.p50) {
        (Some(t), Some(p50)) => {
            parts.push(format!("prefill {} (route median {})", ms(t), ms(p50)));
            Some((t - p50).max(0.0))
        }
        // Without the engine's prefill time: prefill grows about linearly with the prompt.
        _ => match (prompt, b.prompt.p50, b.typical_ttft) {
            (Some(p), Some(p50), Some(typical)) if p50 > 0.0 => {
                Some((typical * (p / p50 - 1.0)).max(0.0))
            }
            _ => None,
        },
    };
    Some(Cause {
        cause: "long prompt",
        ms: estimate,
        evidence: parts.join(", "),
    })
}

fn long_answer(f: &Fields, b: &Baseline) -> Option<Cause> {
    let output = f.output_tokens? as f64;
    let (p95, p50) = (b.output.p95?, b.output.p50?);
    if !(output >= p95 && output > p50) {
        return None;
    }
    let mut evidence = format!("{output:.0} output tokens (route p95 {p95:.0}, median {p50:.0})");
    let estimate = b.tpot.p50.map(|tpot| (output - p50) * tpot);
    if let Some(extra) = estimate {
        evidence.push_str(&format!(", ~{} more decoding", ms(extra)));
    }
    Some(Cause {
        cause: "long answer",
        ms: estimate,
        evidence,
    })
}

fn cold_model(f: &Fields) -> Option<Cause> {
    let load = f.engine_load_ms.filter(|&l| l >= COLD_LOAD_MS)?;
    Some(Cause {
        cause: "cold model",
        ms: Some(load),
        evidence: format!("the engine spent {} loading the model", ms(load)),
    })
}

fn no_cache_hit(f: &Fields, b: &Baseline) -> Option<Cause> {
    let share = b.cached_share_p50.filter(|&s| s >= HIGH_CACHED_SHARE)?;
    let prompt = f.prompt_tokens.filter(|&p| p > 0)?;
    if f.cached_tokens.is_some_and(|c| c > 0) {
        return None;
    }
    let cached = f
        .cached_tokens
        .map_or_else(|| "none reported".to_string(), |c| c.to_string());
    let estimate = match (f.engine_prefill_ms, b.prefill.p50, b.typical_ttft) {
        (Some(t), Some(p50), _) => Some((t - p50).max(0.0)),
        (None, _, Some(typical)) => Some(typical * share),
        _ => None,
    };
    Some(Cause {
        cause: "no cache hit",
        ms: estimate,
        evidence: format!(
            "{cached} of {prompt} prompt tokens cached (route median {:.0} %)",
            share * 100.0
        ),
    })
}

fn stall(f: &Fields, b: &Baseline) -> Option<Cause> {
    let gap = f.max_itl_ms?;
    let p99 = b.tpot.p99?;
    if !(gap >= p99 * STALL_FACTOR && gap >= STALL_FLOOR_MS) {
        return None;
    }
    Some(Cause {
        cause: "stall",
        ms: Some((gap - b.tpot.p50.unwrap_or(0.0)).max(0.0)),
        evidence: format!(
            "the stream stopped for {} mid-answer (route p99 TPOT {})",
            ms(gap),
            ms(p99)
        ),
    })
}

fn overhead(f: &Fields, b: &Baseline) -> Option<Cause> {
    let large = |value: Option<f64>, median: Option<f64>, floor: f64| {
        value.filter(|&v| v >= floor && median.is_none_or(|m| v >= m * OVERHEAD_FACTOR))
    };
    let proxy = large(f.proxy_ms, b.proxy_p50, PROXY_FLOOR_MS);
    let connect = large(f.connect_ms, b.connect_p50, CONNECT_FLOOR_MS);
    let retries = f.retries.filter(|&r| r > 0);
    if proxy.is_none() && connect.is_none() && retries.is_none() {
        return None;
    }
    let mut parts = Vec::new();
    if let Some(p) = proxy {
        let median = b
            .proxy_p50
            .map_or(String::new(), |m| format!(" (route median {})", ms(m)));
        parts.push(format!("the proxy's own share {}{median}", ms(p)));
    }
    if let Some(c) = connect {
        let kind = f.upstream_conn.as_deref().unwrap_or("new");
        parts.push(format!("connecting took {} ({kind} connection)", ms(c)));
    }
    if let Some(r) = retries {
        parts.push(format!(
            "{r} upstream {}",
            if r == 1 { "retry" } else { "retries" }
        ));
    }
    let estimate = match (proxy, connect) {
        (None, None) => None,
        (p, c) => Some(p.unwrap_or(0.0) + c.unwrap_or(0.0)),
    };
    Some(Cause {
        cause: "proxy or connection",
        ms: estimate,
        evidence: parts.join(", "),
    })
}

fn unknown(f: &Fields, b: &Baseline) -> Cause {
    let explains = [
        f.queue_ms,
        f.engine_waiting,
        f.engine_prefill_ms,
        f.proxy_ms,
        f.connect_ms,
    ];
    let evidence = if explains.iter().all(Option::is_none) && f.in_flight.is_none() {
        "the record has no queue, engine, concurrency or connection figures to tell".to_string()
    } else {
        let mut parts = Vec::new();
        if let (Some(t), Some(typical)) = (f.ttft_ms, b.typical_ttft) {
            parts.push(format!("TTFT {} (typical {})", ms(t), ms(typical)));
        }
        if let (Some(p), Some(o)) = (f.prompt_tokens, f.output_tokens) {
            parts.push(format!("{p} prompt and {o} output tokens"));
        }
        if parts.is_empty() {
            "nothing in the record stands out".to_string()
        } else {
            format!("nothing in the record stands out: {}", parts.join(", "))
        }
    };
    Cause {
        cause: "unknown",
        ms: None,
        evidence,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(mut fields: Fields) -> Request {
        fields.ts = "2026-01-01T00:00:00Z".into();
        fields.route = "chat".into();
        fields.outcome.get_or_insert_with(|| "ok".into());
        Request {
            file: 0,
            line: 1,
            at: 0.0,
            fields,
        }
    }

    fn baseline() -> Baseline {
        let spread = |p50, p95, p99| Spread {
            p50: Some(p50),
            p95: Some(p95),
            p99: Some(p99),
        };
        Baseline {
            knee: Some(2),
            in_flight_p50: Some(2.0),
            typical_ttft: Some(80.0),
            prompt: spread(250.0, 330.0, 340.0),
            output: spread(75.0, 98.0, 99.0),
            tpot: spread(27.0, 27.0, 27.5),
            prefill: spread(60.0, 80.0, 90.0),
            proxy_p50: Some(0.3),
            connect_p50: Some(0.4),
            cached_share_p50: Some(0.5),
        }
    }

    fn names(causes: &[Cause]) -> Vec<&str> {
        causes.iter().map(|c| c.cause).collect()
    }

    #[test]
    fn a_measured_queue_outranks_a_long_answer() {
        let r = request(Fields {
            in_flight: Some(8),
            engine_waiting: Some(5.0),
            queue_ms: Some(6000.0),
            queue_source: Some("derived".into()),
            ttft_ms: Some(6100.0),
            output_tokens: Some(120),
            prompt_tokens: Some(250),
            cached_tokens: Some(120),
            ..Fields::default()
        });
        let causes = explain(&r, &baseline());
        assert_eq!(names(&causes), ["queued", "long answer"]);
        assert_eq!(
            causes[0].evidence,
            "8 in flight at arrival (route median 2, bend at 2), engine waiting 5, queue 6000 ms (derived)"
        );
    }

    #[test]
    fn a_short_measured_queue_is_not_queueing_however_crowded() {
        let r = request(Fields {
            in_flight: Some(8),
            queue_ms: Some(3.0),
            ttft_ms: Some(90.0),
            ..Fields::default()
        });
        assert_eq!(names(&explain(&r, &baseline())), ["unknown"]);
    }

    #[test]
    fn without_a_queue_figure_the_crowd_at_arrival_speaks() {
        let r = request(Fields {
            in_flight: Some(6),
            ttft_ms: Some(900.0),
            ..Fields::default()
        });
        let causes = explain(&r, &baseline());
        assert_eq!(names(&causes), ["queued"]);
        assert_eq!(causes[0].ms, Some(820.0));
    }

    #[test]
    fn each_cause_is_named_from_its_own_field() {
        let b = baseline();
        let one = |fields: Fields| names(&explain(&request(fields), &b))[0].to_string();
        let prompt = one(Fields {
            prompt_tokens: Some(1800),
            engine_prefill_ms: Some(700.0),
            cached_tokens: Some(120),
            ..Fields::default()
        });
        assert_eq!(prompt, "long prompt");
        let cold = one(Fields {
            engine_load_ms: Some(2400.0),
            ..Fields::default()
        });
        assert_eq!(cold, "cold model");
        let miss = one(Fields {
            prompt_tokens: Some(250),
            cached_tokens: Some(0),
            engine_prefill_ms: Some(110.0),
            ..Fields::default()
        });
        assert_eq!(miss, "no cache hit");
        let stalled = one(Fields {
            max_itl_ms: Some(1500.0),
            ..Fields::default()
        });
        assert_eq!(stalled, "stall");
        let connect = one(Fields {
            connect_ms: Some(180.0),
            upstream_conn: Some("new".into()),
            ..Fields::default()
        });
        assert_eq!(connect, "proxy or connection");
        let failed = explain(
            &request(Fields {
                outcome: Some("error".into()),
                status: Some(502),
                reason: Some("upstream_reset".into()),
                ..Fields::default()
            }),
            &b,
        );
        assert_eq!(
            failed[0].to_string(),
            "failed: outcome error, status 502, upstream_reset"
        );
    }

    #[test]
    fn a_record_without_figures_says_unknown() {
        let r = request(Fields {
            e2e_ms: 9000.0,
            ..Fields::default()
        });
        let causes = explain(&r, &Baseline::default());
        assert_eq!(
            causes[0].to_string(),
            "unknown: the record has no queue, engine, concurrency or connection figures to tell"
        );
    }
}
