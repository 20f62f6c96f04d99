//! Where things live in a NATS cluster, as the JetStream API answers it: a stream's
//! leader (`$JS.API.STREAM.INFO`), a consumer's (`$JS.API.CONSUMER.INFO`), their
//! replicas; the meta group's leader is [`NatsCluster::meta_leader`] (from `/jsz`).
//!
//! [`ClusterView`] is a client of the test's own, connected to every node (it moves to
//! a live one when its node is killed or frozen), so it answers whichever node a
//! scenario takes away.

use std::time::Duration;

use anyhow::{anyhow, bail, ensure, Context, Result};
use async_nats::jetstream::{self, stream::ClusterInfo};

use crate::nats::NatsCluster;
use crate::wait_for;

/// How often the test's client pings: a frozen node is left within three of these.
const PING_INTERVAL: Duration = Duration::from_secs(1);
/// How long one JetStream API request may take (an election answers nothing).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(3);

/// Connects to `urls` (one server, or a cluster's nodes): the client takes the first
/// that answers and moves to another when it goes; it reconnects by itself for ever.
pub async fn connect(urls: &[String]) -> Result<async_nats::Client> {
    async_nats::ConnectOptions::new()
        .name("sluice-test")
        .connection_timeout(Duration::from_secs(5))
        .request_timeout(Some(REQUEST_TIMEOUT))
        .ping_interval(PING_INTERVAL)
        .max_reconnects(None)
        .reconnect_delay_callback(|attempts| {
            Duration::from_millis(50u64 << attempts.min(4)).min(Duration::from_secs(1))
        })
        .connect(urls)
        .await
        .with_context(|| format!("connecting to NATS at {}", urls.join(",")))
}

/// One replicated group (a stream's or a consumer's) as JetStream reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Group {
    /// The leader's `server_name`.
    pub leader: String,
    /// Every peer: the leader and its replicas.
    pub peers: Vec<String>,
    /// How many replicas the configuration asks for.
    pub configured: usize,
}

/// The JetStream API of a cluster, through a client of the test's own.
#[derive(Clone)]
pub struct ClusterView {
    js: jetstream::Context,
}

// === impl ClusterView ===

impl ClusterView {
    /// Connects to every node of `cluster`.
    pub async fn connect(cluster: &NatsCluster) -> Result<Self> {
        Ok(Self {
            js: jetstream::new(connect(&cluster.urls()).await?),
        })
    }

    pub fn context(&self) -> &jetstream::Context {
        &self.js
    }

    /// A stream's leader and peers (`$JS.API.STREAM.INFO`).
    pub async fn stream(&self, stream: &str) -> Result<Group> {
        let (_, info) = self.stream_info(stream).await?;
        group(&info.cluster, info.config.num_replicas).with_context(|| format!("stream {stream}"))
    }

    /// A stream's handle and its info, read now.
    async fn stream_info(
        &self,
        stream: &str,
    ) -> Result<(jetstream::stream::Stream, jetstream::stream::Info)> {
        let mut handle = self
            .js
            .get_stream(stream)
            .await
            .map_err(|e| anyhow!("looking up stream {stream}: {e}"))?;
        let info = handle
            .info()
            .await
            .map_err(|e| anyhow!("reading stream {stream}: {e}"))?
            .clone();
        Ok((handle, info))
    }

    /// A consumer's leader and peers (`$JS.API.CONSUMER.INFO`).
    pub async fn consumer(&self, stream: &str, consumer: &str) -> Result<Group> {
        let handle = self
            .js
            .get_stream(stream)
            .await
            .map_err(|e| anyhow!("looking up stream {stream}: {e}"))?;
        let info = handle
            .consumer_info(consumer)
            .await
            .map_err(|e| anyhow!("reading consumer {consumer} of {stream}: {e}"))?;
        group(&info.cluster, info.config.num_replicas)
            .with_context(|| format!("consumer {consumer} of {stream}"))
    }

