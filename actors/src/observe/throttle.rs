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
}

impl SnapshotThrottle {
    pub fn new(every: Duration) -> Self {
        Self {
            every,
            last: None,
            dirty: true,
        }
    }

    /// Should the actor publish now?
    pub fn due(&mut self, force: bool) -> bool {
        let now = Instant::now();
        let due = force
            || (self.dirty
                && self
                    .last
                    .is_none_or(|l| now.saturating_duration_since(l) >= self.every));
        if due {
            self.last = Some(now);
            self.dirty = false;
        }
        due
    }
}
