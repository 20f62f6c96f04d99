//! The operator's tools on the dead-letter stream: count, peek, replay, purge.
//!
//! Peeking reads with direct gets (no consumer, nothing consumed). Replaying re-checks
//! each row, publishes it back to the ingest stream under its replay id, and deletes it
//! from the DLQ only after the ingest stream acknowledged it, with a mark in the replay
//! bucket written before the publish: a replay never publishes a row twice (see
//! `replay`). A row parked alone out of a many-row message (`Sluice-Original-Line`) is
//! its own message on the DLQ, so it goes back alone, as a one-row message.

use std::collections::BTreeMap;
use std::sync::Arc;

use anyhow::Context as _;
use async_nats::jetstream::{self, stream::DirectGetErrorKind};
use futures::TryStreamExt as _;
use serde::{Deserialize, Serialize};

use sluice_actors::Failpoint;

use super::key_store::KeyStore;
use super::partitions::IngestStreams;
use crate::config::StreamSettings;

mod replay;

/// A parked row's bytes, decoded the one way every reader decodes (`super::encoding`):
/// only a message parked because it could not be decoded fails here again.
fn parked_payload(
    message: &jetstream::message::StreamMessage,
) -> Result<bytes::Bytes, super::encoding::Undecodable> {
    super::encoding::decode(Some(&message.headers), &message.payload)
}

/// One parked row as the admin endpoint shows it (and `sluice dlq` reads it).
#[derive(Debug, Serialize, Deserialize)]
pub struct ParkedRow {
    pub sequence: u64,
    pub subject: String,
    /// Every `Sluice-*` header: the reason, where the row came from (with
    /// `Sluice-Original-Line` for a row parked alone out of a many-row message).
    pub headers: BTreeMap<String, String>,
    /// The row as parked, byte for byte: its text (never parsed and printed again, which
    /// would sort its keys, round a number past 2^53 and undo its escapes). Bytes that
    /// are not UTF-8 show as U+FFFD here, and exactly in `row_base64`.
    pub row: String,
    /// The row's bytes in base64, only when they are not UTF-8.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub row_base64: Option<String>,
}

impl ParkedRow {
    /// `row` and `row_base64` of a message's payload.
    fn shown(payload: &[u8]) -> (String, Option<String>) {
        use base64::Engine as _;
        match std::str::from_utf8(payload) {
            Ok(text) => (text.to_string(), None),
            Err(_) => (
                String::from_utf8_lossy(payload).into_owned(),
                Some(base64::engine::general_purpose::STANDARD.encode(payload)),
            ),
        }
    }
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
    /// Not a JSON object: left on the DLQ.
    pub skipped: u64,
    /// Publishing or deleting failed: left on the DLQ (a replay again publishes none of
    /// them twice: see `replay`).
    pub failed: u64,
    pub errors: Vec<String>,
}

/// The DLQ of one deployment.
#[derive(Clone)]
pub struct Dlq {
    js: jetstream::Context,
    settings: StreamSettings,
    ingest: IngestStreams,
    /// A mark per row being replayed, or whose replay was cut off (see `replay`).
    replays: Arc<KeyStore>,
    /// The tests' crash on purpose (`SLUICE_TEST_FAILPOINT`); `None` in production.
    failpoint: Option<Failpoint>,
}

/// The first parked row on `subject` at or after sequence `from` (direct get: nothing
/// consumed); `None` past the last.
async fn next_parked(
    stream: &jetstream::stream::Stream,
    subject: &str,
    from: u64,
) -> anyhow::Result<Option<jetstream::message::StreamMessage>> {
    match stream
        .direct_get_next_for_subject(subject, Some(from))
        .await
    {
        Ok(message) => Ok(Some(message)),
        Err(e) if e.kind() == DirectGetErrorKind::NotFound => Ok(None),
        Err(e) => Err(anyhow::anyhow!("reading the DLQ: {e}")),
    }
}

// === impl Dlq ===

impl Dlq {
    pub fn new(js: jetstream::Context, settings: StreamSettings, ingest: IngestStreams) -> Self {
        let replays = KeyStore::new(
            js.clone(),
            replay::bucket_settings(&settings.dlq_stream, settings.replicas),
        );
        Self {
            js,
            settings,
            ingest,
            replays: Arc::new(replays),
            failpoint: None,
        }
    }

    /// Crash at `failpoint` when it is a replay's (the tests of what a crash leaves).
    pub fn crashing_at(mut self, failpoint: Option<Failpoint>) -> Self {
        self.failpoint = failpoint;
        self
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
            let Some(message) = next_parked(&stream, &subject, next).await? else {
                break;
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
            let (row, row_base64) = ParkedRow::shown(&payload);
            rows.push(ParkedRow {
                sequence: message.sequence,
                subject: message.subject.to_string(),
                headers,
                row,
                row_base64,
            });
        }
        Ok(rows)
    }

    /// Delete every parked row of a table; returns how many.
    pub async fn purge(&self, tenant: &str, table: &str) -> anyhow::Result<u64> {
        let stream = self.stream().await?;
        let response = stream
            .purge()
            .filter(self.subject(tenant, table))
            .await
            .context("purging the DLQ")?;
        // The marks of rows whose replays were cut off go with the rows.
        self.collect_marks(&stream).await;
        Ok(response.purged)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_is_shown_as_its_bytes() {
        let exact = br#"{"v":"\u00e9","id":18446744073709551616123}"#;
        assert_eq!(
            ParkedRow::shown(exact),
            (String::from_utf8(exact.to_vec()).unwrap(), None)
        );
        let (text, bytes) = ParkedRow::shown(b"{\"a\":\"\xff\"}");
        assert_eq!(text, "{\"a\":\"\u{fffd}\"}");
        assert_eq!(bytes.as_deref(), Some("eyJhIjoi/yJ9"));
    }
}
