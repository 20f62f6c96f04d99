//! `GET /admin/nats`: the NATS side in one JSON object (the admin page shows its
//! fields as they come, so a field added here shows there without a change to the
//! page): the connection and the server it reached, the stream, the consumer and its
//! lag, and on a NATS cluster where the stream and the consumer live (their leaders,
//! the replicas with their lag) and the pulls found lost and replaced (`stalls`).
//! Read from what the process knows already (the consumer's last lag poll); it sends
//! nothing to NATS.

use serde::{Deserialize, Serialize};

use crate::config::StreamSettings;
use crate::nats::PublisherRoutes;

/// What the admin endpoint knows of the NATS connection.
pub struct NatsView {
    client: async_nats::Client,
    /// The seeds of `[nats] url`, as configured (never with credentials: the
    /// configuration refuses them there).
    url: String,
    streams: StreamSettings,
    /// What the last check of other publishers' subjects found (`nats::partitions`).
    publisher_routes: tokio::sync::watch::Receiver<Option<PublisherRoutes>>,
}

/// The object `GET /admin/nats` answers.
#[derive(Debug, Serialize)]
pub struct NatsOverview {
    pub connected: bool,
    /// `[nats] url` as configured.
    pub url: String,
    /// The server the connection reached, once it reached one.
    pub server: Option<ServerFacts>,
    pub stream: String,
    pub subjects: String,
    pub consumer: String,
    pub dlq_stream: String,
    /// Messages in the stream not yet delivered to the consumer (a message carries one
    /// row or many), as the consumer last heard.
    pub consumer_lag_messages: Option<u64>,
    pub pulled_messages: u64,
    pub pulled_rows: u64,
    pub reconnects: u64,
    pub last_error: Option<String>,
    /// Pulls found lost and replaced (`sluice_consumer_stalls_total`), and why the
    /// last one was.
    pub stalls: u64,
    pub last_stall: Option<serde_json::Value>,
    /// What the consumer waits for before it pulls again (an election, the manifest
    /// index), while it waits.
    pub waiting_for: Option<serde_json::Value>,
    /// The stream's and the consumer's leader and replicas (with their lag), as the
    /// last lag poll read them: `null` before the first. Of the first partition when
    /// there are several (each partition's in `partitions`).
    pub placement: Option<serde_json::Value>,
    /// `[nats] partitions`: each partition's stream, its consumer's lag and figures and
    /// where its leaders are; the figures above are their sums. One entry when the
    /// queue is not partitioned.
    pub partitions: Vec<PartitionFacts>,
    /// Whether what other publishers publish (`<subject_prefix>.<tenant>.<table>`)
    /// reaches the queue, as last asked of the server (every minute; `null` before the
    /// first answer): with partitions, only the server's subject mapping sends it there.
    pub publishers: Option<PublisherRoutes>,
}

/// One partition of the queue: its stream and what its ConsumerActor last said.
#[derive(Debug, Serialize)]
pub struct PartitionFacts {
    pub stream: String,
    pub subjects: String,
    pub consumer_lag_messages: Option<u64>,
    pub pulled_messages: u64,
    pub pulled_rows: u64,
    pub stalls: u64,
    pub waiting_for: Option<serde_json::Value>,
    pub placement: Option<serde_json::Value>,
}

#[derive(Debug, Serialize)]
pub struct ServerFacts {
    pub name: String,
    pub version: String,
    /// `host:port` as the server announced itself.
    pub address: String,
    pub cluster: Option<String>,
    pub jetstream: bool,
}

/// The consumer's snapshot as the actor tree shows it (the fields read here).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
struct ConsumerFacts {
    pending: Option<u64>,
    pulled_total: u64,
    pulled_rows_total: u64,
    reconnects: u64,
    last_error: Option<String>,
    stalls: u64,
    last_stall: Option<serde_json::Value>,
    waiting_for: Option<serde_json::Value>,
    nats: Option<serde_json::Value>,
}

// === impl NatsView ===

impl NatsView {
    pub fn new(
        client: async_nats::Client,
        url: String,
        streams: StreamSettings,
        publisher_routes: tokio::sync::watch::Receiver<Option<PublisherRoutes>>,
    ) -> Self {
        Self {
            client,
            url,
            streams,
            publisher_routes,
        }
    }

    pub fn connected(&self) -> bool {
        self.client.connection_state() == async_nats::connection::State::Connected
    }

