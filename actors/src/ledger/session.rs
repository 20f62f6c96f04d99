//! A flight's hold on its batch's record: the only handle on the store a flight has
//! once its batch is formed, offering the contract's later steps in their order (mark
//! a new attempt, record the split, record the verdicts, record the parked rows,
//! release), each a compare-and-set on the record as this flight last saw it.
//!
//! Why compare-and-set: two instances can form one batch again at once (each holds
//! some of its messages, and reads the others from the stream). Written blindly, the
//! slower one's split would land over the faster one's verdicts, and the batch's
//! inserted rows would go in again under new blocks. So every write names the revision
//! its writer read; one that finds the record moved on writes nothing, and the flight's
//! rows go back to be formed from the record as it is then.
//!
//! Why a flight marks its attempt: ClickHouse answers an insert that may already be in
//! (its answer lost, or sent by another flight) with 252 or 241 before it looks at the
//! block's id. Split then, its pieces would go in as new blocks beside the block it
//! has. An availability answer may split only what no one can have sent before: the
//! whole batch on the first attempt of the flight that claimed it (its messages on
//! their first delivery: a copy delivered again may outlive a batch of it that went
//! in, was acked and forgotten), or a range this
//! flight's own split made. Any other flight writes before it sends (the mark), so a
//! split recorded by compare-and-set over this flight's own last write proves nobody
//! sent anything of the batch since.
//!
//! A table whose inserts ClickHouse does not deduplicate records nothing: its flights
//! hold the no-op twin ([`LedgerSession::unrecorded`]), so a flight has one path.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::manifest::{Manifest, ManifestState, RejectedRow};
use super::split::{RowRange, Split};
use super::store::{ManifestStore, Recorded, StoreError, UpdateError};
use super::LedgerRefusal;
use crate::batch::{Batch, RowVerdict};
use crate::ports::{Delivery, TableKey};

/// JetStream confirms an ack before it has written it down: a nats-server killed
/// within that moment comes back without the ack and delivers the rows again, and
/// their manifest must still be there to settle them by (not insert them anew). So a
/// manifest whose rows are all settled and confirmed goes this much later at the
/// least, and not before [`super::keep_settled_for`] (a copy of its messages may still
/// be held elsewhere); one left by a failure, or by a pipeline that shut down first,
/// is collected by the store.
pub const FORGET_AFTER: Duration = Duration::from_secs(2);

/// How often recording the parked rows reads the record again when another flight
/// recorded some of its own meanwhile (flags only ever turn on: merging converges).
const PARKED_TRIES: usize = 3;

/// Who may have sent the batch before this flight.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sent {
    /// Nobody: this flight claimed it, on its messages' first delivery.
    Never,
    /// Maybe (formed again from its record: an earlier attempt may be in ClickHouse).
    Maybe,
}

/// A recorded batch as one flight holds it.
struct Held {
    store: Arc<dyn ManifestStore>,
    record: Manifest,
    /// The store's revision of `record`: the next write names it.
    revision: u64,
    sent: Sent,
}

/// See the module's doc.
pub struct LedgerSession {
    /// Boxed: a flight's session travels in the values forming returns, nearly always
    /// beside a batch that is not recorded.
    held: Option<Box<Held>>,
}

/// What recording the verdicts made of the batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Judged {
    /// Every row judged (and recorded, for a recorded batch): the rows may be settled.
    Whole,
    /// A row is still pending: nothing is settled, every message goes back (the
    /// progress of a split is recorded).
    Partly,
}

impl LedgerSession {
    /// A batch of a table whose batches are not recorded (at-least-once).
    pub fn unrecorded() -> Self {
        Self { held: None }
    }

    /// A batch recorded in `store` as `recorded`.
    pub fn recorded(store: Arc<dyn ManifestStore>, recorded: Recorded, sent: Sent) -> Self {
        Self {
            held: Some(Box::new(Held {
                store,
                revision: recorded.revision,
                record: recorded.manifest,
                sent,
            })),
        }
    }

    /// The record, for a recorded batch.
    pub fn record(&self) -> Option<&Manifest> {
        self.held.as_ref().map(|h| &h.record)
    }

    /// The token of the insert of rows `lo..hi` of a batch of `rows` rows (`None`:
    /// unrecorded, the server's own block hash decides).
    pub fn token_of(&self, lo: usize, hi: usize, rows: usize) -> Option<String> {
        self.held.as_ref().map(|h| h.record.token_of(lo, hi, rows))
    }

