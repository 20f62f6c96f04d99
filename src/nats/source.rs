//! The durable pull consumer as the actors' `Source`.
//!
//! Pulling is done here with the plain NATS client rather than async-nats's
//! `PullConsumer::stream()`: that stream wraps every message in a `jetstream::Message`
//! carrying its own clone of the JetStream `Context` (a client handle with a fresh
//! channel sender, a `String`, several atomics), made and dropped once per row. Measured
//! with sluice-bench, that was ~14% of Sluice's CPU per row. The protocol it replaces is
//! small: subscribe to an inbox, ask `$JS.API.CONSUMER.MSG.NEXT.<stream>.<consumer>`
//! for a batch (with an expiry and idle heartbeats), keep count of the rows asked for
//! and not yet delivered, ask again when half have come, and read the server's status
//! messages (heartbeat; request expired or ended, with the rows it leaves undelivered;
//! no responders). A pull that goes silent (no row, no heartbeat) or a reconnected
//! client is handled as async-nats does: ask again, or fail so the consumer actor
//! reconnects the source.
//!
//! A request asks for messages by the rows they bring (`super::held`): a message
//! carries one row or many, and what this instance holds is bounded in rows
//! (`[pipeline] max_held_rows`), not only in messages (`max_ack_pending`).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::{self, consumer};
use async_nats::{StatusCode, Subject};
use bytes::Bytes;
use futures::{FutureExt as _, StreamExt as _};
use sluice_actors::{Source, SourceError, SourceFactory};
use tokio::time::Instant;

use super::delivery::{DlqWriter, JsDelivery};
use super::held::{HeldRows, RowsPerMessage};
use super::manifest::JsManifestStore;
use super::setup::{ensure_consumer, ensure_streams, StreamSettings};
use super::stranded::remove_stranded;

/// The most buffered rows handed back when a source is dropped (the client buffers at
/// most a couple of pull batches).
const MAX_DRAINED: usize = 100_000;

/// How long one `pull` waits for a first row before answering with an empty batch.
const IDLE_WAIT: Duration = Duration::from_millis(500);
/// How long the server keeps a pull request waiting for rows.
const EXPIRES: Duration = Duration::from_secs(30);
/// How often the server says a waiting pull request is still alive.
const HEARTBEAT: Duration = Duration::from_secs(5);
/// JetStream's API subject prefix (Sluice uses no domain).
const API_PREFIX: &str = "$JS.API";
/// How long a connect (or a pull after a reconnect) waits for the manifest index to
/// catch up with the bucket before it fails (and the consumer tries again).
const CATCH_UP_WAIT: Duration = Duration::from_secs(15);

/// Opens the consumer, creating the streams and the consumer first when missing (NATS
/// may have come up after Sluice, or lost its store).
pub struct JetStreamSourceFactory {
    js: jetstream::Context,
    settings: StreamSettings,
    dlq: Arc<DlqWriter>,
    /// Rows asked of the server per pull request (as messages at the rows per message
    /// seen lately).
    pull_batch: usize,
    /// The rows held, pulled and not settled, and their bound (see `super::held`):
    /// the factory's, so rows a source left held when it was replaced (a reconnect)
    /// still count against the next.
    held: Arc<HeldRows>,
    expires: Duration,
    heartbeat: Duration,
    /// Exactly-once: no row is pulled before the manifest index holds every manifest
    /// in the bucket, or a redelivered row could be taken for a fresh one.
    manifests: Option<Arc<JsManifestStore>>,
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
            held: HeldRows::new(usize::MAX),
            expires: EXPIRES,
            heartbeat: HEARTBEAT,
            manifests: None,
        }
    }

    /// Hold at most this many rows pulled and not settled (`[pipeline] max_held_rows`);
    /// unbounded in rows otherwise (the consumer's `max_ack_pending` still bounds the
    /// messages).
    pub fn with_max_held_rows(mut self, rows: usize) -> Self {
        self.held = HeldRows::new(rows);
        self
    }

    /// Wait for this store's index before pulling (at connect, and after a reconnect).
    pub fn with_manifests(mut self, store: Option<Arc<JsManifestStore>>) -> Self {
        self.manifests = store;
        self
    }

    /// How long a pull request waits on the server, and how often the server says it
    /// still waits (30 s and 5 s; tests shorten them). Nothing heard for two
    /// heartbeats and a second: the request is lost and the source fails.
    pub fn with_pull_timing(mut self, expires: Duration, heartbeat: Duration) -> Self {
        self.expires = expires;
        self.heartbeat = heartbeat.min(expires / 2);
        self
    }
}

impl SourceFactory for JetStreamSourceFactory {
    type Source = JetStreamSource;

