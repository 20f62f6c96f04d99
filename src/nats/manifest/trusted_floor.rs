//! What the collector may remove manifests by on a NATS cluster: the consumer's ack
//! floor and the ingest stream's first sequence, as every pass of the last
//! [`TRUST_WINDOW`] read them.
//!
//! A replicated consumer's leader counts an ack in its floor before its peers have it,
//! and a stream's leader removes an acked message from its work queue before its peers
//! do (nats-server 2.9 can lose that removal on a peer altogether, see
//! `super::super::acked_here`). After a leader change the floor or the first sequence
//! can be lower again, and messages below the old one are delivered again: a settled
//! manifest removed by the old value leaves its messages to come back as fresh ones,
//! inserted a second time under another token. Trusting a value once the previous pass
//! (ten seconds before) read it too was not enough: in chaos
//! `cluster_connected_node_sigstop` on 2.9.10 (stop 32) a settled manifest was collected
//! with the floor read at 820 by two passes during a node's ten-second freeze, and two
//! seconds after the freeze its messages were delivered again. So a value counts once
//! it held for a minute, longer than an election and the redelivery after it; a freeze
//! or partition longer than that can still bring rows back twice (docs/operations.md).
//! On one server the values are exact and used as read.

use std::collections::VecDeque;
use std::time::Duration;

use tokio::time::Instant;

/// How long every pass must have read a floor at least as high before it counts.
pub const TRUST_WINDOW: Duration = Duration::from_secs(60);

/// The ack floor and first sequence one pass read (or may remove by).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Floor {
    pub ack_floor: u64,
    pub first_sequence: u64,
}

/// The reads of the last [`TRUST_WINDOW`] (and the newest one before it, which covers
/// the window's start).
#[derive(Debug, Default)]
pub struct TrustedFloor {
    reads: VecDeque<(Instant, Floor)>,
}

impl TrustedFloor {
    /// A pass read `read` at `at`: what it may remove by. One server (`replicas` 1): as
    /// read. A cluster: the lowest of every read over the last window, and nothing
    /// (zero) until the reads span a whole window.
    pub fn read(&mut self, at: Instant, read: Floor, replicas: usize) -> Floor {
        if replicas <= 1 {
            return read;
        }
        self.reads.push_back((at, read));
        while self
            .reads
            .get(1)
            .is_some_and(|(then, _)| at.duration_since(*then) >= TRUST_WINDOW)
        {
            self.reads.pop_front();
        }
        let spans = self
            .reads
            .front()
            .is_some_and(|(then, _)| at.duration_since(*then) >= TRUST_WINDOW);
        if !spans {
            return Floor::default();
        }
        self.reads.iter().fold(read, |low, (_, r)| Floor {
            ack_floor: low.ack_floor.min(r.ack_floor),
            first_sequence: low.first_sequence.min(r.first_sequence),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn floor(ack_floor: u64) -> Floor {
        Floor {
            ack_floor,
            first_sequence: ack_floor + 1,
        }
    }

    const PASS: Duration = Duration::from_secs(10);

    #[test]
    fn one_server_removes_by_what_it_read() {
        let mut t = TrustedFloor::default();
        assert_eq!(t.read(Instant::now(), floor(50), 1), floor(50));
    }

    #[test]
    fn a_cluster_removes_nothing_until_a_floor_held_for_the_whole_window() {
        let mut t = TrustedFloor::default();
        let start = Instant::now();
        // Passes every ten seconds, the floor rising: nothing counts for a minute.
        for i in 0..6 {
            let got = t.read(start + PASS * i, floor(100 * u64::from(i + 1)), 3);
            assert_eq!(got, Floor::default(), "pass {i}");
        }
        // A minute after the first read: the lowest of the minute.
        assert_eq!(t.read(start + PASS * 6, floor(700), 3), floor(100));
        // Ten seconds on, the first read has left the window: the second counts.
        assert_eq!(t.read(start + PASS * 7, floor(800), 3), floor(200));
    }

    #[test]
    fn a_floor_read_lower_after_a_leader_change_counts_at_once_and_for_a_window() {
        let mut t = TrustedFloor::default();
        let start = Instant::now();
        for i in 0..=6 {
            t.read(start + PASS * i, floor(800), 3);
        }
        // The new leader lacks acks the old one had counted: 600 at once ...
        assert_eq!(t.read(start + PASS * 7, floor(600), 3), floor(600));
        // ... and for a minute after, though the old leader's 820 is read again.
        for i in 8..=12 {
            assert_eq!(
                t.read(start + PASS * i, floor(820), 3),
                floor(600),
                "pass {i}"
            );
        }
        assert_eq!(t.read(start + PASS * 14, floor(820), 3), floor(820));
    }

    #[test]
    fn the_reads_kept_stay_bounded_by_the_window() {
        let mut t = TrustedFloor::default();
        let start = Instant::now();
        for i in 0..1000 {
            t.read(start + PASS * i, floor(u64::from(i)), 3);
        }
        assert!(t.reads.len() <= 7, "{}", t.reads.len());
    }
}
