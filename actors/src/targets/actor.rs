//! The TargetActor itself: the supervisor of its servers' pools and of its tables, and
//! where the consumer's messages for its tables arrive.
//!
//! It decides nothing about a server's window (each pool owns its own) and nothing
//! about which server a batch goes to (the table picks from the board). It hands
//! arrivals back while no server of the target takes rows at all (every pool's window
//! open or a probe out: nothing is buffered anywhere), spawns a table on its first
//! messages, respawns a failed pool or table with backoff, reaps idle tables, keeps
//! what each must not forget, and tells its tables where the pools are.

use std::collections::{BTreeMap, HashMap};
use std::marker::PhantomData;
use std::sync::Arc;

use ractor::{
    Actor, ActorId, ActorProcessingErr, ActorRef, DerivedActorRef, MessagingErr, RpcReplyPort,
    SupervisionEvent,
};
use tokio::time::Instant;

use super::memory::{ReplicaMemory, TableMemory, TargetMemory};
use super::messages::{TargetDebug, TargetMsg, TargetReport};
use crate::context::Common;
use crate::flight::FlightCtx;
use crate::ledger::LedgerChange;
use crate::metrics::{self, TableMetrics};
use crate::observe::{self, Frame, NodeKind, NodeState, Observed, Registry, TargetSnapshot};
use crate::placement::all_waiting;
use crate::placement::TargetServers;
use crate::pool::{PoolActor, PoolArgs, PoolMsg, PoolReport};
use crate::ports::{Delivery, Inserter, TableKey};
use crate::protocol::{FlightRequest, PoolLink, TableCarryOver, TableReport, VerdictReport};
use crate::restart::child_gone;
use crate::routing::Routed;
use crate::settle::hand_back;
use crate::table::{TableActor, TableArgs, TableDebug, TableMsg};

pub struct TargetActor<I, D>(PhantomData<fn() -> (I, D)>);

impl<I, D> Default for TargetActor<I, D> {
    fn default() -> Self {
        Self(PhantomData)
    }
}

pub struct TargetArgs<I> {
    /// The target's place in the configuration (the root knows its targets by it).
    pub index: usize,
    pub servers: Arc<TargetServers<I>>,
    pub common: Arc<Common>,
    /// Where the predecessor left off (or a first memory).
    pub memory: TargetMemory,
    /// The root, as far as a target speaks to it.
    pub root: DerivedActorRef<TargetReport>,
    /// The root, for the reports of flights that outlive their table, pool and target.
    pub orphans: DerivedActorRef<TableReport>,
    /// Fault injection: fail in `pre_start` (the root's debug message asks for it).
    pub fail_spawn: bool,
}

struct TableEntry<I, D> {
    actor: Option<ActorRef<TableMsg<D>>>,
    ctx: Arc<FlightCtx<I>>,
    node_id: String,
    respawn_at: Option<Instant>,
    /// A table actor found dead by `route` before its supervision event came: the
    /// event, when it comes, only brings the reason (the panic message).
    down_unreported: Option<ActorId>,
    memory: TableMemory,
}

struct PoolEntry {
    actor: Option<ActorRef<PoolMsg>>,
    node_id: String,
    memory: ReplicaMemory,
    /// Spawns failed in a row (past `max_spawn_failures` the pipeline cannot go on).
    spawn_failures: u32,
}

/// A child of the target.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Child {
    Pool(usize),
    Table(TableKey),
}

pub struct TargetState<I, D> {
    index: usize,
    servers: Arc<TargetServers<I>>,
    common: Arc<Common>,
    root: DerivedActorRef<TargetReport>,
    orphans: DerivedActorRef<TableReport>,
    pools: Vec<PoolEntry>,
    tables: BTreeMap<TableKey, TableEntry<I, D>>,
    by_id: HashMap<ActorId, Child>,
    /// The memory the root holds is out of date.
    memory_dirty: bool,
    /// Its place in the live tree.
    frame: Frame,
}

// === impl TargetState ===

