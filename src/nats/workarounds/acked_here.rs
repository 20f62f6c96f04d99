//! The stream sequences this process acked lately: what lets it remove an acked
//! message a replicated stream kept although the consumer's ack floor says nothing of
//! it.
//!
//! In a NATS cluster a work-queue stream's replicas each remove an acked message on
//! their own, and nats-server 2.9 can lose that on the stream's leader when the
//! consumer's leader changes (frozen past the election timeout): the stream keeps
//! messages whose rows were inserted and acked, while the consumer's new leader shows
//! a floor below them and nothing pending. Nothing delivers them again, but they hold
//! on to the stream's byte budget, and a later leader change could deliver them again.
//! The ack floor cannot tell them from rows not yet delivered; this process can, for
//! the ones it acked itself (see `super::stranded`).
//!
//! Spans of consecutive sequences, each with its last ack's time, at most
//! [`MAX_SPANS`]: the lowest (the oldest) give way first, their messages then removed
//! only once the floor passes them.

use std::collections::BTreeMap;
use std::sync::Mutex;

use sluice_actors::Position;
use tokio::time::Instant;

/// The most spans kept (a few hundred KiB). Acks of one batch come in order, so a
/// span holds a batch's messages or more.
pub const MAX_SPANS: usize = 20_000;

/// One run of consecutive acked sequences.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Span {
    /// The last sequence of the run (the first is the map's key).
    last: u64,
    /// When the newest ack of the run was sent.
    acked_at: Instant,
}

/// Sequences acked by this process and not yet looked at by a removal pass.
#[derive(Debug, Default)]
pub struct AckedHere {
    spans: Mutex<BTreeMap<u64, Span>>,
}

impl AckedHere {
    /// `sequence` was acked at `now`.
    pub fn record(&self, sequence: u64, now: Instant) {
        let mut spans = self.lock();
        // The span it extends (ends right before it) or already lies in.
        let before = spans
            .range(..=sequence)
            .next_back()
            .map(|(first, span)| (*first, *span));
        let first = match before {
            Some((first, span)) if span.last + 1 >= sequence => {
                let last = span.last.max(sequence);
                spans.insert(
                    first,
                    Span {
                        last,
                        acked_at: now,
                    },
                );
                first
            }
            _ => {
                spans.insert(
                    sequence,
                    Span {
                        last: sequence,
                        acked_at: now,
                    },
                );
                sequence
            }
        };
        // The span right after it joins it.
        let last = spans.get(&first).map_or(sequence, |s| s.last);
        if let Some(next) = last.checked_add(1).and_then(|n| spans.remove(&n)) {
            if let Some(span) = spans.get_mut(&first) {
                span.last = next.last;
            }
        }
        while spans.len() > MAX_SPANS {
            spans.pop_first();
        }
    }

    /// Takes out the spans whose last ack is no later than `cutoff` (inclusive first
    /// and last sequences, lowest first): each is looked at once.
    pub fn take_acked_before(&self, cutoff: Instant) -> Vec<(u64, u64)> {
        self.take_acked_before_in(0, cutoff)
    }

    /// [`AckedHere::take_acked_before`] of one partition of the queue: the sequences are
    /// recorded as the queue names them (`Position::in_partition`), and come out as
    /// its stream's own. A span never runs over two partitions (2^48 apart).
    pub fn take_acked_before_in(&self, partition: usize, cutoff: Instant) -> Vec<(u64, u64)> {
        let low = Position::in_partition(partition, 0);
        let high = Position::in_partition(partition + 1, 0);
        let mut spans = self.lock();
        let old: Vec<(u64, u64)> = spans
            .range(low..high)
            .filter(|(_, span)| span.acked_at <= cutoff)
            .map(|(first, span)| (*first, span.last))
            .collect();
        for (first, _) in &old {
            spans.remove(first);
        }
        old.into_iter()
            .map(|(first, last)| (Position::sequence_of(first), Position::sequence_of(last)))
            .collect()
    }

    /// Spans a removal pass took and could not look at (the stream did not answer, or
    /// the pass reached its bound): looked at by the next pass.
    pub fn put_back(&self, spans: &[(u64, u64)], acked_at: Instant) {
        self.put_back_in(0, spans, acked_at);
    }

    /// [`AckedHere::put_back`] of one partition's spans, as its stream numbers them.
    pub fn put_back_in(&self, partition: usize, spans: &[(u64, u64)], acked_at: Instant) {
        let mut held = self.lock();
        for &(first, last) in spans {
            let (first, last) = (
                Position::in_partition(partition, first),
                Position::in_partition(partition, last),
            );
            held.entry(first)
                .and_modify(|span| span.last = span.last.max(last))
                .or_insert(Span { last, acked_at });
        }
        while held.len() > MAX_SPANS {
            held.pop_first();
        }
    }

    /// Spans held now (for tests and the bound).
    pub fn spans(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, Span>> {
        // Each change is whole before the lock is let go: a poisoned map is still sound.
        self.spans.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn consecutive_acks_make_one_span_in_whatever_order() {
        let t0 = Instant::now();
        let acked = AckedHere::default();
        for seq in [5, 6, 8, 7, 4, 8] {
            acked.record(seq, t0);
        }
        acked.record(20, t0);
        assert_eq!(acked.spans(), 2);
        assert_eq!(acked.take_acked_before(t0), vec![(4, 8), (20, 20)]);
        assert_eq!(acked.spans(), 0, "each span is taken once");
    }

    #[test]
    fn a_span_is_taken_only_once_its_newest_ack_is_old_enough() {
        let t0 = Instant::now();
        let later = t0 + Duration::from_secs(10);
        let acked = AckedHere::default();
        acked.record(1, t0);
        acked.record(2, later);
        acked.record(9, t0);
        assert_eq!(acked.take_acked_before(t0), vec![(9, 9)]);
        assert_eq!(acked.take_acked_before(later), vec![(1, 2)]);
        // Partitions: each takes its own, as its stream numbers them.
        acked.record(Position::in_partition(2, 7), t0);
        acked.record(Position::in_partition(2, 8), t0);
        acked.record(Position::in_partition(1, 7), t0);
        assert_eq!(acked.take_acked_before_in(2, t0), vec![(7, 8)]);
        acked.put_back_in(2, &[(7, 8)], t0);
        assert_eq!(acked.take_acked_before_in(1, t0), vec![(7, 7)]);
        assert_eq!(acked.take_acked_before_in(2, t0), vec![(7, 8)]);
        assert_eq!(acked.spans(), 0);
    }

    #[test]
    fn the_oldest_spans_give_way_at_the_bound() {
        let t0 = Instant::now();
        let acked = AckedHere::default();
        for n in 0..(MAX_SPANS as u64 + 10) {
            acked.record(n * 2, t0);
        }
        assert_eq!(acked.spans(), MAX_SPANS);
        let kept = acked.take_acked_before(t0);
        assert_eq!(kept.first(), Some(&(20, 20)), "the ten lowest went");
    }
}
