//! What a flight records of a recorded batch after forming it: its split before any
//! part of it is sent on its own, its verdicts before any row is settled, which rows
//! are parked before any message is acked, and its removal once every ack is confirmed.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::manifest::{Manifest, ManifestState, RejectedRow};
use super::split::{RowRange, Split};
use super::store::{ManifestStore, StoreError};
use crate::batch::{Batch, RowVerdict};
use crate::ports::{Delivery, TableKey};

/// The record of a batch in flight, kept current as its isolation splits it: a range
/// is sent only once a split listing it is recorded (see [`super::split`]).
pub struct SplitRecorder<'a> {
    store: &'a Arc<dyn ManifestStore>,
    record: Manifest,
}

impl<'a> SplitRecorder<'a> {
    pub fn new(store: &'a Arc<dyn ManifestStore>, record: Manifest) -> Self {
        Self { store, record }
    }

    pub fn record(&self) -> &Manifest {
        &self.record
    }

    pub fn into_record(self) -> Manifest {
        self.record
    }

    /// Whether rows `lo..hi` may be sent as they are without recording first: the whole
    /// batch while it is open, an untried range of its recorded split.
    pub fn may_send(&self, lo: usize, hi: usize, rows: usize) -> bool {
        match &self.record.state {
            ManifestState::Open => lo == 0 && hi == rows,
            ManifestState::Split(split) => split.may_send(lo, hi),
            ManifestState::Settled { .. } => false,
        }
    }

    /// Record the isolation as it stands: the judged rows, and the ranges not judged
    /// (each to be sent as it is from now on).
    pub async fn record_split(
        &mut self,
        verdicts: &[RowVerdict],
        untried: Vec<RowRange>,
    ) -> Result<(), StoreError> {
        let next = self
            .record
            .with_state(ManifestState::Split(Split::of_progress(verdicts, untried)));
        self.store.update(&next).await?;
        self.record = next;
        Ok(())
    }
}

/// The batch's verdicts, recorded before any of its rows is settled. With a row still
/// pending nothing is settled (the batch must stay formable whole from the stream): when
/// it was split, its progress is recorded (`untried`: the ranges the isolation had not
/// judged when it stopped, as it held them), and every message goes back.
pub async fn record_verdicts<D>(
    store: &Arc<dyn ManifestStore>,
    record: Manifest,
    batch: &Batch<D>,
    verdicts: &mut [RowVerdict],
    untried: Vec<RowRange>,
) -> Result<Manifest, StoreError>
where
    D: Delivery,
{
    if verdicts.contains(&RowVerdict::Pending) {
        let result = match &record.state {
            ManifestState::Split(_) => {
                let split = Split::of_progress(verdicts, untried);
                if !split.covers(verdicts.len()) {
                    // The isolation stopped without saying which ranges it had not
                    // judged (the shutdown deadline cancelled it mid-range): the split
                    // recorded before stays true, this one would leave rows in no range
                    // and the batch could never be formed again.
                    Ok(record)
                } else {
                    let next = record.with_state(ManifestState::Split(split));
                    // A failure here costs nothing: the split recorded before stays true
                    // (a range judged since is sent again as it is and deduplicated).
                    store.update(&next).await.map(|_| next)
                }
            }
            _ => Ok(record),
        };
        verdicts.fill(RowVerdict::Pending);
        return result;
    }
    let rejected = batch
        .row_ids()
        .zip(verdicts.iter())
        .filter_map(|((stream_sequence, line), v)| match v {
            RowVerdict::Rejected(e) => Some(RejectedRow {
                stream_sequence,
                line,
                class: e.class,
                code: e.code,
                error: e.message.clone(),
                parked: false,
            }),
            _ => None,
        })
        .collect();
    let settled = record.with_state(ManifestState::Settled { rejected });
    match store.update(&settled).await {
        Ok(()) => Ok(settled),
        Err(e) => {
            verdicts.fill(RowVerdict::Pending);
            Err(e)
        }
    }
}

