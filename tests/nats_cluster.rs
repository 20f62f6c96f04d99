//! Sluice on a three-node NATS JetStream cluster (the harness's `NatsCluster`, on the
//! nats-server `SLUICE_TEST_NATS` names), each checked as an operator would:
//!
//! - `[nats] replicas = 3`: the ingest stream, the DLQ, the manifest bucket and the
//!   durable consumer, made with one replica by an earlier start, each have three
//!   peers (their stream info says so);
//! - every node in `[nats] url`: Sluice starts and moves rows with the first seed down;
//! - `replicas = 3` on a single server: not ready, and `/readyz` says why;
//! - a pull lost to a leader change is replaced without a restart, and counted
//!   (`sluice_consumer_stalls_total`, the consumer's `stalls` in `/admin/actors`).
//!
//! The faults under load (leaders killed, frozen, a rolling restart) are the chaos
//! suite's `nats_cluster` scenarios.

mod ingest_common;

use std::time::Duration;

use anyhow::{ensure, Context, Result};
use ingest_common::{post, Reply, AS_TENANT, NDJSON};
use serde_json::{json, Value};
use sluice_harness::nats_cluster::{consumer_state, ClusterView};
use sluice_harness::{wait_for, Stack, StackOptions};

const SLUICE: &str = env!("CARGO_BIN_EXE_sluice");
const DEADLINE: Duration = Duration::from_secs(60);
const POLL: Duration = Duration::from_millis(200);

async fn cluster_stack(test: &str) -> Result<Option<Stack>> {
    if sluice_harness::available(test, sluice_harness::clickhouse::binary())?.is_none() {
        return Ok(None);
    }
    let mut stack = Stack::start(StackOptions::default().with_nats_cluster()).await?;
    // What Sluice waits for when it is not ready (the manifest index's watch, the
    // streams' setup) is logged at debug: a failure's log tail must say it (whole run
    // 44, 2026-12-03: not ready in 30 s with one seed down, the watch's tries unseen).
    stack.set("log.level", "info,sluice::nats=debug");
    stack
        .clickhouse
        .exec("CREATE TABLE events (id UInt64, name String) ENGINE = MergeTree ORDER BY id")
        .await?;
    Ok(Some(stack))
}

fn rows(ids: std::ops::Range<u64>) -> Vec<Value> {
    ids.map(|id| json!({"id": id, "name": format!("row {id}")}))
        .collect()
}

