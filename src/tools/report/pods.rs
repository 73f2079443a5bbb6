//! Whether the slowest requests, or the SLO violations, concentrate on one pod: a slow pod (a
//! bad GPU, a noisy neighbour, a node under pressure) is among the commonest causes of a tail,
//! and the records of a fleet, merged, name the pod each request was served by.
//!
//! Pods are compared within their deployment (a fleet's deployments serve different models at
//! different speeds), over the requests whose record names a pod. A pod is named when it holds,
//! of the deployment's slowest requests or of its violations, all three of:
//!
//! - at least [`MIN_COUNT`] of them;
//! - at least [`MIN_RATIO`] times its share of the deployment's requests (of its judged
//!   requests, for violations): well above what a pod that serves like the others would hold;
//! - so many that a pod with its share would hold that many or more by chance less than once
//!   in 1 / [`MAX_CHANCE`] (the binomial tail, which overstates the chance of drawing without
//!   replacement, so it errs towards naming no pod).
//!
//! "The slowest" are the slowest [`TAIL_SHARE`] of the deployment's requests by E2E, and never
//! fewer than [`MIN_TAIL`] (all of them when there are fewer): a 1 % tail of a few hundred
//! requests would be too few to tell anything apart.
//!
//! The records stream past once, so the E2E from which a request is among the slowest cannot be
//! known while they are read. Each pod keeps its counts and an E2E sketch ([`PodTally`], bounded
//! whatever the number of requests); at the end the deployment's sketches, added up, give the
//! bucket that holds the threshold. A pod's requests in the buckets above it are counted exactly;
//! the threshold's own bucket (requests within the sketch's 1 % of the threshold) is shared among
//! the pods in proportion to how many of its requests each has there, so the counts always add up
//! to the tail and only requests that close to the threshold can be given to the wrong pod.

use std::collections::BTreeMap;

use serde::Serialize;

use super::figures::{round, Quantiles};
use super::read::Fields;

/// The share of a deployment's requests, by E2E, that count as its slowest ...
pub const TAIL_SHARE: f64 = 0.01;
/// ... and the fewest that do.
pub const MIN_TAIL: usize = 20;
/// A pod is named for holding at least this many of the slowest (or of the violations) ...
pub const MIN_COUNT: usize = 5;
/// ... at least this many times its share of the requests ...
pub const MIN_RATIO: f64 = 1.5;
/// ... and more than a pod with its share would hold with this probability.
pub const MAX_CHANCE: f64 = 0.001;

/// The pods of one deployment, and where its slowest requests and violations fall.
#[derive(Debug, Serialize)]
pub struct Pods {
    /// `namespace/deployment` (or the deployment alone); `None` when the records do not say.
    pub deployment: Option<String>,
    /// Requests whose record names a pod.
    pub requests: usize,
    /// How many of them count as the slowest, and the E2E from which a request is among them.
    pub slowest: usize,
    pub slowest_from_ms: Option<f64>,
    /// Requests judged against an SLO, and those that violated it.
    pub judged: usize,
    pub violated: usize,
    /// Busiest first.
    pub pods: Vec<Pod>,
    /// The pods the slowest requests or the violations concentrate on; usually none.
    pub concentrated: Vec<Concentration>,
    /// The finding in words.
    pub verdict: String,
}

/// One pod's requests, slowest requests and violations.
#[derive(Debug, Serialize)]
pub struct Pod {
    pub pod: String,
    pub requests: usize,
    /// Its share of the deployment's requests.
    pub share: f64,
    /// How many of the deployment's slowest requests it served.
    pub slowest: usize,
    pub judged: usize,
    pub violated: usize,
}

/// The slowest requests, or the violations, concentrate on `pod`.
#[derive(Debug, Serialize)]
pub struct Concentration {
    pub pod: String,
    /// `slowest` or `violations`.
    pub on: &'static str,
    /// It holds `count` of the `of` slowest requests (or violations) ...
    pub count: usize,
    pub of: usize,
    /// ... a share of `share`, against `expected`: its share of the requests (of the judged
    /// requests, for violations).
    pub share: f64,
    pub expected: f64,
    /// How likely a pod with that share would hold `count` or more by chance.
    pub chance: f64,
}

impl std::fmt::Display for Concentration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (what, base) = match self.on {
            "slowest" => ("slowest requests", "requests"),
            _ => ("violations", "judged requests"),
        };
        write!(
            f,
            "the {what} concentrate on pod {}: {} of the {} ({:.0} %), against {:.0} % of the {base} (by chance: {})",
            self.pod,
            self.count,
            self.of,
            self.share * 100.0,
            self.expected * 100.0,
            odds(self.chance)
        )
    }
}

