//! ZooKeeper, for ClickHouse's Replicated tables: where it is installed
//! ([`Installation`]) and a running one ([`ZooKeeper`]).
//!
//! ClickHouse 18.16 needs ZooKeeper for every `Replicated*MergeTree` table, and only
//! such tables deduplicate inserts there. One JVM start is about half a second on a
//! loaded 2-core machine, so each test (stack) starts its own rather than sharing one;
//! each ClickHouse still gets a root node of its own ([`ZooKeeper::new_root`]), so one
//! ZooKeeper could serve several.

mod client;
mod install;
mod server;

pub use install::{jar, Installation, JAVA_BIN, ZOOKEEPER_JAR};
pub use server::{ZooKeeper, ZooKeeperRoot, ZOOKEEPER_READY_DEADLINE};
