//! Collection of orphaned manifests: the ones no batch will remove.
//!
//! A manifest is normally removed by the flight that settled its batch, once the acks
//! of every row are confirmed. It is left behind when the flight could not (its acks
//! unconfirmed, a crash, a reconnect that may have lost acks, a forget that failed),
//! and the ingest stream being deleted and created again leaves every manifest of the
//! old one. Every instance collects, every `collect_every`; removing a key twice is
//! harmless, so the instances need not agree on who does it.
//!
//! Removed: (a) a manifest of an older incarnation of the ingest stream; (b) a settled
//! one whose messages are all at or below the consumer's ack floor (every row acked:
//! none comes back); (c) any one whose messages are all below the stream's first
//! sequence (none is left to come back). (b) and (c) only once the record has been in
//! its state here for `keep_settled` (`ack_wait`: see `sluice_actors::keep_settled_for`). On a NATS cluster the floor and the first
//! sequence are the lowest every pass read over the last minute (see
//! [`super::trusted_floor`]). An open manifest with a message still in the
//! stream is never removed: that message may come back and must join exactly that
//! batch. Then the removal markers older than `marker_age` are dropped from the
//! bucket, so that a new watch does not read a day of them.

use std::time::Duration;

use sluice_actors::{Manifest, StoreError};
use tokio::time::Instant;

use super::bucket::{stream_name, subject};
use super::partitions::{last_of_each, queue_incarnation};
use super::trusted_floor::{Floor, TrustedFloor};
use super::Shared;
use crate::telemetry::metrics::MANIFESTS_COLLECTED;

/// Why a manifest was collected (the metric's `reason` label).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Reason {
    /// Of an older incarnation of the ingest stream.
    OldIncarnation,
    /// Settled, and every message of it acked.
    Acked,
    /// Settled, every message acked, and its flight's forget deferred by a reconnect.
    ForgottenAfterReconnect,
    /// Nothing of it is left in the stream.
    Gone,
    /// The bucket dropped it after its `max_age` (24 h): a batch held that long loses
    /// its record, and its rows are sent as a new batch (at least once).
    Expired,
}

impl Reason {
    fn as_str(self) -> &'static str {
        match self {
            Reason::OldIncarnation => "old_incarnation",
            Reason::Acked => "acked",
            Reason::ForgottenAfterReconnect => "forgotten_after_reconnect",
            Reason::Gone => "gone_from_stream",
            Reason::Expired => "expired",
        }
    }
}

/// What one collection pass removed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Collected {
    pub old_incarnation: u64,
    pub acked: u64,
    pub forgotten_after_reconnect: u64,
    pub gone_from_stream: u64,
    /// Records the bucket dropped after its `max_age` (taken out of the index: the
    /// tables hear they are gone).
    pub expired: u64,
    /// Removal markers dropped from the bucket.
    pub markers: u64,
    /// Removals that failed (left for the next pass).
    pub failed: u64,
}

impl Collected {
    fn count(&mut self, reason: Reason) {
        match reason {
            Reason::OldIncarnation => self.old_incarnation += 1,
            Reason::Acked => self.acked += 1,
            Reason::ForgottenAfterReconnect => self.forgotten_after_reconnect += 1,
            Reason::Gone => self.gone_from_stream += 1,
            Reason::Expired => self.expired += 1,
        }
    }

    pub fn removed(&self) -> u64 {
        self.old_incarnation
            + self.acked
            + self.forgotten_after_reconnect
            + self.gone_from_stream
            + self.expired
    }
}

/// Registers the metric's series at 0.
pub fn register_metrics() {
    for reason in [
        Reason::OldIncarnation,
        Reason::Acked,
        Reason::ForgottenAfterReconnect,
        Reason::Gone,
        Reason::Expired,
    ] {
        metrics::counter!(MANIFESTS_COLLECTED, "reason" => reason.as_str()).increment(0);
    }
}

/// Whether the record under `key`, taken by the index longer than the bucket's
/// `max_age` ago, is gone from the bucket without a removal: the bucket dropped it.
/// Then it leaves the index (the tables hear of it, and its messages no longer wait to
/// be gathered for it), counted and logged: a batch held that long is sent as a new
/// one, at least once.
async fn expired(
    shared: &Shared,
    key: &str,
    indexed: &super::index::Indexed,
    out: &mut Collected,
) -> bool {
    let Ok(kv) = shared.bucket() else {
        return false;
    };
    match super::super::kv_bucket::read_from_leader(&kv, key).await {
        Ok(None) => {}
        // There (written again since), removed by a marker the watch reports, or
        // unreadable now: not this pass's to judge.
        _ => return false,
    }
    let m = &indexed.manifest;
    shared.index.remove(key, None);
    shared.settled(&m.id);
    out.count(Reason::Expired);
    metrics::counter!(MANIFESTS_COLLECTED, "reason" => Reason::Expired.as_str()).increment(1);
    tracing::warn!(tenant = %m.table.tenant, table = %m.table.table, manifest = %m.id,
        state = if m.is_settled() { "settled" } else { "unsettled" },
        "a batch record expired (the manifest bucket keeps one 24 h at most): its messages still in the stream are sent as a new batch, at least once");
    true
}

