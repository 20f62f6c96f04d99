//! Batch manifests in a JetStream key-value bucket: the actors' `ManifestStore`.
//!
//! - `bucket.rs`: the bucket's stream, created by Sluice (async-nats cannot create a
//!   bucket on nats-server 2.9.10) with a byte budget and a last-resort TTL.
//! - `codec.rs`: a manifest's value, compact (a 10,000-message batch in ~10 KB).
//! - `index.rs`: the store's own index, kept by a watch of the bucket: the changes it
//!   reports to the tables, the claims a new batch is checked against, what a starting
//!   table reads.
//! - `collect.rs`: the manifests no batch will remove, collected every few seconds.
//!
//! Keys are `<stream>.<incarnation>.<manifest id>`. The incarnation is the ingest
//! stream's creation time in ns: a stream deleted and created again numbers its
//! messages from 1 again, and a manifest of the old one must never be taken for a
//! batch of the new one's messages. Only manifests of the current incarnation reach the
//! tables; the collector removes the others.
//!
//! The store must use the same NATS client as the deliveries whose acks it relies on:
//! a confirmed ack covers the acks sent before it on that connection only, so a
//! manifest is removed by `forget` only when the client has not reconnected since it
//! was recorded (otherwise the collector removes it once the consumer's ack floor has
//! passed it). On a NATS cluster (`[nats] replicas` above 1) `forget` always leaves it
//! to the collector: a replicated consumer's leader confirms an ack before its peers
//! have it, and a leader change in between (an election, a node frozen or restarted)
//! delivers the rows again, which must then find their batch's record and be settled
//! by it, not inserted anew. There the collector also takes the lower of the ack floors
//! (and of the stream's first sequences) of its last two passes, so either is trusted
//! only once it has held for a pass.
//!
//! When the store cannot be written (NATS down, the bucket full), `record` fails and
//! the actors hold the batch: nothing is inserted unrecorded (see docs/operations.md,
//! "Manifest store").

mod bucket;
mod codec;
mod collect;
mod index;
mod trusted_floor;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use async_nats::jetstream::{self, kv, stream};
use bytes::Bytes;
use futures::future::BoxFuture;
use futures::{StreamExt as _, TryStreamExt as _};
use sluice_actors::{
    Changes, ClaimError, FetchError, LedgerSnapshot, Manifest, ManifestStore, Recorded, StoreError,
    TableKey, UpdateError,
};
use tokio::task::JoinHandle;

pub use bucket::{stream_name as bucket_stream_name, MAX_AGE as MANIFEST_MAX_AGE};
pub use codec::decode as decode_manifest;
pub use collect::Collected;

use self::index::Index;
/// Also the floor the split records' collector removes by (`nats::split`).
pub(crate) use self::trusted_floor::{Floor, TrustedFloor};
use super::publish::{PublishError, Publisher};
use crate::config::NatsConfig;

/// How often every instance collects orphaned manifests.
const COLLECT_EVERY: Duration = Duration::from_secs(10);
/// How long a removal marker stays: every live watch sees it within moments, and a
/// watch opened later rebuilds without it.
const MARKER_AGE: Duration = Duration::from_secs(60);
/// How long a new batch's record waits for the watch to show every batch recorded
/// before it (normally a round trip).
const CLAIM_WAIT: Duration = Duration::from_secs(5);
/// Messages read from the stream at once when a batch is formed again.
const FETCH_CONCURRENCY: usize = 32;

/// What the store is made of, from `[nats]`.
#[derive(Clone, Debug)]
pub struct ManifestSettings {
    /// The bucket's name (its stream is `KV_<bucket>`).
    pub bucket: String,
    /// The bucket's byte budget: a record that would pass it fails (inserts wait).
    pub max_bytes: u64,
    pub replicas: usize,
    /// The ingest stream whose messages the manifests list, and its durable consumer
    /// (whose ack floor tells which settled manifests are done with).
    pub stream: String,
    pub consumer: String,
    pub collect_every: Duration,
    /// Removal markers older than this are dropped from the bucket by the collector,
    /// so that a new watch does not read a day of them.
    pub marker_age: Duration,
    /// How long the bucket keeps a record at most ([`MANIFEST_MAX_AGE`]; a test may
    /// shorten it): the collector tells records that expired.
    pub max_age: Duration,
}

