//! ZooKeeper as the harness runs it, and what ClickHouse's Replicated tables do with
//! rows inserted again: on 18.16 they are the only tables that deduplicate inserts,
//! which is what exactly-once delivery can build on. Each test records what the server
//! says about a table, so Sluice can tell per table whether a retried insert counts
//! twice.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use sluice_harness::{
    available, clickhouse, create_replicated_like, loopback_client, process_exists, zookeeper,
    ClickHouseOptions, ClickHouseServer, NatsFlavor, Replication, Stack, StackOptions, ZooKeeper,
};

/// The same three rows, as one JSONEachRow block.
const ROWS: &str = "{\"id\":1,\"s\":\"a\"}\n{\"id\":2,\"s\":\"b\"}\n{\"id\":3,\"s\":\"c\"}\n";
/// The same rows in another order.
const ROWS_REORDERED: &str =
    "{\"id\":3,\"s\":\"c\"}\n{\"id\":1,\"s\":\"a\"}\n{\"id\":2,\"s\":\"b\"}\n";
/// Other rows.
const OTHER_ROWS: &str = "{\"id\":4,\"s\":\"d\"}\n{\"id\":5,\"s\":\"e\"}\n";

const PLAIN: &str = "CREATE TABLE plain (id UInt64, s String) ENGINE = MergeTree ORDER BY id";

/// Whether ZooKeeper and clickhouse-server are installed (a notice if not).
fn installed(test: &str) -> Result<bool> {
    Ok(available(test, zookeeper::jar())?.is_some()
        && available(test, clickhouse::binary())?.is_some())
}

/// A ZooKeeper, and a ClickHouse with a root of its own in it and a table `plain`
/// beside its Replicated copy `replicated`.
async fn replicated_pair() -> Result<(ClickHouseServer, ZooKeeper)> {
    let zookeeper = ZooKeeper::start().await?;
    let root = zookeeper.new_root().await?;
    let options = ClickHouseOptions::default().replicated(Replication::new(root));
    let clickhouse = ClickHouseServer::start_with(options).await?;
    clickhouse.exec(PLAIN).await?;
    create_replicated_like(&clickhouse, "replicated", "plain").await?;
    Ok((clickhouse, zookeeper))
}

async fn insert(clickhouse: &ClickHouseServer, table: &str, rows: &str) -> Result<()> {
    clickhouse
        .exec(&format!("INSERT INTO {table} FORMAT JSONEachRow\n{rows}"))
        .await?;
    Ok(())
}

/// One column of one row, as text.
async fn value(clickhouse: &ClickHouseServer, sql: &str) -> Result<String> {
    Ok(clickhouse
        .exec(&format!("{sql} FORMAT TSVRaw"))
        .await?
        .trim_end()
        .to_owned())
}

#[tokio::test]
async fn zookeeper_serves_on_loopback_and_dies_with_its_handle() -> Result<()> {
    if !installed("zookeeper_serves_on_loopback_and_dies_with_its_handle")? {
        return Ok(());
    }
    let started = Instant::now();
    let zookeeper = ZooKeeper::start().await?;
    eprintln!("ZooKeeper served after {:?}", started.elapsed());
    assert!(zookeeper.addr().ip().is_loopback());
    let srvr = zookeeper.four_letter("srvr").await?;
    assert!(srvr.contains("Mode: standalone"), "{srvr}");
    assert_eq!(zookeeper.four_letter("ruok").await?, "imok");

    // Roots: fresh ones differ, and asking for an existing one is fine.
    let first = zookeeper.new_root().await?;
    let second = zookeeper.new_root().await?;
    assert_ne!(first.path, second.path);
    assert_eq!(zookeeper.root(&first.path).await?, first);
    let bad = zookeeper
        .root("/a/b")
        .await
        .err()
        .context("a nested root")?;
    assert!(format!("{bad:#}").contains("one level"), "{bad:#}");

    let pid = zookeeper.pid().context("a running ZooKeeper has a pid")?;
    let dir = zookeeper.dir().to_path_buf();
    drop(zookeeper);
    assert!(!process_exists(pid), "pid {pid} still alive after drop");
    assert!(!dir.exists(), "temp dir {} left behind", dir.display());
    Ok(())
}

