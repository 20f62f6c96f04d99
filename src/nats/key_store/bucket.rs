//! A key store's bucket, created by Sluice itself (`kv_bucket`, as the manifest
//! bucket's), idempotently, the first time a record needs it and again after a failure.

use async_nats::jetstream::{self, kv};

use super::KeyStoreSettings;
use crate::nats::kv_bucket::{self, BucketShape};

/// Create the bucket's stream (or bring it to this shape), then open the bucket. A
/// full bucket refuses new records, never prunes them.
pub async fn ensure_bucket(
    js: &jetstream::Context,
    s: &KeyStoreSettings,
) -> anyhow::Result<kv::Store> {
    let shape = BucketShape {
        bucket: &s.bucket,
        purpose: s.purpose,
        description: s.description,
        max_bytes: s.max_bytes,
        // The promise lasts as long as a record: from its last write.
        max_age: s.max_age,
        replicas: s.replicas,
    };
    kv_bucket::ensure(js, &shape).await
}
