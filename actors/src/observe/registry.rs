//! The registry of published snapshots: each actor publishes its state into it when
//! it changes, and an observer (the admin endpoint, `/readyz`) reads it without
//! messaging or waiting on any actor. A snapshot older than `stale_after` while its
//! actor should have published is reported stale, with its age.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use serde::Serialize;
use tokio::time::Instant;

use super::snapshots::{NodeKind, NodeState, NodeStatus};

#[derive(Clone, Debug)]
struct Node {
    kind: NodeKind,
    name: String,
    parent: Option<String>,
    status: NodeStatus,
    restarts: u64,
    last_error: Option<String>,
    state: NodeState,
    updated: Instant,
    /// The actor says it is alive at least every tick (`beat`): only such a node can go
    /// stale. The root publishes once and has nothing to say after.
    beats: bool,
}

/// One node of the tree as the admin endpoint shows it.
#[derive(Clone, Debug, Serialize)]
pub struct TreeNode {
    pub kind: NodeKind,
    pub name: String,
    pub status: NodeStatus,
    pub restarts: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// How old the snapshot is.
    pub snapshot_age_ms: u64,
    /// True when the snapshot is older than the stale threshold.
    pub stale: bool,
    pub state: NodeState,
    pub children: Vec<TreeNode>,
}

/// Node ids: `root`, `consumer` (and `consumer-<n>` for partition n above 0), `target/<target>`, `target/<target>/pool/<replica>`,
/// `target/<target>/table/<tenant>.<table>`.
pub type NodeId = String;

pub fn target_id(target: &str) -> NodeId {
    format!("target/{target}")
}

pub fn pool_id(target: &str, replica: &str) -> NodeId {
    format!("target/{target}/pool/{replica}")
}

pub fn table_id(target: &str, key: &crate::ports::TableKey) -> NodeId {
    format!("target/{target}/table/{key}")
}

pub const ROOT_ID: &str = "root";
pub const CONSUMER_ID: &str = "consumer";

/// The ConsumerActor of partition `partition`: `consumer` for the first (the one of an
/// unpartitioned queue), `consumer-<n>` for the others.
pub fn consumer_id(partition: usize) -> NodeId {
    match partition {
        0 => CONSUMER_ID.to_owned(),
        n => format!("{CONSUMER_ID}-{n}"),
    }
}

#[derive(Debug)]
pub struct Registry {
    nodes: Mutex<BTreeMap<NodeId, Node>>,
    stale_after: Duration,
}

impl Registry {
    pub fn new(stale_after: Duration) -> Arc<Self> {
        Arc::new(Self {
            nodes: Mutex::new(BTreeMap::new()),
            stale_after,
        })
    }

    fn lock(&self) -> MutexGuard<'_, BTreeMap<NodeId, Node>> {
        self.nodes.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Make sure a node exists (status `starting` when new).
    pub fn register(&self, id: &str, kind: NodeKind, name: &str, parent: Option<&str>) {
        let mut nodes = self.lock();
        nodes.entry(id.to_owned()).or_insert_with(|| Node {
            kind,
            name: name.to_owned(),
            parent: parent.map(str::to_owned),
            status: NodeStatus::Starting,
            restarts: 0,
            last_error: None,
            state: NodeState::None {},
            updated: Instant::now(),
            beats: false,
        });
    }

    /// The actor is alive and its snapshot is current (its heartbeat, when nothing
    /// changed since it last published).
    pub fn beat(&self, id: &str) {
        if let Some(n) = self.lock().get_mut(id) {
            n.updated = Instant::now();
            n.beats = true;
        }
    }

    /// A failure seen by the supervisor: status, error and the restart count.
    pub fn failed(&self, id: &str, error: &str, restarting: bool) {
        if let Some(n) = self.lock().get_mut(id) {
            n.status = if restarting {
                NodeStatus::Restarting
            } else {
                NodeStatus::Failed
            };
            n.last_error = Some(error.to_owned());
            n.updated = Instant::now();
        }
    }

    /// A failure's reason that arrives after the failure was already counted.
    pub fn set_last_error(&self, id: &str, error: &str) {
        if let Some(n) = self.lock().get_mut(id) {
            n.last_error = Some(error.to_owned());
        }
    }

    pub fn count_restart(&self, id: &str) {
        if let Some(n) = self.lock().get_mut(id) {
            n.restarts += 1;
        }
    }

    pub fn restarts(&self, id: &str) -> u64 {
        self.lock().get(id).map(|n| n.restarts).unwrap_or(0)
    }

