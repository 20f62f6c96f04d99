//! `POST /v1/ingest/{table}`: rows into the ingest stream, never a silent drop.

mod chunk;
mod handler;
mod memory;
pub mod parse;
mod publishing;
mod scan;
mod tables;

pub use chunk::ChunkLimits;
pub use handler::{ingest, IngestReply, IngestState, MAX_LISTED_ERRORS};
pub use memory::IngestMemory;
pub use publishing::{MAX_PUBLISHING, PIPELINE_WINDOW};
pub use tables::{TenantTables, TooManyTables};
