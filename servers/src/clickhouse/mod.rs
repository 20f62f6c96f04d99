//! clickhouse-server: its configuration and a running one ([`ClickHouseServer`]),
//! optionally with a ZooKeeper for Replicated tables ([`Replication`]); shards of
//! replicas of them on one ZooKeeper ([`ClickHouseCluster`]).

mod cluster;
mod config;
mod current;
mod flavor;
mod replication;
mod server;

pub use cluster::{
    create_cluster_table, distributed, set_aside_parts_in_doubt, shard_urls, sync_replicas,
    ClickHouseCluster, CLUSTER,
};
pub use config::{
    DEFAULT_PASSWORD, DEFAULT_USER, INGEST_PASSWORD, INGEST_USER, QUERY_PASSWORD, QUERY_USER,
    SKIPPING_PASSWORD, SKIPPING_USER,
};
pub use flavor::{ClickHouseFlavor, CHDB_CORE_VERSION, CHDB_PYTHON_ENV, CLICKHOUSE_FLAVOR_ENV};
pub use replication::{replicated_merge_tree, Replication};
pub use server::{
    binary, ClickHouseOptions, ClickHouseServer, CLICKHOUSE_BIN_ENV, CLICKHOUSE_DEBIAN_BIN,
    CLICKHOUSE_READY_DEADLINE,
};
