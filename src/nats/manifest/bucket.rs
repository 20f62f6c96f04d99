//! The manifest bucket's stream, created by Sluice itself (`kv_bucket`), idempotently
//! (every instance runs it whenever its index watch starts).

use std::time::Duration;

use async_nats::jetstream::{self, kv};

use super::ManifestSettings;
use crate::nats::kv_bucket::{self, BucketShape};

pub use crate::nats::kv_bucket::{stream_name, subject};

/// How long a manifest is kept at most, whatever its state: a last resort against a
/// leak (every manifest is normally removed within seconds of its batch settling, or
/// collected). A batch held longer than this (an outage of a day, with its rows still
/// in the queue) loses its record: its rows are then sent as a new batch, at least
/// once. See docs/operations.md, "Manifest store".
pub const MAX_AGE: Duration = Duration::from_secs(24 * 60 * 60);

/// Create the bucket's stream (or bring it to this shape), then open the bucket. Like
/// the queue, a full bucket refuses records (batches then wait), never prunes them.
pub async fn ensure_bucket(
    js: &jetstream::Context,
    s: &ManifestSettings,
) -> anyhow::Result<kv::Store> {
    let shape = BucketShape {
        bucket: &s.bucket,
        purpose: "manifest",
        description: "Sluice batch manifests: which rows each insert carried, for exactly-once",
        max_bytes: s.max_bytes,
        max_age: s.max_age,
        replicas: s.replicas,
    };
    kv_bucket::ensure(js, &shape).await
}
