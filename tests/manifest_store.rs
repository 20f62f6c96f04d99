//! The manifest store against a real nats-server: Debian's 2.9.10 or the current one
//! (`SLUICE_TEST_NATS=debian|current`; `scripts/test` runs this binary under both).
//!
//! Checked from the outside: what the bucket holds (read back with the key-value API,
//! apart from the store), what a second instance (its own connection) finds, and what
//! the store reads from the ingest stream.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{anyhow, bail, ensure, Context, Result};
use async_nats::jetstream::{self, consumer, kv, stream};
use bytes::Bytes;
use futures::{StreamExt as _, TryStreamExt as _};
use sluice::config::{StreamCompression, StreamSettings};
use sluice::nats::{
    bucket_stream_name, decode_manifest, ensure_consumer, ensure_streams, DlqWriter,
    JetStreamSource, JetStreamSourceFactory, JsDelivery, JsManifestStore, ManifestSettings,
    Publisher, MANIFEST_MAX_AGE,
};
use sluice_actors::{
    ClaimError, Class, ClickHouseError, Dedup, Delivery, FetchError, InsertRequest, Inserter,
    Manifest, ManifestState, ManifestStore, PipelineConfig, PipelineHandle, PipelineSettings,
    RejectedRow, ServerInfo, Source, SourceFactory, TableKey, TableSettings, TableSettingsResolver,
    Target,
};
use sluice_harness::{available, wait_for, wait_until, NatsFlavor, NatsServer};
use tokio::time::Instant;

const DEADLINE: Duration = Duration::from_secs(15);
const POLL: Duration = Duration::from_millis(20);
const SUBJECT: &str = "ingest.acme.events";
const BUCKET: &str = "SLUICE_MANIFESTS";
/// What `ready` may take here (the source waits as long).
const READY: Duration = Duration::from_secs(15);

fn stream_settings() -> StreamSettings {
    StreamSettings {
        stream: "INGEST".into(),
        subject_prefix: "ingest".into(),
        consumer: "sluice".into(),
        dlq_stream: "DLQ".into(),
        dlq_subject_prefix: "dlq".into(),
        max_bytes: 64 << 20,
        dlq_max_bytes: 64 << 20,
        duplicate_window: Duration::from_secs(120),
        ack_wait: Duration::from_secs(30),
        max_ack_pending: 1000,
        replicas: 1,
        stream_compression: StreamCompression::None,
        partitions: 1,
    }
}

fn manifest_settings() -> ManifestSettings {
    ManifestSettings {
        bucket: BUCKET.into(),
        max_bytes: 16 << 20,
        replicas: 1,
        stream: "INGEST".into(),
        consumer: "sluice".into(),
        partitions: Vec::new(),
        // The tests collect when they mean to.
        collect_every: Duration::from_secs(3600),
        marker_age: Duration::from_secs(60),
        max_age: MANIFEST_MAX_AGE,
        // Collected as soon as done with: how long a settled record is kept first is
        // a test of its own (`a_settled_record_stays_for_ack_wait_before_it_is_collected`).
        keep_settled: Duration::ZERO,
    }
}

fn table() -> TableKey {
    TableKey::new("acme", "events")
}

/// A batch of these messages of the ingest stream as `store` reads it now.
fn batch_of(store: &JsManifestStore, messages: Vec<u64>) -> Manifest {
    let incarnation = store
        .incarnation()
        .expect("the store has read the ingest stream");
    Manifest::new(table(), incarnation, messages)
}

/// Record a manifest as the ledger does: a new batch claims its messages, a later
/// state of it is written over the state the store holds now (or, where it holds none,
/// as a record another instance made: written only where there is nothing, revision 0).
async fn record(store: &JsManifestStore, m: &Manifest) -> Result<()> {
    if m.state == ManifestState::Open {
        return store
            .claim(m)
            .await
            .map(|_revision| ())
            .map_err(|e| anyhow!("claiming {}: {e}", m.id));
    }
    let over = store
        .current(&m.id)
        .await
        .map_err(|e| anyhow!("reading {}: {e}", m.id))?
        .map_or(0, |r| r.revision);
    store
        .update(m, over)
        .await
        .map(|_revision| ())
        .map_err(|e| anyhow!("recording {}: {e}", m.id))
}

/// The manifest a value of `key` holds.
fn decode_value(key: &str, value: &[u8]) -> Result<Manifest> {
    let incarnation = key
        .split('.')
        .nth(1)
        .and_then(|i| i.parse().ok())
        .context("the incarnation in the key")?;
    decode_manifest(value, incarnation)
        .map_err(|e| anyhow!("the value of {key} is not a manifest: {e}"))
}

fn settled(mut m: Manifest, rejected: Vec<RejectedRow>) -> Manifest {
    m.state = ManifestState::Settled { rejected };
    m
}

/// A server with the streams and the consumer, and one Sluice instance's connection.
struct Setup {
    server: NatsServer,
    js: jetstream::Context,
    ingest: Publisher,
}

/// One Sluice instance: its own connection, store and source factory.
struct Instance {
    js: jetstream::Context,
    store: Arc<JsManifestStore>,
    factory: JetStreamSourceFactory,
}

impl Setup {
    async fn start(test: &str) -> Result<Option<Setup>> {
        let flavor = NatsFlavor::from_env()?;
        if available(test, flavor.binary())?.is_none() {
            return Ok(None);
        }
        let server = NatsServer::start(flavor).await?;
        let js = connect(&server).await?;
        ensure_streams(&js, &stream_settings()).await?;
        ensure_consumer(&js, &stream_settings()).await?;
        let ingest = Publisher::new(js.clone(), "INGEST", 64 << 20);
        Ok(Some(Setup { server, js, ingest }))
    }

    /// A new instance, its store started (not waited for).
    async fn instance(&self) -> Result<Instance> {
        let js = connect(&self.server).await?;
        let store = Arc::new(JsManifestStore::start(js.clone(), manifest_settings()));
        let dlq = Arc::new(DlqWriter::new(
            Publisher::new(js.clone(), "DLQ", 64 << 20),
            "dlq",
        ));
        let factory = JetStreamSourceFactory::new(js.clone(), stream_settings(), dlq, 100)
            .with_manifests(Some(store.clone()));
        Ok(Instance { js, store, factory })
    }

    /// Two instances, their indexes caught up.
    async fn two_instances(&self) -> Result<(Instance, Instance)> {
        let (a, b) = (self.instance().await?, self.instance().await?);
        a.ready().await?;
        b.ready().await?;
        Ok((a, b))
    }

    async fn publish(&self, payload: &str) -> Result<u64> {
        let published = self
            .ingest
            .publish(SUBJECT.into(), Bytes::from(payload.to_string()), None, None)
            .await
            .context("publishing a row")?;
        Ok(published.sequence)
    }

    async fn publish_rows(&self, n: usize) -> Result<Vec<u64>> {
        let mut out = Vec::with_capacity(n);
        for i in 0..n {
            out.push(self.publish(&format!("{{\"id\":{i}}}")).await?);
        }
        Ok(out)
    }

    /// The manifests the bucket holds, by key, read with the key-value API.
    async fn bucket(&self) -> Result<BTreeMap<String, Manifest>> {
        live_manifests(&self.js).await
    }
}

impl Instance {
    async fn ready(&self) -> Result<()> {
        self.store
            .ready(READY)
            .await
            .map_err(|e| anyhow!("the store is not ready: {e}"))
    }

    async fn source(&self) -> Result<JetStreamSource> {
        self.factory
            .connect(0)
            .await
            .map_err(|e| anyhow!("opening the consumer: {e}"))
    }

