//! A row delivered by JetStream, as the actors' `Delivery`: ack (and ack confirmed by
//! the server), progress, nak with a delay, park on the dead-letter stream with the
//! reason in its headers (the whole message, or one row of a many-row message), split
//! by shard through its split's record, or, as a part of a split message, judged by
//! that record (`crate::nats::split`). What every delivery shares is in `writer.rs`.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::AckKind;
use async_nats::Subject;
use bytes::Bytes;
use sluice_actors::{Delivery, DeliveryMeta, Parking, PartCopy, Position, SettleError};
use tokio::time::Instant;

use super::held::HeldToken;
use super::reply::AckAddress;
use crate::nats::encoding::{read_payload, Unreadable};
use crate::nats::split::{self, PartOf, SplitJob, SplitOutcome};

mod writer;

pub use writer::DlqWriter;

/// How long an ack waits for JetStream's confirmation. The server answers at once when
/// it is there; no answer in this long means the connection or the server is gone, and
/// the ack may be lost with it.
const ACK_CONFIRM_TIMEOUT: Duration = Duration::from_secs(5);

/// The DLQ header that tells which row of a many-row message a parked row was (0-based).
pub const ORIGINAL_LINE_HEADER: &str = "Sluice-Original-Line";

/// What a delivery keeps of a JetStream message: the subject it was published on, its
/// reply subject (the ack address, which also encodes stream, sequence and delivery
/// count) and the row.
///
/// Why not the `jetstream::Message` itself: each one carries its own clone of the
/// JetStream `Context` (a client handle, a prefix `String`, channel senders: ~0.5 KiB
/// and several atomics), and the actors move every delivery from the pulled batch into
/// per-subject groups, into the table's buffer and out into a flight. Keeping the
/// ~100 bytes that matter made those moves and the buffer's growth several times
/// cheaper (see docs/benchmark.md); settling goes through the one shared client.
struct Row {
    subject: Subject,
    reply: Option<Subject>,
    payload: Bytes,
    /// Its message id when it is a chunk of a keyed ingest request: marked landed before
    /// it is acked (see [`crate::nats::landed`]).
    chunk: Option<Box<str>>,
    /// Which split and shard it is when it is a part of a message split by shard
    /// (judged by its split's record before it joins a batch, see [`crate::nats::split`]).
    part: Option<Box<PartOf>>,
    /// Why its payload could not be decoded (`payload` is then as it came): parked whole.
    undecodable: Option<Box<Unreadable>>,
}

/// One delivered row. Dropped without being settled, it is naked at once (see the
/// `Delivery` contract): a crashed actor hands its rows back instead of stranding them
/// until `ack_wait`.
pub struct JsDelivery {
    row: Option<Row>,
    dlq: Arc<DlqWriter>,
    /// When the server sent it, at the latest: when it was read, or when this process
    /// stopped if it was read just after standing still.
    received: Instant,
    /// Milliseconds after `received` of the last `progress()` (0: none yet), taken
    /// when it is sent: JetStream's clock restarts no earlier.
    progressed_ms: AtomicU32,
    /// Read from the ack address once: the actors ask for it several times per message
    /// (routing, the manifest lookup, forming, settling), and parsing the address each
    /// time was a sixth of Sluice's CPU per row (docs/benchmark.md).
    position: Position,
    /// Its rows among those the source holds (pulled, not settled): given back when
    /// the delivery is dropped, after its ack or nak.
    held: Option<HeldToken>,
}

// === impl JsDelivery ===

impl JsDelivery {
    /// A row as the pull subscription delivered it (a core message whose reply
    /// subject is the ack address), read now (see [`super::stall`]).
    pub fn new(message: async_nats::Message, dlq: Arc<DlqWriter>) -> Self {
        let now = std::time::Instant::now();
        Self::sent_by(message, dlq, super::stall::sent_no_later_than(now).into())
    }

    /// A row the server sent no later than `sent`: its `ack_wait` runs from then.
    pub fn sent_by(message: async_nats::Message, dlq: Arc<DlqWriter>, sent: Instant) -> Self {
        let position = message
            .reply
            .as_ref()
            .and_then(|r| AckAddress::parse(r.as_str()))
            .map(|a| Position {
                stream_sequence: a.stream_sequence,
                deliveries: a.deliveries,
            })
            .unwrap_or(Position {
                stream_sequence: 0,
                deliveries: 0,
            });
        let (payload, undecodable) = read_payload(message.headers.as_ref(), message.payload);
        Self {
            position,
            row: Some(Row {
                chunk: crate::nats::landed::chunk_id(message.headers.as_ref()),
                part: PartOf::from_headers(message.headers.as_ref()).map(Box::new),
                subject: message.subject,
                reply: message.reply,
                payload,
                undecodable,
            }),
            dlq,
            received: sent,
            progressed_ms: AtomicU32::new(0),
            held: None,
        }
    }

