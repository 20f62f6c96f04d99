//! Sluice's supervised actor tree.
//!
//! ```text
//! RootSupervisor ─┬─ ConsumerActor ── routes each message by subject ──► TableActor(tenant, table)
//!                 ├─ PoolActor(target A) ─┬─ TableActor(t1, events)
//!                 │   breaker + probe     └─ TableActor(t1, clicks)
//!                 └─ PoolActor(target B) ── ...
//! ```

pub mod ports;

pub use ports::{
    Class, Delivery, DeliveryMeta, InsertError, InsertRequest, Inserter, Parking, ServerInfo,
    SettleError, Source, SourceError, SourceFactory, TableKey,
};
