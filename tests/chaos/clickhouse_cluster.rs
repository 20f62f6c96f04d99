//! Chaos on a ClickHouse cluster: two shards of two replicas of 18.16 on one ZooKeeper
//! (`StackOptions::with_cluster`), the target `main` listing them (`shards`). Every
//! table is each shard's `ReplicatedMergeTree` local table, read through a
//! `Distributed` table over them (`events_all`): the line counts the whole cluster, and
//! a duplicate anywhere fails the scenario (exactly-once holds on every shard).
//!
//! | scenario                      | fault                                                                 |
//! |-------------------------------|-----------------------------------------------------------------------|
//! | `cluster_replica_kill9`       | replica 1 of shard 1 kill -9 while rows flow: its twin takes the shard's rows (`shard1_took_during_fault=`), the query gateway answers meanwhile |
//! | `cluster_replica_sigstop`     | replica 1 of shard 1 frozen past the insert timeout: the retry goes to its twin, deduplicated |
//! | `cluster_shard_down`          | both replicas of shard 2 killed (-9) for a while: shard 1 takes the fresh batches, shard 2's recorded ones wait |
//! | `cluster_zookeeper_stopped`   | ZooKeeper stopped: every replica read-only (242), everything waits, nothing parked |
//! | `cluster_shard_key_shard_down` | `shard_key = "id"`: both replicas of shard 2 frozen past the insert timeout: shard 1 keeps taking its own ids, shard 2's wait; every row on its id's shard |
//! | `cluster_shard_key_split_ack_lost` | keyed split, ack lost, nats-server restarted past the duplicate window: `shard_key = "id"`, a 2 s window; a second instance aborts once its first split's parts are stored (`crash-after-split-parts`), nats-server is restarted once the window has passed, the message comes back: nothing twice |

use super::*;

/// The scenario table's columns (as `create_table_sql` makes it on one server).
const COLUMNS: &str = "id UInt64, n UInt32, s String";
const TABLE: &str = "events";

/// A scenario on a 2 × 2 cluster with `events` on every shard (`None`: skipped).
async fn on_a_cluster(name: &str) -> Result<Option<Scenario>> {
    let options = StackOptions::default().with_cluster(2, 2);
    let Some(s) = Scenario::start(name, SLUICE, options).await? else {
        return Ok(None);
    };
    s.stack.create_cluster_table(TABLE, COLUMNS, "id").await?;
    Ok(Some(s))
}

/// Rows replica `replica` of shard `shard` holds in its local table (what it took, and
/// what it fetched from its twin).
async fn held_by(s: &Scenario, shard: usize, replica: usize) -> Result<u64> {
    s.stack.node(shard, replica).count(TABLE).await
}

/// Waits until replica (`shard`, `replica`) holds more than `n` rows; returns how many.
async fn grows_past(s: &Scenario, shard: usize, replica: usize, n: u64) -> Result<u64> {
    wait_for(
        &format!("shard {} replica {} to take rows", shard + 1, replica + 1),
        secs(30),
        ms(200),
        || async move {
            let now = held_by(s, shard, replica).await?;
            ensure!(now > n, "{now} rows so far");
            Ok(now)
        },
    )
    .await
    .with_context(|| s.logs())
}

/// A feed of `rows` rows over about `seconds` seconds.
fn steady(s: &Scenario, rows: u64, seconds: u64) -> Result<sluice_harness::chaos::Feed> {
    let chunk = 50;
    let every = ms(seconds * 1000 * chunk / rows);
    s.feed_api(
        TABLE,
        RowSet::good(0..rows),
        Pace::new(chunk as usize, every),
    )
}

/// `POST /v1/query` through the gateway; the status and the body.
async fn query(s: &Scenario, sql: &str) -> Result<(u16, String)> {
    let response = s
        .stack
        .http()
        .post(format!("{}/v1/query", s.stack.api_url()))
        .header("X-Tenant", sluice_harness::TENANT)
        .header("Content-Type", "application/json")
        .body(serde_json::json!({ "sql": sql, "timeout_ms": 10_000 }).to_string())
        .send()
        .await?;
    Ok((response.status().as_u16(), response.text().await?))
}

