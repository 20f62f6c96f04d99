//! A three-node JetStream cluster as the harness runs it: every node healthy once the
//! meta group has a leader, an R3 stream on all three, a leader killed with -9 or
//! frozen and another elected, the node back on its ports with its store, and the
//! leaders found through the JetStream API and `/jsz`.
//!
//! These run under the flavour `SLUICE_TEST_NATS` names (the test command runs this
//! binary once per flavour); `each_flavour_forms_a_cluster` starts both.

use std::time::Duration;

use anyhow::{ensure, Context, Result};
use async_nats::jetstream::{self, consumer, stream};
use sluice_harness::nats_cluster::ClusterView;
use sluice_harness::{available, wait_for, NatsCluster, NatsFlavor};

/// An election takes the followers' election timeout (a few seconds) after they stop
/// hearing from the leader; a loaded machine adds to it.
const ELECTION: Duration = Duration::from_secs(30);
const POLL: Duration = Duration::from_millis(200);

async fn cluster_or_skip(test: &str) -> Result<Option<NatsCluster>> {
    let flavor = NatsFlavor::from_env()?;
    if available(test, flavor.binary())?.is_none() {
        return Ok(None);
    }
    Ok(Some(
        NatsCluster::start(flavor, 3, Vec::<String>::new()).await?,
    ))
}

/// An R3 stream `name` with `count` acknowledged messages.
async fn r3_stream(js: &jetstream::Context, name: &str, count: u64) -> Result<()> {
    js.create_stream(stream::Config {
        name: name.to_owned(),
        subjects: vec![format!("{name}.>")],
        storage: stream::StorageType::File,
        num_replicas: 3,
        ..Default::default()
    })
    .await
    .context("creating an R3 stream")?;
    // The create answers once the stream is assigned; its own group may still be
    // electing, and a publish meanwhile finds no responder ("no stream found").
    wait_for(
        &format!("stream {name} has a leader"),
        ELECTION,
        POLL,
        || async {
            let mut stream = js
                .get_stream(name)
                .await
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            let info = stream.info().await.map_err(|e| anyhow::anyhow!("{e}"))?;
            ensure!(
                info.cluster.as_ref().is_some_and(|c| c.leader.is_some()),
                "no leader yet: {:?}",
                info.cluster
            );
            Ok(())
        },
    )
    .await?;
    for i in 0..count {
        js.publish(format!("{name}.rows"), format!("row {i}").into())
            .await
            .context("publishing")?
            .await
            .context("waiting for the publish ack")?;
    }
    Ok(())
}

