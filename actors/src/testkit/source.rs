//! An in-memory [`FakeSource`] (and its factory) over a [`FakeQueue`].

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;

use super::*;
use crate::ports::*;

/// The queue a [`FakeSource`] pulls from; push rows into it from the test.
#[derive(Debug, Default)]
pub struct FakeQueue {
    q: Mutex<VecDeque<FakeDelivery>>,
    notify: Notify,
    /// The next N pulls fail.
    pub fail_pulls: AtomicU32,
    /// The next N connects fail.
    pub fail_connects: AtomicU32,
    pub connects: AtomicU32,
    pub pending: AtomicU64,
}

impl FakeQueue {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    pub fn push(&self, rows: impl IntoIterator<Item = FakeDelivery>) {
        self.q.lock().unwrap().extend(rows);
        self.notify.notify_one();
    }

    pub fn len(&self) -> usize {
        self.q.lock().unwrap().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

pub struct FakeSource {
    queue: Arc<FakeQueue>,
}

impl Source for FakeSource {
    type Delivery = FakeDelivery;

    async fn pull(&mut self, max: usize) -> Result<Vec<FakeDelivery>, SourceError> {
        if take_one(&self.queue.fail_pulls) {
            return Err(SourceError("connection lost (scripted)".into()));
        }
        loop {
            {
                let mut q = self.queue.q.lock().unwrap();
                if !q.is_empty() {
                    let n = max.min(q.len());
                    return Ok(q.drain(..n).collect());
                }
            }
            let notified = self.queue.notify.notified();
            if tokio::time::timeout(Duration::from_millis(100), notified)
                .await
                .is_err()
            {
                return Ok(vec![]);
            }
        }
    }

    async fn pending(&mut self) -> Option<u64> {
        Some(self.queue.pending.load(Ordering::Relaxed))
    }
}

pub struct FakeSourceFactory {
    pub queue: Arc<FakeQueue>,
}

impl SourceFactory for FakeSourceFactory {
    type Source = FakeSource;

    async fn connect(&self, _partition: usize) -> Result<FakeSource, SourceError> {
        self.queue.connects.fetch_add(1, Ordering::Relaxed);
        if take_one(&self.queue.fail_connects) {
            return Err(SourceError("connection refused (scripted)".into()));
        }
        Ok(FakeSource {
            queue: self.queue.clone(),
        })
    }
}

/// One scripted failure taken from `left`, if any is left.
fn take_one(left: &AtomicU32) -> bool {
    left.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
        .is_ok()
}
