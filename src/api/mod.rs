//! The HTTP surfaces clients use: ingest and query.
//!
//! The query surface lives in `crate::query` and is mounted with `query::router`;
//! what the surfaces share (tenant resolution, the headers sent once) lives here.

pub mod headers;
pub mod ingest;
pub mod tenant;