#[tokio::test]
async fn zookeeper_keeps_its_nodes_across_kill9() -> Result<()> {
    if !installed("zookeeper_keeps_its_nodes_across_kill9")? {
        return Ok(());
    }
    let mut zookeeper = ZooKeeper::start().await?;
    let node_count = |srvr: String| {
        srvr.lines()
            .find_map(|line| line.strip_prefix("Node count: "))
            .and_then(|n| n.trim().parse::<u64>().ok())
            .with_context(|| format!("no node count in {srvr:?}"))
    };
    let before = node_count(zookeeper.four_letter("srvr").await?)?;
    zookeeper.new_root().await?;
    let created = node_count(zookeeper.four_letter("srvr").await?)?;
    assert_eq!(created, before + 1);

    let status = zookeeper.kill9().await?;
    assert!(!status.success());
    assert!(zookeeper.four_letter("srvr").await.is_err());
    zookeeper.start_again().await?;
    assert_eq!(node_count(zookeeper.four_letter("srvr").await?)?, created);
    Ok(())
}

/// What the issue measured: the same rows inserted three times count once in a
/// ReplicatedMergeTree table, also in another order, while a plain MergeTree keeps
/// all three copies. Through the stack, as the chaos suite will use it.
#[tokio::test]
async fn a_replicated_table_counts_rows_inserted_again_once() -> Result<()> {
    let test = "a_replicated_table_counts_rows_inserted_again_once";
    if !installed(test)? || available(test, NatsFlavor::from_env()?.binary())?.is_none() {
        return Ok(());
    }
    let stack = Stack::start(StackOptions::default().with_zookeeper()).await?;
    let clickhouse = &stack.clickhouse;
    clickhouse.exec(PLAIN).await?;
    stack.create_replicated_table("replicated", "plain").await?;

    for _ in 0..3 {
        insert(clickhouse, "plain", ROWS).await?;
        insert(clickhouse, "replicated", ROWS).await?;
    }
    assert_eq!(
        stack.count("plain").await?,
        9,
        "a MergeTree keeps every copy"
    );
    assert_eq!(stack.count("replicated").await?, 3, "inserted three times");

    // The block's hash is taken after it is sorted by the table's key.
    insert(clickhouse, "replicated", ROWS_REORDERED).await?;
    assert_eq!(
        stack.count("replicated").await?,
        3,
        "the same rows reordered"
    );

    insert(clickhouse, "replicated", OTHER_ROWS).await?;
    assert_eq!(stack.count("replicated").await?, 5, "other rows count");
    Ok(())
}

/// What 18.16 says about a table and the settings that decide deduplication: the
/// engine name tells a Replicated table, `insert_deduplicate` is on, the window is
/// 100 blocks and 7 days, there is no window for plain tables, and
/// `insert_deduplication_token` and `deduplicate_blocks_in_dependent_materialized_views`
/// are unknown settings.
#[tokio::test]
async fn what_clickhouse_says_about_deduplication() -> Result<()> {
    if !installed("what_clickhouse_says_about_deduplication")? {
        return Ok(());
    }
    let (clickhouse, _zookeeper) = replicated_pair().await?;
    let version = clickhouse.version().await?;
    eprintln!("clickhouse-server {version}");

    for (table, engine) in [
        ("plain", "MergeTree"),
        ("replicated", "ReplicatedMergeTree"),
    ] {
        let row = value(
            &clickhouse,
            &format!(
                "SELECT concat(engine, '\\n', engine_full, '\\n', create_table_query) \
                 FROM system.tables WHERE database = currentDatabase() AND name = '{table}'"
            ),
        )
        .await?;
        eprintln!("system.tables for {table}:\n{row}");
        let mut lines = row.lines();
        assert_eq!(lines.next(), Some(engine), "{row}");
        let engine_full = lines.next().unwrap_or_default();
        let create = lines.next().unwrap_or_default();
        assert!(engine_full.starts_with(engine), "{engine_full}");
        assert!(
            create.contains(&format!("ENGINE = {engine_full}")),
            "{create}"
        );
    }
    let path = value(
        &clickhouse,
        "SELECT engine_full FROM system.tables \
         WHERE database = currentDatabase() AND name = 'replicated'",
    )
    .await?;
    // The macros stay unexpanded in the metadata.
    assert!(
        path.contains("'/clickhouse/tables/{shard}/default/replicated', '{replica}'"),
        "{path}"
    );

    let setting = "SELECT value FROM system.settings WHERE name = 'insert_deduplicate'";
    assert_eq!(value(&clickhouse, setting).await?, "1");
    let windows = value(
        &clickhouse,
        "SELECT arrayStringConcat(groupArray(concat(name, '=', value)), ',') FROM \
         (SELECT name, value FROM system.merge_tree_settings \
          WHERE name LIKE '%deduplication_window%' ORDER BY name)",
    )
    .await?;
    eprintln!("system.merge_tree_settings: {windows}");
    assert!(
        windows.contains("replicated_deduplication_window=100"),
        "{windows}"
    );
    if version.starts_with("18.") {
        assert!(
            !windows.contains("non_replicated_deduplication_window"),
            "{windows}"
        );
        assert!(
            windows.contains("replicated_deduplication_window_seconds=604800"),
            "{windows}"
        );
        let views_setting = value(
            &clickhouse,
            "SELECT count() FROM system.settings \
             WHERE name = 'deduplicate_blocks_in_dependent_materialized_views'",
        )
        .await?;
        assert_eq!(views_setting, "0", "18.16 has no such setting");
        let token = loopback_client(Duration::from_secs(30))?
            .post(format!(
                "{}/?insert_deduplication_token=batch-1",
                clickhouse.http_url()
            ))
            .body(format!("INSERT INTO replicated FORMAT JSONEachRow\n{ROWS}"))
            .send()
            .await?;
        let status = token.status().as_u16();
        let body = token.text().await?;
        eprintln!("insert_deduplication_token: {status} {}", body.trim());
        assert_eq!(status, 404, "{body}");
        assert!(
            body.contains("Unknown setting insert_deduplication_token"),
            "{body}"
        );
        assert_eq!(clickhouse.count("replicated").await?, 0);
    }
    Ok(())
}

