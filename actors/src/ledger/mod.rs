//! The batch ledger: everything that makes an insert into a table ClickHouse
//! deduplicates exactly-once, in one place (see docs/architecture.md, "The batch
//! ledger").
//!
//! ClickHouse deduplicates an insert into a `Replicated*MergeTree` (or a `MergeTree`
//! with `non_replicated_deduplication_window`) when it carries the same rows as a block
//! it already took (the block's hash; `insert_deduplication_token` where the server has
//! it). So a retry is harmless exactly when it sends the same rows as the first attempt.
//! The ledger makes that hold across everything that can come between two attempts: an
//! ambiguous failure, a crash of Sluice, of nats-server or of ClickHouse, a second
//! instance picking the messages up.
//!
//! The contract, in the order a batch meets it:
//!
//! 1. **Sort arrivals** ([`TableLedger::sort`], in the table's mailbox, from the table's
//!    own index): a message of no recorded batch is fresh; one of a batch whose verdicts
//!    are recorded is settled by them, with no insert; one of a batch still open is
//!    gathered to fly again as exactly that batch.
//! 2. **Claim** (`forming::claim_fresh`): before a fresh batch's first attempt its
//!    identity (its messages by stream sequence, in the order their rows are sent, and
//!    the stream's incarnation: the token) is recorded. The store answers typed: claimed,
//!    a conflict (a batch recorded earlier holds one of its messages and wins), a lease
//!    lost (a message may be in another batch by now), the store down. Nothing is sent
//!    unclaimed.
//! 3. **Form again** (`forming::reform`): a recorded batch is formed from its record
//!    as the store holds it now: the same messages, the rows in the same order, the same
//!    token; a split batch resumes its split (`split`), never whole.
//! 4. **Record** (`session`): a split before any range of it is sent on its own; the
//!    verdicts before any row is settled; the rows parked before any message is acked;
//!    each write over the record as its flight last read it (compare-and-set), and a
//!    batch formed again marks its attempt before it is sent.
//! 5. **Release**: once every ack is confirmed, the record is removed, but not before
//!    [`keep_settled_for`] has passed (a copy of a message held under an older lease
//!    must meet the record, not a gap); the store collects the records nothing removes
//!    by the same rule.
//!
//! A table whose inserts ClickHouse does not deduplicate records nothing: its
//! `settled_lines::SettledLines` keep, in memory, the lines of messages
//! handed back with some rows settled (at-least-once).
//!
//! The store ([`ManifestStore`]) is the only I/O: its changes reach each table as
//! messages, into the table's [`index::BatchIndex`].

pub(crate) mod forming;
pub(crate) mod gathering;
pub(crate) mod handle;
pub(crate) mod index;
pub(crate) mod manifest;
pub(crate) mod session;
pub(crate) mod settled_lines;
pub(crate) mod split;
pub(crate) mod store;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

pub use handle::Ledger;
pub use index::BatchIndex;
pub use manifest::{Manifest, ManifestState, RejectedRow};
pub use split::{RowRange, Split, SplitRejection};
pub use store::{
    Changes, ClaimError, FetchError, LedgerChange, LedgerSnapshot, ManifestStore, Recorded,
    StoreError, UpdateError,
};

use crate::batch::{Batch, RowVerdict, SettlePlan, Settled};
use crate::ports::Delivery;
use gathering::{Gathering, Gatherings};
use index::SequenceSet;
use settled_lines::SettledLines;

/// How long a settled batch's record stays before anything removes it (its flight, or
/// the store's collector, counting from when it saw the record settled): `ack_wait`.
///
/// A copy of a message can outlive the batch that settled it: an instance that stood
/// still (SIGSTOP, a stalled runtime), or a consumer leader change that handed every
/// pending message out again at once, leaves a copy here while another instance
/// inserts, settles, acks it. Such a copy was received before that batch settled. While
/// the record stays, the copy's claim meets it (a conflict: settled by the record, no
/// insert). Once it is gone, the copy has been held here longer than `ack_wait`, and a
/// fresh claim looks such messages up in the stream first (`forming::claim_fresh`): an
/// acked one is no longer there. Without the wait, the copy formed a batch of its own,
/// with no record to meet, sent it to another shard than the first one's and its rows
/// went in twice (simulation, seed 215 of the partitions work).
pub fn keep_settled_for(ack_wait: Duration) -> Duration {
    ack_wait
}