impl From<&NatsConfig> for ManifestSettings {
    fn from(c: &NatsConfig) -> Self {
        Self {
            bucket: c.manifest_bucket.clone(),
            max_bytes: c.manifest_max_bytes,
            replicas: c.replicas,
            stream: c.stream.clone(),
            consumer: c.consumer.clone(),
            collect_every: COLLECT_EVERY,
            marker_age: MARKER_AGE,
            max_age: bucket::MAX_AGE,
        }
    }
}

/// The manifest store of one Sluice instance. Its watch and collector run as long as
/// it lives.
pub struct JsManifestStore {
    shared: Arc<Shared>,
    tasks: Vec<JoinHandle<()>>,
}

/// What the store, its watch and its collector share.
pub(crate) struct Shared {
    js: jetstream::Context,
    settings: Arc<ManifestSettings>,
    index: Arc<Index>,
    /// Writes values within the bucket's budget (see `budget.rs`).
    puts: Publisher,
    /// The bucket, once the watch has opened it (removals go through it).
    kv: RwLock<Option<kv::Store>>,
    /// Manifest id → the client's connection count when it was last recorded here.
    recorded: Mutex<HashMap<String, u64>>,
    /// Manifests whose `forget` came after a reconnect: the collector removes them.
    deferred: Mutex<HashSet<String>>,
    /// The consumer's ack floor and the stream's first sequence as the collector's
    /// passes read them (see `trusted_floor`).
    floor_reads: Mutex<TrustedFloor>,
}

// === impl JsManifestStore ===

impl JsManifestStore {
    /// Start the store: its watch opens the bucket (creating it when missing) as soon
    /// as NATS answers. Nothing waits here; [`JsManifestStore::ready`] does.
    pub fn start(js: jetstream::Context, settings: ManifestSettings) -> Self {
        let settings = Arc::new(settings);
        let shared = Arc::new(Shared {
            puts: Publisher::new(
                js.clone(),
                &bucket::stream_name(&settings.bucket),
                settings.max_bytes,
            ),
            index: Arc::new(Index::new(&settings.stream)),
            kv: RwLock::new(None),
            recorded: Mutex::default(),
            deferred: Mutex::default(),
            floor_reads: Mutex::default(),
            settings: settings.clone(),
            js: js.clone(),
        });
        collect::register_metrics();
        let opened = shared.clone();
        let watch = tokio::spawn(index::keep_watching(
            shared.index.clone(),
            js,
            settings.clone(),
            move |store| *opened.kv.write().unwrap_or_else(|e| e.into_inner()) = Some(store),
        ));
        let collector = tokio::spawn(collect::keep_collecting(
            shared.clone(),
            settings.collect_every,
        ));
        Self {
            shared,
            tasks: vec![watch, collector],
        }
    }

    /// Wait (at most `deadline`) until the index holds every manifest in the bucket,
    /// for the ingest stream as it is now. The source calls this before it pulls, and
    /// again after a reconnect.
    pub async fn ready(&self, deadline: Duration) -> Result<(), String> {
        let s = &self.shared.settings;
        let ingest = tokio::time::timeout(deadline, self.shared.js.get_stream(&s.stream))
            .await
            .map_err(|_| format!("reading stream {} took over {deadline:?}", s.stream))?
            .map_err(|e| format!("reading stream {}: {e}", s.stream))?;
        self.shared
            .index
            .set_incarnation(incarnation_of(ingest.cached_info()));
        self.shared
            .index
            .wait_caught_up(&self.shared.js.client(), deadline)
            .await
    }

    /// One collection pass now (the store runs one every `collect_every` anyway).
    pub async fn collect(&self) -> Result<Collected, StoreError> {
        collect::collect(&self.shared).await
    }

