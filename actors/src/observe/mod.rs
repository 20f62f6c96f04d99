//! The live actor tree for `GET /admin/actors` and `/readyz` (quickwit's observe
//! pattern): each actor publishes a serializable snapshot of its state into a shared
//! registry when it changes, and an observer reads the registry without messaging or
//! waiting on any actor. Beside it, the pipeline's running totals.
//!
//! This module and [`crate::metrics`] are the only places in the crate that keep shared
//! state behind a lock or an atomic: they record what the actors decided, they never
//! take part in a decision. The [`ReplicaBoard`] is read by routing to pick whom to
//! ask; the replica's pool still decides.

pub mod board;
pub mod flight_watch;
mod frame;
mod registry;
mod snapshots;
mod stats;
mod throttle;

pub use board::ReplicaBoard;
pub use frame::{Frame, Observed};
pub use registry::{
    consumer_id, pool_id, table_id, target_id, NodeId, Registry, TreeNode, CONSUMER_ID, ROOT_ID,
};
pub use snapshots::{
    BatchRoute, ConsumerSnapshot, FlightSnapshot, FlightStage, MissingTableSnapshot, NodeKind,
    NodeState, NodeStatus, PoolSnapshot, ReplicaBackoff, TableSnapshot, TargetSnapshot,
};
pub use stats::{Stats, StatsSnapshot};
pub use throttle::SnapshotThrottle;
