//! ConsumerActor: pulls batches from the [`Source`](crate::ports::Source), groups each
//! batch by subject and sends ONE message per (tenant, table) group to that table's target;
//! reconnects through the [`SourceFactory`](crate::ports::SourceFactory) with backoff.

pub mod actor;
pub mod messages;

pub use actor::{ConsumerActor, ConsumerArgs, TargetLink};
pub use messages::{ConsumerDebug, ConsumerMsg};
