//! The DLQ tools: peek shows parked rows with every `Sluice-*` header, a dry-run replay
//! changes nothing, a replay after the table is fixed lands the rows and empties the
//! DLQ, a purge wants its confirmation.

use anyhow::{bail, Context, Result};
use reqwest::Method;
use serde_json::{json, Value};
use sluice_harness::{Stack, ADMIN_TOKEN, TENANT};

use crate::*;

/// docs/architecture.md, "Contracts".
const HEADERS: &[&str] = &[
    "Sluice-Tenant",
    "Sluice-Table",
    "Sluice-Error-Class",
    "Sluice-Error-Code",
    "Sluice-Error",
    "Sluice-Original-Subject",
    "Sluice-Original-Sequence",
    "Sluice-Deliveries",
    "Sluice-Parked-At",
];

/// Purges `table`'s parked rows, confirmed; how many went.
async fn purge(stack: &Stack, table: &str) -> Result<u64> {
    let (status, _, body) = stack
        .admin_request(
            Method::DELETE,
            &format!("/admin/dlq/{TENANT}/{table}?confirm={TENANT}.{table}"),
            Some(ADMIN_TOKEN),
            None,
        )
        .await?;
    if status != 200 {
        bail!("purge {table}: {status} {body}");
    }
    body["purged"].as_u64().context("purged")
}

