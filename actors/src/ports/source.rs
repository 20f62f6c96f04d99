//! The JetStream port's consumer: the [`Source`] of deliveries and what it reports.

use std::future::Future;

use serde::Serialize;

use super::Delivery;

/// Why pulling from the queue failed; the consumer reconnects with backoff.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct SourceError(pub String);

/// The durable consumer the ConsumerActor pulls from.
pub trait Source: Send + 'static {
    type Delivery: Delivery;

    /// Wait for deliveries and return the ones ready, at most `max`. May return an
    /// empty batch when nothing arrived for a while, so the caller can look around.
    fn pull(
        &mut self,
        max: usize,
    ) -> impl Future<Output = Result<Vec<Self::Delivery>, SourceError>> + Send;

    /// Rows in the stream not yet delivered to the consumer (the lag), when known.
    fn pending(&mut self) -> impl Future<Output = Option<u64>> + Send;

    /// What the source says of itself besides its rows, for the consumer's snapshot:
    /// read after every pull, so it does no I/O.
    fn status(&self) -> SourceStatus {
        SourceStatus::default()
    }
}

/// Why a pull was found lost and replaced.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StallReason {
    /// No row and no idle heartbeat for two heartbeats: the server no longer knows the
    /// request (its consumer's leader moved, the node went).
    HeartbeatsMissed,
    /// The server ended the request for a change of the consumer's leader (409).
    LeadershipChange,
    /// The stream held rows for the consumer, the request waited, and none came.
    PendingUndelivered,
    /// The stream keeps messages past the last one the consumer delivered, while the
    /// consumer says nothing is pending or awaits an ack: its leader no longer sees
    /// them (a replicated consumer after its leader was frozen, nats-server 2.9).
    StreamAheadOfConsumer,
    /// The consumer holds `max_ack_pending` deliveries awaiting acks that no instance
    /// holds, and redelivers none of them after `ack_wait`: rows wait that never come.
    AcksHeldByNobody,
}

impl StallReason {
    pub const ALL: [StallReason; 5] = [
        StallReason::HeartbeatsMissed,
        StallReason::LeadershipChange,
        StallReason::PendingUndelivered,
        StallReason::StreamAheadOfConsumer,
        StallReason::AcksHeldByNobody,
    ];

    /// The `reason` label of `sluice_consumer_stalls_total`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::HeartbeatsMissed => "heartbeats_missed",
            Self::LeadershipChange => "leadership_change",
            Self::PendingUndelivered => "pending_undelivered",
            Self::StreamAheadOfConsumer => "stream_ahead_of_consumer",
            Self::AcksHeldByNobody => "acks_held_by_nobody",
        }
    }

    /// Whether an idle heartbeat ends the stall: it shows the request waits, which
    /// answers a request lost; it does not answer rows that do not come.
    pub fn ended_by_heartbeat(self) -> bool {
        matches!(self, Self::HeartbeatsMissed | Self::LeadershipChange)
    }
}

/// What a source waits for before it pulls again.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SourceWait {
    /// Its pull requests find no responders: the consumer has no leader (a NATS
    /// cluster's election, a node restarting).
    ConsumerLeader,
    /// The manifest index is being rebuilt (its watch was opened again: a reconnect,
    /// the bucket's leader moved): no row is taken before it holds every record.
    ManifestIndex,
}

impl std::fmt::Display for SourceWait {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::ConsumerLeader => {
                "waiting for the consumer to have a leader (a NATS election): its pull requests find no responders"
            }
            Self::ManifestIndex => {
                "waiting for the manifest index to catch up with the bucket (its watch was opened again)"
            }
        })
    }
}

/// The NATS side of the consumer.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct NatsView {
    /// The `server_name` of the server the client is connected to.
    pub connected_server: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stream: Option<GroupView>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub consumer: Option<GroupView>,
}

/// A replicated stream or consumer: its leader and the other peers.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct GroupView {
    pub name: String,
    /// The leader's `server_name` (none during an election).
    pub leader: Option<String>,
    /// The peers besides the leader.
    pub replicas: Vec<ReplicaView>,
}

#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct ReplicaView {
    pub name: String,
    /// Up to date with the leader.
    pub current: bool,
    /// The group takes it for gone.
    pub offline: bool,
    /// Operations it is behind the leader, when the leader says.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lag: Option<u64>,
}

/// A source's account of itself (see [`Source::status`]).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SourceStatus {
    /// Pulls found lost and replaced since the process started (across reconnects).
    pub stalls: u64,
    pub last_stall: Option<StallReason>,
    /// What it waits for before it pulls again, while it waits.
    pub waiting_for: Option<SourceWait>,
    /// Where its stream and consumer live.
    pub nats: Option<NatsView>,
}

/// Opens a `Source`; called again after a source fails, with backoff.
///
/// A factory may open several sources at once, one per partition of the queue (each
/// a stream with its durable consumer and its own leader): the tree runs a
/// ConsumerActor for each, all routing to the same tables.
pub trait SourceFactory: Send + Sync + 'static {
    type Source: Source;

    /// The streams of the sources this factory opens, by index: one ConsumerActor
    /// each. `None`: one source, on `PipelineSettings::stream`.
    fn partitions(&self) -> Option<Vec<String>> {
        None
    }

    /// Opens source number `partition` (0 when there is one).
    fn connect(
        &self,
        partition: usize,
    ) -> impl Future<Output = Result<Self::Source, SourceError>> + Send;
}
