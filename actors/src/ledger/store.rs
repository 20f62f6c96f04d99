//! The ledger's port: where batch manifests live (a JetStream key-value bucket in the
//! binary), shared by every Sluice instance, and what crosses it.
//!
//! The store keeps the records and answers with typed outcomes; it decides one thing
//! itself, because only it sees every instance's writes in their order: of two batches
//! claiming one message, the one recorded first wins ([`ClaimError::Conflict`]). Which
//! batch a delivered message belongs to is decided by its table, from the changes the
//! store reports ([`ManifestStore::changes`]) into the table's own index.

use std::sync::Arc;

use bytes::Bytes;
use futures::future::BoxFuture;

use super::manifest::Manifest;
use crate::ports::TableKey;

/// Why the manifest store could not be read or written (NATS down, its bucket full).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct StoreError(pub String);

/// A record as the store holds it, and the store's revision of that state: every write
/// after a batch's claim names the revision its writer read, so that of two instances
/// forming one batch again, the slower cannot write over what the faster recorded (a
/// split over verdicts: the batch's inserted rows would be sent again under new
/// blocks).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Recorded {
    pub manifest: Manifest,
    /// The store's revision of this state (not of the claim: see
    /// [`Manifest::claim_revision`]).
    pub revision: u64,
}

/// Why a later state of a batch was not recorded.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum UpdateError {
    /// The record is no longer at the revision its writer read: another flight (here or
    /// on another instance) recorded something of the batch since, or the record was
    /// removed. Nothing was written; the writer stops and its rows go back, to come
    /// again and be formed from the record as it is now.
    #[error("batch {id} was recorded by someone else since it was read")]
    Superseded { id: String },
    #[error(transparent)]
    Unavailable(StoreError),
}

/// Why a new batch could not claim its messages.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ClaimError {
    /// A batch recorded before this one holds one of its messages (a copy delivered
    /// again, a record that landed late): the earlier one wins, this record is removed,
    /// and its messages go back to come again as that batch's. `earlier` is `id` itself
    /// when the same messages were claimed first by another flight (a copy of each held
    /// elsewhere): a claim never writes over a record.
    #[error("batch {id} shares messages with batch {earlier}, recorded first")]
    Conflict { id: String, earlier: String },
    #[error(transparent)]
    Unavailable(StoreError),
}

/// Why messages could not be read from the ingest stream.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FetchError {
    /// The message left the stream: acknowledged (its rows were settled by whoever held
    /// it), or removed by hand.
    #[error("message {stream_sequence} is no longer in the ingest stream")]
    Gone { stream_sequence: u64 },
    #[error(transparent)]
    Unavailable(StoreError),
}

/// One change of the store, as a table's index takes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LedgerChange {
    /// A manifest was recorded or replaced, at this revision of the store (a later
    /// revision of the same batch replaces an earlier one, never the other way round).
    Put {
        revision: u64,
        manifest: Arc<Manifest>,
    },
    /// A manifest was removed; `revision`: the removal's, when known (a value recorded
    /// after it stays).
    Removed {
        table: TableKey,
        id: String,
        revision: Option<u64>,
    },
}

impl LedgerChange {
    pub fn table(&self) -> &TableKey {
        match self {
            LedgerChange::Put { manifest, .. } => &manifest.table,
            LedgerChange::Removed { table, .. } => table,
        }
    }
}

/// What [`ManifestStore::changes`] has for the tables.
#[derive(Debug, Default, PartialEq, Eq)]
pub enum Changes {
    /// Nothing since the last call.
    #[default]
    None,
    /// These, in the order the store saw them.
    Some(Vec<LedgerChange>),
    /// The changes cannot be told one by one (the ingest stream was made again, or more
    /// piled up than the store keeps): every table starts again from
    /// [`ManifestStore::of_table`].
    Resync,
}

/// A table's manifests as the store knows them now: what a table's index starts from.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LedgerSnapshot {
    /// The store's revision the snapshot holds every change up to: a change reported
    /// later at or below it is already in.
    pub as_of: u64,
    /// With each one's revision.
    pub manifests: Vec<(u64, Arc<Manifest>)>,
}

