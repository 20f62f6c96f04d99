//! ConsumerActor: pulls batches from the [`Source`](crate::ports::Source), groups each
//! batch by subject and sends ONE message per (tenant, table) group to that table's pool;
//! reconnects through the [`SourceFactory`](crate::ports::SourceFactory) with backoff.

pub mod actor;
pub mod routing;

pub use actor::{ConsumerActor, ConsumerArgs, ConsumerMsg};
pub use routing::{parse_subject, Route, Router};
