//! What a sweep means: per-level statistics (percentiles by linear interpolation, as numpy's
//! default), goodput against the SLO flags, the saturation point, the table and the CSV.

use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use super::request::Record;

/// The most ITL gaps pooled for one level's percentiles, so memory stays bounded.
const MAX_LEVEL_GAPS: usize = 4_000_000;

/// Output tokens/s must grow by at least this share from one level to the next, or the server
/// is past its knee (when TTFT is rising too).
const SATURATION_GROWTH: f64 = 0.10;

/// The SLO thresholds given on the command line; an absent one is not judged.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Slo {
    pub ttft: Option<Duration>,
    pub tpot: Option<Duration>,
    pub e2e: Option<Duration>,
}

impl Slo {
    pub fn is_set(&self) -> bool {
        self.ttft.is_some() || self.tpot.is_some() || self.e2e.is_some()
    }

    /// vLLM `--goodput` semantics: a request is good when it succeeded and meets every given
    /// threshold. A request with a single token has no TPOT and so cannot miss that one.
    pub fn is_good(&self, record: &Record) -> bool {
        let within = |limit: Option<Duration>, value: Option<Duration>| match (limit, value) {
            (Some(limit), Some(value)) => value <= limit,
            (Some(_), None) => false,
            (None, _) => true,
        };
        record.error.is_none()
            && within(self.ttft, record.ttft)
            && (self.tpot.is_none() || record.tpot.is_none() || within(self.tpot, record.tpot))
            && within(self.e2e, Some(record.e2e))
    }
}

/// p50, p95 and p99 in milliseconds; `None` when there was nothing to measure.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Percentiles {
    pub p50: Option<f64>,
    pub p95: Option<f64>,
    pub p99: Option<f64>,
}

impl Percentiles {
    fn of(mut ms: Vec<f64>) -> Percentiles {
        ms.sort_by(f64::total_cmp);
        Percentiles {
            p50: percentile(&ms, 50.0),
            p95: percentile(&ms, 95.0),
            p99: percentile(&ms, 99.0),
        }
    }
}

