//! What outlives a PoolActor: its target's breaker, its tables' backoffs and restart
//! records, whether the target ever answered. The pool sends a copy to the root
//! supervisor whenever it changes; the root hands it to the pool's successor.

use std::collections::HashMap;
use std::sync::Arc;

use crate::context::Common;
use crate::metrics::TargetMetrics;
use crate::ports::TableKey;
use crate::restart::RestartRecord;
use crate::scoped_breaker::{BreakerScope, ScopedBreaker};
use crate::table::TableCarryOver;

#[derive(Clone, Debug)]
pub struct PoolMemory {
    pub breaker: ScopedBreaker,
    pub tables: HashMap<TableKey, TableMemory>,
    pub readiness: Readiness,
}

/// What outlives one table's actor (kept by its pool).
#[derive(Clone, Debug, Default)]
pub struct TableMemory {
    /// Its backoff and missing-table wait, as it last reported them (`None`: never
    /// changed from new).
    pub carry_over: Option<TableCarryOver>,
    pub restarts: RestartRecord,
}

/// The target's first answer (readiness) and what it said.
#[derive(Clone, Debug, Default)]
pub struct Readiness {
    /// The target answered one probe: `/readyz` needs it once, not again.
    pub probed_ok: bool,
    pub server_version: Option<String>,
    pub last_probe_error: Option<String>,
}

// === impl PoolMemory ===

impl PoolMemory {
    /// A pool's first memory: a closed breaker, no tables, never probed.
    pub fn new(target: &Arc<str>, common: &Common, metrics: &TargetMetrics) -> Self {
        Self {
            breaker: ScopedBreaker::new(
                BreakerScope::Pool {
                    target: target.clone(),
                },
                common.settings.pool_backoff,
                common.settings.log_every,
                common.jitter(&crate::observe::pool_id(target)),
                metrics.breaker.clone(),
            ),
            tables: HashMap::new(),
            readiness: Readiness::default(),
        }
    }
}
