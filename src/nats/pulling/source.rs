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
use super::requests::{Requests, Times, IDLE_WAIT, PAUSE_MIN};
use super::stuck_consumer::{self, ConsumerState, StuckWatch};
use crate::config::StreamSettings;
use crate::nats::manifest::JsManifestStore;
use crate::nats::placement;
use crate::nats::setup::{ensure_consumer, ensure_streams};
use crate::nats::workarounds::stranded::remove_stranded;

/// The most buffered rows handed back when a source is dropped (the client buffers at
/// most a couple of pull batches).
const MAX_DRAINED: usize = 100_000;

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

    fn partitions(&self) -> Option<Vec<String>> {
        let each = self.settings.each_partition();
        self.settings
            .partitioned()
            .then(|| each.into_iter().map(|p| p.stream).collect())
    }

    async fn connect(&self, partition: usize) -> Result<JetStreamSource, SourceError> {
        super::stall::start();
        let fail = |e: anyhow::Error| SourceError(format!("{e:#}"));
        ensure_streams(&self.js, &self.settings)
            .await
            .map_err(fail)?;
        let settings = self.settings.partition(partition);
        let consumer = ensure_consumer(&self.js, &settings).await.map_err(fail)?;
        if let Some(store) = &self.manifests {
            wait_for_index(store).await?;
        }
        let client = self.js.client();
        let inbox = Subject::from(client.new_inbox());
        let subscriber = client.subscribe(inbox.clone()).await.map_err(|e| {
            SourceError(format!(
                "subscribing to pull from {}: {e}",
                settings.consumer
            ))
        })?;
        let now = Instant::now();
        Ok(JetStreamSource {
            requests: Requests {
                next_subject: Subject::from(format!(
                    "{API_PREFIX}.CONSUMER.MSG.NEXT.{}.{}",
                    settings.stream, settings.consumer
                )),
                expires_ns: u64::try_from(self.expires.as_nanos()).unwrap_or(u64::MAX),
                heartbeat_ns: u64::try_from(self.heartbeat.as_nanos()).unwrap_or(u64::MAX),
                rows_per_message: RowsPerMessage::default(),
                asked: 0,
                connects: client.statistics().connects.load(Ordering::Relaxed),
                client,
                subscriber,
                inbox,
                batch: self.pull_batch.max(1),
                pending: 0,
                ask_after: None,
                pause: PAUSE_MIN,
            },
            times: Times {
                heard_from: now,
                last_row: now,
                asked_at: now,
                sent: now,
                silence: self.heartbeat * 2 + Duration::from_secs(1),
            },
            watch: Watch {
                lost: LostPull::new(&settings.stream, self.stalls.clone()),
                stuck: StuckWatch::default(),
                stalls: self.stalls.clone(),
                waiting: None,
                nats: None,
            },
            server: Server {
                consumer,
                partition,
                js: self.js.clone(),
                stream: settings.stream.clone(),
            },
            held: self.held.clone(),
            failed: None,
            dlq: self.dlq.clone(),
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
    /// The requests out on the consumer and their pacing (`super::requests`).
    pub(super) requests: Requests,
    /// When things were last heard and done (`super::lost_pull` reads them).
    pub(super) times: Times,
    /// What the source notices and shows: lost pulls, a stuck consumer, what it waits
    /// for, the NATS side.
    watch: Watch,
    /// The consumer and its stream, for the lag poll and a leader's step-down.
    server: Server,
    /// The rows held, pulled and not settled (`super::held`).
    pub(super) held: Arc<HeldRows>,
    /// A failure met while rows were in hand: reported by the next pull.
    pub(super) failed: Option<SourceError>,
    pub(super) dlq: Arc<DlqWriter>,
    /// See [`JetStreamSourceFactory::with_manifests`].
    pub(super) manifests: Option<Arc<JsManifestStore>>,
}

/// What the source notices and shows.
struct Watch {
    /// Notices requests lost without a word, and counts them into `stalls`.
    lost: LostPull,
    /// Notices a consumer stuck on the server, which a new request cannot help.
    stuck: StuckWatch,
    stalls: Arc<StallTally>,
    /// What the source waits for before it takes rows or asks for more.
    waiting: Option<SourceWait>,
    /// The NATS side, as the last lag poll saw it.
    nats: Option<NatsView>,
}

/// The consumer and its stream.
struct Server {
    consumer: consumer::PullConsumer,
    /// Which partition of the queue its stream is (0 when there is one).
    partition: usize,
    js: jetstream::Context,
    /// The stream's name, to look for acked rows a crashed server left behind.
    stream: String,
}

impl JetStreamSource {
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
            if self.watch.waiting == Some(SourceWait::ManifestIndex) {
                self.watch.waiting = None;
            }
        } else {
            self.watch.waiting = Some(SourceWait::ManifestIndex);
            self.times.heard_from = Instant::now();
        }
        ready
    }

    /// A request was found lost: ask again at once, or fail (the consumer connects
    /// again) when new requests changed nothing.
    fn replace(&mut self, reason: StallReason) -> Result<(), SourceError> {
        self.requests.pending = 0;
        self.requests.ask_after = None;
        self.times.heard_from = Instant::now();
        match self.watch.lost.lost(reason) {
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
        match stuck_consumer::step_down(&self.server.js, &self.server.stream, &info.name).await {
            Ok(()) => {
                tracing::warn!(stream = %self.server.stream, consumer = %info.name, reason = reason.as_str(),
                num_pending = info.num_pending, ack_pending = info.num_ack_pending,
                "the consumer was stuck on its leader: asked it to step down, another replica leads it now")
            }
            Err(e) => {
                tracing::warn!(stream = %self.server.stream, consumer = %info.name, reason = reason.as_str(), error = %e,
                "the consumer is stuck on its leader and the leader could not be asked to step down: asking again after another window")
            }
        }
    }

    /// Something came on the inbox: whatever the source waited for a leader for is over.
    fn heard(&mut self, what: Heard) {
        self.watch.lost.heard(what);
        self.requests.pause = PAUSE_MIN;
        if self.watch.waiting == Some(SourceWait::ConsumerLeader) {
            self.watch.waiting = None;
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
                self.requests.pending = self.requests.pending.saturating_sub(1);
                self.times.last_row = Instant::now();
                self.heard(Heard::Row);
                let delivery = JsDelivery::sent_by(message, self.dlq.clone(), self.times.sent)
                    .in_partition(self.server.partition);
                // An undecodable message is parked whole: one row.
                let rows = match delivery.undecodable() {
                    Some(_) => 1,
                    None => sluice_actors::rows::row_count(delivery.payload()),
                };
                self.requests.rows_per_message.saw(rows);
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
                self.requests.pending = self
                    .requests
                    .pending
                    .saturating_sub(left.unwrap_or(self.requests.asked));
                match by {
                    EndedBy::Expired => {}
                    // Every request on the old leader is gone, not only this one.
                    EndedBy::LeadershipChange => self.replace(StallReason::LeadershipChange)?,
                    EndedBy::Refused => {
                        tracing::debug!(status = %status, why, "a pull request was turned down; asking again after a pause");
                        self.requests.pause();
                    }
                }
            }
            PullStatus::NoResponders => {
                // The request went nowhere: no consumer leader right now.
                self.requests.pending = 0;
                self.watch.waiting = Some(SourceWait::ConsumerLeader);
                self.requests.pause();
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
        let first = match self
            .requests
            .first_message(&self.held, &mut self.times)
            .await?
        {
            None => {
                let now = Instant::now();
                if self.requests.pending == 0 {
                    // Nothing asked for (the held rows fill the bound, or a pause):
                    // nothing to hear.
                    self.times.heard_from = now;
                } else if lost_pull::silent(true, self.times.heard_from, now, self.times.silence) {
                    self.replace(StallReason::HeartbeatsMissed)?;
                }
                return Ok(batch);
            }
            Some(None) => return Err(SourceError("the pull subscription ended".into())),
            Some(Some(message)) => message,
        };
        self.times.heard_from = Instant::now();
        // One stamp for the batch: the rows came in the same moment.
        self.times.sent = super::stall::sent_no_later_than(self.times.heard_from.into_std()).into();
        batch.reserve(max.min(1024));
        self.take(first, &mut batch)?;
        // Take what has already arrived, without waiting for more.
        while batch.len() < max {
            match self.requests.subscriber.next().now_or_never() {
                Some(Some(message)) => {
                    if let Err(e) = self.take(message, &mut batch) {
                        self.failed = Some(e);
                        break;
                    }
                    if self.requests.pending <= self.requests.asked / 2 {
                        if let Err(e) = self
                            .requests
                            .request_more(&self.held, &mut self.times)
                            .await
                        {
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
        let info = tokio::time::timeout(INFO_TIMEOUT, self.server.consumer.info())
            .await
            .ok()?
            .ok()?
            .clone();
        let counts = ConsumerCounts {
            num_pending: info.num_pending,
            ack_pending: info.num_ack_pending as u64,
            max_ack_pending: info.config.max_ack_pending,
        };
        let stream =
            tokio::time::timeout(INFO_TIMEOUT, self.server.js.get_stream(&self.server.stream))
                .await
                .ok()
                .and_then(Result::ok);
        if let Some(stream) = &stream {
            let acked = self.dlq.acked_here().map(|a| (a, self.server.partition));
            remove_stranded(stream, &info, acked).await;
        }
        self.watch.nats = Some(placement::view(
            &self.requests.client.server_info().server_name,
            stream.as_ref().map(|s| {
                (
                    self.server.stream.as_str(),
                    s.cached_info().cluster.as_ref(),
                )
            }),
            Some((info.name.as_str(), info.cluster.as_ref())),
        ));
        let now = Instant::now();
        let stuck = self.watch.waiting.is_none()
            && lost_pull::undelivered(
                counts,
                self.requests.pending > 0,
                self.times.last_row,
                self.times.asked_at,
                now,
                self.times.silence,
            );
        let state = ConsumerState::read(&info, stream.as_ref().map(|s| s.cached_info()));
        let consumer_stuck = self.watch.stuck.poll(&state, self.held.held(), now);
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
        let (stalls, last_stall) = self.watch.stalls.get();
        SourceStatus {
            stalls,
            last_stall,
            waiting_for: self.watch.waiting,
            nats: self.watch.nats.clone(),
        }
    }
}

impl Drop for JetStreamSource {
    /// Rows the client already took from the server but nobody pulled yet (a stop, a
    /// reconnect) are handed back now, rather than after `ack_wait`: each becomes a
    /// delivery whose drop naks it.
    fn drop(&mut self) {
        for _ in 0..MAX_DRAINED {
            match self.requests.subscriber.next().now_or_never() {
                Some(Some(message)) if matches!(message.status, None | Some(StatusCode::OK)) => {
                    drop(
                        JsDelivery::new(message, self.dlq.clone())
                            .in_partition(self.server.partition),
                    )
                }
                Some(Some(_status)) => continue,
                _ => break,
            }
        }
    }
}
