//! The ports the actors speak through, and the types that cross them: an [`Inserter`]
//! (ClickHouse), a [`Delivery`] (one JetStream message, carrying one row or many) and
//! the [`Source`] of deliveries. The batch ledger's own port, the manifest store, is
//! in [`crate::ledger::store`].
//!
//! Every decision the actors make (buffer, flush, bisect, park, back off) is taken
//! against these traits, never against ClickHouse or JetStream directly, so each
//! decision is unit-testable with a scripted `Inserter` and a recording `Delivery`.
//! The real implementations live in the `sluice` crate: the ClickHouse HTTP client
//! (`src/clickhouse/`) and the JetStream message (`src/nats/`).

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use serde::Serialize;

// === Class ===

/// What a failed insert says about the rows it carried.
///
/// The line is drawn at the exception code: a code means ClickHouse read the request
/// and judged it, so any code that is not known to mean "cannot take it now" or "the
/// connection is misconfigured" is a verdict on the rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Class {
    /// The rows are at fault: isolate them and park the ones rejected alone.
    Rejected,
    /// ClickHouse cannot take them now: keep them queued and back off.
    Unavailable,
    /// The connection's configuration (user, password, grants): back off, never park.
    Denied,
    /// Nothing says a row was judged: back off, never park.
    Unknown,
}

impl Class {
    pub fn as_str(self) -> &'static str {
        match self {
            Class::Rejected => "rejected",
            Class::Unavailable => "unavailable",
            Class::Denied => "denied",
            Class::Unknown => "unknown",
        }
    }

    /// An outage of the pool (or, when table-scoped, of one table): the rows are kept.
    pub fn is_outage(self) -> bool {
        !matches!(self, Class::Rejected)
    }
}

impl fmt::Display for Class {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self {
            Class::Rejected => "Rejected",
            Class::Unavailable => "Unavailable",
            Class::Denied => "Denied",
            Class::Unknown => "Unknown",
        };
        f.write_str(name)
    }
}

// === ClickHouseError ===

/// A classified failure of one request to ClickHouse: an insert (the actors judge rows
/// by it) or a query (the gateway answers and retries by it). One type, because one
/// classifier (`src/clickhouse/classify.rs`) reads both.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ClickHouseError {
    pub class: Class,
    /// ClickHouse's exception code, from the `X-ClickHouse-Exception-Code` header or the
    /// body's leading `Code: NNN`; `None` for transport failures and codeless answers.
    pub code: Option<u32>,
    /// Backs off the one table, not the whole pool (read-only table, missing grant...).
    pub table_scoped: bool,
    /// A multi-row batch may succeed when split (too many parts, memory limit).
    pub splittable: bool,
    /// The table or its database does not exist (yet): the same for every row of the
    /// batch, it names none. Class stays `Rejected` (the query path answers 404), but
    /// ingest waits for the table, table-scoped, before it parks anything.
    pub missing_table: bool,
    /// The HTTP status, when an answer came back at all.
    pub status: Option<u16>,
    /// ClickHouse's message (or the transport error), already capped by the adapter.
    pub message: String,
    /// Why no answer came, for a transport failure (`status` is `None` then): told by
    /// the adapter from its client's error, so nothing decides by the message's words.
    #[serde(skip)]
    pub no_answer: Option<NoAnswer>,
}

/// Why a request to ClickHouse got no answer at all. A ClickHouse that crashes on the
/// rows it is sent loses the connection it took them on; one that is not there refuses
/// it, and a frozen or slow one times out: only the first is weighed against the rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NoAnswer {
    /// No connection was made (refused, unreachable, DNS): the rows were never sent.
    Refused,
    /// No answer within the request's timeout.
    TimedOut,
    /// The connection was made and went away with no answer (reset, closed mid-answer).
    Lost,
}

impl ClickHouseError {
    /// The label used for `reason` in metrics and logs.
    pub fn reason(&self) -> &'static str {
        self.class.as_str()
    }

    /// The connection was made and then went away with no answer (reset, closed
    /// mid-answer): what a ClickHouse that crashes on a request looks like. A connection
    /// never made (refused: the server was not there when the rows were sent) and a
    /// timeout (a frozen or slow server) are not that.
    pub fn lost_connection(&self) -> bool {
        self.no_answer == Some(NoAnswer::Lost)
    }
}

impl fmt::Display for ClickHouseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.code {
            Some(code) => write!(f, "{} (code {code}): {}", self.class, self.message),
            None => write!(f, "{}: {}", self.class, self.message),
        }
    }
}

