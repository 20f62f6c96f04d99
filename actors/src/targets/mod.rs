//! TargetActor: one per ClickHouse target (a database on one server, or on a cluster of
//! shards of replicas). Supervises a PoolActor per server (each owning that server's
//! breaker) and the TableActors of every table whose tenant uses this target; routes
//! the consumer's messages to its tables, handing them back while no server takes rows;
//! keeps what its children must not forget (its [`memory`], which outlives it through
//! the root supervisor).

pub mod actor;
mod children;
pub mod memory;
pub mod messages;
mod state;

pub use actor::TargetActor;
pub use memory::{ReplicaMemory, TableMemory, TargetMemory};
pub use messages::{TargetDebug, TargetMsg, TargetReport};
pub use state::TargetArgs;
