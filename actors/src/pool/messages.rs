//! What a PoolActor is told, and what it tells its target.

use crate::messaging::carried;
use ractor::ActorId;

use super::memory::PoolMemory;
use crate::breaker::Ticket;
use crate::ports::{ClickHouseError, ServerInfo};
use crate::protocol::FlightRequest;

pub enum PoolMsg {
    /// A table asks for a flight to this replica, or a flight reports its verdict
    /// (through a derived reference: see the `From` impls below).
    FromTable(FlightRequest),
    /// A table's actor stopped (its target saw it): a probe token its flight was
    /// given and never used comes back.
    TableGone(ActorId),
    /// Probe the server for readiness (retried with backoff until it answers once).
    ReadinessProbe,
    ReadinessResult(Result<ServerInfo, ClickHouseError>),
    /// The pool's own probe of its server came back: the one it sends when a window
    /// ended with no flight to probe, or the idle liveness probe while no traffic flows.
    OwnProbeDone {
        ticket: Ticket,
        result: Result<ServerInfo, ClickHouseError>,
    },
    /// Heartbeat: idle probes, snapshot.
    Tick,
    /// Fault injection (tests, and the admin's debug routes when enabled).
    Debug(PoolDebug),
}

/// The PoolActor's debug messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PoolDebug {
    /// Panic in the pool itself.
    Panic,
    /// Panic on the next table's request for a flight: the pool dies with a request in
    /// hand that it never answers (the table must not wait for that answer forever).
    PanicOnNextFlightRequest,
}

/// What a pool tells its target.
pub enum PoolReport {
    /// What the pool's successor must start from, should this pool die: sent whenever
    /// it changes (a breaker transition, readiness).
    Remember {
        replica: usize,
        memory: Box<PoolMemory>,
    },
}

// === conversions for derived references ===

carried!(FlightRequest => PoolMsg::FromTable);