    /// Asks `consumer`'s leader to step down (`$JS.API.CONSUMER.LEADER.STEPDOWN`): its
    /// peers elect another, the way a leader change happens without a fault.
    pub async fn step_down_consumer(&self, stream: &str, consumer: &str) -> Result<()> {
        // The context puts the API prefix (`$JS.API.`) in front.
        let subject = format!("CONSUMER.LEADER.STEPDOWN.{stream}.{consumer}");
        let answer: serde_json::Value = self
            .js
            .request(subject, &serde_json::json!({}))
            .await
            .map_err(|e| anyhow!("stepping down the leader of {consumer}: {e}"))?;
        if answer["success"] != true {
            bail!("the leader of {consumer} did not step down: {answer}");
        }
        Ok(())
    }

    /// Asks `stream`'s leader to step down (`$JS.API.STREAM.LEADER.STEPDOWN`).
    pub async fn step_down_stream(&self, stream: &str) -> Result<()> {
        let subject = format!("STREAM.LEADER.STEPDOWN.{stream}");
        let answer: serde_json::Value = self
            .js
            .request(subject, &serde_json::json!({}))
            .await
            .map_err(|e| anyhow!("stepping down the leader of {stream}: {e}"))?;
        if answer["success"] != true {
            bail!("the leader of {stream} did not step down: {answer}");
        }
        Ok(())
    }

    /// Moves the leaders of `streams` (as many as the nodes, or fewer) until no two
    /// share a node, stepping one down at a time (at most 20 times, each waited for);
    /// returns the leaders, by stream.
    pub async fn spread_stream_leaders(&self, streams: &[&str]) -> Result<Vec<String>> {
        for _ in 0..20 {
            let mut leaders = Vec::new();
            for stream in streams {
                leaders.push(self.stream(stream).await?.leader);
            }
            let Some(twin) = (1..leaders.len()).find(|&i| leaders[..i].contains(&leaders[i]))
            else {
                return Ok(leaders);
            };
            let (stream, old) = (streams[twin], leaders[twin].clone());
            self.step_down_stream(stream).await?;
            self.new_stream_leader(stream, &old, Duration::from_secs(30))
                .await?;
        }
        bail!("the leaders of {streams:?} still share a node after 20 step-downs")
    }

    /// Waits until every replica of `stream` (and of its `consumer`, if named) is
    /// current and online, as many as configured: a node restarted in a rolling
    /// restart has caught up, as an operator checks before taking the next one down.
    pub async fn wait_current(
        &self,
        stream: &str,
        consumer: Option<&str>,
        deadline: Duration,
    ) -> Result<()> {
        wait_for(
            &format!("every replica of {stream} current"),
            deadline,
            Duration::from_millis(200),
            || async move {
                let (handle, info) = self.stream_info(stream).await?;
                all_current(&info.cluster, info.config.num_replicas)
                    .with_context(|| format!("stream {stream}"))?;
                if let Some(consumer) = consumer {
                    let info = handle
                        .consumer_info(consumer)
                        .await
                        .map_err(|e| anyhow!("reading consumer {consumer}: {e}"))?;
                    all_current(&info.cluster, info.config.num_replicas)
                        .with_context(|| format!("consumer {consumer} of {stream}"))?;
                }
                Ok(())
            },
        )
        .await
    }

    /// Waits until `stream` has a leader other than `old` (an election after its
    /// leader went), and returns it.
    pub async fn new_stream_leader(
        &self,
        stream: &str,
        old: &str,
        deadline: Duration,
    ) -> Result<String> {
        wait_for(
            &format!("a leader of {stream} other than {old}"),
            deadline,
            Duration::from_millis(200),
            || async move {
                let leader = self.stream(stream).await?.leader;
                if leader == old {
                    bail!("still {old}");
                }
                Ok(leader)
            },
        )
        .await
    }

