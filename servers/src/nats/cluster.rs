//! nats-servers joined in one JetStream cluster on free loopback ports, or a single
//! standalone one: what a test deploys NATS as.
//!
//! Each node is a [`NatsServer`] (its own temp dir, store, client and monitoring
//! ports) started with a config file of its own:
//!
//! ```text
//! server_name: "n1"
//! cluster {
//!   name: "sluice-test"
//!   listen: "127.0.0.1:<route port>"
//!   routes: ["nats-route://127.0.0.1:<n2's route port>", "nats-route://127.0.0.1:<n3's>"]
//! }
//! ```
//!
//! beside `-js -sd <store>` (its `jetstream { store_dir }`). The nodes start together:
//! a clustered node's `/healthz` answers 200 only once the meta group has a leader,
//! which takes a quorum. One node can then be killed (`kill -9`), frozen
//! (SIGSTOP/SIGCONT) or restarted through [`NatsCluster::node_mut`], and comes back on
//! the same ports with the same store; the whole deployment through the methods of
//! the cluster itself. The meta group's leader is read from a node's `/jsz`
//! ([`NatsCluster::meta_leader`]); a stream's or a consumer's from the JetStream API
//! (the test harness's `nats_cluster`, which has a NATS client).

use std::ffi::OsString;
use std::fmt::Write as _;

use anyhow::{anyhow, bail, Context, Result};
use tempfile::TempDir;
use tokio::task::JoinSet;

use super::flavor::NatsFlavor;
use super::server::NatsServer;
use crate::ports::free_port;

/// The cluster's name (`cluster { name }`).
pub const CLUSTER_NAME: &str = "sluice-test";

/// Starts of a whole cluster when a node found a port taken meanwhile (its route port
/// is fixed in every node's config, so the cluster starts again on new ones).
const PORT_ATTEMPTS: usize = 3;

/// One standalone nats-server, or several joined in a cluster.
#[derive(Debug)]
pub struct NatsCluster {
    // Field order: the nodes (their processes) go before the dir of their configs.
    nodes: Vec<NatsServer>,
    /// `server_name` of each node, by index (`n1`, `n2`...).
    names: Vec<String>,
    flavor: NatsFlavor,
    /// The nodes' config files; `None` for a standalone server.
    _configs: Option<TempDir>,
}

// === impl NatsCluster ===

impl NatsCluster {
    /// One standalone server (no cluster block), with `extra_args`.
    pub async fn single<I, S>(flavor: NatsFlavor, extra_args: I) -> Result<Self>
    where
        I: IntoIterator<Item = S>,
        S: Into<OsString>,
    {
        Self::single_configured(flavor, extra_args, "").await
    }

    async fn single_configured<I, S>(
        flavor: NatsFlavor,
        extra_args: I,
        extra_config: &str,
    ) -> Result<Self>
    where
        I: IntoIterator<Item = S>,
        S: Into<OsString>,
    {
        let node = NatsServer::start_configured(flavor.clone(), extra_args, extra_config).await?;
        Ok(Self {
            nodes: vec![node],
            names: vec!["n1".into()],
            flavor,
            _configs: None,
        })
    }

    /// `nodes` servers (3 or 5: a quorum survives one or two down) of `flavor` in one
    /// cluster, each with `extra_args`; returns once every node is healthy (the meta
    /// group has a leader). One node is [`NatsCluster::single`].
    pub async fn start<I, S>(flavor: NatsFlavor, nodes: usize, extra_args: I) -> Result<Self>
    where
        I: IntoIterator<Item = S>,
        S: Into<OsString>,
    {
        Self::start_configured(flavor, nodes, extra_args, "").await
    }

