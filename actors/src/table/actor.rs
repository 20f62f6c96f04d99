//! The TableActor itself: one table's buffer and flush triggers, the owner of the
//! table's own backoff on each of its target's servers and of its part of the batch
//! ledger (its index of recorded batches, fed by the store's changes as messages). A
//! batch that is due picks a replica (of its recorded shard, or, fresh, of any shard
//! in turn), asks its own backoff there, then that replica's pool, for a flight; the
//! flight runs as a task and its verdict comes back as a message.

use super::messages::{TableDebug, TableMsg};
use super::state::{TableArgs, TableState};
use crate::lifecycle::{Behaviour, Lifecycle};
use crate::observe::Observed;
use crate::ports::{Delivery, Inserter};
use crate::protocol::FlightReport;
use ractor::{ActorProcessingErr, ActorRef, RpcReplyPort};
use std::time::Duration;

/// The TableActor: its state, run by the tree's one lifecycle.
pub type TableActor<I, D> = Lifecycle<TableState<I, D>>;

impl<I: Inserter, D: Delivery> Behaviour for TableState<I, D> {
    type Msg = TableMsg<D>;
    type Args = TableArgs<I>;

    fn build(args: TableArgs<I>) -> Result<Self, ActorProcessingErr> {
        let mut state = TableState::new(args);
        state.load_ledger();
        Ok(state)
    }

    async fn started(&mut self, myself: &ActorRef<TableMsg<D>>) {
        myself.send_interval(self.ctx.common.settings.tick_every, || TableMsg::Tick);
        self.publish(true);
    }

    async fn receive(&mut self, myself: &ActorRef<TableMsg<D>>, msg: TableMsg<D>) {
        match msg {
            TableMsg::Messages(rows) => self.on_messages(myself, rows),
            TableMsg::Ledger(changes) => self.on_ledger(changes),
            TableMsg::LedgerResync => self.load_ledger(),
            TableMsg::AgeDue(generation) => self.on_age_due(myself, generation),
            TableMsg::ReformDue(id) => self.on_reform_due(myself, id),
            TableMsg::Permit(permit) => self.on_permit(myself, permit),
            TableMsg::PoolLink { replica, link } => self.on_pool_link(myself, replica, link),
            TableMsg::Flight(FlightReport::Verdict(verdict)) => self.on_verdict(verdict),
            TableMsg::Flight(FlightReport::Done(outcome)) => self.on_flight_done(myself, outcome),
            TableMsg::Tick => self.on_tick(myself),
            TableMsg::Publish => self.on_publish(),
            TableMsg::FlushAll(reply) => self.on_flush_all(myself, reply),
            TableMsg::HandBackAll(reply) => self.on_hand_back_all(reply),
            TableMsg::Retire => self.on_retire(myself),
            TableMsg::Debug(debug) => self.on_debug(debug),
        }
        self.frame.changed();
        self.publish_or_arm(myself);
    }
}

// === lifecycle ===

impl<I: Inserter, D: Delivery> TableState<I, D> {
    pub(super) fn on_flush_all(&mut self, myself: &ActorRef<TableMsg<D>>, reply: RpcReplyPort<()>) {
        self.ending
            .draining
            .get_or_insert_with(Vec::new)
            .push(reply);
        self.pump(myself);
    }

    /// Shutdown's flush is answered once every batch has gone (or was handed back).
    pub(super) fn answer_drain(&mut self) {
        if !self.has_work() && self.asking.is_none() {
            if let Some(waiting) = self.ending.draining.as_mut() {
                for reply in waiting.drain(..) {
                    let _ = reply.send(());
                }
            }
        }
    }

    pub(super) fn on_hand_back_all(&mut self, reply: RpcReplyPort<usize>) {
        let mut rows = self.lanes.take_all();
        rows.extend(self.ledger.take_gathered());
        let n = rows.len();
        self.hand_back(rows, Duration::ZERO);
        self.answer_drain();
        let _ = reply.send(n);
    }

    pub(super) fn on_retire(&mut self, myself: &ActorRef<TableMsg<D>>) {
        self.ending.retiring = true;
        self.pump(myself);
        self.maybe_stop(myself);
    }

    pub(super) fn on_debug(&self, debug: TableDebug) {
        match debug {
            TableDebug::Panic => panic!("injected panic in table actor {}", self.ctx.key),
        }
    }

    pub(super) fn maybe_stop(&self, myself: &ActorRef<TableMsg<D>>) {
        if self.ending.retiring
            && self.flights.count == 0
            && self.lanes.is_empty()
            && self.ledger.gathered() == 0
            && self.asking.is_none()
        {
            myself.stop(Some("idle".into()));
        }
    }
}
