//! Noticing a pull request that is gone without a word, and replacing it: no silent
//! stall.
//!
//! A pull request lives on the consumer's leader. When the leader moves (an election,
//! a node killed or frozen, a restart) the request may go with it: nats-server 2.10 and
//! later say so (409 "Leadership Change"), 2.9 says nothing, and a server stuck after a
//! restart (nats-server #5679, #6025, #5839) keeps a consumer that delivers nothing.
//! The ClickHouse NATS engine lost rows this way (ClickHouse #112828: a reconnect
//! re-sent the subscription, not the pull) and nats.go stopped pulling for good after
//! a leadership change (#2063). So the source watches for three signs:
//!
//! - a request waiting with no row and no idle heartbeat for two heartbeats and a
//!   second ([`silent`]): the server forgot it;
//! - a 409 "Leadership Change": every request on the old leader is gone;
//! - rows pending for the consumer, a request waiting, room under `max_ack_pending`,
//!   and no row for as long ([`undelivered`]).
//!
//! Each is a stall: the source asks again at once (a new request; any old one still
//! alive only brings rows sooner), and logs and counts it once
//! (`sluice_consumer_stalls_total`, the consumer's `stalls` in `/admin/actors`),
//! however many requests it takes until rows or heartbeats come again. After
//! [`REPLACEMENTS_BEFORE_RECONNECT`] requests that changed nothing, the source fails
//! instead, and the consumer connects again (a new subscription, the durable consumer
//! made again if it is gone).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use sluice_actors::metrics::consumer_stalls;
use sluice_actors::StallReason;
use tokio::time::Instant;

/// New requests in one stall before the source gives up on them and reconnects.
pub const REPLACEMENTS_BEFORE_RECONNECT: u32 = 3;

/// Stalls since the process started and the last one's reason: held by the source
/// factory, so a count outlives the source a reconnect replaces.
#[derive(Debug, Default)]
pub struct StallTally {
    counted: Mutex<(u64, Option<StallReason>)>,
}

impl StallTally {
    pub fn get(&self) -> (u64, Option<StallReason>) {
        *self.counted.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn count(&self, reason: StallReason) {
        let mut counted = self.counted.lock().unwrap_or_else(|e| e.into_inner());
        counted.0 += 1;
        counted.1 = Some(reason);
    }
}

/// What the source does about a lost request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Replace {
    /// Send a new request.
    AskAgain,
    /// New requests changed nothing: fail, so the consumer connects again.
    Reconnect,
}

/// What the source heard on its inbox.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Heard {
    Row,
    Heartbeat,
}

/// The stall being waited out.
#[derive(Clone, Copy, Debug)]
struct Stall {
    reason: StallReason,
    since: Instant,
    replaced: u32,
}

/// One source's watch for lost requests.
#[derive(Debug)]
pub struct LostPull {
    stream: String,
    tally: Arc<StallTally>,
    open: Option<Stall>,
}

// === impl LostPull ===

impl LostPull {
    pub fn new(stream: &str, tally: Arc<StallTally>) -> Self {
        Self {
            stream: stream.to_owned(),
            tally,
            open: None,
        }
    }

    /// The request was found lost for `reason`: the first time in a stall it is
    /// logged and counted.
    pub fn lost(&mut self, reason: StallReason) -> Replace {
        let stall = match &mut self.open {
            Some(stall) => {
                stall.replaced += 1;
                tracing::debug!(stream = %self.stream, reason = reason.as_str(),
                    replaced = stall.replaced, "the new pull request is lost too");
                *stall
            }
            None => {
                tracing::warn!(stream = %self.stream, reason = reason.as_str(),
                    "the pull request is lost (a silent stall): asking again");
                self.tally.count(reason);
                consumer_stalls(&self.stream, reason).increment(1);
                *self.open.insert(Stall {
                    reason,
                    since: Instant::now(),
                    replaced: 1,
                })
            }
        };
        if stall.replaced > REPLACEMENTS_BEFORE_RECONNECT {
            self.open = None;
            Replace::Reconnect
        } else {
            Replace::AskAgain
        }
    }

    /// Something came: a row ends any stall, a heartbeat one where the request was
    /// forgotten (when rows were pending and none came, only a row does).
    pub fn heard(&mut self, what: Heard) {
        let Some(stall) = self.open else {
            return;
        };
        if what == Heard::Heartbeat && !stall.reason.ended_by_heartbeat() {
            return;
        }
        self.open = None;
        tracing::info!(stream = %self.stream, reason = stall.reason.as_str(),
            after_ms = stall.since.elapsed().as_millis() as u64,
            "the pull is answered again after a stall");
    }
}

