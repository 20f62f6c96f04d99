//! Sluice's supervised actor tree.
//!
//! ```text
//! RootSupervisor ─┬─ ConsumerActor ── routes each message by subject ──► TableActor(tenant, table)
//!                 ├─ TargetActor(A) ─┬─ PoolActor(shard 1, replica a1)   breaker + probe of one server
//!                 │                  ├─ PoolActor(shard 1, replica a2)
//!                 │                  ├─ TableActor(t1, events)           buffer, backoff per replica
//!                 │                  └─ TableActor(t1, clicks)
//!                 └─ TargetActor(B) ── ...
//! ```
//!
//! Each decision has one owner and is taken in its mailbox: each PoolActor owns one
//! ClickHouse server's outage breaker and probe token, each TableActor its buffer and
//! its table's backoff on each server, and which server a batch goes to (a pure
//! function of the breakers the pools publish: [`routing`]). A flight (one batch's
//! insert and isolation) runs as a task, asks the pool of the server it goes to for its
//! ticket and reports its verdict by message; what must outlive an actor goes back to
//! its successor through its supervisor. Nothing shared decides anything: the only
//! locks and atomics are in [`observe`] and [`metrics`], which record what the actors
//! decided.
//!
//! Where to find what (the floors they sit on: docs/architecture.md, "Floors"):
//! - [`ports`]: the traits the actors speak through; `ledger::store` the ledger's.
//! - [`breaker`]: the outage breaker state machine (pure), with [`breaker::scoped`] (a
//!   breaker with its log lines and gauge, as its owner keeps it), [`breaker::gate`]
//!   and [`breaker::outage_log`]; [`backoff`]: delays and jitter.
//! - [`flight`]: one batch's flight (prepare, send, judge,
//!   [`flight::bisect`] the isolation of rejected rows, settle);
//!   [`protocol`]: what table, pool and flight say to each other; [`batch`]: a flight's
//!   rows, their verdicts and settlement ([`batch::keepalive`]: `progress()` for rows
//!   held long); [`ledger`]: the batch ledger (exactly-once: records, their store,
//!   splits, gatherings, a flight's session).
//! - [`consumer`], [`targets`], [`pool`], [`table`], [`supervisor`]: the actors;
//!   [`placement`]: replicas, shard keys and a target's servers; [`routing`]: subjects
//!   to tables to targets; [`settle`]: rows handed back or parked without an insert;
//!   [`restart`]: respawn pacing.
//! - [`observe`]: the live tree, readiness, totals and the frame every actor publishes
//!   its snapshot through; [`metrics`]: every metric name of the actors.
//! - [`pipeline`]: start it, get a handle. `testkit` (feature `testkit`): fakes of the
//!   ports.

pub mod backoff;
pub mod batch;
pub mod breaker;
pub mod clock;
pub mod consumer;
pub mod context;
pub mod flight;
pub mod ledger;
pub mod lifecycle;
pub mod messaging;
pub mod metrics;
pub mod observe;
pub mod pipeline;
pub mod placement;
pub mod pool;
pub mod ports;
pub mod protocol;
pub mod restart;
pub mod routing;
pub mod rows;
pub mod settings;
pub mod settle;
pub mod supervisor;
pub mod table;
pub mod targets;
#[cfg(any(test, feature = "testkit"))]
pub mod testkit;

pub use clock::WallClock;
pub use ledger::{
    keep_settled_for, Changes, ClaimError, FetchError, LedgerChange, LedgerSnapshot, Manifest,
    ManifestState, ManifestStore, Recorded, RejectedRow, StoreError, UpdateError,
};
pub use observe::StatsSnapshot;
pub use pipeline::{start, PipelineConfig, PipelineHandle, ShutdownSummary, StartError, Target};
pub use placement::{MessageShards, ShardKey};
pub use ports::{
    Class, ClickHouseError, Dedup, DedupWindow, Delivery, DeliveryMeta, GroupView, InsertRequest,
    Inserter, NatsView, NoAnswer, Parking, PartCopy, Position, ReplicaView, ServerInfo,
    SettleError, Source, SourceError, SourceFactory, SourceStatus, SourceWait, StallReason,
    TableKey,
};
pub use routing::{parse_subject, partition_prefix, server_mapping};
pub use settings::{
    BackoffPolicy, Failpoint, PipelineSettings, RestartPolicy, TableOverrides, TableSettings,
    TableSettingsResolver,
};
