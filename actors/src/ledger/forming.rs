//! From what a table hands a flight to the batch the flight sends: the messages as they
//! came (a fresh batch, claimed in the store first when the table deduplicates), or a
//! recorded batch formed again from its record.
//!
//! A recorded batch is formed again from the record as the store has it now (read
//! directly, not from an index that may lag): settled meanwhile, its messages are
//! settled by it; removed meanwhile, every message it held was acknowledged (a record
//! goes only once its rows are settled and the acks confirmed, or once nothing of it is
//! left in the stream), so a copy held here is of a settled row unless it is still in
//! the stream. Nothing recorded is ever sent as a new batch from here.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::manifest::{Manifest, ManifestState};
use super::session::{LedgerSession, Sent};
use super::store::{ClaimError, FetchError, ManifestStore, Recorded};
use super::LedgerRefusal;
use crate::batch::keepalive::{any_lease_ran_out, lease_ran_out};
use crate::batch::Batch;
use crate::clock::WallClock;
use crate::ports::{Delivery, TableKey};

/// What forming needs of the flight's table.
pub struct LedgerIo<'a> {
    pub store: &'a Arc<dyn ManifestStore>,
    pub key: &'a TableKey,
    pub ack_wait: Duration,
    /// The time the claim is recorded at.
    pub clock: &'a WallClock,
}

/// What forming made of a cargo.
pub enum Formed<D> {
    /// A batch to send, with its hold on the record it goes under (see
    /// [`LedgerSession`]); `back`: copies of its messages delivered twice, which go back
    /// beside it.
    Batch {
        batch: Batch<D>,
        session: LedgerSession,
        back: Vec<D>,
    },
    /// The batch cannot be sent now: its messages go back (see the refusal).
    Refused {
        messages: Vec<D>,
        why: LedgerRefusal,
    },
    /// Nothing to send: the messages are settled by a record (acked, parked again), or
    /// they are copies of messages settled and gone from the stream (`copies`: acked, a
    /// no-op for JetStream), or they go back to come again as what they are now.
    Settled {
        by_record: Option<(Arc<Manifest>, Vec<D>)>,
        copies: Vec<D>,
        back: Vec<D>,
    },
}

impl<D> Formed<D> {
    fn nothing() -> Self {
        Formed::Settled {
            by_record: None,
            copies: Vec::new(),
            back: Vec::new(),
        }
    }
}