/// Posts rows as a careful client does, with an `Idempotency-Key`: a publish whose ack
/// a leader change lost is then sent again by the API itself, and a 503 (a write whose
/// fate is unknown while streams are raised to three replicas) is sent again by the
/// client, the same body under the same key.
async fn ingest(stack: &Stack, ids: std::ops::Range<u64>) -> Result<()> {
    let key = format!("rows-{}-{}", ids.start, ids.end);
    let key = &key;
    let ids = &ids;
    wait_for("the rows accepted", DEADLINE, POLL, || async move {
        let (status, body) = stack
            .ingest_raw(
                "events",
                "application/x-ndjson",
                ndjson(ids.clone()),
                &[("Idempotency-Key", key)],
            )
            .await?;
        ensure!(status == 202, "ingest answered {status}: {body}");
        Ok(())
    })
    .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_three_replicas_the_streams_the_consumer_and_the_bucket_are_r3() -> Result<()> {
    let Some(mut stack) =
        cluster_stack("with_three_replicas_the_streams_the_consumer_and_the_bucket_are_r3").await?
    else {
        return Ok(());
    };
    let view = ClusterView::connect(&stack.nats).await?;
    // First as a deployment that kept one copy of everything.
    stack.set("nats.replicas", 1);
    let r1 = stack.start_sluice(SLUICE).await?;
    ingest(&stack, 0..100).await?;
    stack.wait_for_count("events", 100, DEADLINE).await?;
    for name in ["INGEST", "DLQ", "KV_SLUICE_MANIFESTS"] {
        let group = view.stream(name).await?;
        assert_eq!((group.configured, group.peers.len()), (1, 1), "{name}");
    }
    stack.sluice[r1].stop(Duration::from_secs(10)).await?;

    // Then with three: the existing streams and bucket are raised, not only new ones.
    stack.set("nats.replicas", 3);
    let r3 = stack.start_sluice(SLUICE).await?;
    ingest(&stack, 100..200).await?;
    stack
        .wait_for_count("events", 200, DEADLINE)
        .await
        .with_context(|| stack.sluice[r3].log_tail(40))?;

    for name in [
        "INGEST",
        "DLQ",
        "KV_SLUICE_MANIFESTS",
        "KV_SLUICE_IDEMPOTENCY",
    ] {
        let view = &view;
        let group = wait_for(
            &format!("{name} on three peers"),
            DEADLINE,
            POLL,
            || async move {
                let group = view.stream(name).await?;
                ensure!(group.configured == 3 && group.peers.len() == 3, "{group:?}");
                Ok(group)
            },
        )
        .await?;
        let mut peers = group.peers.clone();
        peers.sort();
        assert_eq!(peers, ["n1", "n2", "n3"], "{name}: {group:?}");
    }
    let consumer = view.consumer("INGEST", "sluice").await?;
    assert_eq!(
        consumer.peers.len(),
        3,
        "the durable consumer: {consumer:?}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sluice_starts_and_moves_rows_with_its_first_seed_down() -> Result<()> {
    let Some(mut stack) =
        cluster_stack("sluice_starts_and_moves_rows_with_its_first_seed_down").await?
    else {
        return Ok(());
    };
    // The streams exist (a first start made them), as they do when a node goes down
    // under a running deployment.
    let first = stack.start_sluice(SLUICE).await?;
    ingest(&stack, 0..10).await?;
    stack.wait_for_count("events", 10, DEADLINE).await?;
    stack.sluice[first].stop(Duration::from_secs(10)).await?;

    let view = ClusterView::connect(&stack.nats).await?;
    stack.nats.node_mut(0)?.kill9().await?;
    // The fault is a seed down, not an election: the others lead before Sluice starts
    // (under load an election after a kill -9 took longer than Sluice's readiness wait).
    view.wait_led_without(
        &stack.nats,
        stack.nats.name_of(0),
        &[
            "INGEST",
            "DLQ",
            "KV_SLUICE_MANIFESTS",
            "KV_SLUICE_IDEMPOTENCY",
        ],
        &[("INGEST", "sluice")],
        DEADLINE,
    )
    .await?;
    let url = stack.nats.url();
    assert!(url.starts_with(&stack.nats.node(0)?.url()), "{url}");
    // Ready later than usual, and by design: the seed was killed a moment ago, and
    // nats-server still places one new consumer in three on it (the manifest index's
    // watch among them), where it never answers; each such draw costs Sluice a 3 s
    // try of its watch (`src/nats/manifest/index.rs`, `WATCH_OPEN_WITHIN`). Eight
    // tries fit in the minute: all eight lost is one start in 6,561.
    let second = stack.start_sluice_within(SLUICE, DEADLINE).await?;
    ingest(&stack, 10..110).await?;
    stack
        .wait_for_count("events", 110, DEADLINE)
        .await
        .with_context(|| stack.sluice[second].log_tail(40))?;
    Ok(())
}

/// issue 37.10: `[nats] replicas = 3` against a single nats-server (no cluster can ever
/// be there): the start fails, exit 1 with the reason naming `[nats] replicas`, as the
/// docs say. Here the deployment ran with one replica before, so its R1 streams exist:
/// a process left running, unready, answered 202 into them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_on_a_single_server_fail_the_start_with_the_reason() -> Result<()> {
    if sluice_harness::available(
        "three_replicas_on_a_single_server_fail_the_start_with_the_reason",
        sluice_harness::clickhouse::binary(),
    )?
    .is_none()
    {
        return Ok(());
    }
    let mut stack = Stack::start(StackOptions::default()).await?;
    let first = stack.start_sluice(SLUICE).await?;
    stack.sluice[first].stop(DEADLINE).await?;
    stack.set("nats.replicas", 3);
    let index = stack.spawn_sluice(SLUICE)?;
    let exit = stack.sluice[index].wait_exit(DEADLINE).await?;
    let log = stack.sluice[index].log_tail(40);
    assert_eq!(exit.code(), Some(1), "{log}");
    assert!(
        log.contains("[nats] replicas = 3") && log.contains("a single server"),
        "{log}"
    );
    Ok(())
}

/// Rows POSTed while the ingest stream elects a leader (its leader killed with -9): the
/// API sends them again under the same message ids until the new leader takes them,
/// and answers 202, not 503; each row lands once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_posted_during_the_stream_leaders_election_are_accepted_once() -> Result<()> {
    let Some(mut stack) =
        cluster_stack("rows_posted_during_the_stream_leaders_election_are_accepted_once").await?
    else {
        return Ok(());
    };
    let view = ClusterView::connect(&stack.nats).await?;
    let leader = streams_made_then_connected_elsewhere(&mut stack, &view).await?;

    stack.nats.node_mut(leader)?.kill9().await?;
    let (status, body) = stack
        .ingest_raw(
            "events",
            "application/x-ndjson",
            ndjson(10..110),
            &[("Idempotency-Key", "during-the-election")],
        )
        .await?;
    assert_eq!(status, 202, "{body}");
    assert_eq!(body["accepted"], 100, "{body}");
    stack
        .wait_for_count("events", 110, DEADLINE)
        .await
        .with_context(|| stack.sluice[1].log_tail(40))?;
    let (total, distinct) = sluice_harness::chaos::counts(&stack.clickhouse, "events").await?;
    assert_eq!((total, distinct), (110, 110));
    Ok(())
}