/// The `p`th percentile of sorted `values`, interpolated linearly between the two nearest
/// ranks (numpy's default method).
pub fn percentile(sorted: &[f64], p: f64) -> Option<f64> {
    let last = sorted.len().checked_sub(1)?;
    let rank = (p / 100.0).clamp(0.0, 1.0) * last as f64;
    let lo = rank.floor() as usize;
    let hi = rank.ceil() as usize;
    let (a, b) = (sorted[lo], sorted[hi.min(last)]);
    Some(a + (b - a) * (rank - lo as f64))
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// One concurrency level's results.
#[derive(Debug)]
pub struct LevelReport {
    pub concurrency: u32,
    pub records: Vec<Record>,
    pub wall: Duration,
    pub requests_per_s: f64,
    pub output_tokens_per_s: f64,
    /// Over successful requests only.
    pub ttft: Percentiles,
    pub tpot: Percentiles,
    pub itl: Percentiles,
    pub e2e: Percentiles,
    pub errors: usize,
    /// Requests meeting every SLO threshold (failures are never good).
    pub good: usize,
    pub goodput: f64,
    pub attainment: f64,
}

impl LevelReport {
    pub fn new(concurrency: u32, records: Vec<Record>, wall: Duration, slo: &Slo) -> Self {
        let secs = wall.as_secs_f64().max(f64::MIN_POSITIVE);
        let ok: Vec<&Record> = records.iter().filter(|r| r.error.is_none()).collect();
        let output_tokens: u64 = ok.iter().map(|r| r.output_tokens).sum();
        let mut gaps = Vec::new();
        for r in &ok {
            let room = MAX_LEVEL_GAPS.saturating_sub(gaps.len());
            gaps.extend(r.itl.iter().take(room).map(|&d| ms(d)));
        }
        let good = records.iter().filter(|r| slo.is_good(r)).count();
        LevelReport {
            concurrency,
            requests_per_s: records.len() as f64 / secs,
            output_tokens_per_s: output_tokens as f64 / secs,
            ttft: Percentiles::of(ok.iter().filter_map(|r| r.ttft).map(ms).collect()),
            tpot: Percentiles::of(ok.iter().filter_map(|r| r.tpot).map(ms).collect()),
            itl: Percentiles::of(gaps),
            e2e: Percentiles::of(ok.iter().map(|r| ms(r.e2e)).collect()),
            errors: records.len() - ok.len(),
            good,
            goodput: good as f64 / secs,
            attainment: if records.is_empty() {
                0.0
            } else {
                good as f64 / records.len() as f64
            },
            wall,
            records,
        }
    }
}

/// The first level past which output tokens/s grows by less than 10 % while p99 TTFT keeps
/// rising; `None` when no level in the sweep behaves so.
pub fn saturation(levels: &[LevelReport]) -> Option<u32> {
    levels.windows(2).find_map(|pair| {
        let (before, after) = (&pair[0], &pair[1]);
        let flat =
            after.output_tokens_per_s < before.output_tokens_per_s * (1.0 + SATURATION_GROWTH);
        let rising = match (before.ttft.p99, after.ttft.p99) {
            (Some(b), Some(a)) => a > b,
            _ => false,
        };
        (flat && rising).then_some(before.concurrency)
    })
}

fn cell(value: Option<f64>) -> String {
    value.map_or_else(|| "-".to_string(), |v| format!("{v:.1}"))
}

/// The per-level tables and the saturation verdict, as printed on stdout.
pub fn render(levels: &[LevelReport], slo: &Slo) -> String {
    let mut out = String::new();
    for level in levels {
        let _ = writeln!(
            out,
            "concurrency {}: {} requests in {:.2}s, {:.2} req/s, {:.1} output tokens/s, {} errors",
            level.concurrency,
            level.records.len(),
            level.wall.as_secs_f64(),
            level.requests_per_s,
            level.output_tokens_per_s,
            level.errors
        );
        let _ = writeln!(
            out,
            "  {:<10}{:>10}{:>10}{:>10}",
            "(ms)", "p50", "p95", "p99"
        );
        for (name, p) in [
            ("TTFT", level.ttft),
            ("TPOT", level.tpot),
            ("ITL", level.itl),
            ("E2E", level.e2e),
        ] {
            let _ = writeln!(
                out,
                "  {:<10}{:>10}{:>10}{:>10}",
                name,
                cell(p.p50),
                cell(p.p95),
                cell(p.p99)
            );
        }
        if slo.is_set() {
            let _ = writeln!(
                out,
                "  goodput {:.2} req/s, SLO attainment {:.1} %",
                level.goodput,
                level.attainment * 100.0
            );
        }
        out.push('\n');
    }
    match saturation(levels) {
        Some(level) => {
            let _ = writeln!(
                out,
                "saturation: past concurrency {level} output tokens/s grows by less than 10 % while p99 TTFT keeps rising"
            );
        }
        None => out.push_str("saturation: no saturation within the levels tried\n"),
    }
    out
}

/// Writes one row per request of every level to `path`.
pub fn write_csv(path: &Path, levels: &[LevelReport]) -> Result<(), csv::Error> {
    let mut writer = csv::Writer::from_path(path)?;
    writer.write_record([
        "request_id",
        "concurrency",
        "prompt_tokens",
        "output_tokens",
        "ttft_ms",
        "tpot_ms",
        "total_ms",
        "status",
        "error",
        "max_itl_ms",
        "token_source",
    ])?;
    let opt_ms = |d: Option<Duration>| d.map_or_else(String::new, |d| format!("{:.3}", ms(d)));
    for r in levels.iter().flat_map(|l| &l.records) {
        writer.write_record([
            r.request_id.to_string(),
            r.concurrency.to_string(),
            r.prompt_tokens.map_or_else(String::new, |n| n.to_string()),
            r.output_tokens.to_string(),
            opt_ms(r.ttft),
            opt_ms(r.tpot),
            format!("{:.3}", ms(r.e2e)),
            r.status.to_string(),
            r.error.clone().unwrap_or_default(),
            opt_ms(r.max_itl),
            r.token_source.as_str().to_string(),
        ])?;
    }
    writer.flush()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_interpolate_like_numpy() {
        // numpy.percentile([1, 2, 3, 4], [50, 95, 99]) == [2.5, 3.85, 3.97]
        let v = [1.0, 2.0, 3.0, 4.0];
        let close = |a: Option<f64>, b: f64| a.is_some_and(|a| (a - b).abs() < 1e-9);
        assert!(close(percentile(&v, 50.0), 2.5));
        assert!(close(percentile(&v, 95.0), 3.85));
        assert!(close(percentile(&v, 99.0), 3.97));
        assert!(close(percentile(&[7.0], 99.0), 7.0));
        assert_eq!(percentile(&[], 50.0), None);
    }
}
