//! The pull source against a real nats-server (`SLUICE_TEST_NATS=debian|current`): it
//! speaks the pull protocol itself (see `src/nats/pulling/source.rs`), so the cases async-nats
//! used to handle for it are checked here: an expired request is renewed, a silent
//! one is replaced and counted as a stall (and, when new requests change nothing, the
//! source fails so that the consumer actor reconnects it), and a restarted nats-server
//! costs no row.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use async_nats::jetstream;
use sluice::config::{StreamCompression, StreamSettings};
use sluice::nats::{
    ensure_consumer, ensure_streams, DlqWriter, JetStreamSource, JetStreamSourceFactory,
    JsDelivery, Publisher,
};
use sluice_actors::{Delivery, Source, SourceFactory};
use sluice_harness::{available, NatsFlavor, NatsServer};
use tokio::time::Instant;

const SUBJECT: &str = "ingest.acme.events";

fn settings(ack_wait: Duration) -> StreamSettings {
    StreamSettings {
        stream: "INGEST".into(),
        subject_prefix: "ingest".into(),
        consumer: "sluice".into(),
        dlq_stream: "DLQ".into(),
        dlq_subject_prefix: "dlq".into(),
        max_bytes: 64 << 20,
        dlq_max_bytes: 64 << 20,
        duplicate_window: Duration::from_secs(120),
        ack_wait,
        max_ack_pending: 1000,
        replicas: 1,
        stream_compression: StreamCompression::None,
        partitions: 1,
    }
}

struct Setup {
    server: NatsServer,
    js: jetstream::Context,
    ingest: Publisher,
    factory: JetStreamSourceFactory,
}

impl Setup {
    /// A server with the streams, and a source factory with short pull timing.
    async fn start(
        test: &str,
        expires: Duration,
        heartbeat: Duration,
        ack_wait: Duration,
    ) -> Result<Option<Self>> {
        let flavor = NatsFlavor::from_env()?;
        if available(test, flavor.binary())?.is_none() {
            return Ok(None);
        }
        let server = NatsServer::start(flavor).await?;
        let client = async_nats::ConnectOptions::new()
            .connection_timeout(Duration::from_secs(5))
            .retry_on_initial_connect()
            .connect(server.url())
            .await
            .with_context(|| format!("connecting to {}", server.url()))?;
        let js = jetstream::new(client);
        let settings = settings(ack_wait);
        ensure_streams(&js, &settings).await?;
        ensure_consumer(&js, &settings).await?;
        let ingest = Publisher::new(js.clone(), &settings.stream, settings.max_bytes);
        let dlq = Arc::new(DlqWriter::new(
            Publisher::new(js.clone(), &settings.dlq_stream, settings.dlq_max_bytes),
            settings.dlq_subject_prefix.clone(),
        ));
        let factory = JetStreamSourceFactory::new(js.clone(), settings, dlq, 10)
            .with_pull_timing(expires, heartbeat);
        Ok(Some(Self {
            server,
            js,
            ingest,
            factory,
        }))
    }

    async fn publish(&self, ids: std::ops::Range<u64>) -> Result<()> {
        for id in ids {
            self.ingest
                .publish(
                    SUBJECT.to_string(),
                    format!("{{\"id\":{id}}}").into(),
                    None,
                    None,
                )
                .await
                .with_context(|| format!("publishing row {id}"))?;
        }
        Ok(())
    }

    async fn source(&self) -> Result<JetStreamSource> {
        self.factory
            .connect(0)
            .await
            .map_err(|e| anyhow!("opening the consumer: {e}"))
    }
}

fn id_of(d: &JsDelivery) -> Result<u64> {
    let v: serde_json::Value = serde_json::from_slice(d.payload())?;
    v["id"].as_u64().context("a row without an id")
}

