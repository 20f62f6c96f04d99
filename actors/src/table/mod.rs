//! TableActor: one table's buffer, flush triggers (rows, bytes, age) and table-scoped
//! backoff. A flush runs as a spawned task ([`flush`]) whose outcome comes back as a
//! message, so the mailbox is never blocked by ClickHouse.

pub mod actor;
pub mod buffer;
pub mod flush;
pub mod messages;

pub use actor::{TableActor, TableArgs};
pub use flush::{FlightCtx, FlightOutcome};
pub use messages::TableMsg;
