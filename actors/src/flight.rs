//! The flight: one batch, run as a task the TableActor spawns once its own backoff and
//! its pool both let it go. It owns its messages until each is settled, even if the
//! actor dies meanwhile: it forms the batch through the ledger (claimed in the store
//! first, for a table that deduplicates), inserts, isolates rejected rows (recording
//! each split before sending its parts), sends its verdict to its table (which settles
//! its own backoff and passes the pool's part on), learns what becomes of the rows it
//! could not settle, records the verdicts, settles every message and reports its counts.
//!
//! A flight decides nothing about windows: it reports what ClickHouse answered, and the
//! owners of the breakers decide. It decides nothing about which batch a message
//! belongs to either: the table's ledger did, and the store answers the rest.

pub mod bisect;
mod judge;
mod prepare;
mod report;
mod settle;
pub mod split_parts;
pub mod turn;

use self::judge::{cut_off_at_deadline, judge, take_turn, unless_cut_off, Judging};
use self::prepare::prepare;
use self::report::report;
use self::settle::{count, failure_text, record_verdicts, settle, struck_rows};
use crate::batch::{Batch, RowVerdict, SettlePlan};
use crate::context::Common;
use crate::ledger::session::{Judged, LedgerSession};
use crate::ledger::split::RowRange;
use crate::ledger::LedgerRefusal;
use crate::metrics::TableMetrics;
use crate::observe::flight_watch::FlightWatch;
use crate::observe::FlightStage;
use crate::placement::{Replica, TargetServers};
use crate::ports::{Delivery, Inserter, TableKey};
use crate::protocol::Suspicion;
use crate::protocol::{Cargo, FlightLink, FlightReport};
use crate::protocol::{FlightOutcome, Tickets, Verdict};
use crate::protocol::{PoolLink, TableReport};
use crate::restart::panic_message;
use crate::settings::TableSettings;
use futures::FutureExt as _;
use ractor::DerivedActorRef;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// What every flight of one table needs.
pub struct FlightCtx<I> {
    /// The target's servers: a flight goes to one of them (its tickets say which).
    pub servers: Arc<TargetServers<I>>,
    pub key: TableKey,
    pub settings: TableSettings,
    pub metrics: TableMetrics,
    pub common: Arc<Common>,
}

impl<I> FlightCtx<I> {
    /// How this table's rows are settled: `pending_delay` for the rows that go back.
    fn plan(&self, pending_delay: Duration, confirm: bool) -> SettlePlan<'_> {
        SettlePlan {
            table: &self.key,
            dlq: self.settings.dlq,
            cap_delay: self.common.settings.pool_backoff.max,
            pending_delay,
            confirm,
        }
    }
}

/// Where a flight reports: its table; the pool of its replica should the table be
/// gone; the target, which knows the pool's successor, should the pool be gone too;
/// the root, which knows the target's, should the target be gone as well (a flight
/// outlives the actors that spawned it, and its replica's breaker must still hear of
/// it).
pub struct FlightLinks {
    pub table: FlightLink,
    pub pool: Option<PoolLink>,
    pub target: DerivedActorRef<TableReport>,
    pub root: DerivedActorRef<TableReport>,
}

/// Spawn a flight (a tracked task: a shutdown waits for it). `messages`: the stream
/// sequences `cargo` holds, told back to the table with the outcome (its ledger keeps
/// a second copy of them from flying meanwhile).
pub fn spawn_flight<I: Inserter, D: Delivery>(
    ctx: Arc<FlightCtx<I>>,
    cargo: Cargo<D>,
    messages: Vec<u64>,
    held_since: Instant,
    tickets: Tickets,
    links: FlightLinks,
    watch: Arc<FlightWatch>,
) {
    let tracker = ctx.common.tracker.clone();
    tracker.spawn(async move {
        let flight = run_flight(&ctx, cargo, held_since, tickets, &links, &watch);
        let mut outcome = match AssertUnwindSafe(flight).catch_unwind().await {
            Ok(outcome) => outcome,
            Err(panic) => {
                let text = panic_message(panic.as_ref()).unwrap_or_else(|| "a panic".into());
                after_a_panic(&ctx, &links, tickets, &watch, text).await
            }
        };
        // Before the table hears it is done, so the table no longer counts it.
        drop(watch);
        outcome.messages = messages;
        let _ = links.table.send_message(FlightReport::Done(outcome));
    });
}