impl std::error::Error for ClickHouseError {}

// === TableKey ===

/// One ingest table as Sluice routes it: the tenant (which picks the ClickHouse
/// target) and the table name inside that target's database. Both are validated
/// identifiers before a `TableKey` is made; cloning is cheap.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct TableKey {
    pub tenant: Arc<str>,
    pub table: Arc<str>,
}

impl TableKey {
    pub fn new(tenant: &str, table: &str) -> Self {
        Self {
            tenant: Arc::from(tenant),
            table: Arc::from(table),
        }
    }
}

impl fmt::Display for TableKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.tenant, self.table)
    }
}

// === Inserter ===

/// One insert request: NDJSON rows for one table of the inserter's target.
#[derive(Clone, Debug)]
pub struct InsertRequest {
    pub table: TableKey,
    /// The rows as they came, each followed by `\n` (JSONEachRow).
    pub body: Bytes,
    pub rows: usize,
    /// Skip fields the table does not have instead of rejecting the row (per-table option).
    pub skip_unknown_fields: bool,
    /// Set for a table that deduplicates inserts: every attempt of these exact rows
    /// carries the same token. Sent as `insert_deduplication_token` where the server
    /// knows the setting, with `insert_deduplicate=1`; older servers deduplicate the
    /// identical block by its hash.
    pub dedup_token: Option<String>,
}

/// Whether ClickHouse deduplicates inserts into a table, which is what makes a retry of
/// the same rows harmless and exactly-once possible.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Dedup {
    /// Sluice records the table's batches and counts on ClickHouse to drop a retry:
    /// the table deduplicates, its window covers a redelivery, and nothing else on it
    /// (a materialized view on a server that skips views on a retry) would lose rows.
    pub exactly_once: bool,
    /// Why, in a sentence an operator can act on: the engine, the window against the
    /// blocks a redelivery may come after, what to set.
    pub why: String,
    /// The table's deduplication window, when it deduplicates at all (whether or not
    /// it covers a redelivery): what a retry must come within to be dropped.
    pub window: Option<DedupWindow>,
}

/// How far back ClickHouse remembers the blocks a table took: a retry of a block is
/// dropped only while its hash is among the last `blocks` and younger than `seconds`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct DedupWindow {
    /// `replicated_deduplication_window` (or `non_replicated_deduplication_window`).
    pub blocks: u64,
    /// `replicated_deduplication_window_seconds`, counted back from the table's newest
    /// block; `None`: no limit in time (the non-replicated window has none).
    pub seconds: Option<Duration>,
}

/// What a successful probe learnt about the server.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ServerInfo {
    pub version: String,
}

/// Inserts rows into one ClickHouse target (URL + user + database).
///
/// The real implementation is the HTTP client; every failure comes back classified.
pub trait Inserter: Send + Sync + 'static {
    fn insert(
        &self,
        request: InsertRequest,
    ) -> impl Future<Output = Result<(), ClickHouseError>> + Send;

    /// A cheap request proving the target answers (used for readiness).
    fn probe(&self) -> impl Future<Output = Result<ServerInfo, ClickHouseError>> + Send;

    /// Whether Sluice may count on ClickHouse to drop a retried insert into `table`: it
    /// deduplicates (a `Replicated*MergeTree`, or a `MergeTree` with
    /// `non_replicated_deduplication_window` > 0 where the server has it) over a window
    /// that covers a redelivery, and no materialized view loses rows when a retry is
    /// dropped. Asked before a table's batches are formed; what the server says of the
    /// table may be cached by the implementation for a short while.
    fn deduplicates(
        &self,
        table: &TableKey,
    ) -> impl Future<Output = Result<Dedup, ClickHouseError>> + Send;
}

// === Delivery ===

/// Where a message stands in its stream, read cheaply from its ack address.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct Position {
    pub stream_sequence: u64,
    /// How many times JetStream has delivered the message (1 on the first delivery).
    pub deliveries: u64,
}

/// Where a delivered row came from, for the DLQ headers and the logs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DeliveryMeta {
    pub subject: String,
    pub stream_sequence: u64,
    /// How many times JetStream has delivered this row (1 on the first delivery).
    pub deliveries: u64,
}

/// Why a row is parked on the dead-letter stream.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Parking {
    pub table: TableKey,
    pub class: Class,
    pub code: Option<u32>,
    /// ClickHouse's message; the adapter keeps the first 1 KiB in the header.
    pub error: String,
}

