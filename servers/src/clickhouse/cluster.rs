//! A ClickHouse cluster on one machine: `shards` × `replicas` clickhouse-servers on one
//! ZooKeeper root, each with its `{shard}` / `{replica}` macros and an interserver port
//! ([`Replication`]), and a `remote_servers` cluster [`CLUSTER`] naming every server by
//! its native port, for `Distributed` tables over the shards' local tables.
//!
//! The cluster section names every server's port, known only once each has started (a
//! port taken meanwhile is picked again), so it is written into each server's
//! `config.d/` afterwards and loaded with `SYSTEM RELOAD CONFIG`, then awaited in
//! `system.clusters`.
//!
//! About 250 MB per 18.16 server at rest: a 2 × 2 cluster takes ~1 GiB with its
//! ZooKeeper.

use std::time::Duration;

use anyhow::{bail, Context, Result};

use super::config::xml_escape;
use super::replication::{replicated_merge_tree, Replication};
use super::server::{ClickHouseOptions, ClickHouseServer};
use crate::zookeeper::ZooKeeperRoot;

/// The `remote_servers` cluster every server of a [`ClickHouseCluster`] knows.
pub const CLUSTER: &str = "sluice";

/// How long the servers may take to load the cluster section.
const CLUSTER_LOADED_WITHIN: Duration = Duration::from_secs(30);

/// `shards` × `replicas` servers, started shard by shard.
#[derive(Debug)]
pub struct ClickHouseCluster {
    /// Shard by shard: server `s * replicas + r` is replica `r` of shard `s`.
    pub nodes: Vec<ClickHouseServer>,
    pub shards: usize,
    pub replicas: usize,
}

impl ClickHouseCluster {
    /// Starts every server of the cluster on `root` (at once), then wires them into
    /// [`CLUSTER`].
    pub async fn start(root: &ZooKeeperRoot, shards: usize, replicas: usize) -> Result<Self> {
        if shards == 0 || replicas == 0 {
            bail!("a cluster needs at least one shard of one replica ({shards} x {replicas})");
        }
        let mut starting = tokio::task::JoinSet::new();
        for s in 0..shards {
            for r in 0..replicas {
                let replication = Replication::new(root.clone())
                    .shard(shard_name(s))
                    .replica(format!("r{}", r + 1));
                let options = ClickHouseOptions::default().replicated(replication);
                starting.spawn(async move {
                    (
                        s * replicas + r,
                        ClickHouseServer::start_with(options).await,
                    )
                });
            }
        }
        let mut started = Vec::new();
        while let Some(joined) = starting.join_next().await {
            let (index, server) = joined.context("a server's start panicked")?;
            started.push((index, server.context("starting a server of the cluster")?));
        }
        started.sort_by_key(|(index, _)| *index);
        let nodes = started.into_iter().map(|(_, server)| server).collect();
        let cluster = Self {
            nodes,
            shards,
            replicas,
        };
        cluster.wire().await?;
        Ok(cluster)
    }

    /// Replica `replica` of shard `shard` (both 0-based).
    pub fn node(&self, shard: usize, replica: usize) -> &ClickHouseServer {
        &self.nodes[shard * self.replicas + replica]
    }

    pub fn node_mut(&mut self, shard: usize, replica: usize) -> &mut ClickHouseServer {
        &mut self.nodes[shard * self.replicas + replica]
    }

    /// Each shard's servers' HTTP URLs, as `[clickhouse.targets.NAME] shards` takes
    /// them (one comma-separated string per shard).
    pub fn shard_urls(&self) -> Vec<String> {
        shard_urls(&self.nodes.iter().collect::<Vec<_>>(), self.replicas)
    }

