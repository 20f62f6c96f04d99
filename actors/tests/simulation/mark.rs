//! A number that only grows, and waiting for it to pass a mark: what `tokio::sync::watch`
//! would do, but waking its waiters in a fixed order. (`watch` parks each waiter on one
//! of several `Notify`s picked by the runtime's random source, so the order in which
//! two waiters wake, and so the run, would differ between two plays of one seed.)

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::Notify;

#[derive(Default)]
pub struct Mark {
    value: AtomicU64,
    moved: Notify,
}

impl Mark {
    pub fn get(&self) -> u64 {
        self.value.load(Ordering::Relaxed)
    }

    pub fn set(&self, value: u64) {
        self.value.store(value, Ordering::Relaxed);
        self.moved.notify_waiters();
    }

    /// Until the value is past `seen` (it moved since).
    pub async fn moved_from(&self, seen: u64) {
        self.reached(seen + 1).await;
    }

    /// Until the value is at least `mark`.
    pub async fn reached(&self, mark: u64) {
        loop {
            let moved = self.moved.notified();
            if self.get() >= mark {
                return;
            }
            moved.await;
        }
    }

    /// [`Mark::reached`] within `within`: whether it did.
    pub async fn reached_within(&self, mark: u64, within: Duration) -> bool {
        tokio::time::timeout(within, self.reached(mark))
            .await
            .is_ok()
    }
}