/// No quorum for longer than `[api] publish_retry_for`: 503 with `Retry-After` once the
/// bound passed (not at once, not never); the client's retry with the same key, once
/// the nodes are back, stores the rows once.
///
/// In two runs (2026-12-02) the 503 came after 20 s: two steps of the keyed request
/// each waited out the client's 10 s request timeout. Each key-value step and the
/// first wait for a chunk's ack now end with the window too: it comes after about 2 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_quorum_past_the_bound_the_api_answers_503_with_retry_after() -> Result<()> {
    let Some(mut stack) =
        cluster_stack("without_quorum_past_the_bound_the_api_answers_503_with_retry_after").await?
    else {
        return Ok(());
    };
    stack.set("api.publish_retry_for", "2s");
    stack.set("api.retry_after", "3s");
    let view = ClusterView::connect(&stack.nats).await?;
    let leader = streams_made_then_connected_elsewhere(&mut stack, &view).await?;
    let other = (0..3)
        .find(|&i| i != leader && !connected_to(&stack, i))
        .context("a third node")?;
    stack.nats.node_mut(leader)?.kill9().await?;
    stack.nats.node_mut(other)?.kill9().await?;

    let headers_sent = [AS_TENANT, NDJSON, ("Idempotency-Key", "no-quorum")];
    let http = stack.http().clone();
    let started = std::time::Instant::now();
    let Reply {
        status,
        headers,
        body,
    } = post(&http, &stack, "events", ndjson(10..20), &headers_sent).await?;
    let took = started.elapsed();
    assert_eq!(status, 503, "{body}");
    assert_eq!(
        headers.get("retry-after").and_then(|v| v.to_str().ok()),
        Some("3")
    );
    assert_eq!(body["not_stored"], 10, "{body}");
    assert!(
        took >= Duration::from_secs(2) && took < Duration::from_secs(10),
        "answered after {took:?}: the bound is 2 s (no step may wait out the client's 10 s request timeout)"
    );

    stack.nats.node_mut(leader)?.start_again().await?;
    stack.nats.node_mut(other)?.start_again().await?;
    let stack_ref = &stack;
    let http = &http;
    wait_for("the retry to be accepted", DEADLINE, POLL, || async move {
        let reply = post(http, stack_ref, "events", ndjson(10..20), &headers_sent).await?;
        let (status, body) = (reply.status, reply.body);
        ensure!(status == 202, "{status} {body}");
        Ok(())
    })
    .await?;
    stack.wait_for_count("events", 20, DEADLINE).await?;
    let (total, distinct) = sluice_harness::chaos::counts(&stack.clickhouse, "events").await?;
    assert_eq!((total, distinct), (20, 20));
    Ok(())
}

fn ndjson(ids: std::ops::Range<u64>) -> Vec<u8> {
    rows(ids)
        .iter()
        .map(|r| format!("{r}\n"))
        .collect::<String>()
        .into_bytes()
}

/// Whether the newest Sluice was told to connect to node `i` (its `[nats] url`).
fn connected_to(stack: &Stack, i: usize) -> bool {
    let url = stack.config["nats"]["url"].as_str().unwrap_or_default();
    stack
        .nats
        .node(i)
        .is_ok_and(|node| url.split(',').any(|seed| seed == node.url()))
}

