//! The admin page in a real Chromium, clicked through over WebDriver as an operator
//! does: rows flow, bad rows are parked, the page shows the rates and ClickHouse's
//! reasons; the table is fixed in ClickHouse, Replay (confirmed) brings the rows in,
//! and the parked count falls to 0 on the page without a reload; Purge waits for the
//! table's name typed. Any console error, uncaught exception or failed load (a
//! favicon's 404 included) fails the test. Screenshots are kept under
//! `target/tmp/admin-page/` (the paths are printed).

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use sluice_harness::browser::chromium_binary;
use sluice_harness::browser::webdriver::{chromedriver_binary, Browser};
use sluice_harness::{available, Stack, StackOptions, ADMIN_TOKEN, TENANT};

use crate::*;

/// A laptop's screen.
const WINDOW: (u32, u32) = (1440, 900);

/// Whether the browser and its driver are installed (else the test fails or, where
/// allowed, is skipped: see `available`).
fn browser_available(test: &str) -> Result<bool> {
    Ok(available(test, chromium_binary())?.is_some()
        && available(test, chromedriver_binary())?.is_some())
}

fn artifact(name: &str) -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("admin-page")
        .join(name)
}

/// Fails on anything the browser logged as an error since the last look.
async fn no_browser_errors(browser: &Browser, when: &str) -> Result<()> {
    let errors = browser.severe_logs().await?;
    if !errors.is_empty() {
        bail!("the browser logged errors {when}: {errors:#?}");
    }
    Ok(())
}

async fn screenshot(browser: &Browser, name: &str) -> Result<()> {
    let path = artifact(name);
    browser.screenshot(&path).await?;
    println!("screenshot: {}", path.display());
    Ok(())
}

/// The text of the row `row` (a `data-table` or `data-dlq` key) in field `field`.
fn cell(attribute: &str, key: &str, field: &str) -> String {
    format!("tr[data-{attribute}='{key}'] [data-field='{field}']")
}

/// "N rows/s" with N above 0.
fn a_positive_rate(text: &str) -> bool {
    text.strip_suffix(" rows/s")
        .and_then(|n| n.replace(',', "").parse::<f64>().ok())
        .is_some_and(|n| n > 0.0)
}

