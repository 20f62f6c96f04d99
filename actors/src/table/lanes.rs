//! A table's buffered messages in lanes: one, or, when the table places its rows by a
//! `shard_key` on a target of several shards, one per shard. A batch is taken from one
//! lane, so it holds the rows of one shard; a shard whose replicas are all down holds
//! back its own lane only, while the other shards' batches keep flying.
//!
//! A message whose rows belong to several shards goes into no lane: it is split into
//! one message per shard ([`Placed::spanning`], [`crate::ports::Delivery::split`]), and
//! each part comes back into its own lane.

use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;

use super::buffer::{weigh, Buffer, Trigger};
use crate::placement::{MessageShards, ShardKey};
use crate::ports::Delivery;
use crate::settings::TableSettings;

pub struct Lanes<D> {
    lanes: Vec<Buffer<D>>,
    /// Set only with more than one lane: a key on a target of one shard places nothing.
    key: Option<ShardKey>,
}

/// Messages sorted into lanes.
pub struct Placed<D> {
    /// By lane: the messages whose rows all go there.
    pub by_lane: Vec<Vec<D>>,
    /// Messages whose rows belong to several shards, with their parts (one per shard).
    pub spanning: Vec<(D, Vec<(usize, Bytes)>)>,
}

impl<D: Delivery> Lanes<D> {
    /// Lanes for a table placed by `key` (if any) on a target of `shards` shards.
    pub fn new(key: Option<ShardKey>, shards: usize) -> Self {
        let key = key.filter(|_| shards > 1);
        let n = if key.is_some() { shards } else { 1 };
        Self {
            lanes: (0..n).map(|_| Buffer::default()).collect(),
            key,
        }
    }

    /// The key placing the table's rows, when there is more than one shard to place
    /// them on.
    pub fn key(&self) -> Option<&ShardKey> {
        self.key.as_ref()
    }

    /// The shard a lane's batches go to (`None`: any, a table without a shard key).
    pub fn shard_of(&self, lane: usize) -> Option<usize> {
        self.key.as_ref().map(|_| lane)
    }

    /// Sort `messages` into lanes.
    pub fn place(&self, messages: Vec<D>) -> Placed<D> {
        let mut by_lane: Vec<Vec<D>> = (0..self.lanes.len()).map(|_| Vec::new()).collect();
        let mut spanning = Vec::new();
        let Some(key) = &self.key else {
            by_lane[0] = messages;
            return Placed { by_lane, spanning };
        };
        for d in messages {
            match key.shards_of(d.payload(), self.lanes.len()) {
                MessageShards::One(lane) => by_lane[lane].push(d),
                MessageShards::Many(parts) => spanning.push((d, parts)),
            }
        }
        Placed { by_lane, spanning }
    }

    /// Buffer `messages` (all of `lane`, see [`Lanes::place`]).
    pub fn push(&mut self, lane: usize, messages: Vec<D>, now: Instant) {
        let weight = weigh(&messages);
        if let Some(buffer) = self.lanes.get_mut(lane) {
            buffer.push(messages, weight, now);
        }
    }

    /// Buffer what [`Lanes::place`] sorted; `weight`: of all of it, known already. One
    /// lane (no key: every message is in it) takes it as it is, its messages not
    /// counted again; the lanes of a key weigh each their own.
    pub fn push_placed(&mut self, by_lane: Vec<Vec<D>>, weight: (usize, usize), now: Instant) {
        if self.lanes.len() == 1 {
            if let (Some(buffer), Some(messages)) =
                (self.lanes.first_mut(), by_lane.into_iter().next())
            {
                buffer.push(messages, weight, now);
            }
            return;
        }
        for (lane, messages) in by_lane.into_iter().enumerate() {
            self.push(lane, messages, now);
        }
    }

    /// Rows buffered, in every lane.
    pub fn len(&self) -> usize {
        self.lanes.iter().map(Buffer::len).sum()
    }

    pub fn bytes(&self) -> usize {
        self.lanes.iter().map(Buffer::bytes).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.lanes.iter().all(Buffer::is_empty)
    }

    /// Since when the oldest buffered message is held, in any lane.
    pub fn oldest(&self) -> Option<Instant> {
        self.lanes.iter().filter_map(Buffer::oldest).min()
    }

    /// When the age trigger fires first, in any lane.
    pub fn age_deadline(&self, s: &TableSettings) -> Option<Instant> {
        self.lanes.iter().filter_map(|b| b.age_deadline(s)).min()
    }

    pub fn age(&self, now: Instant) -> Duration {
        self.oldest()
            .map(|o| now.saturating_duration_since(o))
            .unwrap_or_default()
    }

    /// The lane whose batch is due now: one full (rows, bytes) first, else the one
    /// whose oldest message is oldest among those due by age.
    pub fn due(&self, s: &TableSettings, now: Instant) -> Option<usize> {
        let due: Vec<(usize, Trigger)> = self
            .lanes
            .iter()
            .enumerate()
            .filter_map(|(lane, b)| b.due(s, now).map(|t| (lane, t)))
            .collect();
        due.iter()
            .find(|(_, t)| *t != Trigger::Age)
            .map(|(lane, _)| *lane)
            .or_else(|| {
                due.iter()
                    .min_by_key(|(lane, _)| self.lanes[*lane].oldest())
                    .map(|(lane, _)| *lane)
            })
    }

    /// The lane holding the oldest message (a flush that takes everything, due or not).
    pub fn oldest_lane(&self) -> Option<usize> {
        self.lanes
            .iter()
            .enumerate()
            .filter_map(|(lane, b)| b.oldest().map(|o| (lane, o)))
            .min_by_key(|(_, o)| *o)
            .map(|(lane, _)| lane)
    }

