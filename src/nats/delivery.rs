//! A row delivered by JetStream, as the actors' `Delivery`: ack (and ack confirmed by
//! the server), progress, nak with a delay, or park on the dead-letter stream with the
//! reason in its headers (the whole message, or one row of a many-row message).

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_nats::jetstream::AckKind;
use async_nats::{HeaderMap, Subject};
use bytes::Bytes;
use sluice_actors::{Delivery, DeliveryMeta, Parking, Position, SettleError};
use tokio::time::Instant;

use super::acked_here::AckedHere;
use super::encoding::{read_payload, Unreadable};
use super::held::HeldToken;
use super::landed::LandedChunks;
use super::publish::{PublishError, Publisher};
use super::reply::AckAddress;

/// The most of ClickHouse's message a DLQ header carries.
pub(crate) const MAX_ERROR_HEADER: usize = 1024;

/// How long an ack waits for JetStream's confirmation. The server answers at once when
/// it is there; no answer in this long means the connection or the server is gone, and
/// the ack may be lost with it.
const ACK_CONFIRM_TIMEOUT: Duration = Duration::from_secs(5);

/// The DLQ header that tells which row of a many-row message a parked row was (0-based).
pub const ORIGINAL_LINE_HEADER: &str = "Sluice-Original-Line";

/// The header of a part of a message split by shard: the stream sequence of the
/// message it came from (see `Delivery::split`).
pub const SPLIT_FROM_HEADER: &str = "Sluice-Split-From";

/// Publishes parked rows to `dlq.<tenant>.<table>`, and holds the connection every
/// delivery settles through (and where keyed chunks are marked landed). Shared by every
/// delivery.
pub struct DlqWriter {
    publisher: Publisher,
    subject_prefix: String,
    /// Acks, naks and progress are plain publishes to the row's reply subject.
    client: async_nats::Client,
    /// Where a keyed request's chunk is marked landed before its ack (`None`: nothing
    /// is marked, as in tests of the delivery alone).
    landed: Option<Arc<LandedChunks>>,
    /// The stream sequences acked through this writer lately, so an acked message a
    /// replicated stream kept can be removed (`super::stranded`). `None` for a stream
    /// of one replica, which cannot keep one: the record costs ~2% of the
    /// instructions per row (docs/benchmark.md).
    acked: Option<Arc<AckedHere>>,
    /// Publishes the parts of a message split by shard into the ingest stream (`None`:
    /// such a message cannot be split and goes back, as in tests of the delivery alone).
    ingest: Option<Publisher>,
}

impl DlqWriter {
    pub fn new(publisher: Publisher, subject_prefix: impl Into<String>) -> Self {
        Self {
            client: publisher.context().client(),
            publisher,
            subject_prefix: subject_prefix.into(),
            landed: None,
            acked: None,
            ingest: None,
        }
    }

    /// Publishes the parts of messages split by shard through `ingest`.
    pub fn with_ingest(mut self, ingest: Publisher) -> Self {
        self.ingest = Some(ingest);
        self
    }

    /// Keeps the sequences acked through this writer (`acked_here`): for a stream of
    /// several replicas, where a leader change can leave acked messages behind.
    pub fn recording_acks(mut self) -> Self {
        self.acked = Some(Arc::default());
        self
    }

    /// The sequences acked through this writer lately (`None`: not recorded).
    pub fn acked_here(&self) -> Option<&AckedHere> {
        self.acked.as_deref()
    }

    /// Marks keyed chunks landed in `landed` before their ack.
    pub fn with_landed(mut self, landed: Arc<LandedChunks>) -> Self {
        self.landed = Some(landed);
        self
    }

