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
use crate::keepalive::lease_ran_out;
use crate::manifest::{Manifest, ManifestState, RejectedRow};
use crate::ports::{Dedup, Delivery, Inserter, StoreError};
use crate::settle::hand_back;

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
    /// Empty when the messages were settled by a record instead (their batch was
    /// settled while they were gathered).
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
        } => {
            let deliveries = set_aside_recorded(ctx, deliveries).await;
            form_fresh(ctx, deliveries, done, held_since).await
        }
        Cargo::Reformed { manifest, held, .. } => reform(ctx, &manifest, held, held_since).await,
    }
}

/// A message may have come twice (nats-server 2.9 delivers a message handed back to a
/// dropped pull request again as new) or been recorded meanwhile in another batch (by
/// another flight, another instance): it must not go into a batch of its own as well.
/// Such copies go back (briefly) and come again as what they are: a redelivery of a
/// recorded batch, settled or formed again by its manifest.
async fn set_aside_recorded<I, D: Delivery>(ctx: &FlightCtx<I>, deliveries: Vec<D>) -> Vec<D> {
    let store = ctx.common.manifests.as_ref();
    if !twice_or_recorded(store, &deliveries) {
        return deliveries;
    }
    let mut seen = HashSet::with_capacity(deliveries.len());
    let mut keep = Vec::with_capacity(deliveries.len());
    let mut aside = Vec::new();
    for d in deliveries {
        let seq = d.position().stream_sequence;
        let recorded = store.is_some_and(|s| s.holding(seq).is_some());
        if recorded || !seen.insert(seq) {
            aside.push(d);
        } else {
            keep.push(d);
        }
    }
    if !aside.is_empty() {
        tracing::debug!(tenant = %ctx.key.tenant, table = %ctx.key.table, messages = aside.len(),
            "messages delivered twice or already in a recorded batch go back");
        back_for_now(ctx, aside);
    }
    keep
}

/// Whether a message is held twice or is in a recorded batch: nearly never, and this
/// asks without moving a delivery or hashing a sequence (it runs for every batch).
fn twice_or_recorded<D: Delivery>(
    store: Option<&Arc<dyn crate::ports::ManifestStore>>,
    deliveries: &[D],
) -> bool {
    let mut seqs: Vec<u64> = deliveries
        .iter()
        .map(|d| d.position().stream_sequence)
        .collect();
    if store.is_some_and(|s| seqs.iter().any(|seq| s.holding(*seq).is_some())) {
        return true;
    }
    seqs.sort_unstable();
    seqs.windows(2).any(|w| w[0] == w[1])
}

/// Rows that must not go into this batch: back to the queue for a moment, to come
/// again as what they are (a settled batch's messages are then settled by its record).
fn back_for_now<I, D: Delivery>(ctx: &FlightCtx<I>, rows: Vec<D>) {
    hand_back(&ctx.common, None, rows, ctx.common.settings.store_retry);
}

/// A batch of the messages as they came. For a table whose inserts ClickHouse
/// deduplicates, recorded first, and only with rows JetStream still counts as ours.
async fn form_fresh<I: Inserter, D: Delivery>(
    ctx: &FlightCtx<I>,
    deliveries: Vec<D>,
    done: Vec<(u64, Vec<u32>)>,
    held_since: Instant,
) -> Formed<D> {
    let mut formed = Formed {
        batch: Batch::new(Vec::new(), held_since),
        manifest: None,
        dedup: None,
        failed: None,
    };
    let Some(store) = &ctx.common.manifests else {
        formed.batch = Batch::resuming(deliveries, done, held_since);
        return formed;
    };
    let dedup = match ctx.inserter.deduplicates(&ctx.key).await {
        Ok(dedup) => dedup,
        Err(e) => {
            formed.batch = Batch::resuming(deliveries, done, held_since);
            formed.failed = Some(outage(e));
            return formed;
        }
    };
    let exactly_once = dedup.exactly_once;
    formed.dedup = Some(dedup);
    if !exactly_once {
        formed.batch = Batch::resuming(deliveries, done, held_since);
        return formed;
    }
    let (mut live, expired) = split_expired(ctx, deliveries);
    // The order the manifest lists (and a batch formed again sends): isolation splits a
    // batch by position, so the same pieces need the same order.
    live.sort_unstable_by_key(|d| d.position().stream_sequence);
    if !expired.is_empty() {
        tracing::info!(tenant = %ctx.key.tenant, table = %ctx.key.table, messages = expired.len(),
            "messages held past ack_wait may be in another batch by now: they go back");
        back_for_now(ctx, expired);
    }
    formed.batch = Batch::resuming(live, done, held_since);
    if formed.batch.is_empty() {
        return formed;
    }
    let manifest = Manifest::new(ctx.key.clone(), formed.batch.sequences());
    if let Err(e) = store.record(&manifest).await {
        formed.failed = Some(store_failed(ctx, e));
        return formed;
    }
    // The record may have taken long (NATS slow or frozen), or this process stood
    // still: a row JetStream gave up on meanwhile may be in another batch already.
    if formed
        .batch
        .deliveries()
        .any(|d| lease_ran_out(d, ctx.common.settings.ack_wait, Instant::now()))
    {
        let _ = store.forget(&manifest.id).await;
        formed.failed = Some(Verdict::StoreDown(StoreError(format!(
            "batch {} was held past ack_wait while it was recorded: its rows go back",
            manifest.id
        ))));
        return formed;
    }
    formed.manifest = Some(manifest);
    formed
}

