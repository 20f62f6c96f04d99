//! Where a batch's rows go within a target: which server a batch goes to (its shard's
//! replicas, the shards in turn: [`replicas`]), which shard each row goes to for a
//! table with a shard key ([`shard_key`]), and the target's servers themselves
//! ([`servers`]). Pure decisions over what the pools published; no actor's messages.

pub mod replicas;
pub mod servers;
pub mod shard_key;

pub use replicas::{all_waiting, pick, Layout, Pick};
pub use servers::{Replica, TargetServers};
pub use shard_key::{MessageShards, ShardKey};
