//! clickhouse-server as the harness runs it: users and their rights, tables surviving
//! stop, kill -9 and restart on the same port, SIGSTOP freezing it, and no process
//! left on drop.

use std::time::Duration;

use anyhow::{Context, Result};
use sluice_harness::{
    available, clickhouse, process_exists, wait_for, ClickHouseFlavor, ClickHouseServer,
    INGEST_PASSWORD, INGEST_USER, QUERY_PASSWORD, QUERY_USER,
};

const DEADLINE: Duration = Duration::from_secs(15);
const POLL: Duration = Duration::from_millis(20);

/// A started server, or `None` (with a notice) if clickhouse-server is missing.
async fn server_or_skip(test: &str) -> Result<Option<ClickHouseServer>> {
    if available(test, clickhouse::binary())?.is_none() {
        return Ok(None);
    }
    Ok(Some(ClickHouseServer::start().await?))
}

async fn table_with_rows(server: &ClickHouseServer, rows: u64) -> Result<()> {
    server
        .exec("CREATE TABLE events (id UInt64, name String) ENGINE = MergeTree ORDER BY id")
        .await?;
    let body: String = (0..rows)
        .map(|id| format!("{{\"id\":{id},\"name\":\"row {id}\"}}\n"))
        .collect();
    server
        .exec(&format!("INSERT INTO events FORMAT JSONEachRow\n{body}"))
        .await?;
    Ok(())
}

#[tokio::test]
async fn creates_inserts_and_counts() -> Result<()> {
    let Some(server) = server_or_skip("creates_inserts_and_counts").await? else {
        return Ok(());
    };
    assert!(server.http_url().starts_with("http://127.0.0.1:"));
    let version = server.version().await?;
    assert!(
        version.starts_with(|c: char| c.is_ascii_digit()),
        "{version}"
    );
    eprintln!("clickhouse-server {version}");

    table_with_rows(&server, 3).await?;
    assert_eq!(server.count("events").await?, 3);
    assert_eq!(
        server
            .count("SELECT count() FROM events WHERE id > 0")
            .await?,
        2
    );
    Ok(())
}

#[tokio::test]
async fn users_have_their_rights() -> Result<()> {
    let Some(server) = server_or_skip("users_have_their_rights").await? else {
        return Ok(());
    };
    table_with_rows(&server, 1).await?;

    server
        .exec_as(
            INGEST_USER,
            INGEST_PASSWORD,
            "INSERT INTO events VALUES (7, 'x')",
        )
        .await?;
    assert_eq!(server.count("events").await?, 2);

    // readonly=2: reads, and may set per-query settings.
    let answer = server
        .exec_as(
            QUERY_USER,
            QUERY_PASSWORD,
            "SELECT count() FROM events SETTINGS max_execution_time = 5",
        )
        .await?;
    assert_eq!(answer.trim(), "2");
    let refused = server
        .exec_as(
            QUERY_USER,
            QUERY_PASSWORD,
            "INSERT INTO events VALUES (8, 'y')",
        )
        .await
        .err()
        .context("the query user must not write")?;
    assert!(format!("{refused:#}").contains("Code: 164"), "{refused:#}");

    let wrong = server
        .exec_as(INGEST_USER, "wrong", "SELECT 1")
        .await
        .err()
        .context("a wrong password must fail")?;
    // WRONG_PASSWORD on 18.16; current servers say AUTHENTICATION_FAILED for any login
    // refused.
    let code = match server.flavor() {
        ClickHouseFlavor::Debian => "Code: 193",
        ClickHouseFlavor::Current => "Code: 516",
    };
    assert!(format!("{wrong:#}").contains(code), "{wrong:#}");
    Ok(())
}

#[tokio::test]
async fn exec_errors_carry_clickhouses_message() -> Result<()> {
    let Some(server) = server_or_skip("exec_errors_carry_clickhouses_message").await? else {
        return Ok(());
    };
    let error = server
        .exec("SELECT * FROM no_such_table")
        .await
        .err()
        .context("querying a missing table must fail")?;
    let text = format!("{error:#}");
    assert!(text.contains("Code: 60"), "{text}");
    assert!(text.contains("no_such_table"), "{text}");
    Ok(())
}

#[tokio::test]
async fn stop_and_start_again_keep_tables_and_port() -> Result<()> {
    let Some(mut server) = server_or_skip("stop_and_start_again_keep_tables_and_port").await?
    else {
        return Ok(());
    };
    table_with_rows(&server, 4).await?;
    let url = server.http_url();

    let status = server.stop().await?;
    assert!(
        status.success(),
        "clickhouse-server exited with {status} on SIGTERM"
    );
    assert!(server.ping(Duration::from_millis(500)).await.is_err());

    server.start_again().await?;
    assert_eq!(server.http_url(), url);
    assert_eq!(server.count("events").await?, 4);
    Ok(())
}

#[tokio::test]
async fn kill9_then_start_again_works() -> Result<()> {
    let Some(mut server) = server_or_skip("kill9_then_start_again_works").await? else {
        return Ok(());
    };
    table_with_rows(&server, 5).await?;
    let status = server.kill9().await?;
    assert!(!status.success());
    assert!(!server.is_running());
    server.start_again().await?;
    assert_eq!(server.count("events").await?, 5);
    server.restart().await?;
    assert_eq!(server.count("events").await?, 5);
    Ok(())
}

#[tokio::test]
async fn sigstop_times_out_ping_and_sigcont_restores_it() -> Result<()> {
    let Some(mut server) = server_or_skip("sigstop_times_out_ping_and_sigcont_restores_it").await?
    else {
        return Ok(());
    };
    server.sigstop().await?;
    let frozen = server.ping(Duration::from_millis(300)).await;
    let error = frozen.err().context("a frozen server answered /ping")?;
    let timed_out = error
        .chain()
        .filter_map(|cause| cause.downcast_ref::<reqwest::Error>())
        .any(reqwest::Error::is_timeout);
    assert!(timed_out, "expected a timeout, got {error:#}");

    server.sigcont().await?;
    wait_for("/ping after SIGCONT", DEADLINE, POLL, || {
        server.ping(Duration::from_millis(500))
    })
    .await?;
    Ok(())
}

#[tokio::test]
async fn dropping_the_server_kills_its_process() -> Result<()> {
    let Some(server) = server_or_skip("dropping_the_server_kills_its_process").await? else {
        return Ok(());
    };
    let pid = server.pid().context("a running server has a pid")?;
    let dir = server.dir().to_path_buf();
    assert!(process_exists(pid));
    drop(server);
    assert!(!process_exists(pid), "pid {pid} still alive after drop");
    assert!(!dir.exists(), "temp dir {} left behind", dir.display());
    Ok(())
}