/// A replica killed with -9 while rows flow: its shard's rows keep landing through its
/// twin, the query gateway answers through the servers left, and once it is back
/// nothing is lost or twice anywhere in the cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_replica_kill9() -> Result<()> {
    let Some(mut s) = on_a_cluster("cluster_replica_kill9").await? else {
        return Ok(());
    };
    s.stack.set("query.target", "main");
    s.start_sluice().await?;
    let feed = steady(&s, 6000, 8)?;
    grows_past(&s, 0, 0, 0).await?;
    s.stack.node_mut(0, 0).kill9().await?;
    let twin_before = held_by(&s, 0, 1).await?;
    let twin_during = grows_past(&s, 0, 1, twin_before + 200).await?;
    s.note(
        "shard1_took_during_fault",
        format!("+{}", twin_during - twin_before),
    );
    let (status, body) = query(&s, "SELECT count() AS n FROM events_all").await?;
    ensure!(
        status == 200,
        "the query gateway with a replica down: {status} {body}\n{}",
        s.logs()
    );
    s.note("query_while_down", status);
    let published = s.published(feed).await?;
    s.stack.node_mut(0, 0).start_again_after_crash().await?;
    s.finish(&[published]).await?;
    Ok(())
}

/// A replica frozen past the insert timeout while rows flow: the attempts on it time
/// out (no answer, no KILL QUERY either), the same rows with the same token go to its
/// twin, and once it is continued its late commit is deduplicated: nothing twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_replica_sigstop() -> Result<()> {
    let Some(mut s) = on_a_cluster("cluster_replica_sigstop").await? else {
        return Ok(());
    };
    s.start_sluice().await?;
    let feed = steady(&s, 6000, 8)?;
    grows_past(&s, 0, 0, 0).await?;
    s.stack.node_mut(0, 0).sigstop().await?;
    let frozen = tokio::time::Instant::now();
    let twin_before = held_by(&s, 0, 1).await?;
    let twin_during = grows_past(&s, 0, 1, twin_before + 200).await?;
    s.note(
        "shard1_took_during_fault",
        format!("+{}", twin_during - twin_before),
    );
    // Frozen past the insert timeout (3 s) and the ack_wait (5 s) at least.
    tokio::time::sleep_until(frozen + secs(6)).await;
    s.stack.node_mut(0, 0).sigcont().await?;
    let published = s.published(feed).await?;
    s.finish(&[published]).await?;
    Ok(())
}

/// How shard 2 goes down.
#[derive(Clone, Copy)]
enum ShardFault {
    /// Both replicas killed (-9), then started again.
    Killed,
    /// Both replicas frozen (SIGSTOP) past the insert timeout, then continued.
    Frozen,
}

/// Once shard 2 took rows, both its replicas go down for a while (`fault`): nothing is
/// parked meanwhile and shard 1 keeps taking rows (`shard1_took_during_fault=`); then
/// both come back.
async fn shard_2_down_for_a_while(s: &mut Scenario, fault: ShardFault) -> Result<()> {
    grows_past(s, 1, 0, 0).await?;
    for replica in 0..2 {
        match fault {
            ShardFault::Killed => {
                s.stack.node_mut(1, replica).kill9().await?;
            }
            ShardFault::Frozen => s.stack.node_mut(1, replica).sigstop().await?,
        }
    }
    let down = tokio::time::Instant::now();
    let shard1_before = held_by(s, 0, 0).await?;
    s.expect_nothing_parked_for(&[TABLE], secs(6)).await?;
    let shard1_during = held_by(s, 0, 0).await?;
    ensure!(
        shard1_during > shard1_before,
        "shard 1 took no row while shard 2 was down\n{}",
        s.logs()
    );
    s.note(
        "shard1_took_during_fault",
        format!("+{}", shard1_during - shard1_before),
    );
    for replica in 0..2 {
        match fault {
            ShardFault::Killed => {
                s.stack
                    .node_mut(1, replica)
                    .start_again_after_crash()
                    .await?;
                for refusal in s.stack.node(1, replica).refused_starts() {
                    s.note(
                        "start_refused",
                        format!("replica {}: {refusal}", replica + 1),
                    );
                }
            }
            ShardFault::Frozen => {
                // Frozen past the insert timeout (3 s) and the ack_wait (5 s) at least.
                tokio::time::sleep_until(down + secs(6)).await;
                s.stack.node_mut(1, replica).sigcont().await?
            }
        }
    }
    Ok(())
}