/// Deduplication is not a property of the engine alone: a request (or a profile) with
/// `insert_deduplicate=0`, or a table with `replicated_deduplication_window = 0`,
/// keeps every copy; the table's setting shows in `engine_full`.
#[tokio::test]
async fn what_turns_deduplication_off() -> Result<()> {
    if !installed("what_turns_deduplication_off")? {
        return Ok(());
    }
    let (clickhouse, _zookeeper) = replicated_pair().await?;
    for _ in 0..2 {
        let (status, body) = insert_with(&clickhouse, "insert_deduplicate=0", ROWS).await?;
        assert_eq!(status, 200, "{body}");
    }
    assert_eq!(clickhouse.count("replicated").await?, 6);

    clickhouse
        .exec(&format!(
            "CREATE TABLE no_window AS plain ENGINE = {} ORDER BY id \
             SETTINGS replicated_deduplication_window = 0",
            clickhouse::replicated_merge_tree("default", "no_window")
        ))
        .await?;
    for _ in 0..2 {
        insert(&clickhouse, "no_window", ROWS).await?;
    }
    assert_eq!(clickhouse.count("no_window").await?, 6);
    let engine_full = value(
        &clickhouse,
        "SELECT engine_full FROM system.tables \
         WHERE database = currentDatabase() AND name = 'no_window'",
    )
    .await?;
    assert!(
        engine_full.contains("replicated_deduplication_window = 0"),
        "{engine_full}"
    );
    Ok(())
}

#[tokio::test]
async fn a_replicated_table_needs_a_zookeeper() -> Result<()> {
    if available("a_replicated_table_needs_a_zookeeper", clickhouse::binary())?.is_none() {
        return Ok(());
    }
    let clickhouse = ClickHouseServer::start().await?;
    clickhouse.exec(PLAIN).await?;
    let error = create_replicated_like(&clickhouse, "replicated", "plain")
        .await
        .err()
        .context("a Replicated table without ZooKeeper")?;
    assert!(
        format!("{error:#}").contains("has no ZooKeeper"),
        "{error:#}"
    );
    Ok(())
}