async fn replay(stack: &Stack, body: Value) -> Result<Value> {
    let (status, _, answer) = stack
        .admin_request(
            Method::POST,
            "/admin/dlq/replay",
            Some(ADMIN_TOKEN),
            Some(&body),
        )
        .await?;
    if status != 200 {
        bail!("replay {body}: {status} {answer}");
    }
    Ok(answer)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peek_dry_run_replay_after_a_fix_and_purge() -> Result<()> {
    let stack = dlq_stack().await?;

    // Two good rows land; three whose `v` is text are parked.
    let rows = vec![
        json!({"id": 1, "v": 10}),
        json!({"id": 2, "v": "twenty"}),
        json!({"id": 3, "v": 30}),
        json!({"id": 4, "v": "forty"}),
        json!({"id": 5, "v": "fifty"}),
    ];
    ingest_ok(&stack, "orders", &rows).await?;
    wait_count(&stack, "SELECT count() FROM orders", 2).await?;
    wait_parked(&stack, "orders", 3).await?;

    // Peek: the rows as they came, in order, with every header; nothing consumed.
    let (status, peek) = admin(&stack, &format!("/admin/dlq/{TENANT}/orders?limit=10")).await?;
    assert_eq!(status, 200, "{peek}");
    let parked = peek["rows"].as_array().context("rows[]")?.clone();
    let ids: Vec<_> = parked
        .iter()
        .map(|r| sluice_harness::parked_json(r)["id"].clone())
        .collect();
    assert_eq!(ids, vec![json!(2), json!(4), json!(5)], "{peek}");
    for row in &parked {
        let h = &row["headers"];
        for name in HEADERS {
            assert!(h[*name].is_string(), "no {name} on {row}");
        }
        assert_eq!(h["Sluice-Tenant"], TENANT, "{row}");
        assert_eq!(h["Sluice-Table"], "orders", "{row}");
        assert_eq!(h["Sluice-Error-Class"], "Rejected", "{row}");
        let code = h["Sluice-Error-Code"].as_str().unwrap_or_default();
        assert!(
            code.parse::<u32>().is_ok(),
            "Sluice-Error-Code {code:?}: {row}"
        );
        let error = h["Sluice-Error"].as_str().unwrap_or_default();
        assert!(!error.is_empty() && error.len() <= 1024, "{row}");
        assert_eq!(
            h["Sluice-Original-Subject"],
            format!("ingest.{TENANT}.orders"),
            "{row}"
        );
        let seq = h["Sluice-Original-Sequence"].as_str().unwrap_or_default();
        assert!(seq.parse::<u64>().is_ok_and(|s| s > 0), "{row}");
        let deliveries = h["Sluice-Deliveries"].as_str().unwrap_or_default();
        assert!(deliveries.parse::<u64>().is_ok_and(|d| d >= 1), "{row}");
        let at = h["Sluice-Parked-At"].as_str().unwrap_or_default();
        assert!(
            humantime::parse_rfc3339(at).is_ok(),
            "Sluice-Parked-At {at:?} is not RFC 3339"
        );
        assert_eq!(row["subject"], format!("dlq.{TENANT}.orders"), "{row}");
    }
    let (_, limited) = admin(&stack, &format!("/admin/dlq/{TENANT}/orders?limit=2")).await?;
    assert_eq!(
        limited["rows"].as_array().map(Vec::len),
        Some(2),
        "{limited}"
    );
    assert_eq!(
        dlq_count(&stack, TENANT, "orders").await?,
        3,
        "peeking consumed rows"
    );

    // A dry run counts what it would replay and changes nothing: the DLQ keeps its
    // rows, the ingest stream gets no message, ClickHouse no row.
    let ingest_before = stack.nats.stream_state("INGEST").await?["last_seq"].clone();
    let report = replay(
        &stack,
        json!({"tenant": TENANT, "table": "orders", "dry_run": true}),
    )
    .await?;
    assert_eq!(report["dry_run"], true, "{report}");
    assert_eq!(
        (report["replayed"].as_u64(), report["failed"].as_u64()),
        (Some(3), Some(0)),
        "{report}"
    );
    assert_eq!(dlq_count(&stack, TENANT, "orders").await?, 3);
    assert_eq!(
        stack.nats.stream_state("INGEST").await?["last_seq"],
        ingest_before
    );
    assert_eq!(stack.count("orders").await?, 2);
    let (_, again) = admin(&stack, &format!("/admin/dlq/{TENANT}/orders?limit=10")).await?;
    assert_eq!(
        again["rows"], peek["rows"],
        "a dry run changed the parked rows"
    );

    // Fix the table so the parked values parse, then replay: they land, the DLQ of
    // the table is empty.
    stack
        .clickhouse
        .exec("ALTER TABLE orders MODIFY COLUMN v String")
        .await?;
    let report = replay(
        &stack,
        json!({"tenant": TENANT, "table": "orders", "limit": 100}),
    )
    .await?;
    assert_eq!(report["dry_run"], false, "{report}");
    assert_eq!(
        (
            report["replayed"].as_u64(),
            report["skipped"].as_u64(),
            report["failed"].as_u64()
        ),
        (Some(3), Some(0), Some(0)),
        "{report}"
    );
    wait_count(&stack, "SELECT count() FROM orders", 5).await?;
    let values = stack
        .clickhouse
        .exec("SELECT groupArray(v) FROM (SELECT v FROM orders WHERE id IN (2, 4, 5) ORDER BY id)")
        .await?;
    assert_eq!(values.trim(), "['twenty','forty','fifty']");
    assert_eq!(dlq_count(&stack, TENANT, "orders").await?, 0);
    assert_eq!(replay_marks(&stack).await?, 0, "a replay left its marks");
    let (_, empty) = admin(&stack, &format!("/admin/dlq/{TENANT}/orders")).await?;
    assert_eq!(empty["rows"], json!([]), "{empty}");
    // Nothing is parked again (the replayed rows were good this time).
    wait_count(&stack, "SELECT count() FROM orders", 5).await?;
    assert_eq!(dlq_count(&stack, TENANT, "orders").await?, 0);

    // A limit replays that many: park two unknown-field rows in another table.
    park_two_in_strict(&stack).await?;
    let peeked = stack.dlq_rows("strict").await?;
    assert!(
        peeked
            .iter()
            .all(|r| r["headers"]["Sluice-Error-Code"] == "117"
                || r["headers"]["Sluice-Error"]
                    .as_str()
                    .is_some_and(|e| e.contains("extra"))),
        "{peeked:?}"
    );

    // Purge wants ?confirm=<tenant>.<table>: without it, or with another table's name,
    // nothing goes.
    for query in ["", "?confirm=yes", "?confirm=acme.orders"] {
        let (status, _, body) = stack
            .admin_request(
                Method::DELETE,
                &format!("/admin/dlq/{TENANT}/strict{query}"),
                Some(ADMIN_TOKEN),
                None,
            )
            .await?;
        assert_eq!(status, 400, "purge{query}: {body}");
        assert!(
            body["error"]
                .as_str()
                .is_some_and(|e| e.contains("confirm=acme.strict")),
            "{body}"
        );
    }
    assert_eq!(dlq_count(&stack, TENANT, "strict").await?, 2);
    assert_eq!(purge(&stack, "strict").await?, 2);
    assert_eq!(dlq_count(&stack, TENANT, "strict").await?, 0);
    assert_eq!(stack.dlq_rows("strict").await?, Vec::<Value>::new());
    assert_eq!(stack.count("strict").await?, 0);

    // A limit that is not a number: a JSON refusal.
    let (status, body) = admin(&stack, &format!("/admin/dlq/{TENANT}/orders?limit=all")).await?;
    assert_eq!(status, 400, "{body}");
    assert!(
        body["error"].as_str().is_some_and(|e| e.contains("limit")),
        "{body}"
    );

    // Names that are not names are refused, never spliced into a subject.
    for path in [
        format!("/admin/dlq/{TENANT}/a.b"),
        "/admin/dlq/a*/events".to_string(),
    ] {
        let (status, body) = admin(&stack, &path).await?;
        assert_eq!(status, 400, "{path}: {body}");
    }
    let (status, _, body) = stack
        .admin_request(
            Method::POST,
            "/admin/dlq/replay",
            Some(ADMIN_TOKEN),
            Some(&json!({"tenant": TENANT, "table": "x>", "dry_run": true})),
        )
        .await?;
    assert_eq!(status, 400, "{body}");
    Ok(())
}

/// issue 36.4: a replay cut off between its publish and its mark (the process crashed
/// there: `SLUICE_TEST_FAILPOINT=crash-after-replay-publish`), the row then inserted
/// by the next instance, nats-server restarted (it rebuilds its duplicate check from
/// the messages it still holds, and the replayed one was consumed), and the replay run
/// again within the duplicate window: the row is not published again, so it is in
/// ClickHouse once, and it stays parked with the reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_cut_off_after_its_publish_never_publishes_the_row_again() -> Result<()> {
    let mut stack = Stack::start(sluice_harness::StackOptions::default()).await?;
    stack.clickhouse.exec(STRICT).await?;
    stack.env.push((
        "SLUICE_TEST_FAILPOINT".into(),
        "crash-after-replay-publish".into(),
    ));
    let doomed = stack.start_sluice(SLUICE).await?;
    stack.env.retain(|(k, _)| k != "SLUICE_TEST_FAILPOINT");
    ingest_ok(&stack, "strict", &[json!({"id": 7, "extra": 1})]).await?;
    wait_parked(&stack, "strict", 1).await?;
    stack
        .clickhouse
        .exec("ALTER TABLE strict ADD COLUMN extra UInt8")
        .await?;

    // The replay publishes the row, then the process dies before its mark says so.
    let body = json!({"tenant": TENANT, "table": "strict"});
    let cut_off = stack
        .admin_request(
            Method::POST,
            "/admin/dlq/replay",
            Some(ADMIN_TOKEN),
            Some(&body),
        )
        .await;
    let exited = stack.sluice[doomed]
        .wait_exit(DEADLINE)
        .await
        .with_context(|| format!("the replay answered {cut_off:?}"))?;
    assert!(!exited.success(), "{exited}");

    // The next instance inserts the replayed row; nats-server restarts.
    let survivor = stack.start_sluice(SLUICE).await?;
    wait_count(&stack, "SELECT count() FROM strict", 1).await?;
    stack.nats.restart().await?;
    stack.wait_ready(survivor, DEADLINE).await?;

    // The replay again, well within the ingest stream's duplicate window (2 min).
    let before = stack.nats.stream_state("INGEST").await?["last_seq"].clone();
    let report = replay(&stack, body).await?;
    let after = stack.nats.stream_state("INGEST").await?["last_seq"].clone();
    if after != before {
        let twice = wait_count(&stack, "SELECT count() FROM strict", 2).await;
        bail!(
            "the row was published again ({report}); in ClickHouse twice: {}",
            twice.is_ok()
        );
    }
    assert_eq!(
        (report["replayed"].as_u64(), report["failed"].as_u64()),
        (Some(0), Some(1)),
        "{report}"
    );
    assert!(
        report["errors"][0]
            .as_str()
            .is_some_and(|e| e.contains("cut off")),
        "{report}"
    );
    assert_eq!(stack.count("strict").await?, 1);
    assert_eq!(dlq_count(&stack, TENANT, "strict").await?, 1);

    // Its mark is the replay bucket's only message; purged, the row takes it along.
    assert_eq!(replay_marks(&stack).await?, 1);
    assert_eq!(purge(&stack, "strict").await?, 1);
    assert_eq!(replay_marks(&stack).await?, 0);
    Ok(())
}

/// Messages in the replay bucket's stream (marks, and removal markers were any left).
async fn replay_marks(stack: &Stack) -> Result<u64> {
    let state = stack.nats.stream_state("KV_DLQ_REPLAYS").await?;
    state["messages"]
        .as_u64()
        .with_context(|| format!("messages in {state}"))
}
