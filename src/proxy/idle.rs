//! Whether the proxy is idle, for what should only run while it is: the allocator's background
//! thread (`main.rs`), which returns a burst's freed memory to the system while no request
//! allocates, and which under load only makes the process two threads (every socket call then
//! takes the kernel's shared descriptor-table path).

use std::time::Duration;

use tokio::time::MissedTickBehavior;

use super::server::Running;

/// Idle or busy, from samples of the requests in flight: idle once `quiet_needed` samples in a
/// row saw none, busy again at the first sample that sees one. A proxy starts idle.
#[derive(Debug)]
pub struct IdleWatch {
    quiet_needed: u32,
    quiet: u32,
    idle: bool,
}

impl IdleWatch {
    pub fn new(quiet_needed: u32) -> IdleWatch {
        IdleWatch {
            quiet_needed: quiet_needed.max(1),
            quiet: 0,
            idle: true,
        }
    }

    /// Takes one sample; returns the new state when it changed (`true`: idle).
    pub fn sample(&mut self, in_flight: i64) -> Option<bool> {
        if in_flight > 0 {
            self.quiet = 0;
            return self.set(false);
        }
        self.quiet = self.quiet.saturating_add(1);
        if self.quiet >= self.quiet_needed {
            self.set(true)
        } else {
            None
        }
    }

    fn set(&mut self, idle: bool) -> Option<bool> {
        (self.idle != idle).then(|| {
            self.idle = idle;
            idle
        })
    }
}

impl Running {
    /// Requests in flight now, over every route, shard and generation.
    pub fn in_flight(&self) -> i64 {
        self.generations.in_flight()
    }

    /// Samples the requests in flight every `every` and calls `change(idle)` each time the proxy
    /// turns idle (`quiet` samples in a row with none) or busy (a sample with one). Runs until
    /// dropped; one timer tick per `every`, nothing per request.
    pub async fn watch_idle(&self, every: Duration, quiet: u32, mut change: impl FnMut(bool)) {
        let mut watch = IdleWatch::new(quiet);
        let mut ticks = tokio::time::interval(every);
        ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            if let Some(idle) = watch.sample(self.in_flight()) {
                change(idle);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_in_flight_makes_it_busy_at_once_and_quiet_samples_idle_again() {
        let mut watch = IdleWatch::new(3);
        // Starts idle: nothing to report while nothing happens.
        assert_eq!(watch.sample(0), None);
        assert_eq!(watch.sample(0), None);
        assert_eq!(watch.sample(0), None);
        assert_eq!(watch.sample(5), Some(false));
        assert_eq!(watch.sample(1), None);
        assert_eq!(watch.sample(0), None);
        assert_eq!(watch.sample(0), None);
        // A request between quiet samples starts the count again.
        assert_eq!(watch.sample(2), None);
        assert_eq!(watch.sample(0), None);
        assert_eq!(watch.sample(0), None);
        assert_eq!(watch.sample(0), Some(true));
        assert_eq!(watch.sample(0), None);
        assert_eq!(watch.sample(1), Some(false));
    }

    #[test]
    fn one_quiet_sample_is_the_least_it_waits() {
        let mut watch = IdleWatch::new(0);
        assert_eq!(watch.sample(1), Some(false));
        assert_eq!(watch.sample(0), Some(true));
    }
}
