//! The end of a flight: its verdicts recorded, its rejected rows parked, its messages
//! acked (the last ack confirmed), its record released, its counts.

use super::FlightCtx;
use crate::batch::{Batch, RowVerdict, SettlePlan, Settled};
use crate::ledger::session::{Judged, LedgerSession};
use crate::ledger::split::RowRange;
use crate::ledger::LedgerRefusal;
use crate::metrics::retry_reason;
use crate::observe::flight_watch::FlightWatch;
use crate::observe::FlightStage;
use crate::ports::{Class, Delivery};
use crate::protocol::Suspicion;
use crate::protocol::{Tickets, Verdict};
use crate::settings::Failpoint;

/// Lost while ClickHouse was taking inserts (not a probe's loss), or lost alone (a
/// suspect's flight is the probe as often as not): a strike on the batch's messages.
pub(super) fn struck_rows<D: Delivery>(
    batch: &Batch<D>,
    verdict: &Verdict,
    tickets: Tickets,
    suspicion: Suspicion,
) -> Vec<u64> {
    match verdict {
        Verdict::PoolOutage(e)
            if e.lost_connection() && (!tickets.pool.is_probe() || suspicion.flies_alone()) =>
        {
            batch.sequences()
        }
        _ => Vec::new(),
    }
}

/// The verdicts recorded (the failpoints of the tests on either side): what the rows
/// may become, or why every row stays pending.
pub(super) async fn record_verdicts<I, D: Delivery>(
    ctx: &FlightCtx<I>,
    session: &mut LedgerSession,
    batch: &Batch<D>,
    verdicts: &mut [RowVerdict],
    untried: Vec<RowRange>,
) -> Result<Judged, LedgerRefusal> {
    crash_if(ctx, Failpoint::CrashAfterInsert, verdicts);
    let judged = session.record_verdicts(batch, verdicts, untried).await;
    if let Err(why) = &judged {
        ctx.refused(why);
    }
    crash_if(ctx, Failpoint::CrashAfterVerdicts, verdicts);
    judged
}

/// Park the rejected rows, record which are parked, ack the rest (the last ack
/// confirmed), and release the record once every message of the batch was held here,
/// settled and its ack confirmed.
pub(super) async fn settle<I, D: Delivery>(
    ctx: &FlightCtx<I>,
    batch: Batch<D>,
    verdicts: Vec<RowVerdict>,
    mut session: LedgerSession,
    judged: Judged,
    plan: &SettlePlan<'_>,
    watch: &FlightWatch,
) -> Settled {
    // Only a flight that held every message of its batch knows them all acked; a batch
    // formed again with messages held elsewhere is left to the store's collection.
    let batch_messages = batch.deliveries().count();
    let held_all = session
        .record()
        .is_some_and(|m| batch_messages == m.messages.len());
    watch.enter(FlightStage::Parking);
    let parked = batch.park(verdicts, plan).await;
    if judged == Judged::Whole {
        if let Err(e) = session.record_parked(parked.parked_rows()).await {
            tracing::debug!(tenant = %ctx.key.tenant, table = %ctx.key.table, error = %e,
                "could not record which rows are parked; a copy delivered again after the DLQ's duplicate window would park them again");
        }
    }
    watch.enter(FlightStage::Acking);
    let settled = parked.ack(plan).await;
    tracing::trace!(tenant = %ctx.key.tenant, table = %ctx.key.table,
        record = session.record().map_or("-", |m| m.id.as_str()),
        judged = ?judged,
        messages = batch_messages, inserted = settled.inserted, parked = settled.parked,
        handed_back = settled.handed_back, pending = settled.pending, confirmed = settled.confirmed,
        "flight settled");
    // A message that went back (a row pending, or rejected and not parked: the DLQ is
    // full) comes again: its batch's record must be there to settle it by, or its
    // inserted rows would go into a new batch (and, after a restart, into ClickHouse
    // again). The collector removes the record once every message is acked.
    let all_acked = settled.confirmed && settled.handed_back == 0;
    if judged == Judged::Whole && held_all && all_acked {
        let keep = crate::ledger::keep_settled_for(ctx.common.settings.ack_wait);
        session.release(&ctx.common.tracker, &ctx.common.shutdown, &ctx.key, keep);
    }
    settled
}

/// The failpoint of the tests: crash here when it is this one and the batch went in.
pub(super) fn crash_if<I>(ctx: &FlightCtx<I>, at: Failpoint, verdicts: &[RowVerdict]) {
    if ctx.common.settings.failpoint == Some(at) && verdicts.contains(&RowVerdict::Inserted) {
        tracing::error!(tenant = %ctx.key.tenant, table = %ctx.key.table, failpoint = ?at,
            "failpoint: crashing on purpose");
        std::process::abort();
    }
}

pub(super) fn failure_text(verdict: &Verdict) -> Option<String> {
    match verdict {
        Verdict::PoolOutage(e) | Verdict::TableOutage(e) | Verdict::MissingTable(e) => {
            Some(e.to_string())
        }
        Verdict::Unsent(why) => Some(why.to_string()),
        _ => None,
    }
}

pub(super) fn count<I>(
    ctx: &FlightCtx<I>,
    settled: &Settled,
    retry_class: Option<Class>,
    parked_missing: bool,
) {
    let m = &ctx.metrics;
    let stats = &ctx.common.stats;
    if settled.inserted > 0 {
        m.inserted.increment(settled.inserted as u64);
        stats.inserted(settled.inserted);
    }
    if settled.parked > 0 {
        let parked = if parked_missing {
            &m.parked_missing_table
        } else {
            &m.parked_rejected
        };
        parked.increment(settled.parked as u64);
        stats.parked(settled.parked);
    }
    if settled.dlq_failures > 0 {
        m.dlq_failures.increment(settled.dlq_failures as u64);
        stats.dlq_failures(settled.dlq_failures);
    }
    if let (Some(class), true) = (retry_class, settled.pending > 0) {
        m.retries(retry_reason(class))
            .increment(settled.pending as u64);
    }
    stats.handed_back(settled.handed_back);
}