    /// A message of partition `partition` of the queue: named in the queue by its
    /// partition and its sequence (`Position::in_partition`); partition 0 keeps the
    /// stream sequence as it is.
    pub fn in_partition(mut self, partition: usize) -> Self {
        self.position.stream_sequence =
            Position::in_partition(partition, self.position.stream_sequence);
        self
    }

    /// Its sequence in its own stream (without its partition's number).
    fn stream_sequence(&self) -> u64 {
        Position::sequence_of(self.position.stream_sequence)
    }

    /// The partition of the queue its stream is.
    fn partition(&self) -> usize {
        Position::partition_of(self.position.stream_sequence)
    }

    /// Counts its rows as held by the source until it is dropped.
    pub fn holding(mut self, token: HeldToken) -> Self {
        self.held = Some(token);
        self
    }

    pub fn subject(&self) -> &str {
        self.row.as_ref().map(|r| r.subject.as_str()).unwrap_or("")
    }

    /// Where the row stands in its stream, from the reply subject; `None` once settled
    /// or for a message that did not come from a consumer.
    fn address(&self) -> Option<AckAddress<'_>> {
        AckAddress::parse(self.row.as_ref()?.reply.as_ref()?.as_str())
    }

    /// The key of its record when it is split by shard (see [`crate::nats::split`]).
    fn split_key(&self) -> Option<String> {
        let published = self.address()?.published()?;
        Some(split::record_key(self.stream_sequence(), published))
    }

    /// The DLQ message id of this message's row `line` (`None`: the message is parked
    /// whole). The publish time is part of it so that a row of a stream recreated within
    /// the DLQ's duplicate window, reusing a sequence, is not taken for a duplicate.
    fn park_id(&self, line: Option<u32>) -> String {
        let place = self.place();
        match line {
            None => format!("park-{place}"),
            Some(line) => format!("park-{place}-{line}"),
        }
    }

    /// `<stream>-<sequence>-<publish time>`: the message's place, for the ids of what is
    /// published from it. The publish time tells a stream recreated within a duplicate
    /// window, reusing a sequence, from the first.
    fn place(&self) -> String {
        let (stream, sequence, published) = self
            .address()
            .map(|a| (a.stream, a.stream_sequence, a.published().unwrap_or(0)))
            .unwrap_or_default();
        format!("{stream}-{sequence}-{published}")
    }

    /// Publish the parts of a message split by shard and record them (see
    /// `Delivery::split`, [`crate::nats::split`]).
    async fn split_by_record(
        &self,
        parts: Vec<(usize, Bytes)>,
    ) -> Result<SplitOutcome, SettleError> {
        let (Some(row), Some(ingest), Some(splits)) = (
            self.row.as_ref(),
            self.dlq.ingest.get(self.partition()),
            self.dlq.splits_of(self.partition()),
        ) else {
            return Err(SettleError(
                "a message spanning shards cannot be split here: no publisher into the ingest stream"
                    .into(),
            ));
        };
        let Some(published) = self.address().and_then(|a| a.published()) else {
            return Err(SettleError(
                "a message spanning shards cannot be split: its ack address does not say when it was stored".into(),
            ));
        };
        let job = SplitJob {
            subject: row.subject.as_str(),
            sequence: self.stream_sequence(),
            published,
            place: &self.place(),
            parts,
            crash_after_parts: self.dlq.crash_after_split_parts,
        };
        split::split(splits, ingest, job).await.map_err(SettleError)
    }

    /// Sends the ack as a request and waits for JetStream's answer (see
    /// `Delivery::ack_confirmed`).
    async fn send_confirmed(&mut self) -> Result<(), SettleError> {
        let Some(row) = self.row.take() else {
            return Ok(());
        };
        let Some(reply) = row.reply else {
            return Err(SettleError(
                "no reply subject: not a JetStream message".into(),
            ));
        };
        let request = self.dlq.client.request(reply, AckKind::Ack.into());
        match tokio::time::timeout(ACK_CONFIRM_TIMEOUT, request).await {
            Ok(Ok(_)) => {
                self.record_ack();
                Ok(())
            }
            Ok(Err(e)) => Err(SettleError(format!("confirming an ack: {e}"))),
            Err(_) => Err(SettleError(format!(
                "JetStream did not confirm an ack within {ACK_CONFIRM_TIMEOUT:?}: it may be lost"
            ))),
        }
    }

    async fn settle(&mut self, kind: AckKind) -> Result<(), SettleError> {
        if matches!(kind, AckKind::Ack) && self.ack_writes_first() {
            if let Err(e) = self.mark_landed().await {
                tracing::warn!(error = %e,
                    "a keyed chunk could not be marked landed before its ack: sent again after a nats-server restart, it could be stored twice (its table records no batch)");
            }
        }
        self.send_once(kind).await
    }

    /// Sends `kind` and forgets the row (it is settled, or left to JetStream). The
    /// reply subject is moved into the publish, not cloned: a clone of it is an
    /// allocation per message (its bytes are shared on their first clone).
    async fn send_once(&mut self, kind: AckKind) -> Result<(), SettleError> {
        let Some(row) = self.row.take() else {
            return Ok(());
        };
        let Some(reply) = row.reply else {
            return Err(SettleError(
                "no reply subject: not a JetStream message".into(),
            ));
        };
        self.dlq
            .client
            .publish(reply, kind.into())
            .await
            .map_err(|e| SettleError(format!("settling a row: {e}")))?;
        if matches!(kind, AckKind::Ack) {
            self.record_ack();
        }
        Ok(())
    }

    fn record_ack(&self) {
        if let Some(acked) = &self.dlq.acked {
            acked.record(self.position.stream_sequence, Instant::now());
        }
    }

    /// Before its ack, a keyed request's chunk is marked landed (see [`crate::nats::landed`]).
    /// A mark that cannot be written (the bucket full or unreachable): in a recorded
    /// batch the chunk is not acked (`ack_recorded`, `ack_confirmed`): it comes again
    /// and its record settles it without another insert. In a table that records no
    /// batch it is acked all the same (`ack`): unacked, it would come again and be
    /// inserted again, while an unmarked chunk costs a copy only if nats-server also
    /// restarts and the client sends the chunk again.
    async fn mark_landed(&self) -> Result<(), String> {
        let (Some(row), Some(landed)) = (self.row.as_ref(), self.dlq.landed.as_ref()) else {
            return Ok(());
        };
        let Some(chunk) = row.chunk.as_deref() else {
            return Ok(());
        };
        // Boxed: the write's future (a key-value put through JetStream) is kilobytes,
        // and inline it would make every ack's future as big, also the acks of the
        // messages that are no keyed chunk (nearly all): a batch's acks go through a
        // `for_each_concurrent`, which moves each future several times (benchmark.md).
        Box::pin(landed.mark(chunk))
            .await
            .map_err(|e| format!("chunk {chunk}: {e}"))
    }

    /// The mark of a recorded batch's chunk, or why its ack waits (see `mark_landed`).
    async fn mark_landed_or_wait(&self) -> Result<(), SettleError> {
        self.mark_landed().await.map_err(|e| {
            tracing::warn!(error = %e,
                "a keyed chunk could not be marked landed: not acked, it comes again and its batch's record settles it");
            SettleError(format!("marking a keyed chunk landed: {e}"))
        })
    }
}

