//! The HTTP listeners against clients that hold connections: idle ones, slow headers,
//! slow bodies, and more connections than the process has descriptors for. Checked from
//! the outside: when a connection is closed, what it was answered, whether rows still
//! land in ClickHouse.

use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use serde_json::json;
use sluice_harness::{wait_for, wait_until, Stack, StackOptions, ADMIN_TOKEN, TENANT};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const SLUICE: &str = env!("CARGO_BIN_EXE_sluice");
const LAND: Duration = Duration::from_secs(60);
const POLL: Duration = Duration::from_millis(200);

const EVENTS: &str = "CREATE TABLE events (id UInt64, s String) ENGINE = MergeTree ORDER BY id";

async fn stack_with(settings: &[(&str, toml::Value)]) -> Result<Stack> {
    let mut stack = Stack::start(StackOptions::default()).await?;
    stack.clickhouse.exec(EVENTS).await?;
    for (key, value) in settings {
        stack.set(key, value.clone());
    }
    Ok(stack)
}

/// Reads until the server closes the connection (EOF or reset) or `deadline` passes;
/// returns what was read and `None` if it was still open at the deadline.
async fn read_until_closed(
    stream: &mut TcpStream,
    deadline: Duration,
) -> (Vec<u8>, Option<Instant>) {
    let end = tokio::time::Instant::now() + deadline;
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match tokio::time::timeout_at(end, stream.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return (got, Some(Instant::now())),
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
            Err(_) => return (got, None),
        }
    }
}

/// Waits until `events` holds exactly `n` rows.
async fn rows_land(stack: &Stack, n: u64, deadline: Duration) -> Result<()> {
    wait_for(&format!("{n} rows land"), deadline, POLL, || async {
        let c = stack.count("SELECT count() FROM events").await?;
        ensure!(c == n, "{c} rows");
        Ok(())
    })
    .await
}

async fn ingest_ok(stack: &Stack, id: u64) -> Result<()> {
    let (status, body) = stack
        .ingest("events", &[json!({"id": id, "s": "normal"})])
        .await?;
    ensure!(status == 202, "row {id}: {status} {body}");
    Ok(())
}

/// Issue 13.2: 300 idle connections (no byte sent) are closed within the idle timeout,
/// on both listeners, while normal requests are answered meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_are_closed_within_the_idle_timeout_while_requests_are_answered(
) -> Result<()> {
    const IDLE: Duration = Duration::from_secs(2);
    let mut stack = stack_with(&[
        ("api.idle_timeout", "2s".into()),
        ("admin.idle_timeout", "2s".into()),
    ])
    .await?;
    stack.start_sluice(SLUICE).await?;

    let mut idle = Vec::new();
    for i in 0..320 {
        let port = if i < 300 {
            stack.api_port
        } else {
            stack.admin_port
        };
        let stream = TcpStream::connect(("127.0.0.1", port)).await?;
        idle.push((Instant::now(), stream));
    }
    // Meanwhile, ordinary clients are served.
    for id in 0..10 {
        ingest_ok(&stack, id).await?;
    }
    let (status, _) = stack.admin_get("/admin/dlq").await?;
    assert_eq!(status, 200);

    let closes =
        futures::future::join_all(idle.into_iter().map(|(opened, mut stream)| async move {
            let (_, closed) = read_until_closed(&mut stream, IDLE * 4).await;
            closed.map(|at| at - opened)
        }))
        .await;
    let open = closes.iter().filter(|c| c.is_none()).count();
    ensure!(
        open == 0,
        "{open} of 320 idle connections still open after {:?}",
        IDLE * 4
    );
    let lasted: Vec<Duration> = closes.into_iter().flatten().collect();
    let (shortest, longest) = (
        lasted.iter().min().copied().unwrap_or_default(),
        lasted.iter().max().copied().unwrap_or_default(),
    );
    println!(
        "320 idle connections closed after {shortest:?} to {longest:?} (idle_timeout {IDLE:?})"
    );
    assert!(
        longest <= IDLE + Duration::from_millis(1500),
        "an idle connection lasted {longest:?}"
    );
    assert!(
        shortest >= IDLE - Duration::from_millis(300),
        "an idle connection was closed after {shortest:?}, before the idle timeout"
    );
    rows_land(&stack, 10, LAND).await?;
    Ok(())
}

