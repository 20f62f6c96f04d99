//! The durable pull consumer as the actors' `Source`.

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::{self, consumer};
use futures::{FutureExt as _, StreamExt as _};
use sluice_actors::{Source, SourceError, SourceFactory};

use super::delivery::{DlqWriter, JsDelivery};
use super::setup::{ensure_consumer, ensure_streams, purge_stranded, StreamSettings};

/// The most buffered rows handed back when a source is dropped (the client buffers at
/// most a couple of pull batches).
const MAX_DRAINED: usize = 100_000;

/// How long one `pull` waits for a first row before answering with an empty batch.
const IDLE_WAIT: Duration = Duration::from_millis(500);

/// Opens the consumer, creating the streams and the consumer first when missing (NATS
/// may have come up after Sluice, or lost its store).
pub struct JetStreamSourceFactory {
    js: jetstream::Context,
    settings: StreamSettings,
    dlq: Arc<DlqWriter>,
    /// Rows asked of the server per pull request.
    pull_batch: usize,
}

impl JetStreamSourceFactory {
    pub fn new(
        js: jetstream::Context,
        settings: StreamSettings,
        dlq: Arc<DlqWriter>,
        pull_batch: usize,
    ) -> Self {
        Self {
            js,
            settings,
            dlq,
            pull_batch,
        }
    }
}

impl SourceFactory for JetStreamSourceFactory {
    type Source = JetStreamSource;

    async fn connect(&self) -> Result<JetStreamSource, SourceError> {
        let fail = |e: anyhow::Error| SourceError(format!("{e:#}"));
        ensure_streams(&self.js, &self.settings)
            .await
            .map_err(fail)?;
        let consumer = ensure_consumer(&self.js, &self.settings)
            .await
            .map_err(fail)?;
        let messages = consumer
            .stream()
            .max_messages_per_batch(self.pull_batch)
            .heartbeat(Duration::from_secs(5))
            .expires(Duration::from_secs(30))
            .messages()
            .await
            .map_err(|e| {
                SourceError(format!(
                    "starting to pull from {}: {e}",
                    self.settings.consumer
                ))
            })?;
        Ok(JetStreamSource {
            consumer,
            messages,
            dlq: self.dlq.clone(),
            js: self.js.clone(),
            stream: self.settings.stream.clone(),
        })
    }
}

/// A running pull subscription on the durable consumer.
pub struct JetStreamSource {
    consumer: consumer::PullConsumer,
    messages: consumer::pull::Stream,
    dlq: Arc<DlqWriter>,
    js: jetstream::Context,
    /// The stream's name, to look for acked rows a crashed server left behind.
    stream: String,
}

impl Source for JetStreamSource {
    type Delivery = JsDelivery;

    async fn pull(&mut self, max: usize) -> Result<Vec<JsDelivery>, SourceError> {
        let mut batch = Vec::new();
        match tokio::time::timeout(IDLE_WAIT, self.messages.next()).await {
            Err(_) => return Ok(batch),
            Ok(None) => return Err(SourceError("the consumer's message stream ended".into())),
            Ok(Some(Err(e))) => return Err(SourceError(format!("pulling: {e}"))),
            Ok(Some(Ok(message))) => {
                batch.reserve(max.min(1024));
                batch.push(JsDelivery::new(message, self.dlq.clone()));
            }
        }
        // Take what has already arrived, without waiting for more.
        while batch.len() < max {
            match self.messages.next().now_or_never() {
                Some(Some(Ok(message))) => batch.push(JsDelivery::new(message, self.dlq.clone())),
                Some(Some(Err(e))) => {
                    tracing::warn!(error = %e, "pull stream reported an error; continuing with the rows in hand");
                    break;
                }
                Some(None) | None => break,
            }
        }
        Ok(batch)
    }

    async fn pending(&mut self) -> Option<u64> {
        let info = self.consumer.info().await.ok()?;
        let (pending, floor) = (info.num_pending, info.ack_floor.stream_sequence);
        if let Ok(stream) = self.js.get_stream(&self.stream).await {
            let first = stream.cached_info().state.first_sequence;
            purge_stranded(&stream, first, floor).await;
        }
        Some(pending)
    }
}

impl Drop for JetStreamSource {
    /// Rows the client already took from the server but nobody pulled yet (a stop, a
    /// reconnect) are handed back now, rather than after `ack_wait`: each becomes a
    /// delivery whose drop naks it.
    fn drop(&mut self) {
        for _ in 0..MAX_DRAINED {
            match self.messages.next().now_or_never() {
                Some(Some(Ok(message))) => drop(JsDelivery::new(message, self.dlq.clone())),
                _ => break,
            }
        }
    }
}
