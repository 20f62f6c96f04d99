//! Batch manifests in a JetStream key-value bucket: the actors' `ManifestStore`.
//!
//! - `bucket.rs`: the bucket's stream, created by Sluice (async-nats cannot create a
//!   bucket on nats-server 2.9.10) with a byte budget and a last-resort TTL.
//! - `codec.rs`: a manifest's value, compact (a 10,000-message batch in ~10 KB).
//! - `index.rs`: the store's own index, kept by a watch of the bucket: the changes it
//!   reports to the tables, the claims a new batch is checked against, what a starting
//!   table reads.
//! - `watch.rs`: the watch of the bucket that keeps the index current.
//! - `records.rs`: one batch's record written and read; `stream_reads.rs`: its
//!   messages read back from the stream.
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
mod partitions;
mod records;
mod stream_reads;
mod trusted_floor;
mod watch;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use async_nats::jetstream::{self, kv};
use bytes::Bytes;
use futures::future::BoxFuture;
use sluice_actors::{
    Changes, ClaimError, FetchError, LedgerSnapshot, Manifest, ManifestStore, Recorded, StoreError,
    TableKey, UpdateError,
};
use tokio::task::JoinHandle;

pub use bucket::{stream_name as bucket_stream_name, MAX_AGE as MANIFEST_MAX_AGE};
pub use codec::decode as decode_manifest;
pub use collect::Collected;

use self::index::Index;
use self::records::Write;
/// Also the floor the split records' collector removes by (`nats::split`).
pub(crate) use self::trusted_floor::{Floor, TrustedFloor};
use super::publish::Publisher;
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
    /// A partitioned queue's streams by partition (`[nats] partitions`); empty: the
    /// one `stream`.
    pub partitions: Vec<String>,
    pub collect_every: Duration,
    /// Removal markers older than this are dropped from the bucket by the collector,
    /// so that a new watch does not read a day of them.
    pub marker_age: Duration,
    /// How long the bucket keeps a record at most ([`MANIFEST_MAX_AGE`]; a test may
    /// shorten it): the collector tells records that expired.
    pub max_age: Duration,
    /// How long a record stays once this instance saw it in its last state before the
    /// collector may remove it: [`sluice_actors::keep_settled_for`] of `ack_wait`, so
    /// that a copy of its messages still held somewhere meets it.
    pub keep_settled: Duration,
}

impl From<&NatsConfig> for ManifestSettings {
    fn from(c: &NatsConfig) -> Self {
        Self {
            bucket: c.manifest_bucket.clone(),
            max_bytes: c.manifest_max_bytes,
            replicas: c.streams.replicas,
            stream: c.streams.stream.clone(),
            consumer: c.streams.consumer.clone(),
            partitions: match c.streams.partitions {
                0 | 1 => Vec::new(),
                n => (0..n)
                    .map(|p| crate::nats::partition_stream(&c.streams.stream, p))
                    .collect(),
            },
            collect_every: COLLECT_EVERY,
            marker_age: MARKER_AGE,
            max_age: bucket::MAX_AGE,
            keep_settled: sluice_actors::keep_settled_for(c.streams.ack_wait),
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
    /// passes read them (see `trusted_floor`), by partition.
    floor_reads: Mutex<Vec<TrustedFloor>>,
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
        let watch = tokio::spawn(watch::keep_watching(
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
        let incarnation =
            partitions::read_incarnation(&self.shared.js, &self.shared.settings, deadline).await?;
        self.shared.index.set_incarnation(incarnation);
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

    fn earlier_claim<'a>(
        &'a self,
        manifest: &'a Manifest,
    ) -> BoxFuture<'a, Result<Option<String>, StoreError>> {
        Box::pin(async move {
            if !self
                .shared
                .index
                .wait_watched(manifest.claim_revision, CLAIM_WAIT)
                .await
            {
                return Err(StoreError(format!(
                    "the manifest index did not see batch {}'s claim within {CLAIM_WAIT:?}: its rows go back",
                    manifest.id
                )));
            }
            Ok(self.shared.index.earlier_claim(manifest))
        })
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

/// A poisoned lock still holds a consistent set (each change is one operation).
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