/// Pull and ack until `want` distinct ids are acked, reconnecting the source on an
/// error the way the consumer actor does.
async fn drain(
    setup: &Setup,
    source: &mut JetStreamSource,
    acked: &mut BTreeSet<u64>,
    want: usize,
    deadline: Duration,
) -> Result<()> {
    let end = Instant::now() + deadline;
    while acked.len() < want {
        if Instant::now() >= end {
            bail!("{} of {want} rows acked within {deadline:?}", acked.len());
        }
        match source.pull(100).await {
            Ok(batch) => {
                for d in batch {
                    let id = id_of(&d)?;
                    d.ack().await.map_err(|e| anyhow!("ack: {e}"))?;
                    acked.insert(id);
                }
            }
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(200)).await;
                if let Ok(fresh) = setup.factory.connect(0).await {
                    *source = fresh;
                }
            }
        }
    }
    Ok(())
}

#[tokio::test]
async fn an_expired_pull_request_is_asked_again() -> Result<()> {
    let Some(setup) = Setup::start(
        "an_expired_pull_request_is_asked_again",
        Duration::from_secs(1),
        Duration::from_millis(300),
        Duration::from_secs(30),
    )
    .await?
    else {
        return Ok(());
    };
    let mut source = setup.source().await?;
    // Three expiries with nothing to deliver, never an error.
    let idle_until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < idle_until {
        let batch = source
            .pull(10)
            .await
            .map_err(|e| anyhow!("an idle pull failed: {e}"))?;
        assert!(batch.is_empty());
    }
    setup.publish(0..25).await?;
    let mut acked = BTreeSet::new();
    let started = Instant::now();
    drain(&setup, &mut source, &mut acked, 25, Duration::from_secs(10)).await?;
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "rows published after idle expiries took {:?}",
        started.elapsed()
    );
    Ok(())
}

#[tokio::test]
async fn a_silent_pull_request_is_replaced_and_counted_then_fails_the_source() -> Result<()> {
    let Some(mut setup) = Setup::start(
        "a_silent_pull_request_is_replaced_and_counted_then_fails_the_source",
        Duration::from_secs(5),
        Duration::from_millis(300),
        Duration::from_secs(30),
    )
    .await?
    else {
        return Ok(());
    };
    let mut source = setup.source().await?;
    source
        .pull(10)
        .await
        .map_err(|e| anyhow!("the first pull failed: {e}"))?;
    assert_eq!(source.status().stalls, 0);
    // A frozen server sends no heartbeat: within two heartbeats and a second the source
    // notices, asks again and counts one stall (however many requests it sends);
    // when new requests change nothing either, it fails (the consumer actor then
    // reconnects it).
    setup.server.sigstop().await?;
    let frozen = Instant::now();
    let failed = loop {
        match source.pull(10).await {
            Err(e) => break e,
            Ok(_) if frozen.elapsed() > Duration::from_secs(15) => {
                setup.server.sigcont().await?;
                bail!("a silent pull request went unnoticed for 15 s");
            }
            Ok(_) => {}
        }
    };
    let noticed = frozen.elapsed();
    setup.server.sigcont().await?;
    let status = source.status();
    assert_eq!(status.stalls, 1, "one stall, counted once: {status:?}");
    assert_eq!(
        status.last_stall,
        Some(sluice_actors::StallReason::HeartbeatsMissed)
    );
    assert!(failed.to_string().contains("heartbeats_missed"), "{failed}");
    assert!(
        noticed >= Duration::from_secs(4),
        "failed after {noticed:?}: new requests come first"
    );
    // And the source works again once reconnected; the count outlives the source.
    setup.publish(0..5).await?;
    let mut acked = BTreeSet::new();
    drain(&setup, &mut source, &mut acked, 5, Duration::from_secs(15)).await?;
    assert_eq!(source.status().stalls, 1);
    Ok(())
}

