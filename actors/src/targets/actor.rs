//! The TargetActor itself: the supervisor of its servers' pools and of its tables, and
//! where the consumer's messages for its tables arrive.
//!
//! It decides nothing about a server's window (each pool owns its own) and nothing
//! about which server a batch goes to (the table picks from the board). It hands
//! arrivals back while no server of the target takes rows at all (every pool's window
//! open or a probe out: nothing is buffered anywhere), spawns a table on its first
//! messages, respawns a failed pool or table with backoff, reaps idle tables, keeps
//! what each must not forget, and tells its tables where the pools are.

use std::marker::PhantomData;

use ractor::{
    Actor, ActorId, ActorProcessingErr, ActorRef, MessagingErr, RpcReplyPort, SupervisionEvent,
};
use tokio::time::Instant;

use super::messages::{TargetDebug, TargetMsg};
use super::state::{Child, TargetArgs, TargetState};
use crate::ledger::LedgerChange;
use crate::observe::Observed;
use crate::placement::all_waiting;
use crate::pool::{PoolMsg, PoolReport};
use crate::ports::{Delivery, Inserter, TableKey};
use crate::protocol::{FlightRequest, TableCarryOver, TableReport, VerdictReport};
use crate::restart::child_gone;
use crate::routing::Routed;
use crate::settle::hand_back;
use crate::table::{TableDebug, TableMsg};

pub struct TargetActor<I, D>(PhantomData<fn() -> (I, D)>);

impl<I, D> Default for TargetActor<I, D> {
    fn default() -> Self {
        Self(PhantomData)
    }
}

impl<I: Inserter, D: Delivery> TargetState<I, D> {
    // --- rows ---

    pub(super) async fn on_routed(&mut self, myself: &ActorRef<TargetMsg<D>>, routed: Routed<D>) {
        match routed {
            Routed::Messages { key, messages } => self.on_messages(myself, key, messages).await,
            Routed::Ledger { key, changes } => self.on_ledger(&key, changes),
            Routed::LedgerResync => {
                for table in self.live_tables() {
                    let _ = table.cast(TableMsg::LedgerResync);
                }
            }
        }
    }

    /// Changes of a table's recorded batches: to its actor, if one runs (one that starts
    /// later reads the store's snapshot, which holds them).
    pub(super) fn on_ledger(&mut self, key: &TableKey, changes: Vec<LedgerChange>) {
        if let Some(actor) = self.tables.get(key).and_then(|e| e.actor.as_ref()) {
            let _ = actor.cast(TableMsg::Ledger(changes));
        }
    }

    pub(super) async fn on_messages(
        &mut self,
        myself: &ActorRef<TargetMsg<D>>,
        key: TableKey,
        rows: Vec<D>,
    ) {
        let gates = self.servers.board.gates(Instant::now());
        if let Some(delay) = all_waiting(&gates) {
            // No server of the target takes rows now: nothing is buffered anywhere.
            let metrics = self.entry(&key).ctx.metrics.clone();
            hand_back(&self.common, Some(&metrics), rows, delay);
            return;
        }
        self.route(myself, key, rows).await;
    }

    pub(super) async fn route(
        &mut self,
        myself: &ActorRef<TargetMsg<D>>,
        key: TableKey,
        rows: Vec<D>,
    ) {
        let mut rows = rows;
        let live = self
            .tables
            .get(&key)
            .and_then(|e| e.actor.as_ref())
            .map(|a| (a.clone(), a.get_id()));
        if let Some((actor, id)) = live {
            match actor.cast(TableMsg::Messages(rows)) {
                Ok(()) => return,
                Err(MessagingErr::SendErr(TableMsg::Messages(back))) => {
                    // The table's mailbox is closed but its supervision event is not
                    // here yet: it is down now. Respawning it here instead would skip
                    // the restart count and the backoff, and the late event would find
                    // a stranger in its place.
                    rows = back;
                    self.child_down(myself, id, "stopped before its failure was reported".into());
                    if let Some(entry) = self.tables.get_mut(&key) {
                        entry.down_unreported = Some(id);
                        self.by_id.insert(id, Child::Table(key.clone()));
                    }
                }
                Err(_) => return,
            }
        }
        let least = self.common.settings.restart.initial;
        let entry = self.entry(&key);
        if let Some(at) = entry.respawn_at {
            // The table is restarting: its rows come back once it is up again.
            let delay = at.saturating_duration_since(Instant::now()).max(least);
            let metrics = entry.ctx.metrics.clone();
            hand_back(&self.common, Some(&metrics), rows, delay);
            return;
        }
        let Some(actor) = self.spawn_table(myself, &key).await else {
            let delay = self.common.settings.handback_while_restarting;
            hand_back(&self.common, None, rows, delay);
            return;
        };
        if let Err(MessagingErr::SendErr(TableMsg::Messages(back))) =
            actor.cast(TableMsg::Messages(rows))
        {
            let delay = self.common.settings.handback_while_restarting;
            hand_back(&self.common, None, back, delay);
        }
    }

    pub(super) fn on_pool_report(&mut self, report: PoolReport) {
        match report {
            PoolReport::Remember { replica, memory } => {
                if let Some(entry) = self.pools.get_mut(replica) {
                    entry.memory.pool = *memory;
                    self.memory_dirty = true;
                }
            }
        }
    }

