//! Everything that speaks to ClickHouse: the error classifier, the insert client and
//! the query gateway.

pub mod catalog;
pub mod classify;
pub mod dedup;
pub mod endpoint;
pub mod insert;