    async fn record(&self, m: &Manifest) -> Result<()> {
        record(&self.store, m).await
    }

    fn batch(&self, messages: Vec<u64>) -> Manifest {
        batch_of(&self.store, messages)
    }

    /// Until this instance's store answers `holding(seq)` as `expect` (an id, or none).
    async fn wait_holding(&self, seq: u64, expect: Option<&Manifest>) -> Result<()> {
        let what = match expect {
            Some(m) => format!("sequence {seq} held by {} ({:?})", m.id, m.state),
            None => format!("sequence {seq} held by no manifest"),
        };
        wait_until(&what, DEADLINE, POLL, || async {
            self.store.holding(seq).as_deref() == expect
        })
        .await
    }

    fn connects(&self) -> u64 {
        self.js
            .client()
            .statistics()
            .connects
            .load(Ordering::Relaxed)
    }
}

async fn connect(server: &NatsServer) -> Result<jetstream::Context> {
    let client = async_nats::ConnectOptions::new()
        .connection_timeout(Duration::from_secs(5))
        .reconnect_delay_callback(|_| Duration::from_millis(100))
        .connect(server.url())
        .await
        .with_context(|| format!("connecting to {}", server.url()))?;
    Ok(jetstream::new(client))
}

async fn live_manifests(js: &jetstream::Context) -> Result<BTreeMap<String, Manifest>> {
    let kv = js
        .get_key_value(BUCKET)
        .await
        .context("opening the bucket")?;
    let stream = js.get_stream(bucket_stream_name(BUCKET)).await?;
    let subjects: Vec<(String, usize)> = stream
        .info_with_subjects(format!("$KV.{BUCKET}.>"))
        .await?
        .try_collect()
        .await?;
    let mut out = BTreeMap::new();
    for (subject, _) in subjects {
        let key = subject
            .strip_prefix(&format!("$KV.{BUCKET}."))
            .context("a subject of the bucket")?
            .to_string();
        let Some(entry) = kv.entry(key.clone()).await? else {
            continue;
        };
        if entry.operation != kv::Operation::Put {
            continue;
        }
        let manifest = decode_value(&key, &entry.value)?;
        ensure!(
            key.ends_with(&format!(".{}", manifest.id)),
            "key {key} holds manifest {}",
            manifest.id
        );
        out.insert(key, manifest);
    }
    Ok(out)
}

async fn pull(source: &mut JetStreamSource, n: usize) -> Result<Vec<JsDelivery>> {
    let end = Instant::now() + DEADLINE;
    let mut got = Vec::new();
    while got.len() < n {
        if Instant::now() >= end {
            bail!("pulled {} of {n} rows within {DEADLINE:?}", got.len());
        }
        let batch = source
            .pull(n - got.len())
            .await
            .map_err(|e| anyhow!("pulling: {e}"))?;
        got.extend(batch);
    }
    Ok(got)
}

async fn ack_floor(js: &jetstream::Context) -> Result<u64> {
    let mut consumer: consumer::PullConsumer = js
        .get_stream("INGEST")
        .await?
        .get_consumer("sluice")
        .await
        .map_err(|e| anyhow!("the consumer: {e}"))?;
    Ok(consumer.info().await?.ack_floor.stream_sequence)
}

#[tokio::test]
async fn the_bucket_is_created_by_sluice_and_again_harmlessly() -> Result<()> {
    let Some(setup) = Setup::start("the_bucket_is_created_by_sluice_and_again_harmlessly").await?
    else {
        return Ok(());
    };
    let first = setup.instance().await?;
    first.ready().await?;
    let mut bucket = setup.js.get_stream(bucket_stream_name(BUCKET)).await?;
    let created = bucket.info().await?.created;

    // A second instance runs the same setup on the existing bucket: nothing changes.
    let second = setup.instance().await?;
    second.ready().await?;
    let info = bucket.info().await?.clone();
    assert_eq!(info.created, created, "not created anew");
    let c = &info.config;
    assert_eq!(c.subjects, vec![format!("$KV.{BUCKET}.>")]);
    assert_eq!(c.max_messages_per_subject, 1, "one value per key");
    assert!(c.allow_rollup && c.deny_delete && !c.deny_purge);
    assert!(c.allow_direct);
    assert_eq!(c.discard, stream::DiscardPolicy::New);
    assert_eq!(c.storage, stream::StorageType::File);
    assert_eq!(c.max_age, MANIFEST_MAX_AGE);
    assert!(
        c.max_bytes >= 16 << 20,
        "the budget, with headroom on servers that need it: {}",
        c.max_bytes
    );

    // It is a key-value bucket as any client sees one, and the store's writes are in it.
    let m = first.batch(setup.publish_rows(3).await?);
    first.record(&m).await?;
    let kv = setup.js.get_key_value(BUCKET).await?;
    let keys: Vec<String> = kv.keys().await?.try_collect().await?;
    assert_eq!(keys.len(), 1, "{keys:?}");
    assert!(
        keys[0].starts_with("INGEST.") && keys[0].ends_with(&m.id),
        "{keys:?}"
    );
    let value = kv.get(&keys[0]).await?.context("the value")?;
    assert_eq!(decode_value(&keys[0], &value)?, m);
    Ok(())
}

#[tokio::test]
async fn what_one_instance_records_the_other_finds_and_what_it_forgets_the_other_drops(
) -> Result<()> {
    let Some(setup) = Setup::start(
        "what_one_instance_records_the_other_finds_and_what_it_forgets_the_other_drops",
    )
    .await?
    else {
        return Ok(());
    };
    let (a, b) = setup.two_instances().await?;
    let seqs = setup.publish_rows(4).await?;
    let open = a.batch(seqs[..3].to_vec());
    a.record(&open).await?;
    assert_eq!(
        a.store.holding(seqs[1]).as_deref(),
        Some(&open),
        "the recorder holds it at once"
    );
    for &seq in &seqs[..3] {
        b.wait_holding(seq, Some(&open)).await?;
    }
    assert_eq!(b.store.holding(seqs[3]), None, "not in the batch");

    // Its verdicts replace it.
    let done = settled(
        open.clone(),
        vec![RejectedRow {
            stream_sequence: seqs[2],
            line: 0,
            class: Class::Rejected,
            code: Some(27),
            error: "Cannot parse input".into(),
            parked: false,
        }],
    );
    a.record(&done).await?;
    b.wait_holding(seqs[0], Some(&done)).await?;
    assert_eq!(
        setup.bucket().await?.into_values().collect::<Vec<_>>(),
        vec![done.clone()]
    );

    a.store
        .forget(&done.id)
        .await
        .map_err(|e| anyhow!("forget: {e}"))?;
    assert!(setup.bucket().await?.is_empty(), "removed from the bucket");
    assert_eq!(a.store.holding(seqs[0]), None);
    for &seq in &seqs[..3] {
        b.wait_holding(seq, None).await?;
    }
    Ok(())
}

