//! Everything that speaks to ClickHouse: the error classifier, the insert client,
//! whether a table's inserts are exactly-once, and the query gateway.

pub mod catalog;
pub mod classify;
pub mod dedup;
pub mod endpoint;
pub mod insert;
pub mod redelivery;
pub mod report;
pub mod table_info;
