//! A key held by a request: what its chunks are sent with, and how its end is recorded.
//!
//! The end is written before the answer goes out, so a client's retry finds it. When
//! it cannot be written (NATS went away mid-request), it is tried again in the
//! background until it is, or until the claim would lapse anyway: otherwise a retry
//! would meet 409 for the whole lease after a short outage.

use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use bytes::Bytes;
use tokio::time::Instant;

use super::key::ScopedKey;
use super::record::{BodyUse, ChunkSet, Record, Split};
use super::CLOCK_MARGIN;
use crate::nats::{KeyStore, KeyStoreError};

/// Between two tries of an end that could not be recorded.
const SETTLE_RETRY: Duration = Duration::from_millis(500);

/// How a request that held a key ended.
pub enum End {
    /// A final answer (every row stored, or refused for good).
    Answered { status: StatusCode, reply: String },
    /// Rows not stored (503): these chunks are stored (acknowledged; a chunk whose ack
    /// never came is not listed, and is sent again under its id).
    Unfinished { stored: ChunkSet },
    /// No chunk was ever sent under the key: it is free again.
    Unused,
}

/// A key held by a request while it publishes.
pub struct Claim {
    hold: Hold,
    body: BodyUse,
    stem: String,
    stored_before: ChunkSet,
}

// === impl Claim ===

impl Claim {
    pub(super) fn new(hold: Hold, scope: &ScopedKey, body: BodyUse, stored: ChunkSet) -> Self {
        Self {
            stem: scope.message_stem(&body.fingerprint),
            hold,
            body,
            stored_before: stored,
        }
    }

    /// How the body is split (as when it was first sent under the key).
    pub fn split(&self) -> Split {
        self.body.split
    }

    /// The stem of the chunks' message ids.
    pub fn message_stem(&self) -> &str {
        &self.stem
    }

    /// Chunks an earlier request under the key stored: not sent again.
    pub fn stored_before(&self) -> &ChunkSet {
        &self.stored_before
    }

    /// When the claim's lease ends: nothing is sent after it.
    pub fn deadline(&self) -> Instant {
        self.hold.deadline
    }

    /// Record how the request ended.
    pub async fn finish(self, end: End) {
        let Claim { hold, body, .. } = self;
        let change = match end {
            End::Unused => Change::Remove,
            End::Unfinished { stored } => {
                Change::Write(Record::Unfinished { body, stored }.encode())
            }
            End::Answered { status, reply } => Change::Write(
                Record::Answered {
                    body,
                    status: status.as_u16(),
                    reply,
                }
                .encode(),
            ),
        };
        hold.settle(change).await;
    }
}

/// What the last write of a held key does.
#[derive(Clone)]
enum Change {
    Write(Bytes),
    Remove,
}

/// A key this request wrote last (at `revision`). Dropped unsettled (its client went
/// away, or it ended before publishing), it frees the key at once instead of holding
/// it for the lease.
pub(super) struct Hold {
    store: Arc<KeyStore>,
    key: String,
    revision: u64,
    /// The lease's end, by this process's clock: nothing is sent after it.
    pub(super) deadline: Instant,
    settled: bool,
}

// === impl Hold ===

impl Hold {
    /// Write `record` under a key whose revision is `expected`, holding it for `lease`.
    pub(super) async fn take(
        store: &Arc<KeyStore>,
        key: &str,
        record: Record,
        expected: u64,
        lease: Duration,
    ) -> Result<Hold, KeyStoreError> {
        // Before the write: the lease is never longer here than the record says.
        let claimed_at = Instant::now();
        let revision = store.write(key, record.encode(), expected).await?;
        Ok(Hold {
            store: store.clone(),
            key: key.to_string(),
            revision,
            deadline: claimed_at + lease,
            settled: false,
        })
    }

    pub(super) async fn rewrite(&mut self, record: Record) -> Result<(), KeyStoreError> {
        let written = self
            .store
            .write(&self.key, record.encode(), self.revision)
            .await;
        match written {
            Ok(revision) => {
                self.revision = revision;
                Ok(())
            }
            Err(e) => {
                // Another request wrote the key: it is not ours to release any more.
                self.settled = e == KeyStoreError::Conflict;
                Err(e)
            }
        }
    }

    /// Make the last change; if it cannot be made now, keep trying in the background.
    async fn settle(mut self, change: Change) {
        self.settled = true;
        let (store, key, revision) = (self.store.clone(), self.key.clone(), self.revision);
        match apply(&store, &key, revision, &change).await {
            Ok(()) | Err(KeyStoreError::Conflict) => {}
            Err(e) => {
                tracing::warn!(key = %key, error = %e, "the end of a keyed ingest request could not be recorded yet: trying again until its claim would lapse");
                tokio::spawn(keep_trying(store, key, revision, change, self.lapses()));
            }
        }
    }

    /// When another request may take the key over anyway.
    fn lapses(&self) -> Instant {
        self.deadline + CLOCK_MARGIN
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        if self.settled {
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(keep_trying(
                self.store.clone(),
                self.key.clone(),
                self.revision,
                Change::Remove,
                self.lapses(),
            ));
        }
    }
}

async fn apply(
    store: &KeyStore,
    key: &str,
    revision: u64,
    change: &Change,
) -> Result<(), KeyStoreError> {
    match change {
        Change::Write(value) => store.write(key, value.clone(), revision).await.map(drop),
        Change::Remove => store.remove(key, revision).await,
    }
}

/// Tries `change` every [`SETTLE_RETRY`] until it is made, someone else wrote the key,
/// or `until`.
async fn keep_trying(
    store: Arc<KeyStore>,
    key: String,
    revision: u64,
    change: Change,
    until: Instant,
) {
    loop {
        match apply(&store, &key, revision, &change).await {
            Ok(()) | Err(KeyStoreError::Conflict) => return,
            Err(e) if Instant::now() >= until => {
                tracing::debug!(key = %key, error = %e, "an Idempotency-Key claim was not settled: it lapses");
                return;
            }
            Err(_) => tokio::time::sleep(SETTLE_RETRY).await,
        }
    }
}
