//! The operator's tools on the dead-letter stream: count, peek, replay, purge.
//!
//! Peeking reads with direct gets (no consumer, nothing consumed). Replaying re-checks
//! each row, publishes it back to the ingest stream under a message id derived from its
//! DLQ sequence, and deletes it from the DLQ only after the ingest stream acknowledged
//! it; a marker in the replay bucket (`<dlq stream>_REPLAYS`) between the two makes a
//! replay retried after a failed delete remove the row without publishing it again,
//! however late (see [`Dlq::replay_one`]). A row parked
//! alone out of a many-row message (`Sluice-Original-Line`) is its own message on the
//! DLQ, so it goes back alone, as a one-row message.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use async_nats::jetstream::{self, stream::DirectGetErrorKind};
use bytes::Bytes;
use futures::TryStreamExt as _;
use serde::{Deserialize, Serialize};

use super::encoding::Undecodable;
use super::key_store::{KeyStore, KeyStoreSettings, Slot};
use super::publish::{PublishError, Publisher};
use super::setup::StreamSettings;

/// One parked row as the admin endpoint shows it (and `sluice dlq` reads it).
#[derive(Debug, Serialize, Deserialize)]
pub struct ParkedRow {
    pub sequence: u64,
    pub subject: String,
    /// Every `Sluice-*` header: the reason, where the row came from (with
    /// `Sluice-Original-Line` for a row parked alone out of a many-row message).
    pub headers: BTreeMap<String, String>,
    /// The row itself: the JSON value when it parses, else the text.
    pub row: serde_json::Value,
}

/// Rows parked per tenant and table.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct DlqCounts {
    pub total: u64,
    pub tables: Vec<DlqTableCount>,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct DlqTableCount {
    pub tenant: String,
    pub table: String,
    pub rows: u64,
}

/// What a replay did.
#[derive(Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplayReport {
    pub dry_run: bool,
    /// Published back to the ingest stream (or, in a dry run, would be).
    pub replayed: u64,
    /// Not a JSON object (or parked undecodable): left on the DLQ.
    pub skipped: u64,
    /// Publishing or deleting failed: left on the DLQ (a replay again publishes none of
    /// them twice: see `Dlq::replay_one`).
    pub failed: u64,
    pub errors: Vec<String>,
}

/// The DLQ of one deployment.
#[derive(Clone)]
pub struct Dlq {
    js: jetstream::Context,
    settings: StreamSettings,
    ingest: Publisher,
    /// A marker per row being replayed (see [`Dlq::replay_one`]).
    replays: Arc<KeyStore>,
}

/// What became of one row a replay took.
enum ReplayedRow {
    /// Published to the ingest stream (now or by an earlier replay) and removed here.
    Done,
    /// The ingest stream is full: the row stays parked, the replay stops.
    StreamFull,
}

/// A replay marker's value.
#[derive(Debug, PartialEq, Eq)]
enum ReplayMark {
    /// About to publish (since then, in ms since the epoch).
    Publishing { at_ms: u64 },
    /// Published: only the removal from the DLQ is left.
    Published,
}

impl ReplayMark {
    fn bytes(&self) -> Bytes {
        match self {
            ReplayMark::Publishing { at_ms } => Bytes::from(format!("publishing {at_ms}")),
            ReplayMark::Published => Bytes::from_static(b"published"),
        }
    }

    /// A marker that cannot be read is taken for a publish of unknown age: the row
    /// stays parked rather than risk a second insert.
    fn read(value: &[u8]) -> Self {
        match std::str::from_utf8(value).ok().map(str::trim) {
            Some("published") => ReplayMark::Published,
            Some(text) => ReplayMark::Publishing {
                at_ms: text
                    .strip_prefix("publishing ")
                    .and_then(|n| n.parse().ok())
                    .unwrap_or(0),
            },
            None => ReplayMark::Publishing { at_ms: 0 },
        }
    }
}

/// How long a replay marker is kept: the longest a replay may be left half done and
/// still be told apart when retried.
pub const REPLAY_MARK_AGE: Duration = Duration::from_secs(7 * 24 * 3600);
/// The replay bucket's byte budget (a marker is a few dozen bytes, gone once its row is
/// removed from the DLQ).
const REPLAY_MARK_BYTES: u64 = 16 << 20;

/// A parked row's bytes, decoded the one way every reader decodes (`super::encoding`):
/// only a message parked because it could not be decoded fails here again.
fn parked_payload(message: &jetstream::message::StreamMessage) -> Result<Bytes, Undecodable> {
    super::encoding::decode(Some(&message.headers), &message.payload)
}

/// The replay bucket of a DLQ stream.
pub fn replay_bucket(dlq_stream: &str) -> String {
    format!("{dlq_stream}_REPLAYS")
}

