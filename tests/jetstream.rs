//! The JetStream adapter against a real nats-server: Debian's 2.9.10 or the current one
//! (`SLUICE_TEST_NATS=debian|current`; `scripts/test` runs this binary under both).
//!
//! Checked from the outside: what the streams hold (rows, headers, sequences), how long
//! a handed-back row stays away, and what the operator's DLQ tools leave behind.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{anyhow, bail, ensure, Context, Result};
use async_nats::jetstream::{self, consumer, message::StreamMessage, stream};
use bytes::Bytes;
use serde_json::json;
use sluice::config::{StreamCompression, StreamSettings};
use sluice::nats::{
    ensure_consumer, ensure_streams, remove_stranded, AckedHere, Dlq, DlqWriter, IngestStreams,
    JetStreamSource, JetStreamSourceFactory, JsDelivery, PublishError, Publisher,
    ORIGINAL_LINE_HEADER,
};
use sluice_actors::{Class, Delivery, Parking, Position, Source, SourceFactory, TableKey};
use sluice_harness::{available, wait_for, wait_until, NatsFlavor, NatsServer};

const DEADLINE: Duration = Duration::from_secs(15);
const POLL: Duration = Duration::from_millis(50);
const SUBJECT: &str = "ingest.acme.events";

/// The nats-server of this run, or `None` (with a notice) if its binary is missing.
async fn nats_or_skip(test: &str) -> Result<Option<NatsServer>> {
    let flavor = NatsFlavor::from_env()?;
    if available(test, flavor.binary())?.is_none() {
        return Ok(None);
    }
    Ok(Some(NatsServer::start(flavor).await?))
}

async fn connect(server: &NatsServer) -> Result<jetstream::Context> {
    let client = async_nats::ConnectOptions::new()
        .connection_timeout(Duration::from_secs(5))
        .connect(server.url())
        .await
        .with_context(|| format!("connecting to {}", server.url()))?;
    Ok(jetstream::new(client))
}

/// `[nats]` as the example config has it, with a budget and `ack_wait` of the test's.
fn settings(max_bytes: u64, ack_wait: Duration) -> StreamSettings {
    StreamSettings {
        stream: "INGEST".into(),
        subject_prefix: "ingest".into(),
        consumer: "sluice".into(),
        dlq_stream: "DLQ".into(),
        dlq_subject_prefix: "dlq".into(),
        max_bytes,
        dlq_max_bytes: 64 << 20,
        duplicate_window: Duration::from_secs(120),
        ack_wait,
        max_ack_pending: 1000,
        replicas: 1,
        stream_compression: StreamCompression::None,
        partitions: 1,
    }
}

/// A server with the streams and the consumer set up, and what the tests use on it.
struct Setup {
    server: NatsServer,
    js: jetstream::Context,
    settings: StreamSettings,
    ingest: Publisher,
    dlq_writer: Arc<DlqWriter>,
}

impl Setup {
    async fn start(test: &str, ack_wait: Duration) -> Result<Option<Setup>> {
        let Some(server) = nats_or_skip(test).await? else {
            return Ok(None);
        };
        let js = connect(&server).await?;
        let settings = settings(64 << 20, ack_wait);
        ensure_streams(&js, &settings).await?;
        ensure_consumer(&js, &settings).await?;
        let ingest = Publisher::new(js.clone(), &settings.stream, settings.max_bytes);
        let dlq_writer = Arc::new(DlqWriter::new(
            Publisher::new(js.clone(), &settings.dlq_stream, settings.dlq_max_bytes),
            settings.dlq_subject_prefix.clone(),
        ));
        Ok(Some(Setup {
            server,
            js,
            settings,
            ingest,
            dlq_writer,
        }))
    }

    async fn source(&self) -> Result<JetStreamSource> {
        JetStreamSourceFactory::new(
            self.js.clone(),
            self.settings.clone(),
            self.dlq_writer.clone(),
            100,
        )
        .connect(0)
        .await
        .map_err(|e| anyhow!("opening the consumer: {e}"))
    }

    /// Publishes a row to the ingest stream; returns its stream sequence.
    async fn publish(&self, subject: &str, payload: impl Into<Bytes>) -> Result<u64> {
        let published = self
            .ingest
            .publish(subject.to_string(), payload.into(), None, None)
            .await
            .context("publishing a row")?;
        Ok(published.sequence)
    }

    fn dlq(&self) -> Dlq {
        Dlq::new(
            self.js.clone(),
            self.settings.clone(),
            IngestStreams::new(&self.js, &self.settings),
        )
    }
}

/// Pulls until `n` deliveries are in hand or the deadline passes.
async fn pull(
    source: &mut JetStreamSource,
    n: usize,
    deadline: Duration,
) -> Result<Vec<JsDelivery>> {
    let end = Instant::now() + deadline;
    let mut got = Vec::new();
    while got.len() < n {
        if Instant::now() >= end {
            bail!("pulled {} of {n} rows within {deadline:?}", got.len());
        }
        let batch = source
            .pull(n - got.len())
            .await
            .map_err(|e| anyhow!("pulling: {e}"))?;
        got.extend(batch);
    }
    Ok(got)
}

async fn stream_messages(js: &jetstream::Context, name: &str) -> Result<u64> {
    let info = js
        .get_stream(name)
        .await
        .with_context(|| format!("looking up stream {name}"))?
        .get_info()
        .await
        .with_context(|| format!("reading stream {name}"))?;
    Ok(info.state.messages)
}

/// Every message a stream holds, oldest first (read by sequence, nothing consumed).
async fn stream_contents(js: &jetstream::Context, name: &str) -> Result<Vec<StreamMessage>> {
    let stream = js.get_stream(name).await?;
    let state = stream.get_info().await?.state;
    let mut out = Vec::new();
    if state.messages == 0 {
        return Ok(out);
    }
    ensure!(
        state.last_sequence - state.first_sequence < 100_000,
        "unexpectedly many sequences: {state:?}"
    );
    for seq in state.first_sequence..=state.last_sequence {
        match stream.get_raw_message(seq).await {
            Ok(message) => out.push(message),
            // A deleted (acked) sequence in between.
            Err(e) if e.kind() == stream::RawMessageErrorKind::NoMessageFound => {}
            Err(e) => return Err(anyhow!("reading message {seq} of {name}: {e}")),
        }
    }
    Ok(out)
}

/// (subject, payload) of every row in the ingest stream, oldest first.
async fn queued_rows(js: &jetstream::Context) -> Result<Vec<(String, String)>> {
    Ok(stream_contents(js, "INGEST")
        .await?
        .into_iter()
        .map(|m| {
            (
                m.subject.to_string(),
                String::from_utf8_lossy(&m.payload).into_owned(),
            )
        })
        .collect())
}

