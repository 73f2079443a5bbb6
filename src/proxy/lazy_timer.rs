//! One timer for a connection's run of deadlines, moved as little as it can be.
//!
//! A keep-alive connection waits for each request under an idle deadline, and an upstream
//! connection waits for each response head under a deadline of its own. A tokio `Sleep` made
//! for each wait is a timer-wheel insert when first polled and a removal when dropped: little
//! work, but code that a cold request fetches twice over (about 200 instruction-cache lines a
//! request, `benches/footprint.py`). A [`LazyTimer`] stays armed at the deadline it has: a wait
//! for a later deadline leaves it there and moves it only if it fires first (as nginx's timers
//! do), and a wait for an earlier one moves it at once. Each wait's deadline is on time; a
//! connection's timer moves about once per idle period instead of twice per request.

use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use tokio::time::{Instant, Sleep};

/// A connection's timer, armed on first use; see the module's documentation.
#[derive(Default)]
pub(crate) struct LazyTimer {
    sleep: Option<Pin<Box<Sleep>>>,
}

impl LazyTimer {
    /// Ready once `deadline` has passed. The waker of the last poll is the one woken, as with
    /// any future; a timer left armed past its wait may wake a task that no longer waits on it,
    /// which finds nothing to do.
    pub(crate) fn poll_until(&mut self, deadline: Instant, cx: &mut Context<'_>) -> Poll<()> {
        let sleep = self
            .sleep
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        if sleep.deadline() > deadline {
            sleep.as_mut().reset(deadline);
        }
        loop {
            ready!(sleep.as_mut().poll(cx));
            if sleep.deadline() >= deadline {
                return Poll::Ready(());
            }
            // Fired for an earlier wait's deadline: on to this one's.
            sleep.as_mut().reset(deadline);
        }
    }

    /// The deadline the timer is armed at, if it has been used.
    #[cfg(test)]
    fn armed(&self) -> Option<Instant> {
        self.sleep.as_ref().map(|s| s.deadline())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::poll_fn;
    use std::task::Waker;
    use std::time::Duration;

    fn poll(timer: &mut LazyTimer, deadline: Instant) -> Poll<()> {
        timer.poll_until(deadline, &mut Context::from_waker(Waker::noop()))
    }

    /// Runs the paused clock to a millisecond before `deadline` (the wait still on), then to it
    /// (the wait over).
    async fn ends_exactly_at(timer: &mut LazyTimer, deadline: Instant) {
        tokio::time::advance(deadline - Instant::now() - Duration::from_millis(1)).await;
        assert!(poll(timer, deadline).is_pending());
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(poll(timer, deadline).is_ready());
    }

    #[tokio::test(start_paused = true)]
    async fn a_wait_ends_at_its_deadline_and_not_before() {
        let mut timer = LazyTimer::default();
        let deadline = Instant::now() + Duration::from_secs(10);
        assert!(poll(&mut timer, deadline).is_pending());
        ends_exactly_at(&mut timer, deadline).await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_later_deadline_leaves_the_timer_where_it_is_and_still_waits_for_its_own() {
        let mut timer = LazyTimer::default();
        let first = Instant::now() + Duration::from_secs(10);
        assert!(poll(&mut timer, first).is_pending());
        tokio::time::advance(Duration::from_secs(4)).await;
        // The next wait's deadline is later: the timer is not moved for it...
        let second = Instant::now() + Duration::from_secs(10);
        assert!(poll(&mut timer, second).is_pending());
        assert_eq!(timer.armed(), Some(first));
        // ...and when it fires at the first deadline, the wait goes on to its own.
        tokio::time::advance(Duration::from_secs(6)).await;
        assert!(poll(&mut timer, second).is_pending());
        assert_eq!(timer.armed(), Some(second));
        ends_exactly_at(&mut timer, second).await;
    }

    #[tokio::test(start_paused = true)]
    async fn an_earlier_deadline_moves_the_timer_at_once() {
        let mut timer = LazyTimer::default();
        assert!(poll(&mut timer, Instant::now() + Duration::from_secs(75)).is_pending());
        let soon = Instant::now() + Duration::from_secs(5);
        // Awaited, so the paused clock runs to the timer: it must be the earlier deadline.
        poll_fn(|cx| timer.poll_until(soon, cx)).await;
        assert_eq!(Instant::now(), soon);
    }

    #[tokio::test(start_paused = true)]
    async fn a_timer_that_fired_long_ago_is_armed_again_for_the_next_wait() {
        let mut timer = LazyTimer::default();
        let first = Instant::now() + Duration::from_secs(1);
        poll_fn(|cx| timer.poll_until(first, cx)).await;
        tokio::time::advance(Duration::from_secs(60)).await;
        let next = Instant::now() + Duration::from_secs(2);
        assert!(poll(&mut timer, next).is_pending());
        poll_fn(|cx| timer.poll_until(next, cx)).await;
        assert_eq!(Instant::now(), next);
    }
}