/// Why a batch was not sent (its messages go back and come again).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LedgerRefusal {
    /// The store could not be read or written (NATS down, the bucket full): the only
    /// refusal counted as a store failure.
    #[error("the manifest store: {0}")]
    StoreDown(StoreError),
    /// The store has not read the ingest stream yet (nothing can be recorded before).
    #[error("the manifest store has not read the ingest stream yet (is NATS reachable?)")]
    NotReady,
    #[error(
        "batch {id} shares messages with batch {earlier}, recorded first: they go back to join it"
    )]
    Conflict { id: String, earlier: String },
    #[error("batch {id} was held past ack_wait while it was recorded: its messages may be in another batch by now")]
    LeaseLost { id: String },
    /// A message held here longer than a settled record is kept has left the stream:
    /// it was acked, its rows settled by another batch whose record is gone. The
    /// claim is withdrawn; what is still queued comes again.
    #[error(
        "batch {id} holds {gone} message(s) acked elsewhere while they were held here: not sent"
    )]
    AckedElsewhere { id: String, gone: usize },
    /// Another flight recorded the batch since this one read it: the rows go back, to
    /// be formed from the record as it is now.
    #[error("batch {id} was recorded by another flight meanwhile: its rows go back to be formed from the record as it is now")]
    Superseded { id: String },
    /// A recorded batch formed again without every one of its messages.
    #[error("recorded batch {id} formed again without all of its {messages} messages")]
    NotWhole { id: String, messages: usize },
    /// A recorded split that does not fit its batch (a damaged record: a batch's rows
    /// are a function of its messages).
    #[error("the recorded split of batch {id} does not cover its {rows} rows exactly once: nothing is sent")]
    SplitMismatch { id: String, rows: usize },
    /// A recorded batch routed to another shard than its record's (1-based, as the
    /// docs count shards).
    #[error("batch {id} is recorded for shard {recorded}, and was about to go to shard {routed}: not sent")]
    WrongShard {
        id: String,
        recorded: usize,
        routed: usize,
    },
}

impl LedgerRefusal {
    /// Whether the refusal is the store's failure (counted, and waited out with the
    /// store's retry delay), not a decision of the ledger.
    pub fn is_store_failure(&self) -> bool {
        matches!(self, LedgerRefusal::StoreDown(_) | LedgerRefusal::NotReady)
    }
}

/// Arrivals, sorted.
pub struct Sorted<D> {
    /// Of no recorded batch.
    pub fresh: Vec<D>,
    /// Of batches whose verdicts are recorded: settle them by those.
    pub settled: Vec<(Arc<Manifest>, Vec<D>)>,
    /// Batches whose gathering this opened: arm their `reform_wait`.
    pub opened: Vec<String>,
    /// Fresh messages delivered before (a nak, `ack_wait`): no record covers them, so
    /// they go into a new batch. On an exactly-once table that is where a duplicate
    /// starts, should a record of theirs have expired or gone while a copy was out.
    pub uncovered: usize,
}

/// How often a table logs messages delivered again that no record covers (they are
/// counted every time).
pub const UNCOVERED_LOG_EVERY: std::time::Duration = std::time::Duration::from_secs(60);

/// One table's part of the ledger: its index of recorded batches, the batches being
/// gathered to fly again, and (for a table whose batches are not recorded) the lines
/// already settled of messages that went back. Owned by the table's actor.
pub struct TableLedger<D> {
    index: BatchIndex,
    gatherings: Gatherings<D>,
    settled_lines: SettledLines,
    /// The messages the table's flights hold now (by stream sequence). A second copy
    /// of one (nats-server 2.9 delivers a message handed back to a dropped pull request
    /// again as new) must not fly beside it: into a table that records nothing that is
    /// a second insert, and a row ClickHouse crashes on would crash it again, and be
    /// isolated and parked twice. Hashed as the index's sequences are: with SipHash
    /// its three operations per message cost ~5% of Sluice's instructions per row.
    flying: SequenceSet,
    /// When messages no record covers were last logged (see [`Sorted::uncovered`]).
    uncovered_logged: Option<Instant>,
}

impl<D> Default for TableLedger<D> {
    fn default() -> Self {
        Self {
            index: BatchIndex::default(),
            gatherings: Gatherings::default(),
            settled_lines: SettledLines::default(),
            flying: SequenceSet::default(),
            uncovered_logged: None,
        }
    }
}

impl<D: Delivery> TableLedger<D> {
    /// Start (again) from the store's snapshot of the table.
    pub fn load(&mut self, snapshot: LedgerSnapshot) {
        self.index.load(snapshot);
    }