    pub fn status(&self, id: &str) -> Option<NodeStatus> {
        self.lock().get(id).map(|n| n.status)
    }

    /// Publish an actor's state; a starting or restarting node becomes running.
    pub fn publish(&self, id: &str, state: NodeState) {
        if let Some(n) = self.lock().get_mut(id) {
            n.state = state;
            n.updated = Instant::now();
            if matches!(n.status, NodeStatus::Starting | NodeStatus::Restarting) {
                n.status = NodeStatus::Running;
            }
        }
    }

    pub fn state(&self, id: &str) -> Option<NodeState> {
        self.lock().get(id).map(|n| n.state.clone())
    }

    pub fn remove(&self, id: &str) {
        let mut nodes = self.lock();
        nodes.remove(id);
        let prefix = format!("{id}/");
        nodes.retain(|k, _| !k.starts_with(&prefix));
    }

    /// The whole tree, rooted at `root`.
    pub fn tree(&self) -> Option<TreeNode> {
        let nodes = self.lock();
        let now = Instant::now();
        let mut children: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for (id, n) in nodes.iter() {
            if let Some(p) = &n.parent {
                children.entry(p.as_str()).or_default().push(id.as_str());
            }
        }
        fn build(
            id: &str,
            nodes: &BTreeMap<NodeId, Node>,
            children: &BTreeMap<&str, Vec<&str>>,
            now: Instant,
            stale_after: Duration,
        ) -> Option<TreeNode> {
            let n = nodes.get(id)?;
            let age = now.saturating_duration_since(n.updated);
            Some(TreeNode {
                kind: n.kind,
                name: n.name.clone(),
                status: n.status,
                restarts: n.restarts,
                last_error: n.last_error.clone(),
                snapshot_age_ms: age.as_millis() as u64,
                stale: n.beats && age > stale_after,
                state: n.state.clone(),
                children: children
                    .get(id)
                    .map(|c| {
                        c.iter()
                            .filter_map(|c| build(c, nodes, children, now, stale_after))
                            .collect()
                    })
                    .unwrap_or_default(),
            })
        }
        build(ROOT_ID, &nodes, &children, now, self.stale_after)
    }

    pub fn tree_json(&self) -> serde_json::Value {
        serde_json::to_value(self.tree()).unwrap_or(serde_json::Value::Null)
    }

    /// Ready when the consumer is connected and running and, in every target, every
    /// shard has a replica that answered one probe. `Err` lists every reason it is not.
    pub fn readiness(&self) -> Result<(), Vec<String>> {
        let nodes = self.lock();
        let mut reasons = vec![];
        let consumers: Vec<_> = nodes
            .iter()
            .filter(|(_, n)| n.kind == NodeKind::Consumer)
            .collect();
        if consumers.is_empty() {
            reasons.push("consumer: not started".to_owned());
        }
        for (id, n) in consumers {
            if n.status != NodeStatus::Running {
                reasons.push(format!("{id}: {}", status_word(n.status)));
            }
            match &n.state {
                NodeState::Consumer(c) if c.connected => {
                    if let Some(wait) = c.waiting_for {
                        reasons.push(format!("{id}: {wait}"));
                    }
                }
                NodeState::Consumer(c) => reasons.push(match &c.last_error {
                    Some(e) => format!("{id}: not connected to the stream ({e})"),
                    None => format!("{id}: not connected to the stream"),
                }),
                _ => reasons.push(format!("{id}: not connected to the stream")),
            }
        }
        reasons.extend(unprobed_shards(&nodes));
        if reasons.is_empty() {
            Ok(())
        } else {
            Err(reasons)
        }
    }
}

