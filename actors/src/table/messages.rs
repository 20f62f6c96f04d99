//! What a TableActor is told; what it tells its target, and what it (or its flight)
//! asks of, and tells, the pool of the replica a batch goes to.

use std::time::Duration;

use ractor::{ActorId, DerivedActorRef, RpcReplyPort};
use tokio::time::Instant;

use super::verdict::{FlightOutcome, FlightVerdict, PendingRows, PoolVerdict};
use crate::breaker::scoped::ScopedBreaker;
use crate::breaker::Ticket;
use crate::ledger::LedgerChange;
use crate::ports::TableKey;

pub enum TableMsg<D> {
    /// Messages routed to this table (one actor message per pulled group, never per
    /// JetStream message).
    Messages(Vec<D>),
    /// Changes of the table's recorded batches, in the order the store saw them
    /// (routed ahead of the messages pulled after them).
    Ledger(Vec<LedgerChange>),
    /// The store's changes could not be told one by one: start the ledger's index
    /// again from the store's snapshot.
    LedgerResync,
    /// The age trigger of the rows buffered at arming time (generation-stamped).
    AgeDue(u64),
    /// The wait for the messages of a recorded batch (by id) is over: it flies with
    /// what came, the rest read from the stream.
    ReformDue(String),
    /// A replica's pool answers [`FlightRequest::WantsFlight`].
    Permit(Permit),
    /// A replica's pool (re)started, or is down (`None`): where the table asks for
    /// flights to it and reports their verdicts.
    PoolLink {
        replica: usize,
        link: Option<PoolLink>,
    },
    /// A flight's verdict, sent as soon as it is known (before its rows are settled),
    /// so the breakers learn it at once.
    Verdict(FlightVerdict),
    /// A flight settled every row.
    FlightDone(FlightOutcome),
    /// Heartbeat: snapshot, age check, progress for rows held long, idleness.
    Tick,
    /// A snapshot publication that was too soon when the state changed.
    Publish,
    /// Shutdown: flush everything now, ignoring age and the in-flight limit.
    FlushAll(RpcReplyPort<()>),
    /// Shutdown, past the deadline: hand back whatever is still buffered, at once.
    HandBackAll(RpcReplyPort<usize>),
    /// The pool reaps this idle table: flush what came meanwhile, then stop.
    Retire,
    /// Fault injection (tests, and the admin's debug routes when enabled).
    Debug(TableDebug),
}

/// The TableActor's one debug message.
pub enum TableDebug {
    Panic,
}

/// What outlives a TableActor (a panic, a reap while it waits): kept by its target and
/// handed to the table's next actor, so a restart neither closes a backoff early nor
/// starts a missing table's grace (and its WARN) over.
#[derive(Clone, Debug)]
pub struct TableCarryOver {
    /// The table's own backoff for each replica of its target (by replica index).
    pub backoffs: Vec<ScopedBreaker>,
    /// Since when ClickHouse says the table does not exist (see `missing_table_grace`).
    pub missing_since: Option<Instant>,
}

impl TableCarryOver {
    /// Whether a reaped table must leave it behind for its next arrival.
    pub fn still_running(&self) -> bool {
        self.backoffs.iter().any(|b| !b.is_closed()) || self.missing_since.is_some()
    }
}

/// Where a table asks a replica's pool for flights: a derived reference, so the table
/// knows nothing of the pool's messages.
pub type PoolLink = DerivedActorRef<FlightRequest>;

/// What a table (or its flight) asks of, or tells, the pool of one replica.
pub enum FlightRequest {
    /// A batch is due: may a flight go to this replica? Answered through `reply`.
    WantsFlight {
        key: TableKey,
        id: ActorId,
        reply: DerivedActorRef<Permit>,
    },
    /// A flight's verdict for the replica's breaker (boxed: once per flight, and it
    /// carries a whole ClickHouse error, while every flight's `WantsFlight` is small).
    Verdict(Box<VerdictReport>),
}

/// A replica's pool's answer to [`FlightRequest::WantsFlight`]: go with its ticket, or
/// not now (this long).
pub struct Permit {
    pub replica: usize,
    pub answer: Result<Ticket, Duration>,
}

/// A flight's verdict for the breaker of the replica it went to. A pool outage's
/// `reply` gets what becomes of the flight's pending rows.
pub struct VerdictReport {
    pub key: TableKey,
    pub replica: usize,
    pub verdict: PoolVerdict,
    pub reply: Option<RpcReplyPort<PendingRows>>,
}

/// What a table tells its target (through a derived reference: the table knows nothing
/// of the target's messages).
pub enum TableReport {
    /// What the table's successor must start from changed (its backoffs, the missing
    /// table's wait): the target keeps a copy.
    CarryOver {
        key: TableKey,
        carry: Box<TableCarryOver>,
    },
    /// The table has been idle long enough to be reaped.
    Idle { key: TableKey, id: ActorId },
    /// A verdict whose replica's pool could not be told (restarting): the target hands
    /// it to the pool's successor.
    Verdict(VerdictReport),
}

// === conversions for derived references ===

impl<D> From<Permit> for TableMsg<D> {
    fn from(permit: Permit) -> Self {
        TableMsg::Permit(permit)
    }
}

impl<D> TryFrom<TableMsg<D>> for Permit {
    type Error = ();

    fn try_from(msg: TableMsg<D>) -> Result<Self, ()> {
        match msg {
            TableMsg::Permit(permit) => Ok(permit),
            _ => Err(()),
        }
    }
}
