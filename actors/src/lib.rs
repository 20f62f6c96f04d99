//! Sluice's supervised actor tree.
//!
//! ```text
//! RootSupervisor ─┬─ ConsumerActor ── routes each message by subject ──► TableActor(tenant, table)
//!                 ├─ PoolActor(target A) ─┬─ TableActor(t1, events)
//!                 │   breaker + probe     └─ TableActor(t1, clicks)
//!                 └─ PoolActor(target B) ── ...
//! ```
//!
//! Where to find what:
//! - [`breaker`]: the outage breaker state machine (pure); [`gate`]: the breaker shared
//!   by a pool (or a table) and its flush tasks; [`backoff`]: delays and jitter;
//!   [`outage_log`]: the WARN/INFO cadence.
//! - [`bisect`]: isolation of rejected rows; [`table::flush`]: one flush task;
//!   [`table::buffer`]: the triggers; [`keepalive`]: `progress()` for rows held long.
//! - [`consumer`], [`pool`], [`table`], [`supervisor`]: the actors.
//! - [`observe`]: the live tree and readiness; [`metrics`]: every metric name.
//! - [`pipeline`]: start it, get a handle. [`testkit`]: fakes of the ports.

pub mod backoff;
pub mod bisect;
pub mod breaker;
pub mod consumer;
pub mod context;
pub mod gate;
pub mod keepalive;
pub mod metrics;
pub mod observe;
pub mod outage_log;
pub mod pipeline;
pub mod pool;
pub mod ports;
pub mod settings;
pub mod shutdown;
pub mod supervisor;
pub mod table;
pub mod testkit;

pub use pipeline::{
    start, PipelineConfig, PipelineHandle, ShutdownSummary, StartError, StatsSnapshot, Target,
};
pub use ports::{
    Class, Delivery, DeliveryMeta, InsertError, InsertRequest, Inserter, Parking, ServerInfo,
    SettleError, Source, SourceError, SourceFactory, TableKey,
};
pub use settings::{
    BackoffPolicy, PipelineSettings, RestartPolicy, TableOverrides, TableSettings,
    TableSettingsResolver,
};
