//! The live view's time rings: fixed rings of 10-second and 1-minute slots, each slot a tally of
//! counters, sketches and the highest in-flight level seen, the routes' pairs of rings and their
//! models' 1-minute rings.

use std::sync::Arc;
use std::time::Duration;

use super::sketch::{key, Sketch, N_KEYS};
use super::Sample;
use crate::policy::outcome::Outcome;
use crate::policy::slo::{Criterion, Verdict};

/// A ring: `slots` slots of `width` seconds each.
pub(super) const SHORT_SLOT_SECS: u64 = 10;
pub(super) const SHORT_SLOTS: usize = 30;
pub(super) const LONG_SLOT_SECS: u64 = 60;
pub(super) const LONG_SLOTS: usize = 60;

/// The windows, in the order `/stats` lists them: name, which ring, how many of its slots.
pub(super) const WINDOWS: [(&str, RingId, u64); 3] = [
    ("1m", RingId::Short, 6),
    ("5m", RingId::Short, 30),
    ("1h", RingId::Long, 60),
];

/// The worst-case heap and inline bytes one route's rings can hold: every slot's four sketches
/// spanning every bucket.
pub(crate) const WORST_CASE_BYTES_PER_ROUTE: usize = std::mem::size_of::<RouteRings>()
    + (SHORT_SLOTS + LONG_SLOTS) * (std::mem::size_of::<Slot>() + 4 * N_KEYS * 4);
// The module doc promises 1.76 MiB; a change of layout that breaks 2 MiB must say so there.
const _: () = assert!(WORST_CASE_BYTES_PER_ROUTE < 2 << 20);
// And under 1 MiB for a model row.
const _: () = assert!(WORST_CASE_BYTES_PER_MODEL < 1 << 20);

/// A model's ring: the long ring only, with ITL left out, so a model row costs about a third
/// of a route's rings (see the module doc for the bound).
pub(super) const MODEL_WINDOW_5M_SLOTS: u64 = 5;

/// The worst-case bytes one model's ring can hold: every slot's three sketches spanning every
/// bucket (its ITL sketch is never filled).
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) const WORST_CASE_BYTES_PER_MODEL: usize =
    std::mem::size_of::<ModelRings>() + LONG_SLOTS * (std::mem::size_of::<Slot>() + 3 * N_KEYS * 4);

/// A duration's bucket, found once per request and added to both the route's and the model's
/// tallies, so the model split adds no logarithm to a request's cost.
#[derive(Debug, Clone, Copy)]
pub(super) enum Bucket {
    Zero,
    Key(i32),
}

impl Bucket {
    pub(super) fn of(d: Duration) -> Bucket {
        let secs = d.as_secs_f64();
        if secs == 0.0 {
            Bucket::Zero
        } else {
            Bucket::Key(key(secs))
        }
    }

    fn put(self, s: &mut Sketch) {
        match self {
            Bucket::Zero => s.add_zeros(1),
            Bucket::Key(k) => s.add_key(k, 1),
        }
    }
}

/// A request's durations as buckets.
#[derive(Debug, Clone, Copy)]
pub(super) struct Buckets {
    pub(super) ttft: Option<Bucket>,
    pub(super) tpot: Option<Bucket>,
    pub(super) e2e: Bucket,
}

impl Buckets {
    pub(super) fn of(s: &Sample<'_>) -> Buckets {
        Buckets {
            ttft: s.ttft.map(Bucket::of),
            tpot: s.tpot.map(Bucket::of),
            e2e: Bucket::of(s.e2e),
        }
    }
}

