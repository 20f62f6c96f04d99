//! Messages suspected of crashing ClickHouse. A row ClickHouse crashes on (a nesting
//! bomb its parser cannot take) looks like an outage: the connection is lost, the rows
//! go back, ClickHouse restarts, the rows come again, and it crashes again. What tells
//! it from a real outage is that it happens while ClickHouse was taking inserts — the
//! flight went with the pool's breaker closed, not as a probe — again and again. Each
//! such loss is a strike against every message of the flight. A batch holding a message
//! with `poison_strikes` strikes flies alone; a loss alone is one more strike, and only
//! a batch that lost the connection alone before is isolated when it loses it alone
//! again (see [`Suspicion`] and `bisect::lost_on_rows`).

use std::collections::{HashMap, VecDeque};

use crate::protocol::Suspicion;

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

    /// The suspicion of a batch of these messages: by the most struck of them against
    /// `threshold` (`poison_strikes`).
    pub fn suspicion(&self, messages: impl Iterator<Item = u64>, threshold: u32) -> Suspicion {
        if self.counts.is_empty() {
            return Suspicion::Clear;
        }
        let most = messages
            .filter_map(|seq| self.counts.get(&seq).copied())
            .max()
            .unwrap_or(0);
        if most > threshold {
            Suspicion::IsolatedIfLostAlone
        } else if most == threshold {
            Suspicion::FliesAlone
        } else {
            Suspicion::Clear
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_flies_alone_from_its_threshold_on_and_is_isolated_only_past_it() {
        let mut s = Strikes::default();
        s.strike(&[1, 2]);
        s.strike(&[1]);
        assert_eq!(s.suspicion([1, 2, 3].into_iter(), 3), Suspicion::Clear);
        s.strike(&[1]);
        assert_eq!(s.suspicion([3, 1].into_iter(), 3), Suspicion::FliesAlone);
        assert_eq!(s.suspicion([2, 3].into_iter(), 3), Suspicion::Clear);
        // Lost alone once: one strike more. Only the next loss alone judges its rows.
        s.strike(&[1]);
        assert_eq!(
            s.suspicion([2, 1].into_iter(), 3),
            Suspicion::IsolatedIfLostAlone
        );
        assert!(Suspicion::FliesAlone.flies_alone());
        assert!(!Suspicion::Clear.flies_alone());
    }
}
