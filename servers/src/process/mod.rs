//! A managed child process: the one way a server (or, in the test harness, a Sluice
//! under test) is run.
//!
//! Every server and every Sluice under test is one of these. Output goes to files (a
//! pipe nobody reads would fill and block the child); the child is forked so that it
//! dies with the process that started it (see [`spawn`]); dropping the handle kills
//! *and reaps* it, so a failed or panicking test leaves neither a process nor a zombie.
//! The recipe is kept, so a stopped or killed child starts again with the same
//! arguments, which is how a restarted server finds its ports and its data again.
//!
//! `std::process::Child` is used rather than tokio's: waiting is a short poll of
//! `try_wait`, and `Drop` can reap synchronously, which tokio's child cannot do.

mod lifecycle;
mod logs;
mod ready;
mod spawn;
mod spec;

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use tokio::time::Instant;

pub(crate) use lifecycle::server_lifecycle;
pub use ready::start_ready;
pub use spec::{on_path, ProcessSpec};

/// How often an exit is checked for while waiting.
const EXIT_POLL: Duration = Duration::from_millis(10);

/// How long [`ManagedProcess::stop`] waits after SIGTERM before SIGKILL, unless told.
pub const DEFAULT_STOP_GRACE: Duration = Duration::from_secs(10);

/// How many log lines an error message carries.
pub const ERROR_LOG_LINES: usize = 30;

/// A child process with its logs in files, killed and reaped on drop.
#[derive(Debug)]
pub struct ManagedProcess {
    spec: ProcessSpec,
    log_dir: PathBuf,
    stdout: PathBuf,
    stderr: PathBuf,
    child: Option<Child>,
    last_exit: Option<ExitStatus>,
    starts: u32,
}

// === impl ManagedProcess ===

impl ManagedProcess {
    /// Starts `spec`, appending its stdout and stderr to `<name>.stdout.log` and
    /// `<name>.stderr.log` in `log_dir` (created if missing).
    pub fn start(spec: ProcessSpec, log_dir: impl AsRef<Path>) -> Result<Self> {
        let log_dir = log_dir.as_ref().to_path_buf();
        std::fs::create_dir_all(&log_dir)
            .with_context(|| format!("creating log dir {}", log_dir.display()))?;
        let stdout = log_dir.join(format!("{}.stdout.log", spec.name));
        let stderr = log_dir.join(format!("{}.stderr.log", spec.name));
        let mut process = Self {
            spec,
            log_dir,
            stdout,
            stderr,
            child: None,
            last_exit: None,
            starts: 0,
        };
        process.start_again()?;
        Ok(process)
    }

