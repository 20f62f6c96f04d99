//! One table's buffer: the messages (each one row or many), their rows and bytes (each
//! row with its `\n`), the oldest message's age, and the flush triggers. Limits count
//! rows and bytes, never messages: a message of 100 rows weighs 100.

use std::time::Duration;

use tokio::time::Instant;

use crate::ports::Delivery;
use crate::rows::row_count;
use crate::settings::TableSettings;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Trigger {
    Rows,
    Bytes,
    Age,
}

#[derive(Debug)]
pub struct Buffer<D> {
    messages: Vec<D>,
    /// Rows in `messages`.
    rows: usize,
    bytes: usize,
    oldest: Option<Instant>,
}

impl<D: Delivery> Default for Buffer<D> {
    fn default() -> Self {
        Self {
            messages: Vec::new(),
            rows: 0,
            bytes: 0,
            oldest: None,
        }
    }
}

/// The rows and bytes of some messages, as the limits count them.
pub fn weigh<D: Delivery>(messages: &[D]) -> (usize, usize) {
    messages.iter().fold((0, 0), |(rows, bytes), d| {
        let (r, b) = weigh_one(d);
        (rows + r, bytes + b)
    })
}

fn weigh_one<D: Delivery>(d: &D) -> (usize, usize) {
    let payload = d.payload();
    (row_count(payload), payload.len() + 1)
}

impl<D: Delivery> Buffer<D> {
    /// Rows buffered.
    pub fn len(&self) -> usize {
        self.rows
    }

    pub fn is_empty(&self) -> bool {
        self.messages.is_empty()
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }

    pub fn oldest(&self) -> Option<Instant> {
        self.oldest
    }

    /// Add messages weighing `rows` and `bytes` (see [`weigh`]).
    pub fn push(&mut self, mut batch: Vec<D>, (rows, bytes): (usize, usize), now: Instant) {
        if batch.is_empty() {
            return;
        }
        if self.messages.is_empty() {
            // Take the vector as it is: no copy for the common case.
            std::mem::swap(&mut self.messages, &mut batch);
            self.messages.append(&mut batch);
        } else {
            self.messages.append(&mut batch);
        }
        self.rows += rows;
        self.bytes += bytes;
        self.oldest.get_or_insert(now);
    }

    /// The trigger that makes a flush due now, if any.
    pub fn due(&self, s: &TableSettings, now: Instant) -> Option<Trigger> {
        let oldest = self.oldest?;
        if self.rows >= s.batch_rows {
            Some(Trigger::Rows)
        } else if self.bytes >= s.batch_bytes {
            Some(Trigger::Bytes)
        } else if now.saturating_duration_since(oldest) >= s.batch_age {
            Some(Trigger::Age)
        } else {
            None
        }
    }

    /// When the age trigger fires for the rows buffered now.
    pub fn age_deadline(&self, s: &TableSettings) -> Option<Instant> {
        self.oldest.map(|o| o + s.batch_age)
    }

    /// Take one batch: whole messages, at most `max_rows` rows and (past the first
    /// message) `max_bytes` bytes; a message is never split across batches (its rows
    /// are settled together). Returns the messages, their bytes and since when they
    /// were held.
    pub fn take(&mut self, max_rows: usize, max_bytes: usize) -> (Vec<D>, usize, Instant) {
        let held_since = self.oldest.unwrap_or_else(Instant::now);
        if self.rows <= max_rows && self.bytes <= max_bytes {
            let bytes = std::mem::take(&mut self.bytes);
            self.rows = 0;
            self.oldest = None;
            return (std::mem::take(&mut self.messages), bytes, held_since);
        }
        let (mut n, mut rows, mut bytes) = (0, 0, 0);
        for d in &self.messages {
            let (r, b) = weigh_one(d);
            if n > 0 && (rows + r > max_rows || bytes + b > max_bytes) {
                break;
            }
            n += 1;
            rows += r;
            bytes += b;
        }
        let rest = self.messages.split_off(n);
        let batch = std::mem::replace(&mut self.messages, rest);
        self.rows -= rows;
        self.bytes -= bytes;
        if self.messages.is_empty() {
            self.oldest = None;
        }
        (batch, bytes, held_since)
    }

    pub fn iter(&self) -> impl Iterator<Item = &D> {
        self.messages.iter()
    }

    pub fn take_all(&mut self) -> Vec<D> {
        self.rows = 0;
        self.bytes = 0;
        self.oldest = None;
        std::mem::take(&mut self.messages)
    }

    pub fn age(&self, now: Instant) -> Duration {
        self.oldest
            .map(|o| now.saturating_duration_since(o))
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::Journal;

    fn settings(rows: usize, bytes: usize, age_ms: u64) -> TableSettings {
        TableSettings {
            batch_rows: rows,
            batch_bytes: bytes,
            batch_age: Duration::from_millis(age_ms),
            ..Default::default()
        }
    }

    #[tokio::test(start_paused = true)]
    async fn triggers_by_rows_bytes_and_age() {
        let journal = Journal::new();
        let now = Instant::now();
        let mut b = Buffer::default();
        let rows = journal.rows("ingest.a.b", 3); // {"n":0} = 7 bytes + \n
        let weight = weigh(&rows);
        assert_eq!(weight, (3, 24));
        b.push(rows, weight, now);
        assert_eq!(b.due(&settings(3, 1000, 1000), now), Some(Trigger::Rows));
        assert_eq!(b.due(&settings(4, 24, 1000), now), Some(Trigger::Bytes));
        assert_eq!(b.due(&settings(4, 1000, 1000), now), None);
        assert_eq!(
            b.due(&settings(4, 1000, 1000), now + Duration::from_secs(1)),
            Some(Trigger::Age)
        );
        let (batch, bytes, _) = b.take(2, 1000);
        assert_eq!((batch.len(), bytes, b.len(), b.bytes()), (2, 16, 1, 8));
        let (batch, _, _) = b.take(10, 1);
        assert_eq!(
            batch.len(),
            1,
            "the first row always goes, whatever its size"
        );
        assert!(b.is_empty() && b.oldest().is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn many_row_messages_weigh_their_rows_and_are_never_split() {
        let journal = Journal::new();
        let subject: std::sync::Arc<str> = std::sync::Arc::from("ingest.a.b");
        let now = Instant::now();
        let mut b = Buffer::default();
        let messages: Vec<_> = (0..3)
            .map(|m| {
                let rows: String = (0..4)
                    .map(|i| format!("{{\"n\":{}}}\n", m * 4 + i))
                    .collect();
                journal.delivery(&subject, rows)
            })
            .collect();
        let weight = weigh(&messages);
        assert_eq!(weight.0, 12);
        b.push(messages, weight, now);
        assert_eq!(b.len(), 12);
        assert_eq!(
            b.due(&settings(10, 1 << 20, 1000), now),
            Some(Trigger::Rows)
        );
        // 10 rows asked: two whole messages (8 rows), never part of the third.
        let (batch, _, _) = b.take(10, 1 << 20);
        assert_eq!((batch.len(), b.len()), (2, 4));
        // A message bigger than a batch still goes, alone.
        let (batch, _, _) = b.take(2, 1 << 20);
        assert_eq!((batch.len(), b.len()), (1, 0));
    }
}
