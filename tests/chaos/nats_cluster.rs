//! Chaos on a three-node NATS JetStream cluster (the harness's `NatsCluster`, on the
//! nats-server `SLUICE_TEST_NATS` names; `[nats] replicas = 3`, every node a seed).
//!
//! Every scenario runs two Sluice instances throughout, sharing the consumer; rows come
//! through the first one's ingest API (100-row requests, retried with their
//! `Idempotency-Key` after a 503) and straight to JetStream (one-row messages and
//! 100-row ones), bad rows among them, into a `MergeTree` table and its
//! `ReplicatedMergeTree` twin. While they flow one fault hits the cluster and heals.
//! Each reports `lost=0`, `duplicates=0` in the twin (past the copies JetStream stored
//! of a one-row or 100-row message the feed sent again after a lost ack across a node's
//! restart: `resent_stored_twice_by_jetstream=`, see docs/operations.md, "Delivery
//! guarantees"), no good row parked, and
//! `gap=` (the longest stretch without a new row in the twin) and `resumed_in=` (from
//! the end of the fault to the next new row, failing past 30 s).
//!
//! | scenario                          | fault                                                        |
//! |-----------------------------------|--------------------------------------------------------------|
//! | `cluster_stream_leader_kill9`     | the `INGEST` stream's leader killed with -9, started again once another is elected |
//! | `cluster_consumer_leader_sigstop` | the consumer's leader frozen 12 s, past the election timeout |
//! | `cluster_bucket_leader_kill9`     | the manifest bucket's leader killed with -9, started again once another is elected |
//! | `cluster_rolling_restart`         | each node restarted in turn, its replicas current before the next |
//! | `cluster_connected_node_sigstop`  | the node the first Sluice is connected to frozen 12 s |
//! | `cluster_partitioned_stream_leader_kill9` | `[nats] partitions = 3`, the partitions' leaders spread over the three nodes: `INGEST_0`'s leader killed with -9 |
//! | `cluster_partitioned_rolling_restart` | `[nats] partitions = 3`, leaders spread: each node restarted in turn |
//!
//! The partitioned ones put the subject mapping for three partitions in every node's
//! configuration (the straight feed publishes on `ingest.<tenant>.<table>`).

use std::time::Duration;

use anyhow::{Context, Result};
use sluice_actors::server_mapping;
use sluice_harness::chaos::{Pace, RowSet, Scenario, CONSUMER, DLQ_STREAM, INGEST_STREAM};
use sluice_harness::nats_cluster::{consumer_state, ClusterView};
use sluice_harness::{wait_for, StackOptions};

const SLUICE: &str = env!("CARGO_BIN_EXE_sluice");
/// The table the rows go to; its Replicated twin (where exactly-once holds) is
/// `events_r`.
const TABLE: &str = "events";
const TWIN: &str = "events_r";
/// Rows per feed, and their pace: 100 every 250 ms, 24 s of rows, so they flow
/// before, through and after each fault.
const ROWS: u64 = 9_600;
const CHUNK: usize = 100;
const EVERY: Duration = Duration::from_millis(250);
/// The manifest bucket's stream.
const BUCKET: &str = "KV_SLUICE_MANIFESTS";
/// An election takes a few seconds after the followers stop hearing the leader.
const ELECTION: Duration = Duration::from_secs(30);
/// How long the scenario waits after the fault for every stream and consumer to have
/// a leader again, before the resume bound runs from the fault's end alone.
const LEADERS_BACK: Duration = Duration::from_secs(60);

/// What happens to the cluster while rows flow.
#[derive(Clone, Copy, Debug)]
enum ClusterFault {
    /// The ingest stream's leader killed with -9, started again once another is elected.
    StreamLeaderKill9,
    /// The durable consumer's leader frozen past the election timeout.
    ConsumerLeaderSigstop,
    /// The manifest bucket's leader killed with -9, started again once another is elected.
    BucketLeaderKill9,
    /// Every node stopped and started again in turn.
    RollingRestart,
    /// The node the first Sluice is connected to frozen.
    ConnectedNodeSigstop,
}

/// How long a node stays frozen: past the election timeout (a few seconds), the pull
/// heartbeat (5 s) and `ack_wait` (5 s).
const FROZEN: Duration = Duration::from_secs(12);

/// The ingest streams of a queue in `partitions` partitions.
fn ingest_streams(partitions: usize) -> Vec<String> {
    match partitions {
        1 => vec![INGEST_STREAM.to_owned()],
        n => (0..n).map(|p| format!("{INGEST_STREAM}_{p}")).collect(),
    }
}

