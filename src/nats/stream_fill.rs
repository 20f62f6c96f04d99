//! How full a stream is, as a publisher last saw it, read without waiting: whether the
//! ingest stream holds a backlog (ClickHouse down or behind) decides whether the ingest
//! API compresses what it publishes (`[api] compress_above`, `super::encoding`).
//!
//! The estimate is the stream's stored bytes at the last reading plus the bytes this
//! process had stored since (counted as JetStream acknowledges them). A reading is
//! taken in the background when the last one is older than [`REFRESH_EVERY`] and
//! someone asks, so an idle API asks nothing of the server and a busy one never waits
//! for the answer; on a server whose byte budget Sluice enforces itself
//! (`super::budget`), that guard's own readings count as readings here too.

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
    /// The stream's stored bytes at the last reading.
    read: AtomicU64,
    /// Bytes this process had stored since that reading was asked for.
    since: AtomicU64,
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
            read: AtomicU64::new(0),
            since: AtomicU64::new(0),
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
        self.read
            .load(Ordering::Relaxed)
            .saturating_add(self.since.load(Ordering::Relaxed))
    }

    /// JetStream stored `bytes` more for this process.
    pub fn stored(&self, bytes: u64) {
        self.since.fetch_add(bytes, Ordering::Relaxed);
    }

    /// A reading taken elsewhere (the byte budget's guard, which zeroed the count with
    /// [`StreamFill::restart_count`] as it asked): the stream held `bytes`.
    pub(super) fn observed(&self, bytes: u64) {
        self.read.store(bytes, Ordering::Relaxed);
        self.asked_ms.store(self.now_ms(), Ordering::Relaxed);
    }

    /// Zeroes what was stored since the last reading, as a reading is asked for:
    /// returned, to be given back if the reading fails. Stored while the reading is
    /// under way is counted twice (in the answer and here), never forgotten.
    pub(super) fn restart_count(&self) -> u64 {
        self.since.swap(0, Ordering::Relaxed)
    }

    /// A reading failed: what was zeroed for it counts again.
    pub(super) fn reading_failed(&self, zeroed: u64) {
        self.since.fetch_add(zeroed, Ordering::Relaxed);
    }

    fn start_reading(self: &Arc<Self>, now_ms: u64) {
        self.asked_ms.store(now_ms.max(1), Ordering::Relaxed);
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            self.reading.store(false, Ordering::Release);
            return;
        };
        let fill = Arc::clone(self);
        runtime.spawn(async move {
            let zeroed = fill.restart_count();
            let info = tokio::time::timeout(READ_TIMEOUT, fill.js.get_stream(&fill.stream)).await;
            match info {
                Ok(Ok(stream)) => fill
                    .read
                    .store(stream.cached_info().state.bytes, Ordering::Relaxed),
                Ok(Err(_)) | Err(_) => fill.reading_failed(zeroed),
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
