//! One table's buffer: the rows, their bytes (each with its `\n`), the oldest row's age,
//! and the flush triggers.

use std::time::Duration;

use tokio::time::Instant;

use crate::ports::Delivery;
use crate::settings::TableSettings;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Trigger {
    Rows,
    Bytes,
    Age,
}

#[derive(Debug)]
pub struct Buffer<D> {
    rows: Vec<D>,
    bytes: usize,
    oldest: Option<Instant>,
}

impl<D: Delivery> Default for Buffer<D> {
    fn default() -> Self {
        Self {
            rows: Vec::new(),
            bytes: 0,
            oldest: None,
        }
    }
}

pub fn row_bytes<D: Delivery>(rows: &[D]) -> usize {
    rows.iter().map(|d| d.payload().len() + 1).sum()
}

impl<D: Delivery> Buffer<D> {
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }

    pub fn oldest(&self) -> Option<Instant> {
        self.oldest
    }

    pub fn push(&mut self, mut batch: Vec<D>, bytes: usize, now: Instant) {
        if batch.is_empty() {
            return;
        }
        if self.rows.is_empty() {
            // Take the vector as it is: no copy for the common case.
            std::mem::swap(&mut self.rows, &mut batch);
            self.rows.append(&mut batch);
        } else {
            self.rows.append(&mut batch);
        }
        self.bytes += bytes;
        self.oldest.get_or_insert(now);
    }

    /// The trigger that makes a flush due now, if any.
    pub fn due(&self, s: &TableSettings, now: Instant) -> Option<Trigger> {
        let oldest = self.oldest?;
        if self.rows.len() >= s.batch_rows {
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

    /// Take one batch: at most `max_rows` rows and (past the first row) `max_bytes`
    /// bytes. Returns the rows, their bytes and since when they were held.
    pub fn take(&mut self, max_rows: usize, max_bytes: usize) -> (Vec<D>, usize, Instant) {
        let held_since = self.oldest.unwrap_or_else(Instant::now);
        if self.rows.len() <= max_rows && self.bytes <= max_bytes {
            let bytes = std::mem::take(&mut self.bytes);
            self.oldest = None;
            return (std::mem::take(&mut self.rows), bytes, held_since);
        }
        let mut n = 0;
        let mut bytes = 0;
        for d in &self.rows {
            let b = d.payload().len() + 1;
            if n >= max_rows || (n > 0 && bytes + b > max_bytes) {
                break;
            }
            n += 1;
            bytes += b;
        }
        let rest = self.rows.split_off(n);
        let batch = std::mem::replace(&mut self.rows, rest);
        self.bytes -= bytes;
        if self.rows.is_empty() {
            self.oldest = None;
        }
        (batch, bytes, held_since)
    }

    pub fn iter(&self) -> impl Iterator<Item = &D> {
        self.rows.iter()
    }

    pub fn take_all(&mut self) -> Vec<D> {
        self.bytes = 0;
        self.oldest = None;
        std::mem::take(&mut self.rows)
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
    use crate::testkit::Ledger;

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
        let ledger = Ledger::new();
        let now = Instant::now();
        let mut b = Buffer::default();
        let rows = ledger.rows("ingest.a.b", 3); // {"n":0} = 7 bytes + \n
        let bytes = row_bytes(&rows);
        assert_eq!(bytes, 24);
        b.push(rows, bytes, now);
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
}
