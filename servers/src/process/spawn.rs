//! Forking children that die with the process that started them (a test, `sluice dev`).
//!
//! Each child also leads a process group of its own, so it can be killed or frozen
//! together with anything it forks. The death signal covers the child itself only
//! (the kernel clears it on fork), so a grandchild outlives a test process that was
//! itself killed; the servers run here do not fork.
//!
//! On Linux each child asks the kernel for `SIGKILL` when its parent dies
//! (`PR_SET_PDEATHSIG`), so a test process that panics, aborts or is killed by the
//! runner leaves no nats-server or clickhouse-server behind. The "parent" the kernel
//! watches is the *thread* that forked, not the process: a child forked from a test
//! thread would be killed when that thread ends, which breaks servers shared across
//! tests (libtest runs each test on its own thread) and children forked from a
//! short-lived blocking-pool thread. So every fork happens on one dedicated thread that
//! lives as long as the process.

use std::io;
use std::process::{Child, Command};
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};

use anyhow::{anyhow, Context, Result};

type Reply = mpsc::Sender<io::Result<Child>>;

/// The channel to the spawner thread.
fn spawner() -> Result<&'static Mutex<mpsc::Sender<(Command, Reply)>>> {
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<(Command, Reply)>>> = OnceLock::new();
    if let Some(sender) = SPAWNER.get() {
        return Ok(sender);
    }
    let (sender, requests) = mpsc::channel::<(Command, Reply)>();
    std::thread::Builder::new()
        .name("servers-spawner".into())
        .spawn(move || {
            for (mut command, reply) in requests {
                // The requester may have given up; nothing to do about it then.
                let _ = reply.send(command.spawn());
            }
        })
        .context("starting the thread that spawns children")?;
    // A concurrent first call may have won the race; its thread serves everyone and
    // ours ends as soon as its (now unused) sender is dropped.
    Ok(SPAWNER.get_or_init(|| Mutex::new(sender)))
}

/// Spawns `command` from the long-lived spawner thread, with the parent-death signal
/// armed on Linux.
pub(crate) fn spawn(mut command: Command) -> Result<Child> {
    use std::os::unix::process::CommandExt;

    // A process group of its own, so killing the group also kills whatever the child
    // forks (the death signal is not inherited across fork).
    command.process_group(0);
    arm_parent_death_signal(&mut command);
    let (reply, answer) = mpsc::channel();
    spawner()?
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .send((command, reply))
        .map_err(|_| anyhow!("the thread that spawns children is gone"))?;
    let child = answer
        .recv()
        .map_err(|_| anyhow!("the thread that spawns children dropped the request"))?;
    Ok(child?)
}

#[cfg(target_os = "linux")]
fn arm_parent_death_signal(command: &mut Command) {
    use std::os::unix::process::CommandExt;

    // SAFETY: getpid is async-signal-safe and has no preconditions.
    let parent = unsafe { libc::getpid() };
    // SAFETY: the closure runs between fork and exec; it only calls the
    // async-signal-safe prctl and getppid and builds io::Errors without allocating.
    unsafe {
        command.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                return Err(io::Error::last_os_error());
            }
            // The parent may have died before the signal was armed: then nobody
            // would ever kill this child, so refuse to exec.
            if libc::getppid() != parent {
                return Err(io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
}

#[cfg(not(target_os = "linux"))]
fn arm_parent_death_signal(_command: &mut Command) {}
