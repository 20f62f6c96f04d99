//! Replaying parked rows: each row is published back to the ingest stream under its
//! replay id, and removed from the DLQ only after the ingest stream took it.
//!
//! A mark in the replay bucket (`<dlq stream>_REPLAYS`, key `replayed.<replay id>`) is
//! written before the publish, create-only, and says "published" once the ingest stream
//! acknowledged it. A replay never publishes a row whose mark exists:
//! - "published": the row is removed from the DLQ without being published again
//!   (a replay retried after its removal failed, or after a crash), however late;
//! - "publishing": a replay is sending it now, or was cut off between its publish and
//!   the answer (a crash, an answer that never came). Whether the ingest stream took it
//!   is not known, and JetStream's duplicate check cannot tell either: a restarted
//!   nats-server rebuilds it from the messages it still holds, and a replayed row
//!   consumed since is gone from there. So the row stays parked with the reason, for
//!   the operator (check ClickHouse, then purge it or publish it by hand).
//!
//! No decision rests on an age: the marks have no `max_age` (a mark that expired would
//! let its row be published again), and the one time a report shows is the bucket's
//! own (when the server stored the mark), never this host's clock against another's.
//! A mark leaves the bucket once its row left the DLQ (purged from the bucket's
//! stream, so no removal marker stays behind either): at the end of the row's replay,
//! or collected when its row is gone otherwise (a purge, a deletion by hand, the DLQ
//! made again).

use std::time::{Duration, SystemTime};

use async_nats::jetstream;
use bytes::Bytes;
use sluice_actors::Failpoint;

use super::{next_parked, Dlq, ReplayReport};
use crate::nats::key_store::{KeyStoreError, KeyStoreSettings, Slot};
use crate::nats::publish::PublishError;

/// The replay bucket's byte budget: a mark is a few dozen bytes, kept only while its
/// row is being replayed, or parked after a replay was cut off.
const REPLAY_MARK_BYTES: u64 = 16 << 20;

/// The replay bucket of a DLQ stream.
fn replay_bucket(dlq_stream: &str) -> String {
    format!("{dlq_stream}_REPLAYS")
}

/// The replay bucket's shape.
pub(super) fn bucket_settings(dlq_stream: &str, replicas: usize) -> KeyStoreSettings {
    KeyStoreSettings {
        bucket: replay_bucket(dlq_stream),
        purpose: "DLQ replay",
        description:
            "Sluice DLQ replays: a mark per parked row being replayed, or whose replay was cut off",
        max_bytes: REPLAY_MARK_BYTES,
        full_hint: "marks go once their rows leave the DLQ",
        replicas,
        // For good: a mark that expired would let its row be published again.
        max_age: Duration::ZERO,
        // A replay is an operator's request: it fails at once and is retried.
        no_leader_wait: Duration::ZERO,
    }
}

/// The id a parked row is replayed under (its message id in the ingest stream, and its
/// mark's name): the DLQ stream's name and incarnation (its creation time in ns) and
/// the row's sequence there. A DLQ made again numbers its rows from 1 again, and a
/// second deployment's DLQ has another name: neither meets another's marks.
fn replay_id(dlq_stream: &str, incarnation: i128, sequence: u64) -> String {
    format!("replay-{dlq_stream}-{incarnation}-{sequence}")
}

/// The (incarnation, sequence) a replay id of `dlq_stream` names.
fn parse_replay_id(dlq_stream: &str, id: &str) -> Option<(i128, u64)> {
    let rest = id.strip_prefix("replay-")?.strip_prefix(dlq_stream)?;
    let (incarnation, sequence) = rest.strip_prefix('-')?.split_once('-')?;
    Some((incarnation.parse().ok()?, sequence.parse().ok()?))
}

/// A mark's key in the replay bucket.
fn mark_key(id: &str) -> String {
    format!("replayed.{id}")
}

/// The DLQ stream's incarnation: its creation time in ns.
fn incarnation(stream: &jetstream::stream::Stream) -> i128 {
    stream.cached_info().created.unix_timestamp_nanos()
}

/// A mark's value.
#[derive(Debug, PartialEq, Eq)]
enum ReplayMark {
    /// Written before the publish: whether the ingest stream took the row is not known.
    Publishing,
    /// The ingest stream took it: only the removal from the DLQ is left.
    Published,
}

impl ReplayMark {
    fn bytes(&self) -> Bytes {
        match self {
            ReplayMark::Publishing => Bytes::from_static(b"publishing"),
            ReplayMark::Published => Bytes::from_static(b"published"),
        }
    }