async fn wait_for_messages(js: &jetstream::Context, name: &str, n: u64) -> Result<()> {
    wait_for(
        &format!("stream {name} to hold {n} messages"),
        DEADLINE,
        POLL,
        || async {
            let count = stream_messages(js, name).await?;
            if count == n {
                Ok(())
            } else {
                Err(anyhow!("{count} messages"))
            }
        },
    )
    .await
}

fn rejected(table: &str, code: Option<u32>, error: &str) -> Parking {
    Parking {
        table: TableKey::new("acme", table),
        class: Class::Rejected,
        code,
        error: error.into(),
    }
}

async fn park(delivery: JsDelivery, parking: &Parking) -> Result<()> {
    delivery
        .park(parking)
        .await
        .map_err(|(_, e)| anyhow!("parking a row: {e}"))
}

#[tokio::test]
async fn a_full_stream_answers_queue_full_and_keeps_every_acked_row() -> Result<()> {
    let Some(server) =
        nats_or_skip("a_full_stream_answers_queue_full_and_keeps_every_acked_row").await?
    else {
        return Ok(());
    };
    let js = connect(&server).await?;
    let budget = 4096;
    let settings = settings(budget, Duration::from_secs(30));
    ensure_streams(&js, &settings).await?;
    let publisher = Publisher::new(js.clone(), &settings.stream, budget);

    // Rows of one size, so "full" means the same thing for every one of them.
    let row = |i: u32| json!({"id": format!("{i:06}"), "pad": "x".repeat(60)}).to_string();
    let mut acked = BTreeSet::new();
    let mut full_after = None;
    for i in 0..1000u32 {
        let payload = row(i);
        let id = format!("row-{i}");
        match publisher
            .publish(SUBJECT.into(), payload.clone().into(), None, Some(&id))
            .await
        {
            Ok(published) => {
                assert!(!published.duplicate, "row {i} is new");
                acked.insert(payload);
            }
            Err(PublishError::QueueFull) => {
                full_after = Some(i);
                break;
            }
            Err(e) => bail!("publish {i}: {e}"),
        }
    }
    let full_after = full_after.context("a 4 KiB stream never answered QueueFull")?;
    assert!(
        full_after > 5,
        "the stream took only {full_after} rows before it was full"
    );

    // Rows of every size keep coming at a full stream (as they would at the API): the
    // small ones may still fit, and each one acked must stay. nats-server < 2.10.5
    // admits a row by its payload alone and then prunes the oldest rows to make room
    // for its overhead; Sluice's budget guard must keep that from ever happening.
    for attempt in 0..120u32 {
        let payload =
            json!({"id": format!("s{attempt}"), "pad": "y".repeat((attempt as usize * 7) % 100)})
                .to_string();
        match publisher
            .publish(SUBJECT.into(), payload.clone().into(), None, None)
            .await
        {
            Err(PublishError::QueueFull) => {}
            Ok(_) => {
                acked.insert(payload);
            }
            Err(e) => bail!("small row {attempt} on a full stream: {e}"),
        }
    }

    // Still full, also once the publisher has re-read the stream's size: a row may still
    // fit where its estimate was pessimistic (then it is acked like any other), until
    // three attempts in a row, spread over several re-reads, are refused.
    let mut refused_in_a_row = 0;
    for attempt in 0..100u32 {
        let payload = row(5000 + attempt);
        match publisher
            .publish(SUBJECT.into(), payload.clone().into(), None, None)
            .await
        {
            Err(PublishError::QueueFull) => refused_in_a_row += 1,
            Ok(_) => {
                refused_in_a_row = 0;
                acked.insert(payload);
            }
            Err(e) => bail!("attempt {attempt} on a full stream: {e}"),
        }
        if refused_in_a_row == 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(120)).await;
    }
    assert_eq!(refused_in_a_row, 3, "a full stream stays full");
    let stored = js
        .get_stream(&settings.stream)
        .await?
        .get_info()
        .await?
        .state
        .bytes;
    assert!(
        stored <= budget,
        "the stream holds {stored} bytes, over its {budget} budget"
    );

    // Nothing acknowledged was dropped to make room: the stream holds exactly the rows
    // whose publish was acked (nats-server < 2.10.5 would prune the oldest ones).
    let held: BTreeSet<String> = stream_contents(&js, &settings.stream)
        .await?
        .into_iter()
        .map(|m| String::from_utf8_lossy(&m.payload).into_owned())
        .collect();
    assert_eq!(
        held.len(),
        acked.len(),
        "nats-server {}: {} acked, {} held",
        server.version(),
        acked.len(),
        held.len()
    );
    assert_eq!(held, acked, "nats-server {}", server.version());
    Ok(())
}

