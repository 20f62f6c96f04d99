//! The rows this instance holds: pulled from the consumer and not settled yet (acked,
//! nakked, parked, or dropped, which naks).
//!
//! JetStream bounds a consumer by messages (`max_ack_pending`), and a message carries
//! one row or many. With 100-row messages the same bound lets one instance hold a
//! hundred times the rows, far more than its tables buffer: the excess is handed back
//! and pulled again, over and over. So the source asks for messages by the rows they
//! bring: no more than what is left under `[pipeline] max_held_rows` at the rows per
//! message seen lately. Each pulled delivery carries a [`HeldToken`] that gives its
//! rows back when the delivery is dropped, whatever became of it; a source waiting for
//! room is woken by the drop that makes some.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::sync::Notify;

/// The count of rows held, shared by the source and its deliveries.
#[derive(Debug)]
pub struct HeldRows {
    held: AtomicUsize,
    limit: usize,
    /// The level the waiting source wants to hear of: a drop to it or below wakes it.
    wake_at: AtomicUsize,
    room: Notify,
}

/// A delivery's rows in [`HeldRows`], given back on drop.
#[derive(Debug)]
pub struct HeldToken {
    rows: usize,
    of: Arc<HeldRows>,
}

/// How fast the rows-per-message estimate follows what comes (a weight of 1/8 per
/// message).
const ESTIMATE_WEIGHT: f64 = 1.0 / 8.0;

// === impl HeldRows ===

impl HeldRows {
    pub fn new(limit: usize) -> Arc<Self> {
        Arc::new(Self {
            held: AtomicUsize::new(0),
            limit: limit.max(1),
            wake_at: AtomicUsize::new(0),
            room: Notify::new(),
        })
    }

    /// Resolves once the rows held leave room for a message of `rows_per_message`
    /// (at once when they do already). A wake-up may come early: ask again.
    pub async fn room_for(&self, rows_per_message: f64) {
        let level = self
            .limit
            .saturating_sub(rows_per_message.max(1.0).ceil() as usize);
        self.wake_at.store(level, Ordering::Relaxed);
        if self.held() <= level {
            return;
        }
        self.room.notified().await;
    }

    pub fn held(&self) -> usize {
        self.held.load(Ordering::Relaxed)
    }

    /// Counts `rows` as held until the token is dropped.
    pub fn hold(self: &Arc<Self>, rows: usize) -> HeldToken {
        self.held.fetch_add(rows, Ordering::Relaxed);
        HeldToken {
            rows,
            of: self.clone(),
        }
    }

    /// How many messages a pull request may ask for: what fits under the limit beside
    /// the rows held and the `asked` messages still on their way, at `rows_per_message`,
    /// and never more than `max` messages. With nothing held and nothing on its way
    /// it is at least one (a message may carry more rows than the limit).
    pub fn messages_to_ask(&self, asked: usize, rows_per_message: f64, max: usize) -> usize {
        let per_message = rows_per_message.max(1.0);
        let held = self.held();
        let coming = (asked as f64 * per_message) as usize;
        let room = self.limit.saturating_sub(held.saturating_add(coming));
        let n = ((room as f64 / per_message) as usize).min(max);
        if n == 0 && held == 0 && asked == 0 {
            1
        } else {
            n
        }
    }
}

impl Drop for HeldToken {
    fn drop(&mut self) {
        let before = self.of.held.fetch_sub(self.rows, Ordering::Relaxed);
        let level = self.of.wake_at.load(Ordering::Relaxed);
        if before > level && before - self.rows <= level {
            // A permit is kept if the source is not waiting yet: it will not miss it.
            self.of.room.notify_one();
        }
    }
}

/// The rows per message seen lately, for sizing pull requests: a moving average, but
/// never below the last message's rows, so a stream turning to bigger messages is
/// followed at once (asking for too few messages costs a round trip; too many, rows
/// that could only be handed back).
#[derive(Clone, Copy, Debug, Default)]
pub struct RowsPerMessage {
    seen: Option<(f64, usize)>,
}

impl RowsPerMessage {
    pub fn saw(&mut self, rows: usize) {
        let average = match self.seen {
            None => rows as f64,
            Some((average, _)) => average + (rows as f64 - average) * ESTIMATE_WEIGHT,
        };
        self.seen = Some((average, rows));
    }

    /// `None` before the first message: ask for one, and know.
    pub fn get(self) -> Option<f64> {
        self.seen
            .map(|(average, last)| average.max(last as f64).max(1.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_ask_for_the_rows_left_under_the_limit() {
        let held = HeldRows::new(20_000);
        // One row per message: the limit in messages, capped by the pull's size.
        assert_eq!(held.messages_to_ask(0, 1.0, 1000), 1000);
        assert_eq!(held.messages_to_ask(19_500, 1.0, 1000), 500);
        // A hundred rows per message: a hundredth of the messages.
        assert_eq!(held.messages_to_ask(0, 100.0, 1000), 200);
        let tokens: Vec<HeldToken> = (0..150).map(|_| held.hold(100)).collect();
        assert_eq!(held.held(), 15_000);
        assert_eq!(held.messages_to_ask(0, 100.0, 1000), 50);
        assert_eq!(held.messages_to_ask(50, 100.0, 1000), 0);
        drop(tokens);
        assert_eq!(held.held(), 0);
        assert_eq!(held.messages_to_ask(0, 100.0, 1000), 200);
    }

    #[test]
    fn a_message_larger_than_the_limit_still_comes_when_nothing_is_held() {
        let held = HeldRows::new(50);
        assert_eq!(held.messages_to_ask(0, 100.0, 1000), 1);
        let token = held.hold(100);
        assert_eq!(held.messages_to_ask(0, 100.0, 1000), 0);
        drop(token);
        assert_eq!(held.messages_to_ask(1, 100.0, 1000), 0, "one is on its way");
    }

    #[tokio::test(start_paused = true)]
    async fn a_source_waiting_for_room_is_woken_by_the_drop_that_makes_it() {
        let held = HeldRows::new(1000);
        let tokens: Vec<HeldToken> = (0..10).map(|_| held.hold(100)).collect();
        let mut tokens = tokens.into_iter();
        let waiting = {
            let held = held.clone();
            tokio::spawn(async move { held.room_for(100.0).await })
        };
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "no room yet");
        drop(tokens.next());
        tokio::time::timeout(std::time::Duration::from_millis(10), waiting)
            .await
            .expect("woken by the drop")
            .expect("the waiting task");
        // Room already there: no wait at all.
        tokio::time::timeout(std::time::Duration::from_millis(10), held.room_for(100.0))
            .await
            .expect("at once");
    }

    #[test]
    fn the_estimate_follows_the_messages_that_come() {
        let mut rpm = RowsPerMessage::default();
        assert_eq!(rpm.get(), None);
        rpm.saw(1);
        assert_eq!(rpm.get(), Some(1.0));
        // Bigger messages are followed at once, smaller ones gradually.
        rpm.saw(100);
        assert_eq!(rpm.get(), Some(100.0));
        for _ in 0..100 {
            rpm.saw(100);
        }
        rpm.saw(1);
        let after_one_small = rpm.get().unwrap_or_default();
        assert!(after_one_small > 80.0, "{after_one_small}");
        for _ in 0..100 {
            rpm.saw(1);
        }
        assert!(rpm.get().unwrap_or_default() < 2.0, "{:?}", rpm.get());
    }
}
