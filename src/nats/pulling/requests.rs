//! The pull requests out on the consumer (NATS ADR-37): how many messages they asked
//! for and how many are still to come, when the next may go (asked again when half
//! have come; after a refusal or no responders, a pause that doubles), and the wait for
//! a first message.

use std::sync::atomic::Ordering;
use std::time::Duration;

use async_nats::Subject;
use bytes::Bytes;
use futures::StreamExt as _;
use sluice_actors::SourceError;
use tokio::time::Instant;

use super::held::{HeldRows, RowsPerMessage};

/// How long one `pull` waits for a first row before answering with an empty batch.
pub(super) const IDLE_WAIT: Duration = Duration::from_millis(500);
/// The pause before asking again after a request nothing took (no responders) or the
/// server turned down; it doubles up to `PAUSE_MAX` until a row or heartbeat comes.
pub(super) const PAUSE_MIN: Duration = Duration::from_millis(250);
const PAUSE_MAX: Duration = Duration::from_secs(2);

/// When things were last heard and done.
pub(super) struct Times {
    /// When the subscription last carried anything (a row or a status).
    pub(super) heard_from: Instant,
    /// When the last row came, and when the last request went out (`lost_pull`).
    pub(super) last_row: Instant,
    pub(super) asked_at: Instant,
    /// When the rows being taken were sent at the latest (see `super::stall`).
    pub(super) sent: Instant,
    /// Nothing heard for this long while a request waits: it is lost.
    pub(super) silence: Duration,
}

/// The requests out on the consumer and their pacing.
pub(super) struct Requests {
    pub(super) client: async_nats::Client,
    pub(super) subscriber: async_nats::Subscriber,
    pub(super) inbox: Subject,
    pub(super) next_subject: Subject,
    /// A pull request's expiry and heartbeat, as the server takes them.
    pub(super) expires_ns: u64,
    pub(super) heartbeat_ns: u64,
    /// Rows per pull request (`pull_batch`).
    pub(super) batch: usize,
    /// The rows per message seen lately: how many messages a request asks for.
    pub(super) rows_per_message: RowsPerMessage,
    /// Messages the last request asked for: the next one goes when half have come.
    pub(super) asked: usize,
    /// Messages asked for and neither delivered yet nor given up by the server.
    pub(super) pending: usize,
    /// The client's connection count when the last request went out.
    pub(super) connects: u64,
    /// No request before this (after no responders or a refusal), and the next pause.
    pub(super) ask_after: Option<Instant>,
    pub(super) pause: Duration,
}

impl Requests {
    /// Ask for another batch when half of what was asked for has come.
    pub(super) async fn request_more(
        &mut self,
        held: &HeldRows,
        times: &mut Times,
    ) -> Result<(), SourceError> {
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
                held.messages_to_ask(self.pending, per_message, most)
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
            times.heard_from = now;
        }
        self.pending += messages;
        self.asked = messages;
        times.asked_at = now;
        Ok(())
    }

    /// Waits (at most `IDLE_WAIT`) for the subscription's next message, asking for rows
    /// first; while the held rows leave no room to ask, for the drop that makes some;
    /// while a pause holds the next request back, for its end.
    /// `None`: nothing came in time; `Some(None)`: the subscription ended.
    pub(super) async fn first_message(
        &mut self,
        held: &HeldRows,
        times: &mut Times,
    ) -> Result<Option<Option<async_nats::Message>>, SourceError> {
        let deadline = Instant::now() + IDLE_WAIT;
        loop {
            self.request_more(held, times).await?;
            let waiting_for_room = self.pending == 0 && self.ask_after.is_none();
            let wake = self.ask_after.map_or(deadline, |at| at.min(deadline));
            let per_message = self.rows_per_message.get().unwrap_or(1.0);
            tokio::select! {
                message = self.subscriber.next() => return Ok(Some(message)),
                () = held.room_for(per_message), if waiting_for_room => {}
                () = tokio::time::sleep_until(wake) => {
                    if wake >= deadline {
                        return Ok(None);
                    }
                }
            }
        }
    }

    /// The next request waits a pause (doubling while nothing answers).
    pub(super) fn pause(&mut self) {
        self.ask_after = Some(Instant::now() + self.pause);
        self.pause = (self.pause * 2).min(PAUSE_MAX);
    }
}