/// What 18.16 does with a table's materialized views, which decides whether Sluice may
/// count on ClickHouse to drop a retry into that table: `system.tables` lists the views
/// of a table; the table takes a block before its views do, so a view that throws
/// fails the insert with the table's rows already in; and a retry the table drops as a
/// duplicate skips the views, so the rows a view missed never reach it. With
/// `insert_deduplicate=0` the retry reaches both.
#[tokio::test]
async fn what_a_retry_dropped_as_a_duplicate_does_to_materialized_views() -> Result<()> {
    if !installed("what_a_retry_dropped_as_a_duplicate_does_to_materialized_views")? {
        return Ok(());
    }
    let (clickhouse, _zookeeper) = replicated_pair().await?;
    if !clickhouse.version().await?.starts_with("18.") {
        eprintln!("not 18.16: what is measured here is 18.16's behaviour");
        return Ok(());
    }
    clickhouse.exec("CREATE TABLE by_view AS plain").await?;
    // A view that takes every row but `s = 'bad'`, where it throws (code 395).
    clickhouse
        .exec(
            "CREATE MATERIALIZED VIEW picky TO by_view AS \
             SELECT id, s FROM replicated WHERE throwIf(s = 'bad') = 0",
        )
        .await?;
    let views = value(
        &clickhouse,
        "SELECT concat(arrayStringConcat(dependencies_database, ','), '/', \
                arrayStringConcat(dependencies_table, ',')) \
         FROM system.tables WHERE database = currentDatabase() AND name = 'replicated'",
    )
    .await?;
    assert_eq!(views, "default/picky");

    // Taken by the table and the view; the same block again by neither.
    insert(&clickhouse, "replicated", ROWS).await?;
    insert(&clickhouse, "replicated", ROWS).await?;
    assert_eq!(table_and_view(&clickhouse).await?, (3, 3));

    // A block with a row the view throws on: the insert fails, the table has the rows.
    let with_bad = "{\"id\":10,\"s\":\"ok\"}\n{\"id\":11,\"s\":\"bad\"}\n";
    let (status, body) = insert_with(&clickhouse, "insert_deduplicate=1", with_bad).await?;
    assert_eq!(status, 500, "{body}");
    assert!(body.starts_with("Code: 395"), "{body}");
    assert_eq!(
        table_and_view(&clickhouse).await?,
        (5, 3),
        "the table took the block before the view threw"
    );
    // The retry is dropped as a duplicate and succeeds: the view is skipped, so row 10
    // never reaches it (and the row it threw on is not refused again).
    let (status, body) = insert_with(&clickhouse, "insert_deduplicate=1", with_bad).await?;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        table_and_view(&clickhouse).await?,
        (5, 3),
        "a dropped retry skips the view"
    );
    // Without deduplication the retry reaches the table and the view again (which
    // throws again on its bad row).
    let (status, body) = insert_with(&clickhouse, "insert_deduplicate=0", with_bad).await?;
    assert_eq!(status, 500, "{body}");
    assert_eq!(clickhouse.count("replicated").await?, 7);
    let (status, body) = insert_with(&clickhouse, "insert_deduplicate=0", ROWS).await?;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        table_and_view(&clickhouse).await?,
        (10, 6),
        "a block not deduplicated reaches the view"
    );
    Ok(())
}

/// The rows in `replicated` and in its view's table `by_view`.
async fn table_and_view(clickhouse: &ClickHouseServer) -> Result<(u64, u64)> {
    Ok((
        clickhouse.count("replicated").await?,
        clickhouse.count("by_view").await?,
    ))
}

/// Inserts `rows` into `replicated` with the request's `settings`; the answer.
async fn insert_with(
    clickhouse: &ClickHouseServer,
    settings: &str,
    rows: &str,
) -> Result<(u16, String)> {
    let response = loopback_client(Duration::from_secs(30))?
        .post(format!("{}/?{settings}", clickhouse.http_url()))
        .body(format!("INSERT INTO replicated FORMAT JSONEachRow\n{rows}"))
        .send()
        .await?;
    Ok((response.status().as_u16(), response.text().await?))
}

/// What a window is: a block inserted again after more than
/// `replicated_deduplication_window` other blocks, once the table's cleanup has
/// forgotten its hash, is inserted again (the duplicate a crash past the window makes,
/// which is why Sluice holds the window against a redelivery). The cleanup runs every
/// `cleanup_delay_period` (30 s on 18.16; 1 s here) and keeps the newest blocks.
#[tokio::test]
async fn a_block_retried_past_the_window_counts_twice() -> Result<()> {
    if !installed("a_block_retried_past_the_window_counts_twice")? {
        return Ok(());
    }
    let (clickhouse, _zookeeper) = replicated_pair().await?;
    clickhouse
        .exec(&format!(
            "CREATE TABLE small_window AS plain ENGINE = {} ORDER BY id SETTINGS \
             replicated_deduplication_window = 10, cleanup_delay_period = 1, \
             cleanup_delay_period_random_add = 0",
            clickhouse::replicated_merge_tree("default", "small_window")
        ))
        .await?;
    insert(&clickhouse, "small_window", ROWS).await?;
    // Within the window: dropped.
    insert(&clickhouse, "small_window", ROWS).await?;
    assert_eq!(clickhouse.count("small_window").await?, 3);
    for id in 100..115 {
        let row = format!("{{\"id\":{id},\"s\":\"x\"}}\n");
        insert(&clickhouse, "small_window", &row).await?;
    }
    let path = value(
        &clickhouse,
        "SELECT zookeeper_path FROM system.replicas WHERE table = 'small_window'",
    )
    .await?;
    let blocks = format!("SELECT count() FROM system.zookeeper WHERE path = '{path}/blocks'");
    sluice_harness::wait_for(
        "the cleanup to keep the last 10 blocks' hashes",
        Duration::from_secs(30),
        Duration::from_millis(200),
        || async {
            let kept: u64 = value(&clickhouse, &blocks).await?.parse()?;
            anyhow::ensure!(kept <= 10, "{kept} hashes kept");
            Ok(())
        },
    )
    .await?;
    insert(&clickhouse, "small_window", ROWS).await?;
    assert_eq!(
        clickhouse.count("small_window").await?,
        3 + 15 + 3,
        "the first block, forgotten, is inserted again"
    );
    Ok(())
}