    /// Writes the cluster section into every server and waits until each lists every
    /// server of it.
    async fn wire(&self) -> Result<()> {
        let xml = self.cluster_xml();
        for node in &self.nodes {
            let config_d = node.dir().join("config.d");
            std::fs::create_dir_all(&config_d)
                .with_context(|| format!("creating {}", config_d.display()))?;
            let path = config_d.join("cluster.xml");
            std::fs::write(&path, &xml).with_context(|| format!("writing {}", path.display()))?;
        }
        let want = self.nodes.len() as u64;
        for node in &self.nodes {
            crate::wait_for(
                "the cluster section to be loaded",
                CLUSTER_LOADED_WITHIN,
                Duration::from_millis(200),
                || async move {
                    // The server also looks at its files every few seconds by itself.
                    let _ = node.exec("SYSTEM RELOAD CONFIG").await;
                    let sql =
                        format!("SELECT count() FROM system.clusters WHERE cluster = '{CLUSTER}'");
                    let listed = node.count(&sql).await?;
                    if listed == want {
                        Ok(())
                    } else {
                        bail!("{listed} of {want} servers listed")
                    }
                },
            )
            .await
            // A server that stopped answering here died: its logs say why.
            .with_context(|| node.log_tail(40))?;
        }
        Ok(())
    }

    fn cluster_xml(&self) -> String {
        let mut shards = String::new();
        for shard in self.nodes.chunks(self.replicas) {
            shards.push_str(
                "      <shard>\n        <internal_replication>true</internal_replication>\n",
            );
            for node in shard {
                shards.push_str(&format!(
                    "        <replica><host>127.0.0.1</host><port>{}</port></replica>\n",
                    node.tcp_port()
                ));
            }
            shards.push_str("      </shard>\n");
        }
        format!(
            "<?xml version=\"1.0\"?>\n<yandex>\n  <remote_servers>\n    <{name}>\n{shards}    </{name}>\n  </remote_servers>\n</yandex>\n",
            name = xml_escape(CLUSTER)
        )
    }

    /// See [`create_cluster_table`].
    pub async fn create_table(&self, table: &str, columns: &str, order_by: &str) -> Result<()> {
        create_cluster_table(
            &self.nodes.iter().collect::<Vec<_>>(),
            table,
            columns,
            order_by,
        )
        .await
    }

    /// See [`sync_replicas`].
    pub async fn sync_replicas(&self, table: &str) -> Result<()> {
        sync_replicas(&self.nodes.iter().collect::<Vec<_>>(), table).await
    }
}

/// The deduplication window of the tables [`create_cluster_table`] makes: current
/// servers' default (18.16 has 100, which a redelivery at the chaos suite's pace can
/// outrun: Sluice then takes the table for at-least-once).
pub const CLUSTER_DEDUPLICATION_WINDOW: u32 = 1000;

/// Creates `table` (columns as in `columns`, e.g. `id UInt64, n UInt32`, sorted by
/// `order_by`) as a `ReplicatedMergeTree` on every one of a cluster's `nodes` (each
/// shard's local table, its replicas sharing its ZooKeeper path, with a window of
/// [`CLUSTER_DEDUPLICATION_WINDOW`] blocks), and `{table}_all`, a `Distributed` table
/// over them on every server: what a reader queries.
pub async fn create_cluster_table(
    nodes: &[&ClickHouseServer],
    table: &str,
    columns: &str,
    order_by: &str,
) -> Result<()> {
    for node in nodes {
        node.exec(&format!(
            "CREATE TABLE {table} ({columns}) ENGINE = {} ORDER BY {order_by} \
             SETTINGS replicated_deduplication_window = {CLUSTER_DEDUPLICATION_WINDOW}",
            replicated_merge_tree("default", table)
        ))
        .await?;
        node.exec(&format!(
            "CREATE TABLE {} AS {table} ENGINE = Distributed({CLUSTER}, default, {table})",
            distributed(table)
        ))
        .await?;
    }
    Ok(())
}

