//! What a TableActor is told.

use ractor::RpcReplyPort;

use super::flush::FlightOutcome;

pub enum TableMsg<D> {
    /// A group of rows routed to this table (one message per pulled group, never per row).
    Rows(Vec<D>),
    /// The age trigger of the rows buffered at arming time (generation-stamped).
    AgeDue(u64),
    /// A flight finished: every one of its rows is settled.
    FlightDone(FlightOutcome),
    /// Heartbeat: snapshot, age check, idleness.
    Tick,
    /// A snapshot publication that was too soon when the state changed.
    Publish,
    /// Shutdown: flush everything now, ignoring age and the in-flight limit.
    FlushAll(RpcReplyPort<()>),
    /// Shutdown, past the deadline: hand back whatever is still buffered, at once.
    HandBackAll(RpcReplyPort<usize>),
    /// The pool reaps this idle table: flush what came meanwhile, then stop.
    Retire,
    /// Test/debug hook: panic inside the actor.
    Panic,
}