/// Two instances form batches sharing a message (a copy delivered again, a record that
/// landed late): the batch recorded first keeps it; the other's claim fails, names the
/// first, and its record is gone from the bucket, so its rows go back to join the first.
#[tokio::test]
async fn of_two_batches_claiming_a_message_the_one_recorded_first_wins() -> Result<()> {
    let Some(setup) =
        Setup::start("of_two_batches_claiming_a_message_the_one_recorded_first_wins").await?
    else {
        return Ok(());
    };
    let (a, b) = setup.two_instances().await?;
    let seqs = setup.publish_rows(3).await?;
    let first = a.batch(seqs[..2].to_vec());
    let second = b.batch(seqs[1..].to_vec());
    // Right after a's record: b's claim waits for its own index to pass its record,
    // so it sees a's, recorded before.
    a.record(&first).await?;
    let refused = b
        .store
        .claim(&second)
        .await
        .expect_err("the second claim on a message");
    assert_eq!(
        refused,
        ClaimError::Conflict {
            id: second.id.clone(),
            earlier: first.id.clone()
        }
    );
    assert_eq!(
        setup.bucket().await?.into_values().collect::<Vec<_>>(),
        vec![first.clone()],
        "the losing record is removed"
    );
    for instance in [&a, &b] {
        instance.wait_holding(seqs[1], Some(&first)).await?;
        instance.wait_holding(seqs[2], None).await?;
    }
    // The winner's record stands: claiming the same messages again (a copy of each held
    // elsewhere) loses to it rather than writing over it.
    assert_eq!(
        a.store.claim(&first).await,
        Err(ClaimError::Conflict {
            id: first.id.clone(),
            earlier: first.id.clone()
        })
    );
    Ok(())
}

/// A batch that lost its claim and was left in the bucket (its claimer gave up before
/// the store judged it, or could not remove it) stays behind the winner after the
/// winner is written again with a later state, also for an instance that reads the
/// bucket only then: the claim's revision travels with every state of a batch, and
/// `current` tells it. Ordered by the revision of each one's latest state, the loser
/// would pass for the first claim and be formed again beside the winner.
#[tokio::test]
async fn a_claim_keeps_its_place_when_its_batch_is_written_again() -> Result<()> {
    let Some(setup) =
        Setup::start("a_claim_keeps_its_place_when_its_batch_is_written_again").await?
    else {
        return Ok(());
    };
    let a = setup.instance().await?;
    a.ready().await?;
    let seqs = setup.publish_rows(3).await?;
    let winner = a.batch(seqs[..2].to_vec());
    let revision = a
        .store
        .claim(&winner)
        .await
        .map_err(|e| anyhow!("claiming {}: {e}", winner.id))?;
    // Written unjudged, as a record left behind is.
    let loser = a.batch(seqs[1..].to_vec());
    a.store
        .update(&loser, 0)
        .await
        .map_err(|e| anyhow!("recording {}: {e}", loser.id))?;
    let winner = settled(winner.claimed_as(revision), Vec::new());
    a.record(&winner).await?;

    let c = setup.instance().await?;
    c.ready().await?;
    let current = |id: String| {
        let store = c.store.clone();
        async move {
            store
                .current(&id)
                .await
                .map_err(|e| anyhow!("reading {id}: {e}"))?
                .map(|r| r.manifest)
                .with_context(|| format!("{id} is not in the bucket"))
        }
    };
    let winner_now = current(winner.id.clone()).await?;
    let loser_now = current(loser.id.clone()).await?;
    assert_eq!(
        winner_now.claim_revision, revision,
        "kept by its later state"
    );
    assert!(
        loser_now.claim_revision > revision,
        "a record never written again is at its claim: {}",
        loser_now.claim_revision
    );
    assert_eq!(
        c.store.earlier_claim(&loser_now).await.ok(),
        Some(Some(winner.id.clone()))
    );
    assert_eq!(c.store.earlier_claim(&winner_now).await.ok(), Some(None));
    c.wait_holding(seqs[1], Some(&winner)).await?;
    Ok(())
}

#[tokio::test]
async fn a_source_does_not_connect_before_its_index_holds_every_manifest() -> Result<()> {
    // Enough that reading them takes longer than setting up the consumer does.
    const N: usize = 1000;
    let Some(setup) =
        Setup::start("a_source_does_not_connect_before_its_index_holds_every_manifest").await?
    else {
        return Ok(());
    };
    let a = setup.instance().await?;
    a.ready().await?;
    let seqs = setup.publish_rows(N * 2).await?;
    let manifests: Vec<Manifest> = seqs.chunks(2).map(|pair| a.batch(pair.to_vec())).collect();
    assert_eq!(manifests.len(), N);
    for m in &manifests {
        a.record(m).await?;
    }

    // A new instance: once its source is connected, every one is found, no waiting.
    let b = setup.instance().await?;
    let _source = b.source().await?;
    for m in &manifests {
        for &seq in &m.messages {
            assert_eq!(
                b.store.holding(seq).as_deref(),
                Some(m),
                "sequence {seq} right after connect"
            );
        }
    }
    Ok(())
}

/// nats-server restarts under a connected source: the index is rebuilt by a new watch,
/// and the source pulls nothing before that watch has read every manifest again (a
/// redelivered message checked against an index still filling could be taken for a
/// fresh one and sent in a batch of its own).
#[tokio::test]
async fn after_a_reconnect_nothing_is_pulled_before_the_index_is_complete_again() -> Result<()> {
    // Enough that a new watch takes a while to read them all.
    const N: u64 = 20_000;
    let Some(mut setup) =
        Setup::start("after_a_reconnect_nothing_is_pulled_before_the_index_is_complete_again")
            .await?
    else {
        return Ok(());
    };
    let a = setup.instance().await?;
    a.ready().await?;
    let writes = (0..N).map(|i| {
        let m = settled(a.batch(vec![1_000_000 + i]), vec![]);
        let store = a.store.clone();
        async move { store.update(&m, 0).await }
    });
    let written: Vec<_> = futures::stream::iter(writes)
        .buffer_unordered(200)
        .try_collect()
        .await
        .map_err(|e| anyhow!("writing manifests: {e}"))?;
    assert_eq!(written.len() as u64, N);
    let mut source = a.source().await?;
    let connects = a.connects();
    setup.server.restart().await?;
    wait_until("reconnected", DEADLINE, POLL, || async {
        a.connects() > connects
    })
    .await?;
    setup.publish_rows(1).await?;
    let delivered = pull(&mut source, 1).await?;
    assert!(
        a.store.caught_up(),
        "a message was pulled before the index read the bucket again"
    );
    drop(delivered);
    Ok(())
}

#[tokio::test]
async fn fetch_reads_rows_by_sequence_in_the_order_asked_and_names_a_missing_one() -> Result<()> {
    let Some(setup) =
        Setup::start("fetch_reads_rows_by_sequence_in_the_order_asked_and_names_a_missing_one")
            .await?
    else {
        return Ok(());
    };
    let a = setup.instance().await?;
    a.ready().await?;
    let seqs = setup.publish_rows(40).await?;
    let asked = [seqs[7], seqs[0], seqs[39], seqs[8]];
    let rows = a
        .store
        .fetch(&asked)
        .await
        .map_err(|e| anyhow!("fetch: {e}"))?;
    let expected: Vec<Bytes> = [7, 0, 39, 8]
        .iter()
        .map(|i| Bytes::from(format!("{{\"id\":{i}}}")))
        .collect();
    assert_eq!(rows, expected);

    // A row acked (gone from the work queue) and one never written.
    let mut source = a.source().await?;
    let delivered = pull(&mut source, 40).await?;
    for d in delivered {
        if d.position().stream_sequence == seqs[3] {
            d.ack_confirmed().await.map_err(|e| anyhow!("ack: {e}"))?;
        }
    }
    for missing in [seqs[3], seqs[39] + 1000] {
        let e = a
            .store
            .fetch(&[seqs[1], missing])
            .await
            .expect_err("a row not in the stream");
        assert_eq!(
            e,
            FetchError::Gone {
                stream_sequence: missing
            },
            "names it"
        );
        assert!(
            e.to_string().contains("no longer in the ingest stream"),
            "{e}"
        );
    }
    Ok(())
}

