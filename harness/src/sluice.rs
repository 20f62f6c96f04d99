//! Running the sluice binary (or any other program under test) as a child.
//!
//! Tests pass `env!("CARGO_BIN_EXE_sluice")` and the arguments; the process gets its own
//! temp dir for logs (and for whatever config files the test writes with
//! [`SluiceProcess::write_file`]), and every lifecycle operation of
//! [`ManagedProcess`] (stop, kill -9, SIGSTOP, start again with the same arguments...).

use std::ops::{Deref, DerefMut};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use tempfile::TempDir;

use crate::process::{ManagedProcess, ProcessSpec, DEFAULT_STOP_GRACE};

/// A program under test running as a child, with its logs in its own temp dir.
/// Dereferences to [`ManagedProcess`] for `pid`, `sigterm`, `kill9`, `wait_exit`,
/// `start_again`, `log_tail` and the rest.
#[derive(Debug)]
pub struct SluiceProcess {
    // Field order matters: the process is killed before its directory is removed.
    process: ManagedProcess,
    dir: TempDir,
}

// === impl SluiceProcess ===

impl SluiceProcess {
    /// Starts `binary` with `args`, inheriting the environment.
    pub fn start<I, S>(binary: impl AsRef<Path>, args: I) -> Result<Self>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<std::ffi::OsStr>,
    {
        Self::start_spec(ProcessSpec::new(binary).args(args))
    }

    /// Starts the program as `spec` says (arguments, environment, working dir).
    pub fn start_spec(spec: ProcessSpec) -> Result<Self> {
        let dir = Self::new_dir()?;
        Self::start_spec_in(spec, dir)
    }

    /// Starts the program with `dir` as its temp dir: for tests that write config files
    /// into the dir (see [`SluiceProcess::new_dir`]) before the program starts.
    pub fn start_spec_in(spec: ProcessSpec, dir: TempDir) -> Result<Self> {
        let process = ManagedProcess::start(spec, dir.path().join("logs"))?;
        Ok(Self { process, dir })
    }

    /// A fresh temp dir of the kind this process uses.
    pub fn new_dir() -> Result<TempDir> {
        tempfile::Builder::new()
            .prefix("sluice-proc-")
            .tempdir()
            .context("creating a temp dir for a child process")
    }

    /// The temp dir (logs are under `logs/`).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Writes a file into the temp dir (e.g. a config for the next start) and returns
    /// its path.
    pub fn write_file(&self, name: &str, contents: impl AsRef<[u8]>) -> Result<PathBuf> {
        let path = self.dir.path().join(name);
        std::fs::write(&path, contents).with_context(|| format!("writing {}", path.display()))?;
        Ok(path)
    }

    /// Graceful stop with the default grace (SIGTERM, SIGKILL after 10 s), then start
    /// again with the same arguments.
    pub async fn restart(&mut self) -> Result<()> {
        self.process.stop(DEFAULT_STOP_GRACE).await?;
        self.process.start_again()
    }

    /// Waits until the logs contain `needle` (e.g. "listening on").
    pub async fn wait_for_log(&self, needle: &str, deadline: Duration) -> Result<()> {
        let process = &self.process;
        crate::wait_until(
            &format!("{:?} in the logs of {}", needle, process.spec().get_name()),
            deadline,
            Duration::from_millis(20),
            || async move { process.logs_contain(needle) },
        )
        .await
        .with_context(|| process.log_tail(crate::process::ERROR_LOG_LINES))
    }
}

impl Deref for SluiceProcess {
    type Target = ManagedProcess;

    fn deref(&self) -> &ManagedProcess {
        &self.process
    }
}

impl DerefMut for SluiceProcess {
    fn deref_mut(&mut self) -> &mut ManagedProcess {
        &mut self.process
    }
}
