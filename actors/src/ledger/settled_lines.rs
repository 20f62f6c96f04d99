//! Lines of messages that went back to the queue with some of their rows settled (an
//! outage in the middle of an isolation, a row that could not be parked) for a table
//! whose batches are not recorded: when such a message comes back, those lines are not
//! sent again. This in-memory record is lost with the process (such tables are
//! at-least-once after a crash anyway). A recorded batch never needs it: its split and
//! its verdicts are in its manifest.

use std::collections::{HashMap, VecDeque};

/// At most this many messages are remembered; the oldest are forgotten first (their
/// settled lines would then be sent again: at-least-once, never a loss).
const MAX_REMEMBERED: usize = 100_000;

#[derive(Debug, Default)]
pub struct SettledLines {
    lines: HashMap<u64, Vec<u32>>,
    order: VecDeque<u64>,
}

impl SettledLines {
    pub fn remember(&mut self, partly: Vec<(u64, Vec<u32>)>) {
        for (seq, lines) in partly {
            if self.lines.insert(seq, lines).is_none() {
                self.order.push_back(seq);
            }
        }
        while self.lines.len() > MAX_REMEMBERED {
            match self.order.pop_front() {
                Some(old) => {
                    self.lines.remove(&old);
                }
                None => break,
            }
        }
    }

    /// The settled lines of these messages (by stream sequence), forgotten here: the
    /// flight that takes them reports them again if the message goes back once more.
    pub fn take(&mut self, sequences: impl Iterator<Item = u64>) -> Vec<(u64, Vec<u32>)> {
        if self.lines.is_empty() {
            return Vec::new();
        }
        sequences
            .filter_map(|seq| self.lines.remove(&seq).map(|l| (seq, l)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remembers_until_taken_and_forgets_the_oldest_past_its_bound() {
        let mut p = SettledLines::default();
        p.remember(vec![(7, vec![0, 2]), (9, vec![1])]);
        assert_eq!(p.take([9, 8].into_iter()), vec![(9, vec![1])]);
        assert_eq!(p.take([9].into_iter()), vec![]);
        p.remember(
            (0..MAX_REMEMBERED as u64 + 10)
                .map(|s| (1000 + s, vec![0]))
                .collect(),
        );
        assert!(p.lines.len() <= MAX_REMEMBERED);
        assert_eq!(p.take([7].into_iter()), vec![], "the oldest went first");
    }
}
