//! `[nats]`: names, prefixes, budgets and the one way of authenticating.

use std::path::PathBuf;

use super::{Check, Key};
use crate::config::file::{FileConfig, NatsFile};
use crate::config::nats_url::{self, hide_credentials};
use crate::config::{NatsAuth, NatsConfig, StreamCompression};

pub(super) fn nats(c: &mut Check, file: &FileConfig) -> NatsConfig {
    let n = &file.nats;
    let section = Key::table(["nats"]);
    let k = |name: &str| section.key(name);
    let seeds = seeds(c, n, &section);
    names(c, n, &section);
    idempotency_bucket(c, n, &section);
    if n.manifest_max_bytes.bytes() < MIN_MANIFEST_BYTES {
        c.problem(
            &[&k("manifest_max_bytes")],
            format!(
                "[nats] manifest_max_bytes = {}: must be at least 1MiB (one manifest of a 10,000-row batch takes about 10KiB)",
                n.manifest_max_bytes
            ),
        );
    }
    if n.subject_prefix == n.dlq_subject_prefix
        || n.subject_prefix
            .starts_with(&format!("{}.", n.dlq_subject_prefix))
        || n.dlq_subject_prefix
            .starts_with(&format!("{}.", n.subject_prefix))
    {
        c.problem(
            &[&k("subject_prefix"), &k("dlq_subject_prefix")],
            "[nats] subject_prefix and dlq_subject_prefix must not overlap",
        );
    }
    if n.max_bytes.bytes() == 0 || n.dlq_max_bytes.bytes() == 0 {
        c.problem(
            &[&k("max_bytes"), &k("dlq_max_bytes")],
            "[nats] max_bytes and dlq_max_bytes must be above zero: they bound the queue and the DLQ",
        );
    }
    c.positive(&k("ack_wait"), n.ack_wait.get());
    c.positive(&k("duplicate_window"), n.duplicate_window.get());
    if n.max_ack_pending <= 0 {
        c.problem(
            &[&k("max_ack_pending")],
            format!(
                "[nats] max_ack_pending = {}: must be above zero (it bounds the rows Sluice holds in memory)",
                n.max_ack_pending
            ),
        );
    }
    if n.replicas == 0 || n.replicas > 5 {
        c.problem(
            &[&k("replicas")],
            format!("[nats] replicas = {}: must be 1 to 5", n.replicas),
        );
    }
    if n.partitions == 0 || n.partitions > MAX_PARTITIONS {
        c.problem(
            &[&k("partitions")],
            format!(
                "[nats] partitions = {}: must be 1 to {MAX_PARTITIONS} (each is a stream with its own consumer and leader)",
                n.partitions
            ),
        );
    }
    let auth = nats_auth(c, file, &section);
    if n.stream_compression == StreamCompression::S2 {
        c.warn(STREAM_COMPRESSION_NEEDS_2_10);
    }
    NatsConfig {
        seeds,
        stream: n.stream.clone(),
        subject_prefix: n.subject_prefix.clone(),
        consumer: n.consumer.clone(),
        dlq_stream: n.dlq_stream.clone(),
        dlq_subject_prefix: n.dlq_subject_prefix.clone(),
        max_bytes: n.max_bytes.bytes(),
        dlq_max_bytes: n.dlq_max_bytes.bytes(),
        duplicate_window: n.duplicate_window.get(),
        ack_wait: n.ack_wait.get(),
        max_ack_pending: n.max_ack_pending,
        auth,
        replicas: n.replicas,
        manifest_bucket: n.manifest_bucket.clone(),
        manifest_max_bytes: n.manifest_max_bytes.bytes(),
        idempotency_bucket: n.idempotency_bucket.clone(),
        idempotency_max_bytes: n.idempotency_max_bytes.bytes(),
        stream_compression: n.stream_compression,
        partitions: n.partitions,
    }
}

/// The most partitions taken: each is a stream, a consumer and a ConsumerActor, and a
/// cluster has a few nodes to spread their leaders over.
const MAX_PARTITIONS: usize = 64;

/// `[nats] url`: the seeds it names, with no credentials in it.
fn seeds(c: &mut Check, n: &NatsFile, section: &Key) -> Vec<String> {
    let k = |name: &str| section.key(name);
    let mut seeds = Vec::new();
    if n.url.trim().is_empty() {
        c.problem(&[&k("url")], "[nats] url is empty");
    } else if let Some(hidden) = hide_credentials(&n.url) {
        c.problem(
            &[&k("url")],
            format!(
                "[nats] url = \"{hidden}\" carries credentials: put the user in `user` and the password in the variable named by `password_env`, or the token in the variable named by `token_env` (secrets never go in the URL)"
            ),
        );
    } else {
        match nats_url::seeds(&n.url) {
            Ok(found) => seeds = found,
            Err(e) => c.problem(&[&k("url")], format!("[nats] url = \"{}\": {e}", n.url)),
        }
    }
    seeds
}