/// When a pod is named, in words, for the report to say beside its finding.
pub fn rule() -> String {
    format!(
        "a pod is named when it holds, of the slowest {:.0} % of its deployment's requests by E2E (at least the {MIN_TAIL} slowest) or of its violations, at least {MIN_COUNT}, at least {MIN_RATIO} times its share of the requests (of the judged requests, for violations), and more than a pod with its share would hold by chance once in {:.0}",
        TAIL_SHARE * 100.0,
        1.0 / MAX_CHANCE
    )
}

/// A small probability as people read it: "less than 1 in a million", "1 in 2,300".
fn odds(p: f64) -> String {
    if p < 1e-6 {
        "less than 1 in a million".into()
    } else {
        let one_in = (1.0 / p).round();
        format!("1 in {one_in:.0}")
    }
}

/// P(X >= k) for X binomial with `n` draws of probability `p`; only asked for `k` above the
/// mean, where the terms fall from the first on.
pub fn upper_tail(k: usize, n: usize, p: f64) -> f64 {
    if k == 0 || p >= 1.0 {
        return 1.0;
    }
    if k > n || p <= 0.0 {
        return 0.0;
    }
    let ln_choose: f64 = (1..=k).map(|i| ((n - k + i) as f64 / i as f64).ln()).sum();
    let mut term = (ln_choose + k as f64 * p.ln() + (n - k) as f64 * (1.0 - p).ln()).exp();
    let ratio = p / (1.0 - p);
    let mut sum = 0.0;
    for j in k..=n {
        sum += term;
        if term <= sum * 1e-16 && j as f64 >= n as f64 * p {
            break;
        }
        term *= (n - j) as f64 / (j + 1) as f64 * ratio;
    }
    sum.min(1.0)
}

/// Whether a pod holding `count` of `of`, with `expected` its share of the base, is named.
fn concentration(
    pod: &str,
    on: &'static str,
    count: usize,
    of: usize,
    expected: f64,
) -> Option<Concentration> {
    if of == 0 || count < MIN_COUNT {
        return None;
    }
    let share = count as f64 / of as f64;
    if share < MIN_RATIO * expected {
        return None;
    }
    let chance = upper_tail(count, of, expected);
    (chance < MAX_CHANCE).then(|| Concentration {
        pod: pod.to_string(),
        on,
        count,
        of,
        share: round(share),
        expected: round(expected),
        chance,
    })
}

/// One pod's requests as they stream past: counts and an E2E sketch.
#[derive(Clone, Debug, Default)]
pub struct PodTally {
    requests: usize,
    judged: usize,
    violated: usize,
    e2e: Quantiles,
}

impl PodTally {
    fn merge(&mut self, other: &PodTally) {
        self.requests += other.requests;
        self.judged += other.judged;
        self.violated += other.violated;
        self.e2e.merge(&other.e2e);
    }
}

/// A deployment's pods as the records stream past; the records that name no pod are not
/// counted. Its size grows with the number of pods, never with the number of requests.
#[derive(Clone, Debug, Default)]
pub struct Tally(BTreeMap<String, PodTally>);

impl Tally {
    pub fn add(&mut self, f: &Fields) {
        let Some(name) = f.pod() else { return };
        let pod = match self.0.get_mut(name) {
            Some(pod) => pod,
            None => self.0.entry(name.to_string()).or_default(),
        };
        pod.requests += 1;
        pod.e2e.add(f.e2e_ms);
        match f.slo.as_deref() {
            Some("good") => pod.judged += 1,
            Some("violated") => {
                pod.judged += 1;
                pod.violated += 1;
            }
            _ => {}
        }
    }

    pub fn merge(&mut self, other: &Tally) {
        for (name, pod) in &other.0 {
            self.0.entry(name.clone()).or_default().merge(pod);
        }
    }
}

/// How many of the `tail` slowest requests each pod served, from their E2E sketches, and the
/// E2E from which a request is among them (see the module doc for how exact this is).
fn slowest_per_pod(tally: &Tally, tail: usize) -> (Vec<usize>, Option<f64>) {
    let slots: Vec<Vec<u64>> = tally.0.values().map(|p| p.e2e.slots()).collect();
    let width = slots.iter().map(Vec::len).max().unwrap_or(0);
    let total: Vec<u64> = (0..width)
        .map(|s| slots.iter().map(|p| p.get(s).copied().unwrap_or(0)).sum())
        .collect();
    // The slot holding the tail's fastest request: walk down from the slowest.
    let tail = tail as u64;
    let mut above = 0u64;
    let mut threshold = None;
    for s in (0..width).rev() {
        if above + total[s] >= tail {
            threshold = Some(s);
            break;
        }
        above += total[s];
    }
    let Some(at) = threshold else {
        return (vec![0; slots.len()], None);
    };
    let need = tail - above;
    let count = |p: &Vec<u64>, s: usize| p.get(s).copied().unwrap_or(0);
    let mut counts: Vec<u64> = slots
        .iter()
        .map(|p| (at + 1..width).map(|s| count(p, s)).sum())
        .collect();
    // The threshold's slot, shared in proportion (largest remainder, first pod first on ties).
    let in_slot: Vec<u64> = slots.iter().map(|p| count(p, at)).collect();
    let mut given = 0u64;
    let mut remainders: Vec<(u64, usize)> = Vec::new();
    for (i, &c) in in_slot.iter().enumerate() {
        let exact = u128::from(need) * u128::from(c);
        let share = (exact / u128::from(total[at])) as u64;
        counts[i] += share;
        given += share;
        remainders.push(((exact % u128::from(total[at])) as u64, i));
    }
    remainders.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    for &(_, i) in remainders.iter().take((need - given) as usize) {
        counts[i] += 1;
    }
    (
        counts.into_iter().map(|c| c as usize).collect(),
        Some(round(Quantiles::slot_value(at))),
    )
}