/// A fresh batch of a table whose inserts ClickHouse deduplicates, for shard `shard`
/// of its target: recorded first (with its shard), and only with messages JetStream
/// still counts as ours. Returns the messages whose lease ran out beside it: they may
/// be in another batch by now and go back.
pub async fn claim_fresh<D: Delivery>(
    io: &LedgerIo<'_>,
    deliveries: Vec<D>,
    held_since: Instant,
    shard: usize,
) -> (Formed<D>, Vec<D>) {
    let now = Instant::now();
    // Nearly always every lease is live: then the deliveries are not moved again.
    let (mut live, expired): (Vec<D>, Vec<D>) = if any_lease_ran_out(&deliveries, io.ack_wait, now)
    {
        deliveries
            .into_iter()
            .partition(|d| !lease_ran_out(d, io.ack_wait, now))
    } else {
        (deliveries, Vec::new())
    };
    // The order the manifest lists (and a batch formed again sends): isolation splits a
    // batch by position, so the same pieces need the same order.
    live.sort_unstable_by_key(|d| d.position().stream_sequence);
    if live.is_empty() {
        return (Formed::nothing(), expired);
    }
    let Some(incarnation) = io.store.incarnation() else {
        let why = LedgerRefusal::NotReady;
        return (
            Formed::Refused {
                messages: live,
                why,
            },
            expired,
        );
    };
    let batch = Batch::new(live, held_since);
    let manifest = Manifest::new(io.key.clone(), incarnation, batch.sequences())
        .claimed_at(io.clock.now_ms())
        .on_shard(u32::try_from(shard).unwrap_or(u32::MAX));
    let (manifest, revision) = match io.store.claim(&manifest).await {
        Ok(revision) => (manifest.claimed_as(revision), revision),
        Err(e) => {
            let why = match e {
                ClaimError::Conflict { id, earlier } => LedgerRefusal::Conflict { id, earlier },
                ClaimError::Unavailable(e) => LedgerRefusal::StoreDown(e),
            };
            let messages = batch.into_deliveries();
            return (Formed::Refused { messages, why }, expired);
        }
    };
    // The record may have taken long (NATS slow or frozen), or this process stood
    // still: a message JetStream gave up on meanwhile may be in another batch already.
    // The claim goes only as it was made: another instance may have formed it again
    // from the record and sent it meanwhile, and its record must stay.
    if any_lease_ran_out(batch.deliveries(), io.ack_wait, Instant::now()) {
        let _ = io.store.withdraw(&manifest.id, revision).await;
        let why = LedgerRefusal::LeaseLost { id: manifest.id };
        let messages = batch.into_deliveries();
        return (Formed::Refused { messages, why }, expired);
    }
    if let Some(why) = acked_elsewhere(io, &batch, &manifest.id).await {
        let _ = io.store.withdraw(&manifest.id, revision).await;
        let messages = batch.into_deliveries();
        return (Formed::Refused { messages, why }, expired);
    }
    // A message delivered before may have been in a batch sent, acked and forgotten
    // while a copy stayed here (this instance cut off from NATS, its progress lost).
    let sent = match batch.deliveries().all(|d| d.position().deliveries <= 1) {
        true => Sent::Never,
        false => Sent::Maybe,
    };
    let session = LedgerSession::recorded(io.store.clone(), Recorded { manifest, revision }, sent);
    let formed = Formed::Batch {
        batch,
        session,
        back: Vec::new(),
    };
    (formed, expired)
}

/// Why a fresh batch's claim cannot stand because a message of it was acked elsewhere,
/// or the stream could not say. Only messages received here longer ago than a settled
/// record is kept ([`super::keep_settled_for`]) are looked up: a copy of a message
/// settled by another batch meets that batch's record while it stays, so a claim that
/// met none can hold such a copy only once the record went, and by then the copy is
/// that old. (Its lease says nothing here: a progress sent for a copy renews whatever
/// delivery of the message is current.) Nearly every batch is younger: no lookup.
async fn acked_elsewhere<D: Delivery>(
    io: &LedgerIo<'_>,
    batch: &Batch<D>,
    id: &str,
) -> Option<LedgerRefusal> {
    let now = Instant::now();
    let horizon = super::keep_settled_for(io.ack_wait);
    let old: Vec<u64> = batch
        .deliveries()
        .filter(|d| now.saturating_duration_since(d.received_at()) >= horizon)
        .map(|d| d.position().stream_sequence)
        .collect();
    if old.is_empty() {
        return None;
    }
    match io.store.in_stream(&old).await {
        Ok(there) => {
            let gone = there.iter().filter(|&&there| !there).count();
            (gone > 0).then(|| {
                tracing::info!(tenant = %io.key.tenant, table = %io.key.table, manifest = %id,
                    gone, held_long = old.len(),
                    "messages held here past ack_wait were acked elsewhere meanwhile (their batch settled and its record went): the claim is withdrawn, the rest come again");
                LedgerRefusal::AckedElsewhere {
                    id: id.to_owned(),
                    gone,
                }
            })
        }
        Err(e) => Some(LedgerRefusal::StoreDown(e)),
    }
}

