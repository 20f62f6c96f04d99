//! The idempotency bucket's stream, created by Sluice itself (as the manifest bucket's
//! is: async-nats's `create_key_value` cannot read nats-server 2.9.10's account info),
//! idempotently, the first time a keyed request needs it and again after a failure.

use std::time::Duration;

use anyhow::Context as _;
use async_nats::jetstream::{self, kv, stream};

use super::KeyStoreSettings;
use crate::nats::budget::{discard_new_is_exact, server_max_bytes};
use crate::nats::setup::{bytes_i64, create_or_update};

/// The stream behind a bucket.
pub fn stream_name(bucket: &str) -> String {
    format!("KV_{bucket}")
}

/// The subject a key is written on.
pub fn subject(bucket: &str, key: &str) -> String {
    format!("$KV.{bucket}.{key}")
}

/// Create the bucket's stream (or bring it to this shape), then open the bucket.
pub async fn ensure_bucket(
    js: &jetstream::Context,
    s: &KeyStoreSettings,
) -> anyhow::Result<kv::Store> {
    let exact = discard_new_is_exact(&js.client().server_info().version);
    let config = stream::Config {
        name: stream_name(&s.bucket),
        description: Some(
            "Sluice Idempotency-Key records: each keyed ingest request's body fingerprint and answer".into(),
        ),
        subjects: vec![format!("$KV.{}.>", s.bucket)],
        // A key-value bucket without history: the last record of each key.
        max_messages_per_subject: 1,
        // Full: a keyed request answers 503 (records are never pruned early). Before
        // nats-server 2.10.5 Sluice enforces the budget itself (see `budget.rs`).
        discard: stream::DiscardPolicy::New,
        max_bytes: bytes_i64(server_max_bytes(s.max_bytes, exact)),
        // The promise lasts as long as a record: from its last write.
        max_age: s.max_age,
        storage: stream::StorageType::File,
        allow_rollup: true,
        deny_delete: true,
        deny_purge: false,
        allow_direct: true,
        // Not used (records carry no message id), but never longer than `max_age`.
        duplicate_window: s.max_age.min(Duration::from_secs(120)),
        num_replicas: s.replicas,
        ..Default::default()
    };
    create_or_update(js, config)
        .await
        .with_context(|| format!("setting up the idempotency bucket {}", s.bucket))?;
    js.get_key_value(&s.bucket)
        .await
        .with_context(|| format!("opening the idempotency bucket {}", s.bucket))
}
