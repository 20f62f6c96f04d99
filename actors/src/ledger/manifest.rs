//! A batch's record: its identity (the messages, in the order their rows are sent), the
//! ingest stream it came from, and how far it got (open, split, settled).
//!
//! Pure: identities, tokens and states. The [`ManifestStore`](super::ManifestStore)
//! keeps them; the rest of the ledger decides with them.

use std::sync::Arc;

use super::split::Split;
use crate::ports::{Class, ClickHouseError, TableKey};

/// One batch's identity and, once judged, its verdicts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Manifest {
    /// `<first sequence>-<last sequence>-<hash of every sequence>`: the same for the same
    /// messages, whoever forms the batch; a valid key for a key-value store.
    pub id: String,
    pub table: TableKey,
    /// The ingest stream's incarnation (its creation time): a stream deleted and made
    /// again numbers its messages from 1 again, and a second deployment on the same
    /// ClickHouse numbers its own from 1 too. Part of every token, so neither can ever
    /// send a token an earlier batch used.
    pub incarnation: u64,
    /// The batch's messages by stream sequence, ascending: the order their rows are sent.
    pub messages: Vec<u64>,
    /// The shard of its target the batch goes to (0-based, in the order the target's
    /// `shards` lists them), chosen when it is claimed: every retry and every copy
    /// formed again goes to a replica of this shard, whose replicas share the
    /// Replicated table's block ids (another shard would take the rows again).
    pub shard: u32,
    /// When the batch was claimed (before its first attempt), in ms since the epoch; 0
    /// when unknown (a record written before this was kept). A retry later than the
    /// table's deduplication window is counted: ClickHouse may take it twice.
    pub claimed_at_ms: u64,
    /// The store's revision of the batch's claim (its first record): the order two
    /// batches holding one message are judged by, the earlier winning. Kept through the
    /// batch's later states, whose own revisions come after other batches' claims (a
    /// store that ordered by those would let a batch that lost its claim win over one
    /// whose rows went in). 0 until the store told it: then the revision it is read at.
    pub claim_revision: u64,
    pub state: ManifestState,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ManifestState {
    /// Attempts of the whole batch may be under way or to come; no row is settled.
    Open,
    /// Isolation started: the batch is never sent whole again. Every attempt from now on
    /// sends exactly one of the split's untried ranges, so a range already inserted is
    /// deduplicated by ClickHouse instead of going in again under another block.
    Split(Split),
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
    /// On the DLQ already: a copy of its message delivered again is acked without
    /// parking the row a second time.
    pub parked: bool,
}

impl RejectedRow {
    /// The reason the row is parked with.
    pub fn reason(&self) -> ClickHouseError {
        ClickHouseError {
            class: self.class,
            code: self.code,
            table_scoped: false,
            splittable: false,
            missing_table: false,
            status: None,
            no_answer: None,
            message: self.error.clone(),
        }
    }
}

// === impl Manifest ===

impl Manifest {
    /// A batch of these messages (any order: they are sorted) of the ingest stream's
    /// `incarnation`.
    pub fn new(table: TableKey, incarnation: u64, mut messages: Vec<u64>) -> Self {
        messages.sort_unstable();
        messages.dedup();
        Self {
            id: id_of(&messages),
            table,
            incarnation,
            messages,
            shard: 0,
            claimed_at_ms: 0,
            claim_revision: 0,
            state: ManifestState::Open,
        }
    }

    /// The same batch, for shard `shard` of its target.
    pub fn on_shard(self, shard: u32) -> Self {
        Self { shard, ..self }
    }

    /// The same batch, claimed at `ms` (since the epoch).
    pub fn claimed_at(self, ms: u64) -> Self {
        Self {
            claimed_at_ms: ms,
            ..self
        }
    }

    /// The same batch, whose claim the store recorded at `revision`.
    pub fn claimed_as(self, revision: u64) -> Self {
        Self {
            claim_revision: revision,
            ..self
        }
    }

    /// The order of this batch's claim among others (see [`Manifest::claim_revision`]),
    /// when the store holds this state of it at `revision`.
    pub fn claim_order(&self, revision: u64) -> u64 {
        if self.claim_revision > 0 {
            self.claim_revision
        } else {
            revision
        }
    }

    /// How long ago the batch was claimed, if known.
    pub fn age(&self, now_ms: u64) -> Option<std::time::Duration> {
        (self.claimed_at_ms > 0)
            .then(|| std::time::Duration::from_millis(now_ms.saturating_sub(self.claimed_at_ms)))
    }

    /// The token of the whole batch's insert. A record written before tokens named the
    /// incarnation (read with incarnation 0: no stream is made at the epoch) keeps the
    /// token its first attempts carried.
    pub fn token(&self) -> String {
        if self.incarnation == 0 {
            format!("sluice-{}", self.id)
        } else {
            format!("sluice-{:x}-{}", self.incarnation, self.id)
        }
    }

    /// The token of the insert of rows `lo..hi` (an isolation's sub-request): the same
    /// range of the same batch always gets the same token.
    pub fn token_of(&self, lo: usize, hi: usize, rows: usize) -> String {
        if lo == 0 && hi == rows {
            self.token()
        } else {
            format!("{}-{lo}-{hi}", self.token())
        }
    }

