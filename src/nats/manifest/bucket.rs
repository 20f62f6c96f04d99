//! The bucket's stream, created by Sluice itself, idempotently (every instance runs it
//! whenever its index watch starts).
//!
//! async-nats's `create_key_value` asks for the account's JetStream limits first, and
//! cannot read 2.9.10's answer to that ("data did not match any variant of untagged
//! enum Response"), so on Debian's server it always fails. A bucket is only a stream of
//! a known shape, though: this creates `KV_<bucket>` as `create_key_value` would (the
//! same subjects, limits and flags), and then opens it with `get_key_value`, which
//! only reads the stream's info.

use std::time::Duration;

use anyhow::Context as _;
use async_nats::jetstream::{self, kv, stream};

use super::ManifestSettings;
use crate::nats::budget::{discard_new_is_exact, server_max_bytes};
use crate::nats::setup::{bytes_i64, create_or_update};

/// How long a manifest is kept at most, whatever its state: a last resort against a
/// leak (every manifest is normally removed within seconds of its batch settling, or
/// collected). A batch held longer than this (an outage of a day, with its rows still
/// in the queue) loses its record: its rows are then sent as a new batch, at least
/// once. See docs/operations.md, "Manifest store".
pub const MAX_AGE: Duration = Duration::from_secs(24 * 60 * 60);

/// The duplicate window `create_key_value` leaves to the server's default.
const DUPLICATE_WINDOW: Duration = Duration::from_secs(120);

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
    s: &ManifestSettings,
) -> anyhow::Result<kv::Store> {
    let exact = discard_new_is_exact(&js.client().server_info().version);
    let config = stream::Config {
        name: stream_name(&s.bucket),
        description: Some(
            "Sluice batch manifests: which rows each insert carried, for exactly-once".into(),
        ),
        subjects: vec![format!("$KV.{}.>", s.bucket)],
        // A key-value bucket without history: the last value of each key.
        max_messages_per_subject: 1,
        // Like the queue: refused when full (records then fail and inserts wait), never
        // the oldest manifests pruned. On servers before 2.10.5 Sluice enforces the
        // budget itself (see `budget.rs`) and the server's own limit sits above it.
        discard: stream::DiscardPolicy::New,
        max_bytes: bytes_i64(server_max_bytes(s.max_bytes, exact)),
        max_age: MAX_AGE,
        storage: stream::StorageType::File,
        allow_rollup: true,
        deny_delete: true,
        deny_purge: false,
        allow_direct: true,
        duplicate_window: DUPLICATE_WINDOW,
        num_replicas: s.replicas,
        ..Default::default()
    };
    create_or_update(js, config)
        .await
        .with_context(|| format!("setting up the manifest bucket {}", s.bucket))?;
    js.get_key_value(&s.bucket)
        .await
        .with_context(|| format!("opening the manifest bucket {}", s.bucket))
}