/// Waits until every one of a cluster's `nodes` fetched what its shard's other
/// replicas took of `table` (`SYSTEM SYNC REPLICA`): replication is asynchronous, and a
/// `Distributed` read takes a shard's rows from one of its replicas.
///
/// A failure names the node's tables and the tail of its log: once, after a kill -9 and
/// a restart of both replicas of a shard on 18.16, a node answered that `table` did not
/// exist (chaos `cluster_shard_down`, not reproduced since), and what it held then is the
/// only evidence of why.
pub async fn sync_replicas(nodes: &[&ClickHouseServer], table: &str) -> Result<()> {
    for node in nodes {
        if let Err(e) = node.exec(&format!("SYSTEM SYNC REPLICA {table}")).await {
            let tables = node
                .exec("SHOW TABLES")
                .await
                .unwrap_or_else(|e| format!("(SHOW TABLES failed: {e:#})"));
            return Err(e).with_context(|| {
                format!(
                    "syncing {table} on {}; its tables: [{}]; its log's tail:\n{}",
                    node.http_url(),
                    tables.split_whitespace().collect::<Vec<_>>().join(", "),
                    node.log_tail(40)
                )
            });
        }
    }
    Ok(())
}

/// Sets aside, on `node`, the active parts of its `table` (a `ReplicatedMergeTree`)
/// that its replica never registered in ZooKeeper; returns how many there were.
///
/// Why: an insert whose commit to ZooKeeper was cut (ZooKeeper stopped: 999 "Connection
/// loss", 319 "Unknown status") leaves its part on the replica while ZooKeeper may
/// never have got its block id; the client's retry lands as a new part, and 18.16 keeps
/// the first, in doubt, until its part check detaches it (up to 5 minutes). Detaching
/// and attaching the table again runs that check now (the part goes to `detached/` as
/// `ignored_*`), as an operator would: what is counted afterwards is what stays.
pub async fn set_aside_parts_in_doubt(node: &ClickHouseServer, table: &str) -> Result<usize> {
    let replica = node
        .exec(&format!(
            "SELECT zookeeper_path, replica_name FROM system.replicas \
             WHERE database = 'default' AND table = '{table}' FORMAT TabSeparated"
        ))
        .await?;
    let Some((zookeeper_path, replica_name)) = replica.trim().split_once('\t') else {
        bail!("{table} is not a replicated table on {}", node.http_url());
    };
    // Active parts first: a part a merge commits meanwhile is then in ZooKeeper's list.
    let active = node
        .exec(&format!(
            "SELECT name FROM system.parts \
             WHERE database = 'default' AND table = '{table}' AND active FORMAT TabSeparated"
        ))
        .await?;
    let registered: std::collections::HashSet<String> = node
        .exec(&format!(
            "SELECT name FROM system.zookeeper \
             WHERE path = '{zookeeper_path}/replicas/{replica_name}/parts' FORMAT TabSeparated"
        ))
        .await?
        .lines()
        .map(str::to_owned)
        .collect();
    let in_doubt = active
        .lines()
        .filter(|part| !part.is_empty() && !registered.contains(*part))
        .count();
    if in_doubt > 0 {
        node.exec(&format!("DETACH TABLE {table}")).await?;
        node.exec(&format!("ATTACH TABLE {table}"))
            .await
            .with_context(|| format!("attaching {table} again on {}", node.http_url()))?;
    }
    Ok(in_doubt)
}

/// The HTTP URLs of `nodes` (shard by shard, `replicas` each), one comma-separated
/// string per shard: what `[clickhouse.targets.NAME] shards` takes.
pub fn shard_urls(nodes: &[&ClickHouseServer], replicas: usize) -> Vec<String> {
    nodes
        .chunks(replicas.max(1))
        .map(|shard| {
            shard
                .iter()
                .map(|n| n.http_url())
                .collect::<Vec<_>>()
                .join(",")
        })
        .collect()
}

/// The `Distributed` table [`create_cluster_table`] makes over `table`.
pub fn distributed(table: &str) -> String {
    format!("{table}_all")
}

/// The `{shard}` macro of shard `s` (0-based): `01`, `02`...
fn shard_name(s: usize) -> String {
    format!("{:02}", s + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_are_named_as_their_zookeeper_paths_sort() {
        assert_eq!(shard_name(0), "01");
        assert_eq!(shard_name(10), "11");
        assert_eq!(distributed("events"), "events_all");
    }
}