#[tokio::test]
async fn a_restarted_nats_server_costs_no_row() -> Result<()> {
    let Some(mut setup) = Setup::start(
        "a_restarted_nats_server_costs_no_row",
        Duration::from_secs(30),
        Duration::from_secs(1),
        // Acks in flight when the server stops may be lost: such rows come back after
        // ack_wait (at least once), so keep it short.
        Duration::from_secs(2),
    )
    .await?
    else {
        return Ok(());
    };
    setup.publish(0..40).await?;
    let mut source = setup.source().await?;
    let mut acked = BTreeSet::new();
    drain(&setup, &mut source, &mut acked, 20, Duration::from_secs(10)).await?;
    setup.server.restart().await?;
    // The client reconnects by itself; each row is retried until it is stored once.
    let end = Instant::now() + Duration::from_secs(20);
    for id in 40..80 {
        loop {
            match setup.publish(id..id + 1).await {
                Ok(()) => break,
                Err(_) if Instant::now() < end => {
                    tokio::time::sleep(Duration::from_millis(200)).await
                }
                Err(e) => return Err(e),
            }
        }
    }
    drain(&setup, &mut source, &mut acked, 80, Duration::from_secs(30)).await?;
    assert_eq!(acked, (0..80).collect::<BTreeSet<u64>>());
    // And the queue ends empty: a row whose ack was lost in the restart (or published
    // twice by a retry) comes back and is acked again.
    let mut stream = setup.js.get_stream("INGEST").await?;
    let end = Instant::now() + Duration::from_secs(20);
    while stream.info().await?.state.messages > 0 {
        if Instant::now() >= end {
            bail!(
                "{} rows left in the queue after every id was acked",
                stream.info().await?.state.messages
            );
        }
        let mut again = BTreeSet::new();
        let _ = drain(
            &setup,
            &mut source,
            &mut again,
            1,
            Duration::from_millis(500),
        )
        .await;
        for id in again {
            assert!(acked.contains(&id), "row {id} was never published");
        }
    }
    Ok(())
}

/// The rows of `batch`, however many each message carries.
fn rows_in(batch: &[JsDelivery]) -> usize {
    batch
        .iter()
        .map(|d| sluice_actors::rows::row_count(d.payload()))
        .sum()
}

/// Issue 15: `max_ack_pending` counts messages, and a message carries one row or many.
/// The source asks for messages by the rows they bring: with 100-row messages and
/// `max_held_rows` 1,000 it holds ten messages (the first, asked for alone, to learn
/// their size) and asks for no more until some are settled; then the next come, and
/// every row is taken in the end.
#[tokio::test]
async fn many_rows_per_message_are_held_by_the_row() -> Result<()> {
    let Some(mut setup) = Setup::start(
        "many_rows_per_message_are_held_by_the_row",
        Duration::from_secs(30),
        Duration::from_secs(5),
        Duration::from_secs(30),
    )
    .await?
    else {
        return Ok(());
    };
    for m in 0..50u64 {
        let body: String = (0..100)
            .map(|i| format!("{{\"id\":{}}}\n", m * 100 + i))
            .collect();
        setup
            .ingest
            .publish(SUBJECT.to_string(), body.into(), None, None)
            .await
            .with_context(|| format!("publishing message {m}"))?;
    }
    setup.factory = setup.factory.with_max_held_rows(1000);
    let mut source = setup.source().await?;

    // Pulled and kept (not settled): the bound holds, however often we pull.
    let mut held = Vec::new();
    for _ in 0..40 {
        if rows_in(&held) >= 1000 {
            break;
        }
        held.extend(source.pull(1000).await.map_err(|e| anyhow!("pull: {e}"))?);
    }
    // And nothing more comes while they are held.
    for _ in 0..3 {
        held.extend(source.pull(1000).await.map_err(|e| anyhow!("pull: {e}"))?);
    }
    let rows = rows_in(&held);
    assert_eq!(
        rows,
        1000,
        "held {rows} rows in {} messages, bound 1000",
        held.len()
    );

    // Settled, the rest come, never more than the bound at a time.
    let mut taken = rows;
    let end = Instant::now() + Duration::from_secs(30);
    while taken < 5000 {
        if Instant::now() >= end {
            bail!("{taken} of 5000 rows taken within 30 s");
        }
        for d in held.drain(..) {
            d.ack().await.map_err(|e| anyhow!("ack: {e}"))?;
        }
        held = source.pull(1000).await.map_err(|e| anyhow!("pull: {e}"))?;
        let rows = rows_in(&held);
        assert!(rows <= 1000, "{rows} rows in one pull, bound 1000");
        taken += rows;
    }
    assert_eq!(taken, 5000);
    Ok(())
}