async fn messages_in(js: &jetstream::Context, name: &str) -> Result<u64> {
    let mut stream = js
        .get_stream(name)
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(stream
        .info()
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?
        .state
        .messages)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_elect_a_meta_leader_and_keep_an_r3_stream_on_each() -> Result<()> {
    let Some(cluster) =
        cluster_or_skip("three_nodes_elect_a_meta_leader_and_keep_an_r3_stream_on_each").await?
    else {
        return Ok(());
    };
    assert_eq!(cluster.len(), 3);
    let urls = cluster.urls();
    assert_eq!(cluster.url(), urls.join(","), "the seed list");
    for i in 0..3 {
        let jsz = cluster.node(i)?.jsz().await?;
        assert_eq!(jsz["meta_cluster"]["name"], "sluice-test", "{jsz}");
        assert_eq!(
            jsz["meta_cluster"]["cluster_size"].as_u64(),
            Some(3),
            "{jsz}"
        );
    }
    let meta = cluster.meta_leader().await?;
    assert!(meta < 3);

    let view = ClusterView::connect(&cluster).await?;
    r3_stream(view.context(), "TRIPLE", 10).await?;
    let group = view.stream("TRIPLE").await?;
    assert_eq!(group.configured, 3);
    let mut peers = group.peers.clone();
    peers.sort();
    assert_eq!(peers, ["n1", "n2", "n3"], "{group:?}");
    cluster.index_of(&group.leader)?;
    // Each node stores its copy: every one reports the messages in its /jsz.
    for i in 0..3 {
        let cluster = &cluster;
        wait_for(
            &format!("n{} to hold the 10 messages", i + 1),
            ELECTION,
            POLL,
            || async move {
                let state = cluster.node(i)?.stream_state("TRIPLE").await?;
                ensure!(state["messages"] == 10, "{state}");
                Ok(())
            },
        )
        .await?;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stream_leader_killed_another_is_elected_and_it_comes_back_on_its_store() -> Result<()>
{
    let Some(mut cluster) = cluster_or_skip(
        "the_stream_leader_killed_another_is_elected_and_it_comes_back_on_its_store",
    )
    .await?
    else {
        return Ok(());
    };
    let view = ClusterView::connect(&cluster).await?;
    r3_stream(view.context(), "KEEP", 20).await?;
    let old = view.stream("KEEP").await?.leader;
    let killed = cluster.index_of(&old)?;
    let url = cluster.node(killed)?.url();

    let status = cluster.node_mut(killed)?.kill9().await?;
    assert!(!status.success());
    let new = view.new_stream_leader("KEEP", &old, ELECTION).await?;
    assert_ne!(new, old);
    assert_eq!(messages_in(view.context(), "KEEP").await?, 20);
    // Two of three still take writes.
    view.context()
        .publish("KEEP.rows", "while one is down".into())
        .await?
        .await
        .context("a publish with a node down")?;

    cluster.node_mut(killed)?.start_again().await?;
    assert_eq!(cluster.node(killed)?.url(), url, "the same port");
    // Back on its store, it catches up and is a current replica again.
    wait_for(&format!("{old} current again"), ELECTION, POLL, || async {
        let state = cluster.node(killed)?.stream_state("KEEP").await?;
        ensure!(state["messages"] == 21, "{state}");
        Ok(())
    })
    .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_consumer_leader_frozen_past_the_election_timeout_is_replaced() -> Result<()> {
    let Some(mut cluster) =
        cluster_or_skip("the_consumer_leader_frozen_past_the_election_timeout_is_replaced").await?
    else {
        return Ok(());
    };
    let view = ClusterView::connect(&cluster).await?;
    r3_stream(view.context(), "WORK", 5).await?;
    let stream = view
        .context()
        .get_stream("WORK")
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    stream
        .create_consumer(consumer::pull::Config {
            durable_name: Some("durable".into()),
            ack_policy: consumer::AckPolicy::Explicit,
            ..Default::default()
        })
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let group = view.consumer("WORK", "durable").await?;
    assert_eq!(
        group.peers.len(),
        3,
        "an R3 stream's durable is R3: {group:?}"
    );
    let frozen = cluster.index_of(&group.leader)?;

    cluster.node_mut(frozen)?.sigstop().await?;
    let new = view
        .new_consumer_leader("WORK", "durable", &group.leader, ELECTION)
        .await?;
    assert_ne!(cluster.index_of(&new)?, frozen);
    cluster.node_mut(frozen)?.sigcont().await?;
    // Thawed, it rejoins as a follower: the leader stays where the election put it
    // or moves on, and the node answers again.
    wait_for("the thawed node healthy", ELECTION, POLL, || async {
        cluster.node(frozen)?.jsz().await.map(|_| ())
    })
    .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_meta_leader_restarted_another_leads_and_the_node_rejoins() -> Result<()> {
    let Some(mut cluster) =
        cluster_or_skip("the_meta_leader_restarted_another_leads_and_the_node_rejoins").await?
    else {
        return Ok(());
    };
    let old = cluster.meta_leader().await?;
    cluster.node_mut(old)?.stop().await?;
    let cluster_ref = &cluster;
    let new = wait_for("another meta leader", ELECTION, POLL, || async move {
        let leader = cluster_ref.meta_leader().await?;
        ensure!(leader != old, "still n{}", old + 1);
        Ok(leader)
    })
    .await?;
    assert_ne!(new, old);
    cluster.node_mut(old)?.start_again().await?;
    let jsz = cluster.node(old)?.jsz().await?;
    assert!(
        jsz["meta_cluster"]["leader"].as_str().is_some(),
        "the restarted node knows the leader: {jsz}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_flavour_forms_a_cluster() -> Result<()> {
    for flavor in [NatsFlavor::Debian, NatsFlavor::Current] {
        let test = format!("each_flavour_forms_a_cluster ({flavor})");
        if available(&test, flavor.binary())?.is_none() {
            continue;
        }
        let cluster = NatsCluster::start(flavor.clone(), 3, Vec::<String>::new()).await?;
        let leader = cluster.meta_leader().await?;
        eprintln!(
            "{flavor}: nats-server {}, meta leader n{}",
            cluster.version(),
            leader + 1
        );
    }
    Ok(())
}