async fn cluster_scenario(name: &str, fault: ClusterFault) -> Result<()> {
    partitioned_scenario(name, fault, 1).await
}

/// A scenario with the queue in `partitions` partitions (1: one stream), their
/// leaders spread over the nodes first.
async fn partitioned_scenario(name: &str, fault: ClusterFault, partitions: usize) -> Result<()> {
    let mut options = StackOptions::default().with_nats_cluster();
    if partitions > 1 {
        options = options.with_nats_config(server_mapping("ingest", partitions));
    }
    let Some(mut s) = Scenario::start(name, SLUICE, options).await? else {
        return Ok(());
    };
    s.create_tables(&[TABLE]).await?;
    s.stack
        .set("log.level", "info,sluice_actors=debug,sluice=debug");
    if partitions > 1 {
        s.stack.set("nats.partitions", partitions as i64);
    }
    let first = s.start_sluice().await?;
    s.stack.fresh_ports()?;
    s.start_sluice().await?;
    let view = ClusterView::connect(&s.stack.nats).await?;
    let streams = ingest_streams(partitions);
    let streams: Vec<&str> = streams.iter().map(String::as_str).collect();
    if partitions > 1 {
        let leaders = view.spread_stream_leaders(&streams).await?;
        eprintln!("{name}: leaders {streams:?} on {leaders:?}");
    }

    let through_api = s.feed_api_of(
        first,
        TABLE,
        RowSet::good(0..ROWS).with_bad_spread(8),
        Pace::new(CHUNK, EVERY),
    )?;
    let straight = s.feed_jetstream(
        TABLE,
        RowSet::good(ROWS..2 * ROWS).with_bad_spread(8),
        Pace::new(CHUNK, EVERY),
    );
    s.stack
        .wait_for_count(TWIN, 1_000, Duration::from_secs(30))
        .await
        .with_context(|| s.logs())?;
    s.watch_flow(TWIN)?;
    inject(&mut s, &view, first, fault, &streams)
        .await
        .with_context(|| format!("{fault:?}\n{}", s.stack.nats.log_tail(20)))?;
    s.fault_over();
    // Rows can flow only once NATS has leaders again: the resume bound runs from then.
    let mut led_streams = streams.clone();
    led_streams.extend([BUCKET, DLQ_STREAM]);
    let consumers: Vec<(&str, &str)> = streams.iter().map(|st| (*st, CONSUMER)).collect();
    let led = view
        .wait_leaders(&led_streams, &consumers, LEADERS_BACK)
        .await;
    if led.is_ok() {
        s.leaders_back();
    }
    let published = [
        s.published(through_api).await?,
        s.published(straight).await?,
    ];
    s.finish(&published).await?;
    Ok(())
}

/// The fault itself, from the moment rows land to the moment it is over.
async fn inject(
    s: &mut Scenario,
    view: &ClusterView,
    first: usize,
    fault: ClusterFault,
    streams: &[&str],
) -> Result<()> {
    // The fault's stream: the first partition's (or the one stream).
    let ingest = streams.first().copied().unwrap_or(INGEST_STREAM);
    let frozen_or_killed = match fault {
        ClusterFault::StreamLeaderKill9 => view.stream(ingest).await?.leader,
        ClusterFault::BucketLeaderKill9 => view.stream(BUCKET).await?.leader,
        ClusterFault::ConsumerLeaderSigstop => view.consumer(INGEST_STREAM, CONSUMER).await?.leader,
        ClusterFault::ConnectedNodeSigstop => connected_server(s, first, None).await?,
        ClusterFault::RollingRestart => String::new(),
    };
    match fault {
        ClusterFault::StreamLeaderKill9 | ClusterFault::BucketLeaderKill9 => {
            let stream = match fault {
                ClusterFault::BucketLeaderKill9 => BUCKET,
                _ => ingest,
            };
            let nats = &mut s.stack.nats;
            let node = nats.index_of(&frozen_or_killed)?;
            nats.node_mut(node)?.kill9().await?;
            // In effect once the others elected a leader without it.
            let elected = view
                .new_stream_leader(stream, &frozen_or_killed, ELECTION)
                .await;
            nats.node_mut(node)?.start_again().await?;
            elected.context("no other leader while the old one was down")?;
        }
        ClusterFault::ConsumerLeaderSigstop => {
            let nats = &mut s.stack.nats;
            let node = nats.index_of(&frozen_or_killed)?;
            nats.node_mut(node)?.sigstop().await?;
            let frozen_at = tokio::time::Instant::now();
            let moved = view
                .new_consumer_leader(INGEST_STREAM, CONSUMER, &frozen_or_killed, ELECTION)
                .await;
            tokio::time::sleep_until(frozen_at + FROZEN).await;
            nats.node_mut(node)?.sigcont().await?;
            moved.context("no other consumer leader while the old one was frozen")?;
        }
        ClusterFault::ConnectedNodeSigstop => {
            let node = s.stack.nats.index_of(&frozen_or_killed)?;
            s.stack.nats.node_mut(node)?.sigstop().await?;
            let frozen_at = tokio::time::Instant::now();
            // In effect once the first Sluice left the frozen node for another.
            let moved = connected_server(s, first, Some(&frozen_or_killed)).await;
            tokio::time::sleep_until(frozen_at + FROZEN).await;
            s.stack.nats.node_mut(node)?.sigcont().await?;
            moved.context("the first Sluice never left the frozen node")?;
        }
        ClusterFault::RollingRestart => {
            let nats = &mut s.stack.nats;
            for node in 0..nats.len() {
                nats.node_mut(node)?.restart().await?;
                // As an operator would: the next node goes only once this one caught
                // up (its /healthz says it runs, not that its replicas are current).
                for stream in streams {
                    view.wait_current(stream, Some(CONSUMER), ELECTION).await?;
                }
                view.wait_current(BUCKET, None, ELECTION).await?;
            }
        }
    }
    Ok(())
}

