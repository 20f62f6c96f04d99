//! What outlives a TargetActor: each of its servers' pool memories (breaker,
//! readiness) and restart records, its tables' backoffs and restart records. The target
//! sends a copy to the root supervisor whenever it changes; the root hands it to the
//! target's successor, which starts its pools and tables from it.

use std::collections::BTreeMap;

use crate::context::Common;
use crate::placement::TargetServers;
use crate::pool::PoolMemory;
use crate::ports::TableKey;
use crate::protocol::TableCarryOver;
use crate::restart::RestartRecord;

#[derive(Clone, Debug)]
pub struct TargetMemory {
    /// By replica index.
    pub pools: Vec<ReplicaMemory>,
    pub tables: BTreeMap<TableKey, TableMemory>,
}

/// What outlives one server's pool (kept by its target).
#[derive(Clone, Debug)]
pub struct ReplicaMemory {
    pub pool: PoolMemory,
    pub restarts: RestartRecord,
}

/// What outlives one table's actor (kept by its target).
#[derive(Clone, Debug, Default)]
pub struct TableMemory {
    /// Its backoffs and missing-table wait, as it last reported them (`None`: never
    /// changed from new).
    pub carry_over: Option<TableCarryOver>,
    pub restarts: RestartRecord,
}

// === impl TargetMemory ===

impl TargetMemory {
    /// A target's first memory: every server's breaker closed and never probed, no
    /// tables.
    pub fn new<I>(servers: &TargetServers<I>, common: &Common) -> Self {
        Self {
            pools: servers
                .replicas
                .iter()
                .map(|r| ReplicaMemory {
                    pool: PoolMemory::new(&servers.target, r, common),
                    restarts: RestartRecord::default(),
                })
                .collect(),
            tables: BTreeMap::new(),
        }
    }
}