    /// Changes the store reported. Returns the gathered messages of batches settled
    /// meanwhile: settle them by their record.
    pub fn apply(&mut self, changes: Vec<LedgerChange>) -> Vec<(Arc<Manifest>, Vec<D>)> {
        let mut settled = Vec::new();
        for change in changes {
            if let LedgerChange::Put { manifest, .. } = &change {
                if manifest.is_settled() {
                    if let Some(held) = self.gatherings.take(&manifest.id) {
                        settled.push((manifest.clone(), held));
                    }
                }
            }
            self.index.apply(change);
        }
        settled
    }

    /// Which batch each arriving message belongs to. Every message is looked up, first
    /// deliveries too: nats-server 2.9 hands a message back to a dropped pull request
    /// and then delivers it again as new (deliveries 1).
    pub fn sort(&mut self, arrivals: Vec<D>, now: Instant) -> Sorted<D> {
        let mut sorted = Sorted {
            fresh: Vec::new(),
            settled: Vec::new(),
            opened: Vec::new(),
            uncovered: 0,
        };
        // Nearly always none is recorded: then the messages stay where they are (moving
        // each one into a new vector showed in the CPU per row).
        if self.index.is_empty()
            || arrivals
                .iter()
                .all(|d| self.index.holding(d.position().stream_sequence).is_none())
        {
            sorted.fresh = arrivals;
            sorted.uncovered = delivered_before(&sorted.fresh);
            return sorted;
        }
        sorted.fresh.reserve(arrivals.len());
        for d in arrivals {
            match self.index.holding(d.position().stream_sequence).cloned() {
                None => sorted.fresh.push(d),
                Some(m) if m.is_settled() => {
                    match sorted.settled.iter_mut().find(|(s, _)| s.id == m.id) {
                        Some((_, held)) => held.push(d),
                        None => sorted.settled.push((m, vec![d])),
                    }
                }
                Some(m) => {
                    let id = m.id.clone();
                    if self.gatherings.add(m, d, now) {
                        sorted.opened.push(id);
                    }
                }
            }
        }
        sorted.uncovered = delivered_before(&sorted.fresh);
        sorted
    }

    /// Whether messages no record covers are to be logged now (at most once every
    /// [`UNCOVERED_LOG_EVERY`]).
    pub fn log_uncovered(&mut self, now: Instant) -> bool {
        let due = self
            .uncovered_logged
            .is_none_or(|at| now.duration_since(at) >= UNCOVERED_LOG_EVERY);
        if due {
            self.uncovered_logged = Some(now);
        }
        due
    }

    /// The wait for batch `id`'s messages is over: it flies with what came.
    pub fn wait_over(&mut self, id: &str) {
        self.gatherings.wait_over(id);
    }

    pub fn has_ready(&self) -> bool {
        self.gatherings.has_ready()
    }

    pub fn next_ready(&mut self) -> Option<Gathering<D>> {
        self.gatherings.next_ready()
    }

    /// The record of the next ready batch, left in place (its shard picks the replica
    /// it is asked for).
    pub fn peek_ready(&self) -> Option<&Arc<Manifest>> {
        self.gatherings.peek_ready()
    }

    /// The ready batch `id` (the one a permit was asked for), taken out.
    pub fn take_ready(&mut self, id: &str) -> Option<Gathering<D>> {
        self.gatherings.take_ready(id)
    }

    /// Messages gathered (waiting or ready).
    pub fn gathered(&self) -> usize {
        self.gatherings.len()
    }

    /// Every gathered message (`progress()` while it waits, like the buffer's).
    pub fn gathered_messages(&self) -> impl Iterator<Item = &D> {
        self.gatherings.held()
    }

    /// Everything gathered (shutdown past its deadline, the table's window open).
    pub fn take_gathered(&mut self) -> Vec<D> {
        self.gatherings.take_all()
    }

    /// Whether nothing is recorded or gathered for the table (it may be reaped).
    pub fn is_idle(&self) -> bool {
        self.index.is_empty() && self.gatherings.is_empty()
    }

    /// Recorded batches the table knows of.
    pub fn recorded(&self) -> usize {
        self.index.len()
    }