impl<I: Inserter, D: Delivery> TargetState<I, D> {
    fn new(args: TargetArgs<I>) -> Self {
        let TargetMemory { pools, tables } = args.memory;
        let target = &args.servers.target;
        let node_id = observe::target_id(target);
        let pools = pools
            .into_iter()
            .zip(&args.servers.replicas)
            .map(|(memory, replica)| PoolEntry {
                actor: None,
                node_id: observe::pool_id(target, &replica.name),
                memory,
                spawn_failures: 0,
            })
            .collect();
        let mut state = Self {
            index: args.index,
            servers: args.servers,
            frame: Frame::new(node_id, args.common.settings.snapshot_every),
            common: args.common,
            root: args.root,
            orphans: args.orphans,
            pools,
            tables: BTreeMap::new(),
            by_id: HashMap::new(),
            memory_dirty: true,
        };
        for (key, memory) in tables {
            state.entry(&key).memory = memory;
        }
        state
    }

    fn target(&self) -> &Arc<str> {
        &self.servers.target
    }

    fn memory(&self) -> TargetMemory {
        TargetMemory {
            pools: self.pools.iter().map(|p| p.memory.clone()).collect(),
            tables: self
                .tables
                .iter()
                .map(|(k, e)| (k.clone(), e.memory.clone()))
                .collect(),
        }
    }

    /// Send the root a fresh copy of what must outlive this target, if it changed.
    fn remember(&mut self) {
        if std::mem::take(&mut self.memory_dirty) {
            let _ = self.root.send_message(TargetReport::Remember {
                index: self.index,
                memory: Box::new(self.memory()),
            });
        }
    }

    fn entry(&mut self, key: &TableKey) -> &mut TableEntry<I, D> {
        let (servers, common) = (&self.servers, &self.common);
        self.tables.entry(key.clone()).or_insert_with(|| {
            let ctx = Arc::new(FlightCtx {
                servers: servers.clone(),
                key: key.clone(),
                settings: common.tables.resolve(key),
                metrics: TableMetrics::new(key),
                common: common.clone(),
            });
            TableEntry {
                actor: None,
                ctx,
                node_id: observe::table_id(&servers.target, key),
                respawn_at: None,
                down_unreported: None,
                memory: TableMemory::default(),
            }
        })
    }

    /// Where the tables reach each replica's pool now (`None`: restarting).
    fn pool_links(&self) -> Vec<Option<PoolLink>> {
        self.pools
            .iter()
            .map(|p| p.actor.as_ref().map(ActorRef::get_derived))
            .collect()
    }

    fn live_tables(&self) -> Vec<ActorRef<TableMsg<D>>> {
        self.tables
            .values()
            .filter_map(|e| e.actor.clone())
            .collect()
    }

    fn live_pools(&self) -> impl Iterator<Item = &ActorRef<PoolMsg>> {
        self.pools.iter().filter_map(|p| p.actor.as_ref())
    }

    // --- rows ---

