//! What each actor publishes about itself: the serializable snapshots of the admin
//! tree (`GET /admin/actors`), one type per kind of node.

use serde::Serialize;

use crate::breaker::scoped::BreakerSnapshot;
use crate::ports::{NatsView, SourceWait, StallReason};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum NodeKind {
    Root,
    Consumer,
    /// A ClickHouse target: the supervisor of its servers' pools and its tables.
    Target,
    /// One ClickHouse server (a replica of a shard): its outage breaker.
    Pool,
    Table,
}

impl NodeKind {
    /// Every kind, as `GET /admin/actors` writes it: the admin API's document takes its
    /// enumeration from here, so a new kind cannot be left out of the contract.
    pub const ALL: [NodeKind; 5] = [
        NodeKind::Root,
        NodeKind::Consumer,
        NodeKind::Target,
        NodeKind::Pool,
        NodeKind::Table,
    ];

    /// The kind's name on the wire (its serialized form).
    pub const fn name(self) -> &'static str {
        match self {
            NodeKind::Root => "root",
            NodeKind::Consumer => "consumer",
            NodeKind::Target => "target",
            NodeKind::Pool => "pool",
            NodeKind::Table => "table",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum NodeStatus {
    Starting,
    Running,
    Stopping,
    Failed,
    Restarting,
}

#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct ConsumerSnapshot {
    pub connected: bool,
    /// Pulls the source found lost and replaced while connected (no row and no
    /// heartbeat, a leader change, rows pending and none delivered): a silent stall
    /// noticed, each counted once (`sluice_consumer_stalls_total`).
    pub stalls: u64,
    /// Why the last one was replaced.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_stall: Option<StallReason>,
    /// What the consumer waits for before it pulls again, while it waits (`/readyz`
    /// gives it as its reason).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub waiting_for: Option<SourceWait>,
    /// Where its stream and consumer live: the server connected to, the leaders and
    /// their replicas (as of the last lag poll).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nats: Option<NatsView>,
    /// Messages pulled: what `max_ack_pending` and `pull_batch` count.
    pub pulled_total: u64,
    /// The rows in them (a message carries one row or many): what the buffers, the
    /// inserts and the row metrics count.
    pub pulled_rows_total: u64,
    /// The stream's pending count (lag), when the source knows it.
    pub pending: Option<u64>,
    pub reconnects: u64,
    pub last_error: Option<String>,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct TargetSnapshot {
    pub target: String,
    /// The replicas of each shard, by name, in the configuration's order (shard 1
    /// first).
    pub shards: Vec<Vec<String>>,
    /// Table actors running.
    pub tables: usize,
}

/// One ClickHouse server of a target.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct PoolSnapshot {
    pub target: String,
    /// The server's name: its `host:port`, or the target's name for a target of one
    /// server.
    pub replica: String,
    /// Its shard, 1-based as operators count them.
    pub shard: usize,
    pub breaker: BreakerSnapshot,
    /// The server answered one probe (readiness).
    pub probed_ok: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server_version: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_probe_error: Option<String>,
}

/// A table's own backoff for one replica (read-only there, too many parts...).
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct ReplicaBackoff {
    pub replica: String,
    pub backoff: BreakerSnapshot,
}

/// Where one of a table's batches went.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct BatchRoute {
    /// 1-based.
    pub shard: usize,
    pub replica: String,
    /// The messages it carried (each one row or many).
    pub messages: usize,
    /// When its flight started (RFC 3339).
    pub at: String,
}

/// The steps of a flight, in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FlightStage {
    /// Forming the batch through the ledger: claiming it, or reading its record and
    /// the messages it lacks.
    Forming,
    /// Waiting for its turn at the server (a suspect's flies alone: see `solo`).
    WaitingTurn,
    /// Inserting (and isolating rejected rows).
    Inserting,
    /// Telling the table its verdict and, with rows pending, hearing what becomes of
    /// them.
    Reporting,
    /// Recording the verdicts in the manifest store.
    Recording,
    /// Parking rejected rows on the DLQ.
    Parking,
    /// Acking the messages settled.
    Acking,
}

