//! The insert clients of one target: one per server (a replica of a shard), in the
//! configuration's order. The actor tree gets them as the target's shards; the ingest
//! API's table catalog reads the target's tables through whichever server answers
//! (every shard holds the same local tables).

use std::sync::Arc;

use anyhow::Context as _;

use super::catalog::{Catalog, TableSource};
use super::insert::HttpInserter;
use super::redelivery::Redelivery;
use super::shard::ShardReplicas;
use super::table_info::TableInfo;
use crate::config::{Config, TargetConfig};

/// A target's table catalog, read through its clients.
pub type TargetCatalog = Catalog<TargetClients>;

/// One target's servers' clients, shard by shard.
pub struct TargetClients {
    pub target: String,
    pub shards: Vec<Vec<Arc<HttpInserter>>>,
}

impl TargetClients {
    /// A client per server of `target`.
    pub fn new(config: &Config, target: &TargetConfig) -> anyhow::Result<Self> {
        let redelivery = Redelivery::of(config, target);
        let shards = target
            .shards
            .iter()
            .zip(target.replica_names())
            .enumerate()
            .map(|(index, (urls, names))| {
                let shard = Arc::new(
                    ShardReplicas::new(target, index, urls, &names)
                        .with_context(|| format!("setting up shard {}", index + 1))?,
                );
                urls.iter()
                    .zip(names)
                    .map(|(url, name)| {
                        HttpInserter::new(target, url, &name, redelivery.clone())
                            .map(|inserter| Arc::new(inserter.in_shard(shard.clone())))
                            .with_context(|| format!("setting up ClickHouse server {name}"))
                    })
                    .collect::<anyhow::Result<Vec<_>>>()
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        Ok(Self {
            target: target.name.clone(),
            shards,
        })
    }

    /// Every server's client, shard by shard.
    pub fn all(&self) -> impl Iterator<Item = &Arc<HttpInserter>> {
        self.shards.iter().flatten()
    }

    /// The target as the actor tree takes it: its shards of named servers.
    pub fn pipeline_target(&self) -> sluice_actors::Target<HttpInserter> {
        let shards = self
            .shards
            .iter()
            .map(|replicas| {
                replicas
                    .iter()
                    .map(|i| (i.replica().to_owned(), i.clone()))
                    .collect()
            })
            .collect();
        sluice_actors::Target::sharded(&self.target, shards)
    }
}

impl TableSource for TargetClients {
    /// The first server that answers (each shard holds the same local tables; a server
    /// down is passed over), or every server's reason.
    async fn list_tables(&self, database: &str) -> Result<Vec<TableInfo>, String> {
        let mut errors = Vec::new();
        for server in self.all() {
            match server.list_tables(database).await {
                Ok(tables) => return Ok(tables),
                Err(e) => errors.push(format!("{}: {e}", server.replica())),
            }
        }
        Err(errors.join("; "))
    }
}
