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

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt as _;
use ractor::{ActorRef, DerivedActorRef, MessagingErr, RpcReplyPort};
use tokio::time::Instant;

use super::flight_watch::FlightWatch;
use super::messages::{FlightRequest, PoolLink, TableMsg, TableReport, VerdictReport};
use super::split_parts::keep_counted;
use super::verdict::{
    outage, FlightOutcome, FlightVerdict, PendingRows, PoolVerdict, Tickets, Verdict,
};
use crate::batch::{Batch, RowVerdict, SettlePlan, Settled};
use crate::bisect::{bisect, lost_on_rows, resume, Isolation};
use crate::context::Common;
use crate::keepalive::Keepalive;
use crate::ledger::forming::Formed;
use crate::ledger::session::{Judged, LedgerSession};
use crate::ledger::split::RowRange;
use crate::ledger::{Cargo, LedgerRefusal, Manifest};
use crate::metrics::{retry_reason, TableMetrics};
use crate::observe::FlightStage;
use crate::placement::{Replica, TargetServers};
use crate::ports::{Class, Dedup, Delivery, Inserter, TableKey};
use crate::restart::panic_message;
use crate::settings::{Failpoint, TableSettings};
use crate::settle::hand_back;
use crate::solo::{Suspicion, Turn};

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
pub struct FlightLinks<D> {
    pub table: ActorRef<TableMsg<D>>,
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
    links: FlightLinks<D>,
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
        let _ = links.table.cast(TableMsg::FlightDone(outcome));
    });
}

