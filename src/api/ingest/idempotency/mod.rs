//! `Idempotency-Key` (IETF draft "The Idempotency-Key HTTP Header Field"): a key belongs
//! to its tenant and table, and binds the body first sent with it.
//!
//! A keyed request, with its record in the bucket (`nats::KeyStore`, shared by every
//! instance, kept for `[nats] duplicate_window` after its last write):
//!
//! 1. Before its body is read, it looks at the key ([`Idempotency::open`]): free, it
//!    claims it (an `in_progress` record); held by a request still in progress, it is
//!    answered 409 at once.
//! 2. Once the body is read, its fingerprint decides ([`Keyed::decide`]): a key used
//!    for another body answers 422; a key whose request ended with a final answer
//!    gives that answer again, nothing published; a key whose request ended with rows
//!    not stored (503) is taken, and only the chunks not stored yet are published. The
//!    fingerprint is in the record before any chunk is published under the key.
//! 3. The request records how it ended ([`Claim::finish`]): its answer (final), the
//!    chunks stored (a 503), or nothing (no chunk was sent: the key is free again, so a
//!    body refused whole may be fixed and sent with the same key).
//!
//! A claim holds the key for its lease (twice `[api] body_timeout`: the body is read
//! within one, the rows published within the other, or the request answers 503 with
//! what it stored). A claim older than its lease plus [`CLOCK_MARGIN`] belongs to a
//! request that is gone (its Sluice crashed): another request with the same body takes
//! the key over, with a compare-and-set on the record's revision.
//!
//! The chunks' message ids are `<stem>-<index>` (`key::ScopedKey::message_stem`): a
//! request that takes over a crashed one's key, or resends a chunk whose ack never
//! came, sends the same ids, and JetStream's duplicate window stores each chunk once.

mod key;
mod record;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use axum::http::StatusCode;
use tokio::time::Instant;

use crate::nats::{KeyStore, KeyStoreError, Slot};
use crate::telemetry::metrics as m;

pub use key::{from_headers, Fingerprint, IdempotencyKey, ScopedKey, MAX_MESSAGE_ID_LEN};
use record::Record;
pub use record::{BodyUse, ChunkSet, Split};

/// Beyond a claim's lease, before another request may take the key over: room for the
/// acks still awaited when the lease ends (JetStream answers within 5 s), the last
/// write, and clocks that differ between the Sluice hosts and nats-server's.
pub const CLOCK_MARGIN: Duration = Duration::from_secs(10);

/// How long a claim holds its key: the body is read within `body_timeout` of the end
/// of the headers (or the request ends), and the rows are published within as long
/// again (or the request answers 503 with what it stored).
pub fn lease(body_timeout: Duration) -> Duration {
    body_timeout.saturating_mul(2)
}

/// How long the bucket keeps a record after its last write: the ingest stream's
/// duplicate window (the promise's length), but never less than a claim can last,
/// or a claim would expire under its own request.
pub fn record_age(duplicate_window: Duration, lease: Duration) -> Duration {
    duplicate_window.max(lease + CLOCK_MARGIN)
}

/// What became of a keyed request at its key, for `sluice_ingest_idempotency_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyOutcome {
    /// A key not in use: claimed.
    Claimed,
    /// The first answer given again.
    Replayed,
    /// A request that ended with rows not stored, resumed.
    Resumed,
    /// A claim past its lease (its request gone), taken over.
    TakenOver,
    /// 409: the key's request is still in progress.
    InProgress,
    /// 422: the key was used for another body.
    Mismatch,
    /// The bucket could not be used: the request answered 503.
    Unusable,
}

impl KeyOutcome {
    pub const ALL: [KeyOutcome; 7] = [
        KeyOutcome::Claimed,
        KeyOutcome::Replayed,
        KeyOutcome::Resumed,
        KeyOutcome::TakenOver,
        KeyOutcome::InProgress,
        KeyOutcome::Mismatch,
        KeyOutcome::Unusable,
    ];

    pub fn label(self) -> &'static str {
        match self {
            KeyOutcome::Claimed => "claimed",
            KeyOutcome::Replayed => "replayed",
            KeyOutcome::Resumed => "resumed",
            KeyOutcome::TakenOver => "taken_over",
            KeyOutcome::InProgress => "in_progress",
            KeyOutcome::Mismatch => "mismatch",
            KeyOutcome::Unusable => "unusable",
        }
    }

    fn count(self) {
        metrics::counter!(m::INGEST_IDEMPOTENCY, "outcome" => self.label()).increment(1);
    }
}

/// The keys of the ingest API.
pub struct Idempotency {
    store: Arc<KeyStore>,
    /// How long a claim holds a key (see the module's doc).
    lease: Duration,
}

/// A keyed request before its body is read.
pub enum Opened {
    /// 409: a request in progress holds the key.
    InProgress,
    /// Read the body, then [`Keyed::decide`].
    Keyed(Keyed),
    /// The bucket could not be used: nothing is published (503).
    Unusable(KeyStoreError),
}