/// Starts a Sluice that makes the streams and lands 10 rows, stops it, then starts
/// one whose seeds leave out the ingest stream's leader (so killing that node is an
/// election, not a reconnect). Returns the leader's index.
async fn streams_made_then_connected_elsewhere(
    stack: &mut Stack,
    view: &ClusterView,
) -> Result<usize> {
    let first = stack.start_sluice(SLUICE).await?;
    ingest(stack, 0..10).await?;
    stack.wait_for_count("events", 10, DEADLINE).await?;
    stack.sluice[first].stop(Duration::from_secs(10)).await?;
    let leader = stack.nats.index_of(&view.stream("INGEST").await?.leader)?;
    let seeds: Vec<String> = (0..3)
        .filter(|&i| i != leader)
        .map(|i| stack.nats.node(i).map(|n| n.url()))
        .collect::<Result<_>>()?;
    // One seed: the node Sluice stays on while the others go.
    stack.set("nats.url", seeds[0].clone());
    stack.fresh_ports()?;
    stack.start_sluice(SLUICE).await?;
    Ok(leader)
}

/// The consumer's leader moves (it steps down: no node goes, no client reconnects)
/// while Sluice's pull request waits on it. The request is lost with the old leader
/// (2.10 and later say so with a 409 "Leadership Change", 2.9 goes silent): Sluice
/// replaces it without a restart or a reconnect, counts one stall, and rows published
/// after the move land.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pull_lost_to_a_leader_change_is_replaced_without_a_restart_and_counted() -> Result<()> {
    let Some(mut stack) =
        cluster_stack("a_pull_lost_to_a_leader_change_is_replaced_without_a_restart_and_counted")
            .await?
    else {
        return Ok(());
    };
    let view = ClusterView::connect(&stack.nats).await?;
    stack.start_sluice(SLUICE).await?;
    ingest(&stack, 0..10).await?;
    stack.wait_for_count("events", 10, DEADLINE).await?;
    assert_eq!(stalls_counted(&stack).await?, 0.0);

    let old = view.consumer("INGEST", "sluice").await?.leader;
    view.step_down_consumer("INGEST", "sluice").await?;
    let new = view
        .new_consumer_leader("INGEST", "sluice", &old, DEADLINE)
        .await?;
    ingest(&stack, 10..110).await?;
    stack
        .wait_for_count("events", 110, DEADLINE)
        .await
        .with_context(|| stack.sluice[0].log_tail(40))?;

    let (stack_ref, new_ref) = (&stack, &new);
    // The leaders come with the lag poll (every 5 s).
    let consumer = wait_for(
        "the stall and the new leader in /admin/actors",
        DEADLINE,
        POLL,
        || async move {
            let (status, tree) = stack_ref.admin_get("/admin/actors").await?;
            ensure!(status == 200, "{status} {tree}");
            let consumer = consumer_state(&tree).context("no consumer node")?;
            ensure!(consumer["stalls"].as_u64() >= Some(1), "{consumer}");
            ensure!(
                consumer["nats"]["consumer"]["leader"] == **new_ref,
                "{consumer}"
            );
            Ok(consumer)
        },
    )
    .await?;
    assert_eq!(
        consumer["reconnects"], 0,
        "replaced, not reconnected: {consumer}"
    );
    assert_eq!(consumer["connected"], true, "{consumer}");
    assert!(
        ["leadership_change", "heartbeats_missed"]
            .contains(&consumer["last_stall"].as_str().unwrap_or_default()),
        "{consumer}"
    );
    assert_eq!(
        consumer["nats"]["consumer"]["replicas"]
            .as_array()
            .map(Vec::len),
        Some(2),
        "the other two peers: {consumer}"
    );
    assert!(stalls_counted(&stack).await? >= 1.0);
    assert_eq!(stack.sluice[0].starts(), 1, "no restart");
    assert!(stack.sluice[0].is_running());
    Ok(())
}

/// `sluice_consumer_stalls_total`, every reason.
async fn stalls_counted(stack: &Stack) -> Result<f64> {
    let text = stack.metrics().await?;
    Ok(sluice_harness::chaos::metric_value(
        &text,
        "sluice_consumer_stalls_total",
        &[("stream", "INGEST")],
    ))
}