#[tokio::test]
async fn a_forget_after_a_reconnect_waits_for_the_ack_floor_then_is_collected() -> Result<()> {
    let Some(setup) =
        Setup::start("a_forget_after_a_reconnect_waits_for_the_ack_floor_then_is_collected")
            .await?
    else {
        return Ok(());
    };
    let (a, b) = setup.two_instances().await?;
    let seqs = setup.publish_rows(3).await?;
    let mut source = a.source().await?;
    let mut delivered = pull(&mut source, 3).await?;
    delivered.sort_by_key(|d| d.position().stream_sequence);
    let done = settled(a.batch(seqs[..2].to_vec()), vec![]);
    let open = a.batch(vec![seqs[2]]);
    a.record(&done).await?;
    a.record(&open).await?;

    // The client reconnects: acks sent before may be lost, so `forget` removes nothing.
    let before = a.connects();
    a.js.client()
        .force_reconnect()
        .await
        .map_err(|e| anyhow!("reconnecting: {e}"))?;
    wait_until("the client reconnected", DEADLINE, POLL, || async {
        a.connects() > before
    })
    .await?;
    a.store
        .forget(&done.id)
        .await
        .map_err(|e| anyhow!("forget: {e}"))?;
    assert_eq!(setup.bucket().await?.len(), 2, "both kept");
    let collected = a.store.collect().await.map_err(|e| anyhow!("{e}"))?;
    assert_eq!(collected.removed(), 0, "nothing acked yet: {collected:?}");
    b.wait_holding(seqs[0], Some(&done)).await?;

    // Its rows are acked: the ack floor passes it, and the collector removes it. The
    // open manifest's row is still in the stream: it stays.
    let last = delivered.pop().context("three rows")?;
    for d in delivered {
        d.ack().await.map_err(|e| anyhow!("ack: {e}"))?;
    }
    wait_until("the ack floor passed the batch", DEADLINE, POLL, || async {
        ack_floor(&setup.js).await.ok() == Some(seqs[1])
    })
    .await?;
    let collected = a.store.collect().await.map_err(|e| anyhow!("{e}"))?;
    assert_eq!(collected.forgotten_after_reconnect, 1, "{collected:?}");
    assert_eq!(collected.removed(), 1, "{collected:?}");
    let left: Vec<Manifest> = setup.bucket().await?.into_values().collect();
    assert_eq!(left, vec![open.clone()]);
    b.wait_holding(seqs[0], None).await?;
    assert_eq!(b.store.holding(seqs[2]).as_deref(), Some(&open));

    // A second pass, from the other instance, removes nothing more. Once the open
    // manifest's row is acked too, nothing of it is left in the stream: collected.
    let collected = b.store.collect().await.map_err(|e| anyhow!("{e}"))?;
    assert_eq!(collected.removed(), 0, "{collected:?}");
    last.ack_confirmed()
        .await
        .map_err(|e| anyhow!("ack: {e}"))?;
    let collected = b.store.collect().await.map_err(|e| anyhow!("{e}"))?;
    assert_eq!(collected.gone_from_stream, 1, "{collected:?}");
    assert!(setup.bucket().await?.is_empty());
    a.wait_holding(seqs[2], None).await?;
    Ok(())
}

/// A settled record whose every message is acked stays until `keep_settled` (the
/// consumer's `ack_wait`) has passed since the store saw it settled: a copy of its
/// messages held elsewhere under an older lease must meet it, not a gap (see
/// `sluice_actors::keep_settled_for`). Then the collector removes it.
#[tokio::test]
async fn a_settled_record_stays_for_ack_wait_before_it_is_collected() -> Result<()> {
    const KEEP: Duration = Duration::from_secs(8);
    let Some(setup) =
        Setup::start("a_settled_record_stays_for_ack_wait_before_it_is_collected").await?
    else {
        return Ok(());
    };
    let store = JsManifestStore::start(
        connect(&setup.server).await?,
        ManifestSettings {
            keep_settled: KEEP,
            ..manifest_settings()
        },
    );
    store.ready(READY).await.map_err(|e| anyhow!("{e}"))?;
    let a = setup.instance().await?;
    a.ready().await?;
    let seqs = setup.publish_rows(2).await?;
    let mut source = a.source().await?;
    let delivered = pull(&mut source, 2).await?;
    let before = Instant::now();
    let m = settled(batch_of(&store, seqs.clone()), vec![]);
    record(&store, &m).await?;
    for d in delivered {
        d.ack_confirmed().await.map_err(|e| anyhow!("ack: {e}"))?;
    }
    wait_until("the ack floor passed the batch", DEADLINE, POLL, || async {
        ack_floor(&setup.js).await.ok() == Some(seqs[1])
    })
    .await?;
    wait_until("the store indexed the record", DEADLINE, POLL, || async {
        store.holding(seqs[0]).is_some()
    })
    .await?;

    // Settled and acked, but seen so for less than KEEP: kept.
    let collected = store.collect().await.map_err(|e| anyhow!("{e}"))?;
    let looked_after = before.elapsed();
    ensure!(
        looked_after < KEEP,
        "the test took {looked_after:?} to reach its first collection: it cannot tell the keeping"
    );
    assert_eq!(collected.removed(), 0, "kept: {collected:?}");
    assert_eq!(setup.bucket().await?.len(), 1);

    // Once KEEP has passed since, collected.
    wait_until(
        "the collector removed the record",
        KEEP + DEADLINE,
        Duration::from_millis(200),
        || async { store.collect().await.is_ok_and(|c| c.acked == 1) },
    )
    .await?;
    assert!(
        before.elapsed() >= KEEP,
        "removed {:?} after it was recorded, before {KEEP:?}",
        before.elapsed()
    );
    assert!(setup.bucket().await?.is_empty());
    Ok(())
}

#[tokio::test]
async fn a_manifest_of_a_deleted_stream_never_matches_the_new_one_and_is_collected() -> Result<()> {
    let Some(setup) =
        Setup::start("a_manifest_of_a_deleted_stream_never_matches_the_new_one_and_is_collected")
            .await?
    else {
        return Ok(());
    };
    let (a, b) = setup.two_instances().await?;
    let seqs = setup.publish_rows(2).await?;
    let old = a.batch(seqs.clone());
    a.record(&old).await?;
    b.wait_holding(seqs[0], Some(&old)).await?;

    // The stream is deleted and created again: its sequences start at 1 again.
    setup.js.delete_stream("INGEST").await?;
    ensure_streams(&setup.js, &stream_settings()).await?;
    ensure_consumer(&setup.js, &stream_settings()).await?;
    let again = setup.publish_rows(2).await?;
    assert_eq!(again, seqs, "the new stream reuses the sequences");
    // A source connecting reads the stream as it is now.
    let _source = b.source().await?;
    assert_eq!(
        b.store.holding(seqs[0]),
        None,
        "the old batch is not this one"
    );
    a.ready().await?;
    assert_eq!(a.store.holding(seqs[1]), None);
    assert_eq!(setup.bucket().await?.len(), 1, "kept until collected");

    let collected = a.store.collect().await.map_err(|e| anyhow!("{e}"))?;
    assert_eq!(collected.old_incarnation, 1, "{collected:?}");
    assert!(setup.bucket().await?.is_empty());

    // A batch of the new stream is recorded and found as usual.
    let new = a.batch(again);
    a.record(&new).await?;
    b.wait_holding(seqs[0], Some(&new)).await?;
    Ok(())
}

