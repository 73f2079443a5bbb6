//! Whether the proxy is idle, for what should only run while it is: the allocator's background
//! thread (`main.rs`), which returns a burst's freed memory to the system while no request
//! allocates, and which under load only makes the process two threads (every socket call then
//! takes the kernel's shared descriptor-table path).

use std::time::Duration;

use tokio::time::MissedTickBehavior;

use super::server::Running;

/// Idle or busy, from samples of the requests in flight: busy once `busy_needed` samples in a
/// row saw one, idle once `quiet_needed` samples in a row saw none; between the two it stays as
/// it was, so that light traffic (a request now and then) does not flip it back and forth. A
/// proxy starts idle.
#[derive(Debug)]
pub struct IdleWatch {
    busy_needed: u32,
    quiet_needed: u32,
    /// Samples in a row of the kind last seen: positive busy, negative quiet.
    run: i64,
    idle: bool,
}

impl IdleWatch {
    pub fn new(busy_needed: u32, quiet_needed: u32) -> IdleWatch {
        IdleWatch {
            busy_needed: busy_needed.max(1),
            quiet_needed: quiet_needed.max(1),
            run: 0,
            idle: true,
        }
    }

    /// Takes one sample; returns the new state when it changed (`true`: idle).
    pub fn sample(&mut self, in_flight: i64) -> Option<bool> {
        if in_flight > 0 {
            self.run = self.run.max(0).saturating_add(1);
            if self.run >= i64::from(self.busy_needed) {
                return self.set(false);
            }
        } else {
            self.run = self.run.min(0).saturating_sub(1);
            if -self.run >= i64::from(self.quiet_needed) {
                return self.set(true);
            }
        }
        None
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
    /// turns busy (`busy` samples in a row with a request in flight) or idle (`quiet` samples in
    /// a row with none). Runs until dropped; one timer tick per `every`, nothing per request.
    pub async fn watch_idle(
        &self,
        every: Duration,
        busy: u32,
        quiet: u32,
        mut change: impl FnMut(bool),
    ) {
        let mut watch = IdleWatch::new(busy, quiet);
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
    fn load_must_last_to_make_it_busy_and_quiet_must_last_to_make_it_idle() {
        let mut watch = IdleWatch::new(2, 3);
        // Starts idle: nothing to report while nothing happens.
        assert_eq!(watch.sample(0), None);
        assert_eq!(watch.sample(0), None);
        // One request now and then does not make it busy.
        assert_eq!(watch.sample(1), None);
        assert_eq!(watch.sample(0), None);
        assert_eq!(watch.sample(3), None);
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
        assert_eq!(watch.sample(1), None);
        assert_eq!(watch.sample(1), Some(false));
    }

    #[test]
    fn one_sample_is_the_least_it_waits() {
        let mut watch = IdleWatch::new(0, 0);
        assert_eq!(watch.sample(1), Some(false));
        assert_eq!(watch.sample(0), Some(true));
        assert_eq!(watch.sample(1), Some(false));
    }
}