impl Parking {
    pub fn from_error(table: &TableKey, error: &ClickHouseError) -> Self {
        Self {
            table: table.clone(),
            class: error.class,
            code: error.code,
            error: error.message.clone(),
        }
    }
}

/// Why settling a delivery failed (connection lost, DLQ full...).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct SettleError(pub String);

/// One delivered message (one row, or many as NDJSON lines) and the ways it can leave
/// the actors. A message is acked only when every row in it is settled.
///
/// Dropping a delivery that was never settled must hand it back for redelivery (a nak
/// without delay where the connection allows), so that a crashed actor never strands
/// the rows it held until `ack_wait` runs out.
///
/// `Sync`: a flush task keeps `&D` across awaits (`progress()` on rows still held
/// during a long insert), and `progress(&self)`'s `Send` future needs it anyway.
pub trait Delivery: Send + Sync + 'static {
    /// The message as published: one JSON object, or many, one per line (NDJSON),
    /// decoded when it was stored compressed.
    fn payload(&self) -> &Bytes;

    /// Why the message's payload cannot be read as rows at all (an encoding the adapter
    /// does not know, a corrupt compressed frame); `None` for nearly every message.
    /// Such a message is parked whole with this reason, never inserted or split, and
    /// counts as one row.
    fn undecodable(&self) -> Option<&str> {
        None
    }

    /// The subject the message was published on (`<prefix>.<tenant>.<table>`),
    /// borrowed: the consumer routes every message by it, so it must not allocate
    /// (`meta()` does).
    fn subject(&self) -> &str;

    fn meta(&self) -> DeliveryMeta;

    /// The message's stream sequence and delivery count, without allocating.
    fn position(&self) -> Position;

    /// Every row of the message is settled: remove it from the queue.
    fn ack(self) -> impl Future<Output = Result<(), SettleError>> + Send;

    /// [`Delivery::ack`] for a message of a recorded batch (exactly-once). A message
    /// whose ack waits for a write of its own first (a keyed ingest chunk's landed mark)
    /// is not acked when that write fails: it comes again, its batch's record settles it
    /// without another insert, and the write is tried again then. (A batch that records
    /// nothing acks all the same: unacked, its rows would be inserted again.)
    fn ack_recorded(self) -> impl Future<Output = Result<(), SettleError>> + Send
    where
        Self: Sized,
    {
        self.ack()
    }

    /// Whether its ack first waits for a write of its own (a keyed ingest chunk's landed
    /// mark): such acks are sent a few at a time, the others one after the other.
    fn ack_writes_first(&self) -> bool {
        false
    }

    /// Ack, and wait until JetStream confirms it: the last ack of a recorded batch
    /// (which waits for its own write first as [`Delivery::ack_recorded`] does).
    /// JetStream handles a connection's acks
    /// in the order they were sent, so once this one is confirmed every ack sent before
    /// it on the same connection was handled too: one confirmed ack closes a batch.
    fn ack_confirmed(self) -> impl Future<Output = Result<(), SettleError>> + Send;

    /// Tell the queue the message is still being worked on, so `ack_wait` does not run
    /// out and redeliver it while a long flush (a bisection, a slow insert) still holds
    /// it.
    ///
    /// `'static`: the future carries what it needs (a client handle, the ack address),
    /// so an actor can hand it to a task and never wait on it in its mailbox.
    fn progress(&self) -> impl Future<Output = Result<(), SettleError>> + Send + 'static;

    /// When JetStream last heard the message is in hand: its delivery, or the last
    /// `progress()` sent for it. Once `ack_wait` has passed since, JetStream may have
    /// delivered it again, perhaps to another instance (this one was frozen, or its
    /// runtime stalled): such a message must not start a batch of its own.
    fn alive_since(&self) -> tokio::time::Instant;

    /// Hand the message back to be delivered again after `delay`.
    fn nak(self, delay: Duration) -> impl Future<Output = Result<(), SettleError>> + Send;

    /// Publish one row of this message to the dead-letter stream, as its own message,
    /// with the reason and the row's `line` (0-based) within the message in its headers.
    /// The message is not acked: its owner acks it once every row in it is settled. A
    /// row parked twice (its message redelivered after a crash) is stored once.
    fn park_row(
        &self,
        line: u32,
        row: Bytes,
        parking: &Parking,
    ) -> impl Future<Output = Result<(), SettleError>> + Send;

    /// Publish the whole message (a one-row message) to the dead-letter stream, with the
    /// reason in its headers. The message is not acked: its owner acks it (after
    /// recording that it is parked, for a recorded batch). Parked twice (its message
    /// redelivered after a crash), it is stored once within the DLQ's duplicate window.
    fn park_message(
        &self,
        parking: &Parking,
    ) -> impl Future<Output = Result<(), SettleError>> + Send;

    /// The message's rows belong to several shards (its table's `shard_key`): publish
    /// `parts`, each the rows of one shard (`(shard, rows)`, one row per line), as
    /// messages of their own on this message's subject, then ack this one (its own
    /// write first, as [`Delivery::ack_recorded`] does) and wait for the ack's
    /// confirmation.
    ///
    /// The split is recorded where every instance reads it, keyed by this message's
    /// place in its stream: for each part, the stream sequence of the one copy of it
    /// that counts. A part already recorded is never published again (this message
    /// split a second time, after its ack was lost or the split failed half way); a
    /// part is published only while unrecorded, and recorded by the first writer (this
    /// split, or the consumer of a copy: [`Delivery::judge_part`]). The message is
    /// acked only once every part is recorded, so a message that comes back finds the
    /// parts it had, however late, whatever JetStream's duplicate window remembers.
    /// When a publish or a write fails, what was stored is recorded, nothing is acked,
    /// and the message comes back with the error, for the caller to nak.
    fn split(
        self,
        parts: Vec<(usize, Bytes)>,
    ) -> impl Future<Output = Result<(), (Self, SettleError)>> + Send
    where
        Self: Sized;

    /// Whether the message is a part of a message split by shard, published with a
    /// record of its split (see [`Delivery::split`]): such a part is judged by
    /// [`Delivery::judge_part`] before it joins a batch. Known without I/O or
    /// allocation; false for every other message (nearly all), which costs nothing
    /// more.
    fn is_split_part(&self) -> bool {
        false
    }

    /// For a part of a split message ([`Delivery::is_split_part`]): whether this copy's
    /// rows are to go in. Its split's record names the one copy of each part that
    /// counts: this one ([`PartCopy::Counted`]), another ([`PartCopy::Surplus`]: acked
    /// without an insert), or none yet, and then this copy is recorded as the one, if
    /// no other was first (first writer wins). With no record left at all it goes in
    /// ([`PartCopy::Unrecorded`]). An error (the record could not be read or written)
    /// says nothing about the copy: it goes back and is judged again. Any other message
    /// is [`PartCopy::Counted`] at once. Called before the message joins a batch that
    /// is claimed or sent, never after: a copy judged surplus must never be inserted.
    fn judge_part(&self) -> impl Future<Output = Result<PartCopy, SettleError>> + Send {
        std::future::ready(Ok(PartCopy::Counted))
    }

    /// Publish the message whole to the dead-letter stream, then ack it. When the DLQ
    /// publish fails it is not acked and comes back with the error, for the caller to
    /// nak.
    fn park(
        self,
        parking: &Parking,
    ) -> impl Future<Output = Result<(), (Self, SettleError)>> + Send
    where
        Self: Sized;
}

