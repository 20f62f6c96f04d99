//! clickhouse-server: its configuration and a running one ([`ClickHouseServer`]).

mod config;
mod server;

pub use config::{
    DEFAULT_PASSWORD, DEFAULT_USER, INGEST_PASSWORD, INGEST_USER, QUERY_PASSWORD, QUERY_USER,
};
pub use server::{
    binary, ClickHouseServer, CLICKHOUSE_BIN_ENV, CLICKHOUSE_DEBIAN_BIN, CLICKHOUSE_READY_DEADLINE,
};