/// Both replicas of shard 2 down for a while (killed: a graceful stop of 18.16 takes
/// seconds): no row is parked, fresh batches go to shard 1, the batches recorded for
/// shard 2 wait for it; once it is back they land there, deduplicated.
///
/// Its failure under load (one 100-row batch missing at the end in about a third of
/// the whole chaos rounds beside two CPU hogs) is ClickHouse's, shown 2026-12-03: the
/// batch was inserted once and acknowledged (the flight's trace), into replica 1 of
/// shard 2, just before both replicas were killed; after their restart replica 1 held
/// the part and replica 2 did not, its replication queue empty and its log pointer past
/// the part, nothing queued to fetch it, so a `Distributed` read that asked replica 2 missed
/// the rows. The tally counts a row a replica of its shard holds as inserted and names
/// the gap (`on_one_replica_only=`); a row on no replica still fails it.
///
/// The kill shows one more thing of 18.16's (2 of 10 whole chaos rounds beside two CPU
/// hogs, 2026-12-03, 2.15.1): a killed replica may refuse to start again, "The local
/// set of parts of table default.events doesn't look like the set of parts in
/// ZooKeeper". The harness starts it as docs/operations.md tells an operator to
/// (`start_again_after_crash`: the `flags/force_restore_data` file, then start again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_shard_down() -> Result<()> {
    let Some(mut s) = on_a_cluster("cluster_shard_down").await? else {
        return Ok(());
    };
    s.start_sluice().await?;
    let feed = steady(&s, 6000, 10)?;
    shard_2_down_for_a_while(&mut s, ShardFault::Killed).await?;
    let published = s.published(feed).await?;
    s.finish(&[published]).await?;
    Ok(())
}

/// ZooKeeper stopped while rows flow: every replica's table is read-only (242), each
/// backs off on its own, nothing is parked; once ZooKeeper is back (and ClickHouse has
/// its session again, ~10 s on 18.16) everything lands, nothing twice.
///
/// 18.16 may keep, on a replica, the part of an insert whose commit ZooKeeper's stop cut
/// (999 "Connection loss", 319 "Unknown status, client must retry") while the retry,
/// whose block id ZooKeeper never got, lands as a new part: 100 rows twice in 2 of about
/// 50 runs (one in whole run 40, 2026-12-03, 2.15.1), until the part check (300 s)
/// detaches the first. Sluice cannot tell which it is from the answer. The count comes
/// after that check, run at once (`set_aside_parts_in_doubt`, named on the line as
/// `parts_in_doubt_set_aside=`): a duplicate left after it is Sluice's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_zookeeper_stopped() -> Result<()> {
    let Some(mut s) = on_a_cluster("cluster_zookeeper_stopped").await? else {
        return Ok(());
    };
    s.start_sluice().await?;
    let feed = steady(&s, 4000, 6)?;
    grows_past(&s, 0, 0, 0).await?;
    let zookeeper = s
        .stack
        .zookeeper
        .as_mut()
        .context("a cluster has a ZooKeeper")?;
    zookeeper.stop().await?;
    let before = s.stack.count("events_all").await?;
    s.expect_nothing_parked_for(&[TABLE], secs(6)).await?;
    let during = s.stack.count("events_all").await?;
    s.note("landed_during_fault", during.saturating_sub(before));
    let zookeeper = s
        .stack
        .zookeeper
        .as_mut()
        .context("a cluster has a ZooKeeper")?;
    zookeeper.start_again().await?;
    let published = s.published(feed).await?;
    s.finish(&[published]).await?;
    Ok(())
}

/// The ids replica `replica` of shard `shard` holds.
async fn ids_on(s: &Scenario, shard: usize, replica: usize) -> Result<Vec<u64>> {
    let text = s
        .stack
        .node(shard, replica)
        .exec(&format!(
            "SELECT DISTINCT id FROM {TABLE} FORMAT TabSeparated"
        ))
        .await?;
    Ok(text
        .lines()
        .filter_map(|l| l.trim().parse::<u64>().ok())
        .collect())
}

