//! The fault proxy in front of a real ClickHouse: pass-through on keep-alive
//! connections, canned answers, refusal, reset, stall, scripts, rules, counters and the
//! request log.

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use sluice_harness::{
    available, clickhouse, http_client_builder, wait_until, ClickHouseServer, FaultProxy, Mode,
    Respond, Rule,
};

const DEADLINE: Duration = Duration::from_secs(10);
const POLL: Duration = Duration::from_millis(10);

/// ClickHouse with a proxy in front, or `None` (with a notice) if it is missing.
async fn clickhouse_behind_proxy(test: &str) -> Result<Option<(ClickHouseServer, FaultProxy)>> {
    if available(test, clickhouse::binary())?.is_none() {
        return Ok(None);
    }
    let server = ClickHouseServer::start().await?;
    let proxy = FaultProxy::start(server.http_addr()).await?;
    Ok(Some((server, proxy)))
}

/// A client that keeps connections alive, like Sluice's.
fn client(timeout: Duration) -> Result<reqwest::Client> {
    Ok(http_client_builder()?.timeout(timeout).build()?)
}

/// POSTs `sql` through the proxy; returns status and body.
async fn post(
    client: &reqwest::Client,
    proxy: &FaultProxy,
    sql: &str,
) -> reqwest::Result<(u16, String)> {
    let response = client
        .post(format!("{}/", proxy.url()))
        .body(sql.to_owned())
        .send()
        .await?;
    let status = response.status().as_u16();
    Ok((status, response.text().await?))
}

/// How many requests the busiest client connection carried. reqwest (hyper) under a
/// multi-threaded runtime may open a spare connection while an idle one is being
/// returned to its pool, so "exactly one connection" is not a fair test of reqwest;
/// `serves_several_requests_on_one_raw_connection` checks the proxy exactly.
fn most_requests_on_one_connection(proxy: &FaultProxy) -> usize {
    let log = proxy.requests();
    log.iter()
        .map(|r| {
            log.iter()
                .filter(|other| other.connection == r.connection)
                .count()
        })
        .max()
        .unwrap_or(0)
}

/// An upstream-free proxy, for tests that never pass anything through.
async fn proxy_to_nowhere() -> Result<FaultProxy> {
    FaultProxy::start(sluice_harness::free_addr()?).await
}

