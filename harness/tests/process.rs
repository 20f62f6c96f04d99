//! Managed children: signals, exits, restarts with the same arguments, logs, and no
//! process outliving the test that started it.

use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use sluice_harness::{
    process_exists, wait_for, wait_until, ManagedProcess, ProcessSpec, SluiceProcess,
};

const DEADLINE: Duration = Duration::from_secs(10);
const POLL: Duration = Duration::from_millis(10);

/// Set in the copy of this test binary that `children_die_with_the_test_process` runs.
const HELPER_ENV: &str = "SLUICE_HARNESS_ORPHAN_HELPER_PIDFILE";

fn sh(script: &str) -> Result<SluiceProcess> {
    SluiceProcess::start("/bin/sh", ["-c", script])
}

#[tokio::test]
async fn sigterm_lets_the_child_exit_its_own_way() -> Result<()> {
    let mut child = sh("trap 'echo bye; exit 7' TERM; echo ready; while :; do sleep 0.05; done")?;
    child.wait_for_log("ready", DEADLINE).await?;
    assert!(child.is_running());
    child.sigterm()?;
    let status = child.wait_exit(DEADLINE).await?;
    assert_eq!(status.code(), Some(7));
    assert!(child.logs_contain("bye"), "{}", child.log_tail(10));
    assert_eq!(child.pid(), None, "an exited child has no pid");
    Ok(())
}

#[tokio::test]
async fn stop_escalates_to_sigkill_when_sigterm_is_ignored() -> Result<()> {
    let mut child = sh("trap '' TERM; echo ready; while :; do sleep 0.05; done")?;
    child.wait_for_log("ready", DEADLINE).await?;
    let started = Instant::now();
    let status = child.stop(Duration::from_millis(300)).await?;
    assert_eq!(status.signal(), Some(libc::SIGKILL));
    assert!(started.elapsed() >= Duration::from_millis(300));
    // Stopping what is already stopped just reports how it ended.
    assert_eq!(child.stop(DEADLINE).await?.signal(), Some(libc::SIGKILL));
    Ok(())
}

/// A child that ticks without starting processes of its own: Debian's `sh` (dash)
/// starts `sleep` with `vfork`, and a SIGSTOP that lands between the `vfork` and the
/// `exec` stops the child before it runs `sleep` while the shell waits for it in state
/// `D`, never stopping itself (run 39, 2026-12-03: "did not stop within 20s; thread
/// states: ['D']"). Perl is in every Debian (`perl-base` is essential).
fn ticker() -> Result<SluiceProcess> {
    SluiceProcess::start(
        "/usr/bin/perl",
        [
            "-e",
            r#"$| = 1; my $i = 0; while (1) { $i++; print "tick $i\n"; select(undef, undef, undef, 0.02) }"#,
        ],
    )
}

#[tokio::test]
async fn sigstop_freezes_and_sigcont_resumes() -> Result<()> {
    let mut child = ticker()?;
    child.wait_for_log("tick 2", DEADLINE).await?;
    child.sigstop().await?;
    assert!(child.is_running(), "a stopped child is still alive");
    // A frozen child cannot exit, whatever it is sent meanwhile.
    ensure!(child.wait_exit(Duration::from_millis(200)).await.is_err());
    child.sigcont().await?;
    let len = std::fs::metadata(child.stdout_path())?.len();
    let stdout = child.stdout_path().to_path_buf();
    wait_until("output after SIGCONT", DEADLINE, POLL, || {
        let stdout = stdout.clone();
        async move { std::fs::metadata(&stdout).is_ok_and(|m| m.len() > len) }
    })
    .await?;
    let status = child.kill9().await?;
    assert_eq!(status.signal(), Some(libc::SIGKILL));
    Ok(())
}

#[tokio::test]
async fn start_again_runs_the_same_command_and_appends_to_the_logs() -> Result<()> {
    let spec = ProcessSpec::new("/bin/sh")
        .name("greeter")
        .args(["-c", "echo hello $GREETING; echo oops >&2"])
        .env("GREETING", "world");
    let mut child = SluiceProcess::start_spec(spec)?;
    assert!(child.wait_exit(DEADLINE).await?.success());
    child.start_again()?;
    assert!(child.wait_exit(DEADLINE).await?.success());
    child.restart().await?;
    assert!(child.wait_exit(DEADLINE).await?.success());

    let stdout = std::fs::read_to_string(child.stdout_path())?;
    assert_eq!(stdout.matches("hello world").count(), 3, "{stdout}");
    assert!(stdout.contains("=== start #3 ==="));
    assert_eq!(child.starts(), 3);
    let tail = child.log_tail(2);
    assert!(
        tail.contains("greeter.stderr.log") && tail.contains("oops"),
        "{tail}"
    );
    assert!(child.stdout_path().starts_with(child.dir()));
    Ok(())
}

#[tokio::test]
async fn start_again_refuses_while_running() -> Result<()> {
    let mut child = sh("exec sleep 30")?;
    let error = child.start_again().err().context("started twice")?;
    assert!(error.to_string().contains("still running"), "{error}");
    Ok(())
}