/// A table placed by `shard_key = "id"`: each row goes to the shard of its id, the
/// ingest API's chunks (which mix ids) are split into a message per shard, and with
/// both replicas of shard 2 frozen past the insert timeout, shard 1 keeps taking its
/// own ids while shard 2's wait in the stream, nothing parked. Once shard 2 is back
/// everything lands, nothing twice (its late commits deduplicated), and every row is
/// on its id's shard and on no other.
///
/// Frozen rather than killed: `cluster_shard_down` kills a whole shard already; a
/// second scenario restarting 18.16 after -9 would walk the same start-up path again
/// (`start_again_after_crash`) and nothing of Sluice's that this one does not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_shard_key_shard_down() -> Result<()> {
    let Some(mut s) = on_a_cluster("cluster_shard_key_shard_down").await? else {
        return Ok(());
    };
    s.stack.set(
        &format!("tables.\"{}.{TABLE}\".shard_key", sluice_harness::TENANT),
        "id",
    );
    s.start_sluice().await?;
    let feed = steady(&s, 4000, 10)?;
    shard_2_down_for_a_while(&mut s, ShardFault::Frozen).await?;
    let published = s.published(feed).await?;
    let metrics = s.stack.metrics_parsed().await?;
    let split = metrics
        .value("sluice_messages_split_total", &[])
        .unwrap_or(0.0);
    s.note("messages_split", split);
    s.finish(&[published]).await?;
    ensure!(
        split > 0.0,
        "no message was split: the API's chunks mix ids"
    );
    let key = sluice_actors::ShardKey::new("id");
    for shard in 0..2 {
        let mut ids = ids_on(&s, shard, 0).await?;
        ids.extend(ids_on(&s, shard, 1).await?);
        ensure!(!ids.is_empty(), "shard {} holds no row", shard + 1);
        let elsewhere: Vec<u64> = ids
            .iter()
            .copied()
            .filter(|id| key.shard_of_row(format!(r#"{{"id":{id}}}"#).as_bytes(), 2) != shard)
            .take(5)
            .collect();
        ensure!(
            elsewhere.is_empty(),
            "shard {} holds ids of the other shard, e.g. {elsewhere:?}",
            shard + 1
        );
    }
    Ok(())
}

/// Keyed split, ack lost, nats-server restarted past the duplicate window (issue 36).
/// `shard_key = "id"` and the ingest stream's duplicate window 2 s: the API's chunks mix
/// ids, so nearly every message is split into a part per shard. While they flow, a
/// second instance starts with the failpoint `crash-after-split-parts`: it aborts once
/// the parts of its first split are stored, that message unacked and its parts not yet
/// recorded. nats-server is stopped and started again once the window has passed, so
/// it rebuilds its duplicate check from the stream alone (the parts consumed meanwhile
/// are forgotten), and the message comes back after `ack_wait` to the first instance.
/// Every row is in the cluster once (`duplicates=0` on its Replicated tables); the line
/// says how many messages were split and how many surplus copies of parts were acked
/// without an insert (`split_copies_dropped=`).
///
/// Before the split was recorded (`src/nats/split/`) the message was split again into
/// parts stored a second time: its rows went in twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_shard_key_split_ack_lost() -> Result<()> {
    let Some(mut s) = on_a_cluster("cluster_shard_key_split_ack_lost").await? else {
        return Ok(());
    };
    s.stack.set(
        &format!("tables.\"{}.{TABLE}\".shard_key", sluice_harness::TENANT),
        "id",
    );
    s.stack.set("nats.duplicate_window", "2s");
    let first = s.start_sluice().await?;
    let feed = steady(&s, 4000, 10)?;
    grows_past(&s, 1, 0, 0).await?;
    s.stack.fresh_ports()?;
    s.stack.env.push((
        "SLUICE_TEST_FAILPOINT".into(),
        "crash-after-split-parts".into(),
    ));
    let doomed = s.spawn_sluice()?;
    s.stack.env.retain(|(k, _)| k != "SLUICE_TEST_FAILPOINT");
    s.stack
        .wait_exited(doomed, secs(60))
        .await
        .context("the second instance to abort once its first split's parts are stored")?;
    let crashed = tokio::time::Instant::now();
    s.stack.nats.stop().await?;
    // Past the window: the parts' ids are older than it when the server rebuilds its
    // duplicate check.
    tokio::time::sleep_until(crashed + secs(3)).await;
    s.stack.nats.start_again().await?;
    let published = s.published(feed).await?;
    // Everything settled (the message the second instance held among it) before the
    // counts of the line are read.
    s.quiesce(&["events_all"], secs(120)).await?;
    let split = s.metric(first, "sluice_messages_split_total", &[]).await?;
    let dropped = s
        .metric(first, "sluice_split_copies_dropped_total", &[])
        .await?;
    s.note("messages_split", split);
    s.note("split_copies_dropped", dropped);
    s.finish(&[published]).await?;
    ensure!(
        split > 0.0,
        "no message was split: the API's chunks mix ids"
    );
    Ok(())
}
