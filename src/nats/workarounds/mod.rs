//! What Sluice does because a nats-server release does not (each file says which
//! releases need it): a discard-new stream's byte budget kept exact ([`budget`]: before
//! 2.10.5), acked messages a crashed server left in the work queue removed
//! ([`stranded`], with the sequences acked here that it needs: [`acked_here`]).

pub(super) mod acked_here;
pub(super) mod budget;
pub(super) mod stranded;
