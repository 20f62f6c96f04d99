//! Everything that speaks to NATS JetStream: the connection, the INGEST and DLQ streams
//! and the durable consumer, publishing with message ids, the delivered message as the
//! actors' `Delivery`, the consumer as their `Source`, the bucket of batch
//! manifests as their `ManifestStore`, and the ingest API's `Idempotency-Key` records.

mod connect;
mod dlq;
mod encoding;
mod error_text;
mod key_store;
mod kv_bucket;
mod landed;
mod manifest;
mod partitions;
mod placement;
mod publish;
mod pulling;
mod setup;
mod split;
mod stream_fill;
pub mod version;
mod workarounds;

pub use connect::{connect, wait_connected};
pub use dlq::{Dlq, DlqCounts, DlqTableCount, ParkedRow, ReplayReport};
pub use encoding::{
    decode, headers_for, Compression, Encoding, Undecodable, ENCODING_HEADER, MAX_DECODED_BYTES,
    UNDECODABLE_CLASS,
};
pub use key_store::{Held, KeyStore, KeyStoreError, KeyStoreSettings, Slot};
pub use landed::{chunk_id, chunk_message_id, LandedChunks, STEM_HEX};
pub use manifest::{
    bucket_stream_name, decode_manifest, Collected, JsManifestStore, ManifestSettings,
    MANIFEST_MAX_AGE,
};
pub use partitions::{
    check_routes, keep_checking_routes, keep_retiring, partition_stream, IngestStreams,
    PublisherRoutes,
};
pub use publish::{PendingPublish, PublishError, Publisher};
pub use pulling::delivery::{DlqWriter, JsDelivery, ORIGINAL_LINE_HEADER};
pub use pulling::source::{JetStreamSource, JetStreamSourceFactory};
pub use setup::{
    ensure_consumer, ensure_streams, replicas_beyond_server, replicas_refused_once_connected,
};
pub use split::{
    keep_collecting as keep_collecting_splits, split_bucket, SplitRecords, SplitSettings,
};
pub use workarounds::acked_here::AckedHere;
pub use workarounds::stranded::remove_stranded;
