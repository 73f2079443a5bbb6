//! Judging a finished request against its route's SLO: good, violated (and why), or excluded.
//!
//! The rules are `docs/MEASUREMENT.md`'s: thresholds are inclusive; an error is a violation;
//! a client that gave up after a deadline had already passed is a violation too, because the
//! reader gave up waiting; client errors and early cancellations are excluded.

use std::time::Duration;

use super::outcome::{Figures, Outcome};
use crate::config::Slo;

/// One way a request can fail its SLO; the label of `tokenmeter_slo_violations_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum Criterion {
    Ttft,
    Tpot,
    E2e,
    MaxItl,
    Error,
}

impl Criterion {
    pub(crate) const ALL: [Criterion; 5] = [
        Criterion::Ttft,
        Criterion::Tpot,
        Criterion::E2e,
        Criterion::MaxItl,
        Criterion::Error,
    ];

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Criterion::Ttft => "ttft",
            Criterion::Tpot => "tpot",
            Criterion::E2e => "e2e",
            Criterion::MaxItl => "max_itl",
            Criterion::Error => "error",
        }
    }
}

/// The judgement of one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Verdict {
    Good,
    /// The criteria that failed, in a fixed order; never empty.
    Violated(Vec<Criterion>),
    Excluded,
}

impl Verdict {
    pub(crate) fn as_str(&self) -> &'static str {
        match self {
            Verdict::Good => "good",
            Verdict::Violated(_) => "violated",
            Verdict::Excluded => "excluded",
        }
    }
}

/// `Some(threshold)` fails when the value is above it; an absent threshold always holds.
fn over(value: Duration, threshold: Option<Duration>) -> bool {
    threshold.is_some_and(|t| value > t)
}

/// Judges a finished request.
pub(crate) fn judge(slo: &Slo, f: &Figures) -> Verdict {
    match f.outcome {
        Outcome::ClientError => Verdict::Excluded,
        Outcome::Error => Verdict::Violated(vec![Criterion::Error]),
        Outcome::Cancelled => {
            // The reader gave up: it counts against the SLO only if a deadline had passed.
            let mut failed = Vec::new();
            if f.ttft.is_none() && over(f.e2e, slo.ttft) {
                failed.push(Criterion::Ttft);
            }
            if over(f.e2e, slo.e2e) {
                failed.push(Criterion::E2e);
            }
            if failed.is_empty() {
                Verdict::Excluded
            } else {
                Verdict::Violated(failed)
            }
        }
        Outcome::Ok => {
            let mut failed = Vec::new();
            // With no output at all, the reader saw nothing until the end.
            if over(f.ttft.unwrap_or(f.e2e), slo.ttft) {
                failed.push(Criterion::Ttft);
            }
            // TPOT is undefined, and so holds, for N ≤ 1.
            if f.tpot.is_some_and(|tpot| over(tpot, slo.tpot)) {
                failed.push(Criterion::Tpot);
            }
            if over(f.e2e, slo.e2e) {
                failed.push(Criterion::E2e);
            }
            if f.max_itl.is_some_and(|gap| over(gap, slo.max_itl)) {
                failed.push(Criterion::MaxItl);
            }
            if failed.is_empty() {
                Verdict::Good
            } else {
                Verdict::Violated(failed)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
    }

    fn slo() -> Slo {
        Slo {
            ttft: Some(ms(300)),
            tpot: Some(ms(40)),
            e2e: Some(ms(8000)),
            max_itl: Some(ms(1000)),
            objective: Some(0.99),
        }
    }

    fn figures(
        outcome: Outcome,
        ttft: Option<u64>,
        tpot: Option<u64>,
        e2e: u64,
        max_itl: Option<u64>,
    ) -> Figures {
        Figures {
            outcome,
            ttfb: ttft.map(ms),
            ttft: ttft.map(ms),
            ttfc: ttft.map(ms),
            tpot: tpot.map(ms),
            max_itl: max_itl.map(ms),
            e2e: ms(e2e),
            output_tokens: 10,
            tokens_from_usage: true,
            prompt_tokens: None,
        }
    }

    use Criterion as C;
    use Outcome as O;

    #[test]
    fn verdicts_follow_the_contract() {
        let s = slo();
        let cases = [
            // Thresholds are inclusive.
            (
                figures(O::Ok, Some(300), Some(40), 8000, Some(1000)),
                Verdict::Good,
            ),
            (
                figures(O::Ok, Some(301), Some(40), 500, Some(10)),
                Verdict::Violated(vec![C::Ttft]),
            ),
            (
                figures(O::Ok, Some(100), Some(41), 500, Some(10)),
                Verdict::Violated(vec![C::Tpot]),
            ),
            (
                figures(O::Ok, Some(100), Some(10), 8001, Some(10)),
                Verdict::Violated(vec![C::E2e]),
            ),
            (
                figures(O::Ok, Some(100), Some(10), 500, Some(1001)),
                Verdict::Violated(vec![C::MaxItl]),
            ),
            (
                figures(O::Ok, Some(900), Some(90), 9000, Some(2000)),
                Verdict::Violated(vec![C::Ttft, C::Tpot, C::E2e, C::MaxItl]),
            ),
            // N ≤ 1: TPOT and ITL undefined, so they hold.
            (figures(O::Ok, Some(100), None, 100, None), Verdict::Good),
            // No output at all: TTFT is judged on E2E.
            (figures(O::Ok, None, None, 250, None), Verdict::Good),
            (
                figures(O::Ok, None, None, 350, None),
                Verdict::Violated(vec![C::Ttft]),
            ),
            (
                figures(O::Error, Some(10), Some(10), 20, None),
                Verdict::Violated(vec![C::Error]),
            ),
            (
                figures(O::ClientError, None, None, 5, None),
                Verdict::Excluded,
            ),
            // Gave up before the first token, after the TTFT deadline: violated.
            (
                figures(O::Cancelled, None, None, 301, None),
                Verdict::Violated(vec![C::Ttft]),
            ),
            // Gave up before the deadline: excluded.
            (
                figures(O::Cancelled, None, None, 299, None),
                Verdict::Excluded,
            ),
            // Gave up mid-stream, within E2E: excluded; past E2E: violated.
            (
                figures(O::Cancelled, Some(100), Some(10), 5000, None),
                Verdict::Excluded,
            ),
            (
                figures(O::Cancelled, Some(100), Some(10), 9000, None),
                Verdict::Violated(vec![C::E2e]),
            ),
        ];
        for (f, want) in cases {
            assert_eq!(judge(&s, &f), want, "{f:?}");
        }
    }

    #[test]
    fn absent_criteria_always_hold() {
        let only_e2e = Slo {
            e2e: Some(ms(60_000)),
            ..Slo::default()
        };
        assert_eq!(
            judge(
                &only_e2e,
                &figures(O::Ok, Some(5000), Some(500), 59_000, Some(9000))
            ),
            Verdict::Good
        );
        assert_eq!(
            judge(&only_e2e, &figures(O::Cancelled, None, None, 59_000, None)),
            Verdict::Excluded
        );
    }
}