/// A bad row as its producer wrote it: its keys out of order, an escape.
const AS_WRITTEN: &str = r#"{"v":"forty-three\u00e9","id":43}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_sees_why_rows_are_parked_replays_and_purges_them_from_the_page() -> Result<()>
{
    if !browser_available(
        "an_operator_sees_why_rows_are_parked_replays_and_purges_them_from_the_page",
    )? {
        return Ok(());
    }
    let stack = dlq_stack().await?;

    // Rows flow; three of them carry text where ClickHouse wants a number.
    let good: Vec<Value> = (1..=40).map(|id| json!({"id": id, "v": id * 10})).collect();
    ingest_ok(&stack, "orders", &good).await?;
    let bad = [
        json!({"id": 41, "v": "forty-one"}),
        json!({"id": 42, "v": "forty-two"}),
    ];
    ingest_ok(&stack, "orders", &bad).await?;
    // The third as its producer wrote it: the page shows these bytes, not the row
    // parsed and printed again (keys sorted, the escape undone).
    ingest_line_ok(&stack, "orders", AS_WRITTEN).await?;
    wait_count(&stack, "SELECT count() FROM orders", 40).await?;
    wait_parked(&stack, "orders", 3).await?;

    let browser = Browser::start(WINDOW.0, WINDOW.1).await?;
    browser
        .goto(&format!("{}/admin/#token={ADMIN_TOKEN}", stack.admin_url()))
        .await?;
    let table = format!("{TENANT}.orders");

    // The rates: rows received and parked over the last minute, and the plot.
    for field in ["received", "inserted", "parked"] {
        browser
            .wait_text(
                &cell("table", &table, field),
                &format!("a {field} rate on the page"),
                DEADLINE,
                a_positive_rate,
            )
            .await?;
    }
    for line in ["received", "inserted", "parked"] {
        let css = format!("tr[data-table='{table}'] svg.plot polyline.{line}");
        assert!(browser.find(&css).await?.is_some(), "no {line} line: {css}");
    }
    let delivery = browser
        .text(&cell("table", &table, "delivery"))
        .await?
        .unwrap_or_default();
    assert!(delivery.contains("at-least-once"), "{delivery:?}");
    // ClickHouse's breaker and the NATS side.
    let breaker = browser
        .wait_text(
            "[data-pool='main'] [data-field='breaker']",
            "the breaker of main",
            DEADLINE,
            |t| !t.is_empty(),
        )
        .await?;
    assert_eq!(breaker, "closed");
    let stream = browser.text("#nats [data-field='stream']").await?;
    assert_eq!(stream.as_deref(), Some("INGEST"));

    // The DLQ: three parked rows, and each one's reason as ClickHouse gave it.
    browser
        .wait_text(
            &cell("dlq", &table, "parked"),
            "3 rows parked on the page",
            DEADLINE,
            |t| t == "3",
        )
        .await?;
    browser
        .click(&format!(
            "tr[data-dlq='{table}'] button[data-action='show']"
        ))
        .await?;
    browser
        .wait_text("#parked-rows", "the parked rows listed", DEADLINE, |t| {
            t.contains("forty-three")
        })
        .await?;
    let (_, peek) = admin(&stack, &format!("/admin/dlq/{TENANT}/orders")).await?;
    let parked = peek["rows"].as_array().context("rows[]")?;
    assert_eq!(parked.len(), 3, "{peek}");
    for row in parked {
        let sequence = row["sequence"].as_u64().context("sequence")?;
        let reason = browser
            .text(&format!(
                "#parked-rows li[data-sequence='{sequence}'] [data-field='reason']"
            ))
            .await?;
        let clickhouse = row["headers"]["Sluice-Error"].as_str().unwrap_or_default();
        assert!(!clickhouse.is_empty(), "{row}");
        assert_eq!(reason.as_deref(), Some(clickhouse), "row {sequence}");
    }
    let last = parked[2]["sequence"].as_u64().context("sequence")?;
    let shown = browser
        .text(&format!(
            "#parked-rows li[data-sequence='{last}'] [data-field='row']"
        ))
        .await?;
    assert_eq!(shown.as_deref(), Some(AS_WRITTEN));
    no_browser_errors(&browser, "showing the rates and the parked rows").await?;
    screenshot(&browser, "1-rows-parked.png").await?;

    // The fix: the column takes text now. Then Replay, and its confirmation.
    stack
        .clickhouse
        .exec("ALTER TABLE orders MODIFY COLUMN v String")
        .await?;
    browser
        .click(&format!(
            "tr[data-dlq='{table}'] button[data-action='replay']"
        ))
        .await?;
    let asked = browser
        .wait_text("#replay-text", "the replay's confirmation", DEADLINE, |t| {
            !t.is_empty()
        })
        .await?;
    assert!(
        asked.contains("the 3 parked rows of acme.orders"),
        "{asked}"
    );
    assert_eq!(
        browser
            .execute(
                "return document.getElementById('replay-dialog').open",
                json!([])
            )
            .await?,
        true
    );
    // Nothing is replayed before the confirmation.
    assert_eq!(dlq_count(&stack, TENANT, "orders").await?, 3);
    browser.click("#replay-confirm").await?;

    wait_count(&stack, "SELECT count() FROM orders", 43).await?;
    browser
        .wait_text(
            "#dlq-total",
            "the page's parked count at 0",
            DEADLINE,
            |t| t == "0 rows parked",
        )
        .await?;
    let notice = browser.text("#notice").await?.unwrap_or_default();
    assert!(
        notice.contains("acme.orders: 3 rows replayed, 0 skipped"),
        "{notice}"
    );
    assert_eq!(dlq_count(&stack, TENANT, "orders").await?, 0);
    let replayed = stack
        .clickhouse
        .exec("SELECT groupArray(v) FROM (SELECT v FROM orders WHERE id > 40 ORDER BY id)")
        .await?;
    assert_eq!(replayed.trim(), "['forty-one','forty-two','forty-threeé']");
    no_browser_errors(&browser, "replaying").await?;
    screenshot(&browser, "2-replayed.png").await?;

    // Purge wants the table's name typed: the button stays off until it is.
    park_two_in_strict(&stack).await?;
    let strict = format!("{TENANT}.strict");
    browser
        .wait_text(
            &cell("dlq", &strict, "parked"),
            "2 rows of strict parked on the page",
            DEADLINE,
            |t| t == "2",
        )
        .await?;
    browser
        .click(&format!(
            "tr[data-dlq='{strict}'] button[data-action='purge']"
        ))
        .await?;
    browser
        .wait_text("#purge-name", "the purge's confirmation", DEADLINE, |t| {
            t == strict
        })
        .await?;
    assert!(!browser.is_enabled("#purge-confirm").await?);
    browser.type_into("#purge-input", "acme.orders").await?;
    assert!(!browser.is_enabled("#purge-confirm").await?, "another name");
    browser
        .execute(
            "document.getElementById('purge-input').value = ''",
            json!([]),
        )
        .await?;
    browser.type_into("#purge-input", &strict).await?;
    assert!(browser.is_enabled("#purge-confirm").await?);
    assert_eq!(dlq_count(&stack, TENANT, "strict").await?, 2);
    browser.click("#purge-confirm").await?;
    browser
        .wait_text("#notice", "the purge's outcome", DEADLINE, |t| {
            t == "acme.strict: 2 rows purged"
        })
        .await?;
    assert_eq!(dlq_count(&stack, TENANT, "strict").await?, 0);
    assert_eq!(stack.count("strict").await?, 0);
    no_browser_errors(&browser, "purging").await?;
    browser.quit().await
}

