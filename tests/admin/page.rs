//! `/admin/` in a real headless Chromium: the page loads, takes the token from the URL
//! fragment, and its rendered DOM shows the pool and table nodes of the running Sluice.

use anyhow::{bail, Result};
use serde_json::json;
use sluice_harness::browser::{chromium_binary, dump_dom_until};
use sluice_harness::{available, Stack, StackOptions, ADMIN_TOKEN, TENANT};

use crate::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_page_shows_the_live_tree_in_chromium() -> Result<()> {
    if available(
        "the_admin_page_shows_the_live_tree_in_chromium",
        chromium_binary(),
    )?
    .is_none()
    {
        return Ok(());
    }
    let mut stack = Stack::start(StackOptions::default()).await?;
    stack.clickhouse.exec(EVENTS).await?;
    stack.start_sluice(SLUICE).await?;
    // A table node exists once rows arrived; one parked row shows in the DLQ table.
    ingest_ok(
        &stack,
        "events",
        &[
            json!({"id": 1, "name": "a"}),
            json!({"id": "x", "name": "b"}),
        ],
    )
    .await?;
    wait_count(&stack, "SELECT count() FROM events", 1).await?;
    wait_for_parked(&stack).await?;

    let url = format!("{}/admin/#token={ADMIN_TOKEN}", stack.admin_url());
    let table = format!("{TENANT}.events");
    let dom = dump_dom_until(&url, DEADLINE, |dom| {
        let needles = [
            r#"data-kind="root""#.to_string(),
            r#"data-kind="consumer""#.to_string(),
            r#"data-kind="pool" data-name="main""#.to_string(),
            format!(r#"data-kind="table" data-name="{table}""#),
            r#"<span id="ready" class="ok">ready</span>"#.to_string(),
            r#"data-tenant="acme" data-table="events""#.to_string(),
        ];
        let missing: Vec<_> = needles
            .iter()
            .filter(|n| !dom.contains(n.as_str()))
            .collect();
        if missing.is_empty() {
            Ok(dom.to_string())
        } else {
            bail!("the DOM lacks {missing:?}")
        }
    })
    .await?;
    // The token came from the fragment: no prompt for one, no refresh error.
    assert!(
        dom.contains(r#"<div id="auth" hidden="">"#),
        "the page asked for a token"
    );
    assert!(
        dom.contains(r#"<div id="status">updated "#),
        "the page's last refresh failed:\n{dom}"
    );
    assert!(dom.contains("breaker closed"), "no breaker state shown");
    Ok(())
}

async fn wait_for_parked(stack: &Stack) -> Result<()> {
    sluice_harness::wait_for("one row parked", DEADLINE, POLL, || async {
        match dlq_count(stack, TENANT, "events").await? {
            1 => Ok(()),
            n => bail!("{n} parked"),
        }
    })
    .await
}
