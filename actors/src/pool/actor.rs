//! The PoolActor itself: the owner of its target's outage breaker and single probe
//! token, the supervisor of its tables.
//!
//! Everything that decides about the target happens here, in mailbox order: arrivals
//! are handed back while the window is open or a probe is out, a table's request for a
//! flight is answered with a ticket or a delay, a flight's verdict opens, escalates or
//! closes the window (late ones change nothing), and the pool probes the target itself
//! when a window ended with no traffic, or when nothing was heard for a while.

use std::collections::HashMap;
use std::marker::PhantomData;
use std::sync::Arc;

use ractor::{
    Actor, ActorId, ActorProcessingErr, ActorRef, DerivedActorRef, MessagingErr, RpcReplyPort,
    SupervisionEvent,
};
use tokio::time::Instant;

use super::memory::{PoolMemory, Readiness, TableMemory};
use super::messages::{PoolDebug, PoolMsg, PoolReport};
use crate::backoff::Backoff;
use crate::breaker::{Admission, Ticket};
use crate::context::Common;
use crate::ledger::LedgerChange;
use crate::metrics::{self, TableMetrics, TargetMetrics};
use crate::observe::{self, NodeKind, NodeState, PoolSnapshot, SnapshotThrottle};
use crate::ports::{ClickHouseError, Delivery, Inserter, ServerInfo, TableKey};
use crate::restart::child_gone;
use crate::routing::Routed;
use crate::scoped_breaker::ScopedBreaker;
use crate::settle::hand_back;
use crate::table::{
    FlightCtx, PendingRows, PoolVerdict, TableActor, TableArgs, TableCarryOver, TableDebug,
    TableMsg, TableReport,
};

pub struct PoolActor<I, D>(PhantomData<fn() -> (I, D)>);

impl<I, D> Default for PoolActor<I, D> {
    fn default() -> Self {
        Self(PhantomData)
    }
}

pub struct PoolArgs<I> {
    /// The target's place in the configuration (the root knows its pools by it).
    pub index: usize,
    pub target: Arc<str>,
    pub inserter: Arc<I>,
    pub common: Arc<Common>,
    /// Where the predecessor left off (or a first memory).
    pub memory: PoolMemory,
    /// The root, as far as a pool speaks to it.
    pub root: DerivedActorRef<PoolReport>,
    /// The root, for the reports of flights that outlive their table and pool.
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

pub struct PoolState<I, D> {
    index: usize,
    target: Arc<str>,
    node_id: String,
    inserter: Arc<I>,
    common: Arc<Common>,
    metrics: TargetMetrics,
    root: DerivedActorRef<PoolReport>,
    orphans: DerivedActorRef<TableReport>,
    breaker: ScopedBreaker,
    readiness: Readiness,
    readiness_failures: u32,
    tables: HashMap<TableKey, TableEntry<I, D>>,
    by_id: HashMap<ActorId, TableKey>,
    /// The table whose flight holds the probe token: should the table die first, the
    /// token comes back.
    probe_holder: Option<(TableKey, Ticket)>,
    /// The pool's own probe is out (one at a time).
    own_probe_out: bool,
    /// When the target last answered anything (a flight's verdict or a probe).
    last_answer: Instant,
    /// The memory the root holds is out of date.
    memory_dirty: bool,
    throttle: SnapshotThrottle,
}

// === impl PoolState ===

impl<I: Inserter, D: Delivery> PoolState<I, D> {
    fn new(args: PoolArgs<I>) -> Self {
        let now = Instant::now();
        let PoolMemory {
            mut breaker,
            tables,
            readiness,
        } = args.memory;
        breaker.take_over(now);
        let node_id = observe::pool_id(&args.target);
        let mut state = Self {
            index: args.index,
            metrics: TargetMetrics::new(&args.target),
            target: args.target,
            node_id,
            inserter: args.inserter,
            throttle: SnapshotThrottle::new(args.common.settings.snapshot_every),
            common: args.common,
            root: args.root,
            orphans: args.orphans,
            breaker,
            readiness,
            readiness_failures: 0,
            tables: HashMap::new(),
            by_id: HashMap::new(),
            probe_holder: None,
            own_probe_out: false,
            last_answer: now,
            memory_dirty: true,
        };
        for (key, memory) in tables {
            state.entry(&key).memory = memory;
        }
        state
    }

    fn memory(&self) -> PoolMemory {
        PoolMemory {
            breaker: self.breaker.clone(),
            tables: self
                .tables
                .iter()
                .map(|(k, e)| (k.clone(), e.memory.clone()))
                .collect(),
            readiness: self.readiness.clone(),
        }
    }

