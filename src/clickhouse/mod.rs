//! Everything that speaks to ClickHouse: the error classifier, the insert client (one
//! per server, [`clients`] per target), whether a table's inserts are exactly-once.

pub mod catalog;
pub mod classify;
pub mod clients;
pub mod dedup;
pub mod endpoint;
pub mod features;
pub mod insert;
pub mod pinned;
pub mod ranges;
pub mod redelivery;
pub mod report;
pub mod shard;
pub mod table_info;
