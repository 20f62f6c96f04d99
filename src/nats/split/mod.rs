//! The records of messages split by shard, in the bucket `<stream>_SPLITS`.
//!
//! A message whose rows belong to several shards of a table's `shard_key` is published
//! again as one message per shard (its parts), then acked (`Delivery::split`). Between
//! the two, anything can happen: a crash, a lost ack, a stream too full for the next
//! part. JetStream's duplicate window would drop a part published again only while it
//! remembers the part's id: for `[nats] duplicate_window` (2 minutes), and not across a
//! nats-server restart, which rebuilds its memory from the messages the stream still
//! holds (a part consumed is gone). So the split is recorded instead, durably, before
//! any part is published: the record names, per part, the one copy whose rows count
//! (`record.rs`). A split publishes only the parts not recorded yet and records them;
//! the message is acked (and the ack confirmed) only once every part is recorded. The
//! consumer inserts a part only if it is the copy its record counts, and records an
//! unrecorded one itself, first writer wins (`Delivery::judge_part`): a copy judged
//! surplus is acked without an insert.
//!
//! - `record.rs`: the record, the parts' headers, the decisions (pure).
//! - `splitter.rs`: a split, from the record read to the last part recorded.
//! - `collect.rs`: a record goes once its message is acked and every copy of its parts
//!   is settled; the bucket's `max_age` (24 h) takes what is left behind.
//!
//! Why a bucket of its own: the records must outlive the parts they judge (they wait
//! in the stream as long as their shard is down), as the manifest bucket's do, while
//! the idempotency bucket keeps its records only `duplicate_window`; and the manifest
//! bucket's watch reads every key of it into every instance's index, which records as
//! many as the messages split would only slow down. Like the DLQ's replay bucket, it is
//! made by Sluice, named after the stream whose messages it records.

mod collect;
mod record;
mod splitter;

use std::sync::Mutex;
use std::time::Duration;

use async_nats::jetstream::{self, stream};
use sluice_actors::PartCopy;

pub use collect::keep_collecting;
pub use record::{record_key, PartOf};
pub use splitter::{split, SplitJob, SplitOutcome};

use self::record::{CopyJudgment, SplitRecord};
use super::key_store::{KeyStore, KeyStoreError, KeyStoreSettings, Slot};
use super::manifest::MANIFEST_MAX_AGE;
use crate::config::NatsConfig;

/// How many times a read-then-write of one record is tried when another writer was
/// first each time (two instances splitting one message, the consumers of its parts).
const WRITES_TRIED: usize = 5;

/// The bucket of split records of an ingest stream.
pub fn split_bucket(stream: &str) -> String {
    format!("{stream}_SPLITS")
}

/// What the records are made of, from `[nats]`.
#[derive(Clone, Debug)]
pub struct SplitSettings {
    /// The ingest stream whose messages are split, and its consumer (whose ack floor
    /// tells which records are done with).
    pub stream: String,
    pub consumer: String,
    pub replicas: usize,
    /// The bucket's byte budget (`[nats] manifest_max_bytes`, as the manifests').
    pub max_bytes: u64,
}

impl From<&NatsConfig> for SplitSettings {
    fn from(c: &NatsConfig) -> Self {
        Self {
            stream: c.streams.stream.clone(),
            consumer: c.streams.consumer.clone(),
            replicas: c.streams.replicas,
            max_bytes: c.manifest_max_bytes,
        }
    }
}

/// A record as read: its value and the revision a write over it expects.
#[derive(Debug)]
enum Read {
    Held(SplitRecord, u64),
    /// No record (never written, expired, or removed); a write that takes the key
    /// expects `revision`.
    Vacant(u64),
}

/// A record whose message was split and acked here: removed once every copy of its
/// parts is settled (see `collect.rs`).
#[derive(Debug)]
struct Done {
    key: String,
    /// The ingest stream's last sequence as the first collection after the ack read
    /// it: every copy of the record's parts was stored at or below it.
    stored_by: Option<u64>,
}

/// The split records of one Sluice instance.
pub struct SplitRecords {
    keys: KeyStore,
    js: jetstream::Context,
    settings: SplitSettings,
    /// Records of messages acked here, waiting to be removed.
    done: Mutex<Vec<Done>>,
}