/// The `server_name` Sluice process `index` is connected to (other than `not`, when
/// given), from its `/admin/actors` (the consumer's `nats` part, filled by the lag poll
/// every 5 s).
async fn connected_server(s: &Scenario, index: usize, not: Option<&str>) -> Result<String> {
    let stack = &s.stack;
    wait_for(
        &format!("a connected server other than {not:?} in /admin/actors"),
        Duration::from_secs(30),
        Duration::from_millis(200),
        || async move {
            let (_, tree) = stack.admin_get_of(index, "/admin/actors").await?;
            consumer_state(&tree)
                .and_then(|c| c["nats"]["connected_server"].as_str().map(str::to_owned))
                .filter(|name| !name.is_empty() && Some(name.as_str()) != not)
                .context("not known yet")
        },
    )
    .await
}

/// The ingest stream's leader killed with -9 under load: publishes wait out the
/// election (the API sends them again under the same ids), the consumer follows the
/// new leader; nothing lost, nothing doubled.
///
/// Ignored for a while (2026-12-03) for 188 rows twice in the twin once under load; the
/// same hole as `cluster_bucket_leader_kill9` was suspected (see there; closed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_stream_leader_kill9() -> Result<()> {
    cluster_scenario(
        "cluster_stream_leader_kill9",
        ClusterFault::StreamLeaderKill9,
    )
    .await
}

/// The consumer's leader frozen past the election timeout: its pull requests go with
/// it, a new leader is elected and the pulls are replaced; the thawed node steps down.
///
/// Ignored for a while (issue 21): in one run under load two bad rows were missing
/// from the DLQ and three parked twice while the DLQ's stream elected a leader; not
/// seen again in 6 runs alone beside two CPU hogs nor in the whole chaos rounds since
/// (the DLQ's count now waits out a stream that cannot answer yet, `cebd3cd`).
///
/// Once in five chaos rounds on 2.9.10 beside two CPU hogs (2026-12-03) the stream
/// kept its last 200 messages while the consumer showed `delivered` and `ack_floor` at
/// the message before them and nothing pending or awaiting an ack, 15 s after every
/// other row had gone quiet. Sluice now removes what it acked itself that the stream
/// keeps above the floor (`src/nats/workarounds/acked_here.rs`), and steps the consumer's leader
/// down when the stream stays ahead of it (`stream_ahead_of_consumer`,
/// `src/nats/pulling/stuck_consumer.rs`); the scenario is quiet only once the stream is empty,
/// and prints its counts (rows in ClickHouse or not) before failing on such messages.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_consumer_leader_sigstop() -> Result<()> {
    cluster_scenario(
        "cluster_consumer_leader_sigstop",
        ClusterFault::ConsumerLeaderSigstop,
    )
    .await
}

