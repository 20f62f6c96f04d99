//! A consumer whose state on the server stopped moving, and the way out: a new leader.
//!
//! `super::lost_pull` notices a pull request gone; a new request answers that. Two
//! stalls seen on a NATS cluster of nats-server 2.9.10 are not the request's but the
//! consumer's, on its leader, and no request (nor a reconnect) changes them:
//!
//! - **the stream ahead of the consumer**: after its leader was frozen past the
//!   election timeout, the consumer showed nothing pending and nothing awaiting an ack
//!   while the stream kept 200 messages past the last one it had delivered, for good;
//! - **acks held by nobody**: after the node a Sluice was connected to was frozen, the
//!   consumer held 1,003 deliveries awaiting acks (its `max_ack_pending` is 1,000) that
//!   neither instance held, redelivered none after `ack_wait`, and so delivered nothing
//!   more for 90 s while 3,950 messages waited.
//!
//! Each is a stall ([`StallReason::StreamAheadOfConsumer`],
//! [`StallReason::AcksHeldByNobody`]) once it has lasted its window, and a replicated
//! consumer's leader is then asked to step down: its peers elect another, which
//! rebuilds what is pending from the replicated state and redelivers what awaits acks
//! past `ack_wait`. At most once per window while it lasts. A consumer without
//! replicas (one server) is not watched: there is no other leader to turn to.
//!
//! Both windows are long enough for the normal moments that look alike: acked
//! messages a replica removes a moment late (and this or another instance removes
//! after `crate::nats::workarounds::stranded::ACKED_GRACE`), and another instance holding every delivery
//! through a ClickHouse outage (it sends progress; a false alarm costs one election
//! per window).

use std::time::Duration;

use async_nats::jetstream::{self, consumer};
use sluice_actors::StallReason;
use tokio::time::Instant;

use crate::nats::workarounds::stranded::ACKED_GRACE;

/// How long the stream may keep messages past the consumer's last delivery with
/// nothing pending before it is a stall: past the grace in which the instances remove
/// what they acked, and two lag polls more.
pub const STREAM_AHEAD_WINDOW: Duration = Duration::from_secs(ACKED_GRACE.as_secs() + 20);

/// How long the leader is given to answer a step-down.
const STEP_DOWN_TIMEOUT: Duration = Duration::from_secs(5);

/// What the last lag poll saw of the consumer and its stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConsumerState {
    /// Messages in the stream not yet delivered to the consumer, as it counts them.
    pub num_pending: u64,
    /// Delivered and not yet acked, and the most it may have (0 or less: no bound).
    pub ack_pending: u64,
    pub max_ack_pending: i64,
    /// The last stream sequence delivered.
    pub delivered: u64,
    /// The stream's messages and its last sequence, as the stream's leader counts.
    pub stream_messages: u64,
    pub stream_last: u64,
    /// How long a delivery may wait for its ack before it is redelivered.
    pub ack_wait: Duration,
    /// The consumer has replicas: another can lead it. Only then is it watched (both
    /// stalls were seen on a cluster, and a single server's consumer has no other
    /// leader to turn to).
    pub replicated: bool,
}

impl ConsumerState {
    pub fn read(info: &consumer::Info, stream: Option<&jetstream::stream::Info>) -> Self {
        let (stream_messages, stream_last) =
            stream.map_or((0, 0), |s| (s.state.messages, s.state.last_sequence));
        Self {
            num_pending: info.num_pending,
            ack_pending: info.num_ack_pending as u64,
            max_ack_pending: info.config.max_ack_pending,
            delivered: info.delivered.stream_sequence,
            stream_messages,
            stream_last,
            ack_wait: info.config.ack_wait,
            replicated: info
                .cluster
                .as_ref()
                .is_some_and(|c| !c.replicas.is_empty()),
        }
    }

    /// The consumer says it has nothing left, while the stream keeps messages past the
    /// last one it delivered.
    fn stream_ahead(&self) -> bool {
        self.replicated
            && self.num_pending == 0
            && self.ack_pending == 0
            && self.stream_messages > 0
            && self.stream_last > self.delivered
    }

    /// Every delivery the consumer allows awaits an ack, none of them here, and rows
    /// wait.
    fn acks_held_elsewhere(&self, held_here: usize) -> bool {
        let at_max = self.max_ack_pending > 0
            && i64::try_from(self.ack_pending).is_ok_and(|n| n >= self.max_ack_pending);
        self.replicated && at_max && held_here == 0 && self.num_pending > 0
    }
}

/// Watches the lag polls for a stuck consumer.
#[derive(Debug, Default)]
pub struct StuckWatch {
    /// Since when the stream has been ahead of the consumer (or since the last
    /// step-down for it).
    ahead_since: Option<Instant>,
    /// Since when the consumer has been full of acks held elsewhere (idem).
    full_since: Option<Instant>,
}

impl StuckWatch {
    /// One lag poll: `state` as read, `held_here` the rows this process holds. Returns
    /// the stall to act on, once per window while it lasts.
    pub fn poll(
        &mut self,
        state: &ConsumerState,
        held_here: usize,
        now: Instant,
    ) -> Option<StallReason> {
        let ahead = lasted(
            &mut self.ahead_since,
            state.stream_ahead(),
            now,
            STREAM_AHEAD_WINDOW,
        );
        // Past `ack_wait` every delivery held by nobody is due again; twice it, and
        // none came.
        let full = lasted(
            &mut self.full_since,
            state.acks_held_elsewhere(held_here),
            now,
            state.ack_wait.saturating_mul(2).max(STREAM_AHEAD_WINDOW),
        );
        if ahead {
            Some(StallReason::StreamAheadOfConsumer)
        } else if full {
            Some(StallReason::AcksHeldByNobody)
        } else {
            None
        }
    }
}

