//! Fakes for the ports: a recording [`FakeDelivery`] (with its [`Journal`]), a scripted
//! [`ScriptedInserter`] and an in-memory [`FakeSource`]. Used by this crate's tests and
//! the throughput example; public so the binary's tests can drive the tree too.
//!
//! One fake per file: `delivery.rs`, `errors.rs`, `inserter.rs`, `source.rs`, `store.rs`.

mod delivery;
mod errors;
mod inserter;
mod source;
mod store;

pub use delivery::*;
pub use errors::*;
pub use inserter::*;
pub use source::*;
pub use store::*;
