//! PoolActor: one per ClickHouse target. Owns the target's outage breaker and its single
//! probe token (its [`memory`] outlives it through the root supervisor), probes the
//! target for readiness and while idle, and spawns, supervises and reaps the
//! TableActors of every table whose tenant uses this target.

pub mod actor;
pub mod memory;
pub mod messages;

pub use actor::{PoolActor, PoolArgs};
pub use memory::{PoolMemory, Readiness, TableMemory};
pub use messages::{PoolDebug, PoolMsg, PoolReport};