/// A recorded batch again: the record read now; the messages held, the others read
/// from the stream.
pub async fn reform<D: Delivery>(
    io: &LedgerIo<'_>,
    id: &str,
    held: Vec<D>,
    held_since: Instant,
) -> Formed<D> {
    let (recorded, held) = match unsettled_record(io, id, held).await {
        Ok(unsettled) => unsettled,
        Err(formed) => return formed,
    };
    let manifest = &recorded.manifest;
    // Only an open record can be of a batch that lost its claim: a split one was sent.
    if manifest.state == ManifestState::Open {
        match io.store.earlier_claim(manifest).await {
            Ok(Some(earlier)) => return lost_its_claim(io, &recorded, &earlier, held).await,
            Ok(None) => {}
            Err(e) => {
                return Formed::Refused {
                    messages: held,
                    why: LedgerRefusal::StoreDown(e),
                }
            }
        }
    }
    let have: HashSet<u64> = held.iter().map(|d| d.position().stream_sequence).collect();
    let missing: Vec<u64> = manifest
        .messages
        .iter()
        .copied()
        .filter(|s| !have.contains(s))
        .collect();
    let fetched = if missing.is_empty() {
        Vec::new()
    } else {
        match io.store.fetch(&missing).await {
            Ok(payloads) => missing.into_iter().zip(payloads).collect(),
            Err(FetchError::Gone { stream_sequence }) => {
                // A message of the batch left the stream after its record was read open.
                // Another instance gathering the same batch (each holds some of its
                // messages, and reads the others from the stream) may have sent and settled
                // it meanwhile, then acked what it held: acks come only after a batch's
                // verdicts are recorded, so the record read again says so, and what is held
                // here is settled by it. Taken for a lost message, the record was withdrawn
                // and what is held here inserted again as new rows (chaos
                // `cluster_consumer_leader_sigstop`, 14 rows twice in the twin).
                return match unsettled_record(io, &manifest.id, held).await {
                    Ok((now, held)) => incomplete(io, &now, stream_sequence, held).await,
                    Err(formed) => formed,
                };
            }
            Err(FetchError::Unavailable(e)) => {
                return Formed::Refused {
                    messages: held,
                    why: LedgerRefusal::StoreDown(e),
                };
            }
        }
    };
    let (batch, copies) = Batch::reformed(&manifest.messages, held, fetched, held_since);
    // Every message must be in (its record's split fits the batch only then).
    if batch.sequences() != manifest.messages {
        let why = LedgerRefusal::NotWhole {
            id: manifest.id.clone(),
            messages: manifest.messages.len(),
        };
        let mut messages = copies;
        messages.extend(batch.into_deliveries());
        return Formed::Refused { messages, why };
    }
    Formed::Batch {
        batch,
        session: LedgerSession::recorded(io.store.clone(), recorded, Sent::Maybe),
        back: copies,
    }
}

/// Batch `id`'s record as the store holds it now, if it is still unsettled (open or
/// split), with `held`. Otherwise what becomes of `held`: settled by the record, or
/// sorted as copies of settled rows and messages still queued (the record removed), or
/// back (the store down). Both readings of a record (forming a batch again, and a
/// message of it gone meanwhile) go through here, so they cannot disagree.
async fn unsettled_record<D: Delivery>(
    io: &LedgerIo<'_>,
    id: &str,
    held: Vec<D>,
) -> Result<(Recorded, Vec<D>), Formed<D>> {
    match io.store.current(id).await {
        Ok(Some(recorded)) if recorded.manifest.is_settled() => Err(Formed::Settled {
            by_record: Some((Arc::new(recorded.manifest), held)),
            copies: Vec::new(),
            back: Vec::new(),
        }),
        Ok(Some(recorded)) => Ok((recorded, held)),
        Ok(None) => Err(removed_meanwhile(io, id, held).await),
        Err(e) => Err(Formed::Refused {
            messages: held,
            why: LedgerRefusal::StoreDown(e),
        }),
    }
}

