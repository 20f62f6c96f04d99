//! `POST /v1/ingest/{table}`: rows into the ingest stream, never a silent drop.

pub mod parse;