/// Issue 13.2: slow clients are cut off: headers trickled a byte at a time after the
/// header timeout, a body that stops short or trickles after the body timeout (408),
/// on the admin listener too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_headers_and_slow_bodies_are_cut_off() -> Result<()> {
    const HEADER: Duration = Duration::from_secs(1);
    const BODY: Duration = Duration::from_secs(2);
    const SLACK: Duration = Duration::from_millis(1500);
    let mut stack = stack_with(&[
        ("api.header_timeout", "1s".into()),
        ("api.body_timeout", "2s".into()),
        ("admin.body_timeout", "2s".into()),
    ])
    .await?;
    stack.start_sluice(SLUICE).await?;
    let api = ("127.0.0.1", stack.api_port);

    // Headers one byte every 100 ms: closed about a second after the first byte, while
    // bytes still arrive.
    let stream = TcpStream::connect(api).await?;
    let (mut reader, mut writer) = stream.into_split();
    let started = Instant::now();
    let trickle = tokio::spawn(async move {
        let head = format!(
            "POST /v1/ingest/events HTTP/1.1\r\nHost: x\r\nX-Tenant: {TENANT}\r\nX-Padding: {}",
            "p".repeat(200)
        );
        let mut sent = 0;
        for b in head.bytes() {
            if writer.write_all(&[b]).await.is_err() {
                break;
            }
            sent += 1;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        sent
    });
    let mut buf = [0u8; 1024];
    let closed = tokio::time::timeout(HEADER + SLACK, reader.read(&mut buf)).await;
    let lasted = started.elapsed();
    ensure!(
        matches!(closed, Ok(Ok(0)) | Ok(Err(_))),
        "slow headers still open after {lasted:?}: {closed:?}"
    );
    trickle.abort();
    println!("slow headers closed after {lasted:?} (header_timeout {HEADER:?})");
    assert!(lasted >= HEADER - Duration::from_millis(200), "{lasted:?}");

    // A body announced as 1,000 bytes of which 50 come: 408, and the connection closes.
    let mut stream = TcpStream::connect(api).await?;
    let started = Instant::now();
    stream
        .write_all(
            format!(
                "POST /v1/ingest/events HTTP/1.1\r\nHost: x\r\nX-Tenant: {TENANT}\r\nContent-Type: application/x-ndjson\r\nContent-Length: 1000\r\n\r\n{}",
                "x".repeat(50)
            )
            .as_bytes(),
        )
        .await?;
    let (answer, closed) = read_until_closed(&mut stream, BODY + SLACK).await;
    let answer = String::from_utf8_lossy(&answer).to_string();
    let lasted = started.elapsed();
    ensure!(
        closed.is_some(),
        "a short body kept the connection open {lasted:?}: {answer:?}"
    );
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("[api] body_timeout"), "{answer}");
    println!("a short body answered 408 after {lasted:?} (body_timeout {BODY:?})");

    // A chunked body at a byte every 200 ms: 408 after the body timeout all the same.
    let stream = TcpStream::connect(api).await?;
    let (mut reader, mut writer) = stream.into_split();
    let started = Instant::now();
    let trickle = tokio::spawn(async move {
        let head = format!("POST /v1/ingest/events HTTP/1.1\r\nHost: x\r\nX-Tenant: {TENANT}\r\nContent-Type: application/x-ndjson\r\nTransfer-Encoding: chunked\r\n\r\n");
        if writer.write_all(head.as_bytes()).await.is_err() {
            return;
        }
        for _ in 0..100 {
            if writer.write_all(b"1\r\nx\r\n").await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });
    let mut answer = Vec::new();
    let read = tokio::time::timeout(BODY + SLACK, reader.read_to_end(&mut answer)).await;
    trickle.abort();
    let answer = String::from_utf8_lossy(&answer).to_string();
    ensure!(
        read.is_ok(),
        "a trickled body was still open after {:?}: {answer:?}",
        started.elapsed()
    );
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");

    // The admin listener: a replay request whose body stops short.
    let mut stream = TcpStream::connect(("127.0.0.1", stack.admin_port)).await?;
    stream
        .write_all(
            format!(
                "POST /admin/dlq/replay HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {ADMIN_TOKEN}\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{{\"tenant\":"
            )
            .as_bytes(),
        )
        .await?;
    let (answer, closed) = read_until_closed(&mut stream, BODY + SLACK).await;
    let answer = String::from_utf8_lossy(&answer).to_string();
    ensure!(
        closed.is_some(),
        "the admin listener kept a short body open: {answer:?}"
    );
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("[admin] body_timeout"), "{answer}");

    // Nothing of it was stored; an ordinary request still is.
    ingest_ok(&stack, 1).await?;
    rows_land(&stack, 1, LAND).await?;
    Ok(())
}

/// Sends `path` a body announced as 1,000 bytes of which 50 come; the answer's status
/// line (the body timeout's 408).
async fn short_body(port: u16, path: &str, content_type: &str) -> Result<String> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).await?;
    stream
        .write_all(
            format!(
                "POST {path} HTTP/1.1\r\nHost: x\r\nX-Tenant: {TENANT}\r\nContent-Type: {content_type}\r\nContent-Length: 1000\r\n\r\n{}",
                "x".repeat(50)
            )
            .as_bytes(),
        )
        .await?;
    let (answer, _) = read_until_closed(&mut stream, Duration::from_secs(10)).await;
    let answer = String::from_utf8_lossy(&answer).to_string();
    Ok(answer.lines().next().unwrap_or_default().to_string())
}