impl FlightStage {
    const ALL: [FlightStage; 7] = [
        FlightStage::Forming,
        FlightStage::WaitingTurn,
        FlightStage::Inserting,
        FlightStage::Reporting,
        FlightStage::Recording,
        FlightStage::Parking,
        FlightStage::Acking,
    ];

    /// The stage numbered `i` (as `stage as u8` numbers them).
    pub fn from_index(i: u8) -> Self {
        Self::ALL
            .get(i as usize)
            .copied()
            .unwrap_or(FlightStage::Forming)
    }

    /// Whether this step comes before `other` in a flight.
    pub fn before(self, other: FlightStage) -> bool {
        (self as u8) < (other as u8)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            FlightStage::Forming => "forming",
            FlightStage::WaitingTurn => "waiting_turn",
            FlightStage::Inserting => "inserting",
            FlightStage::Reporting => "reporting",
            FlightStage::Recording => "recording",
            FlightStage::Parking => "parking",
            FlightStage::Acking => "acking",
        }
    }
}

/// A flight as `/admin/actors` shows it.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct FlightSnapshot {
    pub stage: FlightStage,
    /// How long it has been in that stage.
    pub stage_ms: u64,
    /// How long since it started.
    pub age_ms: u64,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct TableSnapshot {
    pub tenant: String,
    pub table: String,
    pub buffered_rows: usize,
    pub buffered_bytes: usize,
    pub flights: usize,
    /// What each flight out is doing, and for how long.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub flights_out: Vec<FlightSnapshot>,
    /// The table's own backoff: open while every replica's is (it sends nowhere).
    pub backoff: BreakerSnapshot,
    /// Per replica, when the target has more than one.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub replica_backoffs: Vec<ReplicaBackoff>,
    /// The target's shards.
    pub shards: usize,
    /// The column that places the table's rows on shards (`None`: its batches take
    /// the shards in turn; a key on a target of one shard places nothing).
    pub shard_key: Option<String>,
    /// Where the table's last batches went (newest last).
    pub last_batches: Vec<BatchRoute>,
    pub rows_inserted: u64,
    pub rows_parked: u64,
    /// Rows handed back (naked with a delay) by this table.
    pub rows_handed_back: u64,
    pub dlq_failures: u64,
    /// ClickHouse says the table does not exist: its rows wait for it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub missing_table: Option<MissingTableSnapshot>,
    /// Whether ClickHouse deduplicates the table's inserts (exactly-once) — known once
    /// a batch was formed — and why.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exactly_once: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exactly_once_why: Option<String>,
    /// Recorded batches of the table the ledger knows of (open, split or settled and not
    /// removed yet).
    pub recorded_batches: usize,
    /// Recorded batches sent again past the table's deduplication window (see
    /// `sluice_batches_past_dedup_window_total`).
    pub batches_past_dedup_window: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
}

/// A table its rows wait for.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct MissingTableSnapshot {
    /// How long ClickHouse has said it does not exist, in ms.
    pub for_ms: u64,
    /// Time left before its rows are parked, in ms (0: they are parked as they come).
    pub grace_left_ms: u64,
}

/// A node's kind-specific state.
#[derive(Clone, Debug, Serialize, PartialEq)]
#[serde(untagged)]
pub enum NodeState {
    None {},
    Consumer(ConsumerSnapshot),
    Target(TargetSnapshot),
    Pool(PoolSnapshot),
    Table(TableSnapshot),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_is_named_as_it_is_serialized() {
        for kind in NodeKind::ALL {
            assert_eq!(
                serde_json::to_value(kind).ok(),
                Some(serde_json::Value::from(kind.name()))
            );
        }
    }
}