#[tokio::test]
async fn the_index_is_rebuilt_after_nats_restarts() -> Result<()> {
    let Some(mut setup) = Setup::start("the_index_is_rebuilt_after_nats_restarts").await? else {
        return Ok(());
    };
    let (a, b) = setup.two_instances().await?;
    let seqs = setup.publish_rows(4).await?;
    let before = a.batch(seqs[..2].to_vec());
    a.record(&before).await?;
    b.wait_holding(seqs[0], Some(&before)).await?;

    let connects = (a.connects(), b.connects());
    setup.server.restart().await?;
    wait_until("both instances reconnected", DEADLINE, POLL, || async {
        a.connects() > connects.0 && b.connects() > connects.1
    })
    .await?;
    // The rebuilt index kept what the bucket kept, and follows new writes again.
    b.ready().await?;
    a.ready().await?;
    assert_eq!(b.store.holding(seqs[1]).as_deref(), Some(&before));
    let after = a.batch(seqs[2..].to_vec());
    a.record(&after).await?;
    b.wait_holding(seqs[3], Some(&after)).await?;
    b.store
        .forget(&before.id)
        .await
        .map_err(|e| anyhow!("forget: {e}"))?;
    // Recorded by `a`, not by `b`: `b` cannot know its acks were confirmed since, so
    // the removal waits for the collector.
    assert_eq!(setup.bucket().await?.len(), 2);
    a.store
        .forget(&after.id)
        .await
        .map_err(|e| anyhow!("forget: {e}"))?;
    b.wait_holding(seqs[3], None).await?;
    Ok(())
}

/// nats-server can lose writes it had acknowledged when it crashes (it flushes its
/// file store in the background: nats-server#7564), and a manifest among them is not a
/// batch removed: its rows' acks may be lost as well, and the rows come back to find
/// no record (seen once in `chaos::nats::nats_server_kill9`: rows twice in the
/// Replicated twin). Here the bucket's store is lost whole while nats-server is down;
/// the instance that recorded the manifest writes it again from its index once the
/// server is back, before its index says it is complete.
#[tokio::test]
async fn a_manifest_nats_server_lost_in_a_crash_is_written_again_from_the_index() -> Result<()> {
    let Some(mut setup) =
        Setup::start("a_manifest_nats_server_lost_in_a_crash_is_written_again_from_the_index")
            .await?
    else {
        return Ok(());
    };
    let a = setup.instance().await?;
    a.ready().await?;
    let seqs = setup.publish_rows(3).await?;
    let open = a.batch(seqs[..2].to_vec());
    a.record(&open).await?;
    let done = settled(a.batch(seqs[2..].to_vec()), Vec::new());
    a.record(&done).await?;
    let connects = a.connects();
    setup.server.stop().await?;
    let lost = setup
        .server
        .store_dir()
        .join("jetstream/$G/streams")
        .join(bucket_stream_name(BUCKET));
    std::fs::remove_dir_all(&lost).with_context(|| format!("removing {}", lost.display()))?;
    setup.server.start_again().await?;
    wait_until("the instance reconnected", DEADLINE, POLL, || async {
        a.connects() > connects
    })
    .await?;
    a.ready().await?;
    // Complete again only with both written back, as they were.
    let bucket = setup.bucket().await?;
    let mut held: Vec<&Manifest> = bucket.values().collect();
    held.sort_by_key(|m| m.messages[0]);
    assert_eq!(
        held,
        vec![&open, &done],
        "the bucket after the loss: {bucket:?}"
    );
    assert_eq!(a.store.holding(seqs[0]).as_deref(), Some(&open));
    assert_eq!(a.store.holding(seqs[2]).as_deref(), Some(&done));
    Ok(())
}

/// A removal a client queues while it is disconnected goes out once it reconnects, and
/// after a nats-server crash the acks the removal relied on may be lost (their rows
/// come back and must find their batch's record: seen in `chaos::nats::nats_server_kill9`,
/// rows twice in the twin). A settled batch forgotten while NATS is down is left to the
/// collector, and nothing removes it behind the reconnect.
#[tokio::test]
async fn a_manifest_forgotten_while_nats_is_down_is_left_to_the_collector() -> Result<()> {
    let Some(mut setup) =
        Setup::start("a_manifest_forgotten_while_nats_is_down_is_left_to_the_collector").await?
    else {
        return Ok(());
    };
    let a = setup.instance().await?;
    a.ready().await?;
    let seqs = setup.publish_rows(2).await?;
    let open = a.batch(seqs.clone());
    a.record(&open).await?;
    let done = settled(open, Vec::new());
    a.record(&done).await?;
    let connects = a.connects();
    setup.server.stop().await?;
    wait_until("the instance disconnected", DEADLINE, POLL, || async {
        a.js.client().connection_state() != async_nats::connection::State::Connected
    })
    .await?;
    // What the flight does a moment after its acks were confirmed.
    let _ = a.store.forget(&done.id).await;
    setup.server.start_again().await?;
    wait_until("the instance reconnected", DEADLINE, POLL, || async {
        a.connects() > connects
    })
    .await?;
    // Whatever the client queued while down has reached the server after this.
    a.js.client().flush().await.context("flushing")?;
    a.ready().await?;
    let bucket = setup.bucket().await?;
    assert_eq!(
        bucket.values().collect::<Vec<_>>(),
        vec![&done],
        "the record is still there for the collector"
    );
    Ok(())
}

#[tokio::test]
async fn a_full_bucket_fails_the_record_with_the_reason() -> Result<()> {
    let Some(setup) = Setup::start("a_full_bucket_fails_the_record_with_the_reason").await? else {
        return Ok(());
    };
    let js = connect(&setup.server).await?;
    let store = JsManifestStore::start(
        js,
        ManifestSettings {
            max_bytes: 1 << 20,
            ..manifest_settings()
        },
    );
    store
        .ready(READY)
        .await
        .map_err(|e| anyhow!("not ready: {e}"))?;
    // 10,000-message manifests of ~10 KB each: the budget holds about a hundred.
    let mut recorded = Vec::new();
    let mut refusal = None;
    for i in 0..400u64 {
        let first = 1 + i * 10_000;
        let m = batch_of(&store, (first..first + 10_000).collect());
        match store.claim(&m).await {
            Ok(_revision) => recorded.push(m),
            Err(e) => {
                refusal = Some(e);
                break;
            }
        }
    }
    let refusal = refusal.context("the bucket never filled")?;
    let refusal = refusal.to_string();
    assert!(
        refusal.contains("manifest bucket SLUICE_MANIFESTS is full")
            && refusal.contains("manifest_max_bytes"),
        "{refusal}"
    );
    assert!(recorded.len() > 50, "{} recorded", recorded.len());
    // Nothing recorded was pushed out to make room.
    let held = setup.bucket().await?;
    assert_eq!(
        held.len(),
        recorded.len(),
        "nats-server {}",
        setup.server.version()
    );

    // A full bucket still lets manifests go (or it could never drain), and then takes
    // records again.
    for m in &recorded[..10] {
        store
            .forget(&m.id)
            .await
            .map_err(|e| anyhow!("forgetting {} in a full bucket: {e}", m.id))?;
    }
    assert_eq!(setup.bucket().await?.len(), recorded.len() - 10);
    let m = batch_of(&store, (5_000_000..5_010_000).collect());
    wait_until(
        "the bucket takes a record again",
        DEADLINE,
        POLL,
        || async { store.claim(&m).await.is_ok() },
    )
    .await?;
    Ok(())
}

