//! Rate-limited snapshot publication: an actor publishes when something changed and
//! at least `every` passed, or at once for a transition (`force`).

use std::time::Duration;

use tokio::time::Instant;

/// Rate-limits snapshot publication: publish when something changed and at least
/// `every` passed, or at once for transitions (`force`).
#[derive(Debug)]
pub struct SnapshotThrottle {
    every: Duration,
    last: Option<Instant>,
    pub dirty: bool,
    /// A transition happened: the next look publishes whatever the rate.
    urgent: bool,
}

impl SnapshotThrottle {
    pub fn new(every: Duration) -> Self {
        Self {
            every,
            last: None,
            dirty: true,
            urgent: false,
        }
    }

    /// A transition (connected, a probe answered, a flight ended): the next publication
    /// goes at once, however soon after the last. Handlers mark it and publish once,
    /// after their `match`.
    pub fn transition(&mut self) {
        self.dirty = true;
        self.urgent = true;
    }

    /// Should the actor publish now?
    pub fn due(&mut self, force: bool) -> bool {
        let now = Instant::now();
        let due = force
            || self.urgent
            || (self.dirty
                && self
                    .last
                    .is_none_or(|l| now.saturating_duration_since(l) >= self.every));
        if due {
            self.last = Some(now);
            self.dirty = false;
            self.urgent = false;
        }
        due
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn changes_wait_for_the_interval_and_a_transition_does_not() {
        let mut t = SnapshotThrottle::new(Duration::from_secs(1));
        assert!(t.due(false), "the first snapshot goes at once");
        t.dirty = true;
        assert!(!t.due(false), "a change right after waits");
        t.transition();
        assert!(t.due(false), "a transition goes at once");
        assert!(!t.due(false), "and only once");
        t.dirty = true;
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(t.due(false), "a change goes once the interval passed");
    }
}