#[tokio::test]
async fn a_nak_with_a_delay_comes_back_no_sooner() -> Result<()> {
    let Some(setup) = Setup::start(
        "a_nak_with_a_delay_comes_back_no_sooner",
        Duration::from_secs(30),
    )
    .await?
    else {
        return Ok(());
    };
    let sequence = setup.publish(SUBJECT, r#"{"id": 1}"#).await?;
    let mut source = setup.source().await?;
    let mut first = pull(&mut source, 1, DEADLINE).await?;
    let delivery = first.pop().context("one delivery")?;
    assert_eq!(delivery.meta().deliveries, 1);
    assert_eq!(delivery.meta().stream_sequence, sequence);

    let delay = Duration::from_secs(2);
    let naked_at = Instant::now();
    delivery.nak(delay).await.map_err(|e| anyhow!("nak: {e}"))?;
    let mut again = pull(&mut source, 1, delay + DEADLINE).await?;
    let away = naked_at.elapsed();
    let delivery = again.pop().context("the row came back")?;
    assert!(
        away >= delay,
        "redelivered after {away:?}, before the {delay:?} delay"
    );
    assert!(
        away < delay + Duration::from_secs(5),
        "redelivered only after {away:?}"
    );
    let meta = delivery.meta();
    assert_eq!(meta.deliveries, 2, "{meta:?}");
    assert_eq!(meta.stream_sequence, sequence);
    assert_eq!(delivery.payload().as_ref(), br#"{"id": 1}"#);

    delivery.ack().await.map_err(|e| anyhow!("ack: {e}"))?;
    wait_for_messages(&setup.js, "INGEST", 0).await?;
    Ok(())
}

#[tokio::test]
async fn a_dropped_delivery_comes_back_promptly() -> Result<()> {
    let ack_wait = Duration::from_secs(30);
    let Some(setup) = Setup::start("a_dropped_delivery_comes_back_promptly", ack_wait).await?
    else {
        return Ok(());
    };
    setup.publish(SUBJECT, r#"{"id": 1}"#).await?;
    let mut source = setup.source().await?;
    let first = pull(&mut source, 1, DEADLINE).await?;
    let dropped_at = Instant::now();
    // As a crashed actor would: never settled.
    drop(first);
    let mut again = pull(&mut source, 1, DEADLINE).await?;
    let away = dropped_at.elapsed();
    assert!(
        away < Duration::from_secs(5),
        "a dropped row came back after {away:?} (ack_wait is {ack_wait:?})"
    );
    let delivery = again.pop().context("the row came back")?;
    assert_eq!(delivery.meta().deliveries, 2);
    delivery.ack().await.map_err(|e| anyhow!("ack: {e}"))?;
    wait_for_messages(&setup.js, "INGEST", 0).await?;
    Ok(())
}

/// The header's single value, failing when it is missing.
fn header(message: &StreamMessage, name: &str) -> Result<String> {
    message
        .headers
        .get(name)
        .map(|v| v.as_str().to_string())
        .with_context(|| format!("header {name} is missing: {:?}", message.headers))
}

#[tokio::test]
async fn a_parked_row_carries_every_header_and_leaves_the_queue() -> Result<()> {
    let Some(setup) = Setup::start(
        "a_parked_row_carries_every_header_and_leaves_the_queue",
        Duration::from_secs(30),
    )
    .await?
    else {
        return Ok(());
    };
    let row = r#"{"id": "not a number"}"#;
    let sequence = setup.publish(SUBJECT, row).await?;
    let mut source = setup.source().await?;

    // Handed back once first, so the delivery count is not just 1.
    let first = pull(&mut source, 1, DEADLINE).await?;
    for d in first {
        d.nak(Duration::ZERO)
            .await
            .map_err(|e| anyhow!("nak: {e}"))?;
    }
    let mut second = pull(&mut source, 1, DEADLINE).await?;
    let delivery = second.pop().context("the row came back")?;

    // ClickHouse's messages span lines and can be long: the header keeps 1 KiB of it
    // on one line.
    let message = format!(
        "Code: 27, e.displayText() = DB::Exception: Cannot parse input: expected \" before: not a number\r\n(at row 1)\n{}",
        "é".repeat(2000)
    );
    let before = SystemTime::now();
    park(delivery, &rejected("events", Some(27), &message)).await?;
    let after = SystemTime::now();

    // The original is acked: gone from the work queue.
    wait_for_messages(&setup.js, "INGEST", 0).await?;

    let parked = stream_contents(&setup.js, "DLQ").await?;
    assert_eq!(parked.len(), 1, "one row parked");
    let parked = &parked[0];
    assert_eq!(parked.subject.as_str(), "dlq.acme.events");
    assert_eq!(
        parked.payload.as_ref(),
        row.as_bytes(),
        "the row as it came"
    );
    assert_eq!(header(parked, "Sluice-Tenant")?, "acme");
    assert_eq!(header(parked, "Sluice-Table")?, "events");
    assert_eq!(header(parked, "Sluice-Error-Class")?, "Rejected");
    assert_eq!(header(parked, "Sluice-Error-Code")?, "27");
    let error = header(parked, "Sluice-Error")?;
    assert!(
        error.len() <= 1024,
        "capped at 1 KiB: {} bytes",
        error.len()
    );
    assert!(
        error.len() > 900,
        "keeps the first KiB: {} bytes",
        error.len()
    );
    assert!(
        !error.contains('\r') && !error.contains('\n'),
        "one line: {error:?}"
    );
    assert!(
        error.starts_with("Code: 27, e.displayText() = DB::Exception: Cannot parse input"),
        "{error:?}"
    );
    assert!(error.contains("(at row 1)"), "{error:?}");
    assert_eq!(header(parked, "Sluice-Original-Subject")?, SUBJECT);
    assert_eq!(
        header(parked, "Sluice-Original-Sequence")?,
        sequence.to_string()
    );
    assert_eq!(header(parked, "Sluice-Deliveries")?, "2");
    let parked_at = header(parked, "Sluice-Parked-At")?;
    let at = humantime::parse_rfc3339(&parked_at)
        .with_context(|| format!("Sluice-Parked-At {parked_at:?} is not RFC 3339"))?;
    let slack = Duration::from_secs(1);
    assert!(
        at + slack >= before && at <= after + slack,
        "parked at {parked_at}, the park ran between {before:?} and {after:?}"
    );

    // A failure with no code (a tenant without a target, a codeless answer): the code
    // header is there, empty.
    let sequence = setup.publish("ingest.acme.clicks", r#"{"id": 2}"#).await?;
    let mut third = pull(&mut source, 1, DEADLINE).await?;
    let delivery = third.pop().context("the second row")?;
    park(
        delivery,
        &Parking {
            table: TableKey::new("acme", "clicks"),
            class: Class::Rejected,
            code: None,
            error: "tenant acme has no ClickHouse target".into(),
        },
    )
    .await?;
    wait_for_messages(&setup.js, "INGEST", 0).await?;
    let parked = stream_contents(&setup.js, "DLQ").await?;
    assert_eq!(parked.len(), 2);
    let parked = &parked[1];
    assert_eq!(parked.subject.as_str(), "dlq.acme.clicks");
    assert_eq!(header(parked, "Sluice-Error-Code")?, "");
    assert_eq!(header(parked, "Sluice-Table")?, "clicks");
    assert_eq!(
        header(parked, "Sluice-Original-Sequence")?,
        sequence.to_string()
    );
    assert_eq!(header(parked, "Sluice-Deliveries")?, "1");
    Ok(())
}

#[tokio::test]
async fn setting_up_streams_and_consumer_twice_is_harmless() -> Result<()> {
    let Some(server) = nats_or_skip("setting_up_streams_and_consumer_twice_is_harmless").await?
    else {
        return Ok(());
    };
    let js = connect(&server).await?;
    let mut settings = settings(1 << 20, Duration::from_secs(30));
    ensure_streams(&js, &settings).await?;
    ensure_consumer(&js, &settings).await?;
    let publisher = Publisher::new(js.clone(), &settings.stream, settings.max_bytes);
    publisher
        .publish(SUBJECT.into(), r#"{"id": 1}"#.into(), None, None)
        .await?;

    // Every instance runs this at start: again, nothing changes and nothing is lost.
    ensure_streams(&js, &settings).await?;
    ensure_streams(&js, &settings).await?;
    let consumer = ensure_consumer(&js, &settings).await?;
    assert_eq!(
        stream_messages(&js, "INGEST").await?,
        1,
        "the row is still queued"
    );
    let info = consumer.get_info().await?;
    assert_eq!(info.num_pending, 1, "the consumer kept its place: {info:?}");
    assert_eq!(info.config.ack_wait, Duration::from_secs(30));
    assert_eq!(info.config.max_deliver, -1, "unlimited deliveries");
    assert_eq!(info.config.ack_policy, consumer::AckPolicy::Explicit);

    let ingest = js.get_stream("INGEST").await?.get_info().await?.config;
    assert_eq!(ingest.retention, stream::RetentionPolicy::WorkQueue);
    assert_eq!(ingest.discard, stream::DiscardPolicy::New);
    assert_eq!(ingest.storage, stream::StorageType::File);
    assert!(ingest.max_bytes >= 1 << 20, "{}", ingest.max_bytes);
    let dlq = js.get_stream("DLQ").await?.get_info().await?.config;
    assert_eq!(dlq.retention, stream::RetentionPolicy::Limits);
    assert_eq!(dlq.discard, stream::DiscardPolicy::New);
    assert!(dlq.allow_direct);
    let names: Vec<String> = futures::TryStreamExt::try_collect(js.stream_names()).await?;
    assert_eq!(names.len(), 2, "{names:?}");

    // A changed ack_wait (and max_ack_pending, budget) is applied to what exists.
    settings.ack_wait = Duration::from_secs(45);
    settings.max_ack_pending = 500;
    settings.max_bytes = 2 << 20;
    ensure_streams(&js, &settings).await?;
    let consumer = ensure_consumer(&js, &settings).await?;
    let info = consumer.get_info().await?;
    assert_eq!(
        info.config.ack_wait,
        Duration::from_secs(45),
        "{:?}",
        info.config
    );
    assert_eq!(info.config.max_ack_pending, 500);
    assert_eq!(info.num_pending, 1, "the consumer kept its place");
    let ingest = js.get_stream("INGEST").await?.get_info().await?.config;
    assert!(ingest.max_bytes >= 2 << 20, "{}", ingest.max_bytes);
    assert_eq!(stream_messages(&js, "INGEST").await?, 1);
    Ok(())
}

#[tokio::test]
async fn dlq_tools_count_peek_replay_and_purge() -> Result<()> {
    let Some(setup) = Setup::start(
        "dlq_tools_count_peek_replay_and_purge",
        Duration::from_secs(30),
    )
    .await?
    else {
        return Ok(());
    };
    let rows = [
        (SUBJECT, r#"{"id":1}"#),
        (SUBJECT, r#"{"id":2}"#),
        (SUBJECT, "not json at all"),
        (SUBJECT, r#"{"id":3}"#),
        ("ingest.acme.clicks", r#"{"id":10}"#),
    ];
    for (subject, row) in rows {
        setup.publish(subject, row).await?;
    }
    {
        let mut source = setup.source().await?;
        for delivery in pull(&mut source, rows.len(), DEADLINE).await? {
            let table = delivery
                .subject()
                .rsplit('.')
                .next()
                .unwrap_or_default()
                .to_string();
            park(delivery, &rejected(&table, Some(27), "Cannot parse input")).await?;
        }
    }
    wait_for_messages(&setup.js, "INGEST", 0).await?;
    let dlq = setup.dlq();

    let counts = dlq.counts().await?;
    assert_eq!(counts.total, 5);
    let per_table: Vec<(String, String, u64)> = counts
        .tables
        .iter()
        .map(|t| (t.tenant.clone(), t.table.clone(), t.rows))
        .collect();
    assert_eq!(
        per_table,
        vec![
            ("acme".into(), "clicks".into(), 1),
            ("acme".into(), "events".into(), 4)
        ]
    );

    // Peeking consumes nothing.
    let peeked = dlq.peek("acme", "events", 10).await?;
    assert_eq!(peeked.len(), 4);
    // Each as parked, byte for byte.
    assert_eq!(peeked[0].row, r#"{"id":1}"#);
    assert_eq!(peeked[2].row, "not json at all");
    assert_eq!(
        peeked[0]
            .headers
            .get("Sluice-Error-Class")
            .map(String::as_str),
        Some("Rejected")
    );
    assert_eq!(dlq.peek("acme", "events", 2).await?.len(), 2, "limit");
    assert_eq!(dlq.counts().await?.total, 5, "a peek consumed nothing");

    // A dry run changes nothing.
    let report = dlq.replay("acme", "events", 100, true).await?;
    assert!(report.dry_run);
    assert_eq!(
        (report.replayed, report.skipped, report.failed),
        (3, 1, 0),
        "{report:?}"
    );
    assert_eq!(dlq.counts().await?.total, 5, "a dry run moved nothing");
    assert_eq!(stream_messages(&setup.js, "INGEST").await?, 0);

    // A replay with a limit moves that many back, and deletes them from the DLQ.
    let report = dlq.replay("acme", "events", 2, false).await?;
    assert_eq!((report.replayed, report.failed), (2, 0), "{report:?}");
    let report = dlq.replay("acme", "events", 100, false).await?;
    assert_eq!(
        (report.replayed, report.skipped, report.failed),
        (1, 1, 0),
        "{report:?}"
    );
    let back = queued_rows(&setup.js).await?;
    assert_eq!(
        back,
        vec![
            (SUBJECT.to_string(), r#"{"id":1}"#.to_string()),
            (SUBJECT.to_string(), r#"{"id":2}"#.to_string()),
            (SUBJECT.to_string(), r#"{"id":3}"#.to_string()),
        ]
    );
    // The non-object stays parked; the other table is untouched.
    let left = dlq.peek("acme", "events", 10).await?;
    assert_eq!(left.len(), 1);
    assert_eq!(left[0].row, "not json at all");
    assert_eq!(dlq.counts().await?.total, 2);
    // Nothing left to replay: a second replay moves nothing again.
    let report = dlq.replay("acme", "events", 100, false).await?;
    assert_eq!((report.replayed, report.skipped), (0, 1), "{report:?}");
    assert_eq!(stream_messages(&setup.js, "INGEST").await?, 3);

    // Purge empties one table.
    assert_eq!(dlq.purge("acme", "events").await?, 1);
    let counts = dlq.counts().await?;
    assert_eq!(counts.total, 1);
    assert_eq!(counts.tables.len(), 1);
    assert_eq!(counts.tables[0].table, "clicks");
    assert_eq!(dlq.purge("acme", "clicks").await?, 1);
    assert_eq!(dlq.counts().await?.total, 0);
    assert!(dlq.peek("acme", "events", 10).await?.is_empty());
    wait_until("the DLQ to be empty", DEADLINE, POLL, || async {
        stream_messages(&setup.js, "DLQ").await.ok() == Some(0)
    })
    .await?;
    Ok(())
}

#[tokio::test]
async fn a_full_dlq_makes_parking_fail_and_keeps_every_row() -> Result<()> {
    let Some(server) = nats_or_skip("a_full_dlq_makes_parking_fail_and_keeps_every_row").await?
    else {
        return Ok(());
    };
    let js = connect(&server).await?;
    // Two DLQs whose budgets differ by half a parked row: whatever room the first one
    // leaves when it first refuses, one of them leaves enough for the sweep below.
    for (round, budget) in [(0, 4096), (1, 4096 + 700)] {
        full_dlq_round(&server, &js, round, budget)
            .await
            .with_context(|| format!("DLQ of {budget} bytes"))?;
    }
    Ok(())
}

/// Parks rows on a DLQ of `budget` bytes until it refuses, then keeps parking rows with
/// ever shorter reasons (3 bytes at a time), so that one of them lands just under the
/// limit: nats-server < 2.10.5 admits such a message by its payload and headers and then
/// deletes the oldest parked row to make room for its overhead. Sluice must refuse it
/// instead: a refused row goes back unacked, and every parked row stays.
async fn full_dlq_round(
    server: &NatsServer,
    js: &jetstream::Context,
    round: u32,
    budget: u64,
) -> Result<()> {
    let mut settings = settings(64 << 20, Duration::from_secs(30));
    settings.stream = format!("INGEST{round}");
    settings.subject_prefix = format!("ingest{round}");
    settings.consumer = format!("sluice{round}");
    settings.dlq_stream = format!("DLQ{round}");
    settings.dlq_subject_prefix = format!("dlq{round}");
    settings.dlq_max_bytes = budget;
    ensure_streams(js, &settings).await?;
    ensure_consumer(js, &settings).await?;
    let ingest = Publisher::new(js.clone(), &settings.stream, settings.max_bytes);
    let dlq_writer = Arc::new(DlqWriter::new(
        Publisher::new(js.clone(), &settings.dlq_stream, settings.dlq_max_bytes),
        settings.dlq_subject_prefix.clone(),
    ));
    let rows = 360u32;
    let subject = format!("ingest{round}.acme.events");
    for i in 0..rows {
        let payload = json!({"id": format!("{i:04}")}).to_string();
        ingest
            .publish(subject.clone(), payload.into(), None, None)
            .await?;
    }
    let mut source = JetStreamSourceFactory::new(js.clone(), settings.clone(), dlq_writer, 100)
        .connect(0)
        .await
        .map_err(|e| anyhow!("{e}"))?;
    let deliveries = pull(&mut source, rows as usize, DEADLINE).await?;

    let mut parked = BTreeSet::new();
    let mut refused = Vec::new();
    let mut reason_len = 1000usize;
    for delivery in deliveries {
        let payload = String::from_utf8_lossy(delivery.payload()).into_owned();
        if !refused.is_empty() {
            reason_len = reason_len.saturating_sub(3);
        }
        let reason = format!("Cannot parse input {}", "r".repeat(reason_len));
        match delivery.park(&rejected("events", Some(27), &reason)).await {
            Ok(()) => {
                parked.insert(payload);
            }
            Err((back, error)) => {
                assert!(
                    error.0.contains("DLQ stream is full") && !error.0.contains("ingest"),
                    "names the stream that is full: {error}"
                );
                assert_eq!(back.payload().as_ref(), payload.as_bytes());
                refused.push(back);
            }
        }
    }
    assert!(!parked.is_empty(), "the DLQ took no row");
    assert!(!refused.is_empty(), "the DLQ took all {rows} rows");

    // Nothing parked was deleted to make room, and the refused rows are still queued
    // (unacked: the caller naks them).
    let held: BTreeSet<String> = stream_contents(js, &settings.dlq_stream)
        .await?
        .into_iter()
        .map(|m| String::from_utf8_lossy(&m.payload).into_owned())
        .collect();
    assert_eq!(held, parked, "nats-server {}", server.version());
    let refused_count = refused.len() as u64;
    for back in refused {
        back.nak(Duration::from_secs(60))
            .await
            .map_err(|e| anyhow!("nak: {e}"))?;
    }
    wait_for_messages(js, &settings.stream, refused_count).await?;
    Ok(())
}

#[tokio::test]
async fn progress_keeps_a_held_row_from_coming_back() -> Result<()> {
    let ack_wait = Duration::from_secs(2);
    let Some(setup) = Setup::start("progress_keeps_a_held_row_from_coming_back", ack_wait).await?
    else {
        return Ok(());
    };
    setup.publish(SUBJECT, r#"{"id": 1}"#).await?;
    let mut source = setup.source().await?;
    let mut held = pull(&mut source, 1, DEADLINE).await?;
    let delivery = held.pop().context("one delivery")?;

    // A long flush holds the row for 2.5 × ack_wait, telling the server it is working.
    let until = Instant::now() + ack_wait * 5 / 2;
    while Instant::now() < until {
        delivery
            .progress()
            .await
            .map_err(|e| anyhow!("progress: {e}"))?;
        // `pull` waits up to half a second for a row: none may come.
        let again = source.pull(1).await.map_err(|e| anyhow!("{e}"))?;
        assert!(again.is_empty(), "a row in progress was delivered again");
    }
    assert_eq!(delivery.meta().deliveries, 1);
    delivery.ack().await.map_err(|e| anyhow!("ack: {e}"))?;
    wait_for_messages(&setup.js, "INGEST", 0).await?;

    // Without progress, ack_wait brings a held row back.
    setup.publish(SUBJECT, r#"{"id": 2}"#).await?;
    let first = pull(&mut source, 1, DEADLINE).await?;
    let held_at = Instant::now();
    let mut again = pull(&mut source, 1, DEADLINE).await?;
    let away = held_at.elapsed();
    assert!(
        away >= ack_wait - Duration::from_millis(200),
        "back after {away:?}"
    );
    let delivery = again.pop().context("redelivered")?;
    assert_eq!(delivery.meta().deliveries, 2);
    delivery.ack().await.map_err(|e| anyhow!("ack: {e}"))?;
    // The first copy's handle is stale now; settling it must not bring the row back.
    for stale in first {
        stale.ack().await.map_err(|e| anyhow!("ack: {e}"))?;
    }
    wait_for_messages(&setup.js, "INGEST", 0).await?;
    Ok(())
}

#[tokio::test]
async fn a_replay_into_a_full_queue_leaves_the_rows_parked() -> Result<()> {
    let Some(server) = nats_or_skip("a_replay_into_a_full_queue_leaves_the_rows_parked").await?
    else {
        return Ok(());
    };
    let js = connect(&server).await?;
    let budget = 2048;
    let settings = settings(budget, Duration::from_secs(30));
    ensure_streams(&js, &settings).await?;
    let dlq_publisher = Publisher::new(js.clone(), &settings.dlq_stream, settings.dlq_max_bytes);
    // Parked rows (as the DLQ writer stores them), more than the ingest queue holds.
    for i in 0..40u32 {
        let row = json!({"id": i, "pad": "w".repeat(40)}).to_string();
        dlq_publisher
            .publish("dlq.acme.events".into(), row.into(), None, None)
            .await?;
    }
    let dlq = Dlq::new(
        js.clone(),
        settings.clone(),
        IngestStreams::new(&js, &settings),
    );
    let report = dlq.replay("acme", "events", 1000, false).await?;
    assert!(report.replayed > 0, "{report:?}");
    assert!(report.failed >= 1, "{report:?}");
    assert!(
        report.errors.iter().any(|e| e.contains("full")),
        "{report:?}"
    );
    // Every row is in exactly one place: back in the queue or still parked.
    let queued = stream_messages(&js, "INGEST").await?;
    let parked = dlq.counts().await?.total;
    assert_eq!(queued, report.replayed, "{report:?}");
    assert_eq!(queued + parked, 40, "{queued} queued, {parked} parked");
    Ok(())
}

/// A replay whose publish went through but whose removal from the DLQ failed, retried
/// after the ingest stream's duplicate window (and after the replayed message was
/// consumed, so JetStream has nothing left to drop it by): the row is removed from the
/// DLQ without being published again (an earlier Sluice published it twice).
#[tokio::test]
async fn a_replay_retried_after_its_removal_failed_does_not_publish_twice() -> Result<()> {
    const WINDOW: Duration = Duration::from_secs(1);
    let Some(server) =
        nats_or_skip("a_replay_retried_after_its_removal_failed_does_not_publish_twice").await?
    else {
        return Ok(());
    };
    let js = connect(&server).await?;
    let settings = StreamSettings {
        duplicate_window: WINDOW,
        ..settings(64 << 20, Duration::from_secs(30))
    };
    ensure_streams(&js, &settings).await?;
    let dlq_publisher = Publisher::new(js.clone(), &settings.dlq_stream, settings.dlq_max_bytes);
    dlq_publisher
        .publish("dlq.acme.events".into(), r#"{"id":1}"#.into(), None, None)
        .await?;
    let dlq = Dlq::new(
        js.clone(),
        settings.clone(),
        IngestStreams::new(&js, &settings),
    );
    // The DLQ refuses deletes: the replay publishes, then cannot remove the row.
    let mut stream = js.get_stream("DLQ").await?;
    let mut config = stream.info().await?.config.clone();
    config.deny_delete = true;
    js.update_stream(config).await?;
    let first = dlq.replay("acme", "events", 10, false).await?;
    assert_eq!((first.replayed, first.failed), (0, 1), "{first:?}");
    assert!(
        first
            .errors
            .iter()
            .any(|e| e.contains("not removed from the DLQ")),
        "{first:?}"
    );
    assert_eq!(stream_messages(&js, "INGEST").await?, 1, "published once");
    // The replayed row is consumed (inserted), and the duplicate window passes.
    let ingest_stream = js.get_stream("INGEST").await?;
    let replayed = ingest_stream
        .get_last_raw_message_by_subject("ingest.acme.events")
        .await?;
    ingest_stream.delete_message(replayed.sequence).await?;
    tokio::time::sleep(WINDOW * 2).await; // the window is the server's clock
                                          // Retried (the row still parked): it is not published again.
    let second = dlq.replay("acme", "events", 10, false).await?;
    assert_eq!((second.replayed, second.failed), (0, 1), "{second:?}");
    assert_eq!(
        stream_messages(&js, "INGEST").await?,
        0,
        "published a second time: {second:?}"
    );
    assert_eq!(dlq.counts().await?.total, 1, "still parked until removed");
    Ok(())
}

/// The consumer as the server sees it: (acks pending, ack floor's stream sequence).
async fn consumer_state(js: &jetstream::Context) -> Result<(usize, u64)> {
    let mut consumer: consumer::PullConsumer = js
        .get_stream("INGEST")
        .await?
        .get_consumer("sluice")
        .await
        .map_err(|e| anyhow!("the consumer: {e}"))?;
    let info = consumer.info().await?;
    Ok((info.num_ack_pending, info.ack_floor.stream_sequence))
}

#[tokio::test]
async fn a_confirmed_ack_covers_the_plain_acks_sent_before_it() -> Result<()> {
    let Some(setup) = Setup::start(
        "a_confirmed_ack_covers_the_plain_acks_sent_before_it",
        Duration::from_secs(30),
    )
    .await?
    else {
        return Ok(());
    };
    let mut sequences = Vec::new();
    for i in 0..3 {
        sequences.push(setup.publish(SUBJECT, format!("{{\"id\":{i}}}")).await?);
    }
    let mut source = setup.source().await?;
    let mut delivered = pull(&mut source, 3, DEADLINE).await?;
    delivered.sort_by_key(|d| d.position().stream_sequence);
    let positions: Vec<Position> = delivered.iter().map(|d| d.position()).collect();
    let first = |stream_sequence| Position {
        stream_sequence,
        deliveries: 1,
    };
    assert_eq!(
        positions,
        sequences.iter().map(|&s| first(s)).collect::<Vec<_>>()
    );

    // Handed back once: the position counts the second delivery.
    let last = delivered.pop().context("three")?;
    last.nak(Duration::ZERO)
        .await
        .map_err(|e| anyhow!("nak: {e}"))?;
    let last = pull(&mut source, 1, DEADLINE)
        .await?
        .pop()
        .context("back")?;
    assert_eq!(
        last.position(),
        Position {
            stream_sequence: sequences[2],
            deliveries: 2
        }
    );
    assert_eq!(last.meta().deliveries, 2);

    // Two plain acks, then a confirmed one: once it returns, JetStream has handled all
    // three (read at once, no waiting).
    for d in delivered {
        d.ack().await.map_err(|e| anyhow!("ack: {e}"))?;
    }
    last.ack_confirmed()
        .await
        .map_err(|e| anyhow!("ack_confirmed: {e}"))?;
    assert_eq!(consumer_state(&setup.js).await?, (0, sequences[2]));
    assert_eq!(stream_messages(&setup.js, "INGEST").await?, 0);
    Ok(())
}

#[tokio::test]
async fn an_ack_nobody_confirms_fails_within_its_bound() -> Result<()> {
    let Some(mut setup) = Setup::start(
        "an_ack_nobody_confirms_fails_within_its_bound",
        Duration::from_secs(30),
    )
    .await?
    else {
        return Ok(());
    };
    setup.publish(SUBJECT, r#"{"id":1}"#).await?;
    let mut source = setup.source().await?;
    let delivery = pull(&mut source, 1, DEADLINE).await?.pop().context("one")?;
    setup.server.sigstop().await?;
    let started = Instant::now();
    let outcome = delivery.ack_confirmed().await;
    let took = started.elapsed();
    setup.server.sigcont().await?;
    let error = outcome.expect_err("a frozen server confirms nothing");
    assert!(error.0.contains("did not confirm an ack"), "{error}");
    assert!(
        took >= Duration::from_secs(4) && took < Duration::from_secs(10),
        "gave up after {took:?}"
    );
    // The ack itself was sent: once the server runs again the row leaves the queue.
    wait_for_messages(&setup.js, "INGEST", 0).await?;
    Ok(())
}

#[tokio::test]
async fn a_row_parked_alone_carries_its_line_is_stored_once_and_replays_alone() -> Result<()> {
    let Some(setup) = Setup::start(
        "a_row_parked_alone_carries_its_line_is_stored_once_and_replays_alone",
        Duration::from_secs(30),
    )
    .await?
    else {
        return Ok(());
    };
    let rows = [r#"{"id":1}"#, r#"{"id":"two"}"#, r#"{"id":"three"}"#];
    let sequence = setup.publish(SUBJECT, rows.join("\n")).await?;
    let mut source = setup.source().await?;
    let delivery = pull(&mut source, 1, DEADLINE).await?.pop().context("one")?;
    let reason = rejected("events", Some(27), "Cannot parse input: expected a number");

    // Line 1 parked twice (its message redelivered after a crash): stored once.
    for line in [1u32, 1, 2] {
        delivery
            .park_row(line, Bytes::from(rows[line as usize]), &reason)
            .await
            .map_err(|e| anyhow!("park_row({line}): {e}"))?;
    }
    let parked = stream_contents(&setup.js, "DLQ").await?;
    let payloads: Vec<&[u8]> = parked.iter().map(|m| m.payload.as_ref()).collect();
    assert_eq!(payloads, vec![rows[1].as_bytes(), rows[2].as_bytes()]);
    for (m, line) in parked.iter().zip(["1", "2"]) {
        assert_eq!(m.subject.as_str(), "dlq.acme.events");
        assert_eq!(header(m, ORIGINAL_LINE_HEADER)?, line);
        assert_eq!(header(m, "Sluice-Tenant")?, "acme");
        assert_eq!(header(m, "Sluice-Table")?, "events");
        assert_eq!(header(m, "Sluice-Error-Class")?, "Rejected");
        assert_eq!(header(m, "Sluice-Error-Code")?, "27");
        assert_eq!(header(m, "Sluice-Error")?, reason.error);
        assert_eq!(header(m, "Sluice-Original-Subject")?, SUBJECT);
        assert_eq!(header(m, "Sluice-Original-Sequence")?, sequence.to_string());
        assert_eq!(header(m, "Sluice-Deliveries")?, "1");
        humantime::parse_rfc3339(&header(m, "Sluice-Parked-At")?)?;
    }
    // The message itself is not acked: its owner acks it once every row is settled.
    assert_eq!(consumer_state(&setup.js).await?.0, 1);
    assert_eq!(stream_messages(&setup.js, "INGEST").await?, 1);
    delivery
        .ack_confirmed()
        .await
        .map_err(|e| anyhow!("ack: {e}"))?;
    assert_eq!(stream_messages(&setup.js, "INGEST").await?, 0);

    // The operator sees which line each was, and a replay sends each back alone, as
    // a one-row message.
    let dlq = setup.dlq();
    let peeked = dlq.peek("acme", "events", 10).await?;
    let lines: Vec<Option<&str>> = peeked
        .iter()
        .map(|r| r.headers.get(ORIGINAL_LINE_HEADER).map(String::as_str))
        .collect();
    assert_eq!(lines, vec![Some("1"), Some("2")]);
    assert_eq!(peeked[0].row, r#"{"id":"two"}"#);
    let report = dlq.replay("acme", "events", 10, false).await?;
    assert_eq!((report.replayed, report.failed), (2, 0), "{report:?}");
    let back = queued_rows(&setup.js).await?;
    assert_eq!(
        back,
        vec![
            (SUBJECT.to_string(), rows[1].to_string()),
            (SUBJECT.to_string(), rows[2].to_string()),
        ]
    );
    assert_eq!(dlq.counts().await?.total, 0);
    Ok(())
}

#[tokio::test]
async fn a_row_that_does_not_fit_the_dlq_fails_with_the_reason_and_stays_queued() -> Result<()> {
    let Some(server) =
        nats_or_skip("a_row_that_does_not_fit_the_dlq_fails_with_the_reason_and_stays_queued")
            .await?
    else {
        return Ok(());
    };
    let js = connect(&server).await?;
    let mut settings = settings(64 << 20, Duration::from_secs(30));
    settings.dlq_max_bytes = 4096;
    ensure_streams(&js, &settings).await?;
    ensure_consumer(&js, &settings).await?;
    let ingest = Publisher::new(js.clone(), &settings.stream, settings.max_bytes);
    let rows: Vec<String> = (0..40)
        .map(|i| json!({"id": i, "pad": "p".repeat(300)}).to_string())
        .collect();
    ingest
        .publish(SUBJECT.into(), rows.join("\n").into(), None, None)
        .await?;
    let dlq_writer = Arc::new(DlqWriter::new(
        Publisher::new(js.clone(), &settings.dlq_stream, settings.dlq_max_bytes),
        settings.dlq_subject_prefix.clone(),
    ));
    let mut source = JetStreamSourceFactory::new(js.clone(), settings.clone(), dlq_writer, 10)
        .connect(0)
        .await
        .map_err(|e| anyhow!("{e}"))?;
    let delivery = pull(&mut source, 1, DEADLINE).await?.pop().context("one")?;
    let reason = rejected("events", Some(27), "Cannot parse input");
    let mut parked = 0;
    let mut refusal = None;
    for (line, row) in rows.iter().enumerate() {
        match delivery
            .park_row(line as u32, Bytes::from(row.clone()), &reason)
            .await
        {
            Ok(()) => parked += 1,
            Err(e) => {
                refusal = Some(e);
                break;
            }
        }
    }
    let refusal = refusal.context("a 4 KiB DLQ took 12 KB of rows")?;
    assert!(
        refusal
            .0
            .contains("the DLQ stream is full ([nats] dlq_max_bytes)")
            && !refusal.0.contains("ingest"),
        "{refusal}"
    );
    assert!(parked > 0, "the DLQ took no row");
    assert_eq!(stream_messages(&js, &settings.dlq_stream).await?, parked);
    // The message stays queued, unacked, for its owner to hand back.
    assert_eq!(stream_messages(&js, &settings.stream).await?, 1);
    delivery
        .nak(Duration::from_secs(60))
        .await
        .map_err(|e| anyhow!("nak: {e}"))?;
    assert_eq!(stream_messages(&js, &settings.stream).await?, 1);
    Ok(())
}

/// Fetches until `n` messages of `consumer` are in hand or the deadline passes.
async fn fetch(consumer: &consumer::PullConsumer, n: usize) -> Result<Vec<jetstream::Message>> {
    use futures::StreamExt;
    let end = Instant::now() + DEADLINE;
    let mut got = Vec::new();
    while got.len() < n {
        ensure!(
            Instant::now() < end,
            "fetched {} of {n} messages within {DEADLINE:?}",
            got.len()
        );
        let mut batch = consumer
            .fetch()
            .max_messages(n - got.len())
            .expires(Duration::from_millis(500))
            .messages()
            .await
            .map_err(|e| anyhow!("fetching: {e}"))?;
        while let Some(message) = batch.next().await {
            got.push(message.map_err(|e| anyhow!("fetching: {e}"))?);
        }
    }
    Ok(got)
}

/// A limits stream `name` (it keeps acked messages, as a crashed or re-elected work
/// queue can) with ten one-row messages, and its durable consumer `sluice`, explicit
/// acks, nothing delivered yet.
async fn ten_rows_kept_after_their_acks(
    js: &jetstream::Context,
    name: &str,
) -> Result<(stream::Stream, consumer::PullConsumer)> {
    let subject = name.to_lowercase();
    js.create_stream(stream::Config {
        name: name.into(),
        subjects: vec![format!("{subject}.>")],
        storage: stream::StorageType::File,
        ..Default::default()
    })
    .await
    .context("creating the stream")?;
    for i in 0..10 {
        js.publish(format!("{subject}.rows"), format!("{{\"id\":{i}}}").into())
            .await?
            .await?;
    }
    let stream = js.get_stream(name).await?;
    let consumer = stream
        .create_consumer(consumer::pull::Config {
            durable_name: Some("sluice".into()),
            ack_policy: consumer::AckPolicy::Explicit,
            ack_wait: Duration::from_secs(30),
            ..Default::default()
        })
        .await
        .map_err(|e| anyhow!("creating the consumer: {e}"))?;
    Ok((stream, consumer))
}

/// Acked rows a crashed nats-server 2.9 kept in the stream are removed, and the rows
/// still awaiting their ack are not touched: they stay pending and come back after a
/// nak. (A stream purge, what Sluice did before, empties a 2.9 consumer's pending list:
/// the naked rows never came back, and stayed in the stream for good.) A limits stream
/// keeps acked messages as the crashed server's work queue does.
#[tokio::test]
async fn acked_rows_left_in_the_stream_go_and_rows_awaiting_their_ack_stay() -> Result<()> {
    let Some(server) =
        nats_or_skip("acked_rows_left_in_the_stream_go_and_rows_awaiting_their_ack_stay").await?
    else {
        return Ok(());
    };
    let js = connect(&server).await?;
    let (_, mut consumer) = ten_rows_kept_after_their_acks(&js, "KEPT").await?;
    let held = fetch(&consumer, 10).await?;
    for message in &held[..3] {
        message
            .double_ack()
            .await
            .map_err(|e| anyhow!("ack: {e}"))?;
    }
    let info = consumer.info().await?.clone();
    assert_eq!(
        (info.ack_floor.stream_sequence, info.num_ack_pending),
        (3, 7)
    );

    // Fresh stream info: the removal starts at the stream's first sequence.
    let stream = js.get_stream("KEPT").await?;
    assert_eq!(remove_stranded(&stream, &info, None).await, 3);
    let state = js.get_stream("KEPT").await?.cached_info().state.clone();
    assert_eq!((state.messages, state.first_sequence), (7, 4));
    let pending = consumer.info().await?.num_ack_pending;
    assert_eq!(
        pending,
        7,
        "nats-server {}: rows awaiting their ack were dropped",
        server.version()
    );

    // Handed back, they come back: none is stranded undelivered.
    for message in &held[3..] {
        message
            .ack_with(jetstream::AckKind::Nak(Some(Duration::from_millis(100))))
            .await
            .map_err(|e| anyhow!("nak: {e}"))?;
    }
    let again = fetch(&consumer, 7).await?;
    let mut sequences = Vec::new();
    for message in &again {
        sequences.push(message.info().map_err(|e| anyhow!("{e}"))?.stream_sequence);
    }
    sequences.sort_unstable();
    assert_eq!(sequences, (4..=10).collect::<Vec<u64>>());
    Ok(())
}

/// A replicated stream can keep messages acked above the consumer's ack floor (its
/// leader moved, nats-server 2.9): the ones this process acked at least the grace ago
/// go, those acked just now and those it never acked stay. A limits stream keeps acked
/// messages as that stream does.
#[tokio::test]
async fn messages_acked_here_above_the_floor_go_once_their_grace_is_over() -> Result<()> {
    let Some(server) =
        nats_or_skip("messages_acked_here_above_the_floor_go_once_their_grace_is_over").await?
    else {
        return Ok(());
    };
    let js = connect(&server).await?;
    let (stream, mut consumer) = ten_rows_kept_after_their_acks(&js, "AHEAD").await?;
    let held = fetch(&consumer, 10).await?;
    for message in &held[6..9] {
        message
            .double_ack()
            .await
            .map_err(|e| anyhow!("ack: {e}"))?;
    }
    let info = consumer.info().await?.clone();
    assert_eq!(info.ack_floor.stream_sequence, 0, "1 to 6 await their acks");

    let acked = AckedHere::default();
    let now = tokio::time::Instant::now();
    let long_ago = now
        .checked_sub(Duration::from_secs(11))
        .context("a clock this young")?;
    acked.record(7, long_ago);
    acked.record(8, long_ago);
    // Acked just now (the server has not been told here; what counts is the grace).
    acked.record(3, now);
    assert_eq!(remove_stranded(&stream, &info, Some((&acked, 0))).await, 2);
    let mut kept = Vec::new();
    for seq in 1..=10 {
        if stream.get_raw_message(seq).await.is_ok() {
            kept.push(seq);
        }
    }
    assert_eq!(
        kept,
        vec![1, 2, 3, 4, 5, 6, 9, 10],
        "nats-server {}: 7 and 8 acked here long enough ago go; 3 acked just now and the rest stay",
        server.version()
    );
    assert_eq!(acked.spans(), 1, "3 is looked at by a later pass");
    Ok(())
}
