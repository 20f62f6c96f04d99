//! A flight's cargo formed into what it sends, through the ledger: a fresh batch claimed
//! first (for a table that deduplicates), a recorded one formed again on its shard, or
//! nothing (settled by a record); what the ledger refused goes back.

use crate::batch::{Batch, RowVerdict};
use crate::flight::split_parts::keep_counted;
use crate::ledger::forming::Formed;
use crate::ledger::session::LedgerSession;
use crate::ledger::{LedgerRefusal, Manifest};
use crate::placement::Replica;
use crate::ports::{Dedup, Delivery, Inserter};
use crate::protocol::Cargo;
use crate::protocol::{outage, Verdict};
use crate::settle::hand_back;
use std::time::Duration;
use tokio::time::Instant;

use super::judge::unless_cut_off;
use super::{Attempt, FlightCtx, Prepared};

/// What forming a cargo made, and what the flight learnt on the way.
pub(super) struct Formation<D> {
    pub(super) prepared: Prepared<D>,
    /// Whether ClickHouse deduplicates the table, when the flight asked.
    pub(super) dedup: Option<Dedup>,
    /// A recorded batch formed again past the table's deduplication window.
    pub(super) past_dedup_window: bool,
}

impl<D> Formation<D> {
    fn of(prepared: Prepared<D>, dedup: Option<Dedup>) -> Self {
        Self {
            prepared,
            dedup,
            past_dedup_window: false,
        }
    }
}

/// Form the cargo into what the flight sends to `replica`, through the ledger.
pub(super) async fn prepare<I: Inserter, D: Delivery>(
    ctx: &FlightCtx<I>,
    replica: &Replica<I>,
    cargo: Cargo<D>,
    held_since: Instant,
) -> Formation<D> {
    let ledger = &ctx.common.ledger;
    let ack_wait = ctx.common.settings.ack_wait;
    match cargo {
        Cargo::Fresh {
            deliveries, done, ..
        } => {
            // Parts of split messages: only the copies their split counts go on (before
            // any claim or send; see `split_parts`).
            let deliveries = keep_counted(&ctx.common, &ctx.key, &ctx.metrics, deliveries).await;
            if deliveries.is_empty() {
                return Formation::of(Prepared::Nothing, None);
            }
            if !ledger.records() {
                return Formation::of(unrecorded(deliveries, done, held_since), None);
            }
            // Asked of the server (a frozen one answers after `insert_timeout`): the
            // shutdown deadline cuts it short, and the batch goes back at once.
            let lookup = unless_cut_off(ctx, replica.inserter.deduplicates(&ctx.key)).await;
            let dedup = match lookup {
                Some(Ok(dedup)) => dedup,
                Some(Err(e)) => {
                    let batch = Batch::resuming(deliveries, done, held_since);
                    let verdict = outage(e);
                    return Formation::of(Prepared::Failed { batch, verdict }, None);
                }
                None => {
                    let batch = Batch::resuming(deliveries, done, held_since);
                    let verdict = Verdict::Unfinished;
                    return Formation::of(Prepared::Failed { batch, verdict }, None);
                }
            };
            if !dedup.exactly_once {
                return Formation::of(unrecorded(deliveries, done, held_since), Some(dedup));
            }
            // A recorded batch never skips lines: its rows are a function of its
            // messages (an unrecorded flight settles lines only while the table was not
            // exactly-once).
            // The batch's shard is the replica's: recorded with it, every retry and every
            // copy formed again goes to a replica of that shard.
            let claimed = ledger
                .claim(&ctx.key, ack_wait, deliveries, held_since, replica.shard)
                .await;
            let (formed, expired) = match claimed {
                Ok(claimed) => claimed,
                Err(deliveries) => {
                    return Formation::of(unrecorded(deliveries, done, held_since), Some(dedup))
                }
            };
            if !expired.is_empty() {
                tracing::info!(tenant = %ctx.key.tenant, table = %ctx.key.table, messages = expired.len(),
                    "messages held past ack_wait may be in another batch by now: they go back");
                back_for_now(ctx, expired);
            }
            let prepared = settle_formed(ctx, formed, held_since).await;
            Formation::of(prepared, Some(dedup))
        }
        Cargo::Reformed { manifest, held, .. } => {
            let formed = match ledger
                .reform(&ctx.key, ack_wait, &manifest.id, held, held_since)
                .await
            {
                Ok(formed) => on_its_shard(ctx, replica, formed),
                Err(held) => return Formation::of(unrecorded(held, Vec::new(), held_since), None),
            };
            let past_dedup_window = match &formed {
                Formed::Batch { session, .. } => match session.record() {
                    Some(m) => past_window(ctx, replica, m).await,
                    None => false,
                },
                _ => false,
            };
            Formation {
                prepared: settle_formed(ctx, formed, held_since).await,
                dedup: None,
                past_dedup_window,
            }
        }
    }
}

pub(super) fn unrecorded<D: Delivery>(
    deliveries: Vec<D>,
    done: Vec<(u64, Vec<u32>)>,
    held_since: Instant,
) -> Prepared<D> {
    let batch = Batch::resuming(deliveries, done, held_since);
    let verdicts = vec![RowVerdict::Pending; batch.rows()];
    Prepared::Send {
        batch,
        session: LedgerSession::unrecorded(),
        attempt: Attempt::Whole,
        verdicts,
    }
}

