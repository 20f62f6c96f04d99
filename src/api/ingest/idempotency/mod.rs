//! `Idempotency-Key` (IETF draft "The Idempotency-Key HTTP Header Field"): a key belongs
//! to its deployment (the ingest stream), tenant and table, and binds the body first
//! sent with it.
//!
//! A keyed request, with its record in the bucket (`nats::KeyStore`, shared by every
//! instance, kept for `[nats] duplicate_window` after its last write):
//!
//! 1. Before its body is read, it claims the key ([`Idempotency::open`]: an
//!    `in_progress` record, written only if the key is free); a key held by a request
//!    still in progress is answered 409 at once; a key with an earlier request's
//!    record is read, for step 2.
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

mod claim;
mod key;
mod record;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use axum::http::StatusCode;

use crate::nats::{KeyStore, KeyStoreError, Slot};
use crate::telemetry::metrics as m;

use claim::Hold;
pub use claim::{Claim, End};
pub use key::{from_headers, Fingerprint, IdempotencyKey, ScopedKey, MAX_MESSAGE_ID_LEN};
pub use record::{BodyUse, ChunkSet, Split};
use record::{Holder, Record};

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
    /// The deployment's ingest stream: a key belongs to it (the bucket may be shared
    /// by another deployment on the same NATS).
    stream: String,
}

/// A keyed request before its body is read.
pub enum Opened {
    /// 409: a request in progress holds the key.
    InProgress,
    /// Read the body, then [`Keyed::decide`].
    Keyed(Box<Keyed>),
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

// === impl Idempotency ===

impl Idempotency {
    /// Keys of the deployment whose ingest stream is `stream`, kept in `store`, each
    /// claim holding its key for `lease`. Registers every
    /// outcome's series at 0.
    pub fn new(store: Arc<KeyStore>, lease: Duration, stream: &str) -> Self {
        for outcome in KeyOutcome::ALL {
            metrics::counter!(m::INGEST_IDEMPOTENCY, "outcome" => outcome.label()).increment(0);
        }
        Self {
            store,
            lease,
            stream: stream.to_string(),
        }
    }

    /// `key` as sent by `tenant` to `table` of this deployment.
    pub fn scope(&self, tenant: &str, table: &str, key: IdempotencyKey) -> ScopedKey {
        ScopedKey::new(&self.stream, tenant, table, key)
    }

    /// Look at a request's key before its body is read; claim it if it is free.
    pub async fn open(&self, scope: ScopedKey) -> Opened {
        let key = scope.record_key();
        let holder = Holder::new(self.lease);
        // Most keys are new: claimed in one round trip, read only when that fails.
        let earlier = match self.claim(&key, 0, &holder).await {
            Ok(hold) => Earlier::Free(hold),
            Err(KeyStoreError::Conflict) => match self.store.get(&key).await {
                Ok(Slot::Vacant { revision }) => match self.claim(&key, revision, &holder).await {
                    Ok(hold) => Earlier::Free(hold),
                    Err(e) => return refused_opened(e),
                },
                Ok(Slot::Held(held)) => match Record::decode(&held.value) {
                    Ok(Record::InProgress { lease_ms, .. })
                        if !lapsed(held.written, Duration::from_millis(lease_ms)) =>
                    {
                        return count(KeyOutcome::InProgress, Opened::InProgress);
                    }
                    Ok(record) => Earlier::Record {
                        record,
                        revision: held.revision,
                    },
                    Err(why) => {
                        tracing::warn!(key = %key, %why, "an Idempotency-Key record Sluice cannot read: taken over");
                        Earlier::Unreadable {
                            revision: held.revision,
                        }
                    }
                },
                Err(e) => return refused_opened(e),
            },
            Err(e) => return refused_opened(e),
        };
        Opened::Keyed(Box::new(Keyed {
            scope,
            key,
            store: self.store.clone(),
            holder,
            earlier,
        }))
    }