    /// Messages of a fresh batch about to fly: looked up again (a batch may have been
    /// recorded with one of them since they arrived, by another flight or instance), and
    /// copies held twice (nats-server 2.9 delivers a message handed back to a dropped
    /// pull request again as new), in the batch or in a flight, set aside. Returns the
    /// batch's messages and the ones set aside, which go back briefly and come again as
    /// what they are (or not at all, once the flight holding the other copy acks it).
    pub fn launch_fresh(&mut self, deliveries: Vec<D>) -> (Vec<D>, Vec<D>) {
        if !self.twice_or_recorded(&deliveries) {
            return (deliveries, Vec::new());
        }
        let mut seen = HashSet::with_capacity(deliveries.len());
        let mut keep = Vec::with_capacity(deliveries.len());
        let mut aside = Vec::new();
        for d in deliveries {
            let seq = d.position().stream_sequence;
            if self.index.holding(seq).is_some() || self.flying.contains(&seq) || !seen.insert(seq)
            {
                aside.push(d);
            } else {
                keep.push(d);
            }
        }
        (keep, aside)
    }

    /// Whether a message is held twice or is in a recorded batch: nearly never, and this
    /// asks without moving a delivery (it runs for every batch).
    fn twice_or_recorded(&self, deliveries: &[D]) -> bool {
        let mut seqs: Vec<u64> = deliveries
            .iter()
            .map(|d| d.position().stream_sequence)
            .collect();
        if !self.index.is_empty() && seqs.iter().any(|s| self.index.holding(*s).is_some()) {
            return true;
        }
        if !self.flying.is_empty() && seqs.iter().any(|s| self.flying.contains(s)) {
            return true;
        }
        seqs.sort_unstable();
        seqs.windows(2).any(|w| w[0] == w[1])
    }

    /// A flight took these messages (see `flying`).
    pub fn flew(&mut self, messages: &[u64]) {
        self.flying.extend(messages.iter().copied());
    }

    /// The flight that took these messages is done: each is settled or went back.
    pub fn landed(&mut self, messages: &[u64]) {
        for seq in messages {
            self.flying.remove(seq);
        }
    }

    /// Lines of these messages an earlier (unrecorded) flight settled.
    pub fn take_settled_lines(
        &mut self,
        sequences: impl Iterator<Item = u64>,
    ) -> Vec<(u64, Vec<u32>)> {
        self.settled_lines.take(sequences)
    }

    /// A flight of an unrecorded batch handed messages back with these lines settled.
    pub fn remember_settled_lines(&mut self, partly: Vec<(u64, Vec<u32>)>) {
        self.settled_lines.remember(partly);
    }
}

/// How many of these messages JetStream delivered before.
fn delivered_before<D: Delivery>(messages: &[D]) -> usize {
    messages
        .iter()
        .filter(|d| d.position().deliveries > 1)
        .count()
}

/// Messages of a batch whose verdicts are recorded, delivered again (their acks were
/// lost with a crash, or they were gathered while another instance settled the batch):
/// settled by the record, with no insert. A rejected row is parked again only if the
/// record does not say it is on the DLQ already.
pub async fn settle_by_record<D: Delivery>(
    store: Option<&Arc<dyn ManifestStore>>,
    manifest: &Manifest,
    deliveries: Vec<D>,
    plan: &SettlePlan<'_>,
) -> Settled {
    let batch = Batch::new(deliveries, Instant::now());
    let verdicts = batch
        .row_ids()
        .map(|(seq, line)| match manifest.verdict(seq, line) {
            Some(Some(_)) if already_parked(manifest, seq, line) => RowVerdict::AlreadyParked,
            Some(Some(reason)) => RowVerdict::Rejected(reason),
            Some(None) => RowVerdict::Inserted,
            // Not settled after all: back it goes.
            None => RowVerdict::Pending,
        })
        .collect();
    let parked = batch.park(verdicts, plan).await;
    if let (Some(store), false) = (store, parked.parked_rows().is_empty()) {
        let _ = session::record_parked(store, &manifest.id, parked.parked_rows()).await;
    }
    let settled = parked.ack(plan).await;
    tracing::debug!(tenant = %plan.table.tenant, table = %plan.table.table, manifest = %manifest.id,
        acked = settled.inserted, parked = settled.parked,
        "messages of a settled batch came back: settled by its record, not inserted again");
    settled
}

fn already_parked(manifest: &Manifest, seq: u64, line: u32) -> bool {
    match &manifest.state {
        ManifestState::Settled { rejected } => rejected
            .iter()
            .any(|r| r.stream_sequence == seq && r.line == line && r.parked),
        _ => false,
    }
}