    /// The overview, with the consumers' figures read from the actor tree `tree`.
    pub fn overview(&self, tree: &serde_json::Value) -> NatsOverview {
        let each = consumer_facts(tree);
        let partitions: Vec<PartitionFacts> = self
            .streams
            .each_partition()
            .into_iter()
            .enumerate()
            .map(|(n, p)| {
                let facts = each.get(n).cloned().unwrap_or_default();
                PartitionFacts {
                    subjects: format!("{}.>", p.subject_prefix),
                    stream: p.stream,
                    consumer_lag_messages: facts.pending,
                    pulled_messages: facts.pulled_total,
                    pulled_rows: facts.pulled_rows_total,
                    stalls: facts.stalls,
                    waiting_for: facts.waiting_for,
                    placement: facts.nats,
                }
            })
            .collect();
        let consumer = total(each);
        let info = self.client.server_info();
        let server = (!info.server_id.is_empty()).then(|| ServerFacts {
            name: info.server_name,
            version: info.version,
            address: format!("{}:{}", info.host, info.port),
            cluster: info.cluster,
            jetstream: info.jetstream,
        });
        NatsOverview {
            connected: self.connected(),
            url: self.url.clone(),
            server,
            stream: self.streams.stream.clone(),
            subjects: match self.streams.partitioned() {
                true => format!("{}_part.<n>.>", self.streams.subject_prefix),
                false => format!("{}.>", self.streams.subject_prefix),
            },
            consumer: self.streams.consumer.clone(),
            dlq_stream: self.streams.dlq_stream.clone(),
            consumer_lag_messages: consumer.pending,
            pulled_messages: consumer.pulled_total,
            pulled_rows: consumer.pulled_rows_total,
            reconnects: consumer.reconnects,
            last_error: consumer.last_error,
            stalls: consumer.stalls,
            last_stall: consumer.last_stall,
            waiting_for: consumer.waiting_for,
            placement: consumer.nats,
            partitions,
            publishers: self.publisher_routes.borrow().clone(),
        }
    }
}

/// The partitions' figures as one: counts summed, the lag summed once every consumer
/// has told it, the first partition's error, stall, wait and placement.
fn total(each: Vec<ConsumerFacts>) -> ConsumerFacts {
    let mut sum = ConsumerFacts::default();
    let mut lags = Some(0u64);
    for (n, facts) in each.into_iter().enumerate() {
        lags = lags.zip(facts.pending).map(|(a, b)| a + b);
        sum.pulled_total += facts.pulled_total;
        sum.pulled_rows_total += facts.pulled_rows_total;
        sum.reconnects += facts.reconnects;
        sum.stalls += facts.stalls;
        sum.last_error = sum.last_error.or(facts.last_error);
        sum.last_stall = sum.last_stall.or(facts.last_stall);
        sum.waiting_for = sum.waiting_for.or(facts.waiting_for);
        if n == 0 {
            sum.nats = facts.nats;
        }
        sum.pending = lags;
    }
    sum
}

/// The consumer nodes' states in the tree (the root's children, a partition's each, in
/// order), zeros for one that published none yet.
fn consumer_facts(tree: &serde_json::Value) -> Vec<ConsumerFacts> {
    tree["children"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|node| node["kind"] == "consumer")
        .map(|node| ConsumerFacts::deserialize(&node["state"]).unwrap_or_default())
        .collect()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn consumer_figures_come_from_the_consumer_node() {
        let tree = json!({"kind": "root", "children": [
            {"kind": "pool", "state": {"pending": 99}},
            {"kind": "consumer", "state": {"connected": true, "pending": 12, "pulled_total": 3,
                "pulled_rows_total": 300, "reconnects": 1, "last_error": null, "stalls": 2,
                "last_stall": "leadership_change",
                "nats": {"connected_server": "n2", "stream": {"name": "INGEST", "leader": "n1",
                    "replicas": [{"name": "n2", "current": true, "offline": false, "lag": 0}]}}}}
        ]});
        let facts = total(consumer_facts(&tree));
        assert_eq!(facts.stalls, 2);
        assert_eq!(facts.last_stall, Some(json!("leadership_change")));
        assert_eq!(
            facts.nats.as_ref().map(|n| &n["stream"]["leader"]),
            Some(&json!("n1"))
        );
        assert_eq!(facts.pending, Some(12));
        assert_eq!((facts.pulled_total, facts.pulled_rows_total), (3, 300));
        assert_eq!(facts.reconnects, 1);
        let empty = total(consumer_facts(&json!(null)));
        assert_eq!(empty.pending, None);
        // Partitions: summed, the lag once every partition told it.
        let two = json!({"kind": "root", "children": [
            {"kind": "consumer", "state": {"pending": 5, "pulled_total": 1, "stalls": 1}},
            {"kind": "consumer", "state": {"pending": 7, "pulled_total": 2}},
        ]});
        let sum = total(consumer_facts(&two));
        assert_eq!(
            (sum.pending, sum.pulled_total, sum.stalls),
            (Some(12), 3, 1)
        );
        let untold = json!({"children": [{"kind": "consumer", "state": {"pending": 5}},
            {"kind": "consumer", "state": {}}]});
        assert_eq!(total(consumer_facts(&untold)).pending, None);
    }
}