    /// A verdict its replica's pool could not be told (it was restarting): to the
    /// pool that runs now, whose breaker must hear it.
    pub(super) fn on_orphan_verdict(&self, report: VerdictReport) {
        let pool = self
            .pools
            .get(report.replica)
            .and_then(|p| p.actor.as_ref());
        if let Some(pool) = pool {
            let _ = pool.cast(PoolMsg::FromTable(FlightRequest::Verdict(Box::new(report))));
        }
    }

    pub(super) fn on_table_report(&mut self, report: TableReport) {
        match report {
            TableReport::CarryOver { key, carry } => self.on_table_carry_over(key, *carry),
            TableReport::Idle { key, id } => self.on_table_idle(key, id),
            TableReport::Verdict(report) => self.on_orphan_verdict(report),
        }
    }

    pub(super) fn on_table_carry_over(&mut self, key: TableKey, carry: TableCarryOver) {
        self.entry(&key).memory.carry_over = Some(carry);
        self.memory_dirty = true;
    }

    pub(super) fn on_table_idle(&mut self, key: TableKey, id: ActorId) {
        let current = self
            .tables
            .get(&key)
            .and_then(|e| e.actor.as_ref())
            .map(|a| a.get_id());
        if current != Some(id) {
            return;
        }
        let Some(entry) = self.tables.remove(&key) else {
            return;
        };
        self.by_id.remove(&id);
        self.common.registry.remove(&entry.node_id);
        if entry
            .memory
            .carry_over
            .as_ref()
            .is_some_and(TableCarryOver::still_running)
        {
            // Its backoff (or its wait for a missing table) still runs: keep it for the
            // table's next arrival.
            self.entry(&key).memory = entry.memory;
        }
        if let Some(actor) = entry.actor {
            let _ = actor.cast(TableMsg::Retire);
        }
        self.memory_dirty = true;
        tracing::debug!(pool = %self.target(), tenant = %key.tenant, table = %key.table, "idle table reaped");
    }

    // --- shutdown ---

    /// Every table flushes now; answered (from a task, off the mailbox) once each table
    /// answered or the call timed out.
    pub(super) fn on_flush_all(&self, reply: RpcReplyPort<()>) {
        let tables = self.live_tables();
        let timeout = self.common.settings.shutdown_deadline;
        tokio::spawn(async move {
            let calls = tables
                .iter()
                .map(|t| t.call(TableMsg::FlushAll, Some(timeout)));
            futures::future::join_all(calls).await;
            let _ = reply.send(());
        });
    }

    pub(super) fn on_hand_back_all(&self, reply: RpcReplyPort<usize>) {
        let tables = self.live_tables();
        let timeout = self.common.settings.call_timeout;
        tokio::spawn(async move {
            let calls = tables
                .iter()
                .map(|t| t.call(TableMsg::HandBackAll, Some(timeout)));
            let n = futures::future::join_all(calls)
                .await
                .into_iter()
                .filter_map(|r| match r {
                    Ok(ractor::rpc::CallResult::Success(n)) => Some(n),
                    _ => None,
                })
                .sum();
            let _ = reply.send(n);
        });
    }

    pub(super) fn on_debug(&self, debug: TargetDebug) {
        match debug {
            TargetDebug::Panic => panic!("injected panic in target actor {}", self.target()),
            TargetDebug::PanicTable(key, reply) => {
                let actor = self.tables.get(&key).and_then(|e| e.actor.clone());
                let found =
                    actor.is_some_and(|a| a.cast(TableMsg::Debug(TableDebug::Panic)).is_ok());
                let _ = reply.send(found);
            }
            TargetDebug::PanicPool(name, how, reply) => {
                let actor = self
                    .servers
                    .replicas
                    .iter()
                    .position(|r| *r.name == *name)
                    .and_then(|r| self.pools[r].actor.clone());
                let found = actor.is_some_and(|a| a.cast(PoolMsg::Debug(how)).is_ok());
                let _ = reply.send(found);
            }
        }
    }
}

impl<I: Inserter, D: Delivery> Actor for TargetActor<I, D> {
    type Msg = TargetMsg<D>;
    type State = TargetState<I, D>;
    type Arguments = TargetArgs<I>;

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        args: Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        if args.fail_spawn {
            return Err(format!("injected spawn failure of target {}", args.servers.target).into());
        }
        Ok(TargetState::new(args))
    }

    async fn post_start(
        &self,
        myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        myself.send_interval(state.common.settings.tick_every, || TargetMsg::Tick);
        for replica in 0..state.pools.len() {
            state.spawn_pool(&myself, replica).await;
        }
        state.remember();
        state.publish(true);
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            TargetMsg::Routed(routed) => state.on_routed(&myself, routed).await,
            TargetMsg::FromTable(report) => state.on_table_report(report),
            TargetMsg::FromPool(report) => state.on_pool_report(report),
            TargetMsg::RespawnTable(key) => state.on_respawn_table(&myself, key).await,
            TargetMsg::RespawnPool(replica) => state.on_respawn_pool(&myself, replica).await,
            TargetMsg::Tick => {
                state.beat();
            }
            TargetMsg::FlushAll(reply) => state.on_flush_all(reply),
            TargetMsg::HandBackAll(reply) => state.on_hand_back_all(reply),
            TargetMsg::Debug(debug) => state.on_debug(debug),
        }
        state.remember();
        state.publish(false);
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<Self::Msg>,
        evt: SupervisionEvent,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        // A retired table is no longer in `by_id`; anything else stopped unasked.
        if let Some((id, why)) = child_gone(evt) {
            state.child_down(&myself, id, why);
        }
        state.remember();
        state.publish(false);
        Ok(())
    }
}
