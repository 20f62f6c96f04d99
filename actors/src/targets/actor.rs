//! The TargetActor itself: the supervisor of its servers' pools and of its tables, and
//! where the consumer's messages for its tables arrive.
//!
//! It decides nothing about a server's window (each pool owns its own) and nothing
//! about which server a batch goes to (the table picks from the board). It hands
//! arrivals back while no server of the target takes rows at all (every pool's window
//! open or a probe out: nothing is buffered anywhere), spawns a table on its first
//! messages, respawns a failed pool or table with backoff, reaps idle tables, keeps
//! what each must not forget, and tells its tables where the pools are.

use std::time::Duration;

use ractor::{ActorId, ActorProcessingErr, ActorRef, MessagingErr, RpcReplyPort};
use tokio::time::Instant;

use super::messages::{TargetDebug, TargetMsg};
use super::state::{Child, TargetArgs, TargetState};
use crate::ledger::LedgerChange;
use crate::lifecycle::{Behaviour, Lifecycle};
use crate::observe::Observed;
use crate::placement::all_waiting;
use crate::pool::{PoolMsg, PoolReport};
use crate::ports::{Delivery, Inserter, TableKey};
use crate::protocol::{FlightRequest, TableCarryOver, TableReport, VerdictReport};
use crate::routing::Routed;
use crate::settle::hand_back;
use crate::table::{TableDebug, TableMsg};

/// The TargetActor: its state, run by the tree's one lifecycle.
pub type TargetActor<I, D> = Lifecycle<TargetState<I, D>>;

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
        let timeout = self.common.settings.shutdown_deadline;
        let asked = ask_every_table(self.live_tables(), TableMsg::FlushAll, timeout);
        tokio::spawn(async move {
            asked.await;
            let _ = reply.send(());
        });
    }

    pub(super) fn on_hand_back_all(&self, reply: RpcReplyPort<usize>) {
        let timeout = self.common.settings.call_timeout;
        let asked = ask_every_table(self.live_tables(), TableMsg::HandBackAll, timeout);
        tokio::spawn(async move {
            let handed_back = asked.await.into_iter().sum();
            let _ = reply.send(handed_back);
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

impl<I: Inserter, D: Delivery> Behaviour for TargetState<I, D> {
    type Msg = TargetMsg<D>;
    type Args = TargetArgs<I>;

    fn build(args: TargetArgs<I>) -> Result<Self, ActorProcessingErr> {
        if args.fail_spawn {
            return Err(format!("injected spawn failure of target {}", args.servers.target).into());
        }
        Ok(TargetState::new(args))
    }

    async fn started(&mut self, myself: &ActorRef<TargetMsg<D>>) {
        myself.send_interval(self.common.settings.tick_every, || TargetMsg::Tick);
        for replica in 0..self.pools.len() {
            self.spawn_pool(myself, replica).await;
        }
        self.remember();
        self.publish(true);
    }

    async fn receive(&mut self, myself: &ActorRef<TargetMsg<D>>, msg: TargetMsg<D>) {
        match msg {
            TargetMsg::Routed(routed) => self.on_routed(myself, routed).await,
            TargetMsg::FromTable(report) => self.on_table_report(report),
            TargetMsg::FromPool(report) => self.on_pool_report(report),
            TargetMsg::RespawnTable(key) => self.on_respawn_table(myself, key).await,
            TargetMsg::RespawnPool(replica) => self.on_respawn_pool(myself, replica).await,
            TargetMsg::Tick => {
                self.beat();
            }
            TargetMsg::FlushAll(reply) => self.on_flush_all(reply),
            TargetMsg::HandBackAll(reply) => self.on_hand_back_all(reply),
            TargetMsg::Debug(debug) => self.on_debug(debug),
        }
        self.remember();
        self.publish(false);
    }

    /// A retired table is no longer in `by_id`; anything else stopped unasked.
    fn child_gone(&mut self, myself: &ActorRef<TargetMsg<D>>, id: ActorId, why: String) {
        self.child_down(myself, id, why);
        self.remember();
        self.publish(false);
    }
}

/// Every table in `tables` asked at once, each answer awaited up to `timeout`: the
/// answers that came (a table that stopped or timed out has none).
async fn ask_every_table<D: Delivery, T: Send + 'static>(
    tables: Vec<ActorRef<TableMsg<D>>>,
    ask: fn(RpcReplyPort<T>) -> TableMsg<D>,
    timeout: Duration,
) -> Vec<T> {
    let calls = tables.iter().map(|t| t.call(ask, Some(timeout)));
    futures::future::join_all(calls)
        .await
        .into_iter()
        .filter_map(|answer| match answer {
            Ok(ractor::rpc::CallResult::Success(value)) => Some(value),
            _ => None,
        })
        .collect()
}