    /// Whether the index holds every manifest of the bucket for the client's current
    /// connection (what [`JsManifestStore::ready`] waits for), without waiting.
    pub fn caught_up(&self) -> bool {
        self.shared.index.caught_up_on(&self.shared.js.client())
    }

    /// Whether the index is caught up within `deadline` (without reading the stream,
    /// unlike [`JsManifestStore::ready`]): the source's short wait while a watch that
    /// was opened again rebuilds it.
    pub async fn caught_up_within(&self, deadline: Duration) -> bool {
        self.shared
            .index
            .wait_caught_up(&self.shared.js.client(), deadline)
            .await
            .is_ok()
    }

    /// The batch holding a message (the first claim on it), as this instance's index
    /// knows it now (tests and tools: the tables keep their own).
    pub fn holding(&self, stream_sequence: u64) -> Option<Arc<Manifest>> {
        self.shared.index.holding(stream_sequence)
    }
}

impl Drop for JsManifestStore {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

impl ManifestStore for JsManifestStore {
    fn incarnation(&self) -> Option<u64> {
        self.shared.index.incarnation()
    }

    fn claim<'a>(&'a self, manifest: &'a Manifest) -> BoxFuture<'a, Result<u64, ClaimError>> {
        Box::pin(self.shared.claim(manifest))
    }

    fn earlier_claim(&self, manifest: &Manifest) -> Option<String> {
        self.shared.index.earlier_claim(manifest)
    }

    fn update<'a>(
        &'a self,
        manifest: &'a Manifest,
        expected: u64,
    ) -> BoxFuture<'a, Result<u64, UpdateError>> {
        Box::pin(async move {
            let written = self.shared.record(manifest, Write::Over(expected)).await;
            written
                .map(|(_, revision)| revision)
                .map_err(|e| e.superseded(&manifest.id))
        })
    }

    fn current<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Option<Recorded>, StoreError>> {
        Box::pin(self.shared.current(id))
    }

    fn forget<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(self.shared.forget(id))
    }

    fn withdraw<'a>(
        &'a self,
        id: &'a str,
        expected: u64,
    ) -> BoxFuture<'a, Result<(), UpdateError>> {
        Box::pin(self.shared.withdraw(id, expected))
    }

    fn fetch<'a>(
        &'a self,
        stream_sequences: &'a [u64],
    ) -> BoxFuture<'a, Result<Vec<Bytes>, FetchError>> {
        Box::pin(self.shared.fetch(stream_sequences))
    }

    fn in_stream<'a>(
        &'a self,
        stream_sequences: &'a [u64],
    ) -> BoxFuture<'a, Result<Vec<bool>, StoreError>> {
        Box::pin(self.shared.in_stream(stream_sequences))
    }

    fn changes(&self) -> Changes {
        self.shared.index.take_changes()
    }

    fn of_table(&self, table: &TableKey) -> LedgerSnapshot {
        self.shared.index.of_table(table)
    }
}

// === impl Shared ===

impl Shared {
    fn connects(&self) -> u64 {
        self.js
            .client()
            .statistics()
            .connects
            .load(Ordering::Relaxed)
    }

    fn key_of(&self, id: &str) -> Result<String, StoreError> {
        let incarnation = self.index.incarnation().ok_or_else(|| {
            StoreError(format!(
                "the manifest store has not read stream {} yet (is NATS reachable?)",
                self.settings.stream
            ))
        })?;
        Ok(self.index.key(incarnation, id))
    }

    /// Write a manifest as `how` says; returns its key and the bucket's revision of the
    /// value.
    async fn record(&self, m: &Manifest, how: Write) -> Result<(String, u64), WriteError> {
        let key = self.key_of(&m.id).map_err(WriteError::Store)?;
        // Read before the write: a reconnect during it makes `forget` defer.
        let connects = self.connects();
        let subject = bucket::subject(&self.settings.bucket, &key);
        let published = self
            .puts
            .publish(subject, codec::encode(m), how.headers(), None)
            .await
            .map_err(|e| match e {
                PublishError::WrongLastSequence => WriteError::NotAsRead,
                PublishError::QueueFull => WriteError::Store(StoreError(format!(
                    "the manifest bucket {} is full ([nats] manifest_max_bytes): batches wait until manifests are removed",
                    self.settings.bucket
                ))),
                e => WriteError::Store(StoreError(format!("recording manifest {key}: {e}"))),
            })?;
        self.index.put(&key, published.sequence, m.clone());
        lock(&self.recorded).insert(m.id.clone(), connects);
        Ok((key, published.sequence))
    }

