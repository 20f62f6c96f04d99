//! `POST /v1/ingest/{table}`: rows into the ingest stream, never a silent drop.

mod handler;
pub mod parse;

pub use handler::{ingest, IngestReply, IngestState, MAX_PUBLISHING, PIPELINE_WINDOW};
