//! What every delivery shares: the connection it settles through, the DLQ it parks
//! on (with the reason in the headers), the marks of keyed chunks, the publisher and
//! records of messages split by shard.

use std::sync::Arc;
use std::time::SystemTime;

use async_nats::HeaderMap;
use bytes::Bytes;
use sluice_actors::{DeliveryMeta, Parking, SettleError};

use super::ORIGINAL_LINE_HEADER;
use crate::nats::error_text::{header_value, truncate, MAX_ERROR_HEADER};
use crate::nats::landed::LandedChunks;
use crate::nats::publish::{PublishError, Publisher};
use crate::nats::split::SplitRecords;
use crate::nats::workarounds::acked_here::AckedHere;

/// Publishes parked rows to `dlq.<tenant>.<table>`, and holds the connection every
/// delivery settles through (and where keyed chunks are marked landed). Shared by every
/// delivery.
pub struct DlqWriter {
    pub(super) publisher: Publisher,
    pub(super) subject_prefix: String,
    /// Acks, naks and progress are plain publishes to the row's reply subject.
    pub(super) client: async_nats::Client,
    /// Where a keyed request's chunk is marked landed before its ack (`None`: nothing
    /// is marked, as in tests of the delivery alone).
    pub(super) landed: Option<Arc<LandedChunks>>,
    /// The stream sequences acked through this writer lately, so an acked message a
    /// replicated stream kept can be removed (`super::stranded`). `None` for a stream
    /// of one replica, which cannot keep one: the record costs ~2% of the
    /// instructions per row (docs/benchmark.md).
    pub(super) acked: Option<Arc<AckedHere>>,
    /// Publishes the parts of a message split by shard into its ingest stream, by
    /// partition (none: such a message cannot be split and goes back, as in tests of
    /// the delivery alone).
    pub(super) ingest: Vec<Publisher>,
    /// The records of messages split by shard, by partition: each partition's stream
    /// has its own (none: such a message cannot be split, and a part is judged counted,
    /// as in tests of the delivery alone).
    pub(super) splits: Vec<Arc<SplitRecords>>,
    /// The tests' failpoint `crash-after-split-parts`: the process aborts once a split
    /// message's parts are stored (`SLUICE_TEST_FAILPOINT`; never in production).
    pub(super) crash_after_split_parts: bool,
}

impl DlqWriter {
    pub fn new(publisher: Publisher, subject_prefix: impl Into<String>) -> Self {
        Self {
            client: publisher.context().client(),
            publisher,
            subject_prefix: subject_prefix.into(),
            landed: None,
            acked: None,
            ingest: Vec::new(),
            splits: Vec::new(),
            crash_after_split_parts: false,
        }
    }

    /// Aborts the process once a split message's parts are stored (the tests'
    /// failpoint `crash-after-split-parts`).
    pub fn crashing_after_split_parts(mut self, crash: bool) -> Self {
        self.crash_after_split_parts = crash;
        self
    }

    /// Publishes the parts of messages split by shard through `ingest`: the next
    /// partition's stream (the first, the one of an unpartitioned queue).
    pub fn with_ingest(mut self, ingest: Publisher) -> Self {
        self.ingest.push(ingest);
        self
    }

    /// Records the splits of messages of the next partition's stream in `splits`, and
    /// judges their parts by them.
    pub fn with_splits(mut self, splits: Arc<SplitRecords>) -> Self {
        self.splits.push(splits);
        self
    }

    /// The split records of partition `partition`'s stream.
    pub(super) fn splits_of(&self, partition: usize) -> Option<&Arc<SplitRecords>> {
        self.splits.get(partition)
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
    pub(super) fn headers(parking: &Parking, meta: &DeliveryMeta, line: Option<u32>) -> HeaderMap {
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
    pub(super) async fn publish(
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