/// What the record of its split says of a copy of a split message's part (see
/// [`Delivery::judge_part`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PartCopy {
    /// The copy the record counts (or, being the first to ask, now counts): its rows
    /// go in. Also any message that is no part.
    Counted,
    /// No record of its split is left (it expired after its bucket's `max_age`, or was
    /// removed once its parts were acked and this one came again): its rows go in, at
    /// least once.
    Unrecorded,
    /// Another copy of the same part is the one counted (the part was published twice,
    /// past JetStream's duplicate window): acked without its rows going in.
    Surplus,
}

// === Source ===

/// Why pulling from the queue failed; the consumer reconnects with backoff.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct SourceError(pub String);

/// The durable consumer the ConsumerActor pulls from.
pub trait Source: Send + 'static {
    type Delivery: Delivery;

    /// Wait for deliveries and return the ones ready, at most `max`. May return an
    /// empty batch when nothing arrived for a while, so the caller can look around.
    fn pull(
        &mut self,
        max: usize,
    ) -> impl Future<Output = Result<Vec<Self::Delivery>, SourceError>> + Send;

    /// Rows in the stream not yet delivered to the consumer (the lag), when known.
    fn pending(&mut self) -> impl Future<Output = Option<u64>> + Send;

    /// What the source says of itself besides its rows, for the consumer's snapshot:
    /// read after every pull, so it does no I/O.
    fn status(&self) -> SourceStatus {
        SourceStatus::default()
    }
}

