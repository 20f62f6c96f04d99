//! What a PoolActor is told.

use ractor::{ActorId, RpcReplyPort};

use crate::ports::{InsertError, ServerInfo, TableKey};

pub enum PoolMsg<D> {
    /// A group of rows for one of this pool's tables (spawned on first use).
    Rows {
        key: TableKey,
        rows: Vec<D>,
    },
    /// A table has been idle long enough to be reaped.
    TableIdle {
        key: TableKey,
        id: ActorId,
    },
    /// Respawn a table that failed (after its restart delay).
    RespawnTable(TableKey),
    /// Probe the target for readiness (retried with backoff until it answers).
    ReadinessProbe,
    ProbeResult(Result<ServerInfo, InsertError>),
    /// Heartbeat: snapshot, idle probe of an ended window.
    Tick,
    /// Shutdown: every table flushes everything now.
    FlushAll(RpcReplyPort<()>),
    /// Shutdown past the deadline: every table hands back what it still buffers.
    HandBackAll(RpcReplyPort<usize>),
    /// Test/debug hooks.
    Panic,
    PanicTable(TableKey, RpcReplyPort<bool>),
}
