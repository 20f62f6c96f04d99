//! The flight: one batch, run as a task the TableActor spawns once its own backoff and
//! its pool both let it go. It owns its messages until each is settled, even if the
//! actor dies meanwhile: it forms the batch (and records it, for a table that
//! deduplicates), inserts, isolates rejected rows, sends its verdict to its table
//! (which settles its own backoff and passes the pool's part on), learns what becomes of
//! the rows it could not settle, records the verdicts (exactly-once), settles every
//! message and reports its counts.
//!
//! A flight decides nothing about windows: it reports what ClickHouse answered, and the
//! owners of the breakers decide.

use std::sync::Arc;
use std::time::Duration;

use ractor::{ActorRef, DerivedActorRef, MessagingErr, RpcReplyPort};
use tokio::time::Instant;

use super::forming::{finish_record, form, Cargo, Formed};
use super::messages::{TableMsg, TableReport};
use super::verdict::{FlightVerdict, PendingRows, PoolVerdict, Tickets, Verdict};
use crate::batch::{Batch, RowVerdict, SettlePlan, Settled};
use crate::bisect::{bisect, lost_on_rows, Isolation};
use crate::context::Common;
use crate::keepalive::Keepalive;
use crate::manifest::Manifest;
use crate::metrics::{retry_reason, TableMetrics, TargetMetrics};
use crate::ports::{Class, ClickHouseError, Dedup, Delivery, Inserter, TableKey};
use crate::settings::{Failpoint, TableSettings};

/// What every flight of one table needs.
pub struct FlightCtx<I> {
    pub inserter: Arc<I>,
    /// The ClickHouse target's name (for log lines and the admin tree).
    pub target: Arc<str>,
    pub key: TableKey,
    pub settings: TableSettings,
    pub target_metrics: TargetMetrics,
    pub metrics: TableMetrics,
    pub common: Arc<Common>,
}

/// What one flight did, for the table's totals and snapshot.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FlightOutcome {
    pub rows: usize,
    pub inserted: usize,
    pub parked: usize,
    pub handed_back: usize,
    pub dlq_failures: usize,
    pub last_error: Option<String>,
    /// Messages naked with some lines settled: those lines need nothing more.
    pub partly: Vec<(u64, Vec<u32>)>,
    /// Whether ClickHouse deduplicates this table's inserts, as the flight found out.
    pub dedup: Option<Dedup>,
    /// The flight lost ClickHouse's connection while ClickHouse was taking inserts:
    /// a strike against each of these messages.
    pub struck: Vec<u64>,
}

/// Where a flight reports: its table; its pool should the table be gone; the root,
/// which knows the pool's successor, should the pool be gone too (a flight outlives
/// the actors that spawned it, and its target's breaker must still hear of it).
pub struct FlightLinks<D> {
    pub table: ActorRef<TableMsg<D>>,
    pub pool: DerivedActorRef<TableReport>,
    pub root: DerivedActorRef<TableReport>,
}

/// Spawn a flight (a tracked task: a shutdown waits for it).
pub fn spawn_flight<I: Inserter, D: Delivery>(
    ctx: Arc<FlightCtx<I>>,
    cargo: Cargo<D>,
    held_since: Instant,
    tickets: Tickets,
    links: FlightLinks<D>,
) {
    let tracker = ctx.common.tracker.clone();
    tracker.spawn(async move {
        let outcome = run_flight(&ctx, cargo, held_since, tickets, &links).await;
        let _ = links.table.cast(TableMsg::FlightDone(outcome));
    });
}