/// Writes a raw request on a new connection and reads until EOF or error (on a
/// blocking thread, so the proxy keeps running meanwhile).
async fn raw_exchange(
    proxy: &FaultProxy,
    request: &'static [u8],
) -> Result<std::io::Result<Vec<u8>>> {
    let addr = proxy.addr();
    let exchange = tokio::task::spawn_blocking(move || {
        let mut stream = TcpStream::connect(addr)?;
        stream.set_read_timeout(Some(DEADLINE))?;
        stream.write_all(request)?;
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer)?;
        Ok(answer)
    });
    exchange.await.context("the blocking exchange panicked")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passes_queries_through_on_one_keep_alive_connection() -> Result<()> {
    let Some((server, proxy)) =
        clickhouse_behind_proxy("passes_queries_through_on_one_keep_alive_connection").await?
    else {
        return Ok(());
    };
    server
        .exec("CREATE TABLE t (n UInt64) ENGINE = MergeTree ORDER BY n")
        .await?;
    let client = client(DEADLINE)?;

    for i in 0..5u64 {
        let (status, body) = post(&client, &proxy, &format!("SELECT {i} + 1")).await?;
        assert_eq!((status, body.trim()), (200, (i + 1).to_string().as_str()));
    }
    // A large chunked answer and an insert with a body, on the same connection.
    let (status, body) = post(
        &client,
        &proxy,
        "SELECT number FROM system.numbers LIMIT 100000",
    )
    .await?;
    assert_eq!(status, 200);
    assert_eq!(body.lines().count(), 100_000);
    assert_eq!(body.lines().last(), Some("99999"));
    let rows: String = (0..1000).map(|n| format!("{{\"n\":{n}}}\n")).collect();
    let response = client
        .post(format!(
            "{}/?query={}",
            proxy.url(),
            "INSERT%20INTO%20t%20FORMAT%20JSONEachRow"
        ))
        .body(rows)
        .send()
        .await?;
    assert_eq!(
        response.status().as_u16(),
        200,
        "{}",
        response.text().await?
    );
    assert_eq!(server.count("t").await?, 1000);

    // A ClickHouse error passes through untouched.
    let (status, body) = post(&client, &proxy, "SELECT * FROM missing_table").await?;
    assert_ne!(status, 200);
    assert!(body.starts_with("Code: 60"), "{body}");

    assert_eq!(proxy.requests_seen(), 8);
    assert_eq!(proxy.requests_forwarded(), 8);
    assert!(
        most_requests_on_one_connection(&proxy) >= 2,
        "{:?}",
        proxy.requests()
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serves_several_requests_on_one_raw_connection() -> Result<()> {
    let Some((_server, proxy)) =
        clickhouse_behind_proxy("serves_several_requests_on_one_raw_connection").await?
    else {
        return Ok(());
    };
    proxy
        .script([Respond::status_only(503)], Mode::PassThrough)
        .await?;
    // Three requests written at once; the last asks to close, which ends the exchange.
    let answer = raw_exchange(
        &proxy,
        b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 8\r\n\r\nSELECT 1\
          POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 8\r\n\r\nSELECT 2\
          POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 8\r\nConnection: close\r\n\r\nSELECT 3",
    )
    .await??;
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert_eq!(answer.matches("HTTP/1.1 200 OK").count(), 2, "{answer}");
    assert!(
        answer.contains("\r\n2\n\r\n") && answer.contains("\r\n3\n\r\n"),
        "{answer}"
    );
    assert_eq!(proxy.connections_accepted(), 1);
    assert_eq!(proxy.requests_seen(), 3);
    assert_eq!(proxy.requests_forwarded(), 2);
    assert!(proxy.requests().iter().all(|r| r.connection == 0));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_like_modern_and_old_servers_and_proxies() -> Result<()> {
    let proxy = proxy_to_nowhere().await?;
    let client = client(DEADLINE)?;

    proxy
        .set_mode(Respond::clickhouse_modern(
            252,
            "TOO_MANY_PARTS",
            "Too many parts (300)",
        ))
        .await?;
    let response = client
        .post(format!("{}/", proxy.url()))
        .body("INSERT")
        .send()
        .await?;
    assert_eq!(response.status().as_u16(), 500);
    let code = response
        .headers()
        .get("X-ClickHouse-Exception-Code")
        .cloned();
    assert_eq!(code.as_ref().map(|v| v.as_bytes()), Some(&b"252"[..]));
    let body = response.text().await?;
    assert_eq!(
        body,
        "Code: 252. DB::Exception: Too many parts (300). (TOO_MANY_PARTS) (version 24.8.1.1)\n"
    );

    proxy
        .set_mode(Respond::clickhouse_old(241, "Memory limit exceeded"))
        .await?;
    let response = client
        .post(format!("{}/", proxy.url()))
        .body("INSERT")
        .send()
        .await?;
    assert_eq!(response.status().as_u16(), 500);
    assert!(response
        .headers()
        .get("X-ClickHouse-Exception-Code")
        .is_none());
    assert!(response
        .text()
        .await?
        .starts_with("Code: 241, e.displayText() = DB::Exception: Memory limit exceeded"));

    proxy.set_mode(Respond::status_only(503)).await?;
    let (status, body) = post(&client, &proxy, "SELECT 1").await?;
    assert_eq!((status, body.as_str()), (503, ""));

    proxy
        .set_mode(
            Respond::new(429)
                .header("Retry-After", "2")
                .body("slow down"),
        )
        .await?;
    let response = client.get(format!("{}/ping", proxy.url())).send().await?;
    assert_eq!(response.status().as_u16(), 429);
    assert_eq!(response.headers()["retry-after"], "2");
    assert_eq!(response.text().await?, "slow down");

    assert_eq!(proxy.requests_seen(), 4);
    assert_eq!(proxy.requests_forwarded(), 0);
    assert!(
        most_requests_on_one_connection(&proxy) >= 2,
        "{:?}",
        proxy.requests()
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refuse_closes_the_port_and_reopens_it_on_the_same_number() -> Result<()> {
    let Some((_server, proxy)) =
        clickhouse_behind_proxy("refuse_closes_the_port_and_reopens_it_on_the_same_number").await?
    else {
        return Ok(());
    };
    let client = client(DEADLINE)?;
    assert_eq!(post(&client, &proxy, "SELECT 1").await?.0, 200);

    proxy.set_mode(Mode::Refuse).await?;
    let refused = TcpStream::connect(proxy.addr())
        .err()
        .context("the port still accepts")?;
    assert_eq!(refused.kind(), ErrorKind::ConnectionRefused);
    // The kept-alive connection was reset too; the retry on a new one is refused.
    let error = post(&client, &proxy, "SELECT 1")
        .await
        .err()
        .context("a refusing proxy answered")?;
    assert!(error.is_connect() || error.is_request(), "{error:?}");

    proxy.set_mode(Mode::PassThrough).await?;
    assert_eq!(
        post(&client, &proxy, "SELECT 2").await?,
        (200, "2\n".to_owned())
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_resets_the_connection() -> Result<()> {
    let proxy = proxy_to_nowhere().await?;
    proxy.set_mode(Mode::Reset).await?;

    let error = raw_exchange(
        &proxy,
        b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n0123456789",
    )
    .await?
    .err()
    .context("a reset connection answered")?;
    assert_eq!(error.kind(), ErrorKind::ConnectionReset, "{error}");

    let client = client(DEADLINE)?;
    let error = post(&client, &proxy, "SELECT 1")
        .await
        .err()
        .context("reqwest got an answer")?;
    assert!(!error.is_timeout(), "{error:?}");

    wait_until("both requests logged", DEADLINE, POLL, || async {
        proxy.requests().len() == 2
    })
    .await?;
    let log = proxy.requests();
    assert!(log.iter().all(|r| r.action == "reset"), "{log:?}");
    assert!(
        log[0].body_len <= 5,
        "read more than half the body: {log:?}"
    );
    assert_eq!(proxy.requests_forwarded(), 0);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_since_lists_what_came_after_a_moment() -> Result<()> {
    let proxy = proxy_to_nowhere().await?;
    proxy.set_mode(Respond::ok("1\n")).await?;
    let client = client(DEADLINE)?;
    post(&client, &proxy, "SELECT 1").await?;
    post(&client, &proxy, "SELECT 2").await?;
    let moment = proxy.requests_seen();
    assert!(proxy.requests_since(moment).is_empty());
    post(&client, &proxy, "SELECT 3").await?;
    let after: Vec<String> = proxy
        .requests_since(moment)
        .iter()
        .map(|r| r.body_prefix.clone())
        .collect();
    assert_eq!(after, ["SELECT 3"]);
    // Numbers keep counting across a cleared log.
    proxy.clear_requests();
    post(&client, &proxy, "SELECT 4").await?;
    let after: Vec<u64> = proxy.requests_since(moment).iter().map(|r| r.seq).collect();
    assert_eq!(after, [3]);
    assert_eq!(proxy.requests_since(0).len(), 1);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stall_never_answers() -> Result<()> {
    let proxy = proxy_to_nowhere().await?;
    proxy.set_mode(Mode::Stall).await?;
    let client = client(Duration::from_millis(300))?;

    let started = Instant::now();
    let error = post(&client, &proxy, "SELECT sleep(1)")
        .await
        .err()
        .context("a stall answered")?;
    assert!(error.is_timeout(), "{error:?}");
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert_eq!(proxy.requests_seen(), 1);
    assert_eq!(proxy.requests()[0].body_prefix, "SELECT sleep(1)");
    assert_eq!(proxy.requests()[0].action, "stall");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_proxy_resets_stalled_connections() -> Result<()> {
    let proxy = proxy_to_nowhere().await?;
    proxy.set_mode(Mode::Stall).await?;
    let addr = proxy.addr();
    let waiting = tokio::task::spawn_blocking(move || {
        let mut stream = TcpStream::connect(addr)?;
        stream.set_read_timeout(Some(DEADLINE))?;
        stream.write_all(b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n")?;
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).map(|_| answer)
    });
    proxy.wait_for_requests(1, DEADLINE).await?;
    drop(proxy);
    let outcome = waiting.await?;
    let error = outcome.err().context("a stalled request got an answer")?;
    assert_eq!(error.kind(), ErrorKind::ConnectionReset, "{error}");
    // The listener closes when the runtime drops the aborted listener task, which may
    // come after the connection tasks ran their resets: wait for it, not assume it.
    wait_until(
        "the dropped proxy's port to refuse",
        DEADLINE,
        POLL,
        || async move {
            TcpStream::connect(addr).is_err_and(|e| e.kind() == ErrorKind::ConnectionRefused)
        },
    )
    .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn script_answers_503_three_times_then_passes_through() -> Result<()> {
    let Some((_server, proxy)) =
        clickhouse_behind_proxy("script_answers_503_three_times_then_passes_through").await?
    else {
        return Ok(());
    };
    proxy
        .script(vec![Respond::status_only(503); 3], Mode::PassThrough)
        .await?;
    assert_eq!(proxy.queued(), 3);
    let client = client(DEADLINE)?;

    let mut statuses = Vec::new();
    for _ in 0..5 {
        statuses.push(post(&client, &proxy, "SELECT 1").await?.0);
    }
    assert_eq!(statuses, [503, 503, 503, 200, 200]);
    assert_eq!(proxy.queued(), 0);
    assert_eq!(proxy.requests_seen(), 5);
    assert_eq!(proxy.requests_forwarded(), 2);
    assert!(
        most_requests_on_one_connection(&proxy) >= 2,
        "{:?}",
        proxy.requests()
    );

    // A reset inside a script costs one request; the queue goes on after it.
    proxy.script([Mode::Reset], Mode::PassThrough).await?;
    assert!(post(&client, &proxy, "SELECT 1").await.is_err());
    assert_eq!(post(&client, &proxy, "SELECT 1").await?.0, 200);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rules_match_query_or_body_ahead_of_the_script() -> Result<()> {
    let Some((_server, proxy)) =
        clickhouse_behind_proxy("rules_match_query_or_body_ahead_of_the_script").await?
    else {
        return Ok(());
    };
    // A modern server's answer to a feature probe; every other request is refused 503.
    proxy.add_rule(Rule::contains(
        "system.settings",
        Respond::ok("async_insert\t0\ninsert_deduplication_token\t\n"),
    ));
    proxy.add_rule(Rule::query_contains("max_threads=3", Mode::PassThrough).times(1));
    proxy.set_mode(Respond::status_only(503)).await?;
    let client = client(DEADLINE)?;

    let probe = "SELECT name, value FROM system.settings WHERE name = 'async_insert'";
    let in_body = post(&client, &proxy, probe).await?;
    assert_eq!(
        in_body,
        (
            200,
            "async_insert\t0\ninsert_deduplication_token\t\n".to_owned()
        )
    );
    let in_query = client
        .get(reqwest::Url::parse_with_params(
            &format!("{}/", proxy.url()),
            [("query", probe)],
        )?)
        .send()
        .await?;
    assert_eq!(in_query.status().as_u16(), 200);
    assert_eq!(post(&client, &proxy, "SELECT 1").await?.0, 503);

    let one_shot = client
        .post(format!("{}/?max_threads=3", proxy.url()))
        .body("SELECT 7")
        .send()
        .await?;
    assert_eq!(
        one_shot.text().await?.trim(),
        "7",
        "the one-shot rule passed through"
    );
    let again = client
        .post(format!("{}/?max_threads=3", proxy.url()))
        .body("SELECT 7")
        .send()
        .await?;
    assert_eq!(again.status().as_u16(), 503, "the one-shot rule is used up");

    let actions: Vec<String> = proxy.requests().into_iter().map(|r| r.action).collect();
    assert_eq!(
        actions,
        [
            "rule 0: respond 200",
            "rule 0: respond 200",
            "respond 503",
            "rule 1: pass",
            "respond 503"
        ]
    );
    proxy.clear_rules();
    assert_eq!(post(&client, &proxy, probe).await?.0, 503);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_log_shows_what_the_client_sent() -> Result<()> {
    let Some((server, proxy)) =
        clickhouse_behind_proxy("the_log_shows_what_the_client_sent").await?
    else {
        return Ok(());
    };
    server
        .exec("CREATE TABLE t (n UInt64) ENGINE = Memory")
        .await?;
    let client = client(DEADLINE)?;
    let response = client
        .post(reqwest::Url::parse_with_params(
            &format!("{}/", proxy.url()),
            [
                ("query", "INSERT INTO t FORMAT JSONEachRow"),
                ("max_insert_block_size", "100"),
            ],
        )?)
        .basic_auth("default", Some(""))
        .body("{\"n\":1}\n{\"n\":2}\n")
        .send()
        .await?;
    assert_eq!(response.status().as_u16(), 200);

    let log = proxy.requests();
    assert_eq!(log.len(), 1);
    let record = &log[0];
    assert_eq!(record.method, "POST");
    assert_eq!(record.path(), "/");
    assert_eq!(
        record.query_param("query").as_deref(),
        Some("INSERT INTO t FORMAT JSONEachRow")
    );
    assert_eq!(
        record.query_param("max_insert_block_size").as_deref(),
        Some("100")
    );
    assert_eq!(record.query_param("async_insert"), None);
    assert!(record
        .header("authorization")
        .is_some_and(|v| v.starts_with("Basic ")));
    assert_eq!(record.body_prefix, "{\"n\":1}\n{\"n\":2}\n");
    assert_eq!(record.body_len, 16);
    assert_eq!(record.action, "pass");
    assert!(record.request_line().starts_with("POST /?query=INSERT"));

    proxy.clear_requests();
    assert!(proxy.requests().is_empty());
    assert_eq!(
        proxy.requests_seen(),
        1,
        "clearing the log keeps the counters"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunked_requests_pass_through() -> Result<()> {
    let Some((server, proxy)) = clickhouse_behind_proxy("chunked_requests_pass_through").await?
    else {
        return Ok(());
    };
    server
        .exec("CREATE TABLE t (n UInt64) ENGINE = Memory")
        .await?;
    let request = b"POST /?query=INSERT%20INTO%20t%20FORMAT%20JSONEachRow HTTP/1.1\r\n\
                    Host: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n\
                    8\r\n{\"n\":1}\n\r\n8\r\n{\"n\":2}\n\r\n0\r\n\r\n";
    let answer = raw_exchange(&proxy, request).await??;
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert_eq!(server.count("t").await?, 2);
    assert_eq!(proxy.requests()[0].body_prefix, "{\"n\":1}\n{\"n\":2}\n");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delay_slows_a_request_down() -> Result<()> {
    let Some((_server, proxy)) = clickhouse_behind_proxy("delay_slows_a_request_down").await?
    else {
        return Ok(());
    };
    proxy
        .set_mode(Mode::Delay(Duration::from_millis(300)))
        .await?;
    let client = client(DEADLINE)?;
    let started = Instant::now();
    assert_eq!(
        post(&client, &proxy, "SELECT 3").await?,
        (200, "3\n".to_owned())
    );
    assert!(started.elapsed() >= Duration::from_millis(300));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_upstream_resets_the_client() -> Result<()> {
    let proxy = proxy_to_nowhere().await?;
    let error = raw_exchange(&proxy, b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n")
        .await?
        .err()
        .context("a dead upstream answered")?;
    assert_eq!(error.kind(), ErrorKind::ConnectionReset, "{error}");
    assert_eq!(proxy.requests_forwarded(), 0);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_script_can_end_in_refusal() -> Result<()> {
    let proxy = proxy_to_nowhere().await?;
    proxy
        .script([Respond::status_only(503)], Mode::Refuse)
        .await?;
    let client = client(DEADLINE)?;
    // The queued answer is delivered even though taking it closes the port.
    assert_eq!(post(&client, &proxy, "SELECT 1").await?.0, 503);
    let addr = proxy.addr();
    wait_until("the port to refuse", DEADLINE, POLL, || async move {
        TcpStream::connect(addr).is_err_and(|e| e.kind() == ErrorKind::ConnectionRefused)
    })
    .await?;
    let error = post(&client, &proxy, "SELECT 1")
        .await
        .err()
        .context("a refusing proxy answered")?;
    assert!(!error.is_timeout(), "{error:?}");

    proxy.set_mode(Respond::ok("1\n")).await?;
    assert_eq!(
        post(&client, &proxy, "SELECT 1").await?,
        (200, "1\n".to_owned())
    );
    Ok(())
}

/// A passed request is logged unanswered while the upstream holds it, and answered once
/// its answer came back: what a freeze that catches an insert still out tells by.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_passed_request_is_logged_unanswered_until_its_answer_comes_back() -> Result<()> {
    let Some((_server, proxy)) = clickhouse_behind_proxy(
        "a_passed_request_is_logged_unanswered_until_its_answer_comes_back",
    )
    .await?
    else {
        return Ok(());
    };
    let client = client(DEADLINE)?;
    let slow = {
        let (client, proxy_url) = (client.clone(), proxy.url());
        tokio::spawn(async move {
            client
                .post(format!("{proxy_url}/"))
                .body("SELECT sleep(2)")
                .send()
                .await
                .map(|r| r.status().as_u16())
        })
    };
    wait_until("the slow request was passed", DEADLINE, POLL, || async {
        proxy.requests_forwarded() == 1
    })
    .await?;
    let out = proxy.requests();
    assert_eq!(out.len(), 1, "{out:?}");
    assert!(!out[0].answered, "held by the server: {out:?}");
    assert_eq!(slow.await??, 200);
    let back = proxy.requests();
    assert!(back[0].answered, "{back:?}");
    Ok(())
}
