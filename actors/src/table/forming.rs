//! From what a table hands a flight to the batch the flight sends: the messages as they
//! came (a fresh batch), or a recorded batch formed again from its manifest. For a table
//! whose inserts ClickHouse deduplicates, a fresh batch's manifest is recorded before
//! its first attempt, and every batch's verdicts before any of its rows is settled (see
//! [`crate::manifest`]); a message redelivered after that is settled by the record.

use std::collections::HashSet;
use std::sync::Arc;

use tokio::time::Instant;

use super::flight::{outage, FlightCtx};
use super::verdict::Verdict;
use crate::batch::{Batch, RowVerdict, SettlePlan};
use crate::manifest::{Manifest, ManifestState, RejectedRow};
use crate::ports::{Dedup, Delivery, Inserter, StoreError};

/// What a table hands a flight.
pub enum Cargo<D> {
    /// Messages from the buffer, some coming back with lines an earlier flight settled.
    Fresh {
        deliveries: Vec<D>,
        done: Vec<(u64, Vec<u32>)>,
        /// A message of it is suspected of crashing ClickHouse (see `table::strikes`).
        suspect: bool,
    },
    /// A recorded batch, formed again: the messages of it this table holds.
    Reformed {
        manifest: Arc<Manifest>,
        held: Vec<D>,
        suspect: bool,
    },
}

impl<D> Cargo<D> {
    pub fn suspect(&self) -> bool {
        match self {
            Cargo::Fresh { suspect, .. } | Cargo::Reformed { suspect, .. } => *suspect,
        }
    }
}

/// The batch a flight sends, and what it knows about it before the first attempt.
pub struct Formed<D> {
    pub batch: Batch<D>,
    /// Set when the batch is recorded (exactly-once).
    pub manifest: Option<Manifest>,
    /// Whether ClickHouse deduplicates the table's inserts, when the flight asked.
    pub dedup: Option<Dedup>,
    /// The batch cannot be sent: this is why (the rows go back).
    pub failed: Option<Verdict>,
}

/// Form the batch; record it first when the table deduplicates.
pub async fn form<I: Inserter, D: Delivery>(
    ctx: &FlightCtx<I>,
    cargo: Cargo<D>,
    held_since: Instant,
) -> Formed<D> {
    match cargo {
        Cargo::Fresh {
            deliveries, done, ..
        } => form_fresh(ctx, Batch::resuming(deliveries, done, held_since)).await,
        Cargo::Reformed { manifest, held, .. } => reform(ctx, &manifest, held, held_since).await,
    }
}

async fn form_fresh<I: Inserter, D: Delivery>(ctx: &FlightCtx<I>, batch: Batch<D>) -> Formed<D> {
    let mut formed = Formed {
        batch,
        manifest: None,
        dedup: None,
        failed: None,
    };
    let Some(store) = &ctx.common.manifests else {
        return formed;
    };
    let dedup = match ctx.inserter.deduplicates(&ctx.key).await {
        Ok(dedup) => dedup,
        Err(e) => {
            formed.failed = Some(outage(e));
            return formed;
        }
    };
    let exactly_once = dedup.exactly_once;
    formed.dedup = Some(dedup);
    if !exactly_once {
        return formed;
    }
    let manifest = Manifest::new(ctx.key.clone(), formed.batch.sequences());
    match store.record(&manifest).await {
        Ok(()) => formed.manifest = Some(manifest),
        Err(e) => formed.failed = Some(store_failed(ctx, e)),
    }
    formed
}

/// A recorded batch again: the messages held, the others read from the stream.
async fn reform<I: Inserter, D: Delivery>(
    ctx: &FlightCtx<I>,
    manifest: &Manifest,
    held: Vec<D>,
    held_since: Instant,
) -> Formed<D> {
    let Some(store) = &ctx.common.manifests else {
        return form_fresh(ctx, Batch::new(held, held_since)).await;
    };
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
        match store.fetch(&missing).await {
            Ok(payloads) => missing.into_iter().zip(payloads).collect(),
            Err(e) if e.0.contains("no longer") => {
                // Messages of the batch left the stream without the batch being settled
                // (purged by hand): it can never be formed again. What is held goes on
                // as a batch of its own.
                tracing::warn!(tenant = %ctx.key.tenant, table = %ctx.key.table, manifest = %manifest.id,
                    error = %e, "a recorded batch cannot be formed again: its messages held here form a new one");
                return form_fresh(ctx, Batch::new(held, held_since)).await;
            }
            Err(e) => {
                return Formed {
                    batch: Batch::new(held, held_since),
                    manifest: None,
                    dedup: None,
                    failed: Some(store_failed(ctx, e)),
                };
            }
        }
    };
    let mut open = manifest.clone();
    open.state = ManifestState::Open;
    Formed {
        batch: Batch::reformed(&manifest.messages, held, fetched, held_since),
        manifest: Some(open),
        dedup: None,
        failed: None,
    }
}

fn store_failed<I>(ctx: &FlightCtx<I>, e: StoreError) -> Verdict {
    ctx.metrics.manifest_failures.increment(1);
    tracing::warn!(tenant = %ctx.key.tenant, table = %ctx.key.table, error = %e,
        "the manifest store cannot be written: the batch waits (nothing is inserted unrecorded)");
    Verdict::StoreDown(e)
}

/// Record the verdicts before any row is settled. With a row still pending nothing is
/// settled: the batch goes back whole and is sent again whole (its inserted parts are
/// deduplicated). A record that fails sends everything back too.
pub async fn finish_record<I, D: Delivery>(
    ctx: &FlightCtx<I>,
    manifest: &Manifest,
    batch: &Batch<D>,
    verdicts: &mut [RowVerdict],
) -> Result<(), String> {
    if verdicts.contains(&RowVerdict::Pending) {
        verdicts.fill(RowVerdict::Pending);
        return Ok(());
    }
    let Some(store) = &ctx.common.manifests else {
        return Ok(());
    };
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
            }),
            _ => None,
        })
        .collect();
    let mut settled = manifest.clone();
    settled.state = ManifestState::Settled { rejected };
    store.record(&settled).await.map_err(|e| {
        ctx.metrics.manifest_failures.increment(1);
        verdicts.fill(RowVerdict::Pending);
        format!("manifest store: {e}")
    })
}

/// Messages of a batch whose verdicts are recorded, delivered again (their acks were
/// lost with a crash): settled by the record, with no insert. A row recorded rejected is
/// parked again (the DLQ keeps one copy).
pub async fn settle_by_record<I, D: Delivery>(
    ctx: &FlightCtx<I>,
    manifest: &Manifest,
    deliveries: Vec<D>,
) {
    let batch = Batch::new(deliveries, Instant::now());
    let verdicts = batch
        .row_ids()
        .map(|(seq, line)| match manifest.verdict(seq, line) {
            Some(Some(reason)) => RowVerdict::Rejected(reason),
            Some(None) => RowVerdict::Inserted,
            // Not settled after all: back it goes.
            None => RowVerdict::Pending,
        })
        .collect();
    let plan = SettlePlan {
        table: &ctx.key,
        dlq: ctx.settings.dlq,
        cap_delay: ctx.common.settings.pool_backoff.max,
        pending_delay: ctx.common.settings.store_retry,
        confirm: false,
    };
    let settled = batch.settle(verdicts, &plan).await;
    tracing::debug!(tenant = %ctx.key.tenant, table = %ctx.key.table, manifest = %manifest.id,
        acked = settled.inserted, parked = settled.parked,
        "messages of a settled batch came back: settled by its record, not inserted again");
}
