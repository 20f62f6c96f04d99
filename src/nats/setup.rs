//! Create or update the streams and the durable consumer, idempotently: every Sluice
//! instance runs this at start, so running it twice must be harmless.

use std::time::Duration;

use anyhow::{bail, Context as _};
use async_nats::jetstream::{self, consumer, stream};

use super::version;
use super::workarounds::budget::{discard_new_is_exact, server_max_bytes};
use super::workarounds::stranded::remove_stranded;
use crate::config::{StreamCompression, StreamSettings};

/// The INGEST stream (or each partition's: `super::partitions`): a work queue (an acked
/// row leaves it, so `max_bytes` bounds the backlog, not the history) that refuses new
/// publishes when full (the ingest API then answers 503; nothing already accepted is
/// dropped). And the DLQ: limits retention, also discard-new, so a full DLQ makes
/// parking fail instead of deleting parked rows.
pub async fn ensure_streams(js: &jetstream::Context, s: &StreamSettings) -> anyhow::Result<()> {
    let version = js.client().server_info().version;
    let exact = discard_new_is_exact(&version);
    let compression = stream_compression(s.stream_compression == StreamCompression::S2, &version)?;
    for p in s.each_partition() {
        let ingest = stream::Config {
            name: p.stream.clone(),
            description: Some("Sluice ingest queue: rows waiting for ClickHouse".into()),
            subjects: vec![format!("{}.>", p.subject_prefix)],
            retention: stream::RetentionPolicy::WorkQueue,
            discard: stream::DiscardPolicy::New,
            storage: stream::StorageType::File,
            max_bytes: bytes_i64(server_max_bytes(p.max_bytes, exact)),
            duplicate_window: p.duplicate_window,
            num_replicas: p.replicas,
            compression: compression.clone(),
            ..Default::default()
        };
        create_or_update(js, ingest).await?;
    }
    let dlq = stream::Config {
        name: s.dlq_stream.clone(),
        description: Some("Sluice dead letters: rows ClickHouse rejected, with the reason".into()),
        subjects: vec![format!("{}.>", s.dlq_subject_prefix)],
        retention: stream::RetentionPolicy::Limits,
        discard: stream::DiscardPolicy::New,
        storage: stream::StorageType::File,
        max_bytes: bytes_i64(server_max_bytes(s.dlq_max_bytes, exact)),
        // A row parked twice (the ack after a park lost) is parked once.
        duplicate_window: Duration::from_secs(120),
        // The admin endpoint peeks parked rows with direct gets: nothing is consumed.
        allow_direct: true,
        num_replicas: s.replicas,
        compression,
        ..Default::default()
    };
    create_or_update(js, dlq).await?;
    Ok(())
}

/// The durable pull consumer every Sluice instance shares (on the stream `s` names: a
/// partition's settings for a partitioned queue): explicit acks, unlimited
/// deliveries (the DLQ is the only way out), `max_ack_pending` bounding what the
/// instances hold in memory, `[nats] replicas` copies.
pub async fn ensure_consumer(
    js: &jetstream::Context,
    s: &StreamSettings,
) -> anyhow::Result<consumer::PullConsumer> {
    let config = consumer::pull::Config {
        durable_name: Some(s.consumer.clone()),
        description: Some("Sluice: rows to insert into ClickHouse".into()),
        ack_policy: consumer::AckPolicy::Explicit,
        ack_wait: s.ack_wait,
        max_ack_pending: s.max_ack_pending,
        max_deliver: -1,
        deliver_policy: consumer::DeliverPolicy::All,
        // As many copies as the stream: its state (what is acked, what is pending)
        // survives a node like the rows do. Set, not inherited: a stream raised to
        // more replicas later does not raise its consumers on every server version.
        num_replicas: s.replicas,
        ..Default::default()
    };
    let stream = js
        .get_stream(&s.stream)
        .await
        .with_context(|| format!("looking up stream {}", s.stream))?;
    // Create-or-update: the same config again is a no-op; a changed ack_wait or
    // max_ack_pending is applied to the existing durable.
    let mut consumer = stream.create_consumer(config).await.map_err(|e| {
        anyhow::anyhow!(
            "creating or updating consumer {} on stream {}: {e}",
            s.consumer,
            s.stream
        )
    })?;
    if let Ok(info) = consumer.info().await {
        remove_stranded(&stream, info, None).await;
    }
    Ok(consumer)
}