fn split_expired<I, D: Delivery>(ctx: &FlightCtx<I>, deliveries: Vec<D>) -> (Vec<D>, Vec<D>) {
    let now = Instant::now();
    deliveries
        .into_iter()
        .partition(|d| !lease_ran_out(d, ctx.common.settings.ack_wait, now))
}

/// A recorded batch again: the messages held, the others read from the stream. The
/// batch may have been settled meanwhile (by another flight, another instance, while
/// these messages were gathered): then they are settled by its record.
async fn reform<I: Inserter, D: Delivery>(
    ctx: &FlightCtx<I>,
    manifest: &Manifest,
    held: Vec<D>,
    held_since: Instant,
) -> Formed<D> {
    let Some(store) = &ctx.common.manifests else {
        return form_fresh(ctx, held, Vec::new(), held_since).await;
    };
    if let Some(settled) = settled_now(store.as_ref(), manifest) {
        return settled_by_record(ctx, &settled, held, held_since).await;
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
        match store.fetch(&missing).await {
            Ok(payloads) => missing.into_iter().zip(payloads).collect(),
            Err(e) if e.0.contains("no longer") => {
                // Messages of the batch left the stream: acked, so the batch was settled
                // (its record is here now), or purged by hand, and then it can never be
                // formed again: what is held goes on as a batch of its own.
                if let Some(settled) = settled_now(store.as_ref(), manifest) {
                    return settled_by_record(ctx, &settled, held, held_since).await;
                }
                tracing::warn!(tenant = %ctx.key.tenant, table = %ctx.key.table, manifest = %manifest.id,
                    error = %e, "a recorded batch cannot be formed again: its messages held here form a new one");
                return form_fresh(ctx, held, Vec::new(), held_since).await;
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
    let (batch, copies) = Batch::reformed(&manifest.messages, held, fetched, held_since);
    back_for_now(ctx, copies);
    // A settled record says every message of the batch was judged: it may only follow
    // an insert of all of them.
    if batch.sequences() != manifest.messages {
        let e = StoreError(format!(
            "recorded batch {} formed again without all of its {} messages",
            manifest.id,
            manifest.messages.len()
        ));
        return Formed {
            batch,
            manifest: None,
            dedup: None,
            failed: Some(incomplete(ctx, e)),
        };
    }
    let mut open = manifest.clone();
    open.state = ManifestState::Open;
    Formed {
        batch,
        manifest: Some(open),
        dedup: None,
        failed: None,
    }
}

/// The manifest as the store has it now, if it is settled.
fn settled_now(
    store: &dyn crate::ports::ManifestStore,
    manifest: &Manifest,
) -> Option<Arc<Manifest>> {
    let first = *manifest.messages.first()?;
    store
        .holding(first)
        .filter(|m| m.id == manifest.id && m.is_settled())
}

/// Settle the held messages by the batch's record; nothing is left to send.
async fn settled_by_record<I, D: Delivery>(
    ctx: &FlightCtx<I>,
    manifest: &Manifest,
    held: Vec<D>,
    held_since: Instant,
) -> Formed<D> {
    settle_by_record(ctx, manifest, held).await;
    Formed {
        batch: Batch::new(Vec::new(), held_since),
        manifest: None,
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

fn incomplete<I>(ctx: &FlightCtx<I>, e: StoreError) -> Verdict {
    tracing::warn!(tenant = %ctx.key.tenant, table = %ctx.key.table, error = %e,
        "a recorded batch cannot be sent short of messages: its rows go back");
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