/// Without the token the page asks for it, shows no data and does not keep asking the
/// endpoint (which would log a refused request every refresh); the token typed in is
/// used and kept for the tab.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_asks_for_the_token_once_and_keeps_it_for_the_tab() -> Result<()> {
    if !browser_available("the_page_asks_for_the_token_once_and_keeps_it_for_the_tab")? {
        return Ok(());
    }
    let mut stack = Stack::start(StackOptions::default()).await?;
    stack.clickhouse.exec(EVENTS).await?;
    stack.start_sluice(SLUICE).await?;
    let browser = Browser::start(WINDOW.0, WINDOW.1).await?;
    let page = format!("{}/admin/", stack.admin_url());
    browser.goto(&page).await?;
    browser
        .wait_text("#status", "the page waiting for the token", DEADLINE, |t| {
            t == "waiting for the admin token"
        })
        .await?;
    assert!(browser.find("#token").await?.is_some());
    assert_eq!(
        browser
            .execute("return document.getElementById('auth').hidden", json!([]))
            .await?,
        false
    );
    // The refusals it met are the only errors: one 401 per route of the first refresh.
    let refused = browser.severe_logs().await?;
    assert!(
        !refused.is_empty() && refused.iter().all(|e| e.message.contains("401")),
        "{refused:#?}"
    );

    browser.type_into("#token", ADMIN_TOKEN).await?;
    browser.click("#auth button[type='submit']").await?;
    browser
        .wait_text("#ready", "readiness shown", DEADLINE, |t| t == "ready")
        .await?;
    // Kept for the tab: a reload asks for nothing.
    browser.goto(&page).await?;
    browser
        .wait_text("#status", "a refresh with the kept token", DEADLINE, |t| {
            t.starts_with("updated ")
        })
        .await?;
    no_browser_errors(&browser, "with the token").await?;
    browser.quit().await
}