/// Create the stream, or bring an existing one to `config` (a no-op when nothing that
/// Sluice sets differs). A retention that differs is refused: it cannot change. A
/// stream with fewer (or more) replicas than `[nats] replicas` is updated: JetStream
/// copies it to the new peers (or drops the extra ones) while it keeps serving; when
/// it cannot (more replicas than the cluster has JetStream servers, a single server),
/// the error says so.
pub(super) async fn create_or_update(
    js: &jetstream::Context,
    config: stream::Config,
) -> anyhow::Result<()> {
    let name = config.name.clone();
    let replicas = config.num_replicas;
    match js.get_stream(&name).await {
        Ok(mut existing) => {
            let info = existing
                .info()
                .await
                .with_context(|| format!("reading stream {name}"))?;
            let current = &info.config;
            if current.retention != config.retention {
                bail!(
                    "stream {name} exists with retention {:?}, Sluice needs {:?}; a stream's retention cannot change: delete or rename it",
                    current.retention,
                    config.retention
                );
            }
            let had = current.num_replicas;
            let same = had == replicas
                && current.subjects == config.subjects
                && current.discard == config.discard
                && current.max_bytes == config.max_bytes
                && current.duplicate_window == config.duplicate_window
                && current.storage == config.storage
                && current.allow_direct == config.allow_direct
                && current.max_age == config.max_age
                && unlimited_as_zero(current.max_messages_per_subject)
                    == unlimited_as_zero(config.max_messages_per_subject)
                && current.allow_rollup == config.allow_rollup
                && compressed(current.compression.as_ref())
                    == compressed(config.compression.as_ref())
                && current.deny_delete == config.deny_delete;
            if !same {
                js.update_stream(config).await.map_err(|e| {
                    if had == replicas {
                        anyhow::anyhow!("updating stream {name}: {e}")
                    } else {
                        anyhow::anyhow!(
                            "stream {name} has {had} replica(s) and [nats] replicas = {replicas}: changing it failed: {e}{}",
                            replicas_hint(replicas)
                        )
                    }
                })?;
                if had != replicas {
                    tracing::info!(stream = %name, from = had, to = replicas,
                        "the stream's replicas changed to [nats] replicas");
                }
            }
            Ok(())
        }
        Err(_) => {
            js.create_stream(config).await.map_err(|e| {
                anyhow::anyhow!(
                    "creating stream {name} with {replicas} replica(s): {e}{}",
                    replicas_hint(replicas)
                )
            })?;
            Ok(())
        }
    }
}

/// Why `[nats] replicas` can never be had from the server `info` describes: above 1
/// against a single server (one that is not part of a cluster), which no wait changes.
/// `None` when the server may give them (a cluster with too few servers up is waited
/// for: its streams are made once they are).
fn replicas_beyond(info: &async_nats::ServerInfo, replicas: usize) -> Option<String> {
    let single = info.cluster.as_deref().is_none_or(str::is_empty);
    (replicas > 1 && single).then(|| {
        format!(
            "[nats] replicas = {replicas}, but nats-server {} at {}:{} is a single server, not part of a JetStream cluster: it keeps one copy of a stream, so set [nats] replicas = 1, or point [nats] url at a cluster of at least {replicas} servers",
            info.version, info.host, info.port
        )
    })
}

