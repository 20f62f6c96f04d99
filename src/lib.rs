//! Sluice: moves JSON rows from NATS JetStream into ClickHouse and never loses one,
//! plus a query gateway that cannot turn a ClickHouse overload into a retry storm.

pub mod admin;
pub mod api;
pub mod cli;
pub mod clickhouse;
pub mod config;
pub mod dev;
pub mod http;
pub mod nats;
pub mod openapi;
pub mod query;
pub mod server;
pub mod telemetry;
