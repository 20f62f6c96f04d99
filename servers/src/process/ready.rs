//! Waiting for a started server to answer, the one way every server here does it.
//!
//! A server that dies during startup (a bad config, a port taken) would otherwise be
//! polled until the deadline: the child's exit is checked on every round, so the error
//! comes at once and carries the log tail that says why.

use std::future::Future;
use std::time::Duration;

use anyhow::{anyhow, bail, Result};
use tokio::time::Instant;

use super::{ManagedProcess, ERROR_LOG_LINES};

/// How often a readiness check is repeated.
const READY_POLL: Duration = Duration::from_millis(20);

// === impl ManagedProcess ===

impl ManagedProcess {
    /// Repeats `check` until it succeeds. Fails at once if the child exits meanwhile,
    /// or after `deadline` with the last check's error; both errors carry the log tail.
    /// `what` names the server in them (`nats-server 2.9.10`).
    pub async fn wait_ready<F, Fut>(
        &mut self,
        what: &str,
        deadline: Duration,
        mut check: F,
    ) -> Result<()>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<()>>,
    {
        let end = Instant::now() + deadline;
        let mut last_error = anyhow!("no check finished");
        loop {
            if let Some(status) = self.exit_status() {
                bail!(
                    "{what} exited during startup with {status}\n{}",
                    self.log_tail(ERROR_LOG_LINES)
                );
            }
            match check().await {
                Ok(()) => return Ok(()),
                Err(error) => last_error = error,
            }
            if Instant::now() >= end {
                bail!(
                    "{what} was not ready within {deadline:?}: {last_error:#}\n{}",
                    self.log_tail(ERROR_LOG_LINES)
                );
            }
            tokio::time::sleep(READY_POLL).await;
        }
    }
}