    /// Write a new record only where the bucket holds none: over nothing, or over the
    /// removal marker of an earlier record of the same batch (its messages claimed
    /// again once it was withdrawn or lost its claim). `NotAsRead` when a record is
    /// there.
    async fn create(&self, m: &Manifest) -> Result<(String, u64), WriteError> {
        match self.record(m, Write::New).await {
            Err(WriteError::NotAsRead) => {
                let key = self.key_of(&m.id).map_err(WriteError::Store)?;
                let kv = self.bucket().map_err(WriteError::Store)?;
                let entry = super::kv_bucket::read_from_leader(&kv, &key)
                    .await
                    .map_err(|e| {
                        WriteError::Store(StoreError(format!("reading manifest {key}: {e}")))
                    })?;
                match entry {
                    Some(marker) if marker.operation != kv::Operation::Put => {
                        self.record(m, Write::Over(marker.revision)).await
                    }
                    _ => Err(WriteError::NotAsRead),
                }
            }
            written => written,
        }
    }

    /// A new batch claims its messages: no batch recorded before it may hold one of
    /// them, or the two would insert that message's rows in two different blocks that
    /// ClickHouse cannot tell for copies. The earlier claim wins: this one is removed
    /// and its rows go back, to come again and join that batch.
    async fn claim(&self, m: &Manifest) -> Result<u64, ClaimError> {
        let (key, revision) = match self.create(m).await {
            Ok(written) => written,
            // The same messages were claimed first by another flight (copies of them
            // held here and there): that record stands, these go back to join it.
            Err(WriteError::NotAsRead) => {
                return Err(ClaimError::Conflict {
                    id: m.id.clone(),
                    earlier: m.id.clone(),
                })
            }
            Err(WriteError::Store(e)) => return Err(ClaimError::Unavailable(e)),
        };
        if !self.index.wait_watched(revision, CLAIM_WAIT).await {
            // Not judged, and not removed either: another instance may have gathered it
            // meanwhile and be sending it (removed under that flight, its messages would
            // come again as a new batch beside it). If it lost to an earlier claim,
            // forming it again refuses it (`earlier_claim`).
            return Err(ClaimError::Unavailable(StoreError(format!(
                "the manifest index did not see batch {} within {CLAIM_WAIT:?}: its rows go back",
                m.id
            ))));
        }
        let Some(earlier) = self.index.earlier_claim(m) else {
            return Ok(revision);
        };
        if self.purge_key(&key, Some(revision)).await.is_ok() {
            self.index.remove(&key, None);
            lock(&self.recorded).remove(&m.id);
        }
        Err(ClaimError::Conflict {
            id: m.id.clone(),
            earlier,
        })
    }

    /// The manifest's value in the bucket now, read directly (not from the index).
    async fn current(&self, id: &str) -> Result<Option<Recorded>, StoreError> {
        let key = self.key_of(id)?;
        let kv = self.bucket()?;
        // From the leader: the ledger decides on what this says (see `read_from_leader`).
        let entry = super::kv_bucket::read_from_leader(&kv, &key)
            .await
            .map_err(|e| StoreError(format!("reading manifest {key}: {e}")))?;
        let Some(entry) = entry.filter(|e| e.operation == kv::Operation::Put) else {
            return Ok(None);
        };
        let incarnation = self.index.parse_key(&key).map_or(0, |(i, _)| i);
        let manifest = codec::decode(&entry.value, incarnation)
            .map_err(|e| StoreError(format!("reading manifest {key}: {e}")))?;
        // A record never written again since its claim: this is its claim's revision.
        let claim = manifest.claim_order(entry.revision);
        Ok(Some(Recorded {
            manifest: manifest.claimed_as(claim),
            revision: entry.revision,
        }))
    }

