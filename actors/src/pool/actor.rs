//! The PoolActor itself.

use std::collections::HashMap;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ractor::{Actor, ActorId, ActorProcessingErr, ActorRef, MessagingErr, SupervisionEvent};
use tokio::time::Instant;

use super::messages::PoolMsg;
use crate::backoff::Backoff;
use crate::context::{Common, Faults};
use crate::gate::{Gate, GateScope};
use crate::metrics::{self, TableMetrics, TargetMetrics};
use crate::observe::{self, NodeKind, NodeState, PoolSnapshot, Publisher};
use crate::ports::{Delivery, Inserter, TableKey};
use crate::table::flush::hand_back;
use crate::table::{FlightCtx, TableActor, TableArgs, TableMsg};

/// What outlives a pool actor's restarts: the target, its breaker, its tables'
/// backoffs, and whether it ever answered a probe.
pub struct PoolShared<I> {
    pub target: Arc<str>,
    pub inserter: Arc<I>,
    pub gate: Arc<Gate>,
    pub metrics: TargetMetrics,
    pub probed_ok: AtomicBool,
    pub server_version: Mutex<Option<String>>,
    pub last_probe_error: Mutex<Option<String>>,
    pub table_gates: Mutex<HashMap<TableKey, Arc<Gate>>>,
    pub common: Arc<Common>,
    pub node_id: String,
}

impl<I> PoolShared<I> {
    pub fn new(target: &str, inserter: Arc<I>, common: Arc<Common>) -> Arc<Self> {
        let metrics = TargetMetrics::new(target);
        let target: Arc<str> = Arc::from(target);
        let gate = Arc::new(Gate::new(
            GateScope::Pool {
                target: target.clone(),
            },
            common.settings.pool_backoff,
            common.settings.log_every,
            common.jitter(),
            Some(metrics.breaker.clone()),
        ));
        Arc::new(Self {
            node_id: observe::pool_id(&target),
            target,
            inserter,
            gate,
            metrics,
            probed_ok: AtomicBool::new(false),
            server_version: Mutex::new(None),
            last_probe_error: Mutex::new(None),
            table_gates: Mutex::new(HashMap::new()),
            common,
        })
    }

    fn table_gate(&self, key: &TableKey, metrics: &TableMetrics) -> Arc<Gate> {
        let mut gates = self.table_gates.lock().unwrap_or_else(|e| e.into_inner());
        gates
            .entry(key.clone())
            .or_insert_with(|| {
                Arc::new(Gate::new(
                    GateScope::Table {
                        target: self.target.clone(),
                        key: key.clone(),
                    },
                    self.common.settings.table_backoff,
                    self.common.settings.log_every,
                    self.common.jitter(),
                    Some(metrics.backoff.clone()),
                ))
            })
            .clone()
    }

    pub fn snapshot(&self, tables: usize) -> PoolSnapshot {
        PoolSnapshot {
            target: self.target.to_string(),
            breaker: self.gate.snapshot(),
            probed_ok: self.probed_ok.load(Ordering::Relaxed),
            server_version: self
                .server_version
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone(),
            tables,
            last_probe_error: self
                .last_probe_error
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone(),
        }
    }
}

pub struct PoolActor<I, D>(PhantomData<fn() -> (I, D)>);

impl<I, D> Default for PoolActor<I, D> {
    fn default() -> Self {
        Self(PhantomData)
    }
}

struct TableEntry<I, D> {
    actor: Option<ActorRef<TableMsg<D>>>,
    ctx: Arc<FlightCtx<I>>,
    node_id: String,
    failures_in_row: u32,
    last_failure: Option<Instant>,
    respawn_at: Option<Instant>,
    /// A table actor found dead by `route` before its supervision event came: the
    /// event, when it comes, only brings the reason (the panic message).
    down_unreported: Option<ActorId>,
}

pub struct PoolState<I, D> {
    shared: Arc<PoolShared<I>>,
    tables: HashMap<TableKey, TableEntry<I, D>>,
    by_id: HashMap<ActorId, TableKey>,
    probe_failures: u32,
    idle_probe_out: Arc<AtomicBool>,
    publisher: Publisher,
}

impl<I: Inserter, D: Delivery> PoolState<I, D> {
    fn publish(&mut self, force: bool) {
        if self.publisher.due(force) {
            let snap = self.shared.snapshot(self.tables.len());
            self.shared
                .common
                .registry
                .publish(&self.shared.node_id, NodeState::Pool(snap));
        }
    }

    fn entry(&mut self, key: &TableKey) -> &mut TableEntry<I, D> {
        let shared = &self.shared;
        self.tables.entry(key.clone()).or_insert_with(|| {
            let metrics = TableMetrics::new(key);
            let ctx = Arc::new(FlightCtx {
                inserter: shared.inserter.clone(),
                key: key.clone(),
                settings: shared.common.tables.resolve(key),
                pool_gate: shared.gate.clone(),
                table_gate: shared.table_gate(key, &metrics),
                target: shared.metrics.clone(),
                metrics,
                common: shared.common.clone(),
            });
            TableEntry {
                actor: None,
                ctx,
                node_id: observe::table_id(&shared.target, key),
                failures_in_row: 0,
                last_failure: None,
                respawn_at: None,
                down_unreported: None,
            }
        })
    }