impl Delivery for JsDelivery {
    fn payload(&self) -> &Bytes {
        static EMPTY: Bytes = Bytes::from_static(b"");
        self.row.as_ref().map(|r| &r.payload).unwrap_or(&EMPTY)
    }

    fn subject(&self) -> &str {
        JsDelivery::subject(self)
    }

    fn undecodable(&self) -> Option<&str> {
        let row = self.row.as_ref()?;
        row.undecodable.as_deref().map(Unreadable::reason)
    }

    fn meta(&self) -> DeliveryMeta {
        let position = self.position();
        DeliveryMeta {
            subject: self.subject().to_string(),
            stream_sequence: Position::sequence_of(position.stream_sequence),
            deliveries: position.deliveries,
        }
    }

    fn position(&self) -> Position {
        self.position
    }

    async fn ack(mut self) -> Result<(), SettleError> {
        self.settle(AckKind::Ack).await
    }

    fn ack_writes_first(&self) -> bool {
        self.dlq.landed.is_some() && self.row.as_ref().is_some_and(|r| r.chunk.is_some())
    }

    async fn ack_recorded(mut self) -> Result<(), SettleError> {
        if self.ack_writes_first() {
            self.mark_landed_or_wait().await?;
        }
        self.send_once(AckKind::Ack).await
    }

    /// The ack as a request: JetStream answers an ack that has a reply subject with an
    /// empty message once it has handled it (2.9.10 and current alike).
    async fn ack_confirmed(mut self) -> Result<(), SettleError> {
        if self.ack_writes_first() {
            self.mark_landed_or_wait().await?;
        }
        self.send_confirmed().await
    }

