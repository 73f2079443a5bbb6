//! The engine's state as its own metrics last said: running and waiting requests and KV-cache
//! usage. The sampler (`proxy/engine_metrics.rs`) stores each scrape here; every request reads
//! it once, at arrival, with three atomic loads, and its record carries the values.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use crate::parse::EngineState;

/// The last scrape's values; `NaN` stands for "not reported".
pub(crate) struct EngineCell {
    running: AtomicU64,
    waiting: AtomicU64,
    kv_usage: AtomicU64,
    /// Until when (ms after `base`) the values may be stamped on a request: a few intervals
    /// after the scrape, so a sampler that stopped succeeding stamps nothing stale.
    fresh_until: AtomicU64,
    base: Instant,
}

impl Default for EngineCell {
    fn default() -> Self {
        EngineCell {
            running: AtomicU64::new(f64::NAN.to_bits()),
            waiting: AtomicU64::new(f64::NAN.to_bits()),
            kv_usage: AtomicU64::new(f64::NAN.to_bits()),
            fresh_until: AtomicU64::new(0),
            base: Instant::now(),
        }
    }
}

/// What a request is stamped with at arrival.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub(crate) struct AtArrival {
    pub(crate) running: Option<f64>,
    pub(crate) waiting: Option<f64>,
    pub(crate) kv_usage: Option<f64>,
}

impl EngineCell {
    /// Stores a scrape made at `now`, valid for `fresh_for`.
    pub(crate) fn store(&self, state: &EngineState, now: Instant, fresh_for: Duration) {
        let bits = |v: Option<f64>| v.unwrap_or(f64::NAN).to_bits();
        self.running.store(bits(state.running), Ordering::Relaxed);
        self.waiting.store(bits(state.waiting), Ordering::Relaxed);
        self.kv_usage.store(bits(state.kv_usage), Ordering::Relaxed);
        let until = now.saturating_duration_since(self.base) + fresh_for;
        self.fresh_until
            .store(until.as_millis() as u64, Ordering::Release);
    }

    /// The values to stamp on a request arriving at `now`; nothing when the last scrape is stale
    /// or none succeeded.
    pub(crate) fn at(&self, now: Instant) -> AtArrival {
        let now_ms = now.saturating_duration_since(self.base).as_millis() as u64;
        if now_ms >= self.fresh_until.load(Ordering::Acquire) {
            return AtArrival::default();
        }
        let value = |cell: &AtomicU64| {
            let v = f64::from_bits(cell.load(Ordering::Relaxed));
            (!v.is_nan()).then_some(v)
        };
        AtArrival {
            running: value(&self.running),
            waiting: value(&self.waiting),
            kv_usage: value(&self.kv_usage),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn values_are_stamped_only_while_fresh() {
        let cell = EngineCell::default();
        assert_eq!(cell.at(Instant::now()), AtArrival::default());
        let state = EngineState {
            running: Some(2.0),
            waiting: Some(5.0),
            kv_usage: None,
            ..EngineState::default()
        };
        cell.store(&state, Instant::now(), Duration::from_secs(3));
        let got = cell.at(Instant::now());
        assert_eq!(got.running, Some(2.0));
        assert_eq!(got.waiting, Some(5.0));
        assert_eq!(got.kv_usage, None);
        tokio::time::advance(Duration::from_secs(4)).await;
        assert_eq!(cell.at(Instant::now()), AtArrival::default(), "stale");
    }
}