/// What one slot holds: counters and four sketches.
#[derive(Debug, Default)]
pub(super) struct Tally {
    pub(super) requests: u64,
    /// Indexed like [`outcome_index`].
    pub(super) outcomes: [u64; 4],
    pub(super) prompt_tokens: u64,
    /// Requests that reported their prompt tokens.
    pub(super) prompt_known: u64,
    pub(super) output_tokens: u64,
    pub(super) good: u64,
    pub(super) violated: u64,
    pub(super) good_output_tokens: u64,
    /// Indexed like [`Criterion::ALL`].
    pub(super) violations: [u64; 5],
    pub(super) ttft: Sketch,
    pub(super) tpot: Sketch,
    pub(super) itl: Sketch,
    pub(super) e2e: Sketch,
    /// The highest in-flight level seen in the slot: at each finish (the route's level just
    /// before the finishing request left it) and at each `/stats` read. `None`: no finish and
    /// no read in the slot, so nothing is known.
    pub(super) in_flight_max: Option<i64>,
}

pub(super) fn outcome_index(o: Outcome) -> usize {
    match o {
        Outcome::Ok => 0,
        Outcome::Error => 1,
        Outcome::ClientError => 2,
        Outcome::Cancelled => 3,
    }
}

impl Tally {
    /// Adds one finished request; `with_itl`: also its gaps (a model's tally leaves them out).
    pub(super) fn add(&mut self, s: &Sample<'_>, b: &Buckets, with_itl: bool) {
        self.requests += 1;
        self.outcomes[outcome_index(s.outcome)] += 1;
        if let Some(p) = s.prompt_tokens {
            self.prompt_tokens = self.prompt_tokens.saturating_add(p);
            self.prompt_known += 1;
        }
        self.output_tokens = self.output_tokens.saturating_add(s.output_tokens);
        match s.verdict {
            Some(Verdict::Good) => {
                self.good += 1;
                self.good_output_tokens = self.good_output_tokens.saturating_add(s.output_tokens);
            }
            Some(Verdict::Violated(criteria)) => {
                self.violated += 1;
                for c in criteria {
                    if let Some(i) = Criterion::ALL.iter().position(|x| x == c) {
                        self.violations[i] += 1;
                    }
                }
            }
            Some(Verdict::Excluded) | None => {}
        }
        if let Some(k) = b.ttft {
            k.put(&mut self.ttft);
        }
        if let Some(k) = b.tpot {
            k.put(&mut self.tpot);
        }
        b.e2e.put(&mut self.e2e);
        if with_itl {
            self.itl.merge(&s.itl.0);
        }
        if let Some(level) = s.in_flight {
            self.note_in_flight(level);
        }
    }

    /// An in-flight level seen during the slot.
    pub(super) fn note_in_flight(&mut self, level: i64) {
        self.in_flight_max = Some(self.in_flight_max.map_or(level, |m| m.max(level)));
    }

    /// Empties the tally for reuse, keeping the sketches' storage.
    pub(super) fn clear(&mut self) {
        let take = |s: &mut Sketch| {
            s.clear();
            std::mem::take(s)
        };
        *self = Tally {
            ttft: take(&mut self.ttft),
            tpot: take(&mut self.tpot),
            itl: take(&mut self.itl),
            e2e: take(&mut self.e2e),
            ..Tally::default()
        };
    }

    #[cfg(test)]
    pub(super) fn heap_bytes(&self) -> usize {
        [&self.ttft, &self.tpot, &self.itl, &self.e2e]
            .iter()
            .map(|s| s.heap_bytes())
            .sum()
    }
}

#[derive(Debug)]
pub(super) struct Slot {
    /// Which slot of the process's life this holds (elapsed / width); `u64::MAX` when unused.
    pub(super) number: u64,
    pub(super) tally: Tally,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum RingId {
    Short,
    Long,
}

/// A fixed ring of time slots; slot `n` of the process's life lives at `n % len`.
#[derive(Debug)]
pub(super) struct Ring {
    pub(super) width_secs: u64,
    pub(super) slots: Box<[Slot]>,
}

impl Ring {
    pub(super) fn new(width_secs: u64, len: usize) -> Ring {
        Ring {
            width_secs,
            slots: (0..len)
                .map(|_| Slot {
                    number: u64::MAX,
                    tally: Tally::default(),
                })
                .collect(),
        }
    }

    pub(super) fn number(&self, elapsed: Duration) -> u64 {
        elapsed.as_secs() / self.width_secs
    }

