//! Real servers for Sluice's tests, and faults to inject between them.
//!
//! - [`NatsServer`]: `nats-server -js` (Debian's 2.9.10 or a current one, see
//!   [`NatsFlavor`]) on free loopback ports, its store in a temp dir.
//! - [`NatsCluster`]: three nats-servers in one JetStream cluster (one of them killed,
//!   frozen or restarted at will), and [`nats_cluster::ClusterView`]: which node leads
//!   a stream, a consumer, the meta group.
//! - [`ClickHouseServer`]: `clickhouse-server` with users `default`, `ingest` and
//!   `query` (read-only), on free loopback ports, its data in a temp dir; started with
//!   a [`Replication`] (a [`ZooKeeper`] root and macros) it holds Replicated tables,
//!   the only ones that deduplicate inserts on 18.16 ([`create_replicated_like`]).
//! - [`FaultProxy`]: an HTTP proxy between Sluice and ClickHouse that passes through,
//!   refuses, resets, stalls or answers anything, per request and scriptable.
//! - [`SluiceProcess`] / [`ManagedProcess`]: any child (servers included) that can be
//!   stopped, killed with SIGKILL, frozen with SIGSTOP, continued and started again
//!   with the same ports and data; it dies with the test process and is reaped on drop.
//! - [`browser`]: headless chromium that dumps a page's DOM after its scripts ran.
//! - [`Metrics`]: a parsed Prometheus page, for asserting names, labels and values.
//! - [`wait_until`] / [`wait_for`]: poll a condition with a deadline instead of sleeping.
//! - [`Stack`]: a whole deployment (servers, proxy, generated config, sluice processes).
//! - [`chaos`]: known rows, feeds under fault, quiescence and the exact reckoning of the
//!   chaos suite (`tests/chaos.rs`).
//!
//! Everything listens on 127.0.0.1 only.

pub mod browser;
pub mod chaos;
mod exactly_once;
pub mod nats_cluster;
pub mod prom;
pub mod proxy;
mod skip;
mod sluice;
mod stack;
mod tables;

// The servers and the process manager live in `sluice-servers` (so the `sluice` binary
// can start them without linking this crate); every name stays reachable from here.
use sluice_servers::http;
pub use sluice_servers::{clickhouse, nats, ports, process, zookeeper};
pub use sluice_servers::{
    free_addr, free_port, http_client_builder, loopback_client, process_exists, wait_for,
    wait_until, ClickHouseFlavor, ClickHouseOptions, ClickHouseServer, ManagedProcess, NatsCluster,
    NatsFlavor, NatsServer, ProcessSpec, Replication, ZooKeeper, ZooKeeperRoot, DEFAULT_USER,
    INGEST_PASSWORD, INGEST_USER, QUERY_PASSWORD, QUERY_USER,
};

pub use exactly_once::{check_config, exactly_once_gauges, exactly_once_reports};
pub use prom::{Metrics, Sample};
pub use proxy::{FaultProxy, Match, Mode, RequestRecord, Respond, Rule};
pub use skip::{available, servers_required, REQUIRE_SERVERS_ENV};
pub use sluice::SluiceProcess;
pub use stack::{parked_json, Stack, StackOptions, ADMIN_TOKEN, TENANT};
pub use tables::{create_replicated_like, create_replicated_like_at_default_window};