/// A shard none of whose replicas answered a probe yet, per target: one reason each,
/// with its replicas' last errors (a target of one server: worded as the server's).
fn unprobed_shards(nodes: &BTreeMap<NodeId, Node>) -> Vec<String> {
    #[derive(Default)]
    struct Shard {
        answered: bool,
        errors: Vec<String>,
    }
    let mut shards: BTreeMap<(&str, usize), Shard> = BTreeMap::new();
    let mut replicas: BTreeMap<&str, usize> = BTreeMap::new();
    for n in nodes.values().filter(|n| n.kind == NodeKind::Pool) {
        // A pool publishes as it starts; until then it is a server not heard from.
        let (target, shard, answered, error) = match &n.state {
            NodeState::Pool(p) => (
                p.target.as_str(),
                p.shard,
                p.probed_ok,
                p.last_probe_error.as_ref().map(|e| (p.replica.as_str(), e)),
            ),
            _ => (n.name.as_str(), 0, false, None),
        };
        *replicas.entry(target).or_default() += 1;
        let entry = shards.entry((target, shard)).or_default();
        entry.answered |= answered;
        if let (false, Some((replica, e))) = (answered, error) {
            entry.errors.push(format!("{replica}: {e}"));
        }
    }
    let mut reasons = Vec::new();
    for ((target, shard), s) in shards {
        if s.answered {
            continue;
        }
        let (head, errors) = if replicas.get(target) == Some(&1) {
            let prefix = format!("{target}: ");
            let errors: Vec<String> = s
                .errors
                .iter()
                .map(|e| e.strip_prefix(&prefix).unwrap_or(e).to_owned())
                .collect();
            (format!("target {target}: not probed yet"), errors)
        } else {
            let head = format!("target {target} shard {shard}: no replica answered a probe yet");
            (head, s.errors)
        };
        reasons.push(if errors.is_empty() {
            head
        } else {
            format!("{head} ({})", errors.join("; "))
        });
    }
    reasons
}

fn status_word(s: NodeStatus) -> &'static str {
    match s {
        NodeStatus::Starting => "starting",
        NodeStatus::Running => "running",
        NodeStatus::Stopping => "stopping",
        NodeStatus::Failed => "failed",
        NodeStatus::Restarting => "restarting",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::observe::snapshots::ConsumerSnapshot;
    use crate::ports::SourceWait;

    #[test]
    fn a_connected_consumer_that_waits_is_not_ready_and_says_for_what() {
        let r = Registry::new(Duration::from_secs(5));
        r.register(CONSUMER_ID, NodeKind::Consumer, "INGEST", Some(ROOT_ID));
        let waiting = |waiting_for| {
            NodeState::Consumer(ConsumerSnapshot {
                connected: true,
                waiting_for,
                ..Default::default()
            })
        };
        r.publish(CONSUMER_ID, waiting(Some(SourceWait::ConsumerLeader)));
        let reasons = r.readiness().expect_err("waiting for a leader");
        assert_eq!(
            reasons,
            ["consumer: waiting for the consumer to have a leader (a NATS election): its pull requests find no responders"]
        );
        r.publish(CONSUMER_ID, waiting(Some(SourceWait::ManifestIndex)));
        let reasons = r.readiness().expect_err("waiting for the index");
        assert!(reasons[0].contains("manifest index"), "{reasons:?}");
        r.publish(CONSUMER_ID, waiting(None));
        assert_eq!(r.readiness(), Ok(()));
    }

    #[tokio::test(start_paused = true)]
    async fn tree_nests_and_marks_stale_only_what_should_have_beaten() {
        let r = Registry::new(Duration::from_secs(5));
        r.register(ROOT_ID, NodeKind::Root, "root", None);
        r.register(CONSUMER_ID, NodeKind::Consumer, "INGEST", Some(ROOT_ID));
        r.register("pool/main", NodeKind::Pool, "main", Some(ROOT_ID));
        r.publish(
            "pool/main",
            NodeState::Pool(crate::observe::PoolSnapshot {
                target: "main".into(),
                replica: "main".into(),
                shard: 1,
                breaker: crate::breaker::scoped::BreakerSnapshot::closed(),
                probed_ok: false,
                server_version: None,
                last_probe_error: None,
            }),
        );
        r.publish(ROOT_ID, NodeState::None {});
        r.publish(
            CONSUMER_ID,
            NodeState::Consumer(ConsumerSnapshot {
                connected: true,
                ..Default::default()
            }),
        );
        r.beat(CONSUMER_ID);
        r.beat("pool/main");
        tokio::time::advance(Duration::from_secs(6)).await;
        r.beat("pool/main");
        let t = r.tree().unwrap();
        assert_eq!(t.children.len(), 2);
        let child = |kind| t.children.iter().find(|c| c.kind == kind).unwrap();
        // The consumer beats and went silent: stale, with its age.
        assert!(child(NodeKind::Consumer).stale);
        assert_eq!(child(NodeKind::Consumer).snapshot_age_ms, 6000);
        // The pool beat just now.
        assert!(!child(NodeKind::Pool).stale);
        // The root said all it has to say at start: never stale, even hours later.
        tokio::time::advance(Duration::from_secs(3 * 3600)).await;
        assert!(!r.tree().unwrap().stale);
        let reasons = r.readiness().unwrap_err();
        assert_eq!(reasons, vec!["target main: not probed yet".to_owned()]);
    }
}