    async fn on_routed(&mut self, myself: &ActorRef<TargetMsg<D>>, routed: Routed<D>) {
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
    fn on_ledger(&mut self, key: &TableKey, changes: Vec<LedgerChange>) {
        if let Some(actor) = self.tables.get(key).and_then(|e| e.actor.as_ref()) {
            let _ = actor.cast(TableMsg::Ledger(changes));
        }
    }

    async fn on_messages(&mut self, myself: &ActorRef<TargetMsg<D>>, key: TableKey, rows: Vec<D>) {
        let gates = self.servers.board.gates(Instant::now());
        if let Some(delay) = all_waiting(&gates) {
            // No server of the target takes rows now: nothing is buffered anywhere.
            let metrics = self.entry(&key).ctx.metrics.clone();
            hand_back(&self.common, Some(&metrics), rows, delay);
            return;
        }
        self.route(myself, key, rows).await;
    }

    async fn route(&mut self, myself: &ActorRef<TargetMsg<D>>, key: TableKey, rows: Vec<D>) {
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

    // --- pools ---

    /// Spawn (or respawn) a replica's pool. Awaited in the mailbox: `spawn_linked` only
    /// waits for the actor's registration and its `pre_start`, which builds its state
    /// and returns.
    async fn spawn_pool(&mut self, myself: &ActorRef<TargetMsg<D>>, replica: usize) {
        let Some(entry) = self.pools.get(replica) else {
            return;
        };
        let name = self.servers.replica(replica).name.clone();
        self.common.registry.register(
            &entry.node_id,
            NodeKind::Pool,
            &name,
            Some(&self.frame.node_id),
        );
        let args = PoolArgs {
            servers: self.servers.clone(),
            replica,
            common: self.common.clone(),
            memory: entry.memory.pool.clone(),
            target: myself.get_derived(),
            fail_spawn: false,
        };
        let spawned =
            Actor::spawn_linked(None, PoolActor::<I>::default(), args, myself.get_cell()).await;
        match spawned {
            Ok((actor, _)) => {
                self.by_id.insert(actor.get_id(), Child::Pool(replica));
                let link: PoolLink = actor.get_derived();
                self.pools[replica].actor = Some(actor);
                self.pools[replica].spawn_failures = 0;
                self.tell_tables_pool(replica, Some(link));
            }
            Err(e) => {
                let common = self.common.clone();
                let entry = &mut self.pools[replica];
                entry.spawn_failures += 1;
                let n = entry.spawn_failures;
                let max = common.settings.restart.max_spawn_failures;
                common
                    .registry
                    .failed(&entry.node_id, &e.to_string(), n < max);
                if n >= max {
                    common.set_fatal(format!(
                        "pool actor {name} of target {} could not be spawned {n} times in a row: {e}",
                        self.servers.target
                    ));
                    return;
                }
                let delay = common.restart_delay(n);
                tracing::error!(pool = %self.servers.target, replica = %name, error = %e,
                    retry_in_ms = delay.as_millis() as u64, "could not spawn the pool actor");
                myself.send_after(delay, move || TargetMsg::RespawnPool(replica));
            }
        }
    }

    fn tell_tables_pool(&self, replica: usize, link: Option<PoolLink>) {
        for table in self.live_tables() {
            let _ = table.cast(TableMsg::PoolLink {
                replica,
                link: link.clone(),
            });
        }
    }

    async fn on_respawn_pool(&mut self, myself: &ActorRef<TargetMsg<D>>, replica: usize) {
        if self.pools.get(replica).is_some_and(|p| p.actor.is_none()) {
            self.spawn_pool(myself, replica).await;
        }
    }

    fn on_pool_report(&mut self, report: PoolReport) {
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
    fn on_orphan_verdict(&self, report: VerdictReport) {
        let pool = self
            .pools
            .get(report.replica)
            .and_then(|p| p.actor.as_ref());
        if let Some(pool) = pool {
            let _ = pool.cast(PoolMsg::FromTable(FlightRequest::Verdict(Box::new(report))));
        }
    }

    // --- tables ---

    /// Spawn (or respawn) a table's actor. Awaited in the mailbox: `spawn_linked` only
    /// waits for the actor's registration and its `pre_start`, which builds its state
    /// and returns (no I/O, no waiting on another actor).
    async fn spawn_table(
        &mut self,
        myself: &ActorRef<TargetMsg<D>>,
        key: &TableKey,
    ) -> Option<ActorRef<TableMsg<D>>> {
        let target_node = self.frame.node_id.clone();
        let registry = self.common.registry.clone();
        let target_link: DerivedActorRef<TableReport> = myself.get_derived();
        let orphans = self.orphans.clone();
        let pools = self.pool_links();
        let entry = self.entry(key);
        registry.register(
            &entry.node_id,
            NodeKind::Table,
            &key.to_string(),
            Some(&target_node),
        );
        let args = TableArgs {
            ctx: entry.ctx.clone(),
            target: target_link,
            pools,
            orphans,
            node_id: entry.node_id.clone(),
            carry_over: entry.memory.carry_over.clone(),
        };
        let spawned =
            Actor::spawn_linked(None, TableActor::<I, D>::default(), args, myself.get_cell()).await;
        match spawned {
            Ok((actor, _)) => {
                let entry = self.entry(key);
                entry.actor = Some(actor.clone());
                entry.respawn_at = None;
                self.by_id.insert(actor.get_id(), Child::Table(key.clone()));
                Some(actor)
            }
            Err(e) => {
                tracing::error!(pool = %self.target(), tenant = %key.tenant, table = %key.table, error = %e,
                    "could not spawn the table actor");
                None
            }
        }
    }

    /// A child stopped unasked (a panic, an error).
    fn child_down(&mut self, myself: &ActorRef<TargetMsg<D>>, id: ActorId, why: String) {
        match self.by_id.remove(&id) {
            Some(Child::Table(key)) => self.table_down(myself, id, key, why),
            Some(Child::Pool(replica)) => self.pool_down(myself, id, replica, why),
            None => {}
        }
    }

    fn pool_down(
        &mut self,
        myself: &ActorRef<TargetMsg<D>>,
        id: ActorId,
        replica: usize,
        why: String,
    ) {
        let Some(entry) = self.pools.get_mut(replica) else {
            return;
        };
        if entry.actor.as_ref().map(|a| a.get_id()) != Some(id) {
            return;
        }
        entry.actor = None;
        if self.common.shutdown.is_cancelled() {
            return;
        }
        let now = Instant::now();
        let delay = entry
            .memory
            .restarts
            .failed(now, &self.common.settings.restart);
        metrics::restarts("pool").increment(1);
        let registry = &self.common.registry;
        registry.count_restart(&entry.node_id);
        registry.failed(&entry.node_id, &why, true);
        tracing::warn!(pool = %self.servers.target, replica = %self.servers.replica(replica).name,
            error = %why, restart_in_ms = delay.as_millis() as u64,
            "pool actor failed: its breaker is kept, respawning");
        self.memory_dirty = true;
        self.tell_tables_pool(replica, None);
        myself.send_after(delay, move || TargetMsg::RespawnPool(replica));
    }

    fn table_down(
        &mut self,
        myself: &ActorRef<TargetMsg<D>>,
        id: ActorId,
        key: TableKey,
        why: String,
    ) {
        // A probe token its flight was given and never used comes back.
        for pool in self.live_pools() {
            let _ = pool.cast(PoolMsg::TableGone(id));
        }
        let common = self.common.clone();
        let target = self.servers.target.clone();
        let Some(entry) = self.tables.get_mut(&key) else {
            return;
        };
        if entry.down_unreported == Some(id) {
            entry.down_unreported = None;
            common.registry.set_last_error(&entry.node_id, &why);
            tracing::warn!(pool = %target, tenant = %key.tenant, table = %key.table, error = %why,
                "table actor failure reported");
            return;
        }
        if entry.actor.as_ref().map(|a| a.get_id()) != Some(id) {
            return;
        }
        let now = Instant::now();
        entry.actor = None;
        let delay = entry.memory.restarts.failed(now, &common.settings.restart);
        entry.respawn_at = Some(now + delay);
        metrics::restarts("table").increment(1);
        common.registry.count_restart(&entry.node_id);
        common.registry.failed(&entry.node_id, &why, true);
        tracing::warn!(pool = %target, tenant = %key.tenant, table = %key.table, error = %why,
            restart_in_ms = delay.as_millis() as u64,
            "table actor failed: its buffered rows are handed back, respawning");
        myself.send_after(delay, move || TargetMsg::RespawnTable(key));
        self.memory_dirty = true;
    }

    async fn on_respawn_table(&mut self, myself: &ActorRef<TargetMsg<D>>, key: TableKey) {
        if self.tables.get(&key).is_some_and(|e| e.actor.is_none()) {
            self.spawn_table(myself, &key).await;
        }
    }

    fn on_table_report(&mut self, report: TableReport) {
        match report {
            TableReport::CarryOver { key, carry } => self.on_table_carry_over(key, *carry),
            TableReport::Idle { key, id } => self.on_table_idle(key, id),
            TableReport::Verdict(report) => self.on_orphan_verdict(report),
        }
    }

    fn on_table_carry_over(&mut self, key: TableKey, carry: TableCarryOver) {
        self.entry(&key).memory.carry_over = Some(carry);
        self.memory_dirty = true;
    }

    fn on_table_idle(&mut self, key: TableKey, id: ActorId) {
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
    fn on_flush_all(&self, reply: RpcReplyPort<()>) {
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

    fn on_hand_back_all(&self, reply: RpcReplyPort<usize>) {
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

    fn on_debug(&self, debug: TargetDebug) {
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

impl<I: Inserter, D: Delivery> Observed for TargetState<I, D> {
    fn frame(&self) -> &Frame {
        &self.frame
    }

    fn frame_mut(&mut self) -> &mut Frame {
        &mut self.frame
    }

    fn registry(&self) -> &Registry {
        &self.common.registry
    }

    fn snapshot(&self) -> NodeState {
        NodeState::Target(TargetSnapshot {
            target: self.target().to_string(),
            shards: self.servers.shard_names(),
            tables: self.tables.values().filter(|e| e.actor.is_some()).count(),
        })
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
