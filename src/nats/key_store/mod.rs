//! Records under keys in a JetStream key-value bucket shared by every Sluice instance,
//! kept across restarts of Sluice and nats-server for as long as the bucket keeps a
//! record: the ingest API's `Idempotency-Key` records (see `api::ingest::idempotency`
//! for what one says) and the DLQ's replay markers (`nats::dlq`). Here a record is
//! bytes under a key, with a revision.
//!
//! Every write is a compare-and-set on the key's revision, so two instances taking the
//! same key at once cannot both win. Writes go through a [`Publisher`] (the bucket's
//! byte budget, exact on every server version); reads are direct gets of the key's
//! last message.

mod bucket;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_nats::jetstream::{self, kv};
use async_nats::HeaderMap;
use bytes::Bytes;
use futures::TryStreamExt as _;
use tokio::sync::Mutex;
use tokio::time::Instant;

use super::kv_bucket;
use super::publish::{PublishError, Publisher};

/// The header a key-value delete marker carries.
const KV_OPERATION: &str = "KV-Operation";

/// What the store is made of.
#[derive(Clone, Debug)]
pub struct KeyStoreSettings {
    /// The bucket (its stream is `KV_<bucket>`).
    pub bucket: String,
    /// What its records are for, in errors ("the {purpose} bucket ..."): "idempotency",
    /// "DLQ replay".
    pub purpose: &'static str,
    /// What the stream says it holds (`nats stream info`).
    pub description: &'static str,
    /// Past it a new record fails.
    pub max_bytes: u64,
    /// Where `max_bytes` comes from, and when records go, for a full bucket's error:
    /// "[nats] idempotency_max_bytes; its records expire after [nats] duplicate_window".
    pub full_hint: &'static str,
    pub replicas: usize,
    /// How long a record is kept after its last write (zero: for good).
    pub max_age: Duration,
    /// How long a write that found no responders (the bucket's stream without a
    /// leader: a NATS cluster electing one) is sent again before it fails; the ingest
    /// API's is `[api] publish_retry_for`, the bound its publishes ride elections by.
    pub no_leader_wait: Duration,
}

/// The least time an attempt is given, even at the window's end.
const MIN_ATTEMPT: Duration = Duration::from_millis(250);

/// What is under a key now.
#[derive(Debug, PartialEq, Eq)]
pub enum Slot {
    /// Nothing (never written, removed, or expired). `revision` is what a write that
    /// takes the key must expect: 0, or the removal marker's.
    Vacant { revision: u64 },
    /// A record.
    Held(Held),
}

/// A record read from the bucket.
#[derive(Debug, PartialEq, Eq)]
pub struct Held {
    pub value: Bytes,
    /// What a write that replaces it must expect.
    pub revision: u64,
    /// When the server stored it (its clock, not this process's).
    pub written: SystemTime,
}

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum KeyStoreError {
    /// The key's revision was not the one expected: someone wrote it first.
    #[error("the key was written by another request meanwhile")]
    Conflict,
    /// The bucket is at its byte budget.
    #[error("the {purpose} bucket {bucket} is full ({hint})")]
    Full {
        purpose: &'static str,
        bucket: String,
        hint: &'static str,
    },
    /// NATS or JetStream did not answer, or refused.
    #[error("the {purpose} bucket {bucket} cannot be used: {why}")]
    Unavailable {
        purpose: &'static str,
        bucket: String,
        why: String,
    },
}

/// The records of one Sluice instance's ingest API.
pub struct KeyStore {
    js: jetstream::Context,
    settings: KeyStoreSettings,
    puts: Publisher,
    /// The bucket, once opened (its stream created when missing); emptied after a
    /// failure, so the next use sets it up again (nats-server may have lost it).
    opened: Mutex<Option<kv::Store>>,
}

// === impl KeyStore ===

impl KeyStore {
    pub fn new(js: jetstream::Context, settings: KeyStoreSettings) -> Self {
        Self {
            puts: Publisher::new(
                js.clone(),
                &kv_bucket::stream_name(&settings.bucket),
                settings.max_bytes,
            ),
            js,
            settings,
            opened: Mutex::new(None),
        }
    }

