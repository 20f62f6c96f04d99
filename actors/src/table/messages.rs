//! What a TableActor is told (what it says to its target, its pools and its flights is
//! in `crate::protocol`).

use ractor::RpcReplyPort;

use crate::ledger::LedgerChange;
use crate::messaging::carried;
use crate::protocol::{FlightReport, Permit, PoolLink};

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
    /// A replica's pool answers [`crate::protocol::FlightRequest::WantsFlight`].
    Permit(Permit),
    /// A replica's pool (re)started, or is down (`None`): where the table asks for
    /// flights to it and reports their verdicts.
    PoolLink {
        replica: usize,
        link: Option<PoolLink>,
    },
    /// What one of its flights tells it: its verdict, then that it is done.
    Flight(FlightReport),
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

// === conversions for derived references ===

carried!(<D> Permit => TableMsg<D>, TableMsg::Permit);
carried!(<D> FlightReport => TableMsg<D>, TableMsg::Flight);