    async fn forget(&self, id: &str) -> Result<(), StoreError> {
        let recorded_on = lock(&self.recorded).remove(id);
        let connected =
            self.js.client().connection_state() == async_nats::connection::State::Connected;
        if recorded_on != Some(self.connects()) || !connected {
            // Acks sent before the reconnect may be lost, and the confirmed ack after it
            // does not cover them: the collector removes it once the ack floor says.
            lock(&self.deferred).insert(id.to_string());
            tracing::debug!(manifest = %id,
                "the NATS client reconnected since this manifest was recorded: it is collected once its rows are known acked");
            return Ok(());
        }
        if self.settings.replicas > 1 {
            // A confirmed ack may not be on the consumer's other peers yet (see the
            // module's doc): the collector removes it once the ack floor has held.
            return Ok(());
        }
        let key = self.key_of(id)?;
        let connects = self.connects();
        let purged = self.purge_key(&key, None).await;
        if purged.is_err() || self.connects() != connects {
            // The removal may go out (or have gone out) over a new connection, after a
            // nats-server crash that lost the acks it relied on: a removal a client
            // queued while disconnected is sent once it reconnects. The record is
            // written again behind it and left to the collector, which judges by the
            // ack floor as the server has it now.
            if let Some(manifest) = self.index.get(&key) {
                let _ = self.record(&manifest, Write::Anyway).await;
            }
            lock(&self.deferred).insert(id.to_string());
            tracing::debug!(manifest = %id,
                "a manifest's removal crossed a reconnect: written again, it is collected once its rows are known acked");
            return purged.map_err(|e| e.store());
        }
        self.index.remove(&key, None);
        Ok(())
    }

    /// See [`ManifestStore::withdraw`]: removed now, on one server or a cluster, after
    /// a reconnect or not (the deferrals of `forget` guard settled records only), if it
    /// is still at `expected`.
    async fn withdraw(&self, id: &str, expected: u64) -> Result<(), UpdateError> {
        let key = self.key_of(id).map_err(UpdateError::Unavailable)?;
        self.purge_key(&key, Some(expected))
            .await
            .map_err(|e| e.superseded(id))?;
        lock(&self.recorded).remove(id);
        lock(&self.deferred).remove(id);
        self.index.remove(&key, None);
        Ok(())
    }

    async fn fetch(&self, sequences: &[u64]) -> Result<Vec<Bytes>, FetchError> {
        let name = &self.settings.stream;
        let stream = self
            .js
            .get_stream_no_info(name)
            .await
            .map_err(|e| FetchError::Unavailable(StoreError(format!("stream {name}: {e}"))))?;
        let stream = &stream;
        futures::stream::iter(sequences.iter().copied())
            .map(|seq| async move {
                match stream.get_raw_message(seq).await {
                    // Its rows, decoded as the source decodes them (`nats::encoding`).
                    Ok(message) => crate::nats::decode(Some(&message.headers), &message.payload)
                        .map_err(|e| {
                            FetchError::Unavailable(StoreError(format!(
                                "message {seq} of stream {name}: {e}"
                            )))
                        }),
                    Err(e) if e.kind() == stream::RawMessageErrorKind::NoMessageFound => {
                        Err(FetchError::Gone {
                            stream_sequence: seq,
                        })
                    }
                    Err(e) => Err(FetchError::Unavailable(StoreError(format!(
                        "reading message {seq} of stream {name}: {e}"
                    )))),
                }
            })
            .buffered(FETCH_CONCURRENCY)
            .try_collect()
            .await
    }

