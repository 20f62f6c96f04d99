//! PoolActor: one per ClickHouse server (a replica of one of a target's shards). Owns
//! the server's outage breaker and its single probe token (its [`memory`] outlives it
//! through its target), publishes the breaker on its target's board for routing,
//! answers the tables' requests for flights to the server and hears their verdicts,
//! and probes the server for readiness and while idle.

pub mod actor;
pub mod memory;
pub mod messages;
pub mod turns;

pub use actor::{PoolActor, PoolArgs};
pub use memory::{PoolMemory, Readiness};
pub use messages::{PoolDebug, PoolMsg, PoolReport};