    /// The tally of slot `n`, reusing the place of the slot that held it a ring ago; `None`
    /// for a slot already gone (a finish stamped a whole ring before the latest one).
    pub(super) fn tally(&mut self, n: u64) -> Option<&mut Tally> {
        let len = self.slots.len() as u64;
        let slot = &mut self.slots[(n % len) as usize];
        if slot.number == u64::MAX || slot.number < n {
            slot.number = n;
            slot.tally.clear();
        }
        (slot.number == n).then_some(&mut slot.tally)
    }

    /// The slots `cur − k + 1 ..= cur` that hold data.
    pub(super) fn window(&self, cur: u64, k: u64) -> impl Iterator<Item = &Tally> {
        self.slots
            .iter()
            .filter(move |s| s.number != u64::MAX && s.number <= cur && s.number + k > cur)
            .map(|s| &s.tally)
    }

    /// The slot numbered `n`, if this ring holds it.
    pub(super) fn slot(&self, n: u64) -> Option<&Tally> {
        let slot = &self.slots[(n % self.slots.len() as u64) as usize];
        (slot.number == n).then_some(&slot.tally)
    }

    /// The time window `k` slots cover at `elapsed`: from the start of slot `cur − k + 1`, or
    /// from the process's start when it is younger.
    pub(super) fn covered(&self, elapsed: Duration, k: u64) -> Duration {
        let first = (self.number(elapsed) + 1).saturating_sub(k);
        elapsed.saturating_sub(Duration::from_secs(first * self.width_secs))
    }

    #[cfg(test)]
    pub(super) fn heap_bytes(&self) -> usize {
        self.slots.len() * std::mem::size_of::<Slot>()
            + self
                .slots
                .iter()
                .map(|s| s.tally.heap_bytes())
                .sum::<usize>()
    }
}

#[derive(Debug)]
pub(super) struct RouteRings {
    pub(super) name: Box<str>,
    /// The long-ring slot of the latest request, to tell a route silent for an hour.
    pub(super) last_long_slot: u64,
    pub(super) short: Ring,
    pub(super) long: Ring,
    /// The route's split by model label, bounded in total by `MAX_MODEL_ROWS`.
    pub(super) models: Vec<ModelRings>,
}

/// One model's ring within a route.
#[derive(Debug)]
pub(super) struct ModelRings {
    /// The model's label in `/metrics` (already bounded there: named, `other` or `unknown`).
    pub(super) name: Arc<str>,
    pub(super) last_long_slot: u64,
    pub(super) long: Ring,
}

impl ModelRings {
    pub(super) fn new(name: &Arc<str>) -> ModelRings {
        ModelRings {
            name: name.clone(),
            last_long_slot: 0,
            long: Ring::new(LONG_SLOT_SECS, LONG_SLOTS),
        }
    }

    pub(super) fn seen_within_hour(&self, cur: u64) -> bool {
        self.last_long_slot + LONG_SLOTS as u64 > cur
    }

    /// Whether it is the ring of `model`: the same label, usually the very same allocation.
    pub(super) fn is(&self, model: &Arc<str>) -> bool {
        Arc::ptr_eq(&self.name, model) || *self.name == **model
    }
}

impl RouteRings {
    pub(super) fn new(name: &str) -> RouteRings {
        RouteRings {
            name: name.into(),
            last_long_slot: 0,
            short: Ring::new(SHORT_SLOT_SECS, SHORT_SLOTS),
            long: Ring::new(LONG_SLOT_SECS, LONG_SLOTS),
            models: Vec::new(),
        }
    }

    pub(super) fn ring(&self, id: RingId) -> &Ring {
        match id {
            RingId::Short => &self.short,
            RingId::Long => &self.long,
        }
    }

    /// Whether it holds a request of the last hour at long-ring slot `cur`.
    pub(super) fn seen_within_hour(&self, cur: u64) -> bool {
        self.last_long_slot + LONG_SLOTS as u64 > cur
    }
}

// ---------------------------------------------------------------------------------------------
// The public face