/// Run one flight to the end: every held message is settled when this returns.
pub async fn run_flight<I: Inserter, D: Delivery>(
    ctx: &FlightCtx<I>,
    cargo: Cargo<D>,
    held_since: Instant,
    tickets: Tickets,
    links: &FlightLinks<D>,
) -> FlightOutcome {
    let suspect = cargo.suspect();
    let Formed {
        batch,
        manifest,
        dedup,
        failed,
    } = form(ctx, cargo, held_since).await;
    let n = batch.rows();
    if n == 0 && failed.is_none() {
        // Settled by a record while forming: nothing to send. The tickets go back.
        let verdict = Verdict::Unfinished;
        report(ctx, links, tickets, verdict, false).await;
        return FlightOutcome {
            dedup,
            ..Default::default()
        };
    }
    let mut verdicts = vec![RowVerdict::Pending; n];
    let (verdict, last_error) = match failed {
        Some(verdict) => {
            let text = failure_text(&verdict);
            (verdict, text)
        }
        None => {
            ctx.metrics.batch_rows.record(n as f64);
            judge_or_cancel(ctx, &batch, manifest.as_ref(), &mut verdicts, suspect).await
        }
    };
    // Lost while ClickHouse was taking inserts (not a probe's loss): a strike.
    let struck = match &verdict {
        Verdict::PoolOutage(e) if e.lost_connection() && !tickets.pool.is_probe() => {
            batch.sequences()
        }
        _ => Vec::new(),
    };
    let retry_class = match &verdict {
        Verdict::PoolOutage(e) | Verdict::TableOutage(e) | Verdict::MissingTable(e) => {
            Some(e.class)
        }
        _ => None,
    };
    let store_down = matches!(verdict, Verdict::StoreDown(_));
    let has_pending = verdicts.contains(&RowVerdict::Pending);
    let mut parked_missing = false;
    let mut pending_delay = match report(ctx, links, tickets, verdict, has_pending).await {
        PendingRows::HandBack(delay) => delay,
        PendingRows::Park(reason) => {
            parked_missing = true;
            let reason = Arc::new(reason);
            for v in verdicts.iter_mut().filter(|v| **v == RowVerdict::Pending) {
                *v = RowVerdict::Rejected(reason.clone());
            }
            Duration::ZERO
        }
    };
    if store_down {
        pending_delay = ctx.common.settings.store_retry;
    }
    let mut last_error = last_error;
    if let Some(m) = &manifest {
        crash_if(ctx, Failpoint::CrashAfterInsert, &verdicts);
        if let Err(e) = finish_record(ctx, m, &batch, &mut verdicts).await {
            pending_delay = ctx.common.settings.store_retry;
            last_error = Some(e);
        }
        crash_if(ctx, Failpoint::CrashAfterVerdicts, &verdicts);
    }
    let plan = SettlePlan {
        table: &ctx.key,
        dlq: ctx.settings.dlq,
        cap_delay: ctx.common.settings.pool_backoff.max,
        pending_delay,
        confirm: manifest.is_some(),
    };
    // Only a flight that held every message of its batch knows them all acked; a batch
    // formed again with messages held elsewhere is left to the store's collection.
    let held_all = manifest
        .as_ref()
        .is_some_and(|m| batch.deliveries().count() == m.messages.len());
    let settled = batch.settle(verdicts, &plan).await;
    // A message that went back (a row pending, or rejected and not parked: the DLQ is
    // full) comes again: its batch's record must be there to settle it by, or its
    // inserted rows would go into a new batch (and, after a restart, into ClickHouse
    // again). The collector removes the record once every message is acked.
    let all_acked = settled.confirmed && settled.handed_back == 0;
    if let (Some(m), true, true) = (&manifest, held_all, all_acked) {
        forget_soon(ctx, m);
    }
    count(ctx, &settled, retry_class, parked_missing);
    FlightOutcome {
        rows: n,
        inserted: settled.inserted,
        parked: settled.parked,
        handed_back: settled.handed_back,
        dlq_failures: settled.dlq_failures,
        last_error,
        partly: settled.partly,
        dedup,
        struck,
    }
}

/// The failpoint of the tests: crash here when it is this one and the batch went in.
fn crash_if<I>(ctx: &FlightCtx<I>, at: Failpoint, verdicts: &[RowVerdict]) {
    if ctx.common.settings.failpoint == Some(at) && verdicts.contains(&RowVerdict::Inserted) {
        tracing::error!(tenant = %ctx.key.tenant, table = %ctx.key.table, failpoint = ?at,
            "failpoint: crashing on purpose");
        std::process::abort();
    }
}

fn failure_text(verdict: &Verdict) -> Option<String> {
    match verdict {
        Verdict::PoolOutage(e) | Verdict::TableOutage(e) | Verdict::MissingTable(e) => {
            Some(e.to_string())
        }
        Verdict::StoreDown(e) => Some(format!("manifest store: {e}")),
        _ => None,
    }
}

/// JetStream confirms an ack before it has written it down: a nats-server killed
/// within that moment comes back without the ack and delivers the rows again, and
/// their manifest must still be there to settle them by (not insert them anew). So a
/// manifest whose rows are all settled and confirmed goes a little later (at once when
/// the pipeline shuts down); one left by a failure is collected by the store.
const FORGET_AFTER: Duration = Duration::from_secs(2);

