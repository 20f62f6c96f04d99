//! The JetStream port's message: a [`Delivery`] (one message, one row or many) and the
//! ways it leaves the actors (acked, parked, handed back, split).

use std::future::Future;
use std::time::Duration;

use bytes::Bytes;
use serde::Serialize;

use super::{Class, ClickHouseError, TableKey};

/// Where a message stands in its stream, read cheaply from its ack address.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct Position {
    /// The message's name in the queue, which the ledger records: its stream sequence,
    /// and, in a queue of several partitions (streams), its partition's number above
    /// [`Position::PARTITION_SHIFT`] (see [`Position::in_partition`]), so that messages
    /// of two partitions never share a name. Partition 0 is the stream sequence alone.
    pub stream_sequence: u64,
    /// How many times JetStream has delivered the message (1 on the first delivery).
    pub deliveries: u64,
}

impl Position {
    /// The bits of [`Position::stream_sequence`] below the partition's number: a
    /// stream numbers 2^48 messages before it wraps, which no stream reaches.
    pub const PARTITION_SHIFT: u32 = 48;

    /// The name in the queue of message `stream_sequence` of partition `partition`.
    pub const fn in_partition(partition: usize, stream_sequence: u64) -> u64 {
        ((partition as u64) << Self::PARTITION_SHIFT)
            | (stream_sequence & ((1 << Self::PARTITION_SHIFT) - 1))
    }

    /// The partition a name of [`Position::in_partition`] is in.
    pub const fn partition_of(name: u64) -> usize {
        (name >> Self::PARTITION_SHIFT) as usize
    }

    /// The stream sequence a name of [`Position::in_partition`] carries.
    pub const fn sequence_of(name: u64) -> u64 {
        name & ((1 << Self::PARTITION_SHIFT) - 1)
    }
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

    /// Ack, and wait until JetStream confirms it: the last ack of a recorded batch in
    /// each partition (which waits for its own write first as
    /// [`Delivery::ack_recorded`] does). JetStream handles a connection's acks to one
    /// consumer in the order they were sent, so once this one is confirmed every ack
    /// sent before it to the same consumer on the same connection was handled too: one
    /// confirmed ack per partition closes a batch.
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

    /// When this delivery reached this process; unlike [`Delivery::alive_since`], never
    /// moved by a progress (one sent for a copy JetStream has since delivered elsewhere
    /// renews that other delivery). A copy held longer than a settled record is kept may
    /// be of a message acked elsewhere meanwhile: see `ledger::keep_settled_for`.
    fn received_at(&self) -> tokio::time::Instant;

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