    /// Whether each message is still in the ingest stream (a work queue: an acked
    /// message leaves it).
    async fn in_stream(&self, sequences: &[u64]) -> Result<Vec<bool>, StoreError> {
        let name = &self.settings.stream;
        let stream = self
            .js
            .get_stream_no_info(name)
            .await
            .map_err(|e| StoreError(format!("stream {name}: {e}")))?;
        let stream = &stream;
        futures::stream::iter(sequences.iter().copied())
            .map(|seq| async move {
                match stream.get_raw_message(seq).await {
                    Ok(_) => Ok(true),
                    Err(e) if e.kind() == stream::RawMessageErrorKind::NoMessageFound => Ok(false),
                    Err(e) => Err(StoreError(format!(
                        "reading message {seq} of stream {name}: {e}"
                    ))),
                }
            })
            .buffered(FETCH_CONCURRENCY)
            .try_collect()
            .await
    }

    /// The bucket, once the watch has opened it.
    fn bucket(&self) -> Result<kv::Store, StoreError> {
        self.kv
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .ok_or_else(|| {
                StoreError(format!(
                    "the manifest bucket {} is not open yet",
                    self.settings.bucket
                ))
            })
    }

    /// Remove a key (only at revision `expected`, when given); every watch sees the
    /// removal marker.
    async fn purge_key(&self, key: &str, expected: Option<u64>) -> Result<(), WriteError> {
        let kv = self.bucket().map_err(WriteError::Store)?;
        kv.purge_expect_revision(key, expected)
            .await
            .map_err(|e| match e.kind() {
                kv::PurgeErrorKind::WrongLastRevision => WriteError::NotAsRead,
                _ => WriteError::Store(StoreError(format!("removing manifest {key}: {e}"))),
            })
    }

    /// Whether the manifest's `forget` was deferred by a reconnect.
    fn deferred(&self, id: &str) -> bool {
        lock(&self.deferred).contains(id)
    }

    /// Forget what is remembered of manifests no longer in the bucket (removed by
    /// another instance, or expired).
    fn keep_only(&self, known: HashSet<&str>) {
        lock(&self.deferred).retain(|id| known.contains(id.as_str()));
        lock(&self.recorded).retain(|id, _| known.contains(id.as_str()));
    }

    /// The manifest is gone from the bucket: nothing more to remember about it.
    fn settled(&self, id: &str) {
        lock(&self.deferred).remove(id);
        lock(&self.recorded).remove(id);
    }
}

/// How a record is written.
#[derive(Clone, Copy, Debug)]
enum Write {
    /// Only where the bucket holds nothing for its key (a claim).
    New,
    /// Only over the state at this revision (every write after a claim).
    Over(u64),
    /// Whatever is there (a settled record written back behind a removal that crossed
    /// a reconnect: see `forget`).
    Anyway,
}

impl Write {
    fn headers(self) -> Option<async_nats::HeaderMap> {
        let expected = match self {
            Write::New => 0,
            Write::Over(revision) => revision,
            Write::Anyway => return None,
        };
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(
            async_nats::header::NATS_EXPECTED_LAST_SUBJECT_SEQUENCE,
            expected.to_string().as_str(),
        );
        Some(headers)
    }
}

/// Why a write did not happen.
#[derive(Debug, thiserror::Error)]
pub(crate) enum WriteError {
    /// The key is not at the revision the write expected: someone wrote it first.
    #[error("the manifest was written by someone else meanwhile")]
    NotAsRead,
    #[error(transparent)]
    Store(StoreError),
}

impl WriteError {
    fn superseded(self, id: &str) -> UpdateError {
        match self {
            WriteError::NotAsRead => UpdateError::Superseded { id: id.to_owned() },
            WriteError::Store(e) => UpdateError::Unavailable(e),
        }
    }

    fn store(self) -> StoreError {
        match self {
            WriteError::Store(e) => e,
            not_as_read => StoreError(not_as_read.to_string()),
        }
    }
}

/// The ingest stream's incarnation: its creation time, in ns since the epoch (kept by
/// the server across restarts).
fn incarnation_of(info: &stream::Info) -> u64 {
    u64::try_from(info.created.unix_timestamp_nanos()).unwrap_or(0)
}

/// A poisoned lock still holds a consistent set (each change is one operation).
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
