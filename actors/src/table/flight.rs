//! The flight: one batch, run as a task the TableActor spawns once its own backoff and
//! its pool both let it go. It owns its rows until each is settled, even if the actor
//! dies meanwhile: it inserts, isolates rejected rows, sends its verdict to its table
//! (which settles its own backoff and passes the pool's part on), gets back the delay
//! for the rows an outage leaves pending, settles every row, and reports its counts.
//!
//! A flight decides nothing about windows: it reports what ClickHouse answered, and the
//! owners of the breakers decide.

use std::sync::Arc;
use std::time::Duration;

use ractor::{ActorRef, DerivedActorRef, MessagingErr, RpcReplyPort};

use super::messages::{TableMsg, TableReport};
use crate::batch::{Batch, RowVerdict, SettlePlan, Settled};
use crate::bisect::{bisect, Isolation};
use crate::breaker::Ticket;
use crate::context::Common;
use crate::keepalive::Keepalive;
use crate::metrics::{retry_reason, TableMetrics, TargetMetrics};
use crate::ports::{Class, Delivery, InsertError, Inserter, TableKey};
use crate::settings::TableSettings;

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

/// The permissions a flight went with: the pool's (outage breaker) and the table's own
/// (table backoff). Either may be its owner's probe.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tickets {
    pub pool: Ticket,
    pub table: Ticket,
}

/// How a flight ended, as the breakers see it.
#[derive(Clone, Debug, PartialEq)]
pub enum Verdict {
    /// ClickHouse answered: a success, or rows judged (rejected). Closes a probe's window.
    Answered,
    /// The target could not take it: the pool's breaker opens or escalates.
    PoolOutage(InsertError),
    /// This table could not take it (read-only, too many parts, a missing grant): its
    /// own backoff opens; the pool's target answered.
    TableOutage(InsertError),
    /// The table (or its database) does not exist: the same for every row. The table
    /// waits for it (its own backoff) for `missing_table_grace`, then parks.
    MissingTable(InsertError),
    /// Nothing to judge by (cancelled at the shutdown deadline): tokens go back.
    Unfinished,
}

/// What becomes of a flight's pending rows, as the owner of the breaker that sent them
/// back decides.
#[derive(Clone, Debug, PartialEq)]
pub enum PendingRows {
    /// Back to the queue, delivered again after this delay.
    HandBack(Duration),
    /// Parked, with this reason (a table still missing after its grace).
    Park(InsertError),
}

/// The pool's part of a verdict, with the pool's ticket.
#[derive(Clone, Debug, PartialEq)]
pub enum PoolVerdict {
    Answered(Ticket),
    Outage(Ticket, InsertError),
    Unfinished(Ticket),
}

/// A flight's verdict for its table. When rows are pending, `reply` gets what becomes
/// of them.
pub struct FlightVerdict {
    pub tickets: Tickets,
    pub verdict: Verdict,
    pub reply: Option<RpcReplyPort<PendingRows>>,
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
}

/// Where a flight reports: its table; its pool should the table be gone; the root,
/// which knows the pool's successor, should the pool be gone too (a flight outlives
/// the actors that spawned it, and its target's breaker must still hear of it).
pub struct FlightLinks<D> {
    pub table: ActorRef<TableMsg<D>>,
    pub pool: DerivedActorRef<TableReport>,
    pub root: DerivedActorRef<TableReport>,
}

// === impl FlightVerdict ===

impl FlightVerdict {
    /// The pool's part: what the table forwards, or the flight sends itself when its
    /// table is gone.
    pub fn for_pool(&self) -> PoolVerdict {
        let t = self.tickets.pool;
        match &self.verdict {
            Verdict::Answered | Verdict::TableOutage(_) | Verdict::MissingTable(_) => {
                PoolVerdict::Answered(t)
            }
            Verdict::PoolOutage(e) => PoolVerdict::Outage(t, e.clone()),
            Verdict::Unfinished => PoolVerdict::Unfinished(t),
        }
    }
}