/// The INFO of the server the client is connected to, once the client holds it (it
/// reports itself connected a moment before it stores the INFO).
async fn server_info(client: &async_nats::Client) -> async_nats::ServerInfo {
    // Bounded by the process: it ends once connected, or is dropped with the run.
    loop {
        let info = client.server_info();
        if !info.server_id.is_empty() {
            return info;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// [`replicas_beyond`] of the server `client` is connected to (waiting for its INFO
/// for up to `wait`; `None` when it did not come).
pub async fn replicas_beyond_server(
    client: &async_nats::Client,
    replicas: usize,
    wait: Duration,
) -> Option<String> {
    let info = tokio::time::timeout(wait, server_info(client)).await.ok()?;
    replicas_beyond(&info, replicas)
}

/// [`replicas_beyond`]'s reason, once the client is connected (for a start that did
/// not reach NATS); never, when the server may give the replicas.
pub async fn replicas_refused_once_connected(
    client: async_nats::Client,
    replicas: usize,
) -> String {
    match replicas_beyond(&server_info(&client).await, replicas) {
        Some(why) => why,
        None => std::future::pending().await,
    }
}

/// The streams' `compression` for `[nats] stream_compression` on a server of `version`:
/// S2, or none said outright where the server has the setting (so turning it off
/// applies), or nothing at all for a server before 2.10, which knows no such field.
fn stream_compression(s2: bool, version: &str) -> anyhow::Result<Option<stream::Compression>> {
    let has_it = version::parse(version) >= version::STREAM_COMPRESSION;
    match (s2, has_it) {
        (true, true) => Ok(Some(stream::Compression::S2)),
        (true, false) => bail!(
            "[nats] stream_compression = \"s2\": nats-server {version} cannot compress a stream (2.10 and later can); set it to \"none\" ([api] compression still compresses each message), or upgrade the server"
        ),
        (false, true) => Ok(Some(stream::Compression::None)),
        (false, false) => Ok(None),
    }
}

fn compressed(c: Option<&stream::Compression>) -> bool {
    matches!(c, Some(stream::Compression::S2))
}

/// What to check when a stream with `replicas` copies cannot be made.
fn replicas_hint(replicas: usize) -> &'static str {
    if replicas > 1 {
        " ([nats] replicas above 1 needs a JetStream cluster with at least that many servers up; a single server takes 1)"
    } else {
        ""
    }
}

/// The server answers -1 for a limit left unset (0).
fn unlimited_as_zero(limit: i64) -> i64 {
    limit.max(0)
}

pub(super) fn bytes_i64(bytes: u64) -> i64 {
    i64::try_from(bytes).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod replicas_tests {
    use super::*;

    fn info(cluster: Option<&str>) -> async_nats::ServerInfo {
        async_nats::ServerInfo {
            server_id: "N1".into(),
            cluster: cluster.map(String::from),
            ..Default::default()
        }
    }

    #[test]
    fn only_a_single_server_refuses_more_than_one_replica() {
        assert!(replicas_beyond(&info(None), 3).is_some_and(|w| w.contains("[nats] replicas = 3")));
        assert!(replicas_beyond(&info(Some("")), 2).is_some());
        assert_eq!(replicas_beyond(&info(None), 1), None);
        assert_eq!(replicas_beyond(&info(Some("sluice")), 3), None);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn s2_is_refused_by_name_on_a_server_before_2_10() {
        let e = stream_compression(true, "2.9.10").expect_err("2.9.10 has no s2");
        assert!(
            e.to_string()
                .contains("nats-server 2.9.10 cannot compress a stream"),
            "{e}"
        );
        assert_eq!(
            stream_compression(true, "2.15.1").expect("s2"),
            Some(stream::Compression::S2)
        );
        // Off: said outright where the server knows the field, absent where it does not.
        assert_eq!(
            stream_compression(false, "2.10.0").expect("none"),
            Some(stream::Compression::None)
        );
        assert_eq!(stream_compression(false, "2.9.10").expect("absent"), None);
    }
}
