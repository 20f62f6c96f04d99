//! What the ingest requests in progress may hold together (`[api] ingest_memory`).
//!
//! One request is bounded by `max_request_bytes` (its body, and about a copy of its
//! rows while they are published), but without a bound on the whole, many large
//! requests at once take as much memory as the listener has connections. So a request
//! reserves room for twice its body before the body is read: what `Content-Length`
//! declares, or `max_request_bytes` when it declares nothing (chunked). Past the budget
//! a request waits a moment for room, its body meanwhile in the kernel's buffers; then
//! it is answered 503 with `Retry-After`, nothing read and nothing taken.

use std::time::Duration;

use axum::http::{header, HeaderMap};
use tokio::sync::{Semaphore, SemaphorePermit};

use crate::telemetry::metrics as m;

/// The budget's unit: permits count KiB, so a budget of any sensible size fits the
/// semaphore's `u32` per acquisition.
const UNIT: usize = 1024;

/// The longest a request waits for room (less when the body timeout is shorter).
const MAX_WAIT: Duration = Duration::from_secs(5);

pub struct IngestMemory {
    room: Semaphore,
    /// The whole budget, in units: no request reserves more (the largest one may run
    /// alone).
    total: u32,
    max_request_bytes: usize,
    wait: Duration,
}

// === impl IngestMemory ===

impl IngestMemory {
    /// A budget of `total` bytes for requests of at most `max_request_bytes`, read
    /// within `body_timeout`.
    pub fn new(total: usize, max_request_bytes: usize, body_timeout: Duration) -> Self {
        let total = u32::try_from(total.div_ceil(UNIT)).unwrap_or(u32::MAX >> 3);
        Self {
            room: Semaphore::new(total as usize),
            total,
            max_request_bytes,
            wait: MAX_WAIT.min(body_timeout / 2),
        }
    }

    /// Room for a request with these headers, once there is some (held until the
    /// `Room` is dropped); `None` when none came within the wait.
    pub async fn reserve(&self, headers: &HeaderMap) -> Option<Room<'_>> {
        let need = self.units_for(headers);
        let permit = tokio::time::timeout(self.wait, self.room.acquire_many(need))
            .await
            .ok()?
            .ok()?;
        self.publish();
        Some(Room {
            permit: Some(permit),
            memory: self,
        })
    }

    /// The reserved bytes, as a gauge.
    fn publish(&self) {
        let reserved = (self.total as usize - self.room.available_permits()) * UNIT;
        metrics::gauge!(m::INGEST_MEMORY_RESERVED).set(reserved as f64);
    }

    /// How long a request waits for room before its 503.
    pub fn wait(&self) -> Duration {
        self.wait
    }

    fn units_for(&self, headers: &HeaderMap) -> u32 {
        let declared = headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<usize>().ok())
            .unwrap_or(self.max_request_bytes)
            .min(self.max_request_bytes);
        let units = declared.saturating_mul(2).div_ceil(UNIT).max(1);
        u32::try_from(units).unwrap_or(u32::MAX).min(self.total)
    }
}

/// A request's share of the budget, given back when it is dropped.
pub struct Room<'a> {
    permit: Option<SemaphorePermit<'a>>,
    memory: &'a IngestMemory,
}

impl Drop for Room<'_> {
    fn drop(&mut self) {
        drop(self.permit.take());
        self.memory.publish();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn with_length(n: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::CONTENT_LENGTH, HeaderValue::from_str(n).unwrap());
        h
    }

    #[test]
    fn a_request_reserves_twice_its_declared_body_or_the_largest_one() {
        let memory = IngestMemory::new(64 << 20, 10 << 20, Duration::from_secs(30));
        assert_eq!(memory.units_for(&with_length("1024")), 2);
        assert_eq!(memory.units_for(&with_length("1")), 1);
        // No Content-Length (chunked), or a lie past the limit: the largest body.
        assert_eq!(memory.units_for(&HeaderMap::new()), 20 << 10);
        assert_eq!(memory.units_for(&with_length("999999999999")), 20 << 10);
        assert_eq!(memory.units_for(&with_length("nonsense")), 20 << 10);
        // Never more than the whole budget: the largest request may run alone.
        let small = IngestMemory::new(12 << 20, 10 << 20, Duration::from_secs(30));
        assert_eq!(small.units_for(&HeaderMap::new()), 12 << 10);
        assert_eq!(small.wait(), MAX_WAIT);
        let quick = IngestMemory::new(12 << 20, 10 << 20, Duration::from_secs(4));
        assert_eq!(quick.wait(), Duration::from_secs(2));
    }

    #[tokio::test(start_paused = true)]
    async fn past_the_budget_a_request_waits_then_is_turned_away() {
        let memory = IngestMemory::new(4 << 20, 2 << 20, Duration::from_secs(30));
        let first = memory.reserve(&with_length("2097152")).await;
        assert!(first.is_some(), "the whole budget for the first");
        let started = tokio::time::Instant::now();
        assert!(memory.reserve(&with_length("10")).await.is_none());
        assert_eq!(started.elapsed(), MAX_WAIT);
        drop(first);
        assert!(memory.reserve(&with_length("10")).await.is_some());
    }
}
