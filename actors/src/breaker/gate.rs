//! A breaker as routing sees it: whether a server takes requests now, its probe is
//! due, or it turns requests away for a while. Read off a breaker's state (the pools
//! publish theirs on the target's board) by the tables that pick a server.

use std::time::Duration;

use super::BreakerState;

/// A breaker as routing sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gate {
    /// Takes requests.
    Closed,
    /// Its window ended and nobody probed yet: the next request is its probe.
    ProbeDue,
    /// Turns requests away for about this long (a window open, or a probe out).
    Wait(Duration),
}

impl Gate {
    /// A breaker's gate at `now`; `probe_wait`: what a request is told while a probe
    /// is out.
    pub fn of(state: BreakerState, now: tokio::time::Instant, probe_wait: Duration) -> Gate {
        match state {
            BreakerState::Closed => Gate::Closed,
            BreakerState::Open { until } if now < until => Gate::Wait(until - now),
            BreakerState::Open { .. } => Gate::ProbeDue,
            BreakerState::Probing { .. } => Gate::Wait(probe_wait),
        }
    }

    /// Both gates must let a request through: the replica's pool's and the table's
    /// own for that replica.
    pub fn and(self, other: Gate) -> Gate {
        match (self, other) {
            (Gate::Wait(a), Gate::Wait(b)) => Gate::Wait(a.max(b)),
            (Gate::Wait(a), _) | (_, Gate::Wait(a)) => Gate::Wait(a),
            (Gate::ProbeDue, _) | (_, Gate::ProbeDue) => Gate::ProbeDue,
            (Gate::Closed, Gate::Closed) => Gate::Closed,
        }
    }

    /// Closed first, then a probe due; a waiting gate is never picked.
    pub(crate) fn rank(self) -> Option<u8> {
        match self {
            Gate::Closed => Some(0),
            Gate::ProbeDue => Some(1),
            Gate::Wait(_) => None,
        }
    }
}
