//! What a TargetActor is told, and what it tells the root supervisor.

use crate::messaging::carried;
use ractor::RpcReplyPort;

use super::memory::TargetMemory;
use crate::pool::{PoolDebug, PoolReport};
use crate::ports::TableKey;
use crate::protocol::TableReport;
use crate::routing::Routed;

pub enum TargetMsg<D> {
    /// Messages or ledger changes for this target's tables (a table is spawned on its
    /// first messages), from the consumer (through a derived reference: see the `From`
    /// impls below).
    Routed(Routed<D>),
    /// What one of the target's tables says (through a derived reference).
    FromTable(TableReport),
    /// What one of the target's pools says (through a derived reference).
    FromPool(PoolReport),
    /// Respawn a table that failed (after its restart delay).
    RespawnTable(TableKey),
    /// Respawn the pool of a replica that failed (after its restart delay).
    RespawnPool(usize),
    /// Heartbeat: snapshot.
    Tick,
    /// Shutdown: every table flushes everything now; answered when each has.
    FlushAll(RpcReplyPort<()>),
    /// Shutdown past the deadline: every table hands back what it still buffers.
    HandBackAll(RpcReplyPort<usize>),
    /// Fault injection (tests, and the admin's debug routes when enabled).
    Debug(TargetDebug),
}

/// The TargetActor's one debug message.
pub enum TargetDebug {
    /// Panic in the target itself (its pools and tables go with it).
    Panic,
    /// Panic in the table's actor; answers whether one runs.
    PanicTable(TableKey, RpcReplyPort<bool>),
    /// Panic in the pool of the replica of this name (at once, or on its next
    /// request); answers whether one runs.
    PanicPool(String, PoolDebug, RpcReplyPort<bool>),
}

/// What a target tells the root supervisor.
pub enum TargetReport {
    /// What the target's successor must start from, should this target die: sent
    /// whenever it changes (a pool's memory, a table's backoff or restart).
    Remember {
        index: usize,
        memory: Box<TargetMemory>,
    },
}

// === conversions for derived references ===

carried!(<D> Routed<D> => TargetMsg<D>, TargetMsg::Routed);
carried!(<D> TableReport => TargetMsg<D>, TargetMsg::FromTable);
carried!(<D> PoolReport => TargetMsg<D>, TargetMsg::FromPool);
