//! `GET /admin/nats`: the NATS side in one JSON object (the admin page shows its
//! fields as they come, so a field added here shows there without a change to the
//! page): the connection and the server it reached, the stream, the consumer and its
//! lag, and on a NATS cluster where the stream and the consumer live (their leaders,
//! the replicas with their lag) and the pulls found lost and replaced (`stalls`).
//! Read from what the process knows already (the consumer's last lag poll); it sends
//! nothing to NATS.

use serde::{Deserialize, Serialize};

use crate::nats::StreamSettings;

/// What the admin endpoint knows of the NATS connection.
pub struct NatsView {
    client: async_nats::Client,
    /// The seeds of `[nats] url`, as configured (never with credentials: the
    /// configuration refuses them there).
    url: String,
    streams: StreamSettings,
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
    /// last lag poll read them: `null` before the first.
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
#[derive(Debug, Default, Deserialize)]
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
    pub fn new(client: async_nats::Client, url: String, streams: StreamSettings) -> Self {
        Self {
            client,
            url,
            streams,
        }
    }

    pub fn connected(&self) -> bool {
        self.client.connection_state() == async_nats::connection::State::Connected
    }

    /// The overview, with the consumer's figures read from the actor tree `tree`.
    pub fn overview(&self, tree: &serde_json::Value) -> NatsOverview {
        let consumer = consumer_facts(tree);
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
            subjects: format!("{}.>", self.streams.subject_prefix),
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
        }
    }
}

/// The consumer node's state in the tree (the root's children), or zeros before it
/// published one.
fn consumer_facts(tree: &serde_json::Value) -> ConsumerFacts {
    tree["children"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|node| node["kind"] == "consumer")
        .and_then(|node| ConsumerFacts::deserialize(&node["state"]).ok())
        .unwrap_or_default()
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
        let facts = consumer_facts(&tree);
        assert_eq!(facts.stalls, 2);
        assert_eq!(facts.last_stall, Some(json!("leadership_change")));
        assert_eq!(
            facts.nats.as_ref().map(|n| &n["stream"]["leader"]),
            Some(&json!("n1"))
        );
        assert_eq!(facts.pending, Some(12));
        assert_eq!((facts.pulled_total, facts.pulled_rows_total), (3, 300));
        assert_eq!(facts.reconnects, 1);
        let empty = consumer_facts(&json!(null));
        assert_eq!(empty.pending, None);
    }
}
