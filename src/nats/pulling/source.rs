//! The durable pull consumer as the actors' `Source`.
//!
//! Pulling is done here with the plain NATS client rather than async-nats's
//! `PullConsumer::stream()`: that stream wraps every message in a `jetstream::Message`
//! carrying its own clone of the JetStream `Context` (a client handle with a fresh
//! channel sender, a `String`, several atomics), made and dropped once per row. Measured
//! with sluice-bench, that was ~14% of Sluice's CPU per row. The protocol it replaces is
//! small (NATS ADR-37): subscribe to an inbox, ask
//! `$JS.API.CONSUMER.MSG.NEXT.<stream>.<consumer>` for a batch (with an expiry and idle
//! heartbeats at most half of it), keep count of the rows asked for and not yet
//! delivered, ask again when half have come, and read the server's status messages
//! (`super::pull_status`: a heartbeat; a request expired or ended, with the rows it
//! leaves undelivered; no responders). A new request goes out after every reconnect
//! and every leader change; only a 400 and a 409 "Consumer Deleted" fail the source
//! (the consumer actor connects again); a 409 "Leadership Change" and a 503 are waited
//! out. A request lost without a word is noticed and replaced (`super::lost_pull`).
//!
//! With exactly-once, no row is taken while the manifest index is incomplete (at
//! connect, after a reconnect, and whenever its watch was opened again, as after the
//! bucket's leader moved): the source waits, and says so (`SourceWait`).
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
use sluice_actors::{
    Delivery as _, NatsView, Source, SourceError, SourceFactory, SourceStatus, SourceWait,
    StallReason,
};
use tokio::time::Instant;

use super::delivery::{DlqWriter, JsDelivery};
use super::held::{HeldRows, RowsPerMessage};
use super::lost_pull::{self, ConsumerCounts, Heard, LostPull, Replace, StallTally};
use super::pull_status::{self, EndedBy, PullStatus};
use super::stuck_consumer::{self, ConsumerState, StuckWatch};
use crate::nats::manifest::JsManifestStore;
use crate::nats::placement;
use crate::nats::setup::{ensure_consumer, ensure_streams, StreamSettings};
use crate::nats::workarounds::stranded::remove_stranded;

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
/// How long a connect waits for the manifest index to catch up with the bucket before
/// it fails (and the consumer tries again).
const CATCH_UP_WAIT: Duration = Duration::from_secs(15);
/// How long the lag poll's requests (consumer and stream info) may take: during an
/// election nothing answers them, and the consumer actor waits on the poll.
const INFO_TIMEOUT: Duration = Duration::from_secs(2);
/// The pause before asking again after a request nothing took (no responders) or the
/// server turned down; it doubles up to `PAUSE_MAX` until a row or heartbeat comes.
const PAUSE_MIN: Duration = Duration::from_millis(250);
const PAUSE_MAX: Duration = Duration::from_secs(2);

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
    /// Pulls found lost and replaced, across the sources this factory made.
    stalls: Arc<StallTally>,
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
            stalls: Arc::default(),
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
    /// still waits (30 s and 5 s, at most half the expiry; tests shorten them).
    /// Nothing heard for two heartbeats and a second: the request is lost and
    /// replaced (`super::lost_pull`).
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
        let now = Instant::now();
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
            heard_from: now,
            last_row: now,
            asked_at: now,
            sent: now,
            silence: self.heartbeat * 2 + Duration::from_secs(1),
            failed: None,
            dlq: self.dlq.clone(),
            js: self.js.clone(),
            stream: self.settings.stream.clone(),
            manifests: self.manifests.clone(),
            lost: LostPull::new(&self.settings.stream, self.stalls.clone()),
            stuck: StuckWatch::default(),
            stalls: self.stalls.clone(),
            waiting: None,
            ask_after: None,
            pause: PAUSE_MIN,
            nats: None,
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
    /// When the last row came, and when the last request went out (`lost_pull`).
    last_row: Instant,
    asked_at: Instant,
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
    /// Notices requests lost without a word, and counts them into `stalls`.
    lost: LostPull,
    /// Notices a consumer stuck on the server, which a new request cannot help.
    stuck: StuckWatch,
    stalls: Arc<StallTally>,
    /// What the source waits for before it takes rows or asks for more.
    waiting: Option<SourceWait>,
    /// No request before this (after no responders or a refusal), and the next pause.
    ask_after: Option<Instant>,
    pause: Duration,
    /// The NATS side, as the last lag poll saw it.
    nats: Option<NatsView>,
}

