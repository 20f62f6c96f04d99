//! The board of one target's replicas: each replica's PoolActor publishes its breaker
//! here at every transition, and the target's tables read it to pick the replica a
//! batch goes to ([`crate::placement::pick`]), the target to know whether any replica
//! takes rows at all.
//!
//! An observation, never a decision: the pool still admits or turns each request away
//! in its mailbox; a state read a moment before it changed costs one more message.

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use crate::breaker::BreakerState;
use crate::breaker::Gate;

const CLOSED: u8 = 0;
const OPEN: u8 = 1;
const PROBING: u8 = 2;

/// One replica's published breaker.
#[derive(Debug, Default)]
struct Cell {
    phase: AtomicU8,
    /// The open window's end, in ns after the board's epoch.
    until: AtomicU64,
}

#[derive(Debug)]
pub struct ReplicaBoard {
    epoch: Instant,
    /// What a request is told while a probe is out (`probe_handback_min`).
    probe_wait: Duration,
    cells: Vec<Cell>,
}

impl ReplicaBoard {
    /// `replicas` cells, every breaker closed.
    pub fn new(replicas: usize, probe_wait: Duration) -> Self {
        Self {
            epoch: Instant::now(),
            probe_wait,
            cells: (0..replicas.max(1)).map(|_| Cell::default()).collect(),
        }
    }

    /// A pool publishes its breaker (after every transition, and when it starts).
    pub fn publish(&self, replica: usize, state: BreakerState) {
        let Some(cell) = self.cells.get(replica) else {
            return;
        };
        let phase = match state {
            BreakerState::Closed => CLOSED,
            BreakerState::Open { until } => {
                let ns = until.saturating_duration_since(self.epoch).as_nanos();
                cell.until
                    .store(u64::try_from(ns).unwrap_or(u64::MAX), Ordering::Relaxed);
                OPEN
            }
            BreakerState::Probing { .. } => PROBING,
        };
        cell.phase.store(phase, Ordering::Release);
    }

    /// Replica `replica`'s breaker as routing sees it at `now`.
    pub fn gate(&self, replica: usize, now: Instant) -> Gate {
        let Some(cell) = self.cells.get(replica) else {
            return Gate::Closed;
        };
        match cell.phase.load(Ordering::Acquire) {
            OPEN => {
                let until = self.epoch + Duration::from_nanos(cell.until.load(Ordering::Relaxed));
                Gate::of(BreakerState::Open { until }, now, self.probe_wait)
            }
            PROBING => Gate::Wait(self.probe_wait),
            _ => Gate::Closed,
        }
    }

    /// Every replica's gate, by replica index.
    pub fn gates(&self, now: Instant) -> Vec<Gate> {
        (0..self.cells.len()).map(|r| self.gate(r, now)).collect()
    }

    pub fn replicas(&self) -> usize {
        self.cells.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn what_a_pool_publishes_is_what_routing_reads() {
        let board = ReplicaBoard::new(2, Duration::from_millis(500));
        let now = Instant::now();
        assert_eq!(board.gates(now), vec![Gate::Closed, Gate::Closed]);
        board.publish(
            1,
            BreakerState::Open {
                until: now + Duration::from_secs(2),
            },
        );
        assert_eq!(board.gate(1, now), Gate::Wait(Duration::from_secs(2)));
        tokio::time::advance(Duration::from_secs(2)).await;
        assert_eq!(board.gate(1, Instant::now()), Gate::ProbeDue);
        board.publish(1, BreakerState::Probing { since: now });
        assert_eq!(board.gate(1, now), Gate::Wait(Duration::from_millis(500)));
        board.publish(1, BreakerState::Closed);
        assert_eq!(board.gate(1, now), Gate::Closed);
        assert_eq!(
            board.gate(7, now),
            Gate::Closed,
            "no such replica: no opinion"
        );
    }
}
