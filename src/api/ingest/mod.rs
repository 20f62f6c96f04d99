//! `POST /v1/ingest/{table}`: rows into the ingest stream, never a silent drop.

mod chunk;
mod handler;
pub mod idempotency;
mod memory;
pub mod parse;
mod publishing;
mod reply;
mod scan;
mod tables;

pub use chunk::ChunkLimits;
pub use handler::{ingest, IngestState};
pub use memory::IngestMemory;
pub use publishing::{MAX_PUBLISHING, PIPELINE_WINDOW};
pub use reply::{IngestReply, MAX_LISTED_ERRORS};
pub use tables::{TenantTables, TooManyTables};
