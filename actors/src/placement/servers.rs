//! A target's servers as the actors hold them: its layout (shards of replicas), each
//! replica's name, inserter and metrics, and the board their pools publish their
//! breakers on. Made once by [`crate::pipeline::start`], shared by the target, its
//! pools and its tables, never changed.

use std::sync::Arc;

use crate::metrics::ReplicaMetrics;
use crate::observe::ReplicaBoard;
use crate::placement::Layout;

/// One ClickHouse server of a target: a replica of one of its shards.
pub struct Replica<I> {
    /// Its place in the target's flat list of servers (shard by shard).
    pub index: usize,
    pub shard: usize,
    /// `host:port`, or the target's name for a target of one server (its metrics'
    /// `replica` label, its node in the admin tree).
    pub name: Arc<str>,
    pub inserter: Arc<I>,
    pub metrics: ReplicaMetrics,
}

pub struct TargetServers<I> {
    pub target: Arc<str>,
    pub layout: Layout,
    pub replicas: Vec<Replica<I>>,
    /// Each replica's breaker, as its pool last published it.
    pub board: ReplicaBoard,
}

impl<I> TargetServers<I> {
    /// `shards[s]`: the (name, inserter) of each replica of shard `s`.
    pub fn new(
        target: &Arc<str>,
        shards: Vec<Vec<(String, Arc<I>)>>,
        probe_wait: std::time::Duration,
    ) -> Self {
        let layout = Layout::new(&shards.iter().map(Vec::len).collect::<Vec<_>>());
        let replicas: Vec<Replica<I>> = shards
            .into_iter()
            .enumerate()
            .flat_map(|(shard, servers)| servers.into_iter().map(move |s| (shard, s)))
            .enumerate()
            .map(|(index, (shard, (name, inserter)))| Replica {
                index,
                shard,
                metrics: ReplicaMetrics::new(target, &name),
                name: Arc::from(name),
                inserter,
            })
            .collect();
        Self {
            target: target.clone(),
            board: ReplicaBoard::new(replicas.len(), probe_wait),
            layout,
            replicas,
        }
    }

    pub fn replica(&self, index: usize) -> &Replica<I> {
        &self.replicas[index.min(self.replicas.len().saturating_sub(1))]
    }

    /// The replicas' names, shard by shard.
    pub fn shard_names(&self) -> Vec<Vec<String>> {
        (0..self.layout.shards())
            .map(|s| {
                self.layout
                    .replicas_of(s)
                    .iter()
                    .map(|&r| self.replicas[r].name.to_string())
                    .collect()
            })
            .collect()
    }
}