/// The streams', consumer's, prefixes' and bucket's names: valid, and apart.
fn names(c: &mut Check, n: &NatsFile, section: &Key) {
    let k = |name: &str| section.key(name);
    for (name, value) in [
        ("stream", &n.stream),
        ("consumer", &n.consumer),
        ("dlq_stream", &n.dlq_stream),
    ] {
        if !is_nats_name(value) {
            let key = k(name);
            c.problem(
                &[&key],
                format!(
                    "{key} = \"{value}\" is not a valid JetStream name (letters, digits, _ and -)"
                ),
            );
        }
    }
    for (name, prefix) in [
        ("subject_prefix", &n.subject_prefix),
        ("dlq_subject_prefix", &n.dlq_subject_prefix),
    ] {
        if !is_subject_prefix(prefix) {
            let key = k(name);
            c.problem(
                &[&key],
                format!(
                    "{key} = \"{prefix}\" is not a subject prefix like \"ingest\" (tokens of letters, digits, _ and -, separated by dots; no wildcards)"
                ),
            );
        }
    }
    if n.stream == n.dlq_stream {
        c.problem(
            &[&k("stream"), &k("dlq_stream")],
            "[nats] stream and dlq_stream must differ",
        );
    }
    if !is_nats_name(&n.manifest_bucket) {
        c.problem(
            &[&k("manifest_bucket")],
            format!(
                "[nats] manifest_bucket = \"{}\" is not a valid key-value bucket name (letters, digits, _ and -)",
                n.manifest_bucket
            ),
        );
    }
    let bucket_stream = format!("KV_{}", n.manifest_bucket);
    if bucket_stream == n.stream || bucket_stream == n.dlq_stream {
        c.problem(
            &[&k("manifest_bucket"), &k("stream"), &k("dlq_stream")],
            format!(
                "[nats] manifest_bucket = \"{}\" is kept in stream {bucket_stream}, which is the name of another of Sluice's streams",
                n.manifest_bucket
            ),
        );
    }
}

/// What `check-config` says of `[nats] stream_compression = "s2"`: it cannot see the
/// server, and an older one refuses the setting (Sluice then does not start).
pub const STREAM_COMPRESSION_NEEDS_2_10: &str = "[nats] stream_compression = \"s2\" needs nats-server 2.10 or later: on an older one (Debian's 2.9.10) Sluice refuses to start and says so; set it to \"none\" there ([api] compression still compresses each message)";

/// `[nats] idempotency_bucket` and `idempotency_max_bytes`: a bucket name whose stream
/// is none of Sluice's others, and room for more than a handful of records.
fn idempotency_bucket(c: &mut Check, n: &NatsFile, section: &Key) {
    let k = |name: &str| section.key(name);
    if !is_nats_name(&n.idempotency_bucket) {
        c.problem(
            &[&k("idempotency_bucket")],
            format!(
                "[nats] idempotency_bucket = \"{}\" is not a valid key-value bucket name (letters, digits, _ and -)",
                n.idempotency_bucket
            ),
        );
    }
    let stream = format!("KV_{}", n.idempotency_bucket);
    if stream == n.stream || stream == n.dlq_stream || n.idempotency_bucket == n.manifest_bucket {
        c.problem(
            &[
                &k("idempotency_bucket"),
                &k("stream"),
                &k("dlq_stream"),
                &k("manifest_bucket"),
            ],
            format!(
                "[nats] idempotency_bucket = \"{}\" is kept in stream {stream}, which is the name of another of Sluice's streams",
                n.idempotency_bucket
            ),
        );
    }
    if n.idempotency_max_bytes.bytes() < MIN_IDEMPOTENCY_BYTES {
        c.problem(
            &[&k("idempotency_max_bytes")],
            format!(
                "[nats] idempotency_max_bytes = {}: must be at least 1MiB (a record takes about 300 bytes, up to 16KiB with refused rows listed)",
                n.idempotency_max_bytes
            ),
        );
    }
}

/// The one way of authenticating to NATS the section chooses.
fn nats_auth(c: &mut Check, file: &FileConfig, section: &Key) -> NatsAuth {
    let n = &file.nats;
    let k = |name: &str| section.key(name);
    let mut methods = 0;
    let mut auth = NatsAuth::None;
    if let Some(user) = &n.user {
        methods += 1;
        match c.secret(&k("password_env"), &n.password_env) {
            Some(password) => {
                auth = NatsAuth::UserPassword {
                    user: user.clone(),
                    password,
                }
            }
            None if n.password_env.is_none() => {
                c.problem(&[&k("user")], "[nats] user is set without password_env")
            }
            None => {}
        }
    } else if n.password_env.is_some() {
        c.problem(
            &[&k("password_env")],
            "[nats] password_env is set without user",
        );
    }
    if n.token_env.is_some() {
        methods += 1;
        if let Some(token) = c.secret(&k("token_env"), &n.token_env) {
            auth = NatsAuth::Token(token);
        }
    }
    if let Some(path) = &n.creds_file {
        methods += 1;
        let path = PathBuf::from(path);
        if !path.is_file() {
            c.problem(
                &[&k("creds_file")],
                format!("[nats] creds_file = \"{}\" does not exist", path.display()),
            );
        }
        auth = NatsAuth::CredsFile(path);
    }
    if methods > 1 {
        c.problem(
            &[&k("user"), &k("token_env"), &k("creds_file")],
            "[nats] choose one of user/password_env, token_env or creds_file",
        );
    }
    auth
}

/// The smallest manifest bucket budget taken.
const MIN_MANIFEST_BYTES: u64 = 1 << 20;
/// The smallest idempotency bucket budget taken.
const MIN_IDEMPOTENCY_BYTES: u64 = 1 << 20;
/// JetStream stream and consumer names: no whitespace, dots, wildcards or separators.
fn is_nats_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

fn is_subject_prefix(s: &str) -> bool {
    !s.is_empty()
        && s.split('.').all(|token| {
            !token.is_empty()
                && token
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        })
}
