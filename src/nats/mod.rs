//! Everything that speaks to NATS JetStream: the connection, the INGEST and DLQ streams
//! and the durable consumer, publishing with message ids, the delivered message as the
//! actors' `Delivery`, and the consumer as their `Source`.

mod budget;
mod connect;
mod delivery;
mod dlq;
mod publish;
mod setup;
mod source;

pub use connect::{connect, wait_connected};
pub use delivery::{DlqWriter, JsDelivery};
pub use dlq::{Dlq, DlqCounts, DlqTableCount, ParkedRow, ReplayReport};
pub use publish::{PublishError, Publisher};
pub use setup::{ensure_consumer, ensure_streams, StreamSettings};
pub use source::{JetStreamSource, JetStreamSourceFactory};