    /// Claim a key whose revision is `expected` (0: never written), before the body.
    async fn claim(
        &self,
        key: &str,
        expected: u64,
        holder: &Holder,
    ) -> Result<Hold, KeyStoreError> {
        let claim = Record::claim(holder, None, ChunkSet::default());
        let hold = Hold::take(&self.store, key, claim, expected, holder).await?;
        KeyOutcome::Claimed.count();
        Ok(hold)
    }
}

/// A key that could not be claimed before the body: another request took it this
/// instant (409), or the bucket cannot be used (503).
fn refused_opened(e: KeyStoreError) -> Opened {
    match e {
        KeyStoreError::Conflict => count(KeyOutcome::InProgress, Opened::InProgress),
        e => count(KeyOutcome::Unusable, Opened::Unusable(e)),
    }
}

/// Counts `outcome`, and passes `value` on.
fn count<T>(outcome: KeyOutcome, value: T) -> T {
    outcome.count();
    value
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
    /// The record's key in the bucket.
    key: String,
    store: Arc<KeyStore>,
    /// This request, as its claim names it.
    holder: Holder,
    earlier: Earlier,
}

/// What was under the key when the request looked.
enum Earlier {
    /// Nothing: this request claimed it.
    Free(Hold),
    /// An earlier request's record (a claim only when past its lease).
    Record { record: Record, revision: u64 },
    /// A record this version of Sluice cannot read: taken over like a lapsed claim.
    Unreadable { revision: u64 },
}

// === impl Keyed ===

impl Keyed {
    /// Decide, from the body (its fingerprint and how this instance would split it):
    /// publish, answer again, or refuse. The fingerprint is in the record before this
    /// answers [`Decision::Publish`].
    pub async fn decide(self, body: BodyUse) -> Decision {
        let (revision, body, stored, outcome) = match self.earlier {
            Earlier::Free(mut hold) => {
                let record = Record::claim(hold.holder(), Some(body.clone()), ChunkSet::default());
                return match hold.rewrite(record).await {
                    Ok(()) => {
                        let fresh = ChunkSet::default();
                        Decision::Publish(Claim::new(hold, &self.scope, body, fresh, false))
                    }
                    Err(e) => refused(e),
                };
            }
            Earlier::Record { record, revision } => {
                if record
                    .body()
                    .is_some_and(|earlier| earlier.fingerprint != body.fingerprint)
                {
                    return count(KeyOutcome::Mismatch, Decision::Mismatch);
                }
                match record {
                    Record::Answered { status, reply, .. } => {
                        let status = StatusCode::from_u16(status).unwrap_or(StatusCode::ACCEPTED);
                        return count(KeyOutcome::Replayed, Decision::Replay { status, reply });
                    }
                    // Split as it was first split: the same chunks under the same ids.
                    Record::Unfinished {
                        body: earlier,
                        stored,
                    } => (revision, earlier, stored, KeyOutcome::Resumed),
                    Record::InProgress {
                        body: earlier,
                        stored,
                        ..
                    } => (
                        revision,
                        earlier.unwrap_or(body),
                        stored,
                        KeyOutcome::TakenOver,
                    ),
                }
            }
            Earlier::Unreadable { revision } => {
                (revision, body, ChunkSet::default(), KeyOutcome::TakenOver)
            }
        };
        let claim = Record::claim(&self.holder, Some(body.clone()), stored.clone());
        match Hold::take(&self.store, &self.key, claim, revision, &self.holder).await {
            Ok(hold) => count(
                outcome,
                Decision::Publish(Claim::new(hold, &self.scope, body, stored, true)),
            ),
            Err(e) => refused(e),
        }
    }
}

/// A write of the key that failed: someone else took it (409), or the bucket cannot
/// be used (503).
fn refused(e: KeyStoreError) -> Decision {
    match e {
        KeyStoreError::Conflict => count(KeyOutcome::InProgress, Decision::InProgress),
        e => count(KeyOutcome::Unusable, Decision::Unusable(e)),
    }
}
