//! `POST /v1/ingest/{table}`: rows into the ingest stream, never a silent drop.

mod handler;
pub mod parse;
mod scan;
mod tables;

pub use handler::{
    ingest, IngestReply, IngestState, MAX_LISTED_ERRORS, MAX_PUBLISHING, PIPELINE_WINDOW,
};
pub use tables::{TenantTables, TooManyTables};