    pub fn is_settled(&self) -> bool {
        matches!(self.state, ManifestState::Settled { .. })
    }

    /// The split, once isolation started.
    pub fn split(&self) -> Option<&Split> {
        match &self.state {
            ManifestState::Split(split) => Some(split),
            _ => None,
        }
    }

    /// The same batch in another state.
    pub fn with_state(&self, state: ManifestState) -> Self {
        Self {
            state,
            ..self.clone()
        }
    }

    /// Whether the batch holds the message at this stream sequence. A batch's messages
    /// are mostly one run of consecutive sequences, so the place the sequence would
    /// have in such a run is tried before the search (an index asks this per message).
    pub fn holds(&self, stream_sequence: u64) -> bool {
        let (Some(&first), Some(&last)) = (self.messages.first(), self.messages.last()) else {
            return false;
        };
        if stream_sequence < first || stream_sequence > last {
            return false;
        }
        let in_a_run = usize::try_from(stream_sequence - first).ok();
        if in_a_run.and_then(|i| self.messages.get(i)) == Some(&stream_sequence) {
            return true;
        }
        self.messages.binary_search(&stream_sequence).is_ok()
    }

    /// The verdict recorded for one row, once settled: `None` while not settled (and
    /// for a message not of the batch); `Some(None)` inserted; `Some(Some(reason))`
    /// rejected.
    pub fn verdict(&self, stream_sequence: u64, line: u32) -> Option<Option<Arc<ClickHouseError>>> {
        let ManifestState::Settled { rejected } = &self.state else {
            return None;
        };
        // Not a message of this batch: its record says nothing of it.
        if !self.holds(stream_sequence) {
            return None;
        }
        Some(
            rejected
                .iter()
                .find(|r| r.stream_sequence == stream_sequence && r.line == line)
                .map(|r| Arc::new(r.reason())),
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
    fn a_batch_holds_its_messages_and_nothing_between_or_around_them() {
        let m = Manifest::new(key(), 7, vec![10, 11, 12, 20, 22]);
        let held: Vec<u64> = (0..30).filter(|s| m.holds(*s)).collect();
        assert_eq!(held, vec![10, 11, 12, 20, 22]);
        assert!(!Manifest::new(key(), 7, vec![]).holds(0));
    }

    #[test]
    fn the_same_messages_make_the_same_batch_whoever_forms_it() {
        let a = Manifest::new(key(), 7, vec![7, 3, 5, 9]);
        let b = Manifest::new(key(), 7, vec![9, 5, 3, 7, 7]);
        assert_eq!(a, b);
        assert_eq!(a.messages, vec![3, 5, 7, 9]);
        assert!(a.id.starts_with("3-9-"), "{}", a.id);
        assert!(a.id.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'));
        // One message more or less is another batch, with another token.
        let c = Manifest::new(key(), 7, vec![3, 5, 7]);
        let d = Manifest::new(key(), 7, vec![3, 5, 7, 9, 11]);
        assert_ne!(a.token(), c.token());
        assert_ne!(a.token(), d.token());
        // Same ends, other middle: still another batch.
        let e = Manifest::new(key(), 7, vec![3, 6, 7, 9]);
        assert_ne!(a.id, e.id);
    }

    #[test]
    fn the_same_sequences_of_another_stream_incarnation_have_another_token() {
        // A stream made again (or a second deployment) numbers its messages from 1 too.
        let before = Manifest::new(key(), 1_700_000_000_000_000_000, vec![1, 2, 3]);
        let after = Manifest::new(key(), 1_800_000_000_000_000_000, vec![1, 2, 3]);
        assert_eq!(
            before.id, after.id,
            "the same messages: the same key in its stream"
        );
        assert_ne!(before.token(), after.token());
        assert_ne!(before.token_of(0, 1, 3), after.token_of(0, 1, 3));
    }

    #[test]
    fn a_sub_range_has_a_token_of_its_own_the_whole_batch_the_batchs() {
        let m = Manifest::new(key(), 7, vec![1, 2, 3]);
        assert_eq!(m.token_of(0, 30, 30), m.token());
        assert_eq!(m.token_of(0, 15, 30), m.token_of(0, 15, 30));
        assert_ne!(m.token_of(0, 15, 30), m.token_of(15, 30, 30));
    }

    #[test]
    fn a_settled_manifest_tells_each_rows_verdict() {
        let mut m = Manifest::new(key(), 7, vec![10, 11]);
        assert_eq!(m.verdict(10, 0), None, "open: no verdict yet");
        m.state = ManifestState::Settled {
            rejected: vec![RejectedRow {
                stream_sequence: 11,
                line: 2,
                class: Class::Rejected,
                code: Some(27),
                error: "Cannot parse input".into(),
                parked: false,
            }],
        };
        assert_eq!(m.verdict(10, 0), Some(None));
        assert_eq!(m.verdict(11, 0), Some(None));
        assert_eq!(m.verdict(12, 0), None, "not a message of the batch");
        let reason = m.verdict(11, 2).flatten().expect("rejected");
        assert_eq!((reason.class, reason.code), (Class::Rejected, Some(27)));
    }
}
