//! `sluice dlq list | peek | replay | purge` against a running Sluice on real servers,
//! as an operator runs it from a shell: the endpoint and token from the environment,
//! the confirmations answered on stdin, the rows counted in ClickHouse and on the DLQ.
//!
//! Every run starts from an empty environment, so a `SLUICE_*` variable of the machine
//! running the tests cannot change what is checked.

use std::process::Stdio;

use anyhow::{Context, Result};
use serde_json::json;
use sluice_harness::{ADMIN_TOKEN, TENANT};
use tokio::io::AsyncWriteExt as _;

use crate::*;

struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

/// `sluice dlq <args>` with `env` only, `stdin` typed in.
async fn dlq(args: &[&str], env: &[(&str, &str)], stdin: &str) -> Result<Run> {
    let mut command = tokio::process::Command::new(SLUICE);
    command
        .arg("dlq")
        .args(args)
        .env_clear()
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = command
        .spawn()
        .with_context(|| format!("running sluice dlq {args:?}"))?;
    let mut input = child.stdin.take().context("stdin")?;
    input.write_all(stdin.as_bytes()).await?;
    drop(input);
    let output = tokio::time::timeout(DEADLINE, child.wait_with_output())
        .await
        .with_context(|| format!("sluice dlq {args:?} did not finish"))??;
    Ok(Run {
        code: output.status.code(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_lists_peeks_replays_and_purges_from_the_shell() -> Result<()> {
    let stack = dlq_stack().await?;
    let url = stack.admin_url();
    let env = [
        ("SLUICE_ADMIN_URL", url.as_str()),
        ("SLUICE_ADMIN_TOKEN", ADMIN_TOKEN),
    ];

    ingest_ok(
        &stack,
        "orders",
        &[
            json!({"id": 1, "v": 10}),
            json!({"id": 2, "v": "twenty"}),
            json!({"id": 3, "v": "thirty"}),
        ],
    )
    .await?;
    wait_count(&stack, "SELECT count() FROM orders", 1).await?;
    wait_parked(&stack, "orders", 2).await?;
    park_two_in_strict(&stack).await?;

    // list: each table's count, and the total.
    let list = dlq(&["list"], &env, "").await?;
    assert_eq!(list.code, Some(0), "{}", list.stderr);
    let lines: Vec<Vec<&str>> = list
        .stdout
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(
        lines,
        vec![
            vec!["acme.orders", "2"],
            vec!["acme.strict", "2"],
            vec!["4", "rows", "parked", "in", "2", "tables"],
        ],
        "{}",
        list.stdout
    );

    // peek, a page at a time: ClickHouse's reason and the row; nothing consumed.
    let parked = stack.dlq_rows("orders").await?;
    let first = dlq(&["peek", "acme.orders", "--limit", "1"], &env, "").await?;
    assert_eq!(first.code, Some(0), "{}", first.stderr);
    let reason = parked[0]["headers"]["Sluice-Error"]
        .as_str()
        .context("Sluice-Error")?;
    assert!(
        first.stdout.contains(&format!("  reason: {reason}")),
        "{}",
        first.stdout
    );
    assert!(
        first.stdout.contains(r#"  row:    {"id":2,"v":"twenty"}"#),
        "{}",
        first.stdout
    );
    let next = format!(
        "more: sluice dlq peek acme.orders --after {}",
        parked[0]["sequence"]
    );
    assert!(first.stdout.contains(&next), "{}", first.stdout);
    let after = parked[0]["sequence"].to_string();
    let second = dlq(
        &["peek", "acme.orders", "--limit", "1", "--after", &after],
        &env,
        "",
    )
    .await?;
    assert!(
        second.stdout.contains(r#""v":"thirty""#),
        "{}",
        second.stdout
    );
    let last = dlq(&["peek", "acme.orders", "--after", &after], &env, "").await?;
    assert!(!last.stdout.contains("more:"), "{}", last.stdout);
    assert_eq!(dlq_count(&stack, TENANT, "orders").await?, 2);

    // Without the token: refused, with what to set.
    let refused = dlq(&["list"], &env[..1], "").await?;
    assert_eq!(refused.code, Some(1), "{}", refused.stdout);
    assert!(
        refused.stderr.contains("set SLUICE_ADMIN_TOKEN"),
        "{}",
        refused.stderr
    );

    // replay asks y/N; anything but yes replays nothing.
    let declined = dlq(&["replay", "acme.orders"], &env, "n\n").await?;
    assert_eq!(declined.code, Some(1), "{}", declined.stdout);
    assert!(
        declined
            .stderr
            .contains("Send the 2 parked rows of acme.orders back to the ingest stream?"),
        "{}",
        declined.stderr
    );
    assert!(
        declined.stderr.contains("nothing replayed"),
        "{}",
        declined.stderr
    );
    assert_eq!(dlq_count(&stack, TENANT, "orders").await?, 2);

    // The fix, then the replay the page's button does: the rows land, the DLQ empties.
    stack
        .clickhouse
        .exec("ALTER TABLE orders MODIFY COLUMN v String")
        .await?;
    let replayed = dlq(&["replay", "acme.orders"], &env, "y\n").await?;
    assert_eq!(
        replayed.code,
        Some(0),
        "{}{}",
        replayed.stdout,
        replayed.stderr
    );
    assert_eq!(
        replayed.stdout.trim(),
        "acme.orders: 2 rows replayed, 0 skipped (not JSON objects), 0 failed"
    );
    wait_count(&stack, "SELECT count() FROM orders", 3).await?;
    assert_eq!(dlq_count(&stack, TENANT, "orders").await?, 0);

    // purge wants the table's name typed; another name purges nothing.
    let wrong = dlq(&["purge", "acme.strict"], &env, "acme.orders\n").await?;
    assert_eq!(wrong.code, Some(1), "{}", wrong.stdout);
    assert!(
        wrong.stderr.contains("Type acme.strict to confirm"),
        "{}",
        wrong.stderr
    );
    assert!(wrong.stderr.contains("nothing purged"), "{}", wrong.stderr);
    assert_eq!(dlq_count(&stack, TENANT, "strict").await?, 2);
    let purged = dlq(&["purge", "acme.strict"], &env, "acme.strict\n").await?;
    assert_eq!(purged.code, Some(0), "{}", purged.stderr);
    assert_eq!(purged.stdout.trim(), "acme.strict: 2 rows purged");
    assert_eq!(dlq_count(&stack, TENANT, "strict").await?, 0);
    assert_eq!(stack.count("strict").await?, 0);

    let empty = dlq(&["list"], &env, "").await?;
    assert_eq!(empty.stdout.trim(), "no row is parked");
    Ok(())
}

/// issue 37.4: a parked row is shown as the bytes parked, in the admin endpoint's JSON
/// (`row` holds its text) and by `sluice dlq peek` (plain and `--json`): keys in their
/// order, a number past any integer type as written, an escape as sent. (They were
/// parsed and printed again: keys sorted, `1.8446744073709552e+22`, `é`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_row_is_shown_as_the_bytes_parked() -> Result<()> {
    const PARKED: &str = r#"{"v":"\u00e9","id":18446744073709551616123}"#;
    let stack = dlq_stack().await?;
    ingest_line_ok(&stack, "orders", PARKED).await?;
    wait_parked(&stack, "orders", 1).await?;

    let (status, peek) = admin(&stack, &format!("/admin/dlq/{TENANT}/orders")).await?;
    assert_eq!(status, 200, "{peek}");
    assert_eq!(peek["rows"][0]["row"], PARKED, "{peek}");

    let env = [
        ("SLUICE_ADMIN_URL", stack.admin_url()),
        ("SLUICE_ADMIN_TOKEN", ADMIN_TOKEN.to_string()),
    ];
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let shown = dlq(&["peek", "acme.orders"], &env, "").await?;
    assert_eq!(shown.code, Some(0), "{}", shown.stderr);
    assert!(
        shown.stdout.contains(&format!("  row:    {PARKED}\n")),
        "{}",
        shown.stdout
    );
    let json = dlq(&["peek", "acme.orders", "--json"], &env, "").await?;
    assert_eq!(json.code, Some(0), "{}", json.stderr);
    let page: serde_json::Value = serde_json::from_str(&json.stdout).context("--json")?;
    assert_eq!(page["rows"][0]["row"], PARKED, "{}", json.stdout);
    Ok(())
}

/// issue 37.9: a page of no rows says nothing about the queue, so `--limit 0` is
/// refused (by the CLI, and by the endpoint for a peek or a replay), never answered
/// "no parked row" while rows are parked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peek_of_zero_rows_is_refused_not_taken_for_an_empty_queue() -> Result<()> {
    let stack = dlq_stack().await?;
    park_two_in_strict(&stack).await?;
    let env = [
        ("SLUICE_ADMIN_URL", stack.admin_url()),
        ("SLUICE_ADMIN_TOKEN", ADMIN_TOKEN.to_string()),
    ];
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let peek = dlq(&["peek", "acme.strict", "--limit", "0"], &env, "").await?;
    assert_eq!(peek.code, Some(2), "{}{}", peek.stdout, peek.stderr);
    assert!(!peek.stdout.contains("no parked row"), "{}", peek.stdout);
    assert!(peek.stderr.contains("--limit"), "{}", peek.stderr);

    let (status, body) = admin(&stack, &format!("/admin/dlq/{TENANT}/strict?limit=0")).await?;
    assert_eq!(status, 400, "{body}");
    assert!(
        body["error"]
            .as_str()
            .is_some_and(|e| e.contains("limit 0")),
        "{body}"
    );
    let (status, _, body) = stack
        .admin_request(
            reqwest::Method::POST,
            "/admin/dlq/replay",
            Some(ADMIN_TOKEN),
            Some(&json!({"tenant": TENANT, "table": "strict", "limit": 0})),
        )
        .await?;
    assert_eq!(status, 400, "{body}");
    assert_eq!(dlq_count(&stack, TENANT, "strict").await?, 2);
    Ok(())
}