/// A recorded batch sent again after the table's deduplication window (in seconds) has
/// passed since it was claimed: ClickHouse may have forgotten its first attempt. It is
/// sent all the same (its rows must go in); the metric and the log say a row may be
/// twice.
pub(super) async fn past_window<I: Inserter>(
    ctx: &FlightCtx<I>,
    replica: &Replica<I>,
    m: &Manifest,
) -> bool {
    let Some(age) = m.age(ctx.common.ledger.now_ms()) else {
        return false;
    };
    // Cut short by the shutdown deadline: the flight is, at its turn, right after.
    let Some(Ok(dedup)) = unless_cut_off(ctx, replica.inserter.deduplicates(&ctx.key)).await else {
        return false;
    };
    let Some(seconds) = dedup.window.and_then(|w| w.seconds) else {
        return false;
    };
    let past = age > seconds;
    if past {
        ctx.metrics.past_dedup_window.increment(1);
        tracing::warn!(tenant = %ctx.key.tenant, table = %ctx.key.table, manifest = %m.id,
            age = %humantime::format_duration(Duration::from_secs(age.as_secs())),
            window = %humantime::format_duration(seconds),
            "a recorded batch is sent again past the table's deduplication window: ClickHouse may take its rows twice (raise replicated_deduplication_window_seconds)");
    }
    past
}

/// What the flight does with what the ledger formed.
pub(super) async fn settle_formed<I, D: Delivery>(
    ctx: &FlightCtx<I>,
    formed: Formed<D>,
    held_since: Instant,
) -> Prepared<D> {
    match formed {
        Formed::Batch {
            batch,
            session,
            back,
        } => {
            back_for_now(ctx, back);
            recorded_batch(ctx, batch, session)
        }
        Formed::Refused { messages, why } => {
            ctx.refused(&why);
            tracing::warn!(tenant = %ctx.key.tenant, table = %ctx.key.table, reason = %why,
                "the batch is not sent now: its messages go back (nothing is inserted unrecorded)");
            Prepared::Failed {
                batch: Batch::new(messages, held_since),
                verdict: Verdict::Unsent(why),
            }
        }
        Formed::Settled {
            by_record,
            copies,
            back,
        } => {
            back_for_now(ctx, back);
            for copy in copies {
                // Its message left the stream (acked after its batch was settled): the
                // ack is a no-op for JetStream, and nothing is inserted again.
                tracing::trace!(table = %ctx.key.table, seq = copy.position().stream_sequence,
                    "a copy of a message no longer in the stream acked");
                let _ = copy.ack().await;
            }
            if let Some((manifest, held)) = by_record {
                let plan = ctx.plan(ctx.common.settings.store_retry, false);
                ctx.common
                    .ledger
                    .settle_by_record(&manifest, held, &plan)
                    .await;
            }
            Prepared::Nothing
        }
    }
}

/// A formed batch as it is sent: whole, or (a recorded split) its untried ranges with
/// its judged rows' verdicts filled in.
pub(super) fn recorded_batch<I, D: Delivery>(
    ctx: &FlightCtx<I>,
    batch: Batch<D>,
    session: LedgerSession,
) -> Prepared<D> {
    let rows = batch.rows();
    let Some(split) = session.record().and_then(|m| m.split()).cloned() else {
        return Prepared::Send {
            batch,
            session,
            attempt: Attempt::Whole,
            verdicts: vec![RowVerdict::Pending; rows],
        };
    };
    match split.verdicts(rows) {
        Ok(verdicts) => Prepared::Send {
            attempt: Attempt::Resume(split.untried),
            batch,
            session,
            verdicts,
        },
        Err(_) => {
            let why = LedgerRefusal::SplitMismatch {
                id: session.record().map(|m| m.id.clone()).unwrap_or_default(),
                rows,
            };
            tracing::error!(tenant = %ctx.key.tenant, table = %ctx.key.table, reason = %why,
                "a recorded split does not fit its batch: nothing is sent");
            ctx.refused(&why);
            Prepared::Failed {
                batch,
                verdict: Verdict::Unsent(why),
            }
        }
    }
}

/// Messages that must not go into this batch: back to the queue for a moment, to come
/// again as what they are.
pub(super) fn back_for_now<I, D: Delivery>(ctx: &FlightCtx<I>, messages: Vec<D>) {
    hand_back(&ctx.common, None, messages, ctx.common.settings.store_retry);
}

/// A recorded batch goes to a replica of the shard its record names (modulo the
/// shards there are: a target with fewer shards than when the batch was recorded sends
/// it to shard `recorded mod shards`, where it is not deduplicated against its first
/// attempt). The table picked such a replica; anything else is refused, never sent.
pub(super) fn on_its_shard<I, D: Delivery>(
    ctx: &FlightCtx<I>,
    replica: &Replica<I>,
    formed: Formed<D>,
) -> Formed<D> {
    let layout = &ctx.servers.layout;
    let Formed::Batch {
        batch,
        session,
        back,
    } = formed
    else {
        return formed;
    };
    let wrong = session.record().and_then(|m| {
        let recorded = layout.recorded_shard(m.shard);
        (recorded != replica.shard).then(|| LedgerRefusal::WrongShard {
            id: m.id.clone(),
            recorded: recorded + 1,
            routed: replica.shard + 1,
        })
    });
    let Some(why) = wrong else {
        return Formed::Batch {
            batch,
            session,
            back,
        };
    };
    tracing::error!(tenant = %ctx.key.tenant, table = %ctx.key.table, reason = %why,
        "a recorded batch was routed to another shard than its own: it goes back");
    let mut messages = back;
    messages.extend(batch.into_deliveries());
    Formed::Refused { messages, why }
}