    /// Send the root a fresh copy of what must outlive this pool, if it changed.
    fn remember(&mut self) {
        if std::mem::take(&mut self.memory_dirty) {
            let _ = self.root.send_message(PoolReport::Remember {
                index: self.index,
                memory: Box::new(self.memory()),
            });
        }
    }

    fn snapshot(&self) -> PoolSnapshot {
        PoolSnapshot {
            target: self.target.to_string(),
            breaker: self.breaker.snapshot(Instant::now()),
            probed_ok: self.readiness.probed_ok,
            server_version: self.readiness.server_version.clone(),
            tables: self.tables.len(),
            last_probe_error: self.readiness.last_probe_error.clone(),
        }
    }

    fn publish(&mut self, force: bool) {
        if self.throttle.due(force) {
            let snapshot = NodeState::Pool(self.snapshot());
            self.common.registry.publish(&self.node_id, snapshot);
        }
    }

    fn entry(&mut self, key: &TableKey) -> &mut TableEntry<I, D> {
        let (inserter, target, common, target_metrics) =
            (&self.inserter, &self.target, &self.common, &self.metrics);
        self.tables.entry(key.clone()).or_insert_with(|| {
            let ctx = Arc::new(FlightCtx {
                inserter: inserter.clone(),
                target: target.clone(),
                key: key.clone(),
                settings: common.tables.resolve(key),
                target_metrics: target_metrics.clone(),
                metrics: TableMetrics::new(key),
                common: common.clone(),
            });
            TableEntry {
                actor: None,
                ctx,
                node_id: observe::table_id(target, key),
                respawn_at: None,
                down_unreported: None,
                memory: TableMemory::default(),
            }
        })
    }

    // --- rows ---