    /// Like [`NatsCluster::start`], with `extra_config` added to every node's
    /// configuration file (a `mappings` block, say).
    pub async fn start_configured<I, S>(
        flavor: NatsFlavor,
        nodes: usize,
        extra_args: I,
        extra_config: &str,
    ) -> Result<Self>
    where
        I: IntoIterator<Item = S>,
        S: Into<OsString>,
    {
        let extra: Vec<OsString> = extra_args.into_iter().map(Into::into).collect();
        if nodes <= 1 {
            return Self::single_configured(flavor, extra, extra_config).await;
        }
        let mut last_error = anyhow!("the cluster was not started");
        for _ in 0..PORT_ATTEMPTS {
            match Self::start_once(&flavor, nodes, &extra, extra_config).await {
                Ok(cluster) => return Ok(cluster),
                Err(e) if format!("{e:#}").contains("address already in use") => {
                    tracing::warn!("a port of the nats cluster was taken; new ports: {e:#}");
                    last_error = e;
                }
                Err(e) => return Err(e),
            }
        }
        Err(last_error)
    }

    async fn start_once(
        flavor: &NatsFlavor,
        nodes: usize,
        extra: &[OsString],
        extra_config: &str,
    ) -> Result<Self> {
        let configs = tempfile::Builder::new()
            .prefix("sluice-nats-cluster-")
            .tempdir()
            .context("creating a temp dir for the cluster's configs")?;
        let routes = (0..nodes)
            .map(|_| free_port())
            .collect::<Result<Vec<u16>>>()?;
        let names: Vec<String> = (1..=nodes).map(|n| format!("n{n}")).collect();
        let mut starting = JoinSet::new();
        for (i, name) in names.iter().enumerate() {
            let path = configs.path().join(format!("{name}.conf"));
            std::fs::write(&path, node_config(name, i, &routes) + extra_config)
                .with_context(|| format!("writing {}", path.display()))?;
            let mut args = vec![OsString::from("-c"), path.into_os_string()];
            args.extend(extra.iter().cloned());
            let flavor = flavor.clone();
            starting.spawn(async move { (i, NatsServer::start_with_args(flavor, args).await) });
        }
        let mut started: Vec<Option<NatsServer>> = (0..nodes).map(|_| None).collect();
        let mut failures = Vec::new();
        while let Some(joined) = starting.join_next().await {
            let (i, result) = joined.context("a node's start panicked")?;
            match result {
                Ok(node) => started[i] = Some(node),
                Err(e) => failures.push(format!("{}: {e:#}", names[i])),
            }
        }
        if !failures.is_empty() {
            bail!("the nats cluster did not start: {}", failures.join("\n"));
        }
        Ok(Self {
            nodes: started.into_iter().flatten().collect(),
            names,
            flavor: flavor.clone(),
            _configs: Some(configs),
        })
    }

    /// Every node's client URL, comma-separated: the seed list `[nats] url` takes.
    pub fn url(&self) -> String {
        self.urls().join(",")
    }

    /// Every node's client URL.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(NatsServer::url).collect()
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Node `i` (0-based; its `server_name` is `n{i+1}`).
    pub fn node(&self, i: usize) -> Result<&NatsServer> {
        self.nodes
            .get(i)
            .ok_or_else(|| anyhow!("no node {i} in a cluster of {}", self.nodes.len()))
    }

    pub fn node_mut(&mut self, i: usize) -> Result<&mut NatsServer> {
        let len = self.nodes.len();
        self.nodes
            .get_mut(i)
            .ok_or_else(|| anyhow!("no node {i} in a cluster of {len}"))
    }

    pub fn nodes(&self) -> &[NatsServer] {
        &self.nodes
    }

    /// Node `i`'s `server_name`, as the JetStream API names leaders and replicas.
    pub fn name_of(&self, i: usize) -> &str {
        self.names.get(i).map(String::as_str).unwrap_or("")
    }

    /// The node whose `server_name` is `name`.
    pub fn index_of(&self, name: &str) -> Result<usize> {
        self.names
            .iter()
            .position(|n| n == name)
            .ok_or_else(|| anyhow!("no node named {name:?} (the nodes: {:?})", self.names))
    }

    /// The node whose client port is `port` (which node a client is connected to).
    pub fn index_of_port(&self, port: u16) -> Result<usize> {
        self.nodes
            .iter()
            .position(|n| n.port() == port)
            .ok_or_else(|| anyhow!("no node listens on port {port}"))
    }

    pub fn flavor(&self) -> &NatsFlavor {
        &self.flavor
    }

    /// The nodes' version (`2.9.10`): they run one binary.
    pub fn version(&self) -> &str {
        self.nodes.first().map(NatsServer::version).unwrap_or("")
    }