    async fn connect(&self) -> Result<JetStreamSource, SourceError> {
        super::stall::start();
        let fail = |e: anyhow::Error| SourceError(format!("{e:#}"));
        ensure_streams(&self.js, &self.settings)
            .await
            .map_err(fail)?;
        let consumer = ensure_consumer(&self.js, &self.settings)
            .await
            .map_err(fail)?;
        if let Some(store) = &self.manifests {
            wait_for_index(store).await?;
        }
        let client = self.js.client();
        let inbox = Subject::from(client.new_inbox());
        let subscriber = client.subscribe(inbox.clone()).await.map_err(|e| {
            SourceError(format!(
                "subscribing to pull from {}: {e}",
                self.settings.consumer
            ))
        })?;
        let batch = self.pull_batch.max(1);
        Ok(JetStreamSource {
            consumer,
            next_subject: Subject::from(format!(
                "{API_PREFIX}.CONSUMER.MSG.NEXT.{}.{}",
                self.settings.stream, self.settings.consumer
            )),
            expires_ns: u64::try_from(self.expires.as_nanos()).unwrap_or(u64::MAX),
            heartbeat_ns: u64::try_from(self.heartbeat.as_nanos()).unwrap_or(u64::MAX),
            held: self.held.clone(),
            rows_per_message: RowsPerMessage::default(),
            asked: 0,
            connects: client.statistics().connects.load(Ordering::Relaxed),
            client,
            subscriber,
            inbox,
            batch,
            pending: 0,
            heard_from: Instant::now(),
            sent: Instant::now(),
            silence: self.heartbeat * 2 + Duration::from_secs(1),
            failed: None,
            dlq: self.dlq.clone(),
            js: self.js.clone(),
            stream: self.settings.stream.clone(),
            manifests: self.manifests.clone(),
        })
    }
}

async fn wait_for_index(store: &JsManifestStore) -> Result<(), SourceError> {
    store.ready(CATCH_UP_WAIT).await.map_err(|e| {
        SourceError(format!(
            "not pulling before the manifest index is complete: {e}"
        ))
    })
}

/// A running pull subscription on the durable consumer.
pub struct JetStreamSource {
    consumer: consumer::PullConsumer,
    client: async_nats::Client,
    subscriber: async_nats::Subscriber,
    inbox: Subject,
    next_subject: Subject,
    /// A pull request's expiry and heartbeat, as the server takes them.
    expires_ns: u64,
    heartbeat_ns: u64,
    /// Rows per pull request (`pull_batch`).
    batch: usize,
    /// The rows held, and the rows per message seen lately: how many messages a
    /// request asks for.
    held: Arc<HeldRows>,
    rows_per_message: RowsPerMessage,
    /// Messages the last request asked for: the next one goes when half have come.
    asked: usize,
    /// Messages asked for and neither delivered yet nor given up by the server.
    pending: usize,
    /// The client's connection count when the last request went out.
    connects: u64,
    /// When the subscription last carried anything (a row or a status).
    heard_from: Instant,
    /// When the rows being taken were sent at the latest (see `super::stall`).
    sent: Instant,
    /// Nothing heard for this long while a request waits: it is lost.
    silence: Duration,
    /// A failure met while rows were in hand: reported by the next pull.
    failed: Option<SourceError>,
    dlq: Arc<DlqWriter>,
    js: jetstream::Context,
    /// The stream's name, to look for acked rows a crashed server left behind.
    stream: String,
    /// See [`JetStreamSourceFactory::with_manifests`].
    manifests: Option<Arc<JsManifestStore>>,
}

impl JetStreamSource {
    /// Ask for another batch when half of what was asked for has come.
    async fn request_more(&mut self) -> Result<(), SourceError> {
        let connects = self.client.statistics().connects.load(Ordering::Relaxed);
        if connects != self.connects {
            // Reconnected: requests waiting on the server may have gone with the old
            // connection. Ask again (a request that survived only brings rows sooner),
            // once the manifest index has caught up with what changed meanwhile.
            if let Some(store) = &self.manifests {
                wait_for_index(store).await?;
            }
            self.connects = connects;
            self.pending = 0;
        }
        if self.pending > 0 && self.pending > self.asked / 2 {
            return Ok(());
        }
        let messages = match self.rows_per_message.get() {
            // No message seen yet: one, to learn what they carry.
            None => usize::from(self.pending == 0),
            Some(per_message) => {
                let most = ((self.batch as f64 / per_message).ceil() as usize).max(1);
                self.held.messages_to_ask(self.pending, per_message, most)
            }
        };
        if messages == 0 {
            // Held rows fill the bound: ask once some are settled (the next pull).
            return Ok(());
        }
        let request = format!(
            r#"{{"batch":{messages},"expires":{},"idle_heartbeat":{}}}"#,
            self.expires_ns, self.heartbeat_ns
        );
        self.client
            .publish_with_reply(
                self.next_subject.clone(),
                self.inbox.clone(),
                Bytes::from(request),
            )
            .await
            .map_err(|e| SourceError(format!("asking for rows: {e}")))?;
        self.pending += messages;
        self.asked = messages;
        Ok(())
    }

