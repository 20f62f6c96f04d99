//! How a supervisor reads its children's ends and paces their respawns: one rule for
//! the RootSupervisor (consumer, pools) and the PoolActors (tables).

use std::time::Duration;

use ractor::{ActorId, SupervisionEvent};
use tokio::time::Instant;

use crate::backoff::RestartPolicy;

/// A panic's message, when its payload is text (`panic!` with a message makes a `&str`
/// or a `String`): for a flight's caught panic and the log's panic hook alike.
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> Option<String> {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
}

/// The child a supervision event reports gone, with why: a panic or error, or a stop
/// nobody asked for. Other events (starts, state changes) are `None`.
pub fn child_gone(evt: SupervisionEvent) -> Option<(ActorId, String)> {
    match evt {
        SupervisionEvent::ActorFailed(cell, err) => Some((cell.get_id(), err.to_string())),
        SupervisionEvent::ActorTerminated(cell, _, reason) => {
            Some((cell.get_id(), reason.unwrap_or_else(|| "stopped".into())))
        }
        _ => None,
    }
}

/// A child's failures in a row, which pace its respawns: `initial` doubling to `max`,
/// back to `initial` once it ran `reset_after` without failing.
#[derive(Clone, Debug, Default)]
pub struct RestartRecord {
    failures_in_row: u32,
    last_failure: Option<Instant>,
}

// === impl RestartRecord ===

impl RestartRecord {
    /// The child failed now: how long to wait before respawning it.
    pub fn failed(&mut self, now: Instant, policy: &RestartPolicy) -> Duration {
        self.failures_in_row = match self.last_failure {
            Some(t) if now.saturating_duration_since(t) < policy.reset_after => {
                self.failures_in_row + 1
            }
            _ => 1,
        };
        self.last_failure = Some(now);
        crate::backoff::restart_delay(policy, self.failures_in_row)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn respawns_slow_down_in_a_row_and_start_over_after_a_quiet_spell() {
        let policy = RestartPolicy::default();
        let mut r = RestartRecord::default();
        let t0 = Instant::now();
        let delays: Vec<u128> = (0..4)
            .map(|i| r.failed(t0 + Duration::from_secs(i), &policy).as_millis())
            .collect();
        assert_eq!(delays, vec![100, 200, 400, 800]);
        let later = t0 + policy.reset_after + Duration::from_secs(10);
        assert_eq!(r.failed(later, &policy), Duration::from_millis(100));
    }
}
