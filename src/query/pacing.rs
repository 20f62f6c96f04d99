//! The pause before each retry of a query: full jitter over a doubling ceiling.
//!
//! `pause = uniform(0, min(max, base · 2^retry))`. Why full jitter: clients that failed
//! together (an overload fails everyone at once) and back off by the same amount come
//! back together and fail together again; drawing the whole pause at random spreads
//! them over the window, which is what lets an overloaded server recover. The doubling
//! and the jitter are the actors' ([`sluice_actors::backoff`]): one rule, two policies
//! (the breakers use half jitter).

use std::time::Duration;

use sluice_actors::backoff::{ceiling, Jitter};

/// How far apart a query's retries are.
#[derive(Clone, Copy, Debug)]
pub struct RetryPacing {
    pub base: Duration,
    pub max: Duration,
}

impl RetryPacing {
    /// The upper bound of the pause before retry number `retry` (0 for the first retry).
    pub fn ceiling(&self, retry: u32) -> Duration {
        ceiling(self.base, self.max, retry)
    }

    /// A pause drawn uniformly from `[0, ceiling(retry)]`.
    pub fn pause(&self, retry: u32) -> Duration {
        Jitter::from_entropy().full(self.ceiling(retry))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::time::Instant;

    fn pacing() -> RetryPacing {
        RetryPacing {
            base: Duration::from_millis(100),
            max: Duration::from_secs(2),
        }
    }

    #[test]
    fn ceiling_doubles_then_caps() {
        let b = pacing();
        let ceilings: Vec<_> = (0..7).map(|r| b.ceiling(r).as_millis()).collect();
        assert_eq!(ceilings, [100, 200, 400, 800, 1600, 2000, 2000]);
        assert_eq!(b.ceiling(1000), Duration::from_secs(2), "no overflow");
    }

    #[test]
    fn pauses_stay_within_zero_and_the_ceiling_and_spread_out() {
        let b = pacing();
        for retry in 0..8 {
            let ceiling = b.ceiling(retry);
            let draws: Vec<_> = (0..500).map(|_| b.pause(retry)).collect();
            assert!(draws.iter().all(|d| *d <= ceiling), "retry {retry}");
            // Full jitter: draws land in the lower and the upper half alike.
            let low = draws.iter().filter(|d| **d < ceiling / 2).count();
            assert!(low > 100 && low < 400, "retry {retry}: {low} of 500 low");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn sleeping_the_drawn_pause_never_exceeds_the_ceiling() {
        let b = pacing();
        for retry in 0..6 {
            let start = Instant::now();
            tokio::time::sleep(b.pause(retry)).await;
            assert!(start.elapsed() <= b.ceiling(retry), "retry {retry}");
        }
    }

    #[test]
    fn zero_base_means_no_pause() {
        let b = RetryPacing {
            base: Duration::ZERO,
            max: Duration::ZERO,
        };
        assert_eq!(b.pause(3), Duration::ZERO);
    }
}
