//! Keeping a discard-new stream's byte budget exact on servers that do not.
//!
//! nats-server before 2.10.5 (Debian's is 2.9.10) checks a publish against a
//! discard-new `max_bytes` with the payload's size, admits it, stores it with its
//! overhead (subject, headers, framing), and then prunes the OLDEST messages to get back
//! under the limit (nats-server issues #4771 and #4775): rows already acknowledged to
//! the publisher vanish from the queue. Measured here on 2.9.10: a 4 KiB work queue took
//! 103 publishes and kept 44. Sluice must never lose an accepted row, so on such a
//! server it gives the stream headroom above the configured budget and enforces the
//! budget itself, before publishing: a full queue still answers `QueueFull`, and the
//! server's own limit is never reached.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream;
use tokio::sync::Mutex;
use tokio::time::Instant;

use crate::nats::stream_fill::StreamFill;

/// How stale the stream's stored size may be before a publish refreshes it.
const REFRESH_EVERY: Duration = Duration::from_millis(200);
/// How long a refresh may take. The stream's info comes from its leader: while a NATS
/// cluster elects one, nothing answers, and every publish would wait behind the
/// refresh for the client's whole request timeout. Past this the publish is admitted
/// on the last size known (the server's own limit sits above the budget).
const REFRESH_TIMEOUT: Duration = Duration::from_secs(1);

pub use crate::nats::version::discard_new_is_exact;

/// The `max_bytes` to give the server for a configured budget: the budget itself where
/// the server enforces it exactly, else the budget with headroom the server never
/// reaches because Sluice refuses first.
pub fn server_max_bytes(budget: u64, exact: bool) -> u64 {
    if exact {
        budget
    } else {
        budget.saturating_add((budget / 4).max(1 << 20))
    }
}

/// A rough stored size of one message: payload, headers, subject and framing.
pub fn stored_size(subject: &str, payload: usize, headers: usize) -> u64 {
    (subject.len() + payload + headers + 64) as u64
}

/// Enforces a stream's byte budget on the publishing side.
///
/// The estimate of what the stream holds is: its stored bytes at the last refresh,
/// plus the bytes this process had confirmed stored since, plus every publish admitted
/// and not yet answered (whether or not the refresh already saw it: counted twice is
/// safe, forgotten is not). A publish JetStream answers as a duplicate (a client
/// retrying with the same `Idempotency-Key`, as the API advises) or does not store
/// gives its bytes back: otherwise clients retrying big requests against a nearly full
/// stream spend the whole budget on rows already stored and are refused for ever,
/// even with the stream empty.
pub struct BudgetGuard {
    js: jetstream::Context,
    stream: String,
    budget: u64,
    /// Whether the server enforces the budget exactly itself, once its version is known.
    exact: std::sync::OnceLock<bool>,
    /// Serializes admissions (and the refresh they may do).
    state: Mutex<GuardState>,
    /// Bytes admitted whose publish has not been answered yet.
    in_flight: AtomicU64,
    /// Bytes confirmed stored since the last refresh.
    stored_since: AtomicU64,
    /// Told of every refresh: a reading of the stream's fill it need not take itself.
    fill: Arc<StreamFill>,
}

struct GuardState {
    /// The stream's stored bytes at the last refresh.
    stored: u64,
    refreshed: Option<Instant>,
}

/// The stream is at its budget.
#[derive(Debug, PartialEq, Eq)]
pub struct OverBudget;

/// An admitted publish's bytes, held against the budget until its answer is known.
/// Dropped without [`BudgetPermit::stored`], the bytes go back to the budget.
pub struct BudgetPermit {
    guard: Arc<BudgetGuard>,
    bytes: u64,
}

impl BudgetPermit {
    /// JetStream stored the message (not a duplicate): its bytes now count as stored.
    pub fn stored(self) {
        self.guard
            .stored_since
            .fetch_add(self.bytes, Ordering::SeqCst);
        // `Drop` gives back the in-flight count.
    }
}

impl Drop for BudgetPermit {
    fn drop(&mut self) {
        let _ = self
            .guard
            .in_flight
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                Some(n.saturating_sub(self.bytes))
            });
    }
}

// === impl BudgetGuard ===

impl BudgetGuard {
    pub fn new(
        js: jetstream::Context,
        stream: impl Into<String>,
        budget: u64,
        fill: Arc<StreamFill>,
    ) -> Self {
        Self {
            js,
            stream: stream.into(),
            budget,
            exact: std::sync::OnceLock::new(),
            state: Mutex::new(GuardState {
                stored: 0,
                refreshed: None,
            }),
            in_flight: AtomicU64::new(0),
            stored_since: AtomicU64::new(0),
            fill,
        }
    }

    /// Admit `bytes` more into the stream; refuse when the budget would be exceeded.
    /// The permit (none where the server enforces the budget itself) is settled with
    /// the publish's answer. A stream whose size cannot be read (within
    /// [`REFRESH_TIMEOUT`]) is admitted: the publish itself will then fail or succeed
    /// on its own.
    pub async fn admit(self: &Arc<Self>, bytes: u64) -> Result<Option<BudgetPermit>, OverBudget> {
        if self.server_is_exact() {
            return Ok(None);
        }
        let mut state = self.state.lock().await;
        let stale = state
            .refreshed
            .is_none_or(|at| at.elapsed() >= REFRESH_EVERY);
        if stale {
            // Zeroed before asking: a publish confirmed meanwhile is counted twice (in
            // the answer and here), never forgotten.
            let since = self.stored_since.swap(0, Ordering::SeqCst);
            let fill_mark = self.fill.mark();
            match tokio::time::timeout(REFRESH_TIMEOUT, self.js.get_stream(&self.stream)).await {
                Ok(Ok(stream)) => {
                    state.stored = stream.cached_info().state.bytes;
                    state.refreshed = Some(Instant::now());
                    self.fill.observed(state.stored, fill_mark);
                }
                Ok(Err(_)) | Err(_) => {
                    self.stored_since.fetch_add(since, Ordering::SeqCst);
                }
            }
        }
        let estimate = state.stored
            + self.stored_since.load(Ordering::SeqCst)
            + self.in_flight.load(Ordering::SeqCst);
        if estimate + bytes > self.budget {
            return Err(OverBudget);
        }
        self.in_flight.fetch_add(bytes, Ordering::SeqCst);
        Ok(Some(BudgetPermit {
            guard: Arc::clone(self),
            bytes,
        }))
    }

    fn server_is_exact(&self) -> bool {
        if let Some(exact) = self.exact.get() {
            return *exact;
        }
        let version = self.js.client().server_info().version;
        if version.is_empty() {
            return false;
        }
        *self.exact.get_or_init(|| discard_new_is_exact(&version))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions() {
        assert!(!discard_new_is_exact("2.9.10"));
        assert!(!discard_new_is_exact("2.10.4"));
        assert!(discard_new_is_exact("2.10.5"));
        assert!(discard_new_is_exact("2.15.1"));
        assert!(discard_new_is_exact("v2.11.0-beta"));
        assert!(discard_new_is_exact("3.0.0"));
        assert!(!discard_new_is_exact(""));
    }

    #[test]
    fn headroom_only_where_needed() {
        assert_eq!(server_max_bytes(1 << 30, true), 1 << 30);
        assert_eq!(server_max_bytes(1 << 30, false), (1 << 30) + (1 << 28));
        assert_eq!(server_max_bytes(4096, false), 4096 + (1 << 20));
    }
}
