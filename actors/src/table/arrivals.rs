//! Messages arriving at a table: sorted by the ledger (fresh, settled by a record, to
//! be gathered), split by shard when their rows span shards, buffered.

use super::buffer::weigh;
use super::messages::TableMsg;
use super::state::TableState;
use crate::batch::SettlePlan;
use crate::ledger::{LedgerChange, Manifest};
use crate::ports::{Delivery, Inserter};
use ractor::ActorRef;
use std::sync::Arc;
use tokio::time::Instant;

/// Messages spanning shards split at once by one table (see `split_spanning`).
const SPLITS_AT_ONCE: usize = 16;

impl<I: Inserter, D: Delivery> TableState<I, D> {
    pub(super) fn on_messages(&mut self, myself: &ActorRef<TableMsg<D>>, rows: Vec<D>) {
        let now = Instant::now();
        self.timers.last_activity = now;
        self.timers.idle_reported = false;
        if let Some(delay) = self.routes.arrival_delay(now) {
            // The table's window is open on every replica, or its probes are out:
            // nothing is buffered.
            self.hand_back(rows, delay);
            return;
        }
        let fresh = self.sort_out_recorded(myself, rows, now);
        let weight = weigh(&fresh);
        let s = &self.ctx.settings;
        let cap = self.ctx.common.settings.buffer_cap_batches.max(1);
        let over = self.lanes.len() + weight.0 > s.batch_rows.saturating_mul(cap)
            || self.lanes.bytes() + weight.1 > s.batch_bytes.saturating_mul(cap);
        if self.ending.draining.is_none() && over && !self.lanes.is_empty() {
            // Memory bound: the table is behind (flights full); let the queue keep them.
            let delay = self.ctx.common.settings.table_backoff.initial;
            self.hand_back(fresh, delay);
        } else {
            let placed = self.lanes.place(fresh);
            self.split_spanning(placed.spanning);
            self.lanes.push_placed(placed.by_lane, weight, now);
        }
        self.pump(myself);
    }

    /// Messages whose rows belong to several shards: each is published again as one
    /// message per shard and acked, from a task (its parts come back as messages of
    /// their own, each into its shard's lane); one that cannot be goes back.
    pub(super) fn split_spanning(&self, spanning: Vec<(D, Vec<(usize, bytes::Bytes)>)>) {
        if spanning.is_empty() {
            return;
        }
        let delay = self.ctx.common.settings.store_retry;
        let split = self.ctx.metrics.messages_split.clone();
        let key = self.ctx.key.clone();
        self.ctx.common.tracker.spawn(async move {
            // Each split is a few round trips (its record read and written, its parts
            // published, its ack confirmed): a pull's worth go side by side.
            futures::StreamExt::for_each_concurrent(
                futures::stream::iter(spanning),
                SPLITS_AT_ONCE,
                |(d, parts)| {
                    let (split, key) = (&split, &key);
                    async move {
                        match d.split(parts).await {
                            Ok(()) => split.increment(1),
                            Err((d, e)) => {
                                tracing::warn!(tenant = %key.tenant, table = %key.table, error = %e,
                                    "a message whose rows belong to several shards could not be split: it goes back");
                                let _ = d.nak(delay).await;
                            }
                        }
                    }
                },
            )
            .await;
        });
    }

    /// Messages may belong to a recorded batch: one whose verdicts are recorded is
    /// settled by them at once; one still open is gathered to fly again as that batch.
    /// Returns the others.
    pub(super) fn sort_out_recorded(
        &mut self,
        myself: &ActorRef<TableMsg<D>>,
        rows: Vec<D>,
        now: Instant,
    ) -> Vec<D> {
        if !self.ctx.common.ledger.records() {
            return rows;
        }
        let sorted = self.ledger.sort(rows, now);
        self.count_uncovered(sorted.uncovered, now);
        for id in sorted.opened {
            let wait = self.ctx.common.settings.reform_wait;
            myself.send_after(wait, move || TableMsg::ReformDue(id));
        }
        self.settle_by_records(sorted.settled);
        sorted.fresh
    }

    /// Messages delivered again that no record covers, into a table reported
    /// exactly-once: counted, and the first of each minute logged, so a duplicate can
    /// be traced to its cause (a record expired, or removed while a copy was out).
    pub(super) fn count_uncovered(&mut self, uncovered: usize, now: Instant) {
        let exactly_once = self.learnt.dedup.as_ref().is_some_and(|d| d.exactly_once);
        if uncovered == 0 || !exactly_once {
            return;
        }
        self.ctx
            .metrics
            .messages_uncovered
            .increment(uncovered as u64);
        if self.ledger.log_uncovered(now) {
            tracing::warn!(tenant = %self.ctx.key.tenant, table = %self.ctx.key.table, messages = uncovered,
                "messages delivered again are covered by no batch record: they go into a new batch (their rows are in ClickHouse twice if an earlier batch of theirs went in and its record expired or was removed; sluice_messages_uncovered_total counts them)");
        }
    }

    /// Messages of batches whose verdicts are recorded: settled by them, from a task.
    pub(super) fn settle_by_records(&self, settled: Vec<(Arc<Manifest>, Vec<D>)>) {
        for (manifest, held) in settled {
            let ctx = self.ctx.clone();
            self.ctx.common.tracker.spawn(async move {
                let plan = SettlePlan {
                    table: &ctx.key,
                    dlq: ctx.settings.dlq,
                    cap_delay: ctx.common.settings.pool_backoff.max,
                    pending_delay: ctx.common.settings.store_retry,
                    confirm: false,
                };
                ctx.common
                    .ledger
                    .settle_by_record(&manifest, held, &plan)
                    .await;
            });
        }
    }

    /// Changes of the table's recorded batches, from the store.
    pub(super) fn on_ledger(&mut self, changes: Vec<LedgerChange>) {
        self.timers.last_activity = Instant::now();
        let settled = self.ledger.apply(changes);
        self.settle_by_records(settled);
    }

    /// Start the ledger's index again from the store's snapshot of the table.
    pub(super) fn load_ledger(&mut self) {
        if let Some(snapshot) = self.ctx.common.ledger.snapshot_of(&self.ctx.key) {
            self.ledger.load(snapshot);
        }
    }

    pub(super) fn on_reform_due(&mut self, myself: &ActorRef<TableMsg<D>>, id: String) {
        self.ledger.wait_over(&id);
        self.pump(myself);
    }
}