/// Where batch manifests live, shared by every Sluice instance: a batch's identity is
/// recorded before its first attempt so that any instance can form exactly that batch
/// again, its split before any part of it is sent on its own, and its verdicts before
/// any of its rows is settled so that a message redelivered afterwards is settled the
/// same way without another insert.
///
/// Object-safe (boxed futures): one store serves the whole pipeline; it is asked once
/// per batch, not per message.
pub trait ManifestStore: Send + Sync + 'static {
    /// The ingest stream's incarnation (see [`Manifest::incarnation`]), once the store
    /// has read it; `None` before (nothing can be recorded then).
    fn incarnation(&self) -> Option<u64>;

    /// Record a new batch (its `Open` manifest) and claim its messages: `Ok` once no
    /// batch recorded before it holds one of them, so a conflict is told before anything
    /// is sent, with the store's revision of the claim (the caller keeps it in the
    /// batch's later states: [`Manifest::claimed_as`]; it is also the revision the
    /// first later write names). Create-only: a record of the same batch already there
    /// (the same messages claimed by another flight) is a conflict, never written over.
    /// On a conflict this record is removed again. One the store could not judge in
    /// time (`Unavailable` after it was written) stays, as another instance may be
    /// sending it; if it lost to an earlier claim, forming it again refuses it
    /// ([`ManifestStore::earlier_claim`]).
    fn claim<'a>(&'a self, manifest: &'a Manifest) -> BoxFuture<'a, Result<u64, ClaimError>>;

    /// A batch claimed before `manifest` that holds one of its messages (`manifest` need
    /// not be among the records read: its [`Manifest::claim_revision`] then tells its
    /// place). Such a batch lost its claim, so nothing of it was ever sent: a batch
    /// formed again asks this first. Judged only once the store has read every record
    /// written before `manifest`'s claim (waiting for that as a claim does): a claim
    /// still waiting to be judged leaves its record behind, a copy of its message that
    /// came again meanwhile forms that record again, and an index that had not yet read
    /// the earlier batch would let it be sent beside it. `Err` when the store did not
    /// read that far in time (nothing is sent).
    fn earlier_claim<'a>(
        &'a self,
        manifest: &'a Manifest,
    ) -> BoxFuture<'a, Result<Option<String>, StoreError>>;

    /// Record a later state of a claimed batch (its split, its verdicts, its parked
    /// rows), only over the state at `expected` (a compare-and-set): returns the new
    /// state's revision. [`UpdateError::Superseded`] when the record moved on (or went)
    /// since: nothing is written.
    fn update<'a>(
        &'a self,
        manifest: &'a Manifest,
        expected: u64,
    ) -> BoxFuture<'a, Result<u64, UpdateError>>;

    /// The manifest as the store holds it now (read from the store itself, not from what
    /// the changes reported so far, and where its writes are ordered, never from a copy
    /// that may lag), its [`Manifest::claim_revision`] known, with the revision a later
    /// write names: `None` once removed. A batch formed again decides by this.
    fn current<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Option<Recorded>, StoreError>>;

    /// Remove the manifest: every row of it is settled and the settlement confirmed. A
    /// store may leave the removal to its collector (after a reconnect, on a NATS
    /// cluster: an ack confirmed may not be on every peer yet).
    fn forget<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<(), StoreError>>;

    /// Remove an unfinished manifest now, never left to a collector: its batch can never
    /// be formed whole again (a message of it left the stream), or it lost its claim. A
    /// record left behind would gather its other messages for ever, and nothing settled
    /// relies on it. Only the state at `expected` is removed: one recorded since (a
    /// flight sending it after all) is [`UpdateError::Superseded`] and stays.
    fn withdraw<'a>(&'a self, id: &'a str, expected: u64)
        -> BoxFuture<'a, Result<(), UpdateError>>;

    /// The payloads of messages, read from the ingest stream by sequence, in the order
    /// asked (a batch formed again includes messages this instance does not hold).
    fn fetch<'a>(
        &'a self,
        stream_sequences: &'a [u64],
    ) -> BoxFuture<'a, Result<Vec<Bytes>, FetchError>>;

    /// Whether each message is still in the ingest stream (a message leaves a work
    /// queue when it is acknowledged), in the order asked.
    fn in_stream<'a>(
        &'a self,
        stream_sequences: &'a [u64],
    ) -> BoxFuture<'a, Result<Vec<bool>, StoreError>>;

    /// The changes since the last call, for the tables' indexes. Never waits. The
    /// consumer takes them after each pull and routes them ahead of the pulled messages,
    /// so a table has heard of every batch recorded before a message arrives (the
    /// source does not pull before the store has read every manifest in it).
    fn changes(&self) -> Changes;

    /// The manifests of one table, for its index to start from (a table actor starting,
    /// or a [`Changes::Resync`]).
    fn of_table(&self, table: &TableKey) -> LedgerSnapshot;
}
