//! Streams of the layout before (`[nats] partitions` changed): sealed, drained into
//! the current partitions, then removed. Nothing lost, nothing stored twice:
//!
//! 1. **Sealed**: the stream's subjects become `<subject_prefix>_retired.<stream>`, which
//!    no one publishes on, so nothing new lands in it (a publisher still on its old
//!    subjects without the server's mapping gets "no responders": an error it retries,
//!    never a row lost). Only then can "empty" mean empty for good.
//! 2. **Drained**: each message is published again on the current layout (its partition
//!    by its message id, as the API picks it), with its headers and message id (its own,
//!    or `<stream>.<sequence>`), and acked on the old stream only once the new one has
//!    stored it. A copy sent again after a crash between the two is stored once by the
//!    new stream's duplicate window (`[nats] duplicate_window`).
//! 3. **Removed**, once it holds no message (a work queue keeps a message until it is
//!    acked, so one still being moved counts).
//!
//! Every instance runs this; they share each old stream's durable consumer, so each
//! message is moved by one of them. The rows take no other way into ClickHouse than the
//! current partitions' consumers.

use std::time::Duration;

use anyhow::Context as _;
use async_nats::jetstream::{self, consumer, AckKind};
use futures::StreamExt as _;

use super::IngestStreams;
use crate::config::StreamSettings;
use crate::nats::publish::PublishError;

/// How often the streams are listed for old ones.
const EVERY: Duration = Duration::from_secs(5);
/// Messages moved per fetch.
const BATCH: usize = 256;

/// Retire the streams of another layout, for as long as the process runs.
pub async fn keep_retiring(js: jetstream::Context, settings: StreamSettings, to: IngestStreams) {
    let mut logged_idle = false;
    loop {
        match retire_once(&js, &settings, &to).await {
            Ok(0) => logged_idle = true,
            Ok(_) => logged_idle = false,
            Err(e) => {
                if !logged_idle {
                    tracing::warn!(error = %format!("{e:#}"), "retiring the streams of an earlier [nats] partitions");
                }
            }
        }
        tokio::time::sleep(EVERY).await;
    }
}

/// One pass: every old stream sealed and drained as far as it goes, removed when empty.
/// Returns how many old streams there were.
pub async fn retire_once(
    js: &jetstream::Context,
    settings: &StreamSettings,
    to: &IngestStreams,
) -> anyhow::Result<usize> {
    let old = retired_streams(js, settings).await?;
    for name in &old {
        retire(js, settings, to, name)
            .await
            .with_context(|| format!("stream {name}"))?;
    }
    Ok(old.len())
}

/// The ingest streams of another layout that exist: `<stream>` when partitioned now,
/// `<stream>_<n>` past the current count (or any, when not partitioned now).
async fn retired_streams(
    js: &jetstream::Context,
    settings: &StreamSettings,
) -> anyhow::Result<Vec<String>> {
    let current: Vec<String> = settings
        .each_partition()
        .into_iter()
        .map(|p| p.stream)
        .collect();
    let mut names = js.stream_names();
    let mut old = Vec::new();
    while let Some(name) = names.next().await {
        let name = name.context("listing the streams")?;
        if is_ingest_stream(&settings.stream, &name) && !current.contains(&name) {
            old.push(name);
        }
    }
    Ok(old)
}

