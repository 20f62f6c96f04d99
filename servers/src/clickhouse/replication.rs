//! Replicated tables: the `<zookeeper>` section and the `<macros>` a clickhouse-server
//! needs for `ReplicatedMergeTree`, written as `config.d/replication.xml` beside the
//! main config (ClickHouse merges every file of `config.d/` into it).

use std::path::Path;

use anyhow::{Context, Result};

use super::config::xml_escape;
use crate::zookeeper::ZooKeeperRoot;

/// Where a ClickHouse keeps its Replicated tables' metadata, and its names as a replica.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Replication {
    pub zookeeper: ZooKeeperRoot,
    /// The `{shard}` macro.
    pub shard: String,
    /// The `{replica}` macro: two ClickHouses with one root need different ones.
    pub replica: String,
}

// === impl Replication ===

impl Replication {
    /// Shard `01`, replica `r1`.
    pub fn new(zookeeper: ZooKeeperRoot) -> Self {
        Self {
            zookeeper,
            shard: "01".into(),
            replica: "r1".into(),
        }
    }

    pub fn replica(mut self, replica: impl Into<String>) -> Self {
        self.replica = replica.into();
        self
    }

    /// The `{shard}` macro: the replicas of one shard share it (and so their tables'
    /// ZooKeeper paths); two shards need different ones.
    pub fn shard(mut self, shard: impl Into<String>) -> Self {
        self.shard = shard.into();
        self
    }

    /// Writes `config.d/replication.xml` into the server's dir, with an interserver port
    /// of its own (at each start attempt; the one that started is the server's for good,
    /// restarts included).
    pub(crate) fn write(&self, dir: &Path) -> Result<()> {
        let config_d = dir.join("config.d");
        std::fs::create_dir_all(&config_d)
            .with_context(|| format!("creating {}", config_d.display()))?;
        let path = config_d.join("replication.xml");
        let interserver = crate::ports::free_port()?;
        std::fs::write(&path, self.xml(interserver))
            .with_context(|| format!("writing {}", path.display()))
    }

    /// A replica announces where the others can fetch its parts (`interserver_http_*`):
    /// without it 18.16 takes the table read-only when it starts again ("Parameter
    /// 'interserver_http(s)_port' required for replication is not specified").
    fn xml(&self, interserver: u16) -> String {
        let ZooKeeperRoot { addr, path } = &self.zookeeper;
        format!(
            r#"<?xml version="1.0"?>
<yandex>
  <interserver_http_host>127.0.0.1</interserver_http_host>
  <interserver_http_port>{interserver}</interserver_http_port>
  <zookeeper>
    <node><host>{host}</host><port>{port}</port></node>
    <root>{root}</root>
  </zookeeper>
  <macros>
    <shard>{shard}</shard>
    <replica>{replica}</replica>
  </macros>
</yandex>
"#,
            host = addr.ip(),
            port = addr.port(),
            root = xml_escape(path),
            shard = xml_escape(&self.shard),
            replica = xml_escape(&self.replica),
        )
    }
}

/// The engine clause of a Replicated table `database.table` on a server started with
/// [`Replication`]: its path in ZooKeeper is made of the macros, so each table has its
/// own and replicas of one table share it.
pub fn replicated_merge_tree(database: &str, table: &str) -> String {
    format!("ReplicatedMergeTree('/clickhouse/tables/{{shard}}/{database}/{table}', '{{replica}}')")
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;

    use super::*;

    #[test]
    fn the_section_points_at_the_root_with_the_macros() {
        let root = ZooKeeperRoot {
            addr: SocketAddr::from(([127, 0, 0, 1], 2181)),
            path: "/clickhouse-1-0".into(),
        };
        let xml = Replication::new(root).replica("r2").xml(18123);
        for part in [
            "<node><host>127.0.0.1</host><port>2181</port></node>",
            "<root>/clickhouse-1-0</root>",
            "<shard>01</shard>",
            "<replica>r2</replica>",
            "<interserver_http_port>18123</interserver_http_port>",
        ] {
            assert!(xml.contains(part), "{part} missing from:\n{xml}");
        }
        assert_eq!(
            replicated_merge_tree("default", "events"),
            "ReplicatedMergeTree('/clickhouse/tables/{shard}/default/events', '{replica}')"
        );
    }
}