/// A flight that panicked (a bug) must not stop its table: the table counts a flight
/// done only when it hears so, and keeps the messages of a flight out from flying
/// again. So it hears: the messages the flight held were dropped with it (a dropped
/// delivery is naked, and comes again), and the breakers' tickets go back when the
/// flight had not reported yet. The panic itself is logged by the panic hook.
async fn after_a_panic<I: Inserter>(
    ctx: &FlightCtx<I>,
    links: &FlightLinks,
    tickets: Tickets,
    watch: &FlightWatch,
    text: String,
) -> FlightOutcome {
    let stage = watch.stage();
    tracing::error!(tenant = %ctx.key.tenant, table = %ctx.key.table, stage = stage.as_str(), panic = %text,
        "a flight panicked: the rows it held go back to JetStream, and the table goes on");
    if stage.before(FlightStage::Reporting) {
        report(ctx, links, tickets, Verdict::Unfinished, false).await;
    }
    FlightOutcome {
        last_error: Some(format!(
            "a flight panicked while {}: {text}",
            stage.as_str()
        )),
        ..Default::default()
    }
}

/// How a batch is sent.
enum Attempt {
    /// Whole first (an unrecorded batch, or a recorded one still open).
    Whole,
    /// A recorded split, resumed from its untried ranges (verdicts pre-filled).
    Resume(Vec<RowRange>),
}

/// What a flight has once its cargo is formed.
enum Prepared<D> {
    /// A batch to send.
    Send {
        batch: Batch<D>,
        /// Its hold on its record (a no-op for a batch that is not recorded).
        session: LedgerSession,
        attempt: Attempt,
        verdicts: Vec<RowVerdict>,
    },
    /// A batch that cannot be sent now: every row goes back under `verdict`.
    Failed { batch: Batch<D>, verdict: Verdict },
    /// Nothing to send: the messages were settled without an insert.
    Nothing,
}

/// What a flight's sending came to: the rows' verdicts, and how it ended.
struct Flown<D> {
    batch: Batch<D>,
    session: LedgerSession,
    verdicts: Vec<RowVerdict>,
    verdict: Verdict,
    last_error: Option<String>,
    /// The ranges an isolation had not judged when it stopped.
    untried: Vec<RowRange>,
}