fn forget_soon<I>(ctx: &FlightCtx<I>, m: &Manifest) {
    let Some(store) = ctx.common.manifests.clone() else {
        return;
    };
    let shutdown = ctx.common.shutdown.clone();
    let (id, key) = (m.id.clone(), ctx.key.clone());
    ctx.common.tracker.spawn(async move {
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

/// [`judge`], unless the shutdown deadline cancels it first.
async fn judge_or_cancel<I: Inserter, D: Delivery>(
    ctx: &FlightCtx<I>,
    batch: &Batch<D>,
    manifest: Option<&Manifest>,
    verdicts: &mut [RowVerdict],
    suspect: bool,
) -> (Verdict, Option<String>) {
    let cancel = ctx.common.cancel_flights.clone();
    let judged = tokio::select! {
        biased;
        judged = judge(ctx, batch, manifest, verdicts, suspect) => Some(judged),
        _ = cancel.cancelled() => None,
    };
    judged.unwrap_or_else(|| {
        tracing::info!(tenant = %ctx.key.tenant, table = %ctx.key.table,
            "shutdown deadline: handing back the rows of a flight still running");
        (Verdict::Unfinished, None)
    })
}

/// Insert the batch, isolating rejected rows; fills `verdicts` and says how it ended.
async fn judge<I: Inserter, D: Delivery>(
    ctx: &FlightCtx<I>,
    batch: &Batch<D>,
    manifest: Option<&Manifest>,
    verdicts: &mut [RowVerdict],
    suspect: bool,
) -> (Verdict, Option<String>) {
    let n = batch.rows();
    let revive_within = ctx.common.settings.poison_revive_within;
    let mut iso = Isolation {
        inserter: &*ctx.inserter,
        table: &ctx.key,
        skip_unknown_fields: ctx.settings.skip_unknown_fields,
        metrics: Some(&ctx.target_metrics),
        keepalive: Keepalive::new(ctx.common.settings.ack_wait, batch.held_since()),
        batch,
        manifest,
        suspect: suspect.then_some(revive_within),
    };
    let first = match iso.insert(0, n).await {
        Err(e) if suspect => {
            tracing::warn!(tenant = %ctx.key.tenant, table = %ctx.key.table, rows = n, error = %e,
                "this batch lost ClickHouse's connection again and again while ClickHouse answered in between: isolating it");
            Err(lost_on_rows(&*ctx.inserter, e, revive_within).await)
        }
        answer => answer,
    };
    match first {
        Ok(()) => {
            verdicts.fill(RowVerdict::Inserted);
            (Verdict::Answered, None)
        }
        Err(e) if e.missing_table => {
            let text = e.to_string();
            (Verdict::MissingTable(e), Some(text))
        }
        Err(e) if e.class == Class::Rejected || (e.splittable && n > 1) => {
            let report = bisect(&mut iso, verdicts, e).await;
            match report.stopped_by {
                None => (
                    Verdict::Answered,
                    report.last_rejection.map(|r| r.to_string()),
                ),
                Some(err) => {
                    let text = err.to_string();
                    (outage(err), Some(text))
                }
            }
        }
        Err(e) => {
            let text = e.to_string();
            (outage(e), Some(text))
        }
    }
}

/// The verdict of an answer that stopped a flight short of judging every row.
pub fn outage(e: ClickHouseError) -> Verdict {
    if e.missing_table {
        Verdict::MissingTable(e)
    } else if e.table_scoped {
        Verdict::TableOutage(e)
    } else {
        Verdict::PoolOutage(e)
    }
}

/// Send the verdict to the table (or, when it is gone, the pool's part to the pool);
/// when rows are pending, wait to hear what becomes of them.
async fn report<I, D: Delivery>(
    ctx: &FlightCtx<I>,
    links: &FlightLinks<D>,
    tickets: Tickets,
    verdict: Verdict,
    has_pending: bool,
) -> PendingRows {
    let settings = &ctx.common.settings;
    // Unfinished at the shutdown deadline: back at once, another instance may take them.
    // A batch that could not be recorded: the flight knows its own delay.
    let decided_here = matches!(verdict, Verdict::Unfinished | Verdict::StoreDown(_));
    // Nobody answered: back with the first step of the breaker that would have decided.
    let fallback = PendingRows::HandBack(match &verdict {
        Verdict::TableOutage(_) | Verdict::MissingTable(_) => settings.table_backoff.initial,
        Verdict::Unfinished | Verdict::StoreDown(_) => Duration::ZERO,
        _ => settings.pool_backoff.initial,
    });
    let wants_answer = has_pending && !decided_here;
    let (reply, answer) = if wants_answer {
        let (tx, rx) = ractor::concurrency::oneshot();
        (Some(RpcReplyPort::from(tx)), Some(rx))
    } else {
        (None, None)
    };
    let message = TableMsg::Verdict(FlightVerdict {
        tickets,
        verdict,
        reply,
    });
    if let Err(MessagingErr::SendErr(TableMsg::Verdict(v))) = links.table.cast(message) {
        // The table is gone: its backoff's memory went with it, but the pool's breaker
        // must still hear what its target answered.
        let pool_verdict = v.for_pool();
        let reply = match pool_verdict {
            PoolVerdict::Outage(..) => v.reply,
            _ => None,
        };
        let report = TableReport::Verdict {
            key: ctx.key.clone(),
            verdict: pool_verdict,
            reply,
        };
        if let Err(MessagingErr::SendErr(report)) = links.pool.send_message(report) {
            let _ = links.root.send_message(report);
        }
    }
    let Some(answer) = answer else {
        return fallback;
    };
    match tokio::time::timeout(settings.call_timeout, answer).await {
        Ok(Ok(pending)) => pending,
        _ => fallback,
    }
}

fn count<I>(
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