    pub fn settings(&self) -> &KeyStoreSettings {
        &self.settings
    }

    /// What is under `key`.
    pub async fn get(&self, key: &str) -> Result<Slot, KeyStoreError> {
        let kv = self.bucket().await?;
        // From the leader: whether a key was seen decides a publish (`read_from_leader`).
        let entry = match self
            .within_the_window(crate::nats::kv_bucket::read_from_leader(&kv, key))
            .await
        {
            Some(Ok(entry)) => entry,
            Some(Err(e)) => return Err(self.lost(format!("reading {key}: {e}")).await),
            None => {
                return Err(self
                    .lost(format!("reading {key}: {}", self.no_answer()))
                    .await)
            }
        };
        Ok(match entry {
            None => Slot::Vacant { revision: 0 },
            Some(entry) if entry.operation != kv::Operation::Put => Slot::Vacant {
                revision: entry.revision,
            },
            Some(entry) => Slot::Held(Held {
                written: server_time(entry.created.unix_timestamp_nanos()),
                value: entry.value,
                revision: entry.revision,
            }),
        })
    }

    /// Write `value` under `key` if its revision is still `expected`; the new revision.
    pub async fn write(
        &self,
        key: &str,
        value: Bytes,
        expected: u64,
    ) -> Result<u64, KeyStoreError> {
        self.publish(key, value, expected, None).await
    }

    /// Remove what is under `key` if its revision is still `expected`.
    pub async fn remove(&self, key: &str, expected: u64) -> Result<(), KeyStoreError> {
        let mut marker = HeaderMap::new();
        marker.insert(KV_OPERATION, "DEL");
        self.publish(key, Bytes::new(), expected, Some(marker))
            .await
            .map(drop)
    }

    /// Remove what is under `key` and leave no removal marker: the key's messages are
    /// purged from the bucket's stream, so the bucket keeps nothing of it (a marker
    /// would stay `max_age`) and a write that takes it again expects revision 0. Not a
    /// compare-and-set: only for a record nothing writes any more.
    pub async fn purge(&self, key: &str) -> Result<(), KeyStoreError> {
        self.bucket().await?;
        let bucket = &self.settings.bucket;
        let purging = async {
            let stream = self
                .js
                .get_stream_no_info(kv_bucket::stream_name(bucket))
                .await
                .map_err(|e| e.to_string())?;
            stream
                .purge()
                .filter(kv_bucket::subject(bucket, key))
                .await
                .map(drop)
                .map_err(|e| e.to_string())
        };
        match self.within_the_window(purging).await {
            Some(Ok(())) => Ok(()),
            Some(Err(e)) => Err(self.lost(format!("purging {key}: {e}")).await),
            None => Err(self
                .lost(format!("purging {key}: {}", self.no_answer()))
                .await),
        }
    }

    /// The keys in the bucket that start with `prefix` (removed ones too, until they
    /// are forgotten).
    pub async fn keys_with_prefix(&self, prefix: &str) -> Result<Vec<String>, KeyStoreError> {
        let kv = self.bucket().await?;
        let subjects = kv_bucket::subject(&self.settings.bucket, ">");
        let listed: Result<Vec<(String, usize)>, _> = async {
            let info = kv.stream.clone();
            info.info_with_subjects(subjects)
                .await
                .map_err(|e| e.to_string())?
                .try_collect()
                .await
                .map_err(|e| e.to_string())
        }
        .await;
        let listed = match listed {
            Ok(listed) => listed,
            Err(e) => return Err(self.lost(format!("listing its keys: {e}")).await),
        };
        let strip = kv_bucket::subject(&self.settings.bucket, "");
        Ok(listed
            .into_iter()
            .filter_map(|(subject, _)| Some(subject.strip_prefix(&strip)?.to_string()))
            .filter(|key| key.starts_with(prefix))
            .collect())
    }