    async fn on_routed(&mut self, myself: &ActorRef<PoolMsg<D>>, routed: Routed<D>) {
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

    async fn on_messages(&mut self, myself: &ActorRef<PoolMsg<D>>, key: TableKey, rows: Vec<D>) {
        if let Some(delay) = self.breaker.arrival_delay(Instant::now()) {
            // The window is open or the probe is out: nothing is buffered anywhere.
            let metrics = self.entry(&key).ctx.metrics.clone();
            hand_back(&self.common, Some(&metrics), rows, delay);
            return;
        }
        self.route(myself, key, rows).await;
    }

    async fn route(&mut self, myself: &ActorRef<PoolMsg<D>>, key: TableKey, rows: Vec<D>) {
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
                    self.table_down(myself, id, "stopped before its failure was reported".into());
                    if let Some(entry) = self.tables.get_mut(&key) {
                        entry.down_unreported = Some(id);
                        self.by_id.insert(id, key.clone());
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

    // --- tables ---

    /// Spawn (or respawn) a table's actor. Awaited in the mailbox: `spawn_linked` only
    /// waits for the actor's registration and its `pre_start`, which builds its state
    /// and returns (no I/O, no waiting on another actor).
    async fn spawn_table(
        &mut self,
        myself: &ActorRef<PoolMsg<D>>,
        key: &TableKey,
    ) -> Option<ActorRef<TableMsg<D>>> {
        let pool_node = self.node_id.clone();
        let registry = self.common.registry.clone();
        let pool_link: DerivedActorRef<TableReport> = myself.get_derived();
        let orphans = self.orphans.clone();
        let entry = self.entry(key);
        registry.register(
            &entry.node_id,
            NodeKind::Table,
            &key.to_string(),
            Some(&pool_node),
        );
        let args = TableArgs {
            ctx: entry.ctx.clone(),
            pool: pool_link,
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
                self.by_id.insert(actor.get_id(), key.clone());
                Some(actor)
            }
            Err(e) => {
                tracing::error!(pool = %self.target, tenant = %key.tenant, table = %key.table, error = %e,
                    "could not spawn the table actor");
                None
            }
        }
    }

    fn table_down(&mut self, myself: &ActorRef<PoolMsg<D>>, id: ActorId, why: String) {
        let Some(key) = self.by_id.remove(&id) else {
            return;
        };
        if self.probe_holder.as_ref().is_some_and(|(k, _)| *k == key) {
            // The table's flight held the probe: nobody will report on it now.
            if let Some((_, ticket)) = self.probe_holder.take() {
                self.breaker.release(ticket, Instant::now());
            }
        }
        let common = self.common.clone();
        let target = self.target.clone();
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
        myself.send_after(delay, move || PoolMsg::RespawnTable(key));
        self.memory_dirty = true;
    }

    async fn on_respawn_table(&mut self, myself: &ActorRef<PoolMsg<D>>, key: TableKey) {
        if self.tables.get(&key).is_some_and(|e| e.actor.is_none()) {
            self.spawn_table(myself, &key).await;
        }
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
        tracing::debug!(pool = %self.target, tenant = %key.tenant, table = %key.table, "idle table reaped");
    }

    // --- flights ---

    fn on_table_report(&mut self, report: TableReport) {
        match report {
            TableReport::WantsFlight { key, id } => self.on_wants_flight(key, id),
            TableReport::Verdict {
                key,
                verdict,
                reply,
            } => self.on_verdict(key, verdict, reply),
            TableReport::CarryOver { key, carry } => self.on_table_carry_over(key, *carry),
            TableReport::Idle { key, id } => self.on_table_idle(key, id),
        }
    }

    /// A table has a batch due: the breaker says go (maybe as the probe) or wait.
    fn on_wants_flight(&mut self, key: TableKey, id: ActorId) {
        let now = Instant::now();
        let generation = self.breaker.generation();
        let permit = match self.breaker.admit(now) {
            Admission::Go(ticket) => Ok(ticket),
            Admission::Probe(ticket) => {
                self.probe_holder = Some((key.clone(), ticket));
                Ok(ticket)
            }
            Admission::Wait(delay) => Err(delay),
        };
        self.memory_dirty |= self.breaker.generation() != generation;
        let table = self
            .tables
            .get(&key)
            .and_then(|e| e.actor.clone())
            .filter(|a| a.get_id() == id);
        let delivered = table.is_some_and(|a| a.cast(TableMsg::Permit(permit)).is_ok());
        if !delivered {
            if let Ok(ticket) = permit {
                // The table is gone: nobody will fly with this ticket.
                self.forget_ticket(ticket, now);
            }
        }
    }

    fn on_verdict(
        &mut self,
        key: TableKey,
        verdict: PoolVerdict,
        reply: Option<RpcReplyPort<PendingRows>>,
    ) {
        let now = Instant::now();
        let generation = self.breaker.generation();
        match verdict {
            PoolVerdict::Answered(ticket) => {
                self.last_answer = now;
                self.settle_probe(ticket);
                self.breaker.on_answered(ticket, now, Some(&key));
            }
            PoolVerdict::Outage(ticket, err) => {
                self.settle_probe(ticket);
                let failure = self.breaker.on_outage(ticket, &err, now, Some(&key));
                if let Some(reply) = reply {
                    let _ = reply.send(PendingRows::HandBack(failure.delay));
                }
            }
            PoolVerdict::Unfinished(ticket) => self.forget_ticket(ticket, now),
        }
        self.memory_dirty |= self.breaker.generation() != generation;
    }

    fn settle_probe(&mut self, ticket: Ticket) {
        if self
            .probe_holder
            .as_ref()
            .is_some_and(|(_, t)| *t == ticket)
        {
            self.probe_holder = None;
        }
    }

    /// A ticket that will never bring an answer: a probe's token goes back.
    fn forget_ticket(&mut self, ticket: Ticket, now: Instant) {
        self.settle_probe(ticket);
        self.breaker.release(ticket, now);
        self.memory_dirty = true;
    }

    fn on_table_carry_over(&mut self, key: TableKey, carry: TableCarryOver) {
        self.entry(&key).memory.carry_over = Some(carry);
        self.memory_dirty = true;
    }

    // --- probes ---

    fn on_readiness_probe(&mut self, myself: &ActorRef<PoolMsg<D>>) {
        if self.readiness.probed_ok {
            return;
        }
        let inserter = self.inserter.clone();
        let me = myself.clone();
        tokio::spawn(async move {
            let result = inserter.probe().await;
            let _ = me.cast(PoolMsg::ReadinessResult(result));
        });
    }

    fn on_readiness_result(
        &mut self,
        myself: &ActorRef<PoolMsg<D>>,
        result: Result<ServerInfo, ClickHouseError>,
    ) {
        match result {
            Ok(info) => {
                tracing::info!(pool = %self.target, version = %info.version,
                    "ClickHouse target answered its first probe");
                self.readiness = Readiness {
                    probed_ok: true,
                    server_version: Some(info.version),
                    last_probe_error: None,
                };
                self.readiness_failures = 0;
                self.last_answer = Instant::now();
            }
            Err(e) => {
                self.readiness_failures += 1;
                let delay =
                    Backoff::base(&self.common.settings.reconnect, self.readiness_failures - 1);
                tracing::warn!(pool = %self.target, error = %e, retry_in_ms = delay.as_millis() as u64,
                    "ClickHouse target does not answer its probe yet");
                self.readiness.last_probe_error = Some(e.to_string());
                myself.send_after(delay, || PoolMsg::ReadinessProbe);
            }
        }
        self.memory_dirty = true;
        self.throttle.transition();
    }

    /// The pool's own probe: when a window ended and no flush came to probe for
    /// `idle_probe_after` (so an idle pool's breaker closes too), and while closed, when
    /// the target said nothing for `idle_probe_every` (so a target that went down while
    /// no traffic flowed shows as down).
    fn own_probe(&mut self, myself: &ActorRef<PoolMsg<D>>) {
        let now = Instant::now();
        let settings = &self.common.settings;
        if self.own_probe_out || !self.readiness.probed_ok {
            return;
        }
        let window_ended = self
            .breaker
            .probe_due_for(now)
            .is_some_and(|d| d >= settings.idle_probe_after);
        let quiet = self.breaker.is_closed()
            && now.saturating_duration_since(self.last_answer) >= settings.idle_probe_every;
        if !window_ended && !quiet {
            return;
        }
        let generation = self.breaker.generation();
        let ticket = match self.breaker.admit(now) {
            Admission::Go(t) | Admission::Probe(t) => t,
            Admission::Wait(_) => return,
        };
        self.memory_dirty |= self.breaker.generation() != generation;
        self.own_probe_out = true;
        self.last_answer = now;
        let inserter = self.inserter.clone();
        let me = myself.clone();
        tokio::spawn(async move {
            let result = inserter.probe().await;
            let _ = me.cast(PoolMsg::OwnProbeDone { ticket, result });
        });
    }

    fn on_own_probe_done(&mut self, ticket: Ticket, result: Result<ServerInfo, ClickHouseError>) {
        let now = Instant::now();
        self.own_probe_out = false;
        let generation = self.breaker.generation();
        match result {
            Err(e) if e.class.is_outage() && !e.table_scoped => {
                self.breaker.on_outage(ticket, &e, now, None);
            }
            _ => {
                self.last_answer = now;
                self.breaker.on_answered(ticket, now, None);
            }
        }
        self.memory_dirty |= self.breaker.generation() != generation;
    }

    fn on_tick(&mut self, myself: &ActorRef<PoolMsg<D>>) {
        self.own_probe(myself);
        self.common.registry.beat(&self.node_id);
        self.throttle.dirty = true;
    }

    // --- shutdown ---

    fn live_tables(&self) -> Vec<ActorRef<TableMsg<D>>> {
        self.tables
            .values()
            .filter_map(|e| e.actor.clone())
            .collect()
    }

    /// Every table flushes now; answered (from a task, off the mailbox: the tables need
    /// this pool's permits meanwhile) once each table answered or the call timed out.
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

    fn on_debug(&self, debug: PoolDebug) {
        match debug {
            PoolDebug::Panic => panic!("injected panic in pool actor {}", self.target),
            PoolDebug::PanicTable(key, reply) => {
                let actor = self.tables.get(&key).and_then(|e| e.actor.clone());
                let found =
                    actor.is_some_and(|a| a.cast(TableMsg::Debug(TableDebug::Panic)).is_ok());
                let _ = reply.send(found);
            }
        }
    }
}

impl<I: Inserter, D: Delivery> Actor for PoolActor<I, D> {
    type Msg = PoolMsg<D>;
    type State = PoolState<I, D>;
    type Arguments = PoolArgs<I>;

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        args: Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        if args.fail_spawn {
            return Err(format!("injected spawn failure of pool {}", args.target).into());
        }
        Ok(PoolState::new(args))
    }

    async fn post_start(
        &self,
        myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        myself.send_interval(state.common.settings.tick_every, || PoolMsg::Tick);
        if !state.readiness.probed_ok {
            let _ = myself.cast(PoolMsg::ReadinessProbe);
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
        let generation = state.breaker.generation();
        match msg {
            PoolMsg::Routed(routed) => state.on_routed(&myself, routed).await,
            PoolMsg::FromTable(report) => state.on_table_report(report),
            PoolMsg::RespawnTable(key) => state.on_respawn_table(&myself, key).await,
            PoolMsg::ReadinessProbe => state.on_readiness_probe(&myself),
            PoolMsg::ReadinessResult(result) => state.on_readiness_result(&myself, result),
            PoolMsg::OwnProbeDone { ticket, result } => state.on_own_probe_done(ticket, result),
            PoolMsg::Tick => state.on_tick(&myself),
            PoolMsg::FlushAll(reply) => state.on_flush_all(reply),
            PoolMsg::HandBackAll(reply) => state.on_hand_back_all(reply),
            PoolMsg::Debug(debug) => state.on_debug(debug),
        }
        // A breaker transition is shown at once; anything else when due.
        let transition = state.breaker.generation() != generation;
        state.remember();
        state.publish(transition);
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
            state.table_down(&myself, id, why);
        }
        state.remember();
        state.publish(false);
        Ok(())
    }
}