/// What a keyed request does once its body's fingerprint is known.
pub enum Decision {
    /// Publish, holding the key.
    Publish(Claim),
    /// Answer what the key's first request answered; publish nothing.
    Replay { status: StatusCode, reply: String },
    /// 422: the key was used for another body.
    Mismatch,
    /// 409: another request took the key meanwhile.
    InProgress,
    /// The bucket could not be used: nothing is published (503).
    Unusable(KeyStoreError),
}

/// How a request that held a key ended.
pub enum End {
    /// A final answer (every row stored or refused for good).
    Answered { status: StatusCode, reply: String },
    /// Rows not stored (503): these chunks are stored (or may be: sent, ack unknown).
    Unfinished { stored: ChunkSet },
    /// No chunk was ever sent under the key.
    Unused,
}

// === impl Idempotency ===

impl Idempotency {
    /// Keys kept in `store`, each claim holding its key for `lease`. Registers every
    /// outcome's series at 0.
    pub fn new(store: KeyStore, lease: Duration) -> Self {
        for outcome in KeyOutcome::ALL {
            metrics::counter!(m::INGEST_IDEMPOTENCY, "outcome" => outcome.label()).increment(0);
        }
        Self {
            store: Arc::new(store),
            lease,
        }
    }

    /// Look at a request's key before its body is read; claim it if it is free.
    pub async fn open(&self, scope: ScopedKey) -> Opened {
        let key = scope.record_key();
        let slot = match self.store.get(&key).await {
            Ok(slot) => slot,
            Err(e) => return unusable_opened(e),
        };
        let earlier = match slot {
            Slot::Vacant { revision } => {
                let claimed_at = Instant::now();
                let claim = Record::in_progress(self.lease, None);
                return match Hold::write_new(&self.store, &key, claim, revision).await {
                    Ok(hold) => {
                        KeyOutcome::Claimed.count();
                        Opened::Keyed(Keyed {
                            scope,
                            lease: self.lease,
                            earlier: Earlier::Free { hold, claimed_at },
                        })
                    }
                    Err(KeyStoreError::Conflict) => in_progress_opened(),
                    Err(e) => unusable_opened(e),
                };
            }
            Slot::Held(held) => match Record::decode(&held.value) {
                Ok(Record::InProgress { lease_ms, .. })
                    if !lapsed(held.written, Duration::from_millis(lease_ms)) =>
                {
                    return in_progress_opened();
                }
                Ok(record) => Earlier::Record {
                    record,
                    revision: held.revision,
                    store: self.store.clone(),
                    key,
                },
                Err(why) => {
                    tracing::warn!(key = %key, %why, "an Idempotency-Key record Sluice cannot read: taken over");
                    Earlier::Unreadable {
                        revision: held.revision,
                        store: self.store.clone(),
                        key,
                    }
                }
            },
        };
        Opened::Keyed(Keyed {
            scope,
            lease: self.lease,
            earlier,
        })
    }
}

fn in_progress_opened() -> Opened {
    KeyOutcome::InProgress.count();
    Opened::InProgress
}

fn unusable_opened(e: KeyStoreError) -> Opened {
    KeyOutcome::Unusable.count();
    Opened::Unusable(e)
}

/// Whether a claim written at `written` (the server's clock) is past its lease and the
/// margin, by this host's clock.
fn lapsed(written: SystemTime, lease: Duration) -> bool {
    SystemTime::now()
        .duration_since(written)
        .is_ok_and(|age| age > lease + CLOCK_MARGIN)
}

/// A keyed request whose body is being read.
pub struct Keyed {
    scope: ScopedKey,
    lease: Duration,
    earlier: Earlier,
}

/// What was under the key when the request looked.
enum Earlier {
    /// Nothing: this request claimed it.
    Free { hold: Hold, claimed_at: Instant },
    /// An earlier request's record (a claim only when past its lease).
    Record {
        record: Record,
        revision: u64,
        store: Arc<KeyStore>,
        key: String,
    },
    /// A record this version of Sluice cannot read: taken over like a lapsed claim.
    Unreadable {
        revision: u64,
        store: Arc<KeyStore>,
        key: String,
    },
}

// === impl Keyed ===

