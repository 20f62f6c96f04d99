//! Where the consumer's stream and the consumer live, for `/admin/actors`: the server
//! this instance is connected to, each group's leader and its other peers with their
//! lag, as JetStream's stream and consumer info report them (read with the lag poll).

use async_nats::jetstream::stream::ClusterInfo;
use sluice_actors::{GroupView, NatsView, ReplicaView};

/// The view from the connected server's name and the two infos' cluster parts (a
/// single server reports itself as the leader, with no replicas).
pub fn view(
    connected_server: &str,
    stream: Option<(&str, Option<&ClusterInfo>)>,
    consumer: Option<(&str, Option<&ClusterInfo>)>,
) -> NatsView {
    NatsView {
        connected_server: connected_server.to_owned(),
        stream: stream.map(|(name, cluster)| group(name, cluster)),
        consumer: consumer.map(|(name, cluster)| group(name, cluster)),
    }
}

fn group(name: &str, cluster: Option<&ClusterInfo>) -> GroupView {
    GroupView {
        name: name.to_owned(),
        leader: cluster
            .and_then(|c| c.leader.clone())
            .filter(|l| !l.is_empty()),
        replicas: cluster
            .map(|c| {
                c.replicas
                    .iter()
                    .map(|r| ReplicaView {
                        name: r.name.clone(),
                        current: r.current,
                        offline: r.offline,
                        lag: r.lag,
                    })
                    .collect()
            })
            .unwrap_or_default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_group_names_its_leader_and_its_replicas_with_their_lag() {
        let cluster: ClusterInfo = serde_json::from_value(serde_json::json!({
            "name": "c",
            "leader": "n2",
            "replicas": [
                {"name": "n1", "current": true, "active": 1000, "lag": 0},
                {"name": "n3", "current": false, "active": 9000000000u64, "offline": true, "lag": 42}
            ]
        }))
        .expect("a cluster info");
        let v = view(
            "n1",
            Some(("INGEST", Some(&cluster))),
            Some(("sluice", None)),
        );
        assert_eq!(v.connected_server, "n1");
        let stream = v.stream.expect("the stream");
        assert_eq!(stream.leader.as_deref(), Some("n2"));
        assert_eq!(stream.replicas.len(), 2);
        assert_eq!(
            stream.replicas[1],
            ReplicaView {
                name: "n3".into(),
                current: false,
                offline: true,
                lag: Some(42)
            }
        );
        let consumer = v.consumer.expect("the consumer");
        assert_eq!((consumer.name.as_str(), consumer.leader), ("sluice", None));
    }
}
