//! TableActor: one table's buffer, flush triggers (rows, bytes, age), its own backoff on
//! each server of its target ([`routes`]: and which server a batch goes to) and its
//! part of the batch ledger (it owns them). A flush runs as a spawned [`crate::flight`] whose
//! verdict and outcome come back as messages, so the mailbox is never blocked by
//! ClickHouse.

pub mod actor;
mod admission;
mod arrivals;
pub mod buffer;
mod flights;
pub mod lanes;
pub mod messages;
pub mod routes;
mod snapshot;
mod state;
pub mod strikes;
mod timers;

pub use actor::TableActor;
pub use messages::{TableDebug, TableMsg};
pub use state::{TableArgs, TableState};