#[tokio::test]
async fn removal_markers_are_dropped_from_the_bucket_once_seen() -> Result<()> {
    let Some(setup) = Setup::start("removal_markers_are_dropped_from_the_bucket_once_seen").await?
    else {
        return Ok(());
    };
    let js = connect(&setup.server).await?;
    let a = JsManifestStore::start(
        js,
        ManifestSettings {
            marker_age: Duration::ZERO,
            ..manifest_settings()
        },
    );
    a.ready(READY).await.map_err(|e| anyhow!("{e}"))?;
    let b = setup.instance().await?;
    b.ready().await?;
    let seqs = setup.publish_rows(2).await?;
    let m = batch_of(&a, seqs.clone());
    record(&a, &m).await?;
    a.forget(&m.id).await.map_err(|e| anyhow!("{e}"))?;
    b.wait_holding(seqs[0], None).await?;
    let mut bucket = setup.js.get_stream(bucket_stream_name(BUCKET)).await?;
    assert_eq!(
        bucket.info().await?.state.messages,
        1,
        "the removal marker is the key's last value"
    );
    // Once the store's watch has seen the marker, a collection drops it.
    wait_until(
        "a collection dropped the marker",
        DEADLINE,
        POLL,
        || async { a.collect().await.is_ok_and(|c| c.markers == 1) },
    )
    .await?;
    assert_eq!(
        bucket.info().await?.state.messages,
        0,
        "the bucket is empty"
    );
    // The same batch recorded again is found as ever.
    record(&a, &m).await?;
    b.wait_holding(seqs[1], Some(&m)).await?;
    Ok(())
}

// === The store in the pipeline ===

/// A deduplicating ClickHouse table as the pipeline sees it: it keeps every insert it
/// is sent (token and rows), and answers as the test says.
#[derive(Default)]
struct DedupTable {
    sent: Mutex<Vec<(Option<String>, String)>>,
    /// The next insert is taken, then answered with a transport failure (an ambiguous
    /// failure: the rows may be in).
    fail_next: AtomicBool,
    /// Every insert is taken and never answered (an instance that dies mid-insert).
    hang: AtomicBool,
}

impl DedupTable {
    fn sent(&self) -> Vec<(Option<String>, String)> {
        self.sent.lock().map(|s| s.clone()).unwrap_or_default()
    }
}

impl Inserter for DedupTable {
    async fn insert(&self, r: InsertRequest) -> Result<(), ClickHouseError> {
        if let Ok(mut sent) = self.sent.lock() {
            sent.push((
                r.dedup_token.clone(),
                String::from_utf8_lossy(&r.body).into_owned(),
            ));
        }
        if self.hang.load(Ordering::SeqCst) {
            futures::future::pending::<()>().await;
        }
        if self.fail_next.swap(false, Ordering::SeqCst) {
            return Err(ClickHouseError {
                class: Class::Unavailable,
                code: None,
                table_scoped: false,
                splittable: false,
                missing_table: false,
                status: None,
                no_answer: None,
                message: "connection reset by peer after the body was sent".into(),
            });
        }
        Ok(())
    }

    async fn probe(&self) -> Result<ServerInfo, ClickHouseError> {
        Ok(ServerInfo::default())
    }

    async fn deduplicates(&self, _table: &TableKey) -> Result<Dedup, ClickHouseError> {
        Ok(Dedup {
            exactly_once: true,
            why: "a test table that deduplicates".into(),
            window: None,
        })
    }
}

impl Setup {
    /// An instance's pipeline over `table`: batches of 10 rows, flushed after 200 ms.
    async fn pipeline(
        &self,
        instance: Instance,
        table: Arc<DedupTable>,
    ) -> Result<PipelineHandle<JsDelivery>> {
        self.pipeline_gathering(instance, table, Duration::from_millis(300))
            .await
    }

    /// The same, gathering the messages of a recorded batch for `reform_wait`.
    async fn pipeline_gathering(
        &self,
        instance: Instance,
        table: Arc<DedupTable>,
        reform_wait: Duration,
    ) -> Result<PipelineHandle<JsDelivery>> {
        let settings = PipelineSettings {
            shutdown_deadline: Duration::from_secs(1),
            reform_wait,
            ..Default::default()
        };
        let tables = TableSettingsResolver::new(TableSettings {
            batch_rows: 10,
            batch_age: Duration::from_millis(200),
            ..Default::default()
        });
        sluice_actors::start(PipelineConfig {
            source: instance.factory,
            targets: vec![Target::new("main", table)],
            tenants: [("acme".to_string(), "main".to_string())].into(),
            tables,
            settings,
            manifests: Some(instance.store),
        })
        .await
        .map_err(|e| anyhow!("starting the pipeline: {e}"))
    }

    async fn wait_queue_empty(&self) -> Result<()> {
        wait_until("every row acked", Duration::from_secs(30), POLL, || async {
            match self.js.get_stream("INGEST").await {
                Ok(s) => s.cached_info().state.messages == 0,
                Err(_) => false,
            }
        })
        .await
    }
}

/// Exactly-once within an instance: an insert that may have landed is repeated with
/// the same rows and token, and the manifest goes once the rows are acked (by the
/// collector here: the pipeline stops before `ack_wait` has passed since it settled,
/// and leaves its records to it).
#[tokio::test]
async fn a_batch_that_failed_ambiguously_is_sent_again_with_the_same_rows_and_token() -> Result<()>
{
    let Some(setup) =
        Setup::start("a_batch_that_failed_ambiguously_is_sent_again_with_the_same_rows_and_token")
            .await?
    else {
        return Ok(());
    };
    let table = Arc::new(DedupTable::default());
    table.fail_next.store(true, Ordering::SeqCst);
    let instance = setup.instance().await?;
    let store = instance.store.clone();
    let pipeline = setup.pipeline(instance, table.clone()).await?;
    setup.publish_rows(10).await?;
    setup.wait_queue_empty().await?;
    pipeline.shutdown().await;
    assert_eq!(setup.bucket().await?.len(), 1, "kept past the shutdown");

    let sent = table.sent();
    assert_eq!(sent.len(), 2, "the failed attempt and its retry: {sent:#?}");
    assert!(sent[0].0.is_some(), "a deduplication token");
    assert_eq!(sent[0], sent[1], "the same rows under the same token");
    assert_eq!(sent[0].1.lines().count(), 10);
    wait_until(
        "the collector removed the manifest",
        DEADLINE,
        POLL,
        || async { store.collect().await.is_ok_and(|c| c.acked == 1) },
    )
    .await?;
    assert!(setup.bucket().await?.is_empty());
    Ok(())
}

/// Exactly-once across instances: what one instance recorded and sent, another sends
/// again as exactly that batch (same rows, same token), and nothing else.
#[tokio::test]
async fn a_batch_left_by_a_stopped_instance_is_formed_again_by_another() -> Result<()> {
    let Some(setup) =
        Setup::start("a_batch_left_by_a_stopped_instance_is_formed_again_by_another").await?
    else {
        return Ok(());
    };
    // The first instance sends a batch and never hears back; it stops, handing the
    // rows back.
    let first = Arc::new(DedupTable::default());
    first.hang.store(true, Ordering::SeqCst);
    let instance = setup.instance().await?;
    let a_client = instance.js.client();
    let a = setup.pipeline(instance, first.clone()).await?;
    setup.publish_rows(10).await?;
    wait_until(
        "the first instance sent the batch",
        DEADLINE,
        POLL,
        || async { !first.sent().is_empty() },
    )
    .await?;
    let recorded = setup.bucket().await?;
    assert_eq!(
        recorded.len(),
        1,
        "the batch was recorded before it was sent"
    );
    a.shutdown().await;
    // Its process ends: its connection closes (and its pull requests with it).
    a_client
        .drain()
        .await
        .map_err(|e| anyhow!("closing: {e}"))?;

    // Another instance gets the rows again and sends exactly that batch again.
    let second = Arc::new(DedupTable::default());
    let instance = setup.instance().await?;
    let collector = instance.store.clone();
    let b = setup.pipeline(instance, second.clone()).await?;
    setup.wait_queue_empty().await?;
    // The second instance did not hold every message of the batch (some came back to
    // it only after ack_wait, or went elsewhere): the collection removes the manifest
    // once its rows are acked (the tests run it on demand).
    wait_until("the manifest removed", DEADLINE, POLL, || async {
        let _ = collector.collect().await;
        setup.bucket().await.is_ok_and(|b| b.is_empty())
    })
    .await?;
    b.shutdown().await;
    let (sent_first, sent_second) = (first.sent(), second.sent());
    assert_eq!(
        sent_second, sent_first,
        "the same rows under the same token"
    );
    Ok(())
}