    /// Whether rows `lo..hi` may be sent as they are without recording first: the whole
    /// batch while it is open, an untried range of its recorded split; anything for a
    /// batch that is not recorded.
    pub fn may_send(&self, lo: usize, hi: usize, rows: usize) -> bool {
        let Some(held) = &self.held else {
            return true;
        };
        match &held.record.state {
            ManifestState::Open => lo == 0 && hi == rows,
            ManifestState::Split(split) => split.may_send(lo, hi),
            ManifestState::Settled { .. } => false,
        }
    }

    /// Whether an availability answer (252, 241) to the whole batch may split it: only
    /// when nobody can have sent it before (see the module's doc). A batch that is not
    /// recorded is inserted at least once anyway.
    pub fn whole_never_sent(&self) -> bool {
        self.held.as_ref().is_none_or(|h| h.sent == Sent::Never)
    }

    /// Before a batch formed again is sent: a write of its record as read, so that a
    /// flight that claimed or split it and is still sending cannot take an
    /// availability answer for proof that nothing of it went in (its next record fails).
    pub async fn mark_attempt(&mut self) -> Result<(), LedgerRefusal> {
        let Some(held) = &mut self.held else {
            return Ok(());
        };
        if held.sent == Sent::Never {
            // Its claim is the mark.
            return Ok(());
        }
        let record = held.record.clone();
        held.write(record).await
    }

    /// Record the isolation as it stands: the judged rows, and the ranges not judged
    /// (each to be sent as it is from now on). A batch that is not recorded has nothing
    /// to record.
    pub async fn record_split(
        &mut self,
        verdicts: &[RowVerdict],
        untried: Vec<RowRange>,
    ) -> Result<(), LedgerRefusal> {
        let Some(held) = &mut self.held else {
            return Ok(());
        };
        let next = held
            .record
            .with_state(ManifestState::Split(Split::of_progress(verdicts, untried)));
        held.write(next).await
    }

