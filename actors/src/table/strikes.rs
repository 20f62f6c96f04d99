//! Messages suspected of crashing ClickHouse. A row ClickHouse crashes on (a nesting
//! bomb its parser cannot take) looks like an outage: the connection is lost, the rows
//! go back, ClickHouse restarts, the rows come again, and it crashes again. What tells
//! it from a real outage is that it happens while ClickHouse was taking inserts — the
//! flight went with the pool's breaker closed, not as a probe — again and again. Each
//! such loss is a strike against every message of the flight; a batch holding a message
//! with `poison_strikes` strikes is isolated (see `bisect::lost_on_rows`).

use std::collections::{HashMap, VecDeque};

/// At most this many messages carry strikes; the oldest are forgotten first.
const MAX_TRACKED: usize = 100_000;

#[derive(Debug, Default)]
pub struct Strikes {
    counts: HashMap<u64, u32>,
    order: VecDeque<u64>,
}

impl Strikes {
    pub fn strike(&mut self, messages: &[u64]) {
        for seq in messages {
            let count = self.counts.entry(*seq).or_insert_with(|| {
                self.order.push_back(*seq);
                0
            });
            *count += 1;
        }
        while self.counts.len() > MAX_TRACKED {
            match self.order.pop_front() {
                Some(old) => {
                    self.counts.remove(&old);
                }
                None => break,
            }
        }
    }

    /// Whether any of these messages has `threshold` strikes or more.
    pub fn suspect(&self, mut messages: impl Iterator<Item = u64>, threshold: u32) -> bool {
        !self.counts.is_empty()
            && messages.any(|seq| self.counts.get(&seq).is_some_and(|n| *n >= threshold))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_is_suspect_from_its_threshold_on() {
        let mut s = Strikes::default();
        s.strike(&[1, 2]);
        s.strike(&[1]);
        assert!(!s.suspect([1, 2, 3].into_iter(), 3));
        s.strike(&[1]);
        assert!(s.suspect([3, 1].into_iter(), 3));
        assert!(!s.suspect([2, 3].into_iter(), 3));
    }
}