    /// Anything but "published" (an earlier Sluice's `publishing <ms>`, a value that
    /// cannot be read) is taken for a publish of unknown outcome: the row stays parked
    /// rather than risk a second insert.
    fn read(value: &[u8]) -> Self {
        match std::str::from_utf8(value).map(str::trim) {
            Ok("published") => ReplayMark::Published,
            _ => ReplayMark::Publishing,
        }
    }
}

/// What became of one row a replay took.
enum ReplayedRow {
    /// Published to the ingest stream (now or by an earlier replay) and removed here.
    Done,
    /// The ingest stream is full: the row stays parked, the replay stops.
    StreamFull,
}

/// Why a row whose mark says "publishing" stays parked; `at` is when the bucket stored
/// the mark, by its clock.
fn cut_off(at: SystemTime) -> anyhow::Error {
    anyhow::anyhow!(
        "a replay marked it at {} (the replay bucket's clock) and has not finished: one is sending it now, or one was cut off between its publish and the answer, and whether it reached the ingest stream is unknown (check ClickHouse). A replay never publishes it again: purge it, or publish it by hand",
        humantime::format_rfc3339_seconds(at)
    )
}

// === impl Dlq ===

impl Dlq {
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
        // Published on the current layout: its partition picked by the replay id.
        let target = (tenant, table);
        let mut report = ReplayReport {
            dry_run,
            ..Default::default()
        };
        if !dry_run {
            self.collect_marks(&stream).await;
        }
        let mut next = 1u64;
        // Skipped rows do not count against the limit: they stay parked, and a replay
        // must not be stuck behind them.
        while ((report.replayed + report.failed) as usize) < limit {
            let Some(message) = next_parked(&stream, &subject, next).await? else {
                break;
            };
            next = message.sequence + 1;
            // Only a row that decodes (`super::parked_payload`) to a JSON object is
            // replayed: one parked undecodable, or not an object, stays parked.
            let Some(payload) = super::parked_payload(&message).ok().filter(|payload| {
                matches!(
                    serde_json::from_slice::<serde_json::Value>(payload),
                    Ok(serde_json::Value::Object(_))
                )
            }) else {
                report.skipped += 1;
                continue;
            };
            if dry_run {
                report.replayed += 1;
                continue;
            }
            match self.replay_one(&stream, target, &message, payload).await {
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
                    report
                        .errors
                        .push(format!("row {}: {e:#}", message.sequence));
                }
            }
        }
        Ok(report)
    }

    /// Replay one parked row: mark it, publish it, mark it published, remove it from
    /// the DLQ, forget the mark (see the module's header for what a mark found says).
    async fn replay_one(
        &self,
        stream: &jetstream::stream::Stream,
        target: (&str, &str),
        message: &jetstream::message::StreamMessage,
        payload: Bytes,
    ) -> anyhow::Result<ReplayedRow> {
        let id = replay_id(
            &self.settings.dlq_stream,
            incarnation(stream),
            message.sequence,
        );
        let key = mark_key(&id);
        let marks = &self.replays;
        match marks.get(&key).await? {
            Slot::Held(held) => match ReplayMark::read(&held.value) {
                ReplayMark::Published => {}
                ReplayMark::Publishing => return Err(cut_off(held.written)),
            },
            Slot::Vacant { revision } => {
                let marked = match marks
                    .write(&key, ReplayMark::Publishing.bytes(), revision)
                    .await
                {
                    Ok(marked) => marked,
                    Err(KeyStoreError::Conflict) => anyhow::bail!(
                        "another replay marked it a moment ago: it is that replay's to publish"
                    ),
                    Err(e) => return Err(e.into()),
                };
                if let Err(e) = self
                    .publish_marked(target, payload, &id, &key, marked)
                    .await
                {
                    return match e {
                        Unpublished::StreamFull => Ok(ReplayedRow::StreamFull),
                        Unpublished::Failed(e) => Err(e),
                    };
                }
            }
        }
        stream
            .delete_message(message.sequence)
            .await
            .map_err(|e| anyhow::anyhow!("replayed but not removed from the DLQ ({e}): a replay again removes it without publishing it twice"))?;
        // Gone from the DLQ: the mark has nothing left to guard.
        if let Err(e) = marks.purge(&key).await {
            tracing::debug!(key, error = %e, "a replay mark stays until the next replay collects it");
        }
        Ok(ReplayedRow::Done)
    }

    /// Publish a row whose mark (at `revision`) says "publishing", then mark it
    /// published. A publish nothing took forgets the mark (the row may be replayed
    /// again); one whose outcome is unknown keeps it (the row stays parked for good).
    async fn publish_marked(
        &self,
        (tenant, table): (&str, &str),
        payload: Bytes,
        id: &str,
        key: &str,
        revision: u64,
    ) -> Result<(), Unpublished> {
        let (ingest, subject) = self.ingest.route(tenant, table, Some(id));
        match ingest.publish(subject, payload, None, Some(id)).await
        {
            Ok(_) => {}
            Err(e) if e.stored_nothing() => {
                if let Err(forget) = self.replays.purge(key).await {
                    tracing::warn!(key, error = %forget, "a replay nothing took keeps its mark: its row stays parked until the mark is removed by hand");
                }
                return Err(match e {
                    PublishError::QueueFull => Unpublished::StreamFull,
                    e => Unpublished::Failed(e.into()),
                });
            }
            Err(e) => {
                return Err(Unpublished::Failed(anyhow::anyhow!(
                    "{e}: whether the ingest stream took it is unknown (check ClickHouse); a replay never publishes it again: purge it, or publish it by hand"
                )))
            }
        }
        if self.failpoint == Some(Failpoint::CrashAfterReplayPublish) {
            tracing::error!(
                id,
                "failpoint: crashing on purpose after a replay's publish"
            );
            std::process::abort();
        }
        self.replays
            .write(key, ReplayMark::Published.bytes(), revision)
            .await
            .map_err(|e| {
                Unpublished::Failed(anyhow::anyhow!(
                    "published, but its mark could not say so ({e}): it stays parked and a replay never publishes it again; check ClickHouse, then purge it"
                ))
            })?;
        Ok(())
    }

    /// Forget the marks of this DLQ whose rows are gone (purged, deleted by hand, of a
    /// DLQ made again since): nothing will replay them. Best effort: a mark left
    /// behind guards nothing and is collected next time.
    pub(super) async fn collect_marks(&self, stream: &jetstream::stream::Stream) {
        let prefix = mark_key(&format!("replay-{}-", self.settings.dlq_stream));
        let keys = match self.replays.keys_with_prefix(&prefix).await {
            Ok(keys) => keys,
            Err(e) => {
                tracing::debug!(error = %e, "replay marks not collected this time");
                return;
            }
        };
        let current = incarnation(stream);
        for key in keys {
            let Some(id) = key.strip_prefix("replayed.") else {
                continue;
            };
            let gone = match parse_replay_id(&self.settings.dlq_stream, id) {
                Some((of, _)) if of != current => true,
                Some((_, sequence)) => match stream.get_raw_message(sequence).await {
                    Ok(_) => false,
                    Err(e) => e.kind() == jetstream::stream::RawMessageErrorKind::NoMessageFound,
                },
                // Another stream's whose name begins like this one's.
                None => false,
            };
            if gone {
                if let Err(e) = self.replays.purge(&key).await {
                    tracing::debug!(key, error = %e, "a replay mark stays until the next collection");
                }
            }
        }
    }
}

/// Why a marked row was not published.
enum Unpublished {
    /// The ingest stream is full: nothing stored, the mark forgotten.
    StreamFull,
    Failed(anyhow::Error),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_replay_id_names_its_dlq_and_incarnation() {
        let id = replay_id("DLQ", 1_700_000_000_123_456_789, 42);
        assert_eq!(id, "replay-DLQ-1700000000123456789-42");
        assert_eq!(
            parse_replay_id("DLQ", &id),
            Some((1_700_000_000_123_456_789, 42))
        );
        assert_eq!(parse_replay_id("DLQ-B", &id), None);
        assert_eq!(
            parse_replay_id("DLQ", &replay_id("DLQ-B", 1, 2)),
            None,
            "another DLQ whose name starts with this one's"
        );
        assert_eq!(mark_key(&id), "replayed.replay-DLQ-1700000000123456789-42");
    }

    #[test]
    fn only_published_lets_a_row_go_without_a_publish() {
        assert_eq!(ReplayMark::read(b"published"), ReplayMark::Published);
        for other in [
            &b"publishing"[..],
            b"publishing 1700000000000",
            b"",
            b"\xff",
        ] {
            assert_eq!(ReplayMark::read(other), ReplayMark::Publishing, "{other:?}");
        }
    }
}