    async fn publish(
        &self,
        key: &str,
        value: Bytes,
        expected: u64,
        headers: Option<HeaderMap>,
    ) -> Result<u64, KeyStoreError> {
        // Opened first: the stream must exist before the budget can read its size.
        self.bucket().await?;
        let mut headers = headers.unwrap_or_default();
        headers.insert(
            async_nats::header::NATS_EXPECTED_LAST_SUBJECT_SEQUENCE,
            expected.to_string().as_str(),
        );
        let subject = kv_bucket::subject(&self.settings.bucket, key);
        // Every attempt ends with the window (where the store has one): a leader gone
        // with its socket open would otherwise keep one for the client's whole request
        // timeout.
        let until = Instant::now() + self.settings.no_leader_wait;
        let attempt = || async {
            let write =
                self.puts
                    .publish(subject.clone(), value.clone(), Some(headers.clone()), None);
            if self.settings.no_leader_wait.is_zero() {
                return write.await;
            }
            let left = until
                .saturating_duration_since(Instant::now())
                .max(MIN_ATTEMPT);
            tokio::time::timeout(left, write)
                .await
                .unwrap_or_else(|_| Err(PublishError::Unavailable(self.no_answer())))
        };
        let mut answer = attempt().await;
        // No responders: the bucket's stream has no leader right now (a NATS cluster
        // electing one, its replicas being raised) and nothing was stored, so the same
        // write goes again, for a while (the compare-and-set refuses a second copy).
        let mut pause = Duration::from_millis(100);
        while matches!(answer, Err(PublishError::NoResponders(_))) && Instant::now() < until {
            tokio::time::sleep(pause.min(until.saturating_duration_since(Instant::now()))).await;
            pause = (pause * 2).min(Duration::from_secs(1));
            answer = attempt().await;
        }
        match answer {
            Ok(published) => Ok(published.sequence),
            Err(PublishError::WrongLastSequence) => Err(KeyStoreError::Conflict),
            Err(PublishError::QueueFull) => Err(KeyStoreError::Full {
                purpose: self.settings.purpose,
                bucket: self.settings.bucket.clone(),
                hint: self.settings.full_hint,
            }),
            Err(e) => Err(self.lost(format!("writing {key}: {e}")).await),
        }
    }

    /// The bucket, set up if this process has not opened it yet.
    async fn bucket(&self) -> Result<kv::Store, KeyStoreError> {
        let mut opened = self.opened.lock().await;
        if let Some(kv) = opened.as_ref() {
            return Ok(kv.clone());
        }
        let opening = bucket::ensure_bucket(&self.js, &self.settings);
        let kv = match self.within_the_window(opening).await {
            Some(opened) => opened.map_err(|e| self.unavailable(format!("{e:#}")))?,
            None => return Err(self.unavailable(format!("opening: {}", self.no_answer()))),
        };
        *opened = Some(kv.clone());
        Ok(kv)
    }

    /// `op`, or `None` once `no_leader_wait` passed (a store with none, zero, waits as
    /// long as the client does).
    async fn within_the_window<T>(&self, op: impl std::future::Future<Output = T>) -> Option<T> {
        let window = self.settings.no_leader_wait;
        if window.is_zero() {
            return Some(op.await);
        }
        tokio::time::timeout(window, op).await.ok()
    }

    fn no_answer(&self) -> String {
        format!(
            "no answer within {} ([api] publish_retry_for)",
            humantime::format_duration(self.settings.no_leader_wait)
        )
    }

    /// A failure that may mean the bucket is gone: set it up again next time.
    async fn lost(&self, why: String) -> KeyStoreError {
        *self.opened.lock().await = None;
        self.unavailable(why)
    }

    fn unavailable(&self, why: String) -> KeyStoreError {
        KeyStoreError::Unavailable {
            purpose: self.settings.purpose,
            bucket: self.settings.bucket.clone(),
            why,
        }
    }
}

/// A server timestamp in ns since the epoch as a `SystemTime` (the epoch for one before
/// it).
fn server_time(unix_nanos: i128) -> SystemTime {
    UNIX_EPOCH + Duration::from_nanos(u64::try_from(unix_nanos).unwrap_or(0))
}
