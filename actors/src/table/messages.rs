//! What a TableActor is told, and what it tells its pool.

use std::time::Duration;

use ractor::{ActorId, RpcReplyPort};
use tokio::time::Instant;

use super::verdict::{FlightOutcome, FlightVerdict, PendingRows, PoolVerdict};
use crate::breaker::Ticket;
use crate::ledger::LedgerChange;
use crate::ports::TableKey;
use crate::scoped_breaker::ScopedBreaker;

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
    /// The pool's answer to [`TableReport::WantsFlight`]: go with the pool's ticket, or
    /// hand the batch back with this delay.
    Permit(Result<Ticket, Duration>),
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

/// What outlives a TableActor (a panic, a reap while it waits): kept by its pool and
/// handed to the table's next actor, so a restart neither closes a backoff early nor
/// starts a missing table's grace (and its WARN) over.
#[derive(Clone, Debug)]
pub struct TableCarryOver {
    pub backoff: ScopedBreaker,
    /// Since when ClickHouse says the table does not exist (see `missing_table_grace`).
    pub missing_since: Option<Instant>,
}

impl TableCarryOver {
    /// Whether a reaped table must leave it behind for its next arrival.
    pub fn still_running(&self) -> bool {
        !self.backoff.is_closed() || self.missing_since.is_some()
    }
}

/// What a table tells its pool. The pool turns it into its own message (it hands each
/// table a derived reference), so the table knows nothing of the pool's messages.
pub enum TableReport {
    /// A batch is due: may a flight go? Answered by [`TableMsg::Permit`].
    WantsFlight { key: TableKey, id: ActorId },
    /// A flight's verdict for the pool's breaker. A pool outage's `reply` gets what
    /// becomes of the flight's pending rows.
    Verdict {
        key: TableKey,
        verdict: PoolVerdict,
        reply: Option<RpcReplyPort<PendingRows>>,
    },
    /// What the table's successor must start from changed (its backoff, the missing
    /// table's wait): the pool keeps a copy.
    CarryOver {
        key: TableKey,
        carry: Box<TableCarryOver>,
    },
    /// The table has been idle long enough to be reaped.
    Idle { key: TableKey, id: ActorId },
}
