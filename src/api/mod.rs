//! The HTTP surfaces clients use: ingest and query.

pub mod ingest;
pub mod tenant;
