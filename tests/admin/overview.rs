//! The routes the admin page reads, over HTTP: each table's row counts and rates
//! (`/admin/rates`) as `/metrics` counts them, the NATS side (`/admin/nats`), and the
//! parked rows a page at a time.

use anyhow::{Context, Result};
use serde_json::{json, Value};
use sluice_harness::{wait_for, TENANT};

use crate::*;

/// The `/admin/rates` entry of `tenant.table`.
fn table_rates<'a>(rates: &'a Value, table: &str) -> Option<&'a Value> {
    rates["tables"]
        .as_array()?
        .iter()
        .find(|t| t["tenant"] == TENANT && t["table"] == table)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rates_count_what_the_metrics_count_and_nats_says_where_it_is() -> Result<()> {
    let stack = dlq_stack().await?;
    let rows: Vec<Value> = (1..=5)
        .map(|id| json!({"id": id, "v": id}))
        .chain([json!({"id": 6, "v": "six"}), json!({"id": 7, "v": "seven"})])
        .collect();
    ingest_ok(&stack, "orders", &rows).await?;
    wait_count(&stack, "SELECT count() FROM orders", 5).await?;
    wait_parked(&stack, "orders", 2).await?;

    // Totals as the row counters have them, and a rate once two samples were taken.
    let rates = wait_for("rates for acme.orders", DEADLINE, POLL, || async {
        let (status, rates) = admin(&stack, "/admin/rates").await?;
        anyhow::ensure!(status == 200, "/admin/rates answered {status}: {rates}");
        let t = table_rates(&rates, "orders").context("no acme.orders yet")?;
        let totals = (
            t["received_total"].as_u64(),
            t["inserted_total"].as_u64(),
            t["parked_total"].as_u64(),
        );
        anyhow::ensure!(totals == (Some(7), Some(5), Some(2)), "totals {totals:?}");
        anyhow::ensure!(
            t["last_minute"]["received"]
                .as_f64()
                .is_some_and(|r| r > 0.0),
            "no rate yet: {t}"
        );
        Ok(t.clone())
    })
    .await?;
    let series = &rates["series"];
    let points = series["ago_s"].as_array().map(Vec::len).unwrap_or(0);
    assert!(points >= 1, "{rates}");
    for line in ["received", "inserted", "parked"] {
        assert_eq!(
            series[line].as_array().map(Vec::len),
            Some(points),
            "{line}"
        );
    }
    let metrics = stack.metrics_parsed().await?;
    let labels = [("tenant", TENANT), ("table", "orders")];
    assert_eq!(
        metrics.value("sluice_rows_received_total", &labels),
        Some(7.0)
    );
    assert_eq!(
        metrics.value("sluice_rows_inserted_total", &labels),
        Some(5.0)
    );

    // The consumer's figures come from its snapshot, published a moment after a pull.
    let nats = wait_for(
        "the consumer's 7 rows in /admin/nats",
        DEADLINE,
        POLL,
        || async {
            let (status, nats) = admin(&stack, "/admin/nats").await?;
            anyhow::ensure!(status == 200, "/admin/nats answered {status}: {nats}");
            anyhow::ensure!(nats["pulled_rows"] == 7, "{nats}");
            Ok(nats)
        },
    )
    .await?;
    assert_eq!(nats["connected"], true, "{nats}");
    assert_eq!(
        (&nats["stream"], &nats["consumer"], &nats["dlq_stream"]),
        (&json!("INGEST"), &json!("sluice"), &json!("DLQ")),
        "{nats}"
    );
    assert_eq!(nats["url"], stack.nats.url(), "{nats}");
    let port = stack
        .nats
        .url()
        .rsplit(':')
        .next()
        .unwrap_or_default()
        .to_string();
    assert!(
        nats["server"]["address"]
            .as_str()
            .is_some_and(|a| a.ends_with(&format!(":{port}"))),
        "{nats}"
    );
    assert!(nats["server"]["version"]
        .as_str()
        .is_some_and(|v| !v.is_empty()));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parked_rows_come_a_page_at_a_time() -> Result<()> {
    let stack = dlq_stack().await?;
    let bad: Vec<Value> = (1..=3).map(|id| json!({"id": id, "v": "text"})).collect();
    ingest_ok(&stack, "orders", &bad).await?;
    wait_parked(&stack, "orders", 3).await?;

    let mut seen = Vec::new();
    let mut after = 0u64;
    // Three rows, two a page: two pages, the second the last.
    for page in 1..=3 {
        let (status, body) = admin(
            &stack,
            &format!("/admin/dlq/{TENANT}/orders?limit=2&after={after}"),
        )
        .await?;
        assert_eq!(status, 200, "{body}");
        for row in body["rows"].as_array().context("rows[]")? {
            seen.push(
                sluice_harness::parked_json(row)["id"]
                    .as_u64()
                    .context("id")?,
            );
        }
        match body["next_after"].as_u64() {
            Some(next) => {
                assert!(page < 2, "a third page: {body}");
                after = next;
            }
            None => {
                assert_eq!(page, 2, "{body}");
                break;
            }
        }
    }
    assert_eq!(seen, vec![1, 2, 3]);
    assert_eq!(
        dlq_count(&stack, TENANT, "orders").await?,
        3,
        "peeking consumed rows"
    );

    // More than one request takes is refused, not cut.
    let (status, body) = admin(&stack, &format!("/admin/dlq/{TENANT}/orders?limit=10001")).await?;
    assert_eq!(status, 400, "{body}");
    assert!(
        body["error"]
            .as_str()
            .is_some_and(|e| e.contains("at most 10000")),
        "{body}"
    );
    Ok(())
}
