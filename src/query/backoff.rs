//! Full-jitter exponential backoff between query attempts.
//!
//! `sleep = uniform(0, min(max, base · 2^retry))`. Why full jitter: clients that failed
//! together (an overload fails everyone at once) and back off by the same amount come
//! back together and fail together again; drawing the whole delay at random spreads
//! them over the window, which is what lets an overloaded server recover.

use std::time::Duration;

use rand::RngExt;

#[derive(Clone, Copy, Debug)]
pub struct Backoff {
    pub base: Duration,
    pub max: Duration,
}

impl Backoff {
    /// The upper bound of the delay before retry number `retry` (0 for the first retry).
    pub fn ceiling(&self, retry: u32) -> Duration {
        let factor = 2u32.checked_pow(retry).unwrap_or(u32::MAX);
        self.base.saturating_mul(factor).min(self.max)
    }

    /// A delay drawn uniformly from `[0, ceiling(retry)]`.
    pub fn delay(&self, retry: u32) -> Duration {
        let ceiling = self.ceiling(retry);
        if ceiling.is_zero() {
            return Duration::ZERO;
        }
        let nanos = u64::try_from(ceiling.as_nanos()).unwrap_or(u64::MAX);
        Duration::from_nanos(rand::rng().random_range(0..=nanos))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::time::Instant;

    fn backoff() -> Backoff {
        Backoff {
            base: Duration::from_millis(100),
            max: Duration::from_secs(2),
        }
    }

    #[test]
    fn ceiling_doubles_then_caps() {
        let b = backoff();
        let ceilings: Vec<_> = (0..7).map(|r| b.ceiling(r).as_millis()).collect();
        assert_eq!(ceilings, [100, 200, 400, 800, 1600, 2000, 2000]);
        assert_eq!(b.ceiling(1000), Duration::from_secs(2), "no overflow");
    }

    #[test]
    fn delays_stay_within_zero_and_the_ceiling_and_spread_out() {
        let b = backoff();
        for retry in 0..8 {
            let ceiling = b.ceiling(retry);
            let draws: Vec<_> = (0..500).map(|_| b.delay(retry)).collect();
            assert!(draws.iter().all(|d| *d <= ceiling), "retry {retry}");
            // Full jitter: draws land in the lower and the upper half alike.
            let low = draws.iter().filter(|d| **d < ceiling / 2).count();
            assert!(low > 100 && low < 400, "retry {retry}: {low} of 500 low");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn sleeping_the_drawn_delay_never_exceeds_the_ceiling() {
        let b = backoff();
        for retry in 0..6 {
            let start = Instant::now();
            tokio::time::sleep(b.delay(retry)).await;
            assert!(start.elapsed() <= b.ceiling(retry), "retry {retry}");
        }
    }

    #[test]
    fn zero_base_means_no_delay() {
        let b = Backoff {
            base: Duration::ZERO,
            max: Duration::ZERO,
        };
        assert_eq!(b.delay(3), Duration::ZERO);
    }
}