/// Record which rejected rows are now on the DLQ, before their messages are acked: a
/// message delivered again later (its ack lost) is then acked without parking its rows
/// a second time, however long after (the DLQ's own duplicate window is two minutes).
pub async fn record_parked(
    store: &Arc<dyn ManifestStore>,
    settled: &Manifest,
    parked: &[(u64, u32)],
) -> Result<Manifest, StoreError> {
    let ManifestState::Settled { rejected } = &settled.state else {
        return Ok(settled.clone());
    };
    let mut changed = false;
    let rejected = rejected
        .iter()
        .map(|r| {
            let now = !r.parked && parked.contains(&(r.stream_sequence, r.line));
            changed |= now;
            RejectedRow {
                parked: r.parked || now,
                ..r.clone()
            }
        })
        .collect();
    if !changed {
        return Ok(settled.clone());
    }
    let next = settled.with_state(ManifestState::Settled { rejected });
    store.update(&next).await?;
    Ok(next)
}

/// JetStream confirms an ack before it has written it down: a nats-server killed
/// within that moment comes back without the ack and delivers the rows again, and
/// their manifest must still be there to settle them by (not insert them anew). So a
/// manifest whose rows are all settled and confirmed goes a little later (at once when
/// the pipeline shuts down); one left by a failure is collected by the store.
pub const FORGET_AFTER: Duration = Duration::from_secs(2);

/// Remove a settled batch's record a moment after its acks were confirmed.
pub fn forget_soon(
    store: &Arc<dyn ManifestStore>,
    tracker: &TaskTracker,
    shutdown: &CancellationToken,
    key: &TableKey,
    id: &str,
) {
    let (store, shutdown) = (store.clone(), shutdown.clone());
    let (id, key) = (id.to_string(), key.clone());
    tracker.spawn(async move {
        // A graceful shutdown does not wait for it: the moment has mostly passed, and
        // an instance that stops leaves no collector behind for its own manifests.
        tokio::select! {
            _ = tokio::time::sleep(FORGET_AFTER) => {}
            _ = shutdown.cancelled() => {}
        }
        if let Err(e) = store.forget(&id).await {
            tracing::debug!(tenant = %key.tenant, table = %key.table, manifest = %id, error = %e,
                "a settled manifest could not be removed now; the store collects it later");
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::{FakeManifestStore, Journal};

    /// The shutdown deadline cancels an isolation mid-range: the flight knows its judged
    /// rows but not the ranges the isolation held. Recording that would leave rows in
    /// no range (the batch could never be formed again); the split recorded before is
    /// kept.
    #[tokio::test]
    async fn a_cancelled_isolation_leaves_the_recorded_split_as_it_was() {
        let journal = Journal::new();
        let fake = FakeManifestStore::new(&journal);
        let store: Arc<dyn ManifestStore> = fake.clone();
        let batch = Batch::new(journal.rows("acme.events", 4), tokio::time::Instant::now());
        let seqs: Vec<u64> = batch.deliveries().map(|d| d.seq).collect();
        let split = Split {
            untried: vec![RowRange::new(2, 4)],
            inserted: vec![RowRange::new(0, 2)],
            rejected: Vec::new(),
        };
        let record = Manifest::new(TableKey::new("acme", "events"), 1, seqs)
            .with_state(ManifestState::Split(split.clone()));
        store
            .update(&record)
            .await
            .expect("the fake store takes it");
        let mut verdicts = vec![
            RowVerdict::Inserted,
            RowVerdict::Inserted,
            RowVerdict::Pending,
            RowVerdict::Pending,
        ];
        let kept = record_verdicts(&store, record.clone(), &batch, &mut verdicts, Vec::new())
            .await
            .expect("nothing to write");
        assert_eq!(kept.state, ManifestState::Split(split.clone()));
        let stored = fake.get(&record.id).expect("still recorded");
        assert_eq!(stored.state, ManifestState::Split(split));
        assert!(verdicts.iter().all(|v| *v == RowVerdict::Pending));
    }
}