    fn is_split_part(&self) -> bool {
        self.row.as_ref().is_some_and(|r| r.part.is_some())
    }

    async fn judge_part(&self) -> Result<PartCopy, SettleError> {
        let (Some(part), Some(splits)) = (
            self.row.as_ref().and_then(|r| r.part.as_deref()),
            self.dlq.splits_of(self.partition()),
        ) else {
            return Ok(PartCopy::Counted);
        };
        splits
            .judge(part, self.stream_sequence())
            .await
            .map_err(|e| SettleError(format!("judging a part of a split message: {e}")))
    }

    async fn park_row(&self, line: u32, row: Bytes, parking: &Parking) -> Result<(), SettleError> {
        if self.row.is_none() {
            return Err(SettleError("the message is already settled".into()));
        }
        let headers = DlqWriter::headers(parking, &self.meta(), Some(line));
        self.dlq
            .publish(parking, row, headers, &self.park_id(Some(line)))
            .await
    }

    fn progress(
        &self,
    ) -> impl std::future::Future<Output = Result<(), SettleError>> + Send + 'static {
        let client = self.dlq.client.clone();
        let reply = self.row.as_ref().and_then(|r| r.reply.clone());
        let sent = u32::try_from(self.received.elapsed().as_millis()).unwrap_or(u32::MAX);
        self.progressed_ms.fetch_max(sent, Ordering::Relaxed);
        async move {
            let Some(reply) = reply else {
                return Ok(());
            };
            client
                .publish(reply, AckKind::Progress.into())
                .await
                .map_err(|e| SettleError(format!("sending progress: {e}")))
        }
    }

    fn alive_since(&self) -> Instant {
        self.received + Duration::from_millis(self.progressed_ms.load(Ordering::Relaxed).into())
    }

    fn received_at(&self) -> Instant {
        self.received
    }

    async fn nak(mut self, delay: Duration) -> Result<(), SettleError> {
        let kind = if delay.is_zero() {
            AckKind::Nak(None)
        } else {
            AckKind::Nak(Some(delay))
        };
        self.settle(kind).await
    }

    async fn park_message(&self, parking: &Parking) -> Result<(), SettleError> {
        let Some(row) = self.row.as_ref() else {
            return Err(SettleError("the message is already settled".into()));
        };
        let mut headers = DlqWriter::headers(parking, &self.meta(), None);
        if let Some(unreadable) = &row.undecodable {
            unreadable.mark_parked(&mut headers);
        }
        let payload = row.payload.clone();
        self.dlq
            .publish(parking, payload, headers, &self.park_id(None))
            .await
    }

    async fn split(mut self, parts: Vec<(usize, Bytes)>) -> Result<(), (Self, SettleError)> {
        if self.row.is_none() {
            return Ok(());
        }
        let key = self.split_key();
        let outcome = match self.split_by_record(parts).await {
            Ok(outcome) => outcome,
            Err(e) => return Err((self, e)),
        };
        if let Err(e) = self.mark_landed_or_wait().await {
            return Err((self, e));
        }
        // Every part is recorded: should the ack be lost, the message comes back and
        // finds them all, however late, and is acked with nothing published.
        match self.send_confirmed().await {
            Ok(()) => {
                if let (SplitOutcome::Recorded, Some(key), Some(splits)) =
                    (outcome, key, self.dlq.splits_of(self.partition()))
                {
                    splits.acked(&key);
                }
            }
            Err(e) => tracing::warn!(error = %e,
                "a message split by shard has every part recorded but its ack is not confirmed; should it come again, it is acked with nothing published"),
        }
        Ok(())
    }

    async fn park(mut self, parking: &Parking) -> Result<(), (Self, SettleError)> {
        if self.row.is_none() {
            return Ok(());
        }
        if let Err(e) = self.park_message(parking).await {
            return Err((self, e));
        }
        // Parked. Should the ack be lost, the row comes back, is parked again under the
        // same id, and the DLQ keeps one copy.
        if let Err(e) = self.settle(AckKind::Ack).await {
            tracing::warn!(tenant = %parking.table.tenant, table = %parking.table.table, error = %e,
                "row parked but its ack failed; it will be redelivered and parked once more");
        }
        Ok(())
    }
}

impl Drop for JsDelivery {
    fn drop(&mut self) {
        let Some(reply) = self.row.take().and_then(|r| r.reply) else {
            return;
        };
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let client = self.dlq.client.clone();
            runtime.spawn(async move {
                let _ = client.publish(reply, AckKind::Nak(None).into()).await;
            });
        }
    }
}