impl JetStreamSource {
    /// Ask for another batch when half of what was asked for has come.
    async fn request_more(&mut self) -> Result<(), SourceError> {
        let connects = self.client.statistics().connects.load(Ordering::Relaxed);
        if connects != self.connects {
            // Reconnected: requests waiting on the server may have gone with the old
            // connection. Ask again (a request that survived only brings rows sooner);
            // the manifest index is waited for before rows are taken (`pull`).
            self.connects = connects;
            self.pending = 0;
        }
        if let Some(at) = self.ask_after {
            if Instant::now() < at {
                return Ok(());
            }
            self.ask_after = None;
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
        let now = Instant::now();
        if self.pending == 0 {
            // Nothing was waiting: silence is counted from this request on.
            self.heard_from = now;
        }
        self.pending += messages;
        self.asked = messages;
        self.asked_at = now;
        Ok(())
    }

    /// Waits (at most `IDLE_WAIT`) for the subscription's next message, asking for rows
    /// first; while the held rows leave no room to ask, for the drop that makes some;
    /// while a pause holds the next request back, for its end.
    /// `None`: nothing came in time; `Some(None)`: the subscription ended.
    async fn first_message(&mut self) -> Result<Option<Option<async_nats::Message>>, SourceError> {
        let deadline = Instant::now() + IDLE_WAIT;
        loop {
            self.request_more().await?;
            let waiting_for_room = self.pending == 0 && self.ask_after.is_none();
            let wake = self.ask_after.map_or(deadline, |at| at.min(deadline));
            let per_message = self.rows_per_message.get().unwrap_or(1.0);
            tokio::select! {
                message = self.subscriber.next() => return Ok(Some(message)),
                () = self.held.room_for(per_message), if waiting_for_room => {}
                () = tokio::time::sleep_until(wake) => {
                    if wake >= deadline {
                        return Ok(None);
                    }
                }
            }
        }
    }

    /// Whether rows may be taken now: without exactly-once always; with it once the
    /// manifest index holds every record of the bucket on this connection (waiting up
    /// to `IDLE_WAIT` for it). Meanwhile nothing on the inbox is read, and nothing
    /// heard from it is held against the request.
    async fn index_ready(&mut self) -> bool {
        let Some(store) = &self.manifests else {
            return true;
        };
        let ready = store.caught_up() || store.caught_up_within(IDLE_WAIT).await;
        if ready {
            if self.waiting == Some(SourceWait::ManifestIndex) {
                self.waiting = None;
            }
        } else {
            self.waiting = Some(SourceWait::ManifestIndex);
            self.heard_from = Instant::now();
        }
        ready
    }

    /// A request was found lost: ask again at once, or fail (the consumer connects
    /// again) when new requests changed nothing.
    fn replace(&mut self, reason: StallReason) -> Result<(), SourceError> {
        self.pending = 0;
        self.ask_after = None;
        self.heard_from = Instant::now();
        match self.lost.lost(reason) {
            Replace::AskAgain => Ok(()),
            Replace::Reconnect => Err(SourceError(format!(
                "{} new pull requests after a stall ({}) went unanswered: connecting again",
                lost_pull::REPLACEMENTS_BEFORE_RECONNECT,
                reason.as_str()
            ))),
        }
    }

    /// The consumer's state on the server is stuck (`super::stuck_consumer`): its
    /// leader is asked to step down, and its peers elect another.
    async fn new_consumer_leader(&self, info: &consumer::Info, reason: StallReason) {
        match stuck_consumer::step_down(&self.js, &self.stream, &info.name).await {
            Ok(()) => {
                tracing::warn!(stream = %self.stream, consumer = %info.name, reason = reason.as_str(),
                num_pending = info.num_pending, ack_pending = info.num_ack_pending,
                "the consumer was stuck on its leader: asked it to step down, another replica leads it now")
            }
            Err(e) => {
                tracing::warn!(stream = %self.stream, consumer = %info.name, reason = reason.as_str(), error = %e,
                "the consumer is stuck on its leader and the leader could not be asked to step down: asking again after another window")
            }
        }
    }

    /// The next request waits a pause (doubling while nothing answers).
    fn pause_requests(&mut self) {
        self.ask_after = Some(Instant::now() + self.pause);
        self.pause = (self.pause * 2).min(PAUSE_MAX);
    }

    /// Something came on the inbox: whatever the source waited for a leader for is over.
    fn heard(&mut self, what: Heard) {
        self.lost.heard(what);
        self.pause = PAUSE_MIN;
        if self.waiting == Some(SourceWait::ConsumerLeader) {
            self.waiting = None;
        }
    }

    /// One message of the subscription: a row, or a status that changes the count.
    fn take(
        &mut self,
        message: async_nats::Message,
        batch: &mut Vec<JsDelivery>,
    ) -> Result<(), SourceError> {
        let status = match message.status {
            None | Some(StatusCode::OK) => {
                self.pending = self.pending.saturating_sub(1);
                self.last_row = Instant::now();
                self.heard(Heard::Row);
                let delivery = JsDelivery::sent_by(message, self.dlq.clone(), self.sent);
                // An undecodable message is parked whole: one row.
                let rows = match delivery.undecodable() {
                    Some(_) => 1,
                    None => sluice_actors::rows::row_count(delivery.payload()),
                };
                self.rows_per_message.saw(rows);
                let token = self.held.hold(rows);
                batch.push(delivery.holding(token));
                return Ok(());
            }
            Some(status) => status,
        };
        let left = message
            .headers
            .as_ref()
            .and_then(|h| h.get("Nats-Pending-Messages"))
            .and_then(|v| v.as_str().parse::<usize>().ok());
        let why = message.description.as_deref().unwrap_or("");
        match pull_status::classify(status.as_u16(), why, left) {
            PullStatus::Heartbeat => self.heard(Heard::Heartbeat),
            PullStatus::Ended { left, by } => {
                // The rows it leaves undelivered are no longer coming.
                self.pending = self.pending.saturating_sub(left.unwrap_or(self.asked));
                match by {
                    EndedBy::Expired => {}
                    // Every request on the old leader is gone, not only this one.
                    EndedBy::LeadershipChange => self.replace(StallReason::LeadershipChange)?,
                    EndedBy::Refused => {
                        tracing::debug!(status = %status, why, "a pull request was turned down; asking again after a pause");
                        self.pause_requests();
                    }
                }
            }
            PullStatus::NoResponders => {
                // The request went nowhere: no consumer leader right now.
                self.pending = 0;
                self.waiting = Some(SourceWait::ConsumerLeader);
                self.pause_requests();
            }
            PullStatus::Terminal(why) => {
                return Err(SourceError(format!("the pull was refused: {why}")));
            }
        }
        Ok(())
    }
}

impl Source for JetStreamSource {
    type Delivery = JsDelivery;