/// A waiting request heard nothing (no row, no heartbeat) for `silence`.
pub fn silent(waiting: bool, heard_from: Instant, now: Instant, silence: Duration) -> bool {
    waiting && now.saturating_duration_since(heard_from) > silence
}

/// The consumer as the last lag poll saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConsumerCounts {
    /// Messages in the stream not yet delivered to it.
    pub num_pending: u64,
    /// Delivered and not yet acked, and the most it may have.
    pub ack_pending: u64,
    pub max_ack_pending: i64,
}

/// Rows wait for the consumer and it may take them (below `max_ack_pending`), this
/// source's request waits, and no row came for `after` since the request went out.
pub fn undelivered(
    counts: ConsumerCounts,
    waiting: bool,
    last_row: Instant,
    asked_at: Instant,
    now: Instant,
    after: Duration,
) -> bool {
    let room = counts.max_ack_pending <= 0
        || i64::try_from(counts.ack_pending).is_ok_and(|n| n < counts.max_ack_pending);
    let quiet_since = last_row.max(asked_at);
    waiting && room && counts.num_pending > 0 && now.saturating_duration_since(quiet_since) > after
}

#[cfg(test)]
mod tests {
    use super::*;

    const SILENCE: Duration = Duration::from_secs(11);

    #[test]
    fn a_stall_is_counted_once_however_many_requests_it_takes() {
        let tally = Arc::new(StallTally::default());
        let mut watch = LostPull::new("INGEST", tally.clone());
        assert_eq!(watch.lost(StallReason::HeartbeatsMissed), Replace::AskAgain);
        assert_eq!(watch.lost(StallReason::HeartbeatsMissed), Replace::AskAgain);
        assert_eq!(tally.get(), (1, Some(StallReason::HeartbeatsMissed)));
        watch.heard(Heard::Heartbeat);
        assert_eq!(watch.lost(StallReason::LeadershipChange), Replace::AskAgain);
        assert_eq!(tally.get(), (2, Some(StallReason::LeadershipChange)));
    }

    #[test]
    fn requests_that_change_nothing_end_in_a_reconnect() {
        let tally = Arc::new(StallTally::default());
        let mut watch = LostPull::new("INGEST", tally.clone());
        for _ in 0..REPLACEMENTS_BEFORE_RECONNECT {
            assert_eq!(
                watch.lost(StallReason::PendingUndelivered),
                Replace::AskAgain
            );
            // Heartbeats say the request waits; they do not end this stall.
            watch.heard(Heard::Heartbeat);
        }
        assert_eq!(
            watch.lost(StallReason::PendingUndelivered),
            Replace::Reconnect
        );
        assert_eq!(tally.get().0, 1);
        // A row ends it: the next loss is a stall of its own.
        watch.heard(Heard::Row);
        watch.lost(StallReason::PendingUndelivered);
        assert_eq!(tally.get().0, 2);
    }

    #[test]
    fn a_request_is_lost_after_two_heartbeats_of_silence() {
        let t0 = Instant::now();
        assert!(!silent(true, t0, t0 + Duration::from_secs(10), SILENCE));
        assert!(silent(true, t0, t0 + Duration::from_secs(12), SILENCE));
        assert!(
            !silent(false, t0, t0 + Duration::from_secs(60), SILENCE),
            "nothing asked for: nothing to hear"
        );
    }

    #[test]
    fn rows_pending_and_none_delivered_is_a_stall_only_with_room_and_a_request() {
        let t0 = Instant::now();
        let later = t0 + Duration::from_secs(20);
        let stuck = ConsumerCounts {
            num_pending: 500,
            ack_pending: 0,
            max_ack_pending: 20_000,
        };
        let full = ConsumerCounts {
            ack_pending: 20_000,
            ..stuck
        };
        let empty = ConsumerCounts {
            num_pending: 0,
            ..stuck
        };
        let t15 = t0 + Duration::from_secs(15);
        assert!(undelivered(stuck, true, t0, t0, later, SILENCE));
        // (counts, a request out, the last row, the last request): why it is no stall.
        for (counts, asked, last_row, last_pull, why) in [
            (stuck, false, t0, t0, "nothing asked"),
            (
                full,
                true,
                t0,
                t0,
                "max_ack_pending reached: the server holds them back on purpose",
            ),
            (empty, true, t0, t0, "nothing pending"),
            (stuck, true, t0, t15, "asked only 5 s ago"),
            (stuck, true, t15, t0, "a row 5 s ago"),
        ] {
            assert!(
                !undelivered(counts, asked, last_row, last_pull, later, SILENCE),
                "{why}"
            );
        }
    }
}