    /// The batch's verdicts, recorded before any of its rows is settled. With a row
    /// still pending nothing is settled (the batch must stay formable whole from the
    /// stream): when it was split, its progress is recorded (`untried`: the ranges the
    /// isolation had not judged when it stopped, as it held them), and every message
    /// goes back. When the verdicts cannot be recorded, every row becomes pending.
    pub async fn record_verdicts<D: Delivery>(
        &mut self,
        batch: &Batch<D>,
        verdicts: &mut [RowVerdict],
        untried: Vec<RowRange>,
    ) -> Result<Judged, LedgerRefusal> {
        let pending = verdicts.contains(&RowVerdict::Pending);
        let Some(held) = &mut self.held else {
            return Ok(if pending {
                Judged::Partly
            } else {
                Judged::Whole
            });
        };
        if pending {
            if let ManifestState::Split(_) = &held.record.state {
                let split = Split::of_progress(verdicts, untried);
                // Only a split that puts every row in one place may be recorded: a
                // flight the shutdown deadline cut off knows its judged rows but not
                // the ranges it held, and the split recorded before stays true. A
                // failure costs nothing either (a range judged since is sent again as
                // it is and deduplicated).
                if split.covers(verdicts.len()) {
                    let next = held.record.with_state(ManifestState::Split(split));
                    let _ = held.write(next).await;
                }
            }
            verdicts.fill(RowVerdict::Pending);
            return Ok(Judged::Partly);
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
        let settled = held.record.with_state(ManifestState::Settled { rejected });
        if let Err(why) = held.write(settled).await {
            verdicts.fill(RowVerdict::Pending);
            return Err(why);
        }
        Ok(Judged::Whole)
    }

    /// Record which rejected rows are now on the DLQ, before their messages are acked:
    /// a message delivered again later (its ack lost) is then acked without parking its
    /// rows a second time, however long after (the DLQ's own duplicate window is two
    /// minutes).
    pub async fn record_parked(&mut self, parked: &[(u64, u32)]) -> Result<(), LedgerRefusal> {
        let Some(held) = &mut self.held else {
            return Ok(());
        };
        if parked.is_empty() {
            return Ok(());
        }
        record_parked(&held.store, &held.record.id, parked).await
    }

    /// The record, once every row is settled and every ack confirmed: removed once
    /// `keep` has passed ([`super::keep_settled_for`]; [`FORGET_AFTER`] at the least).
    pub fn release(
        self,
        tracker: &TaskTracker,
        shutdown: &CancellationToken,
        key: &TableKey,
        keep: Duration,
    ) {
        if let Some(held) = self.held {
            forget_later(&held.store, (tracker, shutdown), key, &held.record.id, keep);
        }
    }
}

impl Held {
    /// Write `next` over the record as this flight last saw it.
    async fn write(&mut self, next: Manifest) -> Result<(), LedgerRefusal> {
        match self.store.update(&next, self.revision).await {
            Ok(revision) => {
                self.record = next;
                self.revision = revision;
                Ok(())
            }
            Err(e) => Err(refusal(e)),
        }
    }
}

/// What a failed write means for the flight.
pub fn refusal(e: UpdateError) -> LedgerRefusal {
    match e {
        UpdateError::Superseded { id } => LedgerRefusal::Superseded { id },
        UpdateError::Unavailable(e) => LedgerRefusal::StoreDown(e),
    }
}

/// Record which rows of batch `id` are parked, over the record as the store holds it
/// now (a copy settled by the record may park rows too): flags only ever turn on, so
/// a write that lost to another is merged and tried again.
pub async fn record_parked(
    store: &Arc<dyn ManifestStore>,
    id: &str,
    parked: &[(u64, u32)],
) -> Result<(), LedgerRefusal> {
    for _ in 0..PARKED_TRIES {
        let Some(now) = store.current(id).await.map_err(LedgerRefusal::StoreDown)? else {
            // Removed: every message of it was acked, the parked rows too.
            return Ok(());
        };
        let ManifestState::Settled { rejected } = &now.manifest.state else {
            return Err(LedgerRefusal::StoreDown(StoreError(format!(
                "batch {id} is not settled: its parked rows cannot be recorded"
            ))));
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
            return Ok(());
        }
        let next = now.manifest.with_state(ManifestState::Settled { rejected });
        match store.update(&next, now.revision).await {
            Ok(_) => return Ok(()),
            Err(UpdateError::Superseded { .. }) => continue,
            Err(UpdateError::Unavailable(e)) => return Err(LedgerRefusal::StoreDown(e)),
        }
    }
    Err(LedgerRefusal::Superseded { id: id.to_owned() })
}

/// Remove a settled batch's record once `keep` (at least [`FORGET_AFTER`]) has passed
/// since its acks were confirmed.
fn forget_later(
    store: &Arc<dyn ManifestStore>,
    (tracker, shutdown): (&TaskTracker, &CancellationToken),
    key: &TableKey,
    id: &str,
    keep: Duration,
) {
    let (store, shutdown) = (store.clone(), shutdown.clone());
    let (id, key) = (id.to_string(), key.clone());
    tracker.spawn(async move {
        // A graceful shutdown does not wait for it, nor remove it early: the store's
        // collector (of another instance, or of this one when it starts again) removes
        // it by the same rule.
        tokio::select! {
            _ = tokio::time::sleep(keep.max(FORGET_AFTER)) => {}
            _ = shutdown.cancelled() => return,
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
    use crate::ledger::store::ManifestStore;
    use crate::testkit::{FakeManifestStore, Journal};
    use tokio::time::Instant;

    fn key() -> TableKey {
        TableKey::new("acme", "events")
    }

    /// What each test starts from: a batch of four one-row messages, claimed in a fake
    /// store.
    struct Claimed {
        _journal: Arc<Journal>,
        fake: Arc<FakeManifestStore>,
        store: Arc<dyn ManifestStore>,
        batch: Batch<crate::testkit::FakeDelivery>,
        recorded: Recorded,
    }

    impl Claimed {
        /// A flight's session of the claimed batch, as `sent`.
        fn session(&self, sent: Sent) -> LedgerSession {
            LedgerSession::recorded(self.store.clone(), self.recorded.clone(), sent)
        }
    }

    async fn four_claimed() -> Claimed {
        let journal = Journal::new();
        let fake = FakeManifestStore::new(&journal);
        let batch = Batch::new(journal.rows("acme.events", 4), Instant::now());
        let manifest = Manifest::new(key(), 1, batch.sequences());
        let revision = fake.claim(&manifest).await.expect("claimed");
        let manifest = manifest.claimed_as(revision);
        Claimed {
            _journal: journal,
            store: fake.clone(),
            fake,
            batch,
            recorded: Recorded { manifest, revision },
        }
    }

    /// Two flights hold one batch (each formed it again from the record it read). The
    /// first records its verdicts; the second's split, written over the state it read,
    /// is refused, and the settled record stands: a record is written only over the
    /// state its writer read.
    #[tokio::test]
    async fn a_write_over_a_record_another_flight_moved_on_writes_nothing() {
        let claimed = four_claimed().await;
        let mut fast = claimed.session(Sent::Maybe);
        let mut slow = claimed.session(Sent::Maybe);
        fast.mark_attempt().await.expect("the first mark");
        let mut verdicts = vec![RowVerdict::Inserted; 4];
        let judged = fast
            .record_verdicts(&claimed.batch, &mut verdicts, Vec::new())
            .await
            .expect("recorded");
        assert_eq!(judged, Judged::Whole);
        let late = slow
            .record_split(&vec![RowVerdict::Pending; 4], vec![RowRange::new(0, 4)])
            .await;
        assert!(
            matches!(late, Err(LedgerRefusal::Superseded { .. })),
            "{late:?}"
        );
        let id = fast.record().expect("recorded").id.clone();
        assert!(claimed.fake.get(&id).expect("still there").is_settled());
    }

    /// The flight that claimed a batch sends it first, and may split it on an
    /// availability answer, unless another flight marked an attempt meanwhile: then its
    /// split is refused (that other attempt may be in ClickHouse).
    #[tokio::test]
    async fn a_claimer_cannot_split_a_batch_another_flight_has_marked_as_attempted() {
        let claimed = four_claimed().await;
        let mut claimer = claimed.session(Sent::Never);
        let mut other = claimed.session(Sent::Maybe);
        assert!(claimer.whole_never_sent());
        assert!(!other.whole_never_sent());
        claimer
            .mark_attempt()
            .await
            .expect("a claim is its own mark");
        other.mark_attempt().await.expect("the other flight's mark");
        let split = claimer
            .record_split(
                &vec![RowVerdict::Pending; 4],
                vec![RowRange::new(2, 4), RowRange::new(0, 2)],
            )
            .await;
        assert!(
            matches!(split, Err(LedgerRefusal::Superseded { .. })),
            "{split:?}"
        );
    }

    /// The shutdown deadline cancels an isolation mid-range: the flight knows its
    /// judged rows but not the ranges the isolation held. Recording that would leave
    /// rows in no range (the batch could never be formed again); the split recorded
    /// before is kept.
    #[tokio::test]
    async fn a_cancelled_isolation_leaves_the_recorded_split_as_it_was() {
        let claimed = four_claimed().await;
        let split = Split {
            untried: vec![RowRange::new(2, 4)],
            inserted: vec![RowRange::new(0, 2)],
            rejected: Vec::new(),
        };
        let mut session = claimed.session(Sent::Never);
        let mut verdicts = vec![
            RowVerdict::Inserted,
            RowVerdict::Inserted,
            RowVerdict::Pending,
            RowVerdict::Pending,
        ];
        session
            .record_split(&verdicts, split.untried.clone())
            .await
            .expect("the split recorded");
        let judged = session
            .record_verdicts(&claimed.batch, &mut verdicts, Vec::new())
            .await
            .expect("nothing to write");
        assert_eq!(judged, Judged::Partly);
        let id = session.record().expect("recorded").id.clone();
        let stored = claimed.fake.get(&id).expect("still recorded");
        assert_eq!(stored.state, ManifestState::Split(split));
        assert!(verdicts.iter().all(|v| *v == RowVerdict::Pending));
    }

    /// A table that records nothing has the no-op twin: every step answers at once and
    /// nothing reaches a store.
    #[tokio::test]
    async fn an_unrecorded_batch_records_nothing_and_may_send_anything() {
        let journal = Journal::new();
        let batch = Batch::new(journal.rows("acme.events", 3), Instant::now());
        let mut session = LedgerSession::unrecorded();
        assert!(session.may_send(1, 2, 3) && session.whole_never_sent());
        assert_eq!(session.token_of(0, 3, 3), None);
        session.mark_attempt().await.expect("no-op");
        session
            .record_split(&vec![RowVerdict::Pending; 3], Vec::new())
            .await
            .expect("no-op");
        let mut verdicts = vec![RowVerdict::Inserted; 3];
        let judged = session
            .record_verdicts(&batch, &mut verdicts, Vec::new())
            .await
            .expect("no-op");
        assert_eq!(judged, Judged::Whole);
        assert!(session.record().is_none());
    }
}