    async fn spawn_table(
        &mut self,
        myself: &ActorRef<PoolMsg<D>>,
        key: &TableKey,
    ) -> Option<ActorRef<TableMsg<D>>> {
        let pool_node = self.shared.node_id.clone();
        let registry = self.shared.common.registry.clone();
        let entry = self.entry(key);
        registry.register(
            &entry.node_id,
            NodeKind::Table,
            &key.to_string(),
            Some(&pool_node),
        );
        let args = TableArgs {
            ctx: entry.ctx.clone(),
            pool: myself.clone(),
            node_id: entry.node_id.clone(),
        };
        match Actor::spawn_linked(None, TableActor::<I, D>::default(), args, myself.get_cell())
            .await
        {
            Ok((actor, _)) => {
                let entry = self.entry(key);
                entry.actor = Some(actor.clone());
                entry.respawn_at = None;
                self.by_id.insert(actor.get_id(), key.clone());
                self.publisher.dirty = true;
                Some(actor)
            }
            Err(e) => {
                tracing::error!(pool = %self.shared.target, tenant = %key.tenant, table = %key.table, error = %e,
                    "could not spawn the table actor");
                None
            }
        }
    }

    async fn route(&mut self, myself: &ActorRef<PoolMsg<D>>, key: TableKey, rows: Vec<D>) {
        let mut rows = rows;
        let live = self
            .tables
            .get(&key)
            .and_then(|e| e.actor.as_ref())
            .map(|a| (a.clone(), a.get_id()));
        if let Some((actor, id)) = live {
            match actor.cast(TableMsg::Rows(rows)) {
                Ok(()) => return,
                Err(MessagingErr::SendErr(TableMsg::Rows(back))) => {
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
        if let Some(entry) = self.tables.get(&key) {
            if let Some(at) = entry.respawn_at {
                // The table is restarting: its rows come back once it is up again.
                let delay = at
                    .saturating_duration_since(Instant::now())
                    .max(Duration::from_millis(100));
                let m = entry.ctx.metrics.clone();
                hand_back(&self.shared.common, Some(&m), rows, delay);
                return;
            }
        }
        match self.spawn_table(myself, &key).await {
            Some(actor) => {
                if let Err(MessagingErr::SendErr(TableMsg::Rows(back))) =
                    actor.cast(TableMsg::Rows(rows))
                {
                    hand_back(&self.shared.common, None, back, Duration::from_secs(1));
                }
            }
            None => hand_back(&self.shared.common, None, rows, Duration::from_secs(1)),
        }
    }

    fn table_down(&mut self, myself: &ActorRef<PoolMsg<D>>, id: ActorId, why: String) {
        let Some(key) = self.by_id.remove(&id) else {
            return;
        };
        let common = self.shared.common.clone();
        let target = self.shared.target.clone();
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
        entry.failures_in_row = match entry.last_failure {
            Some(t) if now.saturating_duration_since(t) < common.settings.restart.reset_after => {
                entry.failures_in_row + 1
            }
            _ => 1,
        };
        entry.last_failure = Some(now);
        let delay = common.restart_delay(entry.failures_in_row);
        entry.respawn_at = Some(now + delay);
        metrics::restarts("table").increment(1);
        common.registry.count_restart(&entry.node_id);
        common.registry.failed(&entry.node_id, &why, true);
        tracing::warn!(pool = %target, tenant = %key.tenant, table = %key.table, error = %why,
            restart_in_ms = delay.as_millis() as u64,
            "table actor failed: its buffered rows are handed back, respawning");
        myself.send_after(delay, move || PoolMsg::RespawnTable(key));
        self.publisher.dirty = true;
    }

    fn idle_probe(&mut self) {
        let after = self.shared.common.settings.idle_probe_after;
        let due = self.shared.gate.probe_due_for().is_some_and(|d| d >= after);
        if !due || self.idle_probe_out.load(Ordering::Relaxed) {
            return;
        }
        let Ok(pass) = self.shared.gate.admit() else {
            return;
        };
        self.idle_probe_out.store(true, Ordering::Relaxed);
        let shared = self.shared.clone();
        let out = self.idle_probe_out.clone();
        tokio::spawn(async move {
            match shared.inserter.probe().await {
                Ok(_) => pass.ok(None),
                Err(e) if !e.class.is_outage() || e.table_scoped => pass.ok(None),
                Err(e) => {
                    pass.outage(&e, None);
                }
            }
            out.store(false, Ordering::Relaxed);
        });
    }
}

impl<I: Inserter, D: Delivery> Actor for PoolActor<I, D> {
    type Msg = PoolMsg<D>;
    type State = PoolState<I, D>;
    type Arguments = Arc<PoolShared<I>>;

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        shared: Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        if Faults::take(&shared.common.faults.pool_spawn) {
            return Err(format!("injected spawn failure of pool {}", shared.target).into());
        }
        let every = shared.common.settings.snapshot_every;
        Ok(PoolState {
            shared,
            tables: HashMap::new(),
            by_id: HashMap::new(),
            probe_failures: 0,
            idle_probe_out: Arc::new(AtomicBool::new(false)),
            publisher: Publisher::new(every),
        })
    }

    async fn post_start(
        &self,
        myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        myself.send_interval(Duration::from_secs(1), || PoolMsg::Tick);
        if !state.shared.probed_ok.load(Ordering::Relaxed) {
            let _ = myself.cast(PoolMsg::ReadinessProbe);
        }
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
            PoolMsg::Rows { key, rows } => state.route(&myself, key, rows).await,
            PoolMsg::TableIdle { key, id } => {
                let current = state
                    .tables
                    .get(&key)
                    .and_then(|e| e.actor.as_ref())
                    .map(|a| a.get_id());
                if current == Some(id) {
                    if let Some(entry) = state.tables.remove(&key) {
                        state.by_id.remove(&id);
                        state.shared.common.registry.remove(&entry.node_id);
                        if entry.ctx.table_gate.is_closed() {
                            state
                                .shared
                                .table_gates
                                .lock()
                                .unwrap_or_else(|e| e.into_inner())
                                .remove(&key);
                        }
                        if let Some(a) = entry.actor {
                            let _ = a.cast(TableMsg::Retire);
                        }
                        tracing::debug!(pool = %state.shared.target, tenant = %key.tenant, table = %key.table, "idle table reaped");
                    }
                    state.publish(true);
                }
            }
            PoolMsg::RespawnTable(key) => {
                let needs = state.tables.get(&key).is_some_and(|e| e.actor.is_none());
                if needs {
                    state.spawn_table(&myself, &key).await;
                    state.publish(true);
                }
            }
            PoolMsg::ReadinessProbe => {
                if !state.shared.probed_ok.load(Ordering::Relaxed) {
                    let shared = state.shared.clone();
                    let me = myself.clone();
                    tokio::spawn(async move {
                        let r = shared.inserter.probe().await;
                        let _ = me.cast(PoolMsg::ProbeResult(r));
                    });
                }
            }
            PoolMsg::ProbeResult(r) => {
                match r {
                    Ok(info) => {
                        state.shared.probed_ok.store(true, Ordering::Relaxed);
                        *state
                            .shared
                            .server_version
                            .lock()
                            .unwrap_or_else(|e| e.into_inner()) = Some(info.version.clone());
                        *state
                            .shared
                            .last_probe_error
                            .lock()
                            .unwrap_or_else(|e| e.into_inner()) = None;
                        state.probe_failures = 0;
                        tracing::info!(pool = %state.shared.target, version = %info.version, "ClickHouse target answered its first probe");
                    }
                    Err(e) => {
                        state.probe_failures += 1;
                        let delay = Backoff::base(
                            &state.shared.common.settings.reconnect,
                            state.probe_failures - 1,
                        );
                        tracing::warn!(pool = %state.shared.target, error = %e, retry_in_ms = delay.as_millis() as u64,
                            "ClickHouse target does not answer its probe yet");
                        *state
                            .shared
                            .last_probe_error
                            .lock()
                            .unwrap_or_else(|e| e.into_inner()) = Some(e.to_string());
                        myself.send_after(delay, || PoolMsg::ReadinessProbe);
                    }
                }
                state.publish(true);
            }
            PoolMsg::Tick => {
                state.idle_probe();
                state.publisher.dirty = true;
                state.publish(true);
            }
            PoolMsg::FlushAll(reply) => {
                let actors: Vec<_> = state
                    .tables
                    .values()
                    .filter_map(|e| e.actor.clone())
                    .collect();
                for a in actors {
                    let _ = a
                        .call(TableMsg::FlushAll, Some(Duration::from_secs(5)))
                        .await;
                }
                let _ = reply.send(());
            }
            PoolMsg::HandBackAll(reply) => {
                let actors: Vec<_> = state
                    .tables
                    .values()
                    .filter_map(|e| e.actor.clone())
                    .collect();
                let mut n = 0;
                for a in actors {
                    if let Ok(ractor::rpc::CallResult::Success(k)) = a
                        .call(TableMsg::HandBackAll, Some(Duration::from_secs(5)))
                        .await
                    {
                        n += k;
                    }
                }
                let _ = reply.send(n);
            }
            PoolMsg::Panic => panic!("injected panic in pool actor {}", state.shared.target),
            PoolMsg::PanicTable(key, reply) => {
                let actor = state.tables.get(&key).and_then(|e| e.actor.clone());
                let found = actor.is_some_and(|a| a.cast(TableMsg::Panic).is_ok());
                let _ = reply.send(found);
            }
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<Self::Msg>,
        evt: SupervisionEvent,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        // A retired table is no longer in `by_id`; anything else stopped unasked.
        if let Some((id, why)) = crate::supervisor::child_gone(evt) {
            state.table_down(&myself, id, why);
        }
        state.publish(false);
        Ok(())
    }
}
