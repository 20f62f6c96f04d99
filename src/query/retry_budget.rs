//! The global retry budget: a token bucket every retry must take from.
//!
//! Why a budget and not just `max_attempts`: during an overload every query fails at
//! once, and N attempts per query multiply the load by N exactly when ClickHouse can
//! take the least. A bucket shared by all queries caps retries at `capacity` in a burst
//! and `refill_per_sec` sustained, whatever the request rate; once it is empty a failure
//! is answered at once (503 + `Retry-After`) instead of being repeated.
//!
//! Time comes from `tokio::time::Instant`, so tests drive it with a paused clock.

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use super::metrics;

#[derive(Debug)]
pub struct RetryBudget {
    capacity: f64,
    refill_per_sec: f64,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    tokens: f64,
    last: Instant,
}

impl RetryBudget {
    /// A full bucket. Negative or non-finite figures are treated as zero (the config
    /// validation refuses them; this keeps the arithmetic total anyway).
    pub fn new(capacity: f64, refill_per_sec: f64) -> Self {
        let capacity = if capacity.is_finite() {
            capacity.max(0.0)
        } else {
            0.0
        };
        let refill_per_sec = if refill_per_sec.is_finite() {
            refill_per_sec.max(0.0)
        } else {
            0.0
        };
        metrics::budget_tokens(capacity);
        RetryBudget {
            capacity,
            refill_per_sec,
            state: Mutex::new(State {
                tokens: capacity,
                last: Instant::now(),
            }),
        }
    }

    /// Take one token for a retry. `Err(wait)` when the bucket holds less than one:
    /// `wait` is how long until it will (`None` when it never refills).
    pub fn try_take(&self) -> Result<(), Option<Duration>> {
        let mut state = self.lock();
        self.refill(&mut state);
        let result = if state.tokens >= 1.0 {
            state.tokens -= 1.0;
            Ok(())
        } else {
            Err(self.wait_for_one(state.tokens))
        };
        metrics::budget_tokens(state.tokens);
        result
    }

    /// Tokens available now (refilled up to this instant).
    pub fn tokens(&self) -> f64 {
        let mut state = self.lock();
        self.refill(&mut state);
        metrics::budget_tokens(state.tokens);
        state.tokens
    }

    fn refill(&self, state: &mut State) {
        let now = Instant::now();
        let elapsed = now.saturating_duration_since(state.last).as_secs_f64();
        state.tokens = (state.tokens + elapsed * self.refill_per_sec).min(self.capacity);
        state.last = now;
    }

    fn wait_for_one(&self, tokens: f64) -> Option<Duration> {
        if self.refill_per_sec <= 0.0 || self.capacity < 1.0 {
            return None;
        }
        Duration::try_from_secs_f64((1.0 - tokens) / self.refill_per_sec).ok()
    }

    /// A poisoned lock only means another thread panicked while holding it; the two
    /// numbers inside are still meaningful, so keep going rather than fail every query.
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn starts_full_and_empties_after_capacity_takes() {
        let b = RetryBudget::new(3.0, 1.0);
        assert_eq!(b.tokens(), 3.0);
        for _ in 0..3 {
            assert!(b.try_take().is_ok());
        }
        let wait = b.try_take().expect_err("empty");
        assert_eq!(wait, Some(Duration::from_secs(1)));
    }

    #[tokio::test(start_paused = true)]
    async fn refills_at_the_configured_rate_up_to_capacity() {
        let b = RetryBudget::new(2.0, 4.0);
        assert!(b.try_take().is_ok());
        assert!(b.try_take().is_ok());
        assert!(b.try_take().is_err());
        tokio::time::advance(Duration::from_millis(250)).await;
        assert!(b.try_take().is_ok(), "one token after 1/4 s at 4/s");
        assert!(b.try_take().is_err());
        tokio::time::advance(Duration::from_millis(125)).await;
        let wait = b.try_take().expect_err("half a token");
        assert_eq!(wait, Some(Duration::from_millis(125)));
        tokio::time::advance(Duration::from_secs(3600)).await;
        assert_eq!(b.tokens(), 2.0, "never above capacity");
    }

    #[tokio::test(start_paused = true)]
    async fn zero_budget_never_grants() {
        let b = RetryBudget::new(0.0, 1.0);
        assert_eq!(b.try_take(), Err(None));
        tokio::time::advance(Duration::from_secs(10)).await;
        assert_eq!(b.try_take(), Err(None), "capacity 0 can never hold a token");
    }

    #[tokio::test(start_paused = true)]
    async fn no_refill_means_no_wait_estimate() {
        let b = RetryBudget::new(1.0, 0.0);
        assert!(b.try_take().is_ok());
        tokio::time::advance(Duration::from_secs(10)).await;
        assert_eq!(b.try_take(), Err(None));
    }

    #[tokio::test(start_paused = true)]
    async fn fractional_capacity_is_floored_by_the_one_token_rule() {
        let b = RetryBudget::new(1.5, 1.0);
        assert!(b.try_take().is_ok());
        assert!(b.try_take().is_err(), "half a token is not a retry");
    }

    #[test]
    fn nonsense_figures_are_zero() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("runtime");
        rt.block_on(async {
            let b = RetryBudget::new(f64::NAN, -1.0);
            assert_eq!(b.try_take(), Err(None));
        });
    }
}
