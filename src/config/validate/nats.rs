//! `[nats]`: names, prefixes, budgets and the one way of authenticating.

use std::path::PathBuf;

use super::{Check, Key};
use crate::config::file::{FileConfig, NatsFile};
use crate::config::nats_url::{self, hide_credentials};
use crate::config::units::Size;
use crate::config::{NatsAuth, NatsConfig, StreamCompression, StreamSettings};

pub(super) fn nats(c: &mut Check, file: &FileConfig) -> NatsConfig {
    let n = &file.nats;
    let section = Key::table(["nats"]);
    let k = |name: &str| section.key(name);
    let seeds = seeds(c, n, &section);
    names(c, n, &section);
    idempotency_bucket(c, n, &section);
    let why = "one manifest of a 10,000-row batch takes about 10KiB";
    c.at_least_for(
        &k("manifest_max_bytes"),
        n.manifest_max_bytes,
        MIN_MANIFEST_BYTES,
        why,
    );
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
    c.one_to(&k("replicas"), n.replicas, 5, "");
    let why = "each is a stream with its own consumer and leader";
    c.one_to(&k("partitions"), n.partitions, MAX_PARTITIONS, why);
    let auth = nats_auth(c, file, &section);
    if n.stream_compression == StreamCompression::S2 {
        c.warn(STREAM_COMPRESSION_NEEDS_2_10);
    }
    let streams = StreamSettings {
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
        replicas: n.replicas,
        stream_compression: n.stream_compression,
        partitions: n.partitions,
    };
    NatsConfig {
        seeds,
        streams,
        auth,
        manifest_bucket: n.manifest_bucket.clone(),
        manifest_max_bytes: n.manifest_max_bytes.bytes(),
        idempotency_bucket: n.idempotency_bucket.clone(),
        idempotency_max_bytes: n.idempotency_max_bytes.bytes(),
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

/// What a name must be, and how a problem says it.
struct NameRule {
    valid: fn(&str) -> bool,
    what: &'static str,
}

const JETSTREAM_NAME: NameRule = NameRule {
    valid: is_nats_name,
    what: "a valid JetStream name (letters, digits, _ and -)",
};

const SUBJECT_PREFIX: NameRule = NameRule {
    valid: is_subject_prefix,
    what: "a subject prefix like \"ingest\" (tokens of letters, digits, _ and -, separated by dots; no wildcards)",
};

/// The streams', consumer's, prefixes' and bucket's names: valid, and apart.
fn names(c: &mut Check, n: &NatsFile, section: &Key) {
    let k = |name: &str| section.key(name);
    let each = [
        ("stream", &n.stream, &JETSTREAM_NAME),
        ("consumer", &n.consumer, &JETSTREAM_NAME),
        ("dlq_stream", &n.dlq_stream, &JETSTREAM_NAME),
        ("subject_prefix", &n.subject_prefix, &SUBJECT_PREFIX),
        ("dlq_subject_prefix", &n.dlq_subject_prefix, &SUBJECT_PREFIX),
    ];
    for (name, value, rule) in each {
        if !(rule.valid)(value) {
            let key = k(name);
            c.problem(&[&key], format!("{key} = \"{value}\" is not {}", rule.what));
        }
    }
    if n.stream == n.dlq_stream {
        c.problem(
            &[&k("stream"), &k("dlq_stream")],
            "[nats] stream and dlq_stream must differ",
        );
    }
    let streams = [
        ("stream", n.stream.clone()),
        ("dlq_stream", n.dlq_stream.clone()),
    ];
    bucket_name(c, section, "manifest_bucket", &n.manifest_bucket, &streams);
}

/// `[nats] <name> = "<bucket>"`: a key-value bucket's name, valid, and whose stream
/// (`KV_<bucket>`) is none of `others` (the keys naming Sluice's other streams, with
/// the streams they name).
fn bucket_name(c: &mut Check, section: &Key, name: &str, bucket: &str, others: &[(&str, String)]) {
    let keys: Vec<Key> = std::iter::once(name)
        .chain(others.iter().map(|(key, _)| *key))
        .map(|key| section.key(key))
        .collect();
    if !is_nats_name(bucket) {
        c.problem(
            &[&keys[0]],
            format!("[nats] {name} = \"{bucket}\" is not a valid key-value bucket name (letters, digits, _ and -)"),
        );
    }
    let stream = format!("KV_{bucket}");
    if others.iter().any(|(_, other)| *other == stream) {
        c.problem(
            &keys.iter().collect::<Vec<_>>(),
            format!("[nats] {name} = \"{bucket}\" is kept in stream {stream}, which is the name of another of Sluice's streams"),
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
    let others = [
        ("stream", n.stream.clone()),
        ("dlq_stream", n.dlq_stream.clone()),
        ("manifest_bucket", format!("KV_{}", n.manifest_bucket)),
    ];
    bucket_name(
        c,
        section,
        "idempotency_bucket",
        &n.idempotency_bucket,
        &others,
    );
    let why = "a record takes about 300 bytes, up to 16KiB with refused rows listed";
    c.at_least_for(
        &k("idempotency_max_bytes"),
        n.idempotency_max_bytes,
        MIN_IDEMPOTENCY_BYTES,
        why,
    );
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
const MIN_MANIFEST_BYTES: Size = Size(1 << 20);
/// The smallest idempotency bucket budget taken.
const MIN_IDEMPOTENCY_BYTES: Size = Size(1 << 20);
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
