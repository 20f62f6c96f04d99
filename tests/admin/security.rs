//! The admin token (401 without, 403 wrong, 200 right; probes and scrapes open), and
//! secrets that never show: not in the tree, the DLQ tools, `/metrics` or the logs.

use std::collections::BTreeSet;

use anyhow::Result;
use reqwest::Method;
use serde_json::{json, Value};
use sluice_harness::{
    wait_for, Stack, StackOptions, ADMIN_TOKEN, INGEST_PASSWORD, INGEST_USER, TENANT,
};

use crate::*;

/// The admin routes that want the token, as docs/deploy.md writes them.
const GUARDED: &[(Method, &str)] = &[
    (Method::GET, "/admin/actors"),
    (Method::GET, "/admin/rates"),
    (Method::GET, "/admin/nats"),
    (Method::GET, "/admin/dlq"),
    (Method::GET, "/admin/dlq/{tenant}/{table}"),
    (Method::DELETE, "/admin/dlq/{tenant}/{table}"),
    (Method::POST, "/admin/dlq/replay"),
    (Method::POST, "/admin/debug/panic/{tenant}/{table}"),
    (Method::POST, "/admin/debug/panic-pool/{target}"),
];

/// The `GET` routes that answer without it, with the media type of their answer.
const OPEN: &[(&str, &str)] = &[
    ("/healthz", "application/json"),
    ("/readyz", "application/json"),
    ("/metrics", "text/plain; version=0.0.4; charset=utf-8"),
    ("/openapi.json", "application/json"),
    ("/admin", "text/html; charset=utf-8"),
    ("/admin/", "text/html; charset=utf-8"),
    ("/admin/assets/page.js", "text/javascript; charset=utf-8"),
    ("/admin/assets/page.css", "text/css; charset=utf-8"),
    ("/favicon.ico", "image/svg+xml"),
];

/// A request for `route` on the test's stack: the tenant's `events` table, target
/// `main`, and what each route needs besides (a purge's confirmation, a replay's body).
fn concrete(method: &Method, route: &str) -> (Method, String, Option<Value>) {
    let mut path = route
        .replace("{tenant}", TENANT)
        .replace("{table}", "events")
        .replace("{target}", "main");
    let mut body = None;
    match (method.as_str(), route) {
        ("GET", "/admin/dlq/{tenant}/{table}") => path.push_str("?limit=5"),
        ("DELETE", _) => path.push_str(&format!("?confirm={TENANT}.events")),
        ("POST", "/admin/dlq/replay") => {
            body = Some(json!({"tenant": TENANT, "table": "events", "dry_run": true}))
        }
        _ => {}
    }
    (method.clone(), path, body)
}

/// docs/deploy.md's table of admin routes: (method, route, whether it wants the token).
fn documented_admin_routes() -> Result<BTreeSet<(String, String, bool)>> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/deploy.md");
    let doc = std::fs::read_to_string(&path)?;
    let mut routes = BTreeSet::new();
    for row in doc.lines().map(str::trim).filter(|l| l.starts_with("| `")) {
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        let (Some(route), Some(token)) = (cells.get(1), cells.get(2)) else {
            continue;
        };
        let Some((method, route)) = route.trim_matches('`').split_once(' ') else {
            continue;
        };
        if !route.starts_with('/') {
            continue;
        }
        let token = match *token {
            "yes" => true,
            "no" => false,
            other => {
                anyhow::bail!("docs/deploy.md: {method} {route}: token {other:?}, want yes or no")
            }
        };
        routes.insert((method.to_string(), route.to_string(), token));
    }
    Ok(routes)
}

/// The admin endpoint's OpenAPI document: (method, route, whether it wants the token).
async fn openapi_admin_routes(stack: &Stack) -> Result<BTreeSet<(String, String, bool)>> {
    let (status, doc) = stack.admin_get("/openapi.json").await?;
    anyhow::ensure!(status == 200, "/openapi.json answered {status}");
    let mut routes = BTreeSet::new();
    for (route, item) in doc["paths"].as_object().into_iter().flatten() {
        for (method, operation) in item.as_object().into_iter().flatten() {
            if method == "parameters" {
                continue;
            }
            let token = operation["security"]
                .as_array()
                .is_some_and(|s| !s.is_empty());
            routes.insert((method.to_ascii_uppercase(), route.clone(), token));
        }
    }
    Ok(routes)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_token_guards_everything_but_probes_and_the_page() -> Result<()> {
    let mut stack = Stack::start(StackOptions::default()).await?;
    stack.clickhouse.exec(EVENTS).await?;
    stack.start_sluice(SLUICE).await?;
    ingest_ok(&stack, "events", &[json!({"id": 1, "name": "a"})]).await?;
    wait_count(&stack, "SELECT count() FROM events", 1).await?;

    // What docs/deploy.md's table of admin routes says is what this test finds.
    let documented = documented_admin_routes()?;
    let tested: BTreeSet<(String, String, bool)> = GUARDED
        .iter()
        .map(|(m, route)| (m.to_string(), route.to_string(), true))
        .chain(
            OPEN.iter()
                .map(|(route, _)| ("GET".into(), route.to_string(), false)),
        )
        .collect();
    assert_eq!(
        documented, tested,
        "docs/deploy.md's admin routes (method, route, token) and the ones this test checks"
    );
    // And the endpoint's OpenAPI document says the same.
    assert_eq!(
        openapi_admin_routes(&stack).await?,
        tested,
        "the admin endpoint's /openapi.json (method, route, token) and the ones this test checks"
    );

    let guarded: Vec<(Method, String, Option<Value>)> = GUARDED
        .iter()
        .map(|(method, route)| concrete(method, route))
        .collect();
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

    // Probes, the scraper, the page with its assets and the endpoint's description
    // need no token.
    for (path, content_type) in OPEN {
        let (status, headers, _) = stack.admin_request(Method::GET, path, None, None).await?;
        assert_eq!(status, 200, "GET {path} without a token");
        let ct = headers.get("content-type").and_then(|v| v.to_str().ok());
        assert_eq!(ct, Some(*content_type), "GET {path}");
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
