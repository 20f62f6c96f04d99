//! A key held by a request: what its chunks are sent with, and how its end is recorded.
//!
//! The end is written before the answer goes out, so a client's retry finds it. When
//! it cannot be written (NATS went away mid-request), it is tried again in the
//! background until it is, or until the claim would lapse anyway: otherwise a retry
//! would meet 409 for the whole lease after a short outage. A claim whose write got
//! no answer (it may land later) is removed the same way, recognised by its holder.

use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use bytes::Bytes;
use tokio::time::Instant;

use super::key::ScopedKey;
use super::record::{BodyUse, ChunkSet, Holder, Record, Split};
use super::CLOCK_MARGIN;
use crate::nats::{KeyStore, KeyStoreError, Slot};

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
    /// An earlier request under the key may have stored chunks (its record was
    /// resumed or taken over).
    resumed: bool,
}

// === impl Claim ===

impl Claim {
    /// `resumed`: the key had an earlier request's record (see [`Claim::resumed`]).
    pub(super) fn new(
        hold: Hold,
        scope: &ScopedKey,
        body: BodyUse,
        stored: ChunkSet,
        resumed: bool,
    ) -> Self {
        Self {
            stem: scope.message_stem(&body.fingerprint),
            hold,
            body,
            stored_before: stored,
            resumed,
        }
    }

    /// Whether an earlier request under the key may have stored chunks: its record was
    /// resumed or taken over. Such a request's chunks are sent only if the consumer did
    /// not mark them landed (`nats::LandedChunks`).
    pub fn resumed(&self) -> bool {
        self.resumed
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

    /// Record how the request ended. A final answer is recorded before it is given (a
    /// retry must find it). A 503's end (the key released, or the chunks stored) is
    /// written in the background: the bucket may well be why it is a 503 (a NATS
    /// cluster without quorum), and the client must get its answer within
    /// `[api] publish_retry_for`, not after the write's timeout too. A retry meanwhile
    /// finds the claim (409) until it is written.
    pub async fn finish(self, end: End) {
        let is_final = matches!(end, End::Answered { .. });
        let Claim { hold, body, .. } = self;
        let change = match end {
            End::Unused => Change::Release,
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
        if is_final {
            hold.settle(change).await;
        } else {
            tokio::spawn(hold.settle(change));
        }
    }
}

/// What the last write of a held key does.
#[derive(Clone)]
enum Change {
    /// Replace the claim with this record.
    Write(Bytes),
    /// Remove the claim, if it is still this request's.
    Release,
}

/// A key this request wrote last (at `revision`). Dropped unsettled (its client went
/// away, or it ended before publishing), it frees the key at once instead of holding
/// it for the lease.
pub(super) struct Hold {
    store: Arc<KeyStore>,
    key: String,
    holder: Holder,
    revision: u64,
    /// The lease's end, by this process's clock: nothing is sent after it.
    pub(super) deadline: Instant,
    settled: bool,
}

// === impl Hold ===

impl Hold {
    /// Write `holder`'s claim (`record`) under a key whose revision is `expected`. A
    /// write that got no answer may still land: its claim is then removed when it
    /// shows up (until it would lapse).
    pub(super) async fn take(
        store: &Arc<KeyStore>,
        key: &str,
        record: Record,
        expected: u64,
        holder: &Holder,
    ) -> Result<Hold, KeyStoreError> {
        // Before the write: the lease is never longer here than the record says.
        let claimed_at = Instant::now();
        let deadline = claimed_at + holder.lease;
        match store.write(key, record.encode(), expected).await {
            Ok(revision) => Ok(Hold {
                store: store.clone(),
                key: key.to_string(),
                holder: holder.clone(),
                revision,
                deadline,
                settled: false,
            }),
            Err(e) => {
                if matches!(e, KeyStoreError::Unavailable { .. }) {
                    let lapses = deadline + CLOCK_MARGIN;
                    tokio::spawn(keep_trying(
                        Settling::of(store, key, holder, None),
                        Change::Release,
                        lapses,
                    ));
                }
                Err(e)
            }
        }
    }

    pub(super) fn holder(&self) -> &Holder {
        &self.holder
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
        let settling = self.settling();
        if let Attempt::Again(why) = settling.attempt(&change).await {
            tracing::warn!(key = %self.key, error = %why, "the end of a keyed ingest request could not be recorded yet: trying again until its claim would lapse");
            tokio::spawn(keep_trying(settling, change, self.lapses()));
        }
    }

    fn settling(&self) -> Settling {
        Settling::of(&self.store, &self.key, &self.holder, Some(self.revision))
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
            runtime.spawn(keep_trying(self.settling(), Change::Release, self.lapses()));
        }
    }
}

/// What the last change of a claim needs, owned (it may outlive the request).
struct Settling {
    store: Arc<KeyStore>,
    key: String,
    holder: String,
    /// The revision the claim was written at; `None` for a claim whose write got no
    /// answer (it may land any moment, or never).
    revision: Option<u64>,
}

/// How one try at the last change went.
enum Attempt {
    /// Made, or not this request's to make any more (another wrote the key).
    Done,
    /// Not made: try again (why, for the log).
    Again(String),
}

impl Settling {
    fn of(store: &Arc<KeyStore>, key: &str, holder: &Holder, revision: Option<u64>) -> Self {
        Self {
            store: store.clone(),
            key: key.to_string(),
            holder: holder.id.clone(),
            revision,
        }
    }

    async fn attempt(&self, change: &Change) -> Attempt {
        let made = match (change, self.revision) {
            (Change::Write(value), Some(revision)) => self
                .store
                .write(&self.key, value.clone(), revision)
                .await
                .map(|_| Attempt::Done),
            (Change::Release, Some(revision)) => {
                match self.store.remove(&self.key, revision).await {
                    // Written since: a late write of this request's, or another's.
                    Err(KeyStoreError::Conflict) => self.release_if_held().await,
                    done => done.map(|()| Attempt::Done),
                }
            }
            // Nothing was written for sure: only a claim that shows up is removed.
            (_, None) => self.release_if_held().await,
        };
        match made {
            Ok(attempt) => attempt,
            Err(KeyStoreError::Conflict) => Attempt::Done,
            Err(e) => Attempt::Again(e.to_string()),
        }
    }

    /// Removes the key if it holds this request's claim. A key without a record may
    /// still receive the claim's late write: tried again while `revision` is unknown.
    async fn release_if_held(&self) -> Result<Attempt, KeyStoreError> {
        match self.store.get(&self.key).await? {
            Slot::Held(held)
                if Record::decode(&held.value).is_ok_and(|r| r.claimed_by(&self.holder)) =>
            {
                self.store
                    .remove(&self.key, held.revision)
                    .await
                    .map(|()| Attempt::Done)
            }
            Slot::Vacant { .. } if self.revision.is_none() => Ok(Attempt::Again(
                "the claim's write has not landed (yet)".into(),
            )),
            _ => Ok(Attempt::Done),
        }
    }
}

/// Tries `change` every [`SETTLE_RETRY`] until it is made, someone else wrote the key,
/// or `until`.
async fn keep_trying(settling: Settling, change: Change, until: Instant) {
    loop {
        match settling.attempt(&change).await {
            Attempt::Done => return,
            Attempt::Again(why) if Instant::now() >= until => {
                tracing::debug!(key = %settling.key, %why, "an Idempotency-Key claim was not settled: it lapses");
                return;
            }
            Attempt::Again(_) => tokio::time::sleep(SETTLE_RETRY).await,
        }
    }
}