/// issues 37.5 and 37.6: a body that did not arrive within the body timeout is answered
/// 408, and counted as 408 in `sluice_ingest_requests_total` and `sluice_query_total`
/// (it was counted as 400, and no 408 series existed), and each operation's OpenAPI
/// document lists the 408.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_timeout_is_a_408_in_the_metrics_and_the_openapi_document() -> Result<()> {
    let mut stack = stack_with(&[
        ("api.body_timeout", "2s".into()),
        ("query.target", "main".into()),
        ("query.user", sluice_harness::QUERY_USER.into()),
        ("query.password_env", "SLUICE_TEST_QUERY_PASSWORD".into()),
    ])
    .await?;
    stack.env.push((
        "SLUICE_TEST_QUERY_PASSWORD".into(),
        sluice_harness::QUERY_PASSWORD.into(),
    ));
    stack.start_sluice(SLUICE).await?;
    let ingest = short_body(stack.api_port, "/v1/ingest/events", "application/x-ndjson").await?;
    assert!(ingest.starts_with("HTTP/1.1 408"), "{ingest}");
    let query = short_body(stack.api_port, "/v1/query", "application/json").await?;
    assert!(query.starts_with("HTTP/1.1 408"), "{query}");

    let stack = &stack;
    for (family, surface) in [
        ("sluice_ingest_requests_total", "ingest"),
        ("sluice_query_total", "query"),
    ] {
        wait_for(
            &format!("the {surface} 408 counted"),
            Duration::from_secs(10),
            POLL,
            || async move {
                let metrics = stack.metrics_parsed().await?;
                let count = |status| metrics.value(family, &[("status", status)]).unwrap_or(0.0);
                ensure!(
                    (count("408"), count("400")) == (1.0, 0.0),
                    "{family}: 408 counted {}, 400 counted {}",
                    count("408"),
                    count("400")
                );
                Ok(())
            },
        )
        .await?;
    }

    let document = stack
        .http()
        .get(format!("{}/openapi.json", stack.api_url()))
        .send()
        .await?
        .text()
        .await?;
    let document: serde_json::Value = serde_json::from_str(&document)?;
    for path in ["/v1/ingest/{table}", "/v1/query"] {
        let answer = &document["paths"][path]["post"]["responses"]["408"];
        assert!(
            answer["description"]
                .as_str()
                .is_some_and(|d| d.contains("body_timeout")),
            "{path}: {answer}"
        );
    }
    Ok(())
}

/// The number of descriptors `pid` has open.
fn open_descriptors(pid: u32) -> Result<usize> {
    Ok(std::fs::read_dir(format!("/proc/{pid}/fd"))
        .with_context(|| format!("listing /proc/{pid}/fd"))?
        .count())
}

/// Issue 13.2: more idle clients than the process has descriptors for. Sluice runs
/// under a limit of 256 (its hard limit too, so it cannot raise it): the API takes what
/// the reserve and the admin cap leave, the rest of the clients wait in the backlog,
/// and inserts to ClickHouse still get their connections (it is restarted meanwhile,
/// so every insert needs a new one), as does the admin endpoint.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_flood_leaves_descriptors_for_clickhouse() -> Result<()> {
    const LIMIT: usize = 256;
    const FLOOD: usize = 300;
    let mut stack = stack_with(&[
        ("api.fd_reserve", 64.into()),
        ("admin.max_connections", 8.into()),
        ("pipeline.backoff_initial", "200ms".into()),
        ("pipeline.backoff_max", "1s".into()),
    ])
    .await?;
    let dir = tempfile::tempdir()?;
    let wrapper = dir.path().join("sluice-limited");
    std::fs::write(
        &wrapper,
        format!("#!/bin/sh\nulimit -n {LIMIT} || exit 1\nexec '{SLUICE}' \"$@\"\n"),
    )?;
    std::fs::set_permissions(
        &wrapper,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )?;
    stack.start_sluice(&wrapper).await?;
    let pid = stack.sluice[0].pid().context("sluice is not running")?;
    // 256 - 64 reserved - 8 for the admin listener.
    ensure!(
        stack.sluice[0].logs_contain("api_connections=184"),
        "the caps are not in the log:\n{}",
        stack.sluice[0].log_tail(20)
    );
    ingest_ok(&stack, 0).await?;
    let before = open_descriptors(pid)?;

    let mut flood = Vec::new();
    for _ in 0..FLOOD {
        flood.push(TcpStream::connect(("127.0.0.1", stack.api_port)).await?);
    }
    wait_until(
        "sluice holds as many API connections as its cap",
        Duration::from_secs(10),
        Duration::from_millis(50),
        // Less a few pooled ClickHouse connections that may close meanwhile.
        || async { open_descriptors(pid).is_ok_and(|n| n + 8 >= before + 184) },
    )
    .await?;
    let held = open_descriptors(pid)?;
    println!("descriptors: {before} before the flood, {held} during it (limit {LIMIT})");
    assert!(
        held <= before + 184,
        "{held} descriptors: the cap did not hold"
    );

    // Every pooled connection to ClickHouse dies with it; rows published straight to
    // the stream need new ones.
    stack.clickhouse.restart().await?;
    let client = async_nats::connect(stack.nats.url()).await?;
    let js = async_nats::jetstream::new(client);
    for id in 1..=100u64 {
        js.publish(
            format!("ingest.{TENANT}.events"),
            json!({"id": id, "s": "direct"}).to_string().into(),
        )
        .await?
        .await?;
    }
    // Well within the flood: a minute of idle clients holds their connections.
    rows_land(&stack, 101, Duration::from_secs(15)).await?;
    let (status, _) = stack.admin_get("/admin/dlq").await?;
    assert_eq!(status, 200, "the admin endpoint answers during the flood");
    assert!(
        !stack.sluice[0].logs_contain("Too many open files"),
        "{}",
        stack.sluice[0].log_tail(20)
    );

    // The flood leaves: the API answers again.
    drop(flood);
    let stack = &stack;
    wait_for(
        "the API answers after the flood",
        Duration::from_secs(20),
        POLL,
        || async move { ingest_ok(stack, 1000).await },
    )
    .await?;
    ensure!(
        stack.sluice[0].logs_contain("max_connections allows"),
        "no warning that the API listener reached its cap"
    );
    Ok(())
}

