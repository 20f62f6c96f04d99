//! The flush task: one batch, spawned by the TableActor, which owns its rows until each
//! is settled — even if the actor dies meanwhile. It inserts, isolates rejected rows,
//! acks / parks / naks, reports the outcome straight into the pool's breaker and the
//! table's backoff (shared [`Gate`]s), then tells the actor (if still alive).

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::bisect::{bisect, build_body, Isolation};
use crate::context::{Common, Stats};
use crate::gate::{Gate, GatePass};
use crate::keepalive::Keepalive;
use crate::metrics::{retry_reason, TableMetrics, TargetMetrics};
use crate::ports::{Class, Delivery, InsertError, Inserter, TableKey};
use crate::settings::TableSettings;

/// What a flush task needs; one per table, shared by its flights.
pub struct FlightCtx<I> {
    pub inserter: Arc<I>,
    pub key: TableKey,
    pub settings: TableSettings,
    pub pool_gate: Arc<Gate>,
    pub table_gate: Arc<Gate>,
    pub target: TargetMetrics,
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
}

/// Spawn a flight; `done` gets its outcome once every row is settled.
pub fn spawn_flight<I: Inserter, D: Delivery>(
    ctx: Arc<FlightCtx<I>>,
    batch: Vec<D>,
    held_since: Instant,
    pool: GatePass,
    table: GatePass,
    done: impl FnOnce(FlightOutcome) + Send + 'static,
) {
    let guard = ctx.common.tracker.enter();
    tokio::spawn(async move {
        let _guard = guard;
        let out = run_flight(&ctx, batch, held_since, pool, table).await;
        done(out);
    });
}

/// Run one flight to the end: every row of `batch` is settled when this returns.
pub async fn run_flight<I: Inserter, D: Delivery>(
    ctx: &FlightCtx<I>,
    batch: Vec<D>,
    held_since: Instant,
    pool: GatePass,
    table: GatePass,
) -> FlightOutcome {
    let mut rows: Vec<Option<D>> = batch.into_iter().map(Some).collect();
    let mut out = FlightOutcome {
        rows: rows.len(),
        ..Default::default()
    };
    ctx.metrics.batch_rows.record(rows.len() as f64);
    let mut cancel = ctx.common.cancelled();
    {
        let work = flight_body(ctx, &mut rows, held_since, pool, table, &mut out);
        tokio::select! {
            biased;
            _ = work => {}
            _ = cancel.recv() => {
                tracing::info!(tenant = %ctx.key.tenant, table = %ctx.key.table,
                    "shutdown deadline: handing back the rows of a flight still running");
            }
        }
    }
    // Whatever is still held (the shutdown deadline passed): back at once.
    let mut left = 0;
    for d in rows.into_iter().flatten() {
        left += 1;
        let _ = d.nak(Duration::ZERO).await;
    }
    if left > 0 {
        out.handed_back += left;
        Stats::add(&ctx.common.stats.handed_back, left);
    }
    out
}

async fn flight_body<I: Inserter, D: Delivery>(
    ctx: &FlightCtx<I>,
    rows: &mut [Option<D>],
    held_since: Instant,
    pool: GatePass,
    table: GatePass,
    out: &mut FlightOutcome,
) {
    let n = rows.len();
    let (body, offsets) = build_body(rows);
    let mut iso = Isolation {
        inserter: &*ctx.inserter,
        table: &ctx.key,
        skip_unknown_fields: ctx.settings.skip_unknown_fields,
        dlq: ctx.settings.dlq,
        cap_delay: ctx.pool_gate.cap(),
        metrics: Some(&ctx.target),
        keepalive: Keepalive::new(ctx.common.settings.ack_wait, held_since),
    };
    let key = &ctx.key;
    match iso.insert(rows, &body, &offsets, 0, n).await {
        Ok(()) => {
            let mut acked = 0;
            for d in rows.iter_mut().filter_map(Option::take) {
                acked += 1;
                if let Err(e) = d.ack().await {
                    tracing::debug!(tenant = %key.tenant, table = %key.table, error = %e, "ack failed");
                }
            }
            out.inserted += acked;
            pool.ok(Some(key));
            table.ok(Some(key));
        }
        Err(e) if e.class == Class::Rejected || (e.splittable && n > 1) => {
            let r = bisect(&mut iso, rows, &body, &offsets, e).await;
            out.inserted += r.inserted;
            out.parked += r.parked;
            out.dlq_failures += r.dlq_failures;
            out.handed_back += r.left_unacked;
            if let Some(rej) = &r.last_rejection {
                out.last_error = Some(rej.to_string());
            }
            match r.stopped_by {
                None => {
                    pool.ok(Some(key));
                    table.ok(Some(key));
                }
                Some(err) => outage(ctx, rows, &err, pool, table, out).await,
            }
        }
        Err(e) => outage(ctx, rows, &e, pool, table, out).await,
    }
    let m = &ctx.metrics;
    let s = &ctx.common.stats;
    if out.inserted > 0 {
        m.inserted.increment(out.inserted as u64);
        Stats::add(&s.inserted, out.inserted);
    }
    if out.parked > 0 {
        m.parked_rejected.increment(out.parked as u64);
        Stats::add(&s.parked, out.parked);
    }
    if out.dlq_failures > 0 {
        m.dlq_failures.increment(out.dlq_failures as u64);
        Stats::add(&s.dlq_failures, out.dlq_failures);
    }
    Stats::add(&s.handed_back, out.handed_back);
}

/// An outage answer: report it to the breaker it belongs to, and hand every row still
/// held back with that breaker's delay.
async fn outage<I: Inserter, D: Delivery>(
    ctx: &FlightCtx<I>,
    rows: &mut [Option<D>],
    err: &InsertError,
    pool: GatePass,
    table: GatePass,
    out: &mut FlightOutcome,
) {
    let key = &ctx.key;
    let delay = if err.table_scoped {
        // The server answered: the pool is fine, this table is not.
        pool.ok(Some(key));
        table.outage(err, Some(key))
    } else {
        drop(table);
        pool.outage(err, Some(key))
    };
    out.last_error = Some(err.to_string());
    let mut n = 0;
    for d in rows.iter_mut().filter_map(Option::take) {
        n += 1;
        let _ = d.nak(delay).await;
    }
    out.handed_back += n;
    ctx.metrics
        .retries(retry_reason(err.class))
        .increment(n as u64);
}

/// Hand rows back (nak with `delay`) from a tracked task, off the actor's mailbox.
pub fn hand_back<D: Delivery>(
    common: &Arc<Common>,
    metrics: Option<&TableMetrics>,
    rows: Vec<D>,
    delay: Duration,
) {
    if rows.is_empty() {
        return;
    }
    let n = rows.len();
    if let Some(m) = metrics {
        m.retries_backoff.increment(n as u64);
    }
    Stats::add(&common.stats.handed_back, n);
    let guard = common.tracker.enter();
    tokio::spawn(async move {
        let _guard = guard;
        for d in rows {
            let _ = d.nak(delay).await;
        }
    });
}