/// Why a pull was found lost and replaced.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StallReason {
    /// No row and no idle heartbeat for two heartbeats: the server no longer knows the
    /// request (its consumer's leader moved, the node went).
    HeartbeatsMissed,
    /// The server ended the request for a change of the consumer's leader (409).
    LeadershipChange,
    /// The stream held rows for the consumer, the request waited, and none came.
    PendingUndelivered,
    /// The stream keeps messages past the last one the consumer delivered, while the
    /// consumer says nothing is pending or awaits an ack: its leader no longer sees
    /// them (a replicated consumer after its leader was frozen, nats-server 2.9).
    StreamAheadOfConsumer,
    /// The consumer holds `max_ack_pending` deliveries awaiting acks that no instance
    /// holds, and redelivers none of them after `ack_wait`: rows wait that never come.
    AcksHeldByNobody,
}

impl StallReason {
    pub const ALL: [StallReason; 5] = [
        StallReason::HeartbeatsMissed,
        StallReason::LeadershipChange,
        StallReason::PendingUndelivered,
        StallReason::StreamAheadOfConsumer,
        StallReason::AcksHeldByNobody,
    ];

    /// The `reason` label of `sluice_consumer_stalls_total`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::HeartbeatsMissed => "heartbeats_missed",
            Self::LeadershipChange => "leadership_change",
            Self::PendingUndelivered => "pending_undelivered",
            Self::StreamAheadOfConsumer => "stream_ahead_of_consumer",
            Self::AcksHeldByNobody => "acks_held_by_nobody",
        }
    }

    /// Whether an idle heartbeat ends the stall: it shows the request waits, which
    /// answers a request lost; it does not answer rows that do not come.
    pub fn ended_by_heartbeat(self) -> bool {
        matches!(self, Self::HeartbeatsMissed | Self::LeadershipChange)
    }

    /// Whether the consumer's own state on the server is at fault, not the request: a
    /// new request cannot help, a new consumer leader can (`$JS.API.CONSUMER.LEADER.STEPDOWN`).
    pub fn needs_new_consumer_leader(self) -> bool {
        matches!(self, Self::StreamAheadOfConsumer | Self::AcksHeldByNobody)
    }
}

/// What a source waits for before it pulls again.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SourceWait {
    /// Its pull requests find no responders: the consumer has no leader (a NATS
    /// cluster's election, a node restarting).
    ConsumerLeader,
    /// The manifest index is being rebuilt (its watch was opened again: a reconnect,
    /// the bucket's leader moved): no row is taken before it holds every record.
    ManifestIndex,
}

impl std::fmt::Display for SourceWait {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::ConsumerLeader => {
                "waiting for the consumer to have a leader (a NATS election): its pull requests find no responders"
            }
            Self::ManifestIndex => {
                "waiting for the manifest index to catch up with the bucket (its watch was opened again)"
            }
        })
    }
}

/// The NATS side of the consumer.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct NatsView {
    /// The `server_name` of the server the client is connected to.
    pub connected_server: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stream: Option<GroupView>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub consumer: Option<GroupView>,
}

/// A replicated stream or consumer: its leader and the other peers.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct GroupView {
    pub name: String,
    /// The leader's `server_name` (none during an election).
    pub leader: Option<String>,
    /// The peers besides the leader.
    pub replicas: Vec<ReplicaView>,
}

#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct ReplicaView {
    pub name: String,
    /// Up to date with the leader.
    pub current: bool,
    /// The group takes it for gone.
    pub offline: bool,
    /// Operations it is behind the leader, when the leader says.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lag: Option<u64>,
}

/// A source's account of itself (see [`Source::status`]).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SourceStatus {
    /// Pulls found lost and replaced since the process started (across reconnects).
    pub stalls: u64,
    pub last_stall: Option<StallReason>,
    /// What it waits for before it pulls again, while it waits.
    pub waiting_for: Option<SourceWait>,
    /// Where its stream and consumer live.
    pub nats: Option<NatsView>,
}

/// Opens a `Source`; called again after a source fails, with backoff.
pub trait SourceFactory: Send + Sync + 'static {
    type Source: Source;

    fn connect(&self) -> impl Future<Output = Result<Self::Source, SourceError>> + Send;
}
