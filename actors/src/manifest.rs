//! Batch manifests: what makes an insert into a deduplicating table exactly-once.
//!
//! ClickHouse deduplicates an insert into a `Replicated*MergeTree` (or a `MergeTree` with
//! `non_replicated_deduplication_window`) when it carries the same rows as an insert it
//! already took (the block's hash; `insert_deduplication_token` where the server has
//! it). So a retry is harmless exactly when it sends the same rows as the first attempt.
//! A manifest makes that hold across everything that can come between two attempts — an
//! ambiguous failure, a crash of Sluice, of nats-server or of ClickHouse, a second
//! instance picking the rows up:
//!
//! 1. Before a batch's first attempt its identity is recorded in the
//!    [`ManifestStore`](crate::ports::ManifestStore): its messages by stream sequence,
//!    in the order their rows are sent, and its token.
//! 2. A message redelivered while its manifest is open is put back into exactly that
//!    batch, by whichever instance receives it (the rows it does not hold are read from
//!    the stream), and sent again with the same token; isolation splits it the same way.
//! 3. Once every row is judged, the verdicts are recorded before any row is settled: a
//!    message redelivered afterwards is settled by them, with no insert.
//! 4. Once every row is settled and the last ack confirmed, the manifest is removed
//!    (orphans are collected by the store).
//!
//! Pure: identities, tokens and the verdicts' record. The store does the I/O.

use std::sync::Arc;

use crate::ports::{Class, ClickHouseError, TableKey};

/// One batch's identity and, once judged, its verdicts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Manifest {
    /// `<first sequence>-<last sequence>-<hash of every sequence>`: the same for the same
    /// messages, whoever forms the batch; a valid key for a key-value store.
    pub id: String,
    pub table: TableKey,
    /// The batch's messages by stream sequence, ascending: the order their rows are sent.
    pub messages: Vec<u64>,
    pub state: ManifestState,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ManifestState {
    /// Attempts may be under way or to come; no row is settled.
    Open,
    /// Every row was judged: inserted, except these, rejected alone. A message
    /// redelivered now is settled by this, with no insert.
    Settled { rejected: Vec<RejectedRow> },
}

/// A row ClickHouse rejected alone, and why (the reason it is parked with).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RejectedRow {
    pub stream_sequence: u64,
    /// The row's line within its message (0 for a one-row message).
    pub line: u32,
    pub class: Class,
    pub code: Option<u32>,
    pub error: String,
}

// === impl Manifest ===

impl Manifest {
    /// A batch of these messages (any order: they are sorted).
    pub fn new(table: TableKey, mut messages: Vec<u64>) -> Self {
        messages.sort_unstable();
        messages.dedup();
        Self {
            id: id_of(&messages),
            table,
            messages,
            state: ManifestState::Open,
        }
    }

    /// The token of the whole batch's insert.
    pub fn token(&self) -> String {
        format!("sluice-{}", self.id)
    }

    /// The token of the insert of rows `lo..hi` (an isolation's sub-request): the same
    /// range of the same batch always gets the same token.
    pub fn token_of(&self, lo: usize, hi: usize, rows: usize) -> String {
        if lo == 0 && hi == rows {
            self.token()
        } else {
            format!("sluice-{}-{lo}-{hi}", self.id)
        }
    }

    pub fn is_settled(&self) -> bool {
        matches!(self.state, ManifestState::Settled { .. })
    }

    /// The verdict recorded for one row, once settled: `None` while open; `Some(None)`
    /// inserted; `Some(Some(reason))` rejected. `None` too for a message not of the batch.
    pub fn verdict(&self, stream_sequence: u64, line: u32) -> Option<Option<Arc<ClickHouseError>>> {
        let ManifestState::Settled { rejected } = &self.state else {
            return None;
        };
        // Not a message of this batch: its record says nothing of it.
        self.messages.binary_search(&stream_sequence).ok()?;
        Some(
            rejected
                .iter()
                .find(|r| r.stream_sequence == stream_sequence && r.line == line)
                .map(|r| {
                    Arc::new(ClickHouseError {
                        class: r.class,
                        code: r.code,
                        table_scoped: false,
                        splittable: false,
                        missing_table: false,
                        status: None,
                        message: r.error.clone(),
                    })
                }),
        )
    }
}

/// FNV-1a over the sequences: cheap, stable across versions and machines (a std hasher
/// is not promised to be).
fn id_of(messages: &[u64]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for seq in messages {
        for b in seq.to_le_bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    let first = messages.first().copied().unwrap_or(0);
    let last = messages.last().copied().unwrap_or(0);
    format!("{first}-{last}-{h:016x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> TableKey {
        TableKey::new("acme", "events")
    }

    #[test]
    fn the_same_messages_make_the_same_batch_whoever_forms_it() {
        let a = Manifest::new(key(), vec![7, 3, 5, 9]);
        let b = Manifest::new(key(), vec![9, 5, 3, 7, 7]);
        assert_eq!(a, b);
        assert_eq!(a.messages, vec![3, 5, 7, 9]);
        assert!(a.id.starts_with("3-9-"), "{}", a.id);
        assert!(a.id.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'));
        // One message more or less is another batch, with another token.
        let c = Manifest::new(key(), vec![3, 5, 7]);
        let d = Manifest::new(key(), vec![3, 5, 7, 9, 11]);
        assert_ne!(a.token(), c.token());
        assert_ne!(a.token(), d.token());
        // Same ends, other middle: still another batch.
        let e = Manifest::new(key(), vec![3, 6, 7, 9]);
        assert_ne!(a.id, e.id);
    }

    #[test]
    fn a_sub_range_has_a_token_of_its_own_the_whole_batch_the_batchs() {
        let m = Manifest::new(key(), vec![1, 2, 3]);
        assert_eq!(m.token_of(0, 30, 30), m.token());
        assert_eq!(m.token_of(0, 15, 30), m.token_of(0, 15, 30));
        assert_ne!(m.token_of(0, 15, 30), m.token_of(15, 30, 30));
    }

    #[test]
    fn a_settled_manifest_tells_each_rows_verdict() {
        let mut m = Manifest::new(key(), vec![10, 11]);
        assert_eq!(m.verdict(10, 0), None, "open: no verdict yet");
        m.state = ManifestState::Settled {
            rejected: vec![RejectedRow {
                stream_sequence: 11,
                line: 2,
                class: Class::Rejected,
                code: Some(27),
                error: "Cannot parse input".into(),
            }],
        };
        assert_eq!(m.verdict(10, 0), Some(None));
        assert_eq!(m.verdict(11, 0), Some(None));
        let reason = m.verdict(11, 2).flatten().expect("rejected");
        assert_eq!((reason.class, reason.code), (Class::Rejected, Some(27)));
    }
}