/// `<stream>` or `<stream>_<n>`.
fn is_ingest_stream(stream: &str, name: &str) -> bool {
    name == stream
        || name
            .strip_prefix(stream)
            .and_then(|rest| rest.strip_prefix('_'))
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// The one subject a sealed stream keeps (a stream needs one): no one publishes on it.
fn sealed_subject(settings: &StreamSettings, name: &str) -> String {
    format!("{}_retired.{name}", settings.subject_prefix)
}

async fn retire(
    js: &jetstream::Context,
    settings: &StreamSettings,
    to: &IngestStreams,
    name: &str,
) -> anyhow::Result<()> {
    let mut stream = js.get_stream(name).await.context("looking it up")?;
    let info = stream.info().await.context("reading it")?.clone();
    let sealed = vec![sealed_subject(settings, name)];
    if info.config.subjects != sealed {
        let mut config = info.config.clone();
        config.subjects = sealed;
        js.update_stream(config).await.context("sealing it")?;
        tracing::info!(stream = %name, messages = info.state.messages,
            "an ingest stream of an earlier [nats] partitions: sealed, its rows move to the current partitions");
    }
    if info.state.messages > 0 {
        drain(js, settings, to, name).await?;
    }
    let left = js
        .get_stream(name)
        .await
        .context("looking it up")?
        .info()
        .await
        .context("reading it")?
        .state
        .messages;
    if left == 0 {
        js.delete_stream(name).await.context("removing it")?;
        tracing::info!(stream = %name, "an ingest stream of an earlier [nats] partitions: drained and removed");
    }
    Ok(())
}

/// Move what the stream holds, a batch at a time, until a fetch brings nothing.
async fn drain(
    js: &jetstream::Context,
    settings: &StreamSettings,
    to: &IngestStreams,
    name: &str,
) -> anyhow::Result<()> {
    let stream = js.get_stream(name).await.context("looking it up")?;
    let consumer: consumer::PullConsumer = stream
        .get_or_create_consumer(
            &settings.consumer,
            consumer::pull::Config {
                durable_name: Some(settings.consumer.clone()),
                ack_policy: consumer::AckPolicy::Explicit,
                ack_wait: settings.ack_wait,
                max_deliver: -1,
                ..Default::default()
            },
        )
        .await
        .map_err(|e| anyhow::anyhow!("opening its consumer {}: {e}", settings.consumer))?;
    // Bounded: each round moves what one fetch brings; the stream is sealed.
    loop {
        let mut batch = consumer
            .fetch()
            .max_messages(BATCH)
            .expires(Duration::from_secs(1))
            .messages()
            .await
            .map_err(|e| anyhow::anyhow!("fetching: {e}"))?;
        let mut moved = 0usize;
        while let Some(message) = batch.next().await {
            let message = message.map_err(|e| anyhow::anyhow!("fetching: {e}"))?;
            move_one(to, name, &message).await?;
            moved += 1;
        }
        if moved == 0 {
            return Ok(());
        }
        tracing::debug!(stream = %name, moved, "moved to the current partitions");
    }
}

/// Publish one message on the current layout and wait for it to be stored, then ack
/// it on the old stream. A full partition hands it back (to be moved later).
async fn move_one(
    to: &IngestStreams,
    name: &str,
    message: &jetstream::Message,
) -> anyhow::Result<()> {
    let sequence = message
        .info()
        .map(|i| i.stream_sequence)
        .unwrap_or_default();
    let mut headers = message.headers.clone().unwrap_or_default();
    let id = match headers.get(async_nats::header::NATS_MESSAGE_ID) {
        Some(id) => id.as_str().to_owned(),
        None => format!("{name}.{sequence}"),
    };
    // `Publisher::send` sets it again.
    headers.insert(async_nats::header::NATS_MESSAGE_ID, id.as_str());
    let subject = message.subject.as_str();
    let (publisher, target) = match to.reroute(subject, Some(&id)) {
        Some(found) => found,
        // Not a subject of the queue (parked as such by the consumer that takes it).
        None => {
            let (publisher, prefix) = to.pick(Some(&id));
            (publisher, format!("{prefix}.{subject}"))
        }
    };
    let published = publisher
        .publish(target, message.payload.clone(), Some(headers), Some(&id))
        .await;
    match published {
        Ok(_) => message
            .double_ack()
            .await
            .map_err(|e| anyhow::anyhow!("acking message {sequence} once moved: {e}")),
        Err(e) => {
            let _ = message
                .ack_with(AckKind::Nak(Some(Duration::from_secs(5))))
                .await;
            Err(moving_failed(e, sequence))
        }
    }
}

fn moving_failed(e: PublishError, sequence: u64) -> anyhow::Error {
    anyhow::anyhow!("moving message {sequence}: {e}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_queues_own_streams_are_taken_for_old_ones() {
        for yes in ["INGEST", "INGEST_0", "INGEST_12"] {
            assert!(is_ingest_stream("INGEST", yes), "{yes}");
        }
        for no in [
            "INGEST_",
            "INGEST_x",
            "INGEST_1_2",
            "INGESTX",
            "DLQ",
            "KV_INGEST",
        ] {
            assert!(!is_ingest_stream("INGEST", no), "{no}");
        }
    }
}
