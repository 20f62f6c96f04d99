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
    now >= d.alive_since() + ack_wait - ack_wait / 10
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

    async fn touch<D: Delivery>(&mut self, batch: &Batch<D>) {
        let now = Instant::now();
        for d in batch.deliveries() {
            if !lease_ran_out(d, self.ack_wait, now) {
                let _ = d.progress().await;
            }
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