/// The stream's creation time in ns: a DLQ made again numbers its rows from 1 again.
fn stream_created(stream: &jetstream::stream::Stream) -> i128 {
    stream.cached_info().created.unix_timestamp_nanos()
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

// === impl Dlq ===

impl Dlq {
    pub fn new(js: jetstream::Context, settings: StreamSettings, ingest: Publisher) -> Self {
        let replays = KeyStore::new(
            js.clone(),
            KeyStoreSettings {
                bucket: replay_bucket(&settings.dlq_stream),
                purpose: "DLQ replay",
                description: "Sluice DLQ replays in progress: a row published back to the ingest stream, not yet removed from the DLQ",
                max_bytes: REPLAY_MARK_BYTES,
                full_hint: "markers go once their rows leave the DLQ",
                replicas: settings.replicas,
                max_age: REPLAY_MARK_AGE,
                // A replay is an operator's request: it fails at once and is retried.
                no_leader_wait: Duration::ZERO,
            },
        );
        Self {
            js,
            settings,
            ingest,
            replays: Arc::new(replays),
        }
    }

    fn subject(&self, tenant: &str, table: &str) -> String {
        format!("{}.{tenant}.{table}", self.settings.dlq_subject_prefix)
    }

    async fn stream(&self) -> anyhow::Result<jetstream::stream::Stream> {
        self.js
            .get_stream(&self.settings.dlq_stream)
            .await
            .with_context(|| format!("reading stream {}", self.settings.dlq_stream))
    }

    /// Parked rows per tenant and table.
    pub async fn counts(&self) -> anyhow::Result<DlqCounts> {
        let stream = self.stream().await?;
        let filter = format!("{}.>", self.settings.dlq_subject_prefix);
        let subjects: Vec<(String, usize)> = stream
            .info_with_subjects(filter)
            .await
            .context("reading the DLQ's subjects")?
            .try_collect()
            .await
            .context("reading the DLQ's subjects")?;
        let prefix_tokens = self.settings.dlq_subject_prefix.split('.').count();
        let mut counts = DlqCounts::default();
        for (subject, rows) in subjects {
            let tokens: Vec<&str> = subject.split('.').skip(prefix_tokens).collect();
            let (tenant, table) = match tokens.as_slice() {
                [tenant, table] => (tenant.to_string(), table.to_string()),
                _ => (String::new(), subject.clone()),
            };
            counts.total += rows as u64;
            counts.tables.push(DlqTableCount {
                tenant,
                table,
                rows: rows as u64,
            });
        }
        counts
            .tables
            .sort_by(|a, b| (&a.tenant, &a.table).cmp(&(&b.tenant, &b.table)));
        Ok(counts)
    }

    /// Up to `limit` parked rows of a table, oldest first, without consuming them.
    pub async fn peek(
        &self,
        tenant: &str,
        table: &str,
        limit: usize,
    ) -> anyhow::Result<Vec<ParkedRow>> {
        self.peek_after(tenant, table, 0, limit).await
    }

    /// Up to `limit` parked rows of a table whose DLQ sequence is above `after`, oldest
    /// first, without consuming them: the next page starts after the last row's
    /// `sequence`.
    pub async fn peek_after(
        &self,
        tenant: &str,
        table: &str,
        after: u64,
        limit: usize,
    ) -> anyhow::Result<Vec<ParkedRow>> {
        let stream = self.stream().await?;
        let subject = self.subject(tenant, table);
        let mut rows = Vec::new();
        let mut next = after.saturating_add(1);
        while rows.len() < limit {
            let message = match stream
                .direct_get_next_for_subject(&subject, Some(next))
                .await
            {
                Ok(m) => m,
                Err(e) if e.kind() == DirectGetErrorKind::NotFound => break,
                Err(e) => return Err(anyhow::anyhow!("reading the DLQ: {e}")),
            };
            next = message.sequence + 1;
            let headers = message
                .headers
                .iter()
                .filter(|(name, _)| AsRef::<str>::as_ref(*name).starts_with("Sluice-"))
                .map(|(name, values)| {
                    let value = values
                        .iter()
                        .map(|v| v.as_str())
                        .collect::<Vec<_>>()
                        .join(", ");
                    (AsRef::<str>::as_ref(name).to_string(), value)
                })
                .collect();
            // Parked undecodable, it is shown as it came (its headers say why).
            let payload = parked_payload(&message).unwrap_or_else(|_| message.payload.clone());
            let row = serde_json::from_slice(&payload).unwrap_or_else(|_| {
                serde_json::Value::String(String::from_utf8_lossy(&payload).into_owned())
            });
            rows.push(ParkedRow {
                sequence: message.sequence,
                subject: message.subject.to_string(),
                headers,
                row,
            });
        }
        Ok(rows)
    }

    /// Publish up to `limit` parked rows of a table back to the ingest stream.
    pub async fn replay(
        &self,
        tenant: &str,
        table: &str,
        limit: usize,
        dry_run: bool,
    ) -> anyhow::Result<ReplayReport> {
        let stream = self.stream().await?;
        let subject = self.subject(tenant, table);
        let target = format!("{}.{tenant}.{table}", self.settings.subject_prefix);
        let mut report = ReplayReport {
            dry_run,
            ..Default::default()
        };
        let mut next = 1u64;
        // Skipped rows do not count against the limit: they stay parked, and a replay
        // must not be stuck behind them.
        while ((report.replayed + report.failed) as usize) < limit {
            let message = match stream
                .direct_get_next_for_subject(&subject, Some(next))
                .await
            {
                Ok(m) => m,
                Err(e) if e.kind() == DirectGetErrorKind::NotFound => break,
                Err(e) => return Err(anyhow::anyhow!("reading the DLQ: {e}")),
            };
            next = message.sequence + 1;
            let is_object = parked_payload(&message).is_ok_and(|payload| {
                matches!(
                    serde_json::from_slice::<serde_json::Value>(&payload),
                    Ok(serde_json::Value::Object(_))
                )
            });
            if !is_object {
                report.skipped += 1;
                continue;
            }
            if dry_run {
                report.replayed += 1;
                continue;
            }
            match self.replay_one(&stream, &target, &message).await {
                Ok(ReplayedRow::Done) => report.replayed += 1,
                Ok(ReplayedRow::StreamFull) => {
                    report.failed += 1;
                    report.errors.push(
                        "the ingest stream is full: replay stopped, the rest stays parked".into(),
                    );
                    break;
                }
                Err(e) => {
                    report.failed += 1;
                    report.errors.push(format!("row {}: {e}", message.sequence));
                }
            }
        }
        Ok(report)
    }

    /// Replay one parked row: publish it to the ingest stream, then delete it from the
    /// DLQ, with a marker in the replay bucket between the two, so that a replay retried
    /// after the publish went through (the delete failed, the process died) deletes the
    /// row without publishing it again, however late. The marker says "publishing"
    /// (with when) before the publish and "published" after it; a retry that finds
    /// "publishing" publishes again under the same message id only within the ingest
    /// stream's duplicate window (JetStream drops the copy); later, whether the first
    /// publish landed is unknown, and the row stays parked with the reason (it is never
    /// inserted twice by a replay).
    async fn replay_one(
        &self,
        stream: &jetstream::stream::Stream,
        target: &str,
        message: &jetstream::message::StreamMessage,
    ) -> anyhow::Result<ReplayedRow> {
        let key = format!("{}.{}", stream_created(stream), message.sequence);
        let id = format!("replay-{}-{}", self.settings.dlq_stream, message.sequence);
        let marks = &self.replays;
        let (state, revision) = match marks.get(&key).await? {
            Slot::Vacant { revision } => (None, revision),
            Slot::Held(held) => (Some(ReplayMark::read(&held.value)), held.revision),
        };
        let revision = match state {
            Some(ReplayMark::Published) => revision,
            Some(ReplayMark::Publishing { at_ms }) => {
                let age = Duration::from_millis(unix_ms().saturating_sub(at_ms));
                if age >= self.settings.duplicate_window {
                    anyhow::bail!(
                        "a replay of it was interrupted {} ago, between its publish and its record: whether it reached the ingest stream is unknown (check ClickHouse), so it stays parked; purge it, or publish it again by hand",
                        humantime::format_duration(Duration::from_secs(age.as_secs()))
                    );
                }
                self.publish_marked(target, message, &id, &key, revision)
                    .await?
            }
            None => {
                let mark = ReplayMark::Publishing { at_ms: unix_ms() }.bytes();
                let revision = marks.write(&key, mark, revision).await?;
                match self
                    .publish_marked(target, message, &id, &key, revision)
                    .await
                {
                    Err(e)
                        if e.downcast_ref::<PublishError>()
                            .is_some_and(|e| matches!(e, PublishError::QueueFull)) =>
                    {
                        let _ = marks.remove(&key, revision).await;
                        return Ok(ReplayedRow::StreamFull);
                    }
                    other => other?,
                }
            }
        };
        stream
            .delete_message(message.sequence)
            .await
            .map_err(|e| anyhow::anyhow!("replayed but not removed from the DLQ ({e}): a replay again removes it without publishing it twice"))?;
        // Gone from the DLQ: the marker has nothing left to guard (it expires anyway).
        let _ = marks.remove(&key, revision).await;
        Ok(ReplayedRow::Done)
    }

    /// Publish a row whose marker (at `revision`) says "publishing", then mark it
    /// published; the marker's new revision.
    async fn publish_marked(
        &self,
        target: &str,
        message: &jetstream::message::StreamMessage,
        id: &str,
        key: &str,
        revision: u64,
    ) -> anyhow::Result<u64> {
        self.ingest
            .publish(target.to_string(), parked_payload(message)?, None, Some(id))
            .await?;
        Ok(self
            .replays
            .write(key, ReplayMark::Published.bytes(), revision)
            .await?)
    }

    /// Delete every parked row of a table; returns how many.
    pub async fn purge(&self, tenant: &str, table: &str) -> anyhow::Result<u64> {
        let stream = self.stream().await?;
        let response = stream
            .purge()
            .filter(self.subject(tenant, table))
            .await
            .context("purging the DLQ")?;
        Ok(response.purged)
    }
}
