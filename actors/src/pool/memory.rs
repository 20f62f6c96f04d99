//! What outlives a PoolActor: its server's breaker, whether the server ever answered.
//! The pool sends a copy to its target whenever it changes; the target hands it to the
//! pool's successor (and keeps it in its own memory, should the target die too).

use crate::breaker::scoped::{BreakerScope, ScopedBreaker};
use crate::context::Common;
use crate::observe;
use crate::placement::Replica;

#[derive(Clone, Debug)]
pub struct PoolMemory {
    pub breaker: ScopedBreaker,
    pub readiness: Readiness,
}

/// The server's first answer (readiness) and what it said.
#[derive(Clone, Debug, Default)]
pub struct Readiness {
    /// The server answered one probe: `/readyz` needs it once, not again.
    pub probed_ok: bool,
    pub server_version: Option<String>,
    pub last_probe_error: Option<String>,
}

// === impl PoolMemory ===

impl PoolMemory {
    /// A pool's first memory: a closed breaker, never probed.
    pub fn new<I>(target: &str, replica: &Replica<I>, common: &Common) -> Self {
        Self {
            breaker: ScopedBreaker::new(
                BreakerScope::Pool {
                    target: std::sync::Arc::from(target),
                    replica: replica.name.clone(),
                },
                common.settings.pool_backoff,
                common.settings.log_every,
                common.jitter(&observe::pool_id(target, &replica.name)),
                replica.metrics.breaker.clone(),
            ),
            readiness: Readiness::default(),
        }
    }
}
