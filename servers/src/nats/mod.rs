//! nats-server: which build to run ([`NatsFlavor`]) and a running one ([`NatsServer`]).

mod flavor;
mod server;

pub use flavor::{NatsFlavor, BIN_OVERRIDE_ENV, CURRENT_BIN_ENV, DEBIAN_BIN, FLAVOR_ENV};
pub use server::{NatsServer, NATS_READY_DEADLINE};