    pub fn lane_is_empty(&self, lane: usize) -> bool {
        self.lanes.get(lane).is_none_or(Buffer::is_empty)
    }

    /// One batch from `lane` (see [`Buffer::take`]).
    pub fn take(
        &mut self,
        lane: usize,
        max_rows: usize,
        max_bytes: usize,
    ) -> (Vec<D>, usize, Instant) {
        match self.lanes.get_mut(lane) {
            Some(buffer) => buffer.take(max_rows, max_bytes),
            None => (Vec::new(), 0, Instant::now()),
        }
    }

    pub fn iter(&self) -> impl Iterator<Item = &D> {
        self.lanes.iter().flat_map(Buffer::iter)
    }

    pub fn take_all(&mut self) -> Vec<D> {
        self.lanes.iter_mut().flat_map(Buffer::take_all).collect()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::testkit::{FakeDelivery, Journal};

    fn settings(rows: usize, age_ms: u64) -> TableSettings {
        TableSettings {
            batch_rows: rows,
            batch_age: Duration::from_millis(age_ms),
            ..Default::default()
        }
    }

    fn message(journal: &Arc<Journal>, users: &[&str]) -> FakeDelivery {
        let subject: Arc<str> = Arc::from("ingest.a.b");
        let rows: Vec<String> = users
            .iter()
            .map(|u| format!(r#"{{"user":"{u}"}}"#))
            .collect();
        journal.delivery(&subject, rows.join("\n"))
    }

    /// The tests' key, on a target of 2 shards.
    fn key() -> ShardKey {
        ShardKey::new("user")
    }

    /// The lane (shard of 2) of `user`'s rows.
    fn lane_of(user: &str) -> usize {
        key().shard_of_row(format!(r#"{{"user":"{user}"}}"#).as_bytes(), 2)
    }

    /// Two users that go to different shards of 2.
    fn apart() -> (String, String) {
        let first = "u0".to_string();
        let other = (1..100)
            .map(|i| format!("u{i}"))
            .find(|u| lane_of(u) != lane_of(&first))
            .expect("some user hashes to the other shard");
        (first, other)
    }

    #[test]
    fn without_a_key_or_with_one_shard_there_is_one_lane_for_any_shard() {
        let journal = Journal::new();
        for lanes in [
            Lanes::<FakeDelivery>::new(None, 3),
            Lanes::new(Some(key()), 1),
        ] {
            assert_eq!(lanes.shard_of(0), None);
            let placed = lanes.place(vec![message(&journal, &["a", "b", "c"])]);
            assert_eq!((placed.by_lane.len(), placed.spanning.len()), (1, 0));
            assert_eq!(placed.by_lane[0].len(), 1);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn messages_go_to_their_shards_lane_and_a_spanning_one_is_split() {
        let journal = Journal::new();
        let (a, b) = apart();
        let mut lanes = Lanes::new(Some(key()), 2);
        let placed = lanes.place(vec![
            message(&journal, &[&a, &a]),
            message(&journal, &[&b]),
            message(&journal, &[&a, &b, &a]),
        ]);
        assert_eq!(placed.by_lane[lane_of(&a)].len(), 1);
        assert_eq!(placed.by_lane[lane_of(&b)].len(), 1);
        assert_eq!(placed.spanning.len(), 1);
        let (_, parts) = &placed.spanning[0];
        let rows = |u: &str| format!("{{\"user\":\"{u}\"}}\n");
        let mut expected = vec![
            (lane_of(&a), Bytes::from(rows(&a).repeat(2))),
            (lane_of(&b), Bytes::from(rows(&b))),
        ];
        expected.sort();
        assert_eq!(parts, &expected);
        // Settled as the table would: acked after its parts are published.
        for (d, parts) in placed.spanning {
            d.split(parts).await.expect("the fake always splits");
        }
        let now = Instant::now();
        for (lane, messages) in placed.by_lane.into_iter().enumerate() {
            lanes.push(lane, messages, now);
        }
        assert_eq!((lanes.len(), lanes.shard_of(1)), (3, Some(1)));
        for d in lanes.take_all() {
            d.ack().await.expect("acked");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_lane_is_due_first_then_the_oldest_by_age() {
        let journal = Journal::new();
        let (a, b) = apart();
        let mut lanes = Lanes::new(Some(key()), 2);
        let s = settings(3, 1000);
        let start = Instant::now();
        lanes.push(lane_of(&a), vec![message(&journal, &[&a])], start);
        lanes.push(
            lane_of(&b),
            vec![message(&journal, &[&b, &b, &b])],
            start + Duration::from_millis(10),
        );
        let now = start + Duration::from_millis(10);
        assert_eq!(
            lanes.due(&s, now),
            Some(lane_of(&b)),
            "three rows fill a batch"
        );
        let (batch, _, _) = lanes.take(lane_of(&b), 3, 1 << 20);
        assert_eq!(batch.len(), 1);
        assert_eq!(lanes.due(&s, now), None, "one row, not yet a second old");
        let later = start + Duration::from_secs(1);
        assert_eq!(lanes.due(&s, later), Some(lane_of(&a)));
        assert_eq!(lanes.oldest_lane(), Some(lane_of(&a)));
        assert_eq!(lanes.age_deadline(&s), Some(start + Duration::from_secs(1)));
        let mut rest = lanes.take_all();
        rest.extend(batch);
        for d in rest {
            d.ack().await.expect("acked");
        }
        assert!(lanes.is_empty() && lanes.lane_is_empty(0) && lanes.lane_is_empty(1));
    }
}
