//! Where rows go: subjects to tables to targets ([`subjects`]), and within a target,
//! which of its servers a batch goes to ([`replicas`]), and, for a table with a shard
//! key, which shard each row goes to ([`shard_key`]).
//!
//! Neutral ground: the consumer routes by subject, the tables pick replicas; neither
//! knows another actor's messages.

pub mod replicas;
pub mod shard_key;
pub mod subjects;

pub use replicas::{all_waiting, pick, Gate, Layout, Pick};
pub use shard_key::{MessageShards, ShardKey};
pub use subjects::{
    is_table, is_tenant, parse_subject, Route, Routed, Router, MAX_NAME_LEN, TABLE_NAME_RULE,
    TENANT_NAME_RULE,
};
