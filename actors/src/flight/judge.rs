//! The flight at its server: its turn (a suspect's alone), the insert, the isolation
//! of rejected rows, each cut short at the shutdown deadline; what it all came to.

use super::{Attempt, FlightCtx};
use crate::batch::keepalive::Keepalive;
use crate::batch::{Batch, RowVerdict};
use crate::flight::bisect::{bisect, lost_on_rows, resume, Isolation};
use crate::flight::turn::{self, Turn};
use crate::ledger::session::LedgerSession;
use crate::ledger::split::RowRange;
use crate::placement::Replica;
use crate::ports::{Class, Delivery, Inserter};
use crate::protocol::PoolLink;
use crate::protocol::Suspicion;
use crate::protocol::{outage, Verdict};

/// A flight's turn at its server, and the keepalive of its rows, held while it talks
/// to the server.
pub(super) struct AtServer {
    turn: Turn,
    keepalive: Keepalive,
    /// Whether a connection lost alone judges the batch's rows.
    suspicion: Suspicion,
}

/// Wait for the flight's turn at `replica`, granted by its pool (a suspect's flies
/// alone: see `turn`), keeping its rows alive meanwhile; `None` when the shutdown
/// deadline came first, or a suspect's pool could not grant one.
pub(super) async fn take_turn<I: Inserter, D: Delivery>(
    ctx: &FlightCtx<I>,
    replica: &Replica<I>,
    pool: Option<&PoolLink>,
    batch: &Batch<D>,
    suspicion: Suspicion,
) -> Option<AtServer> {
    let mut keepalive = Keepalive::new(ctx.common.settings.ack_wait, batch.held_since());
    let waiting = keepalive.run(turn::take(pool, suspicion.flies_alone()), batch);
    let turn = unless_cut_off(ctx, waiting).await.flatten()?;
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
pub(super) struct Judging<'s> {
    pub(super) session: &'s mut LedgerSession,
    pub(super) attempt: Attempt,
    pub(super) at: AtServer,
}

/// `work`, unless the shutdown deadline cancels the flights first (`None`): whatever a
/// flight awaits of its server (a lookup, its turn, an insert) must not keep its rows
/// past the deadline, since they are handed back only once it lets them go.
pub(super) async fn unless_cut_off<I, T>(
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

/// What a flight still judging comes to when the shutdown deadline cuts it off: its
/// rows are handed back, nothing judged.
pub(super) fn cut_off_at_deadline<I>(
    ctx: &FlightCtx<I>,
) -> (Verdict, Option<String>, Vec<RowRange>) {
    tracing::info!(tenant = %ctx.key.tenant, table = %ctx.key.table,
        "shutdown deadline: handing back the rows of a flight still running");
    (Verdict::Unfinished, None, Vec::new())
}

/// Insert the batch into `replica` (or resume its recorded split), isolating rejected
/// rows; fills `verdicts` and says how it ended: the verdict, the last error's text and,
/// when the isolation stopped short, the ranges it had not judged. Run under
/// [`unless_cut_off`], with [`cut_off_at_deadline`] what a cut-off flight comes to.
pub(super) async fn judge<I: Inserter, D: Delivery>(
    ctx: &FlightCtx<I>,
    replica: &Replica<I>,
    batch: &Batch<D>,
    verdicts: &mut [RowVerdict],
    how: Judging<'_>,
) -> (Verdict, Option<String>, Vec<RowRange>) {
    let n = batch.rows();
    let revive_within = ctx.common.settings.poison_revive_within;
    // Held to the end: a suspect flies alone, and only then, the second time, is a lost
    // connection its rows' doing (see `Suspicion`).
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