/// `[api] ingest_memory` bounds what the ingest requests in progress hold together: a
/// request reserves twice its announced body before reading it. One that announces a
/// body taking the whole budget and sends it slowly holds it; another request waits a
/// moment and is answered 503 with `Retry-After`, naming the key, nothing taken. Once
/// the slow one is gone the budget is free again and rows are taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ingest_requests_in_progress_share_a_memory_budget() -> Result<()> {
    let mut stack = stack_with(&[
        ("api.max_request_bytes", "512KiB".into()),
        ("api.max_row_bytes", "64KiB".into()),
        ("api.chunk_bytes", "64KiB".into()),
        ("api.ingest_memory", "1MiB".into()),
        ("api.body_timeout", "20s".into()),
    ])
    .await?;
    stack.start_sluice(SLUICE).await?;
    let reserved = || async {
        let text = stack.metrics().await?;
        anyhow::Ok(sluice_harness::chaos::metric_value(
            &text,
            "sluice_ingest_memory_reserved_bytes",
            &[],
        ))
    };
    ensure!(reserved().await? == 0.0, "reserved before any request");

    let mut holder = TcpStream::connect(("127.0.0.1", stack.api_port)).await?;
    holder
        .write_all(
            format!(
                "POST /v1/ingest/events HTTP/1.1\r\nHost: x\r\nX-Tenant: {TENANT}\r\nContent-Type: application/x-ndjson\r\nContent-Length: {}\r\n\r\n{{\"id\": 1",
                512 << 10
            )
            .as_bytes(),
        )
        .await?;
    wait_until(
        "the slow request holds the whole budget",
        LAND,
        POLL,
        || async { reserved().await.is_ok_and(|r| r >= f64::from(1u32 << 20)) },
    )
    .await?;

    let started = Instant::now();
    let turned_away = stack
        .http()
        .post(format!("{}/v1/ingest/events", stack.api_url()))
        .header("X-Tenant", TENANT)
        .header("Content-Type", "application/x-ndjson")
        .body("{\"id\": 2, \"s\": \"waits\"}\n")
        .send()
        .await?;
    let waited = started.elapsed();
    ensure!(turned_away.status() == 503, "{}", turned_away.status());
    ensure!(
        turned_away.headers().contains_key("retry-after"),
        "{:?}",
        turned_away.headers()
    );
    let answer = turned_away.text().await?;
    ensure!(answer.contains("[api] ingest_memory"), "{answer}");
    ensure!(
        waited >= Duration::from_secs(4),
        "answered after {waited:?}: it should wait for room first"
    );

    drop(holder);
    wait_until("the budget is free again", LAND, POLL, || async {
        reserved().await.is_ok_and(|r| r == 0.0)
    })
    .await?;
    ingest_ok(&stack, 3).await?;
    rows_land(&stack, 1, LAND).await?;
    ensure!(
        stack
            .count("SELECT count() FROM events WHERE id = 2")
            .await?
            == 0,
        "the turned-away row was taken"
    );
    Ok(())
}
