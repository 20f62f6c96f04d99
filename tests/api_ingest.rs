//! `POST /v1/ingest/{table}` on real servers, as a client application sees it: what it
//! answers (status, body, headers) and what lands in ClickHouse (rows counted).

mod ingest_common;

use std::time::Duration;

use anyhow::{bail, Context, Result};
use ingest_common::{
    filling_stack, ndjson, post, settled_with, stack_with, wait_exactly, Reply, AS_TENANT, EVENTS,
    JSON, LAND, NDJSON, SLUICE,
};
use serde_json::{json, Value};
use sluice_harness::{loopback_client, wait_for, Stack, StackOptions, TENANT};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_object_an_array_and_ndjson_land() -> Result<()> {
    let stack = stack_with(&[EVENTS], &[]).await?;
    let http = stack.http().clone();

    let r = post(
        &http,
        &stack,
        "events",
        json!({"id": 1, "name": "object"}).to_string(),
        &[AS_TENANT, JSON],
    )
    .await?;
    assert_eq!(r.status, 202, "{r}");
    assert_eq!((r.n("accepted"), r.n("rejected")), (1, 0), "{r}");
    assert_eq!(r.body["errors"], json!([]), "{r}");

    let array =
        json!([{"id": 2, "name": "array"}, {"id": 3, "name": "array"}, {"id": 4, "name": "array"}]);
    let r = post(
        &http,
        &stack,
        "events",
        array.to_string(),
        &[AS_TENANT, JSON],
    )
    .await?;
    assert_eq!(r.status, 202, "{r}");
    assert_eq!((r.n("accepted"), r.n("rejected")), (3, 0), "{r}");

    // A charset parameter and CRLF line ends are fine.
    let lines = "{\"id\": 5, \"name\": \"nd\"}\r\n{\"id\": 6, \"name\": \"nd\"}\n\n{\"id\": 7, \"name\": \"nd\"}";
    let r = post(
        &http,
        &stack,
        "events",
        lines,
        &[
            AS_TENANT,
            ("Content-Type", "application/x-ndjson; charset=utf-8"),
        ],
    )
    .await?;
    assert_eq!(r.status, 202, "{r}");
    assert_eq!((r.n("accepted"), r.n("rejected")), (3, 0), "{r}");

    wait_exactly(&stack, "SELECT count() FROM events", 7).await?;
    let by_kind = stack
        .clickhouse
        .exec("SELECT name, count(), groupArray(id) FROM (SELECT * FROM events ORDER BY id) GROUP BY name ORDER BY name FORMAT TSV")
        .await?;
    assert_eq!(
        by_kind,
        "array\t3\t[2,3,4]\nnd\t3\t[5,6,7]\nobject\t1\t[1]\n"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_rows_are_reported_by_index_and_the_good_ones_land() -> Result<()> {
    let stack = stack_with(&[EVENTS], &[("api.max_row_bytes", "1KiB".into())]).await?;
    let http = stack.http().clone();

    // An array with a number and a string among objects.
    let r = post(
        &http,
        &stack,
        "events",
        r#"[{"id": 10, "name": "a"}, 5, {"id": 11, "name": "b"}, "x"]"#,
        &[AS_TENANT, JSON],
    )
    .await?;
    assert_eq!(r.status, 400, "{r}");
    assert_eq!((r.n("accepted"), r.n("rejected")), (2, 2), "{r}");
    let errors = r.body["errors"].as_array().context("errors[]")?;
    let indexes: Vec<u64> = errors.iter().filter_map(|e| e["index"].as_u64()).collect();
    assert_eq!(indexes, vec![1, 3], "{r}");
    for e in errors {
        assert!(
            e["reason"]
                .as_str()
                .is_some_and(|s| s.contains("not a JSON object")),
            "{r}"
        );
        assert!(e.get("line").is_none(), "an array row has no line: {r}");
    }

    // NDJSON: broken JSON on line 2, an array on line 5 (after a blank line), a row
    // over max_row_bytes on line 6; the index counts rows, the line counts lines.
    let big = json!({"id": 99, "name": "x".repeat(2000)});
    let body = format!(
        "{}\n{{\"id\": \n{}\n\n[1, 2]\n{big}\n{}\n",
        json!({"id": 20, "name": "c"}),
        json!({"id": 21, "name": "d"}),
        json!({"id": 22, "name": "e"}),
    );
    let r = post(&http, &stack, "events", body, &[AS_TENANT, NDJSON]).await?;
    assert_eq!(r.status, 400, "{r}");
    assert_eq!((r.n("accepted"), r.n("rejected")), (3, 3), "{r}");
    let errors: Vec<(u64, u64, String)> = r.body["errors"]
        .as_array()
        .context("errors[]")?
        .iter()
        .map(|e| {
            (
                e["index"].as_u64().unwrap_or(u64::MAX),
                e["line"].as_u64().unwrap_or(u64::MAX),
                e["reason"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    assert_eq!(
        errors.iter().map(|(i, l, _)| (*i, *l)).collect::<Vec<_>>(),
        vec![(1, 2), (3, 5), (4, 6)],
        "{r}"
    );
    assert!(errors[0].2.contains("not valid JSON"), "{r}");
    assert!(errors[1].2.contains("not a JSON object"), "{r}");
    assert!(errors[2].2.contains("over the limit"), "{r}");

    // A body that is no JSON at all: 400, nothing accepted.
    let r = post(&http, &stack, "events", "[{\"id\": 30", &[AS_TENANT, JSON]).await?;
    assert_eq!(r.status, 400, "{r}");
    assert_eq!(r.n("accepted"), 0, "{r}");
    assert!(
        r.body["error"].as_str().is_some_and(|e| !e.is_empty()),
        "{r}"
    );

    wait_exactly(&stack, "SELECT count() FROM events", 5).await?;
    let ids = stack
        .clickhouse
        .exec("SELECT groupArray(id) FROM (SELECT id FROM events ORDER BY id)")
        .await?;
    assert_eq!(ids.trim(), "[10,11,20,21,22]");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_413_415_404_400_carry_a_json_reason() -> Result<()> {
    let stack = stack_with(
        &[EVENTS],
        &[
            ("api.max_request_bytes", "64KiB".into()),
            ("api.max_row_bytes", "16KiB".into()),
        ],
    )
    .await?;
    let http = stack.http().clone();
    let error_of = |r: &Reply| r.body["error"].as_str().unwrap_or_default().to_string();

    // 413: a body over [api] max_request_bytes.
    let rows = ndjson((0..3000).map(|i| json!({"id": 1000 + i, "name": "too much"})));
    assert!(rows.len() > 64 << 10);
    let r = post(&http, &stack, "events", rows, &[AS_TENANT, NDJSON]).await?;
    assert_eq!(r.status, 413, "{r}");
    assert!(error_of(&r).contains("max_request_bytes"), "{r}");
    assert_eq!(r.n("accepted"), 0, "{r}");

    // 415: a media type that is not JSON, and none at all.
    let row = json!({"id": 1, "name": "x"}).to_string();
    let r = post(
        &http,
        &stack,
        "events",
        row.clone(),
        &[AS_TENANT, ("Content-Type", "text/plain")],
    )
    .await?;
    assert_eq!(r.status, 415, "{r}");
    assert!(error_of(&r).contains("text/plain"), "{r}");
    let r = post(&http, &stack, "events", row.clone(), &[AS_TENANT]).await?;
    assert_eq!(r.status, 415, "{r}");

    // 404: a table name that is not an identifier, or longer than one may be; the
    // answer states the whole rule, the length cap too.
    let too_long = "t".repeat(300);
    for bad in [
        "bad-name",
        "1events",
        "a.b",
        "%27%3B%20DROP",
        too_long.as_str(),
    ] {
        let r = post(&http, &stack, bad, row.clone(), &[AS_TENANT, JSON]).await?;
        assert_eq!(r.status, 404, "{bad}: {r}");
        assert!(error_of(&r).contains("not a table name"), "{bad}: {r}");
        assert!(
            error_of(&r).contains("[A-Za-z_][A-Za-z0-9_]*, at most 128 characters"),
            "{bad}: {r}"
        );
    }
    // 404: a well-formed tenant no one configured; 400 without X-Tenant or with a
    // name that is not one.
    let r = post(
        &http,
        &stack,
        "events",
        row.clone(),
        &[("X-Tenant", "globex"), JSON],
    )
    .await?;
    assert_eq!(r.status, 404, "{r}");
    assert!(error_of(&r).contains("globex"), "{r}");
    let r = post(&http, &stack, "events", row.clone(), &[JSON]).await?;
    assert_eq!(r.status, 400, "{r}");
    assert!(error_of(&r).contains("X-Tenant"), "{r}");
    let r = post(
        &http,
        &stack,
        "events",
        row.clone(),
        &[("X-Tenant", "a b"), JSON],
    )
    .await?;
    assert_eq!(r.status, 400, "{r}");
    // Two X-Tenant headers: which one counts would be a guess (a proxy may append its
    // own after the client's), so neither does.
    let r = post(
        &http,
        &stack,
        "events",
        row.clone(),
        &[AS_TENANT, ("X-Tenant", "globex"), JSON],
    )
    .await?;
    assert_eq!(r.status, 400, "{r}");
    assert!(error_of(&r).contains("more than once"), "{r}");

    // 400: an Idempotency-Key over 128 characters.
    let long_key = "k".repeat(200);
    let r = post(
        &http,
        &stack,
        "events",
        row.clone(),
        &[AS_TENANT, JSON, ("Idempotency-Key", long_key.as_str())],
    )
    .await?;
    assert_eq!(r.status, 400, "{r}");
    assert!(error_of(&r).contains("Idempotency-Key"), "{r}");

    // 400: two Idempotency-Key headers, like a repeated X-Tenant (which one counts
    // would be a guess).
    let r = post(
        &http,
        &stack,
        "events",
        row.clone(),
        &[
            AS_TENANT,
            JSON,
            ("Idempotency-Key", "first"),
            ("Idempotency-Key", "second"),
        ],
    )
    .await?;
    assert_eq!(r.status, 400, "{r}");
    assert!(
        error_of(&r).contains("Idempotency-Key header is sent more than once"),
        "{r}"
    );

    // None of that was stored: the one good request that follows is the only row.
    let r = post(
        &http,
        &stack,
        "events",
        json!({"id": 7, "name": "good"}).to_string(),
        &[AS_TENANT, JSON],
    )
    .await?;
    assert_eq!(r.status, 202, "{r}");
    wait_exactly(&stack, "SELECT count() FROM events", 1).await?;
    assert_eq!(
        stack
            .count("SELECT count() FROM events WHERE id = 7")
            .await?,
        1
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bearer_tokens_401_403_and_the_tenant_from_the_token() -> Result<()> {
    const TOKEN: &str = "acme-ingest-token-4f1e";
    let mut stack = Stack::start(StackOptions::default()).await?;
    stack.clickhouse.exec(EVENTS).await?;
    stack.set("api.auth", "token");
    stack.set(
        &format!("tenants.{TENANT}.token_env"),
        "SLUICE_TEST_ACME_TOKEN",
    );
    stack
        .env
        .push(("SLUICE_TEST_ACME_TOKEN".into(), TOKEN.into()));
    stack.start_sluice(SLUICE).await?;
    let http = stack.http().clone();
    let row = |id: u64| json!({"id": id, "name": "t"}).to_string();
    let bearer = format!("Bearer {TOKEN}");

    // No credentials (X-Tenant is no credential in token mode): 401 with a challenge.
    for headers in [vec![JSON], vec![JSON, AS_TENANT]] {
        let r = post(&http, &stack, "events", row(1), &headers).await?;
        assert_eq!(r.status, 401, "{r}");
        assert_eq!(
            r.headers
                .get("www-authenticate")
                .and_then(|v| v.to_str().ok()),
            Some("Bearer"),
            "{r}"
        );
        assert!(
            r.body["error"]
                .as_str()
                .is_some_and(|e| e.contains("Bearer")),
            "{r}"
        );
    }
    // Not a bearer token: 401.
    let r = post(
        &http,
        &stack,
        "events",
        row(2),
        &[JSON, ("Authorization", "Basic YWNtZTpzZWNyZXQ=")],
    )
    .await?;
    assert_eq!(r.status, 401, "{r}");
    // A token no tenant owns: 403, and the answer does not echo it.
    let r = post(
        &http,
        &stack,
        "events",
        row(3),
        &[JSON, ("Authorization", "Bearer not-the-token")],
    )
    .await?;
    assert_eq!(r.status, 403, "{r}");
    assert!(!r.body.to_string().contains("not-the-token"), "{r}");

    // The right token: accepted for acme, whatever X-Tenant claims.
    let r = post(
        &http,
        &stack,
        "events",
        row(4),
        &[JSON, ("Authorization", bearer.as_str())],
    )
    .await?;
    assert_eq!(r.status, 202, "{r}");
    let r = post(
        &http,
        &stack,
        "events",
        row(5),
        &[
            JSON,
            ("Authorization", bearer.as_str()),
            ("X-Tenant", "globex"),
        ],
    )
    .await?;
    assert_eq!(r.status, 202, "{r}");
    wait_exactly(&stack, "SELECT count() FROM events", 2).await?;
    assert_eq!(
        stack
            .count("SELECT count() FROM events WHERE id IN (4, 5)")
            .await?,
        2
    );
    // The counter moves once the rows are acked, a moment after ClickHouse has them.
    let stack = &stack;
    sluice_harness::wait_until(
        "sluice_rows_inserted_total{tenant=acme,table=events} is 2",
        Duration::from_secs(10),
        Duration::from_millis(100),
        || async move {
            stack.metrics_parsed().await.ok().and_then(|m| {
                m.value(
                    "sluice_rows_inserted_total",
                    &[("tenant", TENANT), ("table", "events")],
                )
            }) == Some(2.0)
        },
    )
    .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_idempotency_key_twice_lands_once() -> Result<()> {
    let stack = stack_with(&[EVENTS], &[]).await?;
    let http = stack.http().clone();

    // Each form sent twice under its key: the second answer is the first one again
    // (nothing published), marked as a replay.
    let object = json!({"id": 1, "name": "object"}).to_string();
    let batch =
        json!([{"id": 2, "name": "batch"}, {"id": 3, "name": "batch"}, {"id": 4, "name": "batch"}])
            .to_string();
    let lines = ndjson((5..8).map(|id| json!({"id": id, "name": "ndjson"})));
    for (body, content_type, key, rows) in [
        (object, JSON, "order-1", 1),
        (batch, JSON, "batch-7", 3),
        (lines, NDJSON, "nd-1", 3),
    ] {
        let headers = [AS_TENANT, content_type, ("Idempotency-Key", key)];
        let first = post(&http, &stack, "events", body.clone(), &headers).await?;
        assert_eq!(
            (first.status, first.n("accepted"), first.n("duplicates")),
            (202, rows, 0),
            "{first}"
        );
        assert!(
            !first.headers.contains_key("idempotent-replayed"),
            "{first}"
        );
        let again = post(&http, &stack, "events", body, &headers).await?;
        assert_eq!((again.status, &again.body), (202, &first.body), "{again}");
        assert_eq!(
            again
                .headers
                .get("idempotent-replayed")
                .and_then(|v| v.to_str().ok()),
            Some("true"),
            "{again}"
        );
    }

    // A row sent after the duplicates is delivered after them: once it has landed,
    // a duplicate would have too.
    settled_with(&stack, 100, 8).await?;
    assert_eq!(
        stack.count("SELECT count(DISTINCT id) FROM events").await?,
        8
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_stream_answers_503_with_retry_after_and_loses_nothing() -> Result<()> {
    let mut stack = filling_stack("64KiB", &[("api.retry_after", "7s".into())]).await?;
    let http = stack.http().clone();

    let pad = "p".repeat(300);
    let mut accepted = 0u64;
    let mut full: Option<(Reply, String, String)> = None;
    // 64 KiB hold ~200 rows of this size: 100 requests of 20 are plenty. Each request
    // has its own Idempotency-Key, as a careful client's would.
    for n in 0..100u64 {
        let rows = ndjson((0..20).map(|i| json!({"id": n * 20 + i, "name": pad})));
        let key = format!("fill-{n}");
        let r = post(
            &http,
            &stack,
            "events",
            rows.clone(),
            &[AS_TENANT, NDJSON, ("Idempotency-Key", key.as_str())],
        )
        .await?;
        accepted += r.n("accepted");
        match r.status {
            202 => assert_eq!(r.n("accepted"), 20, "{r}"),
            503 => {
                full = Some((r, rows, key));
                break;
            }
            _ => bail!("unexpected answer while filling the stream: {r}"),
        }
    }
    let (full, full_rows, full_key) =
        full.context("the stream never filled: no 503 after 100 requests")?;
    assert_eq!(
        full.headers
            .get("retry-after")
            .and_then(|v| v.to_str().ok()),
        Some("7"),
        "{full}"
    );
    assert!(
        full.body["error"]
            .as_str()
            .is_some_and(|e| e.contains("full")),
        "{full}"
    );
    assert_eq!(full.n("accepted") + full.n("not_stored"), 20, "{full}");
    assert!(full.n("not_stored") > 0, "{full}");
    assert!(
        accepted > 0,
        "nothing was accepted before the stream filled"
    );

    // A request's rows travel as one message, refused whole; single rows may still fit
    // until even one does not: then it is refused, with nothing accepted.
    let mut refused = None;
    for id in 1_000_000..1_000_200u64 {
        let r = post(
            &http,
            &stack,
            "events",
            json!({"id": id, "name": pad}).to_string(),
            &[AS_TENANT, JSON],
        )
        .await?;
        match r.status {
            202 => accepted += 1,
            503 => {
                refused = Some((id, r));
                break;
            }
            _ => bail!("unexpected answer while filling the stream: {r}"),
        }
    }
    let (refused_id, r) = refused.context("200 single rows were taken after the 503")?;
    assert_eq!(
        (r.status, r.n("accepted"), r.n("not_stored")),
        (503, 0, 1),
        "{r}"
    );
    assert!(r.headers.contains_key("retry-after"), "{r}");

    // ClickHouse returns: every accepted row lands, once.
    stack.clickhouse.start_again().await?;
    wait_exactly(&stack, "SELECT count() FROM events", accepted).await?;
    assert_eq!(
        stack.count("SELECT count(DISTINCT id) FROM events").await?,
        accepted
    );
    assert_eq!(
        stack
            .count(&format!(
                "SELECT count() FROM events WHERE id = {refused_id}"
            ))
            .await?,
        0
    );

    // The client retries the refused request with its key, as Retry-After says: the
    // rows already accepted are recognised, the rest are stored now.
    let retry = [AS_TENANT, NDJSON, ("Idempotency-Key", full_key.as_str())];
    let r = wait_for(
        "the API accepts the retried request",
        LAND,
        Duration::from_millis(200),
        || {
            let (http, stack, body) = (http.clone(), &stack, full_rows.clone());
            async move {
                let r = post(&http, stack, "events", body, &retry).await?;
                if r.status == 202 {
                    Ok(r)
                } else {
                    bail!("{r}")
                }
            }
        },
    )
    .await?;
    assert_eq!(
        (r.n("accepted"), r.n("duplicates")),
        (20, full.n("accepted")),
        "{r}"
    );
    let total = accepted + full.n("not_stored");
    wait_exactly(&stack, "SELECT count() FROM events", total).await?;
    assert_eq!(
        stack.count("SELECT count(DISTINCT id) FROM events").await?,
        total
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_after_a_503_in_the_middle_of_a_request_stores_every_row_once() -> Result<()> {
    // Messages of 10 rows (~3.3 KB): the stream takes some of a request's, not all.
    let mut stack = filling_stack("64KiB", &[("api.chunk_rows", 10.into())]).await?;
    let http = stack.http().clone();

    // Rows of ~320 B: 150 (about 48 KB) fit the stream's 64 KiB, 100 more do not.
    let pad = "p".repeat(300);
    let rows = |ids: std::ops::Range<u64>| ndjson(ids.map(|id| json!({"id": id, "name": pad})));
    let fill = [AS_TENANT, NDJSON, ("Idempotency-Key", "fill-1")];
    let r = post(&http, &stack, "events", rows(0..150), &fill).await?;
    assert_eq!((r.status, r.n("accepted")), (202, 150), "{r}");
    let body = rows(150..250);
    let key = [AS_TENANT, NDJSON, ("Idempotency-Key", "order-batch-1")];
    let first = post(&http, &stack, "events", body.clone(), &key).await?;
    assert_eq!(first.status, 503, "{first}");
    assert!(first.headers.contains_key("retry-after"), "{first}");
    assert!(
        first.body["error"]
            .as_str()
            .is_some_and(|e| e.contains("full")),
        "{first}"
    );
    let stored = first.n("accepted");
    assert!(stored > 0 && stored < 100, "not full mid-request: {first}");
    assert_eq!(
        stored % 10,
        0,
        "a message's rows are stored together: {first}"
    );
    assert_eq!(
        (stored + first.n("not_stored"), first.n("duplicates")),
        (100, 0),
        "{first}"
    );

    // ClickHouse returns and the stored rows drain; the client sends the same body
    // with the same key again (as often as it is told to): the messages stored already
    // are recognised, the rest are stored now.
    stack.clickhouse.start_again().await?;
    wait_exactly(&stack, "SELECT count() FROM events", 150 + stored).await?;
    let done = wait_for(
        "the API accepts the retried request whole",
        LAND,
        Duration::from_millis(200),
        || {
            let (http, stack, body) = (http.clone(), &stack, body.clone());
            async move {
                let r = post(&http, stack, "events", body, &key).await?;
                match r.status {
                    202 => Ok(Ok(r)),
                    503 => bail!("{r}"),
                    _ => Ok(Err(anyhow::anyhow!("unexpected answer to the retry: {r}"))),
                }
            }
        },
    )
    .await??;
    assert_eq!(done.n("accepted"), 100, "{done}");
    assert!(done.n("duplicates") >= stored, "{done}");
    wait_exactly(&stack, "SELECT count() FROM events", 250).await?;
    assert_eq!(
        stack.count("SELECT count(DISTINCT id) FROM events").await?,
        250
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_stream_of_many_row_messages_keeps_every_accepted_row() -> Result<()> {
    // Messages of 100 rows of ~1 KB (about a tenth of the budget each): on nats-server
    // before 2.10.5 Sluice's byte budget must refuse them before the server prunes
    // accepted ones, as it does for single rows.
    const BUDGET: u64 = 1 << 20;
    let mut stack = filling_stack("1MiB", &[]).await?;
    let http = stack.http().clone();

    let pad = "p".repeat(1000);
    let mut accepted = 0u64;
    let mut full = false;
    // Each request is 3 messages (300 KB): a 1 MiB stream takes a few.
    for n in 0..20u64 {
        let rows = ndjson((0..300).map(|i| json!({"id": n * 300 + i, "name": pad})));
        let key = format!("big-{n}");
        let r = post(
            &http,
            &stack,
            "events",
            rows,
            &[AS_TENANT, NDJSON, ("Idempotency-Key", key.as_str())],
        )
        .await?;
        accepted += r.n("accepted");
        match r.status {
            202 => {}
            503 => {
                assert_eq!(r.n("accepted") % 100, 0, "whole messages: {r}");
                full = true;
                break;
            }
            _ => bail!("unexpected answer while filling the stream: {r}"),
        }
    }
    assert!(full, "a 1 MiB stream took 20 requests of 300 KB");
    assert!(accepted > 0, "nothing was accepted");

    // The stream holds every accepted row, once, within its budget.
    let client = async_nats::connect(stack.nats.url()).await?;
    let js = async_nats::jetstream::new(client);
    let stream = js.get_stream("INGEST").await?;
    let state = stream.get_info().await?.state;
    assert!(state.bytes <= BUDGET, "{} bytes stored", state.bytes);
    let mut ids = std::collections::BTreeSet::new();
    let mut rows = 0u64;
    for seq in state.first_sequence..=state.last_sequence {
        let message = stream
            .get_raw_message(seq)
            .await
            .map_err(|e| anyhow::anyhow!("reading message {seq}: {e}"))?;
        for line in String::from_utf8_lossy(&message.payload).lines() {
            let row: Value = serde_json::from_str(line)?;
            ids.insert(row["id"].as_u64().context("an id")?);
            rows += 1;
        }
    }
    assert_eq!((rows, ids.len() as u64), (accepted, accepted));

    stack.clickhouse.start_again().await?;
    wait_exactly(&stack, "SELECT count() FROM events", accepted).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_unreachable_answers_503_with_retry_after() -> Result<()> {
    let mut stack = stack_with(&[EVENTS], &[("api.retry_after", "3s".into())]).await?;
    let http = stack.http().clone();
    let r = post(
        &http,
        &stack,
        "events",
        json!({"id": 1, "name": "before"}).to_string(),
        &[AS_TENANT, JSON],
    )
    .await?;
    assert_eq!(r.status, 202, "{r}");
    wait_exactly(&stack, "SELECT count() FROM events", 1).await?;

    stack.nats.stop().await?;
    // At once, not after every publish timed out: the client is waiting.
    let r = tokio::time::timeout(
        Duration::from_secs(5),
        post(
            &http,
            &stack,
            "events",
            json!({"id": 2, "name": "during"}).to_string(),
            &[AS_TENANT, JSON, ("Idempotency-Key", "during-1")],
        ),
    )
    .await
    .context("no answer within 5 s while NATS is down")??;
    assert_eq!(
        (r.status, r.n("accepted"), r.n("not_stored")),
        (503, 0, 1),
        "{r}"
    );
    assert_eq!(
        r.headers.get("retry-after").and_then(|v| v.to_str().ok()),
        Some("3"),
        "{r}"
    );
    assert!(
        r.body["error"].as_str().is_some_and(|e| e.contains("NATS")),
        "{r}"
    );

    // Not ready while NATS is away, and it says why.
    let (status, _, body) = stack
        .admin_request(reqwest::Method::GET, "/readyz", None, None)
        .await?;
    assert_eq!(status, 503, "{body}");
    assert!(body["reasons"].to_string().contains("NATS"), "{body}");

    // NATS returns: the client's retry (same key) is taken and the row lands once,
    // whether or not the first attempt reached the stream after all.
    stack.nats.start_again().await?;
    let r = wait_for(
        "the API accepts rows again",
        LAND,
        Duration::from_millis(250),
        || {
            let (http, stack) = (http.clone(), &stack);
            async move {
                let r = post(
                    &http,
                    stack,
                    "events",
                    json!({"id": 2, "name": "during"}).to_string(),
                    &[AS_TENANT, JSON, ("Idempotency-Key", "during-1")],
                )
                .await?;
                if r.status == 202 {
                    Ok(r)
                } else {
                    bail!("{r}")
                }
            }
        },
    )
    .await?;
    assert_eq!(r.n("accepted"), 1, "{r}");
    wait_exactly(&stack, "SELECT count() FROM events WHERE id = 2", 1).await?;
    assert_eq!(stack.count("SELECT count() FROM events").await?, 2);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_20000_row_request_is_accepted_whole() -> Result<()> {
    let stack = stack_with(&[EVENTS], &[]).await?;
    let http = loopback_client(Duration::from_secs(180))?;
    let rows = ndjson((0..20_000).map(|id| json!({"id": id, "name": format!("row {id}")})));
    let r = post(&http, &stack, "events", rows, &[AS_TENANT, NDJSON]).await?;
    assert_eq!(r.status, 202, "{r}");
    assert_eq!(
        (
            r.n("accepted"),
            r.n("rejected"),
            r.n("not_stored"),
            r.n("duplicates")
        ),
        (20_000, 0, 0, 0),
        "{r}"
    );
    wait_exactly(&stack, "SELECT count() FROM events", 20_000).await?;
    assert_eq!(
        stack.count("SELECT count(DISTINCT id) FROM events").await?,
        20_000
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_large_requests_all_complete() -> Result<()> {
    const REQUESTS: u64 = 6;
    const ROWS: u64 = 10_000;
    let stack = stack_with(&[EVENTS], &[]).await?;
    let http = loopback_client(Duration::from_secs(180))?;
    let requests = (0..REQUESTS).map(|n| {
        let rows =
            ndjson((0..ROWS).map(|i| json!({"id": n * ROWS + i, "name": format!("request {n}")})));
        post(&http, &stack, "events", rows, &[AS_TENANT, NDJSON])
    });
    // A stall (requests holding publish permits while waiting for more) would hang
    // here: the bound turns it into a failure.
    let replies = tokio::time::timeout(
        Duration::from_secs(240),
        futures::future::join_all(requests),
    )
    .await
    .context("concurrent large requests did not all complete within 240 s (a stall)")?;
    for r in replies {
        let r = r?;
        assert_eq!(r.status, 202, "{r}");
        assert_eq!((r.n("accepted"), r.n("not_stored")), (ROWS, 0), "{r}");
    }
    wait_exactly(&stack, "SELECT count() FROM events", REQUESTS * ROWS).await?;
    assert_eq!(
        stack.count("SELECT count(DISTINCT id) FROM events").await?,
        REQUESTS * ROWS
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_over_the_nats_payload_limit_is_refused_alone() -> Result<()> {
    // The default max_row_bytes (1 MiB) is also nats-server's default max_payload, and a
    // message's headers count against it: a row just under max_row_bytes must be
    // refused by index like any oversized row, not stop the rows after it.
    let stack = stack_with(&[EVENTS], &[]).await?;
    let http = loopback_client(Duration::from_secs(60))?;
    let big = json!({"id": 2, "name": "x".repeat((1 << 20) - 30)});
    let body = format!(
        "{}\n{big}\n{}\n",
        json!({"id": 1, "name": "small"}),
        json!({"id": 3, "name": "small"})
    );
    let r = post(
        &http,
        &stack,
        "events",
        body,
        &[AS_TENANT, NDJSON, ("Idempotency-Key", "big-1")],
    )
    .await?;
    assert_eq!(r.status, 400, "{r}");
    assert_eq!(
        (r.n("accepted"), r.n("rejected"), r.n("not_stored")),
        (2, 1, 0),
        "{r}"
    );
    assert_eq!(r.body["errors"][0]["index"], 1, "{r}");
    assert_eq!(r.body["errors"][0]["line"], 2, "{r}");
    assert!(
        r.body["errors"][0]["reason"]
            .as_str()
            .is_some_and(|e| e.contains("over the limit")),
        "{r}"
    );
    wait_exactly(&stack, "SELECT count() FROM events", 2).await?;
    assert_eq!(
        stack
            .count("SELECT count() FROM events WHERE id IN (1, 3)")
            .await?,
        2
    );
    Ok(())
}
