//! A ClickHouse cluster as the harness runs it: two shards of two replicas of 18.16 on
//! one ZooKeeper. What the design of shards in Sluice rests on, measured here: the
//! same block inserted on both replicas of a shard counts once (they share the block
//! ids in ZooKeeper); on another shard it counts again; a `Distributed` table over the
//! shards' local tables reads all of them from any server.

use anyhow::Result;
use sluice_harness::clickhouse::{distributed, ClickHouseCluster, CLUSTER};
use sluice_harness::{available, clickhouse, zookeeper, ZooKeeper};

const ROWS: &str = "{\"id\":1}\n{\"id\":2}\n{\"id\":3}\n";

fn installed(test: &str) -> Result<bool> {
    Ok(available(test, zookeeper::jar())?.is_some()
        && available(test, clickhouse::binary())?.is_some())
}

#[tokio::test]
async fn a_block_sent_to_both_replicas_of_a_shard_counts_once_and_on_another_shard_twice(
) -> Result<()> {
    if !installed(
        "a_block_sent_to_both_replicas_of_a_shard_counts_once_and_on_another_shard_twice",
    )? {
        return Ok(());
    }
    let zookeeper = ZooKeeper::start().await?;
    let root = zookeeper.new_root().await?;
    let cluster = ClickHouseCluster::start(&root, 2, 2).await?;
    cluster.create_table("events", "id UInt64", "id").await?;
    let sql = format!("INSERT INTO events FORMAT JSONEachRow\n{ROWS}");
    let insert = |shard: usize, replica: usize| cluster.node(shard, replica).exec(&sql);
    insert(0, 0).await?;
    insert(0, 1).await?;
    // Replication is asynchronous: a replica may not have fetched its twin's part yet.
    cluster.sync_replicas("events").await?;
    let all = distributed("events");
    for (shard, replica) in [(0, 0), (0, 1), (1, 0), (1, 1)] {
        let n = cluster.node(shard, replica).count(&all).await?;
        assert_eq!(
            n, 3,
            "the twin deduplicated the block; read from ({shard}, {replica})"
        );
    }
    insert(1, 0).await?;
    cluster.sync_replicas("events").await?;
    assert_eq!(
        cluster.node(0, 1).count(&all).await?,
        6,
        "another shard took it again"
    );
    // Each server knows the whole cluster.
    let servers = cluster
        .node(1, 1)
        .count(&format!(
            "SELECT count() FROM system.clusters WHERE cluster = '{CLUSTER}'"
        ))
        .await?;
    assert_eq!(servers, 4);
    assert_eq!(cluster.shard_urls().len(), 2);
    assert!(
        cluster.shard_urls()[0].contains(','),
        "{:?}",
        cluster.shard_urls()
    );
    Ok(())
}