    /// Waits (at most `IDLE_WAIT`) for the subscription's next message, asking for rows
    /// first; while the held rows leave no room to ask, for the drop that makes some.
    /// `None`: nothing came in time; `Some(None)`: the subscription ended.
    async fn first_message(&mut self) -> Result<Option<Option<async_nats::Message>>, SourceError> {
        let deadline = Instant::now() + IDLE_WAIT;
        loop {
            self.request_more().await?;
            let waiting_for_room = self.pending == 0;
            let per_message = self.rows_per_message.get().unwrap_or(1.0);
            tokio::select! {
                message = self.subscriber.next() => return Ok(Some(message)),
                () = self.held.room_for(per_message), if waiting_for_room => {}
                () = tokio::time::sleep_until(deadline) => return Ok(None),
            }
        }
    }

    /// One message of the subscription: a row, or a status that changes the count.
    fn take(
        &mut self,
        message: async_nats::Message,
        batch: &mut Vec<JsDelivery>,
    ) -> Result<(), SourceError> {
        match message.status {
            None | Some(StatusCode::OK) => {
                self.pending = self.pending.saturating_sub(1);
                let rows = sluice_actors::batch::row_count(&message.payload);
                self.rows_per_message.saw(rows);
                let token = self.held.hold(rows);
                batch
                    .push(JsDelivery::sent_by(message, self.dlq.clone(), self.sent).holding(token));
                Ok(())
            }
            Some(StatusCode::IDLE_HEARTBEAT) => Ok(()),
            Some(status @ (StatusCode::TIMEOUT | StatusCode::REQUEST_TERMINATED)) => {
                let why = message.description.as_deref().unwrap_or("");
                if why == "Consumer Deleted"
                    || why == "Consumer is push based"
                    || why.starts_with("Exceeded MaxRequest")
                {
                    return Err(SourceError(format!("the pull was refused: {status} {why}")));
                }
                // Expired or ended (leadership change, max waiting...): the rows it
                // leaves undelivered are no longer coming.
                let left = message
                    .headers
                    .as_ref()
                    .and_then(|h| h.get("Nats-Pending-Messages"))
                    .and_then(|v| v.as_str().parse::<usize>().ok())
                    .unwrap_or(self.asked);
                self.pending = self.pending.saturating_sub(left);
                Ok(())
            }
            Some(StatusCode::NO_RESPONDERS) => Err(SourceError(
                "JetStream did not answer the pull request (no responders)".into(),
            )),
            Some(status) => Err(SourceError(format!(
                "the pull answered {status} {}",
                message.description.as_deref().unwrap_or("")
            ))),
        }
    }
}

impl Source for JetStreamSource {
    type Delivery = JsDelivery;

    async fn pull(&mut self, max: usize) -> Result<Vec<JsDelivery>, SourceError> {
        if let Some(e) = self.failed.take() {
            return Err(e);
        }
        let mut batch = Vec::new();
        let first = match self.first_message().await? {
            None => {
                if self.pending == 0 {
                    // Nothing asked for (the held rows fill the bound): nothing to hear.
                    self.heard_from = Instant::now();
                } else if self.heard_from.elapsed() > self.silence {
                    return Err(SourceError(format!(
                        "no row and no heartbeat for {:?}: the pull request is lost",
                        self.silence
                    )));
                }
                return Ok(batch);
            }
            Some(None) => return Err(SourceError("the pull subscription ended".into())),
            Some(Some(message)) => message,
        };
        self.heard_from = Instant::now();
        // One stamp for the batch: the rows came in the same moment.
        self.sent = super::stall::sent_no_later_than(self.heard_from.into_std()).into();
        batch.reserve(max.min(1024));
        self.take(first, &mut batch)?;
        // Take what has already arrived, without waiting for more.
        while batch.len() < max {
            match self.subscriber.next().now_or_never() {
                Some(Some(message)) => {
                    if let Err(e) = self.take(message, &mut batch) {
                        self.failed = Some(e);
                        break;
                    }
                    if self.pending <= self.asked / 2 {
                        if let Err(e) = self.request_more().await {
                            self.failed = Some(e);
                            break;
                        }
                    }
                }
                Some(None) => {
                    self.failed = Some(SourceError("the pull subscription ended".into()));
                    break;
                }
                None => break,
            }
        }
        if batch.is_empty() {
            if let Some(e) = self.failed.take() {
                return Err(e);
            }
        }
        Ok(batch)
    }

    async fn pending(&mut self) -> Option<u64> {
        let info = self.consumer.info().await.ok()?.clone();
        if let Ok(stream) = self.js.get_stream(&self.stream).await {
            remove_stranded(&stream, &info).await;
        }
        Some(info.num_pending)
    }
}

impl Drop for JetStreamSource {
    /// Rows the client already took from the server but nobody pulled yet (a stop, a
    /// reconnect) are handed back now, rather than after `ack_wait`: each becomes a
    /// delivery whose drop naks it.
    fn drop(&mut self) {
        for _ in 0..MAX_DRAINED {
            match self.subscriber.next().now_or_never() {
                Some(Some(message)) if matches!(message.status, None | Some(StatusCode::OK)) => {
                    drop(JsDelivery::new(message, self.dlq.clone()))
                }
                Some(Some(_status)) => continue,
                _ => break,
            }
        }
    }
}
