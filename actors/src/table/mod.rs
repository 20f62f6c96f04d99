//! TableActor: one table's buffer, flush triggers (rows, bytes, age) and table-scoped
//! backoff (it owns it). A flush runs as a spawned [`flight`] whose verdict and outcome
//! come back as messages, so the mailbox is never blocked by ClickHouse.

pub mod actor;
pub mod buffer;
pub mod flight;
pub mod forming;
pub mod messages;
pub mod partly;
pub mod reforming;
pub mod strikes;
pub mod verdict;

pub use actor::{TableActor, TableArgs};
pub use flight::{FlightCtx, FlightOutcome};
pub use forming::Cargo;
pub use messages::{TableCarryOver, TableDebug, TableMsg, TableReport};
pub use verdict::{FlightVerdict, PendingRows, PoolVerdict, Tickets, Verdict};