/// The pods of one deployment's requests; `None` when no record names a pod.
pub fn of(deployment: Option<String>, tally: &Tally) -> Option<Pods> {
    let n: usize = tally.0.values().map(|p| p.requests).sum();
    if n == 0 {
        return None;
    }
    let tail = ((n as f64 * TAIL_SHARE).ceil() as usize)
        .max(MIN_TAIL)
        .min(n);
    let (slowest, slowest_from_ms) = slowest_per_pod(tally, tail);
    let mut pods: Vec<Pod> = tally
        .0
        .iter()
        .zip(slowest)
        .map(|((name, p), slowest)| Pod {
            pod: name.clone(),
            requests: p.requests,
            share: 0.0,
            slowest,
            judged: p.judged,
            violated: p.violated,
        })
        .collect();
    let judged: usize = pods.iter().map(|p| p.judged).sum();
    let violated: usize = pods.iter().map(|p| p.violated).sum();
    for p in &mut pods {
        p.share = round(p.requests as f64 / n as f64);
    }
    pods.sort_by(|a, b| b.requests.cmp(&a.requests).then(a.pod.cmp(&b.pod)));

    let mut concentrated = Vec::new();
    if pods.len() > 1 {
        for p in &pods {
            let share = p.requests as f64 / n as f64;
            concentrated.extend(concentration(&p.pod, "slowest", p.slowest, tail, share));
        }
        for p in &pods {
            let share = if judged > 0 {
                p.judged as f64 / judged as f64
            } else {
                0.0
            };
            concentrated.extend(concentration(
                &p.pod,
                "violations",
                p.violated,
                violated,
                share,
            ));
        }
    }
    let verdict = if pods.len() == 1 {
        format!("one pod, {}: nothing to compare it with", pods[0].pod)
    } else if concentrated.is_empty() {
        let violations = if violated > 0 {
            format!(" nor of the {violated} violations")
        } else {
            String::new()
        };
        format!(
            "no pod stands out: none of the {} pods holds a share of the {tail} slowest requests{violations} well above its share of the requests",
            pods.len()
        )
    } else {
        concentrated
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("; ")
    };
    Some(Pods {
        deployment,
        requests: n,
        slowest: tail,
        slowest_from_ms,
        judged,
        violated,
        pods,
        concentrated,
        verdict,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::report::read::Fields;

    #[test]
    fn the_binomial_tail_is_right_where_it_can_be_counted() {
        // P(X >= 3) for 4 fair coins: (4 + 1) / 16.
        assert!((upper_tail(3, 4, 0.5) - 5.0 / 16.0).abs() < 1e-12);
        assert!((upper_tail(20, 20, 0.5) - 0.5f64.powi(20)).abs() < 1e-18);
        assert_eq!(upper_tail(0, 10, 0.1), 1.0);
        assert_eq!(upper_tail(11, 10, 0.1), 0.0);
        // 18 or more of 20 at a third, term by term.
        let third = 1.0f64 / 3.0;
        let exact = 190.0 * third.powi(18) * (2.0 * third).powi(2)
            + 20.0 * third.powi(19) * (2.0 * third)
            + third.powi(20);
        assert!((upper_tail(18, 20, third) / exact - 1.0).abs() < 1e-9);
        // Large n stays finite and small.
        let p = upper_tail(900, 1000, 0.25);
        assert!(p.is_finite() && p < 1e-100 || p == 0.0, "{p}");
    }

    fn request(pod: &str, e2e_ms: f64, slo: &str) -> Fields {
        Fields {
            ts: "2026-01-01T00:00:00Z".into(),
            route: "chat".into(),
            e2e_ms,
            pod: Some(pod.into()),
            slo: Some(slo.into()),
            ..Fields::default()
        }
    }

    fn tally(requests: &[Fields]) -> Tally {
        let mut tally = Tally::default();
        requests.iter().for_each(|f| tally.add(f));
        tally
    }

    /// Four pods; `slow` pods serve every request they get at 3x the others' E2E and violate.
    fn fleet(slow: &[&str], n: usize) -> Vec<Fields> {
        let names = ["a", "b", "c", "d"];
        (0..n)
            .map(|i| {
                let pod = names[i % 4];
                let base = 1000.0 + (i * 37 % 101) as f64;
                if slow.contains(&pod) {
                    request(pod, base * 3.0, "violated")
                } else {
                    request(pod, base, if i % 50 == 0 { "violated" } else { "good" })
                }
            })
            .collect()
    }

    #[test]
    fn a_slow_pod_is_named_for_the_slowest_and_the_violations() {
        let requests = fleet(&["c"], 400);
        let pods = of(Some("llm".into()), &tally(&requests)).unwrap();
        assert_eq!(pods.slowest, MIN_TAIL);
        let named: Vec<(&str, &str)> = pods
            .concentrated
            .iter()
            .map(|c| (c.pod.as_str(), c.on))
            .collect();
        assert_eq!(named, [("c", "slowest"), ("c", "violations")]);
        assert!(
            pods.verdict.contains("concentrate on pod c"),
            "{}",
            pods.verdict
        );
    }

    #[test]
    fn slowness_spread_over_the_pods_names_none() {
        // Every 7th request is slow, whichever pod served it (7 shares no factor with the 4
        // pods the requests go round).
        let requests: Vec<Fields> = (0..400)
            .map(|i| {
                let pod = ["a", "b", "c", "d"][i % 4];
                let e2e = if i % 7 == 0 { 5000.0 } else { 1000.0 };
                request(
                    pod,
                    e2e + i as f64,
                    if i % 7 == 0 { "violated" } else { "good" },
                )
            })
            .collect();
        let pods = of(None, &tally(&requests)).unwrap();
        assert!(pods.concentrated.is_empty(), "{:?}", pods.concentrated);
        assert!(
            pods.verdict.starts_with("no pod stands out"),
            "{}",
            pods.verdict
        );
    }

    #[test]
    fn too_few_requests_name_no_pod() {
        // All of the slowest are c's, but the deployment's 20 requests are all "the slowest".
        let requests = fleet(&["c"], 20);
        let pods = of(None, &tally(&requests)).unwrap();
        assert!(
            pods.concentrated.iter().all(|c| c.on != "slowest"),
            "{:?}",
            pods.concentrated
        );
        // Without pods in the records there is nothing to say.
        let mut old = fleet(&[], 40);
        old.iter_mut().for_each(|f| f.pod = None);
        assert!(of(None, &tally(&old)).is_none());
    }

    /// The per-pod counts of the slowest, from sketches, against the exact counts from sorting:
    /// they add up to the tail, and differ only by requests within the sketch's error of the
    /// threshold.
    #[test]
    fn the_slowest_per_pod_from_sketches_matches_sorting_up_to_the_threshold_bucket() {
        let mut rng = fastrand::Rng::with_seed(7);
        let names = ["a", "b", "c", "d", "e"];
        let requests: Vec<Fields> = (0..20_000)
            .map(|i| {
                let pod = names[i % 5];
                // Pod e somewhat slower, with a long tail for every pod.
                let slow = if pod == "e" { 1.3 } else { 1.0 };
                let e2e = (500.0 + 4000.0 * rng.f64().powi(6)) * slow;
                request(pod, round(e2e), "good")
            })
            .collect();
        let pods = of(None, &tally(&requests)).unwrap();
        let tail = pods.slowest;
        assert_eq!(tail, 200);
        assert_eq!(pods.pods.iter().map(|p| p.slowest).sum::<usize>(), tail);
        let mut sorted: Vec<&Fields> = requests.iter().collect();
        sorted.sort_by(|a, b| b.e2e_ms.total_cmp(&a.e2e_ms));
        let threshold = sorted[tail - 1].e2e_ms;
        let from = pods.slowest_from_ms.unwrap();
        assert!(
            (from - threshold).abs() <= 0.0101 * threshold,
            "{from} vs {threshold}"
        );
        // Requests within 2 % of the threshold are the only ones the sketch can misplace.
        let near = |f: &&Fields| (f.e2e_ms - threshold).abs() <= 0.021 * threshold;
        for p in &pods.pods {
            let exact = sorted[..tail]
                .iter()
                .filter(|f| f.pod() == Some(&p.pod))
                .count();
            let close = requests
                .iter()
                .filter(|f| f.pod() == Some(&p.pod))
                .filter(near)
                .count();
            assert!(
                exact.abs_diff(p.slowest) <= close,
                "pod {}: {} from the sketch, {exact} exactly, {close} near the threshold",
                p.pod,
                p.slowest
            );
        }
    }
}
