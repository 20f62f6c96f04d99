//! Rows held longer than about `ack_wait / 2` (a long bisection, a slow insert) get
//! `Delivery::progress()`, so JetStream does not redeliver them while still in hand.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

use crate::batch::Batch;
use crate::ports::Delivery;

#[derive(Debug)]
pub struct Keepalive {
    every: Duration,
    next: Instant,
}

impl Keepalive {
    /// Rows held since `held_since` (when the oldest arrived).
    pub fn new(ack_wait: Duration, held_since: Instant) -> Self {
        let every = (ack_wait / 2).max(Duration::from_millis(100));
        Self {
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
        for d in batch.deliveries() {
            let _ = d.progress().await;
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
