//! One batch's record in the bucket: written create-only (a claim), over the revision
//! read (every write after it) or, behind a removal that crossed a reconnect, anyway;
//! read back, withdrawn, forgotten; and what the store remembers of each write.

use std::collections::HashSet;
use std::sync::atomic::Ordering;

use async_nats::jetstream::kv;
use sluice_actors::{ClaimError, Manifest, Recorded, StoreError, UpdateError};

use super::{bucket, codec, lock, Shared, CLAIM_WAIT};
use crate::nats::publish::PublishError;

impl Shared {
    pub(super) fn connects(&self) -> u64 {
        self.js
            .client()
            .statistics()
            .connects
            .load(Ordering::Relaxed)
    }

    pub(super) fn key_of(&self, id: &str) -> Result<String, StoreError> {
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
    pub(super) async fn record(
        &self,
        m: &Manifest,
        how: Write,
    ) -> Result<(String, u64), WriteError> {
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
    pub(super) async fn create(&self, m: &Manifest) -> Result<(String, u64), WriteError> {
        match self.record(m, Write::New).await {
            Err(WriteError::NotAsRead) => {
                let key = self.key_of(&m.id).map_err(WriteError::Store)?;
                let kv = self.bucket().map_err(WriteError::Store)?;
                let entry = crate::nats::kv_bucket::read_from_leader(&kv, &key)
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
    pub(super) async fn claim(&self, m: &Manifest) -> Result<u64, ClaimError> {
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
    pub(super) async fn current(&self, id: &str) -> Result<Option<Recorded>, StoreError> {
        let key = self.key_of(id)?;
        let kv = self.bucket()?;
        // From the leader: the ledger decides on what this says (see `read_from_leader`).
        let entry = crate::nats::kv_bucket::read_from_leader(&kv, &key)
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

    pub(super) async fn forget(&self, id: &str) -> Result<(), StoreError> {
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
    pub(super) async fn withdraw(&self, id: &str, expected: u64) -> Result<(), UpdateError> {
        let key = self.key_of(id).map_err(UpdateError::Unavailable)?;
        self.purge_key(&key, Some(expected))
            .await
            .map_err(|e| e.superseded(id))?;
        lock(&self.recorded).remove(id);
        lock(&self.deferred).remove(id);
        self.index.remove(&key, None);
        Ok(())
    }

    /// The bucket, once the watch has opened it.
    pub(super) fn bucket(&self) -> Result<kv::Store, StoreError> {
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
    pub(super) async fn purge_key(
        &self,
        key: &str,
        expected: Option<u64>,
    ) -> Result<(), WriteError> {
        let kv = self.bucket().map_err(WriteError::Store)?;
        kv.purge_expect_revision(key, expected)
            .await
            .map_err(|e| match e.kind() {
                kv::PurgeErrorKind::WrongLastRevision => WriteError::NotAsRead,
                _ => WriteError::Store(StoreError(format!("removing manifest {key}: {e}"))),
            })
    }

    /// Whether the manifest's `forget` was deferred by a reconnect.
    pub(super) fn deferred(&self, id: &str) -> bool {
        lock(&self.deferred).contains(id)
    }

    /// Forget what is remembered of manifests no longer in the bucket (removed by
    /// another instance, or expired).
    pub(super) fn keep_only(&self, known: HashSet<&str>) {
        lock(&self.deferred).retain(|id| known.contains(id.as_str()));
        lock(&self.recorded).retain(|id, _| known.contains(id.as_str()));
    }

    /// The manifest is gone from the bucket: nothing more to remember about it.
    pub(super) fn settled(&self, id: &str) {
        lock(&self.deferred).remove(id);
        lock(&self.recorded).remove(id);
    }
}

/// How a record is written.
#[derive(Clone, Copy, Debug)]
pub(super) enum Write {
    /// Only where the bucket holds nothing for its key (a claim).
    New,
    /// Only over the state at this revision (every write after a claim).
    Over(u64),
    /// Whatever is there (a settled record written back behind a removal that crossed
    /// a reconnect: see `forget`).
    Anyway,
}

impl Write {
    pub(super) fn headers(self) -> Option<async_nats::HeaderMap> {
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
    pub(super) fn superseded(self, id: &str) -> UpdateError {
        match self {
            WriteError::NotAsRead => UpdateError::Superseded { id: id.to_owned() },
            WriteError::Store(e) => UpdateError::Unavailable(e),
        }
    }

    pub(super) fn store(self) -> StoreError {
        match self {
            WriteError::Store(e) => e,
            not_as_read => StoreError(not_as_read.to_string()),
        }
    }
}