/// The record is gone: its batch was settled and every message of it acknowledged
/// (or nothing of it was left in the stream), or it lost its claim to an earlier batch
/// before anything was sent. A copy whose message left the stream is of a settled row
/// (acked here, a no-op for JetStream); one still in the stream goes back, to come again
/// as what it is now.
async fn removed_meanwhile<D: Delivery>(io: &LedgerIo<'_>, id: &str, held: Vec<D>) -> Formed<D> {
    let sequences: Vec<u64> = held.iter().map(|d| d.position().stream_sequence).collect();
    let in_stream = match io.store.in_stream(&sequences).await {
        Ok(flags) => flags,
        Err(e) => {
            return Formed::Refused {
                messages: held,
                why: LedgerRefusal::StoreDown(e),
            }
        }
    };
    let mut back = Vec::new();
    let mut copies = Vec::new();
    for (d, there) in held.into_iter().zip(in_stream) {
        if there {
            back.push(d);
        } else {
            copies.push(d);
        }
    }
    tracing::debug!(tenant = %io.key.tenant, table = %io.key.table, manifest = %id,
        acked_elsewhere = copies.len(), still_queued = back.len(),
        "a recorded batch was removed while its messages were gathered: copies of settled rows are dropped, the rest come again");
    Formed::Settled {
        by_record: None,
        copies,
        back,
    }
}

/// The record is of a batch that lost its claim to an earlier one holding one of its
/// messages, and was left behind (its claimer could not tell the outcome, or could not
/// remove it). Nothing of it was ever sent (a batch is sent only once its claim stood),
/// and sending it now would insert the shared messages' rows a second time, under
/// another token, beside the earlier batch: it is withdrawn, and what is held comes
/// again, to be gathered for the earlier batch or formed anew.
async fn lost_its_claim<D: Delivery>(
    io: &LedgerIo<'_>,
    recorded: &Recorded,
    earlier: &str,
    held: Vec<D>,
) -> Formed<D> {
    tracing::info!(tenant = %io.key.tenant, table = %io.key.table, manifest = %recorded.manifest.id,
        earlier = %earlier,
        "a recorded batch that lost its claim to an earlier one was left behind: withdrawn, its messages come again");
    withdrawn(io, recorded, held).await
}

/// A message of an open (or split) batch left the stream, and its record, read again,
/// is still unfinished. Its record is read directly
/// from the store (its leader, on a NATS cluster: a replica may lag), so it is not a
/// record lagging behind: acks come only after a batch's verdicts are recorded, so an
/// operator removed it by hand, or nats-server lost it.
/// The batch can never be formed whole again: its record is withdrawn at once (never
/// left to the store's collector, which would keep it while its other messages wait:
/// they would be gathered for it for ever) and what is held comes again as new
/// messages (their rows may have gone in under the old record: the removal costs
/// exactly-once for this batch, never a row).
async fn incomplete<D: Delivery>(
    io: &LedgerIo<'_>,
    recorded: &Recorded,
    gone: u64,
    held: Vec<D>,
) -> Formed<D> {
    tracing::warn!(tenant = %io.key.tenant, table = %io.key.table, manifest = %recorded.manifest.id,
        message = gone,
        "a message of a recorded, unfinished batch left the ingest stream unsettled (removed by hand, or lost by nats-server): the batch cannot be formed again; its record is withdrawn and its other messages come again as new ones (their rows may be inserted twice)");
    withdrawn(io, recorded, held).await
}

