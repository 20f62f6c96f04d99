//! A JetStream key-value bucket whose stream Sluice creates itself, idempotently: the
//! manifest bucket and the `Idempotency-Key` bucket.
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

use super::setup::{bytes_i64, create_or_update};
use super::workarounds::budget::{discard_new_is_exact, server_max_bytes};

/// The stream behind a bucket.
pub fn stream_name(bucket: &str) -> String {
    format!("KV_{bucket}")
}

/// The subject a key is written on.
pub fn subject(bucket: &str, key: &str) -> String {
    format!("$KV.{bucket}.{key}")
}

/// What a bucket is made of.
pub struct BucketShape<'a> {
    pub bucket: &'a str,
    /// What the bucket is for, in messages: "manifest", "idempotency".
    pub purpose: &'a str,
    /// What `nats stream info` says the stream holds.
    pub description: &'a str,
    /// Sluice's byte budget: a write past it is refused (on servers before 2.10.5
    /// Sluice enforces it itself, see `budget.rs`, and the server's own limit sits
    /// above it).
    pub max_bytes: u64,
    /// How long a value is kept after its last write, whatever it says.
    pub max_age: Duration,
    pub replicas: usize,
}

/// JetStream's own default duplicate window, which `create_key_value` leaves in place.
const DEFAULT_DUPLICATE_WINDOW: Duration = Duration::from_secs(120);

/// A bucket's duplicate window (not used: records carry no message id): the server's
/// default, but never longer than the age values are kept (JetStream refuses that); a
/// zero age keeps values for good, and the default.
fn duplicate_window(max_age: Duration) -> Duration {
    if max_age.is_zero() {
        DEFAULT_DUPLICATE_WINDOW
    } else {
        max_age.min(DEFAULT_DUPLICATE_WINDOW)
    }
}

/// Create the bucket's stream (or bring it to this shape), then open the bucket.
pub async fn ensure(js: &jetstream::Context, shape: &BucketShape<'_>) -> anyhow::Result<kv::Store> {
    let exact = discard_new_is_exact(&js.client().server_info().version);
    let config = stream::Config {
        name: stream_name(shape.bucket),
        description: Some(shape.description.to_string()),
        subjects: vec![format!("$KV.{}.>", shape.bucket)],
        // A key-value bucket without history: the last value of each key.
        max_messages_per_subject: 1,
        // Refused when full, never the oldest values pruned.
        discard: stream::DiscardPolicy::New,
        max_bytes: bytes_i64(server_max_bytes(shape.max_bytes, exact)),
        max_age: shape.max_age,
        storage: stream::StorageType::File,
        allow_rollup: true,
        deny_delete: true,
        deny_purge: false,
        allow_direct: true,
        duplicate_window: duplicate_window(shape.max_age),
        num_replicas: shape.replicas,
        ..Default::default()
    };
    let (purpose, bucket) = (shape.purpose, shape.bucket);
    create_or_update(js, config)
        .await
        .with_context(|| format!("setting up the {purpose} bucket {bucket}"))?;
    js.get_key_value(bucket)
        .await
        .with_context(|| format!("opening the {purpose} bucket {bucket}"))
}

/// The last value of `key`, read from the bucket's stream leader (`None`: never written,
/// or deleted or purged since).
///
/// Not `kv::Store::entry`: on a bucket with `allow_direct` (every bucket Sluice makes,
/// as `create_key_value` makes them) that is a direct get, which any replica of an R3
/// bucket answers, a lagging one with an older value: a batch's record read as still
/// open after its settled state was written and its messages acked, and its rows
/// inserted again (`cluster_consumer_leader_sigstop` found it). A
/// decision taken on what a record says now must read it where writes are ordered.
pub async fn read_from_leader(kv: &kv::Store, key: &str) -> Result<Option<kv::Entry>, String> {
    let subject = format!("{}{key}", kv.prefix);
    let message = match kv.stream.get_last_raw_message_by_subject(&subject).await {
        Ok(message) => message,
        Err(e) if e.kind() == stream::LastRawMessageErrorKind::NoMessageFound => return Ok(None),
        Err(e) => return Err(e.to_string()),
    };
    let operation = match message.headers.get("KV-Operation") {
        Some(op) => op
            .as_str()
            .parse::<kv::Operation>()
            .map_err(|_| format!("{key}: an unknown KV-Operation {:?}", op.as_str()))?,
        // A marker a newer server writes when it removes a value itself.
        None if message
            .headers
            .get(async_nats::header::NATS_MARKER_REASON)
            .is_some() =>
        {
            kv::Operation::Purge
        }
        None => kv::Operation::Put,
    };
    Ok(Some(kv::Entry {
        bucket: kv.name.clone(),
        key: key.to_owned(),
        value: message.payload,
        revision: message.sequence,
        delta: 0,
        created: message.time,
        operation,
        seen_current: false,
    }))
}