/// Spawn a flight (a tracked task: a shutdown waits for it).
pub fn spawn_flight<I: Inserter, D: Delivery>(
    ctx: Arc<FlightCtx<I>>,
    batch: Batch<D>,
    tickets: Tickets,
    links: FlightLinks<D>,
) {
    let tracker = ctx.common.tracker.clone();
    tracker.spawn(async move {
        let outcome = run_flight(&ctx, batch, tickets, &links).await;
        let _ = links.table.cast(TableMsg::FlightDone(outcome));
    });
}

/// Run one flight to the end: every row of `batch` is settled when this returns.
pub async fn run_flight<I: Inserter, D: Delivery>(
    ctx: &FlightCtx<I>,
    batch: Batch<D>,
    tickets: Tickets,
    links: &FlightLinks<D>,
) -> FlightOutcome {
    let n = batch.rows();
    ctx.metrics.batch_rows.record(n as f64);
    let mut verdicts = vec![RowVerdict::Pending; n];
    let cancel = ctx.common.cancel_flights.clone();
    let judged = tokio::select! {
        biased;
        judged = judge(ctx, &batch, &mut verdicts) => Some(judged),
        _ = cancel.cancelled() => None,
    };
    let (verdict, last_error) = judged.unwrap_or_else(|| {
        tracing::info!(tenant = %ctx.key.tenant, table = %ctx.key.table,
            "shutdown deadline: handing back the rows of a flight still running");
        (Verdict::Unfinished, None)
    });
    let has_pending = verdicts.contains(&RowVerdict::Pending);
    let retry_class = match &verdict {
        Verdict::PoolOutage(e) | Verdict::TableOutage(e) | Verdict::MissingTable(e) => {
            Some(e.class)
        }
        _ => None,
    };
    let pending_delay = match report(ctx, links, tickets, verdict, has_pending).await {
        PendingRows::HandBack(delay) => delay,
        PendingRows::Park(reason) => {
            let reason = Arc::new(reason);
            for v in verdicts.iter_mut().filter(|v| **v == RowVerdict::Pending) {
                *v = RowVerdict::Rejected(reason.clone());
            }
            Duration::ZERO
        }
    };
    let plan = SettlePlan {
        table: &ctx.key,
        dlq: ctx.settings.dlq,
        cap_delay: ctx.common.settings.pool_backoff.max,
        pending_delay,
    };
    let settled = batch.settle(verdicts, &plan).await;
    count(ctx, &settled, retry_class);
    FlightOutcome {
        rows: n,
        inserted: settled.inserted,
        parked: settled.parked,
        handed_back: settled.handed_back,
        dlq_failures: settled.dlq_failures,
        last_error,
    }
}

/// Insert the batch, isolating rejected rows; fills `verdicts` and says how it ended.
async fn judge<I: Inserter, D: Delivery>(
    ctx: &FlightCtx<I>,
    batch: &Batch<D>,
    verdicts: &mut [RowVerdict],
) -> (Verdict, Option<String>) {
    let n = batch.rows();
    let mut iso = Isolation {
        inserter: &*ctx.inserter,
        table: &ctx.key,
        skip_unknown_fields: ctx.settings.skip_unknown_fields,
        metrics: Some(&ctx.target_metrics),
        keepalive: Keepalive::new(ctx.common.settings.ack_wait, batch.held_since()),
        batch,
    };
    match iso.insert(0, n).await {
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
fn outage(e: InsertError) -> Verdict {
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
    let unfinished = verdict == Verdict::Unfinished;
    // Nobody answered: back with the first step of the breaker that would have decided.
    let fallback = PendingRows::HandBack(match &verdict {
        Verdict::TableOutage(_) | Verdict::MissingTable(_) => settings.table_backoff.initial,
        Verdict::Unfinished => Duration::ZERO,
        _ => settings.pool_backoff.initial,
    });
    let wants_delay = has_pending && !unfinished;
    let (reply, answer) = if wants_delay {
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

fn count<I>(ctx: &FlightCtx<I>, settled: &Settled, retry_class: Option<Class>) {
    let m = &ctx.metrics;
    let stats = &ctx.common.stats;
    if settled.inserted > 0 {
        m.inserted.increment(settled.inserted as u64);
        stats.inserted(settled.inserted);
    }
    if settled.parked > 0 {
        m.parked_rejected.increment(settled.parked as u64);
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