/// The record withdrawn (unless it was written since it was read: then a flight is
/// sending it after all) and what is held sent back, to come again as what it is then;
/// if the store cannot withdraw it now, the messages go back under that refusal.
async fn withdrawn<D: Delivery>(io: &LedgerIo<'_>, recorded: &Recorded, held: Vec<D>) -> Formed<D> {
    let withdrawn = io
        .store
        .withdraw(&recorded.manifest.id, recorded.revision)
        .await;
    if let Err(e) = withdrawn {
        return Formed::Refused {
            messages: held,
            why: super::session::refusal(e),
        };
    }
    Formed::Settled {
        by_record: None,
        copies: Vec::new(),
        back: held,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::manifest::ManifestState;
    use crate::ledger::store::{Changes, LedgerSnapshot, UpdateError};
    use crate::ledger::StoreError;
    use crate::testkit::{FakeManifestStore, Journal};
    use bytes::Bytes;
    use futures::future::BoxFuture;

    const ACK_WAIT: Duration = Duration::from_secs(30);

    fn io_of<'a>(
        store: &'a Arc<dyn ManifestStore>,
        key: &'a TableKey,
        clock: &'a WallClock,
    ) -> LedgerIo<'a> {
        LedgerIo {
            store,
            key,
            ack_wait: ACK_WAIT,
            clock,
        }
    }

    /// A store whose claim is judged late (its watch lags): meanwhile JetStream gave
    /// the messages to another instance, which formed the batch again from the claim,
    /// sent it and recorded its verdicts.
    struct LateClaim(Arc<FakeManifestStore>);

    impl ManifestStore for LateClaim {
        fn incarnation(&self) -> Option<u64> {
            self.0.incarnation()
        }
        fn claim<'a>(&'a self, m: &'a Manifest) -> BoxFuture<'a, Result<u64, ClaimError>> {
            Box::pin(async move {
                let revision = self.0.claim(m).await?;
                let settled = m
                    .clone()
                    .claimed_as(revision)
                    .with_state(ManifestState::Settled { rejected: vec![] });
                self.0.plant(&settled);
                tokio::time::sleep(ACK_WAIT * 2).await;
                Ok(revision)
            })
        }
        fn earlier_claim<'a>(
            &'a self,
            m: &'a Manifest,
        ) -> BoxFuture<'a, Result<Option<String>, StoreError>> {
            self.0.earlier_claim(m)
        }
        fn update<'a>(
            &'a self,
            m: &'a Manifest,
            e: u64,
        ) -> BoxFuture<'a, Result<u64, UpdateError>> {
            self.0.update(m, e)
        }
        fn current<'a>(
            &'a self,
            id: &'a str,
        ) -> BoxFuture<'a, Result<Option<Recorded>, StoreError>> {
            self.0.current(id)
        }
        fn forget<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<(), StoreError>> {
            self.0.forget(id)
        }
        fn withdraw<'a>(&'a self, id: &'a str, e: u64) -> BoxFuture<'a, Result<(), UpdateError>> {
            self.0.withdraw(id, e)
        }
        fn fetch<'a>(&'a self, s: &'a [u64]) -> BoxFuture<'a, Result<Vec<Bytes>, FetchError>> {
            self.0.fetch(s)
        }
        fn in_stream<'a>(&'a self, s: &'a [u64]) -> BoxFuture<'a, Result<Vec<bool>, StoreError>> {
            self.0.in_stream(s)
        }
        fn changes(&self) -> Changes {
            self.0.changes()
        }
        fn of_table(&self, table: &TableKey) -> LedgerSnapshot {
            self.0.of_table(table)
        }
    }

    /// A claim judged after its messages' lease ran out is given up, but only as it was
    /// claimed: the record another instance moved on meanwhile (settled, its rows in
    /// ClickHouse) stays, or the messages, delivered again, would be claimed as new and
    /// their rows could go in twice (found by the simulation, seed 39).
    #[tokio::test(start_paused = true)]
    async fn a_claim_given_up_leaves_a_record_another_instance_moved_on() {
        let journal = Journal::new();
        let fake = FakeManifestStore::new(&journal);
        let store: Arc<dyn ManifestStore> = Arc::new(LateClaim(fake.clone()));
        let (key, clock) = (TableKey::new("acme", "events"), WallClock::default());
        let io = io_of(&store, &key, &clock);
        let deliveries = journal.rows("acme.events", 2);
        let (formed, _) = claim_fresh(&io, deliveries, Instant::now(), 0).await;
        assert!(
            matches!(
                &formed,
                Formed::Refused {
                    why: LedgerRefusal::LeaseLost { .. },
                    ..
                }
            ),
            "the claim is given up"
        );
        let kept = fake.holding(1).expect("the settled record is still there");
        assert!(kept.is_settled(), "{kept:?}");
    }

    /// A copy held here longer than a settled record is kept (`ack_wait`) is looked up
    /// in the stream before its claim stands, whatever its lease says (a progress sent
    /// for a copy renews whichever delivery of the message is current). Acked elsewhere
    /// meanwhile (its batch settled there and its record went), it is not sent: the
    /// claim is withdrawn. Without it, a copy held through a consumer leader change
    /// formed a batch of its own, went to another shard and its rows in twice (found by
    /// the simulation, seed 215 of the partitions work).
    #[tokio::test(start_paused = true)]
    async fn a_copy_held_past_ack_wait_and_acked_elsewhere_is_not_claimed() {
        let journal = Journal::new();
        let fake = FakeManifestStore::new(&journal);
        let store: Arc<dyn ManifestStore> = fake.clone();
        let (key, clock) = (TableKey::new("acme", "events"), WallClock::default());
        let io = io_of(&store, &key, &clock);
        let held_long = |n: usize| {
            let held = journal.rows("acme.events", n);
            async move {
                tokio::time::advance(ACK_WAIT + Duration::from_secs(1)).await;
                for d in &held {
                    // Its progress went out all along: its lease looks live.
                    let _ = d.progress().await;
                }
                held
            }
        };
        let held = held_long(2).await;
        journal.remove_from_stream(2);
        let (formed, expired) = claim_fresh(&io, held, Instant::now(), 0).await;
        assert!(expired.is_empty(), "every lease looks live");
        let Formed::Refused { messages, why } = formed else {
            panic!("a copy acked elsewhere is not claimed");
        };
        assert!(
            matches!(why, LedgerRefusal::AckedElsewhere { gone: 1, .. }),
            "{why}"
        );
        assert_eq!(messages.len(), 2, "both go back (the acked one to nothing)");
        assert!(fake.holding(1).is_none(), "the claim is withdrawn");

        // Held as long, and still in the stream: claimed.
        let held = held_long(2).await;
        let (formed, _) = claim_fresh(&io, held, Instant::now(), 0).await;
        assert!(matches!(formed, Formed::Batch { .. }), "claimed");
        assert!(fake.holding(3).is_some());
    }

    /// A fresh claim of messages delivered before is no proof nobody sent them: an
    /// earlier batch of them may have gone in, been acked and forgotten, while a copy
    /// stayed here (this instance cut off from NATS, its progress never arriving). An
    /// availability answer must not split it: the pieces would go in beside the block
    /// ClickHouse has (found by the simulation, seed 13).
    #[tokio::test]
    async fn a_fresh_claim_of_messages_delivered_before_may_have_been_sent() {
        let journal = Journal::new();
        let store: Arc<dyn ManifestStore> = FakeManifestStore::new(&journal);
        let (key, clock) = (TableKey::new("acme", "events"), WallClock::default());
        let io = io_of(&store, &key, &clock);
        let first = journal.rows("acme.events", 2);
        let (Formed::Batch { session, .. }, _) = claim_fresh(&io, first, Instant::now(), 0).await
        else {
            panic!("a first delivery is claimed");
        };
        assert!(session.whole_never_sent(), "its claimer sends it first");
        let again = vec![journal.redeliver(1, 2), journal.redeliver(2, 1)];
        let _ = store.forget(&session.record().expect("recorded").id).await;
        let (Formed::Batch { session, .. }, _) = claim_fresh(&io, again, Instant::now(), 0).await
        else {
            panic!("a redelivery is claimed");
        };
        assert!(!session.whole_never_sent(), "a redelivered batch may be in");
    }
}