impl Keyed {
    /// Decide, from the body (its fingerprint and how this instance would split it):
    /// publish, answer again, or refuse.
    pub async fn decide(self, body: BodyUse) -> Decision {
        let Keyed {
            scope,
            lease,
            earlier,
        } = self;
        let (body, stored, outcome, mut hold, claimed_at) = match earlier {
            Earlier::Free {
                mut hold,
                claimed_at,
            } => {
                // The fingerprint is recorded before any chunk is published.
                let record = Record::in_progress(lease, Some(body.clone()));
                if let Err(e) = hold.rewrite(record).await {
                    return unusable_or_busy(e);
                }
                (body, ChunkSet::default(), None, hold, claimed_at)
            }
            Earlier::Record {
                record,
                revision,
                store,
                key,
            } => {
                if record
                    .body()
                    .is_some_and(|earlier| earlier.fingerprint != body.fingerprint)
                {
                    KeyOutcome::Mismatch.count();
                    return Decision::Mismatch;
                }
                let (body, stored, outcome) = match record {
                    Record::Answered { status, reply, .. } => {
                        KeyOutcome::Replayed.count();
                        return Decision::Replay {
                            status: StatusCode::from_u16(status).unwrap_or(StatusCode::ACCEPTED),
                            reply,
                        };
                    }
                    Record::Unfinished {
                        body: earlier,
                        stored,
                    } => (earlier, stored, KeyOutcome::Resumed),
                    Record::InProgress { body: earlier, .. } => (
                        earlier.unwrap_or(body),
                        ChunkSet::default(),
                        KeyOutcome::TakenOver,
                    ),
                };
                let claimed_at = Instant::now();
                let claim = Record::in_progress(lease, Some(body.clone()));
                match Hold::write_new(&store, &key, claim, revision).await {
                    Ok(hold) => (body, stored, Some(outcome), hold, claimed_at),
                    Err(e) => return unusable_or_busy(e),
                }
            }
            Earlier::Unreadable {
                revision,
                store,
                key,
            } => {
                let claimed_at = Instant::now();
                let claim = Record::in_progress(lease, Some(body.clone()));
                match Hold::write_new(&store, &key, claim, revision).await {
                    Ok(hold) => (
                        body,
                        ChunkSet::default(),
                        Some(KeyOutcome::TakenOver),
                        hold,
                        claimed_at,
                    ),
                    Err(e) => return unusable_or_busy(e),
                }
            }
        };
        if let Some(outcome) = outcome {
            outcome.count();
        }
        hold.body = Some(body.clone());
        Decision::Publish(Claim {
            stem: scope.message_stem(&body.fingerprint),
            split: body.split,
            stored_before: stored,
            deadline: claimed_at + lease,
            hold,
        })
    }
}

fn unusable_or_busy(e: KeyStoreError) -> Decision {
    match e {
        KeyStoreError::Conflict => {
            KeyOutcome::InProgress.count();
            Decision::InProgress
        }
        e => {
            KeyOutcome::Unusable.count();
            Decision::Unusable(e)
        }
    }
}

/// A key held by a request while it publishes.
pub struct Claim {
    hold: Hold,
    stem: String,
    split: Split,
    stored_before: ChunkSet,
    deadline: Instant,
}

// === impl Claim ===

impl Claim {
    /// How the body is split (as when it was first sent under the key).
    pub fn split(&self) -> Split {
        self.split
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
        self.deadline
    }

    /// Record how the request ended. A record that cannot be written leaves the claim
    /// to lapse (its chunks' ids still keep a retry from storing them twice).
    pub async fn finish(self, end: End) {
        let mut hold = self.hold;
        let Some(body) = hold.body.clone() else {
            return;
        };
        let written = match end {
            End::Unused => hold.release().await,
            End::Unfinished { stored } => hold.rewrite(Record::Unfinished { body, stored }).await,
            End::Answered { status, reply } => {
                hold.rewrite(Record::Answered {
                    body,
                    status: status.as_u16(),
                    reply,
                })
                .await
            }
        };
        hold.done = true;
        if let Err(e) = written {
            tracing::warn!(key = %hold.key, error = %e, "the end of a keyed ingest request could not be recorded: its key is held until the claim lapses");
        }
    }
}

/// A key this request wrote last (its revision), released if dropped unsettled: a
/// request whose client went away, or that ended before publishing, frees the key
/// at once instead of holding it for its lease.
struct Hold {
    store: Arc<KeyStore>,
    key: String,
    revision: u64,
    /// The body the key is used for, once decided.
    body: Option<BodyUse>,
    done: bool,
}

// === impl Hold ===

impl Hold {
    /// Write `record` under a key whose revision is `expected`; the hold of it.
    async fn write_new(
        store: &Arc<KeyStore>,
        key: &str,
        record: Record,
        expected: u64,
    ) -> Result<Hold, KeyStoreError> {
        let revision = store.write(key, record.encode(), expected).await?;
        Ok(Hold {
            store: store.clone(),
            key: key.to_string(),
            revision,
            body: None,
            done: false,
        })
    }

    async fn rewrite(&mut self, record: Record) -> Result<(), KeyStoreError> {
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
                self.done = e == KeyStoreError::Conflict;
                Err(e)
            }
        }
    }

    async fn release(&mut self) -> Result<(), KeyStoreError> {
        self.done = true;
        self.store.remove(&self.key, self.revision).await
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (store, key, revision) = (self.store.clone(), self.key.clone(), self.revision);
        runtime.spawn(async move {
            if let Err(e) = store.remove(&key, revision).await {
                tracing::debug!(key = %key, error = %e, "an abandoned Idempotency-Key claim was not released: it lapses");
            }
        });
    }
}
