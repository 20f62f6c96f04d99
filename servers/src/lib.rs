//! Local servers as child processes: what `sluice dev` runs, and what the test harness
//! (`sluice-harness`) builds on.
//!
//! - [`NatsServer`]: `nats-server -js` (Debian's 2.9.10 or a current one, see
//!   [`NatsFlavor`]) on free loopback ports, its store in a temp dir.
//! - [`NatsCluster`]: three (or five) of them joined in one JetStream cluster, each
//!   node its own store and ports, one of them killed, frozen or restarted at will;
//!   or a single standalone server.
//! - [`ClickHouseServer`]: `clickhouse-server` with users `default`, `ingest` and
//!   `query` (read-only), on free loopback ports, its data in a temp dir; with a
//!   [`Replication`] (a ZooKeeper root and macros) it can hold Replicated tables.
//! - [`ZooKeeper`]: a standalone ZooKeeper (Debian's package, run by `java`) on a free
//!   loopback port, its data in a temp dir. `sluice dev` does not use it; the tests of
//!   deduplicating (Replicated) tables do.
//! - [`ManagedProcess`]: any child (the servers included) that can be stopped, killed
//!   with SIGKILL, frozen with SIGSTOP, continued and started again with the same ports
//!   and data; it dies with this process and is killed and reaped on drop.
//! - [`free_port`] / [`free_addr`]: loopback ports outside the kernel's ephemeral range.
//! - [`wait_until`] / [`wait_for`]: poll a condition with a deadline instead of sleeping.
//!
//! Everything listens on 127.0.0.1 only. No test tooling lives here: the fault proxy,
//! the chaos tools and whole test stacks live in `sluice-harness`, which re-exports
//! every name of this crate.

pub mod clickhouse;
pub mod http;
pub mod nats;
pub mod ports;
pub mod process;
mod wait;
pub mod zookeeper;

pub use clickhouse::{
    ClickHouseFlavor, ClickHouseOptions, ClickHouseServer, Replication, DEFAULT_USER,
    INGEST_PASSWORD, INGEST_USER, QUERY_PASSWORD, QUERY_USER,
};
pub use http::{http_client_builder, loopback_client};
pub use nats::{NatsCluster, NatsFlavor, NatsServer};
pub use ports::{free_addr, free_port};
pub use process::{process_exists, ManagedProcess, ProcessSpec};
pub use wait::{wait_for, wait_until};
pub use zookeeper::{ZooKeeper, ZooKeeperRoot};
