//! PoolActor: one per ClickHouse target. Owns the target's outage breaker (through a
//! shared [`Gate`](crate::gate::Gate) kept across pool restarts) and its single probe
//! token, probes the target for readiness, and spawns, supervises and reaps the
//! TableActors of every table whose tenant uses this target.

pub mod actor;
pub mod messages;

pub use actor::{PoolActor, PoolShared};
pub use messages::PoolMsg;