#[tokio::test]
async fn a_missing_program_fails_clearly() -> Result<()> {
    let error = SluiceProcess::start("/nonexistent/sluice", ["run"])
        .err()
        .context("a missing program started")?;
    let text = format!("{error:#}");
    assert!(text.contains("/nonexistent/sluice run"), "{text}");
    Ok(())
}

#[tokio::test]
async fn dropping_a_child_kills_and_reaps_it() -> Result<()> {
    let child = sh("exec sleep 30")?;
    let pid = child.pid().context("a running child has a pid")?;
    assert!(process_exists(pid));
    drop(child);
    assert!(!process_exists(pid), "pid {pid} survived the drop");
    Ok(())
}

#[tokio::test]
async fn dropping_a_child_kills_what_it_forked() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let pid_file = dir.path().join("grandchild.pid");
    let child = sh(&format!(
        "sleep 30 & echo $! > {}; wait",
        pid_file.display()
    ))?;
    let grandchild: u32 = wait_for("the grandchild's pid", DEADLINE, POLL, || {
        let pid_file = pid_file.clone();
        async move { Ok(std::fs::read_to_string(&pid_file)?.trim().parse()?) }
    })
    .await?;
    assert!(process_exists(grandchild));
    drop(child);
    wait_until("the grandchild to die", DEADLINE, POLL, || async move {
        !process_exists(grandchild)
    })
    .await?;
    Ok(())
}

#[tokio::test]
async fn a_child_started_from_a_short_lived_thread_outlives_the_thread() -> Result<()> {
    // PR_SET_PDEATHSIG fires when the forking *thread* exits; the harness forks from a
    // thread of its own so this child must survive the end of the thread below.
    let dir = tempfile::tempdir()?;
    let log_dir = dir.path().to_path_buf();
    let mut child = std::thread::spawn(move || {
        ManagedProcess::start(ProcessSpec::new("/bin/sleep").arg("30"), log_dir)
    })
    .join()
    .map_err(|_| anyhow::anyhow!("the starting thread panicked"))??;
    let early_exit = child.wait_exit(Duration::from_millis(300)).await;
    assert!(
        early_exit.is_err(),
        "the child died with its thread: {early_exit:?}"
    );
    assert!(child.is_running());
    Ok(())
}

#[tokio::test]
async fn children_die_with_the_test_process() -> Result<()> {
    // Run this test binary again as a helper that starts a child and then hangs; kill
    // the helper with SIGKILL (no destructor runs) and check its child dies too.
    let dir = tempfile::tempdir()?;
    let pid_file = dir.path().join("child.pid");
    let exe = std::env::current_exe().context("locating this test binary")?;
    let mut helper = SluiceProcess::start_spec(
        ProcessSpec::new(&exe)
            .args([
                "--exact",
                "orphan_helper",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(HELPER_ENV, &pid_file),
    )?;
    let child_pid: u32 = wait_for("the helper's child pid", DEADLINE, POLL, || {
        let pid_file = pid_file.clone();
        async move {
            let text = std::fs::read_to_string(&pid_file)?;
            let pid = text.trim().parse()?;
            Ok(pid)
        }
    })
    .await
    .with_context(|| helper.log_tail(20))?;
    assert!(process_exists(child_pid));

    helper.kill9().await?;
    wait_until("the orphaned child to die", DEADLINE, POLL, || async move {
        !process_exists(child_pid)
    })
    .await?;
    Ok(())
}

/// Does nothing in a normal run; in the helper run, starts a child, writes its pid and
/// waits to be killed (bounded, in case nobody does).
#[tokio::test]
async fn orphan_helper() -> Result<()> {
    let Some(pid_file) = std::env::var_os(HELPER_ENV).map(PathBuf::from) else {
        return Ok(());
    };
    let child = sh("exec sleep 60")?;
    let pid = child.pid().context("the child has a pid")?;
    let partial = pid_file.with_extension("partial");
    std::fs::write(&partial, pid.to_string())?;
    std::fs::rename(&partial, &pid_file)?;
    tokio::time::sleep(Duration::from_secs(30)).await;
    Ok(())
}

#[tokio::test]
async fn wait_until_times_out_with_a_clear_error() -> Result<()> {
    let started = Instant::now();
    let error = wait_until(
        "the moon to turn blue",
        Duration::from_millis(100),
        POLL,
        || async { false },
    )
    .await
    .err()
    .context("a false condition held")?;
    let elapsed = started.elapsed();
    assert!(
        elapsed >= Duration::from_millis(90) && elapsed < DEADLINE,
        "{elapsed:?}"
    );
    assert!(
        error.to_string().contains("the moon to turn blue"),
        "{error}"
    );

    // A hanging attempt is cut off at the deadline and the last error is reported.
    let error = wait_for("an answer", Duration::from_millis(100), POLL, || async {
        std::future::pending::<Result<()>>().await
    })
    .await
    .err()
    .context("a pending attempt succeeded")?;
    assert!(error.to_string().contains("still running"), "{error}");
    Ok(())
}
