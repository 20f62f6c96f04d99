//! The TargetActor's state: its pools and tables, and what it keeps of each.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use ractor::{ActorId, ActorRef, DerivedActorRef};
use tokio::time::Instant;

use super::memory::{ReplicaMemory, TableMemory, TargetMemory};
use super::messages::TargetReport;
use crate::context::Common;
use crate::flight::FlightCtx;
use crate::metrics::TableMetrics;
use crate::observe::{self, Frame, NodeState, Observed, TargetSnapshot};
use crate::placement::TargetServers;
use crate::pool::PoolMsg;
use crate::ports::{Delivery, Inserter, TableKey};
use crate::protocol::{PoolLink, TableReport};
use crate::table::TableMsg;

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

pub(super) struct TableEntry<I, D> {
    pub(super) actor: Option<ActorRef<TableMsg<D>>>,
    pub(super) ctx: Arc<FlightCtx<I>>,
    pub(super) node_id: String,
    pub(super) respawn_at: Option<Instant>,
    /// A table actor found dead by `route` before its supervision event came: the
    /// event, when it comes, only brings the reason (the panic message).
    pub(super) down_unreported: Option<ActorId>,
    pub(super) memory: TableMemory,
}

pub(super) struct PoolEntry {
    pub(super) actor: Option<ActorRef<PoolMsg>>,
    pub(super) node_id: String,
    pub(super) memory: ReplicaMemory,
    /// Spawns failed in a row (past `max_spawn_failures` the pipeline cannot go on).
    pub(super) spawn_failures: u32,
}

/// A child of the target.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Child {
    Pool(usize),
    Table(TableKey),
}

pub struct TargetState<I, D> {
    pub(super) index: usize,
    pub(super) servers: Arc<TargetServers<I>>,
    pub(super) common: Arc<Common>,
    pub(super) root: DerivedActorRef<TargetReport>,
    pub(super) orphans: DerivedActorRef<TableReport>,
    pub(super) pools: Vec<PoolEntry>,
    pub(super) tables: BTreeMap<TableKey, TableEntry<I, D>>,
    pub(super) by_id: HashMap<ActorId, Child>,
    /// The memory the root holds is out of date.
    pub(super) memory_dirty: bool,
    /// Its place in the live tree.
    pub(super) frame: Frame,
}

// === impl TargetState ===

impl<I: Inserter, D: Delivery> TargetState<I, D> {
    pub(super) fn new(args: TargetArgs<I>) -> Self {
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
            frame: args.common.frame(node_id),
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

    pub(super) fn target(&self) -> &Arc<str> {
        &self.servers.target
    }

    pub(super) fn memory(&self) -> TargetMemory {
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
    pub(super) fn remember(&mut self) {
        if std::mem::take(&mut self.memory_dirty) {
            let _ = self.root.send_message(TargetReport::Remember {
                index: self.index,
                memory: Box::new(self.memory()),
            });
        }
    }

    pub(super) fn entry(&mut self, key: &TableKey) -> &mut TableEntry<I, D> {
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
    pub(super) fn pool_links(&self) -> Vec<Option<PoolLink>> {
        self.pools
            .iter()
            .map(|p| p.actor.as_ref().map(ActorRef::get_derived))
            .collect()
    }

    pub(super) fn live_tables(&self) -> Vec<ActorRef<TableMsg<D>>> {
        self.tables
            .values()
            .filter_map(|e| e.actor.clone())
            .collect()
    }

    pub(super) fn live_pools(&self) -> impl Iterator<Item = &ActorRef<PoolMsg>> {
        self.pools.iter().filter_map(|p| p.actor.as_ref())
    }
}

impl<I: Inserter, D: Delivery> Observed for TargetState<I, D> {
    fn frame(&mut self) -> &mut Frame {
        &mut self.frame
    }

    fn snapshot(&self) -> NodeState {
        NodeState::Target(TargetSnapshot {
            target: self.target().to_string(),
            shards: self.servers.shard_names(),
            tables: self.tables.values().filter(|e| e.actor.is_some()).count(),
        })
    }
}
