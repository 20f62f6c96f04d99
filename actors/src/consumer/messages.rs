//! What the ConsumerActor is told.

use ractor::{DerivedActorRef, RpcReplyPort};

use crate::routing::Routed;

pub enum ConsumerMsg<D> {
    Connect,
    Pull,
    /// The root (re)spawned target number `index`: route its tenants' rows there.
    TargetUp {
        index: usize,
        target: DerivedActorRef<Routed<D>>,
    },
    /// Target number `index` is down (restarting): its rows go back for a moment.
    TargetDown {
        index: usize,
    },
    /// Shutdown: stop pulling; answers once the batch in hand is routed.
    StopPulling(RpcReplyPort<()>),
    /// Fault injection (tests, and the admin's debug routes when enabled).
    Debug(ConsumerDebug),
}

/// The ConsumerActor's one debug message.
pub enum ConsumerDebug {
    Panic,
}
