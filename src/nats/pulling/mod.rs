//! Pulling from the durable consumer: the actors' `Source` ([`source`]), the message
//! as the actors see it and the ways it leaves ([`delivery`]), the rows this instance
//! holds, and what notices a pull or a consumer that stopped moving
//! (a stalled process, a lost pull, a stuck consumer) and what a status or an ack
//! address says.

pub(super) mod delivery;
pub(super) mod held;
pub(super) mod lost_pull;
pub(super) mod pull_status;
pub(super) mod reply;
pub(super) mod requests;
pub(super) mod source;
pub(super) mod stall;
pub(super) mod stuck_consumer;
