//! nats-server: which build to run ([`NatsFlavor`]), a running one ([`NatsServer`]),
//! and several joined in a JetStream cluster ([`NatsCluster`]).

mod cluster;
mod flavor;
mod server;

pub use cluster::{NatsCluster, CLUSTER_NAME};
pub use flavor::{NatsFlavor, BIN_OVERRIDE_ENV, CURRENT_BIN_ENV, DEBIAN_BIN, FLAVOR_ENV};
pub use server::{NatsServer, NATS_READY_DEADLINE};
