//! The public HTTP API (the ingest and query listener): what is shared by its surfaces.
//!
//! The query surface lives in `crate::query` and is mounted with `query::router`; the
//! ingest surface will join it here.

pub mod tenant;