/// Copies of a recorded batch's messages are gathered here while another instance
/// settles the batch, acks its messages and removes the record: the copies are not
/// inserted again (an earlier Sluice formed them into a new batch once the rest of
/// the batch was no longer in the stream: their rows twice).
#[tokio::test]
async fn copies_gathered_while_their_batch_was_settled_elsewhere_are_not_inserted_again(
) -> Result<()> {
    let Some(setup) = Setup::start(
        "copies_gathered_while_their_batch_was_settled_elsewhere_are_not_inserted_again",
    )
    .await?
    else {
        return Ok(());
    };
    // The other instance holds the four messages and records them as one batch.
    let other = setup.instance().await?;
    other.ready().await?;
    let seqs = setup.publish_rows(4).await?;
    let held = fetch_exactly(&setup.js, 4).await?;
    let batch = other.batch(seqs.clone());
    other.record(&batch).await?;
    // This instance gathers copies of two of them (the others are still held there),
    // and waits long for the rest.
    let table = Arc::new(DedupTable::default());
    let here = setup.instance().await?;
    let here_store = here.store.clone();
    let pipeline = setup
        .pipeline_gathering(here, table.clone(), Duration::from_secs(5))
        .await?;
    here_store.ready(READY).await.map_err(|e| anyhow!("{e}"))?;
    let mut kept = Vec::new();
    for m in held {
        let seq = m.info().map_err(|e| anyhow!("{e}"))?.stream_sequence;
        if seq <= seqs[1] {
            m.ack_with(jetstream::AckKind::Nak(None))
                .await
                .map_err(|e| anyhow!("nak: {e}"))?;
        } else {
            kept.push(m);
        }
    }
    wait_until("the copies gathered here", DEADLINE, POLL, || async {
        buffered_rows(&pipeline.tree_json()) == 2
    })
    .await?;
    // The other instance settles the batch: its verdicts, every message acked (the two
    // copies' messages leave the stream with it), the record removed.
    other.record(&settled(batch.clone(), vec![])).await?;
    for m in kept {
        m.double_ack().await.map_err(|e| anyhow!("ack: {e}"))?;
    }
    let ingest = setup.js.get_stream("INGEST").await?;
    for seq in &seqs[..2] {
        ingest.delete_message(*seq).await?;
    }
    other
        .store
        .forget(&batch.id)
        .await
        .map_err(|e| anyhow!("{e}"))?;
    wait_until("the stream empty", DEADLINE, POLL, || async {
        stream_messages(&setup.js).await.is_ok_and(|n| n == 0)
    })
    .await?;
    // Past the gathering's wait: the copies were settled, never inserted.
    tokio::time::sleep(Duration::from_secs(6)).await;
    pipeline.shutdown().await;
    assert!(
        table.sent().is_empty(),
        "copies of settled rows were inserted again: {:?}",
        table.sent()
    );
    Ok(())
}

/// A message of a settled batch comes back, its rejected row recorded as parked: it is
/// acked, and the row is not parked again, however long after (the DLQ's own
/// duplicate window is two minutes).
#[tokio::test]
async fn a_row_recorded_parked_is_not_parked_again_when_its_message_comes_back() -> Result<()> {
    let Some(setup) =
        Setup::start("a_row_recorded_parked_is_not_parked_again_when_its_message_comes_back")
            .await?
    else {
        return Ok(());
    };
    let other = setup.instance().await?;
    other.ready().await?;
    let seqs = setup.publish_rows(2).await?;
    let batch = other.batch(seqs.clone());
    other.record(&batch).await?;
    let done = settled(
        batch,
        vec![RejectedRow {
            stream_sequence: seqs[1],
            line: 0,
            class: Class::Rejected,
            code: Some(27),
            error: "Cannot parse input".into(),
            parked: true,
        }],
    );
    other.record(&done).await?;
    // The other instance died after parking and recording, before its acks.
    let table = Arc::new(DedupTable::default());
    let pipeline = setup
        .pipeline(setup.instance().await?, table.clone())
        .await?;
    setup.wait_queue_empty().await?;
    pipeline.shutdown().await;
    assert!(
        table.sent().is_empty(),
        "inserted again: {:?}",
        table.sent()
    );
    let dlq = setup.js.get_stream("DLQ").await?;
    assert_eq!(dlq.cached_info().state.messages, 0, "parked a second time");
    Ok(())
}

/// Exactly `n` messages pulled by one request of their own (no request left waiting on
/// the server to take the ones handed back later).
async fn fetch_exactly(js: &jetstream::Context, n: usize) -> Result<Vec<jetstream::Message>> {
    let consumer: consumer::PullConsumer = js
        .get_stream("INGEST")
        .await?
        .get_consumer("sluice")
        .await
        .map_err(|e| anyhow!("the consumer: {e}"))?;
    let messages: Vec<jetstream::Message> = consumer
        .fetch()
        .max_messages(n)
        .expires(Duration::from_secs(2))
        .messages()
        .await
        .map_err(|e| anyhow!("fetching: {e}"))?
        .try_collect()
        .await
        .map_err(|e| anyhow!("fetching: {e}"))?;
    ensure!(messages.len() == n, "fetched {} of {n}", messages.len());
    Ok(messages)
}

/// Messages in the ingest stream (a work queue: acked ones leave it).
async fn stream_messages(js: &jetstream::Context) -> Result<u64> {
    let mut stream = js.get_stream("INGEST").await?;
    Ok(stream.info().await?.state.messages)
}

/// The rows a pipeline's tables hold (buffered or gathered), from its tree.
fn buffered_rows(tree: &serde_json::Value) -> u64 {
    fn walk(node: &serde_json::Value, sum: &mut u64) {
        if let Some(n) = node
            .pointer("/state/buffered_rows")
            .and_then(|v| v.as_u64())
        {
            *sum += n;
        }
        for child in node["children"].as_array().into_iter().flatten() {
            walk(child, sum);
        }
    }
    let mut sum = 0;
    walk(tree, &mut sum);
    sum
}

