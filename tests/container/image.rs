//! The image under test, run as a user runs it: configured by `SLUICE_*` variables
//! alone, against the harness's nats-server and clickhouse-server.

use std::time::Duration;

use anyhow::{Context, Result};
use serde_json::Value;
use sluice_harness::{free_port, Stack, StackOptions};

use crate::engine::Engine;
use crate::sluice::{Settings, SluiceContainer, PASSWORD_VAR};
use crate::{rows, DEADLINE, EVENTS};

/// The grace period of `docker stop` here, as `terminationGracePeriodSeconds` in
/// docs/deploy.md: above `[pipeline] shutdown_deadline` (20 s by default).
const STOP_GRACE: Duration = Duration::from_secs(40);

/// The engine (or a skip), and a stack with the table `events`.
async fn setup(test: &str) -> Result<Option<(Engine, Stack)>> {
    let Some(engine) = Engine::from_env(test)? else {
        return Ok(None);
    };
    let stack = Stack::start(StackOptions::default()).await?;
    stack.clickhouse.exec(EVENTS).await?;
    Ok(Some((engine, stack)))
}

/// Whether a JSON log line (the fields at its top level) has this level and a message
/// containing `needle`.
fn logged(line: &Value, level: &str, needle: &str) -> bool {
    line["level"] == level && line["message"].as_str().is_some_and(|m| m.contains(needle))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_image_runs_from_the_environment_alone() -> Result<()> {
    let Some((engine, stack)) = setup("the_image_runs_from_the_environment_alone").await? else {
        return Ok(());
    };
    let sluice = SluiceContainer::start(&engine, &Settings::for_stack(&stack)).await?;
    sluice.wait_ready().await?;
    assert_eq!(sluice.run_healthcheck().await?, "healthy");

    let (status, answer) = sluice.ingest("events", &rows(1, 3)).await?;
    assert_eq!(status, 202, "{answer}");
    assert_eq!(answer["accepted"], 3, "{answer}");
    let landed = stack.wait_for_count("events", 3, DEADLINE).await?;
    assert_eq!(landed, 3);

    // Logs are JSON lines (the image sets SLUICE_LOG_FORMAT=json): every line parses.
    let lines = sluice.log_lines().await?;
    assert!(
        lines
            .iter()
            .any(|l| logged(l, "INFO", "answered its first probe")),
        "{lines:#?}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_image_runs_as_uid_10001_read_only_without_capabilities() -> Result<()> {
    let Some((engine, stack)) =
        setup("the_image_runs_as_uid_10001_read_only_without_capabilities").await?
    else {
        return Ok(());
    };
    let sluice = SluiceContainer::start(&engine, &Settings::for_stack(&stack).hardened()).await?;
    sluice.wait_ready().await?;

    // Its process as the host sees it: the image's own user (the test asks for none),
    // no capability at all, a read-only root.
    let pid = sluice.pid().await?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let field = |name: &str| -> Result<Vec<String>> {
        let line = status
            .lines()
            .find(|l| l.starts_with(&format!("{name}:")))
            .with_context(|| format!("no {name} in /proc/{pid}/status:\n{status}"))?;
        Ok(line.split_whitespace().skip(1).map(str::to_owned).collect())
    };
    assert_eq!(field("Name")?, ["sluice"], "{status}");
    assert_eq!(field("Uid")?, ["10001"; 4], "{status}");
    assert_eq!(field("Gid")?, ["10001"; 4], "{status}");
    for caps in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
        assert_eq!(field(caps)?, ["0000000000000000"], "{caps}");
    }
    let mounts = std::fs::read_to_string(format!("/proc/{pid}/mounts"))?;
    let root = mounts
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|fields| fields.get(1) == Some(&"/"))
        .with_context(|| format!("no / in /proc/{pid}/mounts:\n{mounts}"))?;
    assert!(
        root.get(3)
            .is_some_and(|options| options.split(',').any(|o| o == "ro")),
        "the root filesystem is mounted {root:?}"
    );

    // And Sluice does all its work that way.
    let (status, answer) = sluice.ingest("events", &rows(1, 5)).await?;
    assert_eq!(status, 202, "{answer}");
    assert_eq!(stack.wait_for_count("events", 5, DEADLINE).await?, 5);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_drains_every_accepted_row_within_the_grace_period() -> Result<()> {
    let Some((engine, stack)) =
        setup("a_stop_drains_every_accepted_row_within_the_grace_period").await?
    else {
        return Ok(());
    };
    // Rows wait in Sluice's buffers (no flush by age or count before the stop).
    let settings = Settings::for_stack(&stack)
        .set("SLUICE_INGEST_BATCH_AGE", "10m")
        .set("SLUICE_INGEST_BATCH_ROWS", "100000");
    let sluice = SluiceContainer::start(&engine, &settings).await?;
    sluice.wait_ready().await?;
    for first in (0..500).step_by(100) {
        let (status, answer) = sluice.ingest("events", &rows(first, 100)).await?;
        assert_eq!(status, 202, "{answer}");
    }
    sluice.wait_buffered("events", 500).await?;
    assert_eq!(stack.clickhouse.count("events").await?, 0);

    let (code, took) = sluice.stop(STOP_GRACE).await?;
    assert_eq!(code, Some(0), "exit code after a stop that took {took:?}");
    assert!(took < STOP_GRACE, "the stop took {took:?}, the whole grace");
    assert_eq!(stack.clickhouse.count("events").await?, 500);
    // It was the image's stop signal that stopped it.
    let lines = sluice.log_lines().await?;
    assert!(
        lines
            .iter()
            .any(|l| logged(l, "INFO", "stopping") && l["signal"] == "SIGTERM"),
        "{lines:#?}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill9_loses_nothing_once_a_new_container_takes_over() -> Result<()> {
    let Some((engine, stack)) =
        setup("a_kill9_loses_nothing_once_a_new_container_takes_over").await?
    else {
        return Ok(());
    };
    // Unacked rows come back to the consumer after ack_wait: short, for the test.
    let settings = Settings::for_stack(&stack).set("SLUICE_NATS_ACK_WAIT", "3s");
    let held = settings
        .clone()
        .set("SLUICE_INGEST_BATCH_AGE", "10m")
        .set("SLUICE_INGEST_BATCH_ROWS", "100000");
    let first = SluiceContainer::start(&engine, &held).await?;
    first.wait_ready().await?;
    for start in (0..300).step_by(100) {
        let (status, answer) = first.ingest("events", &rows(start, 100)).await?;
        assert_eq!(status, 202, "{answer}");
    }
    first.wait_buffered("events", 300).await?;
    assert_eq!(first.kill9().await?, Some(137));
    assert_eq!(stack.clickhouse.count("events").await?, 0);

    let second = SluiceContainer::start(&engine, &settings).await?;
    second.wait_ready().await?;
    assert_eq!(stack.wait_for_count("events", 300, DEADLINE).await?, 300);
    assert_eq!(
        stack
            .clickhouse
            .count("SELECT count() FROM (SELECT DISTINCT id FROM events)")
            .await?,
        300
    );
    Ok(())
}

/// Starts Sluice with `settings`, and checks that it stays up and unready while its
/// ClickHouse target fails its probe, saying why (`reason`) in its JSON log.
async fn stays_alive_and_unready(
    engine: &Engine,
    settings: &Settings,
    reason: &[&str],
) -> Result<()> {
    let sluice = SluiceContainer::start(engine, settings).await?;
    // Two failed probes in the log: it keeps trying, it does not give up or exit.
    let warnings = sluice
        .wait_log("two failed probes", 2, |l| {
            logged(l, "WARN", "does not answer its probe")
        })
        .await?;
    let error = warnings[0]["error"].as_str().unwrap_or_default();
    assert!(
        reason.iter().any(|r| error.contains(r)),
        "the logged error {error:?} does not name {reason:?}"
    );
    assert!(sluice.is_running().await?);
    assert_eq!(sluice.admin_get("/healthz").await?.0, 200);
    let (status, body) = sluice.admin_get("/readyz").await?;
    assert_eq!(status, 503, "{body}");
    assert!(
        body["reasons"].as_array().is_some_and(|r| r
            .iter()
            .any(|r| r.as_str().is_some_and(|r| r.contains("target main")))),
        "{body}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_password_keeps_it_alive_and_unready() -> Result<()> {
    let Some((engine, stack)) = setup("a_wrong_password_keeps_it_alive_and_unready").await? else {
        return Ok(());
    };
    let settings = Settings::for_stack(&stack).set(PASSWORD_VAR, "not-the-password");
    // ClickHouse 18.16 answers 193 (WRONG_PASSWORD); current servers 516.
    stays_alive_and_unready(&engine, &settings, &["193", "516", "password"]).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_clickhouse_keeps_it_alive_and_unready() -> Result<()> {
    let Some((engine, stack)) =
        setup("an_unreachable_clickhouse_keeps_it_alive_and_unready").await?
    else {
        return Ok(());
    };
    // A loopback port nothing listens on.
    let nowhere = format!("http://127.0.0.1:{}", free_port()?);
    let settings = Settings::for_stack(&stack).set("SLUICE_CLICKHOUSE_TARGETS_MAIN_URL", nowhere);
    stays_alive_and_unready(&engine, &settings, &["connect", "refused"]).await
}