    /// The meta group's leader (which places streams and consumers and answers the
    /// JetStream API's account requests), by index, as a node that answers `/jsz`
    /// reports it. Fails while no node knows one (an election).
    pub async fn meta_leader(&self) -> Result<usize> {
        let mut why = String::new();
        for (i, node) in self.nodes.iter().enumerate() {
            match node.jsz().await {
                Ok(jsz) => match jsz["meta_cluster"]["leader"].as_str() {
                    Some(leader) if !leader.is_empty() => return self.index_of(leader),
                    _ => {
                        let _ = write!(why, " {}: no leader;", self.names[i]);
                    }
                },
                Err(e) => {
                    let _ = write!(why, " {}: {e:#};", self.names[i]);
                }
            }
        }
        bail!("no node knows the meta group's leader:{why}")
    }

    /// A stream's state from `/jsz` (see [`NatsServer::stream_state`]), as the first
    /// node that holds a copy of it reports it.
    pub async fn stream_state(&self, stream: &str) -> Result<serde_json::Value> {
        let mut why = Vec::new();
        for node in &self.nodes {
            match node.stream_state(stream).await {
                Ok(state) => return Ok(state),
                Err(e) => why.push(format!("{e:#}")),
            }
        }
        bail!("no node reports stream {stream}: {}", why.join("; "))
    }

    /// The last `lines` of every node's logs.
    pub fn log_tail(&self, lines: usize) -> String {
        self.nodes
            .iter()
            .zip(&self.names)
            .map(|(node, name)| format!("=== {name} ===\n{}", node.log_tail(lines)))
            .collect::<Vec<_>>()
            .join("\n")
    }

    // --- the whole deployment ---

    /// Stops every node gracefully. Their stores stay.
    pub async fn stop(&mut self) -> Result<()> {
        for node in &mut self.nodes {
            node.stop().await?;
        }
        Ok(())
    }

    /// Kills every node with SIGKILL.
    pub async fn kill9(&mut self) -> Result<()> {
        for node in &mut self.nodes {
            node.kill9().await?;
        }
        Ok(())
    }

    /// Starts every stopped or killed node again on its ports and store, together (a
    /// clustered node is healthy only once a quorum is back), and waits until each is.
    pub async fn start_again(&mut self) -> Result<()> {
        for node in &mut self.nodes {
            if !node.is_running() {
                node.process_mut().start_again()?;
            }
        }
        for node in &mut self.nodes {
            node.wait_ready().await?;
        }
        Ok(())
    }

    /// Stops every node, then starts them again.
    pub async fn restart(&mut self) -> Result<()> {
        self.stop().await?;
        self.start_again().await
    }

    /// Freezes every node.
    pub async fn sigstop(&mut self) -> Result<()> {
        for node in &mut self.nodes {
            node.sigstop().await?;
        }
        Ok(())
    }

    pub async fn sigcont(&mut self) -> Result<()> {
        for node in &mut self.nodes {
            node.sigcont().await?;
        }
        Ok(())
    }
}

/// Node `i`'s config: its name and its place in the cluster (routes to the others).
fn node_config(name: &str, i: usize, routes: &[u16]) -> String {
    let others: Vec<String> = routes
        .iter()
        .enumerate()
        .filter(|(j, _)| *j != i)
        .map(|(_, port)| format!("\"nats-route://127.0.0.1:{port}\""))
        .collect();
    format!(
        "server_name: \"{name}\"\ncluster {{\n  name: \"{CLUSTER_NAME}\"\n  listen: \"127.0.0.1:{}\"\n  routes: [{}]\n}}\n",
        routes[i],
        others.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_routes_to_every_other_node() {
        let config = node_config("n2", 1, &[11_001, 11_002, 11_003]);
        assert!(config.contains("server_name: \"n2\""), "{config}");
        assert!(config.contains("listen: \"127.0.0.1:11002\""), "{config}");
        assert!(
            config.contains(
                "routes: [\"nats-route://127.0.0.1:11001\", \"nats-route://127.0.0.1:11003\"]"
            ),
            "{config}"
        );
        assert!(config.contains(&format!("name: \"{CLUSTER_NAME}\"")));
    }
}
