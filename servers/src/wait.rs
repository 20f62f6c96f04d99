//! Polling with deadlines.
//!
//! Tests never sleep and hope: they poll a condition until it holds or a deadline
//! passes, and a timeout says what was awaited and what the last attempt saw. Every
//! attempt is itself cut off at the deadline, so one hanging check cannot outlive it.

use std::future::Future;
use std::time::Duration;

use anyhow::{anyhow, Result};
use tokio::time::{timeout_at, Instant};

/// Polls `check` every `interval` until it answers `true`, or fails after `deadline`.
///
/// `what` names the condition in the timeout error ("table has 3 rows").
pub async fn wait_until<F, Fut>(
    what: &str,
    deadline: Duration,
    interval: Duration,
    mut check: F,
) -> Result<()>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    wait_for(what, deadline, interval, || {
        let attempt = check();
        async move {
            if attempt.await {
                Ok(())
            } else {
                Err(anyhow!("the condition was false"))
            }
        }
    })
    .await
}

/// Polls `attempt` every `interval` until it succeeds, and returns its value; fails
/// after `deadline` with the last attempt's error.
pub async fn wait_for<T, F, Fut>(
    what: &str,
    deadline: Duration,
    interval: Duration,
    mut attempt: F,
) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T>>,
{
    let started = Instant::now();
    let end = started + deadline;
    let mut attempts: u64 = 0;
    let mut last_error = anyhow!("no attempt finished");
    loop {
        attempts += 1;
        match timeout_at(end, attempt()).await {
            Ok(Ok(value)) => return Ok(value),
            Ok(Err(error)) => last_error = error,
            Err(_elapsed) => last_error = anyhow!("the last attempt was still running"),
        }
        let next = Instant::now() + interval;
        if next >= end {
            return Err(anyhow!(
                "timed out after {:.1?} waiting for {what} ({attempts} attempts); last: {last_error:#}",
                started.elapsed()
            ));
        }
        tokio::time::sleep_until(next).await;
    }
}