/// Issue 36 (7): two instances holding copies of one message both form a batch of it
/// alone: the same message set, the same record key. The second claim must lose to the
/// first (its messages go back to join it), never write over it and pass for a claim
/// of its own: both would be sent, on two shards when the table has no shard key.
#[tokio::test]
async fn a_second_claim_of_the_same_messages_loses_to_the_first() -> Result<()> {
    let Some(setup) =
        Setup::start("a_second_claim_of_the_same_messages_loses_to_the_first").await?
    else {
        return Ok(());
    };
    let (a, b) = setup.two_instances().await?;
    let seqs = setup.publish_rows(2).await?;
    let first = a.batch(seqs.clone()).on_shard(0);
    let second = b.batch(seqs.clone()).on_shard(1);
    let revision = a
        .store
        .claim(&first)
        .await
        .map_err(|e| anyhow!("the first claim: {e}"))?;
    let refused = b.store.claim(&second).await;
    assert_eq!(
        refused,
        Err(ClaimError::Conflict {
            id: second.id.clone(),
            earlier: first.id.clone()
        }),
        "the second claim of the same messages"
    );
    let stands = a
        .store
        .current(&first.id)
        .await
        .map_err(|e| anyhow!("reading {}: {e}", first.id))?
        .map(|r| r.manifest)
        .context("the first claim's record is gone")?;
    assert_eq!(
        (stands.shard, stands.claim_revision),
        (0, revision),
        "the first claim's record, as it was written"
    );
    Ok(())
}

/// Issue 36 (6): two instances hold halves of a redelivered batch and each forms it
/// again. B sends it and records its verdicts; A, slower, then records a split over
/// them. Written over, the settled record would be gone: formed again, the batch's
/// inserted rows would be sent once more under new blocks. A record written after its
/// claim is written only over the state its writer read; a settled one is final.
#[tokio::test]
async fn a_settled_record_is_never_written_over() -> Result<()> {
    let Some(setup) = Setup::start("a_settled_record_is_never_written_over").await? else {
        return Ok(());
    };
    let (a, b) = setup.two_instances().await?;
    let seqs = setup.publish_rows(4).await?;
    let claimed = a.batch(seqs.clone());
    let revision = a
        .store
        .claim(&claimed)
        .await
        .map_err(|e| anyhow!("claiming {}: {e}", claimed.id))?;
    let claimed = claimed.claimed_as(revision);
    // Both read it open.
    for instance in [&a, &b] {
        let read = instance
            .store
            .current(&claimed.id)
            .await
            .map_err(|e| anyhow!("reading {}: {e}", claimed.id))?
            .map(|r| r.manifest);
        assert_eq!(read.as_ref(), Some(&claimed));
    }
    let done = settled(claimed.clone(), Vec::new());
    b.record(&done).await?;
    let split = claimed.with_state(ManifestState::Split(sluice_actors::ledger::Split {
        untried: vec![
            sluice_actors::ledger::RowRange::new(2, 4),
            sluice_actors::ledger::RowRange::new(0, 2),
        ],
        ..Default::default()
    }));
    let late = a.store.update(&split, revision).await;
    assert!(
        late.is_err(),
        "a split recorded over the settled record was taken"
    );
    let stands = b
        .store
        .current(&claimed.id)
        .await
        .map_err(|e| anyhow!("reading {}: {e}", claimed.id))?
        .map(|r| r.manifest);
    assert_eq!(stands, Some(done), "the settled record stands");
    Ok(())
}

/// Issue 36 (8): a nats-server crash loses the bucket's records (nats-server#7564);
/// the watch writes them back from its index. Among them, batches that claimed one
/// message in turn: the earlier claim (sent) and a later one left behind unjudged
/// (never sent). Written back in any order at new revisions, the later could pass for
/// the earlier: the sent batch would be withdrawn as one that lost its claim, and its
/// rows inserted again as new ones. They keep their order of claim.
#[tokio::test]
async fn records_written_back_after_a_loss_keep_their_order_of_claim() -> Result<()> {
    let Some(mut setup) =
        Setup::start("records_written_back_after_a_loss_keep_their_order_of_claim").await?
    else {
        return Ok(());
    };
    let a = setup.instance().await?;
    a.ready().await?;
    // Pairs of batches sharing a message: the first of each claimed, the second written
    // after it, unjudged (left behind as a record the store could not judge is).
    const PAIRS: usize = 6;
    let seqs = setup.publish_rows(3 * PAIRS).await?;
    let mut pairs = Vec::new();
    for pair in seqs.chunks(3) {
        let earlier = a.batch(pair[..2].to_vec());
        a.store
            .claim(&earlier)
            .await
            .map_err(|e| anyhow!("claiming {}: {e}", earlier.id))?;
        pairs.push(earlier);
    }
    let mut later = Vec::new();
    for pair in seqs.chunks(3) {
        let behind = a.batch(pair[1..].to_vec());
        a.store
            .update(&behind, 0)
            .await
            .map_err(|e| anyhow!("recording {}: {e}", behind.id))?;
        later.push(behind);
    }
    let connects = a.connects();
    setup.server.stop().await?;
    let lost = setup
        .server
        .store_dir()
        .join("jetstream/$G/streams")
        .join(bucket_stream_name(BUCKET));
    std::fs::remove_dir_all(&lost).with_context(|| format!("removing {}", lost.display()))?;
    setup.server.start_again().await?;
    wait_until("the instance reconnected", DEADLINE, POLL, || async {
        a.connects() > connects
    })
    .await?;
    a.ready().await?;
    ensure!(
        setup.bucket().await?.len() == 2 * PAIRS,
        "every record written back"
    );
    // As another instance reads the bucket now.
    let c = setup.instance().await?;
    c.ready().await?;
    for (earlier, behind) in pairs.iter().zip(&later) {
        let read = |id: String| {
            let store = c.store.clone();
            async move {
                store
                    .current(&id)
                    .await
                    .map_err(|e| anyhow!("reading {id}: {e}"))?
                    .map(|r| r.manifest)
                    .with_context(|| format!("{id} is not in the bucket"))
            }
        };
        let (earlier_now, behind_now) = (
            read(earlier.id.clone()).await?,
            read(behind.id.clone()).await?,
        );
        assert_eq!(
            c.store.earlier_claim(&behind_now).await.ok(),
            Some(Some(earlier.id.clone())),
            "the batch left behind still comes after the one claimed before it"
        );
        assert_eq!(c.store.earlier_claim(&earlier_now).await.ok(), Some(None));
    }
    Ok(())
}

/// Issue 36, "also": the bucket drops a record its `max_age` after its last write (24 h;
/// 2 s here). Gone without a removal marker, it used to stay in every index, its
/// messages gathered for it for ever and no one told. The collector sees it expired:
/// out of the index, counted (`reason="expired"`) and logged.
#[tokio::test]
async fn a_record_the_bucket_expired_is_counted_and_leaves_the_index() -> Result<()> {
    let Some(setup) =
        Setup::start("a_record_the_bucket_expired_is_counted_and_leaves_the_index").await?
    else {
        return Ok(());
    };
    let js = connect(&setup.server).await?;
    let store = JsManifestStore::start(
        js,
        ManifestSettings {
            max_age: Duration::from_secs(2),
            ..manifest_settings()
        },
    );
    store
        .ready(READY)
        .await
        .map_err(|e| anyhow!("the store is not ready: {e}"))?;
    let seqs = setup.publish_rows(2).await?;
    let open = batch_of(&store, seqs.clone());
    store
        .claim(&open)
        .await
        .map_err(|e| anyhow!("claiming {}: {e}", open.id))?;
    ensure!(
        store.holding(seqs[0]).is_some(),
        "the index holds the claim"
    );
    let collected = wait_for(
        "the record collected as expired",
        Duration::from_secs(20),
        Duration::from_millis(500),
        || async {
            let collected = store
                .collect()
                .await
                .map_err(|e| anyhow!("collecting: {e}"))?;
            ensure!(collected.expired == 1, "{collected:?}");
            Ok(collected)
        },
    )
    .await?;
    assert_eq!(collected.removed(), 1, "{collected:?}");
    assert_eq!(store.holding(seqs[0]), None, "the index let it go");
    Ok(())
}