    /// Starts the same program again with the same arguments, environment and log
    /// files (appended to, after a `=== start #N ===` marker). Fails if it is running.
    pub fn start_again(&mut self) -> Result<()> {
        if self.is_running() {
            bail!(
                "{} is still running (pid {:?}); stop it before starting it again",
                self.spec.name,
                self.pid()
            );
        }
        self.starts += 1;
        let marker = format!("=== start #{} ===\n", self.starts);
        let stdout = open_log(&self.stdout, &marker)?;
        let stderr = open_log(&self.stderr, &marker)?;

        let mut command = Command::new(&self.spec.program);
        command
            .args(&self.spec.args)
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr);
        for key in &self.spec.env_remove {
            command.env_remove(key);
        }
        for (key, value) in &self.spec.env {
            command.env(key, value);
        }
        if let Some(dir) = &self.spec.current_dir {
            command.current_dir(dir);
        }
        let child =
            spawn::spawn(command).with_context(|| format!("starting `{}`", self.spec.display()))?;
        tracing::debug!(name = %self.spec.name, pid = child.id(), "started child");
        self.child = Some(child);
        self.last_exit = None;
        Ok(())
    }

    /// The running child's pid; `None` once it has exited and been reaped.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Whether the child is alive (a SIGSTOPped child is alive). Reaps it if it exited.
    pub fn is_running(&mut self) -> bool {
        self.exit_status().is_none() && self.child.is_some()
    }

    /// The exit status if the child has exited (reaping it), `None` while it runs or
    /// before it was ever started.
    pub fn exit_status(&mut self) -> Option<ExitStatus> {
        if let Some(child) = &mut self.child {
            match child.try_wait() {
                Ok(Some(status)) => {
                    self.child = None;
                    self.last_exit = Some(status);
                }
                Ok(None) => return None,
                Err(error) => {
                    tracing::warn!(name = %self.spec.name, %error, "try_wait failed");
                    return None;
                }
            }
        }
        self.last_exit
    }

    /// Sends `signal` to the running child. Never signals a pid that was reaped (it
    /// might belong to someone else by now).
    pub fn signal(&mut self, signal: i32) -> Result<()> {
        let pid = self.live_pid()?;
        send(pid, signal).with_context(|| format!("sending signal {signal} to {}", self.spec.name))
    }

    /// Sends `signal` to the child's whole process group: the child and anything it
    /// forked (each child leads a group of its own). Kills and freezes go this way, so
    /// a shell's or server's own children are not left behind.
    pub fn signal_group(&mut self, signal: i32) -> Result<()> {
        let pid = self.live_pid()?;
        send(-pid, signal)
            .with_context(|| format!("sending signal {signal} to {}'s group", self.spec.name))
    }

    /// The pid of the running (or exited but unreaped) child: while it is unreaped,
    /// neither its pid nor its process group id can be reused.
    fn live_pid(&mut self) -> Result<libc::pid_t> {
        if !self.is_running() {
            bail!("{} is not running", self.spec.name);
        }
        let pid = self
            .pid()
            .ok_or_else(|| anyhow!("{} has no pid", self.spec.name))?;
        libc::pid_t::try_from(pid).context("pid out of range")
    }

    /// Asks the child to shut down (SIGTERM) without waiting.
    pub fn sigterm(&mut self) -> Result<()> {
        self.signal(libc::SIGTERM)
    }

    /// Freezes the child (SIGSTOP) and returns once every one of its threads has
    /// stopped: `kill` only queues the signal, and a thread that is running at that
    /// moment could otherwise still answer a request. Sockets stay open, nothing
    /// answers.
    pub async fn sigstop(&mut self) -> Result<()> {
        self.signal_group(libc::SIGSTOP)?;
        self.wait_for_threads("stop", |state| matches!(state, 'T' | 't' | 'Z'))
            .await
    }

    /// Thaws a frozen child (SIGCONT) and returns once none of its threads is stopped.
    pub async fn sigcont(&mut self) -> Result<()> {
        self.signal_group(libc::SIGCONT)?;
        self.wait_for_threads("continue", |state| state != 'T')
            .await
    }

    /// Polls the state of each of the child's threads (`/proc/PID/task/*/stat`) until
    /// `done` holds for all of them.
    async fn wait_for_threads(&mut self, what: &str, done: impl Fn(char) -> bool) -> Result<()> {
        // A thread in an uninterruptible disk wait stops only when the I/O returns, which
        // on a loaded machine has taken over 5 s.
        const DEADLINE: Duration = Duration::from_secs(20);
        let pid = self
            .pid()
            .ok_or_else(|| anyhow!("{} is not running", self.spec.name))?;
        let end = Instant::now() + DEADLINE;
        loop {
            let states = thread_states(pid);
            if states
                .as_ref()
                .is_ok_and(|states| states.iter().all(|&s| done(s)))
            {
                return Ok(());
            }
            if Instant::now() >= end {
                bail!(
                    "{} (pid {pid}) did not {what} within {DEADLINE:?}; thread states: {states:?}",
                    self.spec.name
                );
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// Waits up to `deadline` for the child to exit by itself.
    pub async fn wait_exit(&mut self, deadline: Duration) -> Result<ExitStatus> {
        let end = Instant::now() + deadline;
        loop {
            if let Some(status) = self.exit_status() {
                return Ok(status);
            }
            if self.child.is_none() {
                bail!("{} was never started", self.spec.name);
            }
            if Instant::now() >= end {
                bail!(
                    "{} (pid {:?}) did not exit within {deadline:?}\n{}",
                    self.spec.name,
                    self.pid(),
                    self.log_tail(ERROR_LOG_LINES)
                );
            }
            tokio::time::sleep(EXIT_POLL).await;
        }
    }

    /// Graceful stop: SIGTERM (plus SIGCONT, in case it is frozen), then SIGKILL if it
    /// has not exited after `grace`. Returns how it exited; a no-op if already exited.
    pub async fn stop(&mut self, grace: Duration) -> Result<ExitStatus> {
        if !self.is_running() {
            return self.already_exited();
        }
        self.sigterm()?;
        // A stopped process keeps SIGTERM pending until it is continued.
        let _ = self.signal_group(libc::SIGCONT);
        match self.wait_exit(grace).await {
            Ok(status) => Ok(status),
            Err(_) => {
                tracing::warn!(name = %self.spec.name, ?grace, "no exit after SIGTERM; SIGKILL");
                self.kill9().await
            }
        }
    }

    /// Kills the child (and its process group) with SIGKILL and reaps it. A no-op if
    /// already exited.
    pub async fn kill9(&mut self) -> Result<ExitStatus> {
        if !self.is_running() {
            return self.already_exited();
        }
        self.signal_group(libc::SIGKILL)?;
        // SIGKILL cannot be caught; the bound only guards against a kernel stuck in
        // uninterruptible I/O.
        self.wait_exit(Duration::from_secs(30)).await
    }

    fn already_exited(&mut self) -> Result<ExitStatus> {
        self.exit_status()
            .ok_or_else(|| anyhow!("{} was never started", self.spec.name))
    }

    /// How many times the child has been started.
    pub fn starts(&self) -> u32 {
        self.starts
    }

    pub fn spec(&self) -> &ProcessSpec {
        &self.spec
    }

    pub fn log_dir(&self) -> &Path {
        &self.log_dir
    }

    pub fn stdout_path(&self) -> &Path {
        &self.stdout
    }

    pub fn stderr_path(&self) -> &Path {
        &self.stderr
    }

    fn log_files(&self) -> impl Iterator<Item = &PathBuf> {
        [&self.stdout, &self.stderr]
            .into_iter()
            .chain(self.spec.log_files.iter())
    }

    /// The last `lines` lines of each log file, each under a heading with its path.
    /// Empty and missing program-written logs are left out.
    pub fn log_tail(&self, lines: usize) -> String {
        let mut out = format!("--- logs of {} ---", self.spec.name);
        for path in self.log_files() {
            if !path.exists() && self.spec.log_files.contains(path) {
                continue;
            }
            let text = logs::tail(path, lines);
            if text.is_empty() {
                continue;
            }
            out.push_str(&format!("\n[{}]\n{text}", path.display()));
        }
        out
    }

    /// Whether any log file's recent output contains `needle`.
    pub fn logs_contain(&self, needle: &str) -> bool {
        self.log_files().any(|path| logs::contains(path, needle))
    }
}

impl Drop for ManagedProcess {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            if let Ok(None) = child.try_wait() {
                // Blocking here is fine: SIGKILL is not catchable, the wait is short.
                // The group first (the unreaped child keeps its id from being reused).
                if let Ok(pid) = libc::pid_t::try_from(child.id()) {
                    let _ = send(-pid, libc::SIGKILL);
                }
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

/// `kill(pid, signal)`; a negative pid names a process group.
fn send(pid: libc::pid_t, signal: i32) -> Result<()> {
    // SAFETY: kill has no memory-safety preconditions; callers only pass our own
    // unreaped child's pid (or its group), which cannot have been recycled.
    if unsafe { libc::kill(pid, signal) } != 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    Ok(())
}

/// The state letter (`R`, `S`, `T`, `Z`...) of each thread of process `pid`.
fn thread_states(pid: u32) -> std::io::Result<Vec<char>> {
    let mut states = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))? {
        let stat = match std::fs::read_to_string(task?.path().join("stat")) {
            Ok(stat) => stat,
            // A thread that ended between listing and reading.
            Err(_) => continue,
        };
        if let Some(state) = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.trim_start().chars().next())
        {
            states.push(state);
        }
    }
    Ok(states)
}

/// Whether a process with this pid exists and has not died (a zombie, dead but not yet
/// reaped by its parent, counts as gone). For checking that a child really went away.
pub fn process_exists(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => false,
        // The state letter follows the parenthesised command name, which may itself
        // contain spaces and parentheses.
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z')),
    }
}

fn open_log(path: &Path, marker: &str) -> Result<File> {
    let mut file = OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .with_context(|| format!("opening log file {}", path.display()))?;
    file.write_all(marker.as_bytes())
        .with_context(|| format!("writing to log file {}", path.display()))?;
    Ok(file)
}