    /// The DLQ headers (docs/architecture.md, "Contracts"), every one of them, and the row's line when one row
    /// of a many-row message is parked on its own.
    fn headers(parking: &Parking, meta: &DeliveryMeta, line: Option<u32>) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(
            "Sluice-Tenant",
            header_value(&parking.table.tenant).as_str(),
        );
        h.insert("Sluice-Table", header_value(&parking.table.table).as_str());
        h.insert("Sluice-Error-Class", parking.class.to_string().as_str());
        h.insert(
            "Sluice-Error-Code",
            parking
                .code
                .map(|c| c.to_string())
                .unwrap_or_default()
                .as_str(),
        );
        h.insert(
            "Sluice-Error",
            header_value(truncate(&parking.error, MAX_ERROR_HEADER)).as_str(),
        );
        h.insert(
            "Sluice-Original-Subject",
            header_value(&meta.subject).as_str(),
        );
        h.insert(
            "Sluice-Original-Sequence",
            meta.stream_sequence.to_string().as_str(),
        );
        h.insert("Sluice-Deliveries", meta.deliveries.to_string().as_str());
        h.insert(
            "Sluice-Parked-At",
            humantime::format_rfc3339_millis(SystemTime::now())
                .to_string()
                .as_str(),
        );
        if let Some(line) = line {
            h.insert(ORIGINAL_LINE_HEADER, line.to_string().as_str());
        }
        h
    }

    /// Publish one parked row to `dlq.<tenant>.<table>` under `id` (a row parked twice
    /// within the DLQ's duplicate window is stored once).
    async fn publish(
        &self,
        parking: &Parking,
        payload: Bytes,
        headers: HeaderMap,
        id: &str,
    ) -> Result<(), SettleError> {
        let subject = format!(
            "{}.{}.{}",
            self.subject_prefix, parking.table.tenant, parking.table.table
        );
        match self
            .publisher
            .publish(subject, payload, Some(headers), Some(id))
            .await
        {
            Ok(_) => Ok(()),
            // `QueueFull` reads "the ingest stream is full", which is not the one here: an
            // operator must not go looking at the wrong stream.
            Err(PublishError::QueueFull) => Err(SettleError(
                "publishing to the DLQ: the DLQ stream is full ([nats] dlq_max_bytes); the row stays unacked"
                    .into(),
            )),
            Err(e) => Err(SettleError(format!("publishing to the DLQ: {e}"))),
        }
    }
}

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
    /// it is acked (see [`super::landed`]).
    chunk: Option<Box<str>>,
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
                chunk: super::landed::chunk_id(message.headers.as_ref()),
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

    /// Publish the parts of a message split by shard (see `Delivery::split`), each sent
    /// before any is confirmed.
    async fn publish_parts(&self, parts: Vec<(usize, Bytes)>) -> Result<(), SettleError> {
        let (Some(row), Some(ingest)) = (self.row.as_ref(), self.dlq.ingest.as_ref()) else {
            return Err(SettleError(
                "a message spanning shards cannot be split here: no publisher into the ingest stream"
                    .into(),
            ));
        };
        let failed = |e: PublishError| {
            SettleError(format!(
                "publishing a part of a message split by shard: {e}"
            ))
        };
        let place = self.place();
        let mut sent = Vec::with_capacity(parts.len());
        for (shard, rows) in parts {
            let mut headers = HeaderMap::new();
            headers.insert(
                SPLIT_FROM_HEADER,
                self.position.stream_sequence.to_string().as_str(),
            );
            let id = format!("part-{place}-{shard}");
            let subject = row.subject.to_string();
            sent.push(
                ingest
                    .send(subject, rows, Some(headers), Some(&id))
                    .await
                    .map_err(failed)?,
            );
        }
        for pending in sent {
            Publisher::confirm(pending).await.map_err(failed)?;
        }
        Ok(())
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

    /// Before its ack, a keyed request's chunk is marked landed (see [`super::landed`]).
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
            stream_sequence: position.stream_sequence,
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
        if let Err(e) = self.publish_parts(parts).await {
            return Err((self, e));
        }
        if let Err(e) = self.mark_landed_or_wait().await {
            return Err((self, e));
        }
        // Its parts are in the stream. Should the ack be lost, the message comes back,
        // is split again into the same parts under the same ids, and the stream keeps
        // one copy of each (within its duplicate window).
        if let Err(e) = self.send_once(AckKind::Ack).await {
            tracing::warn!(error = %e,
                "a message split by shard was published in parts but its ack failed; it will be split once more");
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

/// NATS header values cannot hold CR or LF: a multi-line ClickHouse message is folded.
fn header_value(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect::<String>()
        .trim()
        .to_string()
}

/// At most `max` bytes, cut at a character boundary.
pub(crate) fn truncate(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_values_are_single_lines_and_capped() {
        assert_eq!(
            header_value("Code: 27\r\n, e.what()"),
            "Code: 27  , e.what()"
        );
        let long = "é".repeat(1000);
        let cut = truncate(&long, MAX_ERROR_HEADER);
        assert!(cut.len() <= MAX_ERROR_HEADER && cut.len() >= MAX_ERROR_HEADER - 1);
    }
}