/// Run one flight to the end: every held message is settled when this returns.
pub async fn run_flight<I: Inserter, D: Delivery>(
    ctx: &FlightCtx<I>,
    cargo: Cargo<D>,
    held_since: Instant,
    tickets: Tickets,
    links: &FlightLinks,
    watch: &FlightWatch,
) -> FlightOutcome {
    let suspicion = cargo.suspicion();
    let replica = ctx.servers.replica(tickets.replica);
    let formation = prepare(ctx, replica, cargo, held_since).await;
    let (dedup, past_dedup_window) = (formation.dedup, formation.past_dedup_window);
    let Some(flown) = fly(
        ctx,
        replica,
        formation.prepared,
        links.pool.as_ref(),
        suspicion,
        watch,
    )
    .await
    else {
        // Settled by a record (counted when its batch was), or nothing left: the tickets
        // go back.
        watch.enter(FlightStage::Reporting);
        report(ctx, links, tickets, Verdict::Unfinished, false).await;
        return FlightOutcome {
            dedup,
            past_dedup_window,
            ..Default::default()
        };
    };
    let Flown {
        batch,
        mut session,
        mut verdicts,
        verdict,
        mut last_error,
        untried,
    } = flown;
    let struck = struck_rows(&batch, &verdict, tickets, suspicion);
    let retry_class = verdict.retry_class();
    let unsent = matches!(verdict, Verdict::Unsent(_));
    watch.enter(FlightStage::Reporting);
    let has_pending = verdicts.contains(&RowVerdict::Pending);
    let pending = report(ctx, links, tickets, verdict, has_pending).await;
    let (mut pending_delay, parked_missing) = pending.apply(&mut verdicts);
    if unsent {
        pending_delay = ctx.common.settings.store_retry;
    }
    watch.enter(FlightStage::Recording);
    let judged = record_verdicts(ctx, &mut session, &batch, &mut verdicts, untried).await;
    if let Err(why) = &judged {
        pending_delay = ctx.common.settings.store_retry;
        last_error = Some(why.to_string());
    }
    let judged = judged.unwrap_or(Judged::Partly);
    let recorded = session.record().is_some();
    let rows = batch.rows();
    let plan = ctx.plan(pending_delay, recorded);
    let settled = settle(ctx, batch, verdicts, session, judged, &plan, watch).await;
    count(ctx, &settled, retry_class, parked_missing);
    FlightOutcome {
        rows,
        inserted: settled.inserted,
        parked: settled.parked,
        handed_back: settled.handed_back,
        dlq_failures: settled.dlq_failures,
        last_error,
        partly: if recorded { Vec::new() } else { settled.partly },
        dedup,
        struck,
        past_dedup_window,
        // Told by `spawn_flight`, which knows them from before the cargo was formed.
        messages: Vec::new(),
    }
}

/// Send what was prepared: its turn at the server, its attempt marked in its record,
/// the insert and any isolation. `None`: nothing to send.
async fn fly<I: Inserter, D: Delivery>(
    ctx: &FlightCtx<I>,
    replica: &Replica<I>,
    prepared: Prepared<D>,
    pool: Option<&PoolLink>,
    suspicion: Suspicion,
    watch: &FlightWatch,
) -> Option<Flown<D>> {
    let (batch, mut session, attempt, mut verdicts) = match prepared {
        Prepared::Nothing => return None,
        Prepared::Failed { batch, verdict } => return Some(unsent(batch, verdict)),
        Prepared::Send {
            batch,
            session,
            attempt,
            verdicts,
        } => (batch, session, attempt, verdicts),
    };
    if let Err(why) = session.mark_attempt().await {
        ctx.refused(&why);
        return Some(unsent(batch, Verdict::Unsent(why)));
    }
    ctx.metrics.batch_rows.record(batch.rows() as f64);
    watch.enter(FlightStage::WaitingTurn);
    let (verdict, last_error, untried) =
        match take_turn(ctx, replica, pool, &batch, suspicion).await {
            Some(at) => {
                watch.enter(FlightStage::Inserting);
                let how = Judging {
                    session: &mut session,
                    attempt,
                    at,
                };
                let judging = judge(ctx, replica, &batch, &mut verdicts, how);
                unless_cut_off(ctx, judging)
                    .await
                    .unwrap_or_else(|| cut_off_at_deadline(ctx))
            }
            None => (Verdict::Unfinished, None, Vec::new()),
        };
    Some(Flown {
        batch,
        session,
        verdicts,
        verdict,
        last_error,
        untried,
    })
}

/// A batch not sent: every row pending under `verdict`.
fn unsent<D: Delivery>(batch: Batch<D>, verdict: Verdict) -> Flown<D> {
    Flown {
        verdicts: vec![RowVerdict::Pending; batch.rows()],
        last_error: failure_text(&verdict),
        batch,
        session: LedgerSession::unrecorded(),
        verdict,
        untried: Vec::new(),
    }
}

impl<I> FlightCtx<I> {
    /// A batch the ledger did not let go: counted as a store failure only when the
    /// store failed (a conflict, a batch recorded elsewhere meanwhile are decisions).
    fn refused(&self, why: &LedgerRefusal) {
        if why.is_store_failure() {
            self.metrics.manifest_failures.increment(1);
        }
    }
}