impl SplitRecords {
    pub fn new(js: jetstream::Context, settings: SplitSettings) -> Self {
        let keys = KeyStore::new(
            js.clone(),
            KeyStoreSettings {
                bucket: split_bucket(&settings.stream),
                purpose: "split",
                description:
                    "Sluice splits of messages by shard: for each part, the copy whose rows count",
                max_bytes: settings.max_bytes,
                full_hint: "[nats] manifest_max_bytes; a record goes once its parts are settled",
                replicas: settings.replicas,
                max_age: MANIFEST_MAX_AGE,
                // A split or a judgment that fails is tried again with its message.
                no_leader_wait: Duration::ZERO,
            },
        );
        Self {
            keys,
            js,
            settings,
            done: Mutex::new(Vec::new()),
        }
    }

    async fn read(&self, key: &str) -> Result<Read, String> {
        match self.keys.get(key).await.map_err(|e| e.to_string())? {
            Slot::Vacant { revision } => Ok(Read::Vacant(revision)),
            Slot::Held(held) => Ok(Read::Held(
                SplitRecord::decode(&held.value).map_err(|e| format!("{key}: {e}"))?,
                held.revision,
            )),
        }
    }

    /// Write `record` under `key` over revision `expected`; `None`: another writer was
    /// first.
    async fn write(
        &self,
        key: &str,
        record: &SplitRecord,
        expected: u64,
    ) -> Result<Option<u64>, String> {
        match self.keys.write(key, record.encode(), expected).await {
            Ok(revision) => Ok(Some(revision)),
            Err(KeyStoreError::Conflict) => Ok(None),
            Err(e) => Err(e.to_string()),
        }
    }

    /// What the copy at `sequence` of `part` is (see `Delivery::judge_part`).
    pub async fn judge(&self, part: &PartOf, sequence: u64) -> Result<PartCopy, String> {
        for _ in 0..WRITES_TRIED {
            let (record, revision) = match self.read(&part.key).await? {
                // Removed once every copy of its parts was settled, or expired: this
                // one came again after its ack, or after a day. It goes in.
                Read::Vacant(_) => return Ok(PartCopy::Unrecorded),
                Read::Held(record, revision) => (record, revision),
            };
            match record.judge(part.shard, sequence) {
                CopyJudgment::Counted => return Ok(PartCopy::Counted),
                CopyJudgment::Surplus => return Ok(PartCopy::Surplus),
                CopyJudgment::Claim(claimed) => {
                    if self.write(&part.key, &claimed, revision).await?.is_some() {
                        return Ok(PartCopy::Counted);
                    }
                }
            }
        }
        Err(format!(
            "the split record {} changed under each of {WRITES_TRIED} reads",
            part.key
        ))
    }

    /// Whether the message at `sequence` is still in the ingest stream (a work queue:
    /// an acked message leaves it). Asked of a message this instance holds a delivery
    /// of, so a message there at that sequence is that one.
    async fn original_in_stream(&self, sequence: u64) -> Result<bool, String> {
        let name = &self.settings.stream;
        let stream = self
            .js
            .get_stream_no_info(name)
            .await
            .map_err(|e| format!("stream {name}: {e}"))?;
        match stream.get_raw_message(sequence).await {
            Ok(_) => Ok(true),
            Err(e) if e.kind() == stream::RawMessageErrorKind::NoMessageFound => Ok(false),
            Err(e) => Err(format!("reading message {sequence} of stream {name}: {e}")),
        }
    }

    /// Deletes a surplus copy of a part from the ingest stream, one by sequence (never a
    /// purge: see `super::workarounds::stranded`). Best effort: a copy left is judged surplus when it
    /// is consumed, as long as its record is kept.
    async fn delete_copy(&self, sequence: u64) {
        let name = &self.settings.stream;
        let deleted = match self.js.get_stream_no_info(name).await {
            Ok(stream) => stream
                .delete_message(sequence)
                .await
                .map(drop)
                .map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        if let Err(e) = deleted {
            tracing::debug!(stream = %name, sequence, error = %e,
                "a surplus copy of a split message's part stays in the stream: it is acked without an insert when consumed");
        }
    }

    /// The message whose split `key` records is acked: the record goes once every copy
    /// of its parts is settled.
    pub fn acked(&self, key: &str) {
        lock(&self.done).push(Done {
            key: key.to_owned(),
            stored_by: None,
        });
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