    /// Waits until the cluster leads itself without node `gone` (down, not yet noticed
    /// by its peers): a meta leader other than it (consumers are created through that
    /// one) and a leader other than it for each of `streams` and for each consumer in
    /// `consumers` (`(stream, consumer)`). A test whose fault is "a node down", not "an
    /// election", establishes this before it goes on.
    pub async fn wait_led_without(
        &self,
        cluster: &NatsCluster,
        gone: &str,
        streams: &[&str],
        consumers: &[(&str, &str)],
        deadline: Duration,
    ) -> Result<()> {
        wait_for(
            &format!("the cluster led without {gone}"),
            deadline,
            Duration::from_millis(200),
            || async move {
                let meta = cluster.name_of(cluster.meta_leader().await?);
                ensure!(meta != gone, "the meta leader is still {gone}");
                for stream in streams {
                    let leader = self.stream(stream).await?.leader;
                    ensure!(leader != gone, "{stream}'s leader is still {gone}");
                }
                for (stream, consumer) in consumers {
                    let leader = self.consumer(stream, consumer).await?.leader;
                    ensure!(leader != gone, "{consumer}'s leader is still {gone}");
                }
                Ok(())
            },
        )
        .await
    }

    /// Waits until each of `streams` and each consumer in `consumers` (`(stream,
    /// consumer)`) has a leader: the cluster answers for all of them again.
    pub async fn wait_leaders(
        &self,
        streams: &[&str],
        consumers: &[(&str, &str)],
        deadline: Duration,
    ) -> Result<()> {
        wait_for(
            "a leader for every stream and consumer",
            deadline,
            Duration::from_millis(200),
            || async move {
                for stream in streams {
                    self.stream(stream).await?;
                }
                for (stream, consumer) in consumers {
                    self.consumer(stream, consumer).await?;
                }
                Ok(())
            },
        )
        .await
    }

    /// Waits until `consumer` has a leader other than `old`, and returns it.
    pub async fn new_consumer_leader(
        &self,
        stream: &str,
        consumer: &str,
        old: &str,
        deadline: Duration,
    ) -> Result<String> {
        wait_for(
            &format!("a leader of consumer {consumer} other than {old}"),
            deadline,
            Duration::from_millis(200),
            || async move {
                let leader = self.consumer(stream, consumer).await?.leader;
                if leader == old {
                    bail!("still {old}");
                }
                Ok(leader)
            },
        )
        .await
    }
}

/// Whether a group has its leader and every configured replica online and current.
fn all_current(cluster: &Option<ClusterInfo>, configured: usize) -> Result<()> {
    let group = group(cluster, configured)?;
    let replicas = cluster
        .as_ref()
        .map(|c| c.replicas.as_slice())
        .unwrap_or(&[]);
    if group.peers.len() < configured {
        bail!("{} of {configured} peers", group.peers.len());
    }
    if let Some(behind) = replicas.iter().find(|r| !r.current || r.offline) {
        bail!(
            "replica {} not current (lag {})",
            behind.name,
            behind.lag.unwrap_or(0)
        );
    }
    Ok(())
}

fn group(cluster: &Option<ClusterInfo>, configured: usize) -> Result<Group> {
    let cluster = cluster
        .as_ref()
        .ok_or_else(|| anyhow!("no cluster information"))?;
    let leader = cluster
        .leader
        .clone()
        .filter(|l| !l.is_empty())
        .ok_or_else(|| anyhow!("no leader right now"))?;
    let mut peers = vec![leader.clone()];
    peers.extend(cluster.replicas.iter().map(|r| r.name.clone()));
    Ok(Group {
        leader,
        peers,
        configured,
    })
}

/// The consumer node's state in an `/admin/actors` answer (its `stalls`, `nats`
/// placement, `waiting_for`).
pub fn consumer_state(tree: &serde_json::Value) -> Option<serde_json::Value> {
    let mut nodes = vec![tree];
    // Bounded by the tree's size: each node is visited once.
    while let Some(node) = nodes.pop() {
        if node["kind"] == "consumer" {
            return Some(node["state"].clone());
        }
        if let Some(children) = node["children"].as_array() {
            nodes.extend(children);
        }
    }
    None
}
