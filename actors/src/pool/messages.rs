//! What a PoolActor is told, and what it tells the root supervisor.

use ractor::RpcReplyPort;

use super::memory::PoolMemory;
use crate::breaker::Ticket;
use crate::ports::{ClickHouseError, ServerInfo, TableKey};
use crate::routing::Routed;
use crate::table::TableReport;

pub enum PoolMsg<D> {
    /// Messages or ledger changes for this pool's tables (a table is spawned on its
    /// first messages), from the consumer (through a derived reference: see the `From`
    /// impls below).
    Routed(Routed<D>),
    /// What one of the pool's tables says (through a derived reference).
    FromTable(TableReport),
    /// Respawn a table that failed (after its restart delay).
    RespawnTable(TableKey),
    /// Probe the target for readiness (retried with backoff until it answers once).
    ReadinessProbe,
    ReadinessResult(Result<ServerInfo, ClickHouseError>),
    /// The pool's own probe of its target came back: the one it sends when a window
    /// ended with no flush to probe, or the idle liveness probe while no traffic flows.
    OwnProbeDone {
        ticket: Ticket,
        result: Result<ServerInfo, ClickHouseError>,
    },
    /// Heartbeat: idle probes, snapshot.
    Tick,
    /// Shutdown: every table flushes everything now; answered when each has.
    FlushAll(RpcReplyPort<()>),
    /// Shutdown past the deadline: every table hands back what it still buffers.
    HandBackAll(RpcReplyPort<usize>),
    /// Fault injection (tests, and the admin's debug routes when enabled).
    Debug(PoolDebug),
}

/// The PoolActor's one debug message.
pub enum PoolDebug {
    /// Panic in the pool itself.
    Panic,
    /// Panic in the table's actor; answers whether one runs.
    PanicTable(TableKey, RpcReplyPort<bool>),
}

/// What a pool tells the root supervisor.
pub enum PoolReport {
    /// What the pool's successor must start from, should this pool die: sent whenever
    /// it changes (a breaker transition, a table's backoff or restart, readiness).
    Remember {
        index: usize,
        memory: Box<PoolMemory>,
    },
}

// === conversions for derived references ===

impl<D> From<Routed<D>> for PoolMsg<D> {
    fn from(routed: Routed<D>) -> Self {
        PoolMsg::Routed(routed)
    }
}

impl<D> TryFrom<PoolMsg<D>> for Routed<D> {
    type Error = ();

    fn try_from(msg: PoolMsg<D>) -> Result<Self, ()> {
        match msg {
            PoolMsg::Routed(routed) => Ok(routed),
            _ => Err(()),
        }
    }
}

impl<D> From<TableReport> for PoolMsg<D> {
    fn from(report: TableReport) -> Self {
        PoolMsg::FromTable(report)
    }
}

impl<D> TryFrom<PoolMsg<D>> for TableReport {
    type Error = ();

    fn try_from(msg: PoolMsg<D>) -> Result<Self, ()> {
        match msg {
            PoolMsg::FromTable(report) => Ok(report),
            _ => Err(()),
        }
    }
}
