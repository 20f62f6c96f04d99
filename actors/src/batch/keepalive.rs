//! Rows held longer than about `ack_wait / 2` (a long bisection, a slow insert) get
//! `Delivery::progress()`, so JetStream does not redeliver them while still in hand.
//!
//! A row whose `ack_wait` ran out before a progress reached JetStream (this process
//! stood still: SIGSTOP, a stalled runtime) is no longer in hand: JetStream may have
//! delivered it again, perhaps to another instance. It gets no progress (which would
//! only make it look alive here) and must not start a batch of its own: see
//! [`lease_ran_out`].

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

use crate::batch::Batch;
use crate::ports::Delivery;

/// Whether JetStream may have given up on the row: `ack_wait`, less a tenth for the time
/// a progress takes to arrive, has passed since it last heard of it.
pub fn lease_ran_out<D: Delivery>(d: &D, ack_wait: Duration, now: Instant) -> bool {
    ran_out(d.alive_since(), ack_wait, now)
}

/// Whether the lease of any of these rows ran out (see [`lease_ran_out`]). The row
/// heard of longest ago decides, so a batch's check is one deadline and a comparison
/// per row, not a deadline per row (each an `Instant` sum with its overflow checks).
pub fn any_lease_ran_out<'a, D: Delivery + 'a>(
    deliveries: impl IntoIterator<Item = &'a D>,
    ack_wait: Duration,
    now: Instant,
) -> bool {
    deliveries
        .into_iter()
        .map(Delivery::alive_since)
        .min()
        .is_some_and(|oldest| ran_out(oldest, ack_wait, now))
}

fn ran_out(alive_since: Instant, ack_wait: Duration, now: Instant) -> bool {
    now >= alive_since + ack_wait - ack_wait / 10
}

#[derive(Debug)]
pub struct Keepalive {
    ack_wait: Duration,
    every: Duration,
    next: Instant,
}

impl Keepalive {
    /// Rows held since `held_since` (when the oldest arrived).
    pub fn new(ack_wait: Duration, held_since: Instant) -> Self {
        let every = (ack_wait / 2).max(Duration::from_millis(100));
        Self {
            ack_wait,
            every,
            next: held_since + every,
        }
    }

    /// Tell the queue about every row still held, if it is time.
    pub async fn tick<D: Delivery>(&mut self, batch: &Batch<D>) {
        if Instant::now() >= self.next {
            self.touch(batch).await;
        }
    }

    /// One round of progress, bounded by `every`: a progress is a publish, and a NATS
    /// client whose outbound queue is full (its server frozen, a reconnect under way)
    /// makes a publish wait for as long as that lasts. `run` polls the insert only
    /// between rounds, so an unbounded round would hold the flight, and its rows, with
    /// it. A round cut short is not worse than one not sent: the next comes `every`
    /// later, and rows whose lease runs out meanwhile are handled as such.
    async fn touch<D: Delivery>(&mut self, batch: &Batch<D>) {
        let now = Instant::now();
        let round = async {
            for d in batch.deliveries() {
                if !lease_ran_out(d, self.ack_wait, now) {
                    let _ = d.progress().await;
                }
            }
        };
        if tokio::time::timeout(self.every, round).await.is_err() {
            tracing::debug!(
                within = ?self.every,
                "progress for the rows held could not all be sent (the NATS client's queue is full): the insert goes on"
            );
        }
        self.next = Instant::now() + self.every;
    }

    /// Await `fut`, sending progress for the rows still held every `ack_wait / 2`.
    pub async fn run<F: Future, D: Delivery>(&mut self, fut: F, batch: &Batch<D>) -> F::Output {
        self.tick(batch).await;
        tokio::pin!(fut);
        loop {
            tokio::select! {
                biased;
                out = &mut fut => return out,
                _ = tokio::time::sleep_until(self.next) => self.touch(batch).await,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;
    use std::sync::Arc;

    use super::*;
    use crate::testkit::{Event, Journal};

    /// A progress that never completes (the NATS client's queue full) does not hold the
    /// insert it runs beside: the insert's answer is taken within one round's bound.
    #[tokio::test(start_paused = true)]
    async fn a_progress_that_cannot_be_sent_does_not_hold_the_insert() {
        let journal = Journal::new();
        journal.progress_hangs.store(true, Ordering::Relaxed);
        let subject: Arc<str> = Arc::from("ingest.acme.events");
        let ack_wait = Duration::from_secs(10);
        let held_since = Instant::now();
        let batch = Batch::new(
            (0..3)
                .map(|i| journal.delivery(&subject, format!("{{\"id\":{i}}}")))
                .collect(),
            held_since,
        );
        let mut keepalive = Keepalive::new(ack_wait, held_since);
        // An insert answered after 12 s: two rounds of progress fall due meanwhile.
        let insert = tokio::time::sleep(Duration::from_secs(12));
        let started = Instant::now();
        let answered =
            tokio::time::timeout(Duration::from_secs(60), keepalive.run(insert, &batch)).await;
        assert!(answered.is_ok(), "the insert was held by its keepalive");
        // The 12 s of the insert, and at most one round's bound (5 s) past it.
        assert!(
            started.elapsed() <= Duration::from_secs(17),
            "{:?}",
            started.elapsed()
        );
        assert!(!journal.events().iter().any(|(_, e)| *e == Event::Progress));
    }

    /// Progress that can be sent goes out every `ack_wait / 2` while the insert runs.
    #[tokio::test(start_paused = true)]
    async fn rows_held_through_a_long_insert_get_progress_every_half_ack_wait() {
        let journal = Journal::new();
        let subject: Arc<str> = Arc::from("ingest.acme.events");
        let held_since = Instant::now();
        let batch = Batch::new(vec![journal.delivery(&subject, "{}")], held_since);
        let mut keepalive = Keepalive::new(Duration::from_secs(10), held_since);
        keepalive
            .run(tokio::time::sleep(Duration::from_secs(12)), &batch)
            .await;
        let progress = journal
            .events()
            .iter()
            .filter(|(_, e)| *e == Event::Progress)
            .count();
        assert_eq!(progress, 2, "at 5 s and 10 s");
    }
}