/// A flight that panicked (a bug) must not stop its table: the table counts a flight
/// done only when it hears so, and keeps the messages of a flight out from flying
/// again. So it hears: the messages the flight held were dropped with it (a dropped
/// delivery is naked, and comes again), and the breakers' tickets go back when the
/// flight had not reported yet. The panic itself is logged by the panic hook.
async fn after_a_panic<I: Inserter, D: Delivery>(
    ctx: &FlightCtx<I>,
    links: &FlightLinks<D>,
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
    links: &FlightLinks<D>,
    watch: &FlightWatch,
) -> FlightOutcome {
    let suspicion = cargo.suspicion();
    let replica = ctx.servers.replica(tickets.replica);
    let formation = prepare(ctx, replica, cargo, held_since).await;
    let (dedup, past_dedup_window) = (formation.dedup, formation.past_dedup_window);
    let Some(flown) = fly(ctx, replica, formation.prepared, suspicion, watch).await else {
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
    let (verdict, last_error, untried) = match take_turn(ctx, replica, &batch, suspicion).await {
        Some(at) => {
            watch.enter(FlightStage::Inserting);
            let how = Judging {
                session: &mut session,
                attempt,
                at,
            };
            judge_or_cancel(ctx, replica, &batch, &mut verdicts, how).await
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

/// Lost while ClickHouse was taking inserts (not a probe's loss), or lost alone (a
/// suspect's flight is the probe as often as not): a strike on the batch's messages.
fn struck_rows<D: Delivery>(
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
async fn record_verdicts<I, D: Delivery>(
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
async fn settle<I, D: Delivery>(
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
        session.release(&ctx.common.tracker, &ctx.common.shutdown, &ctx.key);
    }
    settled
}

/// What forming a cargo made, and what the flight learnt on the way.
struct Formation<D> {
    prepared: Prepared<D>,
    /// Whether ClickHouse deduplicates the table, when the flight asked.
    dedup: Option<Dedup>,
    /// A recorded batch formed again past the table's deduplication window.
    past_dedup_window: bool,
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
async fn prepare<I: Inserter, D: Delivery>(
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

fn unrecorded<D: Delivery>(
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
async fn past_window<I: Inserter>(ctx: &FlightCtx<I>, replica: &Replica<I>, m: &Manifest) -> bool {
    let Some(age) = m.age(crate::ledger::forming::unix_ms()) else {
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
async fn settle_formed<I, D: Delivery>(
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
fn recorded_batch<I, D: Delivery>(
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

impl<I> FlightCtx<I> {
    /// A batch the ledger did not let go: counted as a store failure only when the
    /// store failed (a conflict, a batch recorded elsewhere meanwhile are decisions).
    fn refused(&self, why: &LedgerRefusal) {
        if why.is_store_failure() {
            self.metrics.manifest_failures.increment(1);
        }
    }
}

/// Messages that must not go into this batch: back to the queue for a moment, to come
/// again as what they are.
fn back_for_now<I, D: Delivery>(ctx: &FlightCtx<I>, messages: Vec<D>) {
    hand_back(&ctx.common, None, messages, ctx.common.settings.store_retry);
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
        Verdict::Unsent(why) => Some(why.to_string()),
        _ => None,
    }
}

/// A flight's turn at its server, and the keepalive of its rows, held while it talks
/// to the server.
struct AtServer {
    turn: Turn,
    keepalive: Keepalive,
    /// Whether a connection lost alone judges the batch's rows.
    suspicion: Suspicion,
}

/// Wait for the flight's turn at `replica` (a suspect's flies alone: see `solo`),
/// keeping its rows alive meanwhile; `None` when the shutdown deadline came first.
async fn take_turn<I: Inserter, D: Delivery>(
    ctx: &FlightCtx<I>,
    replica: &Replica<I>,
    batch: &Batch<D>,
    suspicion: Suspicion,
) -> Option<AtServer> {
    let mut keepalive = Keepalive::new(ctx.common.settings.ack_wait, batch.held_since());
    let waiting = keepalive.run(replica.solo.turn(suspicion.flies_alone()), batch);
    let turn = unless_cut_off(ctx, waiting).await?;
    if suspicion.flies_alone() {
        tracing::info!(tenant = %ctx.key.tenant, table = %ctx.key.table, rows = batch.rows(), replica = %replica.name,
            "a batch suspected of crashing ClickHouse flies alone");
    }
    Some(AtServer {
        turn,
        keepalive,
        suspicion,
    })
}

/// How a batch is judged: its record, how it is sent, its turn at the server.
struct Judging<'s> {
    session: &'s mut LedgerSession,
    attempt: Attempt,
    at: AtServer,
}

/// `work`, unless the shutdown deadline cancels the flights first (`None`): whatever a
/// flight awaits of its server (a lookup, its turn, an insert) must not keep its rows
/// past the deadline, since they are handed back only once it lets them go.
async fn unless_cut_off<I, T>(
    ctx: &FlightCtx<I>,
    work: impl std::future::Future<Output = T>,
) -> Option<T> {
    let cancel = ctx.common.cancel_flights.clone();
    tokio::select! {
        biased;
        done = work => Some(done),
        _ = cancel.cancelled() => None,
    }
}

/// [`judge`], unless the shutdown deadline cancels it first. Returns the verdict, the
/// last error's text and, when the isolation stopped short, the ranges it had not
/// judged.
async fn judge_or_cancel<I: Inserter, D: Delivery>(
    ctx: &FlightCtx<I>,
    replica: &Replica<I>,
    batch: &Batch<D>,
    verdicts: &mut [RowVerdict],
    how: Judging<'_>,
) -> (Verdict, Option<String>, Vec<RowRange>) {
    let judging = judge(ctx, replica, batch, verdicts, how);
    unless_cut_off(ctx, judging).await.unwrap_or_else(|| {
        tracing::info!(tenant = %ctx.key.tenant, table = %ctx.key.table,
            "shutdown deadline: handing back the rows of a flight still running");
        (Verdict::Unfinished, None, Vec::new())
    })
}

/// Insert the batch into `replica` (or resume its recorded split), isolating rejected
/// rows; fills `verdicts` and says how it ended.
async fn judge<I: Inserter, D: Delivery>(
    ctx: &FlightCtx<I>,
    replica: &Replica<I>,
    batch: &Batch<D>,
    verdicts: &mut [RowVerdict],
    how: Judging<'_>,
) -> (Verdict, Option<String>, Vec<RowRange>) {
    let n = batch.rows();
    let revive_within = ctx.common.settings.poison_revive_within;
    // Held to the end: a suspect flies alone, and only then, the second time, is a lost
    // connection its rows' doing (see `solo::Suspicion`).
    let Judging {
        session,
        attempt,
        at: AtServer {
            turn,
            keepalive,
            suspicion,
        },
    } = how;
    let judged_if_lost = turn.is_alone() && suspicion == Suspicion::IsolatedIfLostAlone;
    // An availability answer (too many parts, memory) to a batch someone may have sent
    // before is no proof its rows are not in: it is waited out whole, never split.
    let may_split_whole = session.whole_never_sent();
    let mut iso = Isolation {
        inserter: &*replica.inserter,
        table: &ctx.key,
        skip_unknown_fields: ctx.settings.skip_unknown_fields,
        metrics: Some(&replica.metrics),
        keepalive,
        batch,
        record: session,
        suspect: judged_if_lost.then_some(revive_within),
    };
    let report = match attempt {
        Attempt::Resume(untried) => resume(&mut iso, verdicts, &untried).await,
        Attempt::Whole => {
            let first = match iso.insert(0, n).await {
                // A refusal or a timeout carried no insert to crash on: only a
                // connection lost while alone is weighed against the rows.
                Err(e) if judged_if_lost && e.lost_connection() => {
                    tracing::warn!(tenant = %ctx.key.tenant, table = %ctx.key.table, rows = n, error = %e,
                        "this batch lost ClickHouse's connection again and again, alone too, while ClickHouse answered in between: isolating it");
                    Err(lost_on_rows(&*replica.inserter, e, revive_within).await)
                }
                Err(e) if turn.is_alone() && e.lost_connection() => {
                    tracing::warn!(tenant = %ctx.key.tenant, table = %ctx.key.table, rows = n, error = %e,
                        "a batch suspected of crashing ClickHouse lost its connection alone: it is isolated if that happens again (an earlier attempt may have gone in before a crash)");
                    Err(e)
                }
                answer => answer,
            };
            match first {
                Ok(()) => {
                    verdicts.fill(RowVerdict::Inserted);
                    return (Verdict::Answered, None, Vec::new());
                }
                Err(e) if e.missing_table => {
                    let text = e.to_string();
                    return (Verdict::MissingTable(e), Some(text), Vec::new());
                }
                Err(e)
                    if e.class == Class::Rejected || (e.splittable && n > 1 && may_split_whole) =>
                {
                    bisect(&mut iso, verdicts, e).await
                }
                Err(e) => {
                    let text = e.to_string();
                    return (outage(e), Some(text), Vec::new());
                }
            }
        }
    };
    if let Some(why) = report.store_failed {
        ctx.refused(&why);
        let text = why.to_string();
        return (Verdict::Unsent(why), Some(text), report.untried);
    }
    match report.stopped_by {
        None => (
            Verdict::Answered,
            report.last_rejection.map(|r| r.to_string()),
            Vec::new(),
        ),
        Some(err) => {
            let text = err.to_string();
            (outage(err), Some(text), report.untried)
        }
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
    // A batch the ledger did not let go: the flight knows its own delay.
    let decided_here = matches!(verdict, Verdict::Unfinished | Verdict::Unsent(_));
    // Nobody answered: back with the first step of the breaker that would have decided.
    let fallback = PendingRows::HandBack(match &verdict {
        Verdict::TableOutage(_) | Verdict::MissingTable(_) => settings.table_backoff.initial,
        Verdict::Unfinished | Verdict::Unsent(_) => Duration::ZERO,
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
        // The table is gone: its backoff's memory went with it, but the replica's
        // breaker must still hear what the server answered.
        let pool_verdict = v.for_pool();
        let reply = match pool_verdict {
            PoolVerdict::Outage(..) => v.reply,
            _ => None,
        };
        orphan_report(
            links,
            VerdictReport {
                key: ctx.key.clone(),
                replica: tickets.replica,
                verdict: pool_verdict,
                reply,
            },
        );
    }
    let Some(answer) = answer else {
        return fallback;
    };
    match tokio::time::timeout(settings.call_timeout, answer).await {
        Ok(Ok(pending)) => pending,
        _ => fallback,
    }
}

/// A verdict whose table is gone: to the replica's pool, or (restarting) the target,
/// or (the target restarting too) the root, which each hand it on to the successor.
fn orphan_report<D>(links: &FlightLinks<D>, report: VerdictReport) {
    let report = match &links.pool {
        Some(pool) => match pool.send_message(FlightRequest::Verdict(Box::new(report))) {
            Ok(()) => return,
            Err(MessagingErr::SendErr(FlightRequest::Verdict(report))) => *report,
            Err(_) => return,
        },
        None => report,
    };
    if let Err(MessagingErr::SendErr(report)) =
        links.target.send_message(TableReport::Verdict(report))
    {
        let _ = links.root.send_message(report);
    }
}

/// A recorded batch goes to a replica of the shard its record names (modulo the
/// shards there are: a target with fewer shards than when the batch was recorded sends
/// it to shard `recorded mod shards`, where it is not deduplicated against its first
/// attempt). The table picked such a replica; anything else is refused, never sent.
fn on_its_shard<I, D: Delivery>(
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