/// One pass. Reads where the ingest stream and its consumer stand first: without
/// them nothing is removed.
pub async fn collect(shared: &Shared) -> Result<Collected, StoreError> {
    let s = &shared.settings;
    let read = shared.read_partitions().await?;
    let incarnation = queue_incarnation(&read.iter().map(|r| r.incarnation).collect::<Vec<_>>());
    shared.index.set_incarnation(incarnation);
    let now = Instant::now();
    let floors: Vec<Floor> = {
        let mut trusted = shared.floor_reads.lock().unwrap_or_else(|e| e.into_inner());
        trusted.resize_with(read.len(), TrustedFloor::default);
        trusted
            .iter_mut()
            .zip(&read)
            .map(|(t, r)| t.read(now, r.floor, s.replicas))
            .collect()
    };
    let mut out = Collected::default();
    let snapshot = shared.index.snapshot();
    shared.keep_only(
        snapshot
            .iter()
            .map(|(_, i)| i.manifest.id.as_str())
            .collect(),
    );
    let max_age = s.max_age;
    for (key, indexed) in snapshot {
        if indexed.taken_at.elapsed() >= max_age && expired(shared, &key, &indexed, &mut out).await
        {
            continue;
        }
        let m = &indexed.manifest;
        let reason = if indexed.incarnation < incarnation {
            Some(Reason::OldIncarnation)
        } else if indexed.incarnation > incarnation {
            // Written for a stream newer than the one just read: not ours to judge.
            None
        } else if indexed.taken_at.elapsed() < s.keep_settled {
            // Seen in this state too recently: a copy of its messages may still be
            // held under a lease older than its settling.
            None
        } else {
            done_with(m, &floors, shared.deferred(&m.id))
        };
        let Some(reason) = reason else { continue };
        match shared.purge_key(&key, None).await {
            Ok(()) => {
                shared.index.remove(&key, None);
                shared.settled(&m.id);
                out.count(reason);
                metrics::counter!(MANIFESTS_COLLECTED, "reason" => reason.as_str()).increment(1);
                tracing::debug!(key = %key, reason = reason.as_str(), "collected a manifest");
            }
            Err(e) => {
                out.failed += 1;
                tracing::debug!(key = %key, error = %e, "a manifest could not be collected now");
            }
        }
    }
    drop_markers(shared, &mut out).await;
    Ok(out)
}

/// Why a record of the current incarnation can go, if it can: settled and every one of
/// its messages at or below its partition's ack floor (acked), or every one below its
/// stream's first sequence (gone from the stream).
fn done_with(m: &Manifest, floors: &[Floor], deferred: bool) -> Option<Reason> {
    let lasts = last_of_each(&m.messages);
    let floor_of = |p: usize| floors.get(p).copied().unwrap_or_default();
    if m.is_settled() && lasts.iter().all(|&(p, last)| last <= floor_of(p).ack_floor) {
        Some(if deferred {
            Reason::ForgottenAfterReconnect
        } else {
            Reason::Acked
        })
    } else if lasts
        .iter()
        .all(|&(p, last)| last < floor_of(p).first_sequence)
    {
        Some(Reason::Gone)
    } else {
        None
    }
}

/// Drop the removal markers every watch has seen by now (up to and including the
/// marker: a value written after it stays).
async fn drop_markers(shared: &Shared, out: &mut Collected) {
    let old = shared.index.take_tombstones(shared.settings.marker_age);
    if old.is_empty() {
        return;
    }
    let bucket = &shared.settings.bucket;
    let stream = match shared.js.get_stream_no_info(stream_name(bucket)).await {
        Ok(stream) => stream,
        Err(e) => {
            tracing::debug!(error = %e, "could not drop old removal markers now");
            return;
        }
    };
    for (key, revision) in old {
        match stream
            .purge()
            .filter(subject(bucket, &key))
            .sequence(revision + 1)
            .await
        {
            Ok(_) => out.markers += 1,
            Err(e) => tracing::debug!(key = %key, error = %e, "a removal marker stays for now"),
        }
    }
}

/// The collection task: a pass every `every`, for as long as the store lives.
pub async fn keep_collecting(shared: std::sync::Arc<Shared>, every: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tick.tick().await;
        if shared.js.client().connection_state() != async_nats::connection::State::Connected {
            continue;
        }
        match collect(&shared).await {
            Ok(c) if c.removed() + c.markers + c.failed > 0 => tracing::debug!(
                removed = c.removed(),
                markers = c.markers,
                failed = c.failed,
                "manifest collection"
            ),
            Ok(_) => {}
            Err(e) => tracing::debug!(error = %e, "manifest collection skipped"),
        }
    }
}
