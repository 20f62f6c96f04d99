//! The admin token (401 without, 403 wrong, 200 right; probes and scrapes open), and
//! secrets that never show: not in the tree, the DLQ tools, `/metrics` or the logs.

use anyhow::Result;
use reqwest::Method;
use serde_json::{json, Value};
use sluice_harness::{
    wait_for, Stack, StackOptions, ADMIN_TOKEN, INGEST_PASSWORD, INGEST_USER, TENANT,
};

use crate::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_token_guards_everything_but_probes_and_the_page() -> Result<()> {
    let mut stack = Stack::start(StackOptions::default()).await?;
    stack.clickhouse.exec(EVENTS).await?;
    stack.start_sluice(SLUICE).await?;
    ingest_ok(&stack, "events", &[json!({"id": 1, "name": "a"})]).await?;
    wait_count(&stack, "SELECT count() FROM events", 1).await?;

    let replay = json!({"tenant": TENANT, "table": "events", "dry_run": true});
    let guarded: Vec<(Method, String, Option<Value>)> = vec![
        (Method::GET, "/admin/actors".into(), None),
        (Method::GET, "/admin/rates".into(), None),
        (Method::GET, "/admin/nats".into(), None),
        (Method::GET, "/admin/dlq".into(), None),
        (
            Method::GET,
            format!("/admin/dlq/{TENANT}/events?limit=5"),
            None,
        ),
        (Method::POST, "/admin/dlq/replay".into(), Some(replay)),
        (
            Method::DELETE,
            format!("/admin/dlq/{TENANT}/events?confirm={TENANT}.events"),
            None,
        ),
        (
            Method::POST,
            format!("/admin/debug/panic/{TENANT}/events"),
            None,
        ),
        (Method::POST, "/admin/debug/panic-pool/main".into(), None),
    ];
    for (method, path, body) in &guarded {
        let (status, headers, answer) = stack
            .admin_request(method.clone(), path, None, body.as_ref())
            .await?;
        assert_eq!(status, 401, "{method} {path} without a token: {answer}");
        assert_eq!(
            headers
                .get("www-authenticate")
                .and_then(|v| v.to_str().ok()),
            Some("Bearer"),
            "{method} {path}"
        );
        assert!(answer["error"].is_string(), "{method} {path}: {answer}");
        let (status, _, answer) = stack
            .admin_request(
                method.clone(),
                path,
                Some("not-the-admin-token"),
                body.as_ref(),
            )
            .await?;
        assert_eq!(status, 403, "{method} {path} with a wrong token: {answer}");
        assert!(
            !answer.to_string().contains("not-the-admin-token"),
            "{answer}"
        );
    }
    // Not a bearer token at all: 401.
    let response = stack
        .http()
        .get(format!("{}/admin/actors", stack.admin_url()))
        .header("Authorization", format!("Basic {ADMIN_TOKEN}"))
        .send()
        .await?;
    assert_eq!(response.status().as_u16(), 401);
    // The right token, whatever the scheme's case (RFC 9110: case-insensitive).
    for scheme in ["Bearer", "bearer", "BEARER"] {
        let response = stack
            .http()
            .get(format!("{}/admin/actors", stack.admin_url()))
            .header("Authorization", format!("{scheme} {ADMIN_TOKEN}"))
            .send()
            .await?;
        assert_eq!(response.status().as_u16(), 200, "scheme {scheme}");
    }
    for path in [
        "/admin/actors".to_string(),
        "/admin/rates".to_string(),
        "/admin/nats".to_string(),
        "/admin/dlq".to_string(),
        format!("/admin/dlq/{TENANT}/events?limit=5"),
    ] {
        let (status, answer) = admin(&stack, &path).await?;
        assert_eq!(status, 200, "GET {path}: {answer}");
    }
    let (status, _, answer) = stack
        .admin_request(
            Method::POST,
            "/admin/dlq/replay",
            Some(ADMIN_TOKEN),
            Some(&json!({"tenant": TENANT, "table": "events", "dry_run": true})),
        )
        .await?;
    assert_eq!(status, 200, "{answer}");

    // Probes, the scraper, the page with its assets and the API's description need no
    // token.
    for (path, content_type) in [
        ("/healthz", "application/json"),
        ("/readyz", "application/json"),
        ("/metrics", "text/plain; version=0.0.4; charset=utf-8"),
        ("/admin/", "text/html; charset=utf-8"),
        ("/admin/assets/page.js", "text/javascript; charset=utf-8"),
        ("/admin/assets/page.css", "text/css; charset=utf-8"),
        ("/favicon.ico", "image/svg+xml"),
        ("/openapi.json", "application/json"),
    ] {
        let (status, headers, _) = stack.admin_request(Method::GET, path, None, None).await?;
        assert_eq!(status, 200, "GET {path} without a token");
        let ct = headers.get("content-type").and_then(|v| v.to_str().ok());
        assert_eq!(ct, Some(content_type), "GET {path}");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_never_show_in_the_tree_the_dlq_metrics_or_logs() -> Result<()> {
    const TENANT_TOKEN: &str = "tenant-token-5b9c2e71";
    const NATS_TOKEN: &str = "nats-token-0d3a8f64";
    let secrets = [ADMIN_TOKEN, TENANT_TOKEN, NATS_TOKEN, INGEST_PASSWORD];

    let mut stack =
        Stack::start(StackOptions::default().with_nats_args(["--auth", NATS_TOKEN])).await?;
    stack.clickhouse.exec(EVENTS).await?;
    stack.set("nats.token_env", "SLUICE_TEST_NATS_TOKEN");
    stack.set("clickhouse.targets.main.user", INGEST_USER);
    stack.set(
        "clickhouse.targets.main.password_env",
        "SLUICE_TEST_CH_PASSWORD",
    );
    stack.set("api.auth", "token");
    stack.set(
        &format!("tenants.{TENANT}.token_env"),
        "SLUICE_TEST_TENANT_TOKEN",
    );
    // Everything the process says, at its most talkative.
    stack.set("log.level", "debug");
    stack.env.extend([
        ("SLUICE_TEST_NATS_TOKEN".to_string(), NATS_TOKEN.to_string()),
        (
            "SLUICE_TEST_CH_PASSWORD".to_string(),
            INGEST_PASSWORD.to_string(),
        ),
        (
            "SLUICE_TEST_TENANT_TOKEN".to_string(),
            TENANT_TOKEN.to_string(),
        ),
    ]);
    stack.start_sluice(SLUICE).await?;

    // Traffic: rows that land, a row that is parked, a wrong token, an outage.
    let http = stack.http().clone();
    let url = format!("{}/v1/ingest/events", stack.api_url());
    let post = |body: String, token: &'static str| {
        http.post(&url)
            .header("Content-Type", "application/json")
            .bearer_auth(token)
            .body(body)
            .send()
    };
    let r = post(
        json!([{"id": 1, "name": "a"}, {"id": "x", "name": "bad"}]).to_string(),
        TENANT_TOKEN,
    )
    .await?;
    assert_eq!(r.status().as_u16(), 202);
    let r = post(json!({"id": 2, "name": "b"}).to_string(), "wrong-token").await?;
    assert_eq!(r.status().as_u16(), 403);
    wait_count(&stack, "SELECT count() FROM events", 1).await?;
    wait_for("the bad row is parked", DEADLINE, POLL, || async {
        match dlq_count(&stack, TENANT, "events").await? {
            1 => Ok(()),
            n => anyhow::bail!("{n} parked"),
        }
    })
    .await?;
    stack.clickhouse.stop().await?;
    let r = post(json!({"id": 3, "name": "c"}).to_string(), TENANT_TOKEN).await?;
    assert_eq!(r.status().as_u16(), 202);
    wait_node(&stack, "pool", "main", "the breaker opens", |n| {
        n["state"]["breaker"]["state"] != "closed"
    })
    .await?;
    stack.clickhouse.start_again().await?;
    wait_count(&stack, "SELECT count() FROM events", 2).await?;

    // Everything an operator can read.
    let mut pages = Vec::new();
    for path in [
        "/admin/actors".to_string(),
        "/admin/rates".to_string(),
        "/admin/nats".to_string(),
        "/admin/dlq".to_string(),
        format!("/admin/dlq/{TENANT}/events?limit=100"),
        "/readyz".to_string(),
    ] {
        let (status, body) = admin(&stack, &path).await?;
        assert_eq!(status, 200, "{path}: {body}");
        pages.push((path, body.to_string()));
    }
    pages.push(("/metrics".into(), stack.metrics().await?));
    // Stop the process so its last words (shutdown) are in the log too.
    stack.sluice[0]
        .stop(std::time::Duration::from_secs(20))
        .await?;
    let logs = stack.sluice_output(0)?;
    assert!(
        logs.lines().count() > 20,
        "the debug log is suspiciously short:\n{logs}"
    );
    pages.push(("the logs".into(), logs));

    for (name, text) in &pages {
        for secret in secrets {
            assert!(!text.contains(secret), "{name} shows the secret {secret:?}");
        }
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_token_the_admin_endpoint_is_loopback_only_and_says_so() -> Result<()> {
    let mut stack = Stack::start(StackOptions::default()).await?;
    stack.env.retain(|(k, _)| k != "SLUICE_ADMIN_TOKEN");
    // Asked to listen everywhere, without a token: it binds loopback instead.
    stack.set("admin.listen", format!("0.0.0.0:{}", stack.admin_port));
    stack.start_sluice(SLUICE).await?;
    let logs = stack.sluice_output(0)?;
    assert!(
        logs.contains("loopback only"),
        "no word of it at start:\n{logs}"
    );
    let (status, _, body) = stack
        .admin_request(Method::GET, "/admin/actors", None, None)
        .await?;
    assert_eq!(status, 200, "{body}");
    // The listening socket, as the kernel has it: 127.0.0.1 (0100007F), not 0.0.0.0.
    let port = format!(":{:04X}", stack.admin_port);
    let tcp = std::fs::read_to_string("/proc/net/tcp")?;
    let listening: Vec<&str> = tcp
        .lines()
        .filter_map(|l| {
            let fields: Vec<&str> = l.split_whitespace().collect();
            // local_address, state 0A = LISTEN
            (fields.len() > 3 && fields[1].ends_with(&port) && fields[3] == "0A")
                .then_some(fields[1])
        })
        .collect();
    assert_eq!(listening, vec![format!("0100007F{port}").as_str()], "{tcp}");
    Ok(())
}
