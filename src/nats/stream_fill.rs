//! How full a stream is, as a publisher last saw it, read without waiting: whether the
//! ingest stream holds a backlog (ClickHouse down or behind) decides whether the ingest
//! API compresses what it publishes (`[api] compress_above`, `super::encoding`).
//!
//! The estimate is the stream's stored bytes at the last reading plus the bytes this
//! process had stored since (counted as JetStream acknowledges them). A reading is
//! taken in the background when the last one is older than [`REFRESH_EVERY`] and
//! someone asks, so an idle API asks nothing of the server and a busy one never waits
//! for the answer; on a server whose byte budget Sluice enforces itself
//! (`super::workarounds::budget`), that guard's own readings count as readings here too.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream;
use tokio::time::Instant;

/// How old a reading may be before a question starts a new one.
const REFRESH_EVERY: Duration = Duration::from_millis(250);
/// How long a reading may take: during a NATS election nothing answers, and the last
/// estimate stands meanwhile.
const READ_TIMEOUT: Duration = Duration::from_secs(2);

/// A stream's fill, as seen from one process.
pub struct StreamFill {
    js: jetstream::Context,
    stream: String,
    estimate: Estimate,
    /// When the last reading was asked for, in ms after `epoch` (0: never).
    asked_ms: AtomicU64,
    epoch: Instant,
    /// A reading is under way.
    reading: AtomicBool,
}

impl StreamFill {
    pub fn new(js: jetstream::Context, stream: impl Into<String>) -> Self {
        Self {
            js,
            stream: stream.into(),
            estimate: Estimate::default(),
            asked_ms: AtomicU64::new(0),
            epoch: Instant::now(),
            reading: AtomicBool::new(false),
        }
    }

    /// The stream's bytes as estimated now; starts a new reading when this one is stale
    /// (its answer counts from the next question on).
    pub fn bytes(self: &Arc<Self>) -> u64 {
        let now_ms = self.now_ms();
        let asked = self.asked_ms.load(Ordering::Relaxed);
        let stale = asked == 0 || now_ms.saturating_sub(asked) >= REFRESH_EVERY.as_millis() as u64;
        if stale && !self.reading.swap(true, Ordering::AcqRel) {
            self.start_reading(now_ms);
        }
        self.estimate.bytes()
    }

    /// JetStream stored `bytes` more for this process.
    pub fn stored(&self, bytes: u64) {
        self.estimate.since.fetch_add(bytes, Ordering::Relaxed);
    }

    /// What this process stored since the last reading, taken as a reading is asked
    /// for: [`StreamFill::observed`] takes it off the count with the answer.
    pub(super) fn mark(&self) -> u64 {
        self.estimate.since.load(Ordering::Relaxed)
    }

    /// A reading (this one's, or the byte budget's guard's, asked at `mark`): the
    /// stream held `bytes`.
    pub(super) fn observed(&self, bytes: u64, mark: u64) {
        self.estimate.observed(bytes, mark);
        self.asked_ms.store(self.now_ms(), Ordering::Relaxed);
    }

    fn start_reading(self: &Arc<Self>, now_ms: u64) {
        self.asked_ms.store(now_ms.max(1), Ordering::Relaxed);
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            self.reading.store(false, Ordering::Release);
            return;
        };
        let fill = Arc::clone(self);
        runtime.spawn(async move {
            let mark = fill.mark();
            let info = tokio::time::timeout(READ_TIMEOUT, fill.js.get_stream(&fill.stream)).await;
            if let Ok(Ok(stream)) = info {
                fill.estimate
                    .observed(stream.cached_info().state.bytes, mark);
            }
            fill.reading.store(false, Ordering::Release);
        });
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis())
            .unwrap_or(u64::MAX)
            .saturating_add(1)
    }
}

/// The stream's bytes at the last reading, and what this process stored since that
/// reading was asked for. What is stored while a reading is under way counts until the
/// answer comes (then in the answer too, perhaps twice): the estimate never dips below
/// what the stream holds because a reading was asked.
#[derive(Default)]
struct Estimate {
    read: AtomicU64,
    since: AtomicU64,
}

impl Estimate {
    fn bytes(&self) -> u64 {
        self.read
            .load(Ordering::Relaxed)
            .saturating_add(self.since.load(Ordering::Relaxed))
    }

    /// A reading asked when `since` was `mark` answered `bytes`.
    fn observed(&self, bytes: u64, mark: u64) {
        self.read.store(bytes, Ordering::Relaxed);
        // Saturating: two readings under way at once may both take off the same bytes.
        let _ = self
            .since
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |s| {
                Some(s.saturating_sub(mark))
            });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reading_under_way_takes_nothing_off_the_estimate() {
        let e = Estimate::default();
        e.since.fetch_add(300, Ordering::Relaxed);
        // A reading is asked (its mark: 300 stored since the last), then 50 more are
        // stored before it answers: still counted.
        let mark = e.since.load(Ordering::Relaxed);
        e.since.fetch_add(50, Ordering::Relaxed);
        assert_eq!(e.bytes(), 350);
        // The answer holds the 300 (and perhaps the 50): they are not lost either way.
        e.observed(300, mark);
        assert_eq!(e.bytes(), 350);
        // The consumer drained the stream: the next reading says so.
        e.observed(0, e.since.load(Ordering::Relaxed));
        assert_eq!(e.bytes(), 0);
        // A mark above what is left (two readings took the same bytes off): zero, no wrap.
        e.observed(10, 300);
        assert_eq!(e.bytes(), 10);
    }
}
