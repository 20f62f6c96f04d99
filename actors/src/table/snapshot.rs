//! What a table shows of itself: its snapshot for the live tree, published when due.

use super::messages::TableMsg;
use super::state::TableState;
use crate::observe::{Frame, MissingTableSnapshot, NodeState, Observed, TableSnapshot};
use crate::ports::{Delivery, Inserter};
use ractor::ActorRef;
use std::sync::Arc;
use tokio::time::Instant;

impl<I: Inserter, D: Delivery> TableState<I, D> {
    pub(super) fn table_snapshot(&self) -> TableSnapshot {
        TableSnapshot {
            tenant: self.ctx.key.tenant.to_string(),
            table: self.ctx.key.table.to_string(),
            buffered_rows: self.lanes.len() + self.ledger.gathered(),
            buffered_bytes: self.lanes.bytes(),
            flights: self.flights.count,
            flights_out: self
                .flights
                .out
                .iter()
                .filter(|w| Arc::strong_count(w) > 1)
                .map(|w| w.snapshot(Instant::now()))
                .collect(),
            backoff: self.routes.summary(Instant::now()),
            replica_backoffs: self.routes.per_replica(&self.ctx, Instant::now()),
            shards: self.ctx.servers.layout.shards(),
            shard_key: self.lanes.key().map(|k| k.column().to_owned()),
            last_batches: self.routes.last_batches(),
            rows_inserted: self.learnt.totals.inserted,
            rows_parked: self.learnt.totals.parked,
            rows_handed_back: self.learnt.totals.handed_back,
            dlq_failures: self.learnt.totals.dlq_failures,
            missing_table: self.learnt.missing_since.map(|since| {
                let waited = Instant::now().saturating_duration_since(since);
                MissingTableSnapshot {
                    for_ms: waited.as_millis() as u64,
                    grace_left_ms: self
                        .ctx
                        .settings
                        .missing_table_grace
                        .saturating_sub(waited)
                        .as_millis() as u64,
                }
            }),
            exactly_once: self.learnt.dedup.as_ref().map(|d| d.exactly_once),
            exactly_once_why: self.learnt.dedup.as_ref().map(|d| d.why.clone()),
            recorded_batches: self.ledger.recorded(),
            batches_past_dedup_window: self.learnt.totals.past_dedup_window,
            last_error: self.learnt.totals.last_error.clone(),
        }
    }

    /// Publish now if due; if something changed but it is too soon, arm one publication
    /// for when it is due (so a burst followed by silence is still shown).
    pub(super) fn publish_or_arm(&mut self, myself: &ActorRef<TableMsg<D>>) {
        self.publish(false);
        if self.frame.arm_publication() {
            myself.send_after(self.ctx.common.settings.snapshot_every, || {
                TableMsg::Publish
            });
        }
    }

    pub(super) fn on_publish(&mut self) {
        self.frame.armed_fired();
    }
}

impl<I: Inserter, D: Delivery> Observed for TableState<I, D> {
    fn frame(&mut self) -> &mut Frame {
        &mut self.frame
    }

    fn snapshot(&self) -> NodeState {
        self.ctx.metrics.buffered.set(self.lanes.len() as f64);
        NodeState::Table(self.table_snapshot())
    }
}
