//! Delay escalation, one rule for every delay Sluice grows: `initial` doubling to a cap
//! ([`ceiling`]), then jittered by one of two policies ([`Jitter`]):
//!
//! - **half** (uniform in `[d/2, d]`): the breakers' windows and the tables' backoffs,
//!   so that instances and tables that met the same outage do not all come back in the
//!   same millisecond, yet none comes back much sooner than the policy says;
//! - **full** (uniform in `[0, d]`, "full jitter"): the query gateway's retries, where
//!   clients that failed together must spread over the whole window for an overloaded
//!   server to recover.
//!
//! The random source is injectable (`Jitter::seeded`) so tests see fixed delays.

use std::time::Duration;

use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};

/// The random half of the jitter.
#[derive(Clone, Debug)]
pub struct Jitter {
    rng: SmallRng,
}

impl Jitter {
    pub fn seeded(seed: u64) -> Self {
        Self {
            rng: SmallRng::seed_from_u64(seed),
        }
    }

    pub fn from_entropy() -> Self {
        Self {
            rng: rand::make_rng::<SmallRng>(),
        }
    }

    pub fn new(seed: Option<u64>) -> Self {
        match seed {
            Some(s) => Self::seeded(s),
            None => Self::from_entropy(),
        }
    }

    /// Half jitter: uniform in `[d/2, d]`.
    pub fn apply(&mut self, d: Duration) -> Duration {
        let hi = d.as_nanos().min(u64::MAX as u128) as u64;
        if hi < 2 {
            return d;
        }
        let lo = hi / 2;
        Duration::from_nanos(self.rng.random_range(lo..=hi))
    }

    /// Full jitter: uniform in `[0, d]`.
    pub fn full(&mut self, d: Duration) -> Duration {
        let hi = d.as_nanos().min(u64::MAX as u128) as u64;
        Duration::from_nanos(self.rng.random_range(0..=hi))
    }
}

/// `initial` doubled `step` times, capped at `max` (no overflow, however many steps).
pub fn ceiling(initial: Duration, max: Duration, step: u32) -> Duration {
    let factor = 1u32.checked_shl(step.min(31)).unwrap_or(u32::MAX);
    initial.checked_mul(factor).unwrap_or(max).min(max)
}

/// One escalation sequence (a breaker's windows).
#[derive(Clone, Debug)]
pub struct Backoff {
    policy: BackoffPolicy,
    step: u32,
    jitter: Jitter,
}

impl Backoff {
    pub fn new(policy: BackoffPolicy, jitter: Jitter) -> Self {
        Self {
            policy,
            step: 0,
            jitter,
        }
    }

    pub fn policy(&self) -> &BackoffPolicy {
        &self.policy
    }

    /// The un-jittered delay of escalation step `step` (0 → initial).
    pub fn base(policy: &BackoffPolicy, step: u32) -> Duration {
        ceiling(policy.initial, policy.max, step)
    }

    /// The next window: the current step's base delay, jittered; then escalate.
    pub fn next_delay(&mut self) -> Duration {
        let base = Self::base(&self.policy, self.step);
        if base < self.policy.max {
            self.step += 1;
        }
        self.jitter.apply(base)
    }

    /// Back to `initial` (the outage is over).
    pub fn reset(&mut self) {
        self.step = 0;
    }

    /// The cap, jitter-free: the delay for rows left unacked on purpose.
    pub fn cap(&self) -> Duration {
        self.policy.max
    }

    /// A jittered `initial` that does not escalate (late reports).
    pub fn initial_jittered(&mut self) -> Duration {
        self.jitter.apply(self.policy.initial)
    }
}

/// A supervisor's respawn delay after `failures` consecutive failures (1 → initial).
pub fn restart_delay(policy: &RestartPolicy, failures: u32) -> Duration {
    ceiling(policy.initial, policy.max, failures.saturating_sub(1))
}

/// Delay escalation for an outage window (the pool's breaker, a table's backoff).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BackoffPolicy {
    /// The first window (before jitter).
    pub initial: Duration,
    /// Windows double up to this cap (before jitter). Also the delay a row left
    /// unacked is naked with (DLQ off, DLQ publish failed, tenant without target).
    pub max: Duration,
    /// While a probe is out, arrivals are handed back with at least this delay.
    pub probe_handback_min: Duration,
}

impl Default for BackoffPolicy {
    fn default() -> Self {
        Self {
            initial: Duration::from_secs(1),
            max: Duration::from_secs(30),
            probe_handback_min: Duration::from_millis(500),
        }
    }
}

/// How supervisors respawn a failed child: `initial` doubling to `max`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RestartPolicy {
    pub initial: Duration,
    pub max: Duration,
    /// A core actor (consumer, pool) whose spawn fails this many times in a row makes
    /// the pipeline fatal: the process must exit non-zero.
    pub max_spawn_failures: u32,
    /// A child that ran this long without failing starts again from `initial`.
    pub reset_after: Duration,
}

impl Default for RestartPolicy {
    fn default() -> Self {
        Self {
            initial: Duration::from_millis(100),
            max: Duration::from_secs(10),
            max_spawn_failures: 5,
            reset_after: Duration::from_secs(60),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escalates_one_two_four_to_the_cap() {
        let p = BackoffPolicy::default();
        let bases: Vec<u64> = (0..8).map(|s| Backoff::base(&p, s).as_secs()).collect();
        assert_eq!(bases, vec![1, 2, 4, 8, 16, 30, 30, 30]);
        assert_eq!(Backoff::base(&p, 200), Duration::from_secs(30));
    }

    #[test]
    fn jitter_stays_within_half_and_full() {
        let mut b = Backoff::new(BackoffPolicy::default(), Jitter::seeded(7));
        for step in 0..12u32 {
            let base = Backoff::base(&BackoffPolicy::default(), step);
            let d = b.next_delay();
            assert!(
                d >= base / 2 && d <= base,
                "step {step}: {d:?} not in [{:?}, {base:?}]",
                base / 2
            );
        }
        // Over many draws the jitter really spreads (not always the top).
        let mut j = Jitter::seeded(1);
        let draws: Vec<Duration> = (0..1000)
            .map(|_| j.apply(Duration::from_secs(10)))
            .collect();
        assert!(draws
            .iter()
            .all(|d| *d >= Duration::from_secs(5) && *d <= Duration::from_secs(10)));
        assert!(draws.iter().any(|d| *d < Duration::from_secs(6)));
        assert!(draws.iter().any(|d| *d > Duration::from_secs(9)));
    }

    #[test]
    fn reset_starts_again_at_initial() {
        let mut b = Backoff::new(BackoffPolicy::default(), Jitter::seeded(3));
        for _ in 0..6 {
            b.next_delay();
        }
        b.reset();
        assert!(b.next_delay() <= Duration::from_secs(1));
    }

    #[test]
    fn restart_delay_doubles_to_ten_seconds() {
        let p = RestartPolicy::default();
        let ms: Vec<u128> = (1..=9).map(|f| restart_delay(&p, f).as_millis()).collect();
        assert_eq!(ms, vec![100, 200, 400, 800, 1600, 3200, 6400, 10000, 10000]);
    }
}
