//! Starting a server and waiting for it to answer, the one way every server here does
//! it.
//!
//! A server that dies during startup (a bad config, a port taken) would otherwise be
//! polled until the deadline: the child's exit is checked on every round, so the error
//! comes at once and carries the log tail that says why. Ports are picked free but
//! bound only by the child, so another process can take one in between: a child that
//! says so is started again on fresh ports.

use std::future::Future;
use std::path::Path;
use std::time::Duration;

use anyhow::{anyhow, bail, Result};
use tokio::time::Instant;

use super::{ManagedProcess, ProcessSpec, ERROR_LOG_LINES};

/// How often a readiness check is repeated.
const READY_POLL: Duration = Duration::from_millis(20);

/// Starts (with fresh ports each time) when the child reports its port taken.
const PORT_ATTEMPTS: usize = 3;

/// Starts the child `prepare` describes, its logs in `log_dir`, and waits until `check`
/// passes (see [`ManagedProcess::wait_ready`]). `prepare` picks the ports, writes
/// whatever configuration names them, and returns them beside the spec; `check` is
/// given them. A child whose logs say a port was taken is killed and prepared again,
/// up to three times.
pub async fn start_ready<P, F, C, Fut>(
    what: &str,
    log_dir: &Path,
    deadline: Duration,
    mut prepare: F,
    mut check: C,
) -> Result<(ManagedProcess, P)>
where
    F: FnMut() -> Result<(ProcessSpec, P)>,
    C: FnMut(&P) -> Fut,
    Fut: Future<Output = Result<()>>,
{
    let mut last_error = anyhow!("{what} was not started");
    for _ in 0..PORT_ATTEMPTS {
        let (spec, ports) = prepare()?;
        let mut process = ManagedProcess::start(spec, log_dir)?;
        match process.wait_ready(what, deadline, || check(&ports)).await {
            Ok(()) => return Ok((process, ports)),
            Err(error) if process.port_taken() => {
                let _ = process.kill9().await;
                tracing::warn!("{what}: a port was taken; starting again on new ports");
                last_error = error;
            }
            Err(error) => return Err(error),
        }
    }
    Err(last_error)
}

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

    /// Whether the logs say a port was taken (nats-server writes it in lower case).
    fn port_taken(&self) -> bool {
        ["Address already in use", "address already in use"]
            .into_iter()
            .any(|needle| self.logs_contain(needle))
    }
}