    async fn pull(&mut self, max: usize) -> Result<Vec<JsDelivery>, SourceError> {
        if let Some(e) = self.failed.take() {
            return Err(e);
        }
        let mut batch = Vec::new();
        if !self.index_ready().await {
            return Ok(batch);
        }
        let first = match self.first_message().await? {
            None => {
                let now = Instant::now();
                if self.pending == 0 {
                    // Nothing asked for (the held rows fill the bound, or a pause):
                    // nothing to hear.
                    self.heard_from = now;
                } else if lost_pull::silent(true, self.heard_from, now, self.silence) {
                    self.replace(StallReason::HeartbeatsMissed)?;
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

    /// The lag, read with the consumer's info (bounded in time: during an election
    /// nothing answers); with it the NATS side for the snapshot, acked rows a crashed
    /// server left in the stream, and a request that waits while rows are pending and
    /// none come (`lost_pull::undelivered`).
    async fn pending(&mut self) -> Option<u64> {
        let info = tokio::time::timeout(INFO_TIMEOUT, self.consumer.info())
            .await
            .ok()?
            .ok()?
            .clone();
        let counts = ConsumerCounts {
            num_pending: info.num_pending,
            ack_pending: info.num_ack_pending as u64,
            max_ack_pending: info.config.max_ack_pending,
        };
        let stream = tokio::time::timeout(INFO_TIMEOUT, self.js.get_stream(&self.stream))
            .await
            .ok()
            .and_then(Result::ok);
        if let Some(stream) = &stream {
            remove_stranded(stream, &info, self.dlq.acked_here()).await;
        }
        self.nats = Some(placement::view(
            &self.client.server_info().server_name,
            stream
                .as_ref()
                .map(|s| (self.stream.as_str(), s.cached_info().cluster.as_ref())),
            Some((info.name.as_str(), info.cluster.as_ref())),
        ));
        let now = Instant::now();
        let stuck = self.waiting.is_none()
            && lost_pull::undelivered(
                counts,
                self.pending > 0,
                self.last_row,
                self.asked_at,
                now,
                self.silence,
            );
        let state = ConsumerState::read(&info, stream.as_ref().map(|s| s.cached_info()));
        let consumer_stuck = self.stuck.poll(&state, self.held.held(), now);
        if let Some(reason) = consumer_stuck {
            self.new_consumer_leader(&info, reason).await;
        }
        if let Some(reason) = consumer_stuck.or(stuck.then_some(StallReason::PendingUndelivered)) {
            if let Err(e) = self.replace(reason) {
                self.failed = Some(e);
            }
        }
        Some(info.num_pending)
    }

    fn status(&self) -> SourceStatus {
        let (stalls, last_stall) = self.stalls.get();
        SourceStatus {
            stalls,
            last_stall,
            waiting_for: self.waiting,
            nats: self.nats.clone(),
        }
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
