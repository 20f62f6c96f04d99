//! The target's children: its servers' pools and its tables, spawned, told of each
//! other, and respawned with backoff when they fail.

use ractor::{Actor, ActorId, ActorRef, DerivedActorRef};
use tokio::time::Instant;

use super::messages::TargetMsg;
use super::state::{Child, TargetState};
use crate::metrics;
use crate::observe::NodeKind;
use crate::pool::{PoolActor, PoolArgs, PoolMsg};
use crate::ports::{Delivery, Inserter, TableKey};
use crate::protocol::{PoolLink, TableReport};
use crate::table::{TableActor, TableArgs, TableMsg};

impl<I: Inserter, D: Delivery> TargetState<I, D> {
    // --- pools ---

    /// Spawn (or respawn) a replica's pool. Awaited in the mailbox: `spawn_linked` only
    /// waits for the actor's registration and its `pre_start`, which builds its state
    /// and returns.
    pub(super) async fn spawn_pool(&mut self, myself: &ActorRef<TargetMsg<D>>, replica: usize) {
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

    pub(super) fn tell_tables_pool(&self, replica: usize, link: Option<PoolLink>) {
        for table in self.live_tables() {
            let _ = table.cast(TableMsg::PoolLink {
                replica,
                link: link.clone(),
            });
        }
    }

    pub(super) async fn on_respawn_pool(
        &mut self,
        myself: &ActorRef<TargetMsg<D>>,
        replica: usize,
    ) {
        if self.pools.get(replica).is_some_and(|p| p.actor.is_none()) {
            self.spawn_pool(myself, replica).await;
        }
    }

    // --- tables ---

    /// Spawn (or respawn) a table's actor. Awaited in the mailbox: `spawn_linked` only
    /// waits for the actor's registration and its `pre_start`, which builds its state
    /// and returns (no I/O, no waiting on another actor).
    pub(super) async fn spawn_table(
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
    pub(super) fn child_down(&mut self, myself: &ActorRef<TargetMsg<D>>, id: ActorId, why: String) {
        match self.by_id.remove(&id) {
            Some(Child::Table(key)) => self.table_down(myself, id, key, why),
            Some(Child::Pool(replica)) => self.pool_down(myself, id, replica, why),
            None => {}
        }
    }

    pub(super) fn pool_down(
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

    pub(super) fn table_down(
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

    pub(super) async fn on_respawn_table(
        &mut self,
        myself: &ActorRef<TargetMsg<D>>,
        key: TableKey,
    ) {
        if self.tables.get(&key).is_some_and(|e| e.actor.is_none()) {
            self.spawn_table(myself, &key).await;
        }
    }
}