/// Whether a condition has held for `window` (then its clock starts again).
fn lasted(since: &mut Option<Instant>, holds: bool, now: Instant, window: Duration) -> bool {
    if !holds {
        *since = None;
        return false;
    }
    let from = *since.get_or_insert(now);
    if now.saturating_duration_since(from) >= window {
        *since = Some(now);
        true
    } else {
        false
    }
}

/// Asks the consumer's leader to step down (`$JS.API.CONSUMER.LEADER.STEPDOWN`).
pub async fn step_down(
    js: &jetstream::Context,
    stream: &str,
    consumer: &str,
) -> Result<(), String> {
    // The context puts the API prefix in front.
    let subject = format!("CONSUMER.LEADER.STEPDOWN.{stream}.{consumer}");
    let empty = serde_json::json!({});
    let request = js.request::<_, _, serde_json::Value>(subject, &empty);
    match tokio::time::timeout(STEP_DOWN_TIMEOUT, request).await {
        Ok(Ok(answer)) if answer["success"] == true => Ok(()),
        Ok(Ok(answer)) => Err(format!("the leader did not step down: {answer}")),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!("no answer within {STEP_DOWN_TIMEOUT:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn healthy() -> ConsumerState {
        ConsumerState {
            num_pending: 0,
            ack_pending: 0,
            max_ack_pending: 1000,
            delivered: 9688,
            stream_messages: 0,
            stream_last: 9688,
            ack_wait: Duration::from_secs(30),
            replicated: true,
        }
    }

    #[test]
    fn a_stream_ahead_of_an_idle_consumer_is_a_stall_once_it_lasts_its_window() {
        let t0 = Instant::now();
        let seen = ConsumerState {
            stream_messages: 200,
            stream_last: 9888,
            ..healthy()
        };
        let mut watch = StuckWatch::default();
        assert_eq!(watch.poll(&seen, 0, t0), None);
        assert_eq!(watch.poll(&seen, 0, t0 + Duration::from_secs(29)), None);
        assert_eq!(
            watch.poll(&seen, 0, t0 + STREAM_AHEAD_WINDOW),
            Some(StallReason::StreamAheadOfConsumer)
        );
        // Acted on: not again before another window.
        assert_eq!(
            watch.poll(&seen, 0, t0 + STREAM_AHEAD_WINDOW + Duration::from_secs(5)),
            None
        );
        assert_eq!(
            watch.poll(&seen, 0, t0 + STREAM_AHEAD_WINDOW * 2),
            Some(StallReason::StreamAheadOfConsumer)
        );
    }

    #[test]
    fn a_consumer_without_replicas_is_not_watched() {
        let t0 = Instant::now();
        let ahead = ConsumerState {
            stream_messages: 200,
            stream_last: 9888,
            replicated: false,
            ..healthy()
        };
        let mut watch = StuckWatch::default();
        watch.poll(&ahead, 0, t0);
        assert_eq!(watch.poll(&ahead, 0, t0 + STREAM_AHEAD_WINDOW * 2), None);
    }

    #[test]
    fn a_moment_of_agreement_starts_the_window_again() {
        let t0 = Instant::now();
        let ahead = ConsumerState {
            stream_messages: 5,
            stream_last: 9693,
            ..healthy()
        };
        let mut watch = StuckWatch::default();
        assert_eq!(watch.poll(&ahead, 0, t0), None);
        assert_eq!(
            watch.poll(&healthy(), 0, t0 + Duration::from_secs(20)),
            None
        );
        assert_eq!(watch.poll(&ahead, 0, t0 + STREAM_AHEAD_WINDOW), None);
    }

    #[test]
    fn messages_pending_or_awaiting_acks_are_no_stream_ahead() {
        let t0 = Instant::now();
        let later = t0 + STREAM_AHEAD_WINDOW * 2;
        for state in [
            ConsumerState {
                stream_messages: 200,
                stream_last: 9888,
                num_pending: 200,
                ..healthy()
            },
            ConsumerState {
                stream_messages: 200,
                stream_last: 9888,
                ack_pending: 3,
                ..healthy()
            },
            ConsumerState {
                stream_messages: 200,
                ..healthy()
            },
        ] {
            let mut watch = StuckWatch::default();
            watch.poll(&state, 0, t0);
            assert_eq!(watch.poll(&state, 0, later), None, "{state:?}");
        }
    }

    #[test]
    fn a_full_consumer_with_nothing_held_here_is_a_stall_after_twice_ack_wait() {
        let t0 = Instant::now();
        let full = ConsumerState {
            num_pending: 3950,
            ack_pending: 1003,
            delivered: 20_000,
            stream_messages: 4953,
            stream_last: 23_950,
            ..healthy()
        };
        let mut watch = StuckWatch::default();
        assert_eq!(watch.poll(&full, 0, t0), None);
        assert_eq!(watch.poll(&full, 0, t0 + Duration::from_secs(59)), None);
        assert_eq!(
            watch.poll(&full, 0, t0 + Duration::from_secs(60)),
            Some(StallReason::AcksHeldByNobody)
        );
        let mut holding = StuckWatch::default();
        holding.poll(&full, 1, t0);
        assert_eq!(
            holding.poll(&full, 1, t0 + Duration::from_secs(120)),
            None,
            "rows held here: this instance holds acks, it is not stuck"
        );
        let room = ConsumerState {
            ack_pending: 999,
            ..full
        };
        let mut below = StuckWatch::default();
        below.poll(&room, 0, t0);
        assert_eq!(
            below.poll(&room, 0, t0 + Duration::from_secs(120)),
            None,
            "room under max_ack_pending: lost_pull's pending_undelivered, not this"
        );
    }
}
