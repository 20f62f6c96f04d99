//! Where rows go: subjects to tables to targets ([`subjects`]), and within a target,
//! which of its servers a batch goes to ([`replicas`]).
//!
//! Neutral ground: the consumer routes by subject, the tables pick replicas; neither
//! knows another actor's messages.

pub mod replicas;
pub mod subjects;

pub use replicas::{all_waiting, pick, Gate, Layout, Pick};
pub use subjects::{
    is_table, is_tenant, parse_subject, Route, Routed, Router, MAX_NAME_LEN, TABLE_NAME_RULE,
    TENANT_NAME_RULE,
};