/// The manifest bucket's leader killed with -9: records wait for the election, the
/// watch that kept the index is opened again where it broke, and no row is taken
/// before the index is whole again.
///
/// Ignored for a while: round 3 of `scripts/test --repeat 3 --hogs 2 --phases
/// chaos-debian,chaos-current` (2026-12-03, 2.9.10) had 146 rows twice in the twin.
/// Both instances logged "the manifest index did not see batch … within 5s": the claim
/// wrote its record, the index (its watch broken by the kill) did not show it in time,
/// and the claim gave up before "the earlier claim wins" was checked, leaving a record
/// that shared messages with an earlier one; formed again later for a message only it
/// held, it was inserted beside the earlier batch under its own token. Closed
/// (`6dc3594`): an open record overlapped by an earlier claim is withdrawn when formed
/// again, never sent
/// (`actors/tests/exactly_once.rs::a_record_left_behind_by_a_lost_claim_is_withdrawn_never_sent`),
/// and claims keep their order through their batches' later states
/// (`tests/manifest_store.rs::a_claim_keeps_its_place_when_its_batch_is_written_again`).
/// That commit also removed the record of a claim that gave up: in 3 of 3 rounds on
/// 2.9.10 beside two CPU hogs, this scenario or `cluster_stream_leader_kill9` then had
/// 475 to 860 rows twice, each round with claims that gave up and their records
/// "removed while its messages were gathered" by the other instance: a record removed
/// while another instance may be sending it. It stays now, as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_bucket_leader_kill9() -> Result<()> {
    cluster_scenario(
        "cluster_bucket_leader_kill9",
        ClusterFault::BucketLeaderKill9,
    )
    .await
}

/// All three nodes restarted one by one, each with its replicas current before the next: every leader
/// moves at least once.
///
/// In three runs of `scripts/test` on the current nats-server (2026-12-02, runs 10, 13
/// and 16) one flight stayed open past the 90 s deadline after every row had landed
/// once and been acked, here and in `cluster_connected_node_sigstop`; found on
/// 2026-12-03: an empty batch's isolation that never ended (see
/// `cluster_connected_node_sigstop`). A flight that panicked stayed open for ever that way (fixed: see
/// `actors/tests/supervision.rs::a_flight_that_panics_gives_its_rows_back_and_its_table_flies_on`),
/// and a scenario that does not go quiet now prints each flight's step. Back in the
/// suite after 4 whole chaos runs on 2.15.1 and 2 on 2.9.10 without it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_rolling_restart() -> Result<()> {
    cluster_scenario("cluster_rolling_restart", ClusterFault::RollingRestart).await
}

/// The node the first Sluice is connected to frozen with its sockets open: the client
/// leaves it within a few pings and goes on through another node.
///
/// The flight that stayed `inserting` past the 90 s deadline (here, in
/// `cluster_rolling_restart` and `cluster_consumer_leader_sigstop`, about once in ten
/// runs under load) is found and fixed (2026-12-03, with the insert's steps traced): a
/// batch whose every message went back as a copy of one in flight flew empty, its empty
/// insert was refused (code 381), and the isolation split the empty range into empty
/// ranges for ever (329,852 inserts in 90 s). An empty range sends nothing now, and an
/// empty batch does not fly (`actors/src/bisect.rs::tests::an_empty_batch_is_judged_without_an_insert`).
///
/// Ignored for a while for the consumer: in run 29 rows flowed again only 40.6 s after
/// the thaw (the bound is 30 s), the manifest bucket answering "no responders" (no
/// leader) for that long; and once on 2.9.10 beside two CPU hogs (2026-12-03) nothing
/// was delivered for 90 s after the thaw while 3,950 messages waited: both instances
/// idle, the consumer's `ack_pending` at 1,003 (its `max_ack_pending` is 1,000), held by
/// neither, and no redelivery after `ack_wait`. Such a consumer is now noticed and its
/// leader stepped down (`acks_held_by_nobody`, `src/nats/pulling/stuck_consumer.rs`). Back in
/// the suite after 7 runs on 2.9.10 beside two CPU hogs and 3 on 2.15.1 without either
/// (2026-12-03).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_connected_node_sigstop() -> Result<()> {
    cluster_scenario(
        "cluster_connected_node_sigstop",
        ClusterFault::ConnectedNodeSigstop,
    )
    .await
}

/// The queue in three partitions, their leaders on three nodes: one partition's leader
/// killed with -9. Its rows wait out the election (the API sends them again under the
/// same ids); the other two partitions' rows flow on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_partitioned_stream_leader_kill9() -> Result<()> {
    partitioned_scenario(
        "cluster_partitioned_stream_leader_kill9",
        ClusterFault::StreamLeaderKill9,
        3,
    )
    .await
}

/// The queue in three partitions, their leaders on three nodes: every node restarted
/// in turn (each partition's leader moves at least once).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_partitioned_rolling_restart() -> Result<()> {
    partitioned_scenario(
        "cluster_partitioned_rolling_restart",
        ClusterFault::RollingRestart,
        3,
    )
    .await
}
