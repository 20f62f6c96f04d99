//! Compressed messages on real servers (issue 40): the ingest API stores its messages
//! zstd-compressed under `Sluice-Encoding: zstd` while the stream holds a backlog (or
//! always, with `compress_above = "0%"`), plain otherwise, and every row lands once; another
//! publisher's compressed message lands too; a message whose encoding is unknown or
//! whose frame is corrupt is parked whole with its reason, as it came, and a replay
//! leaves it parked. And `[nats] stream_compression = "s2"`: set where the server has
//! it, refused by name where it does not.

use std::time::Duration;

use anyhow::{bail, Context, Result};
use async_nats::jetstream;
use async_nats::jetstream::stream::Compression;
use async_nats::HeaderMap;
use serde_json::{json, Value};
use sluice::config::{StreamCompression, StreamSettings};
use sluice::nats::ensure_streams;
use sluice_harness::{
    available, wait_for, Mode, NatsFlavor, NatsServer, Respond, Rule, Stack, StackOptions, TENANT,
};

mod ingest_common;

use ingest_common::{wait_exactly, SLUICE};

const DEADLINE: Duration = Duration::from_secs(60);
const POLL: Duration = Duration::from_millis(200);

const EVENTS: &str = "CREATE TABLE events (id UInt64, path String, status UInt16, agent String) ENGINE = MergeTree ORDER BY id";

/// A web-log row of about 150 bytes.
fn row(id: u64) -> String {
    json!({
        "id": id,
        "path": format!("/api/v1/items/{}?page={}", id % 977, id % 13),
        "status": if id % 17 == 0 { 404 } else { 200 },
        "agent": "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko)",
    })
    .to_string()
}

fn rows(ids: std::ops::Range<u64>) -> String {
    ids.map(row).collect::<Vec<_>>().join("\n")
}

async fn jetstream_of(stack: &Stack) -> Result<jetstream::Context> {
    let client = async_nats::connect(stack.nats.url())
        .await
        .context("connecting to NATS")?;
    Ok(jetstream::new(client))
}

/// Publishes one message with `encoding` in `Sluice-Encoding` (none: plain).
async fn publish(js: &jetstream::Context, encoding: Option<&str>, payload: Vec<u8>) -> Result<()> {
    let mut headers = HeaderMap::new();
    if let Some(encoding) = encoding {
        headers.insert("Sluice-Encoding", encoding);
    }
    js.publish_with_headers(format!("ingest.{TENANT}.events"), headers, payload.into())
        .await
        .context("publishing")?
        .await
        .context("the publish ack")?;
    Ok(())
}

/// Waits until exactly `n` messages of `events` are parked; returns them.
async fn parked(stack: &Stack, n: usize) -> Result<Vec<Value>> {
    wait_for(&format!("{n} parked"), DEADLINE, POLL, || async {
        let rows = stack.dlq_rows("events").await?;
        if rows.len() == n {
            Ok(rows)
        } else {
            bail!("{} parked so far", rows.len())
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_stores_its_messages_compressed_and_every_row_lands_once() -> Result<()> {
    let mut stack = Stack::start(StackOptions::default().with_proxy()).await?;
    stack.clickhouse.exec(EVENTS).await?;
    stack.set("api.chunk_rows", 100);
    // Every message, whatever the stream holds.
    stack.set("api.compress_above", "0%");
    stack.set("pipeline.backoff_initial", "200ms");
    stack.set("pipeline.backoff_max", "1s");
    stack.start_sluice(SLUICE).await?;
    let proxy = stack.proxy.as_ref().context("a stack with a proxy")?;
    // ClickHouse takes no insert for now: the messages stay in the stream to be read.
    proxy.add_rule(Rule::contains(
        "INSERT",
        Mode::Respond(Respond::status_only(503)),
    ));

    let body = rows(0..250) + "\n";
    let plain_chunk = rows(0..100).len();
    let (status, reply) = stack
        .ingest_raw("events", "application/x-ndjson", body.into_bytes(), &[])
        .await?;
    assert_eq!(status, 202, "{reply}");
    assert_eq!(reply["accepted"], 250, "{reply}");

    let js = jetstream_of(&stack).await?;
    let stream = js.get_stream("INGEST").await?;
    let first = stream.get_raw_message(1).await?;
    assert_eq!(
        first.headers.get("Sluice-Encoding").map(|v| v.as_str()),
        Some("zstd"),
        "{:?}",
        first.headers
    );
    assert!(
        first.payload.len() * 4 < plain_chunk,
        "a 100-row message of {plain_chunk} bytes was stored in {}",
        first.payload.len()
    );
    let decoded = zstd::bulk::decompress(&first.payload, 1 << 20)?;
    assert_eq!(String::from_utf8(decoded)?, rows(0..100));

    // ClickHouse back: every row lands, once, decoded.
    proxy.clear_rules();
    wait_exactly(&stack, "SELECT count() FROM events", 250).await?;
    assert_eq!(stack.count("SELECT uniqExact(id) FROM events").await?, 250);
    assert_eq!(
        stack
            .count("SELECT count() FROM events WHERE agent LIKE 'Mozilla/5.0%'")
            .await?,
        250
    );
    Ok(())
}

/// The encoding each message of the ingest stream was stored with, in order.
async fn encodings(js: &jetstream::Context) -> Result<Vec<Option<String>>> {
    let stream = js.get_stream("INGEST").await?;
    let state = stream.cached_info().state.clone();
    let mut out = Vec::new();
    for seq in state.first_sequence..=state.last_sequence {
        let message = stream.get_raw_message(seq).await?;
        out.push(
            message
                .headers
                .get("Sluice-Encoding")
                .map(|v| v.as_str().to_owned()),
        );
    }
    Ok(out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_are_compressed_only_while_the_stream_holds_a_backlog() -> Result<()> {
    let mut stack = Stack::start(StackOptions::default().with_proxy()).await?;
    stack.clickhouse.exec(EVENTS).await?;
    stack.set("api.chunk_rows", 100);
    // A backlog from 5% of 4 MiB on (~210 KB: about 1,400 of these rows).
    stack.set("nats.max_bytes", "4MiB");
    stack.set("api.compress_above", "5%");
    stack.set("pipeline.backoff_initial", "200ms");
    stack.set("pipeline.backoff_max", "1s");
    stack.start_sluice(SLUICE).await?;
    let proxy = stack.proxy.as_ref().context("a stack with a proxy")?;
    // ClickHouse takes no insert for now (an outage): the rows wait in the stream.
    proxy.add_rule(Rule::contains(
        "INSERT",
        Mode::Respond(Respond::status_only(503)),
    ));

    let mut next = 0;
    let mut post = |n: u64| {
        let ids = next..next + n;
        next += n;
        rows(ids) + "\n"
    };
    // The stream nearly empty: stored plain.
    let (status, reply) = stack
        .ingest_raw(
            "events",
            "application/x-ndjson",
            post(200).into_bytes(),
            &[],
        )
        .await?;
    assert_eq!((status, &reply["accepted"]), (202, &json!(200)), "{reply}");
    let js = jetstream_of(&stack).await?;
    assert_eq!(
        encodings(&js).await?,
        vec![None, None],
        "two plain messages"
    );
    // Past 5% of the budget (three requests: ~450 KB of rows), the messages that
    // follow are compressed.
    for _ in 0..3 {
        let (status, reply) = stack
            .ingest_raw(
                "events",
                "application/x-ndjson",
                post(1000).into_bytes(),
                &[],
            )
            .await?;
        assert_eq!((status, &reply["accepted"]), (202, &json!(1000)), "{reply}");
    }
    let (status, reply) = stack
        .ingest_raw(
            "events",
            "application/x-ndjson",
            post(200).into_bytes(),
            &[],
        )
        .await?;
    assert_eq!((status, &reply["accepted"]), (202, &json!(200)), "{reply}");
    let stored = encodings(&js).await?;
    assert_eq!(stored.len(), 34, "{stored:?}");
    let last_two = &stored[32..];
    assert_eq!(
        last_two,
        [Some("zstd".to_owned()), Some("zstd".to_owned())],
        "the last request's messages, with a backlog in the stream: {stored:?}"
    );
    let plain = stored.iter().filter(|e| e.is_none()).count();
    assert!(
        (2..32).contains(&plain),
        "plain until the backlog, compressed after: {stored:?}"
    );

    // ClickHouse back: every row lands once, plain and compressed alike.
    proxy.clear_rules();
    wait_exactly(&stack, "SELECT count() FROM events", 3400).await?;
    assert_eq!(stack.count("SELECT uniqExact(id) FROM events").await?, 3400);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_publishers_compress_too_and_what_cannot_be_decoded_is_parked_whole() -> Result<()> {
    let mut stack = Stack::start(StackOptions::default()).await?;
    stack.clickhouse.exec(EVENTS).await?;
    stack.start_sluice(SLUICE).await?;
    let js = jetstream_of(&stack).await?;

    // A producer's own compressed message, in the header's other spelling.
    let packed = zstd::bulk::compress(rows(0..50).as_bytes(), 3)?;
    publish(&js, Some("ZSTD"), packed.clone()).await?;
    // An encoding Sluice does not read, and a zstd frame cut short.
    publish(&js, Some("br"), rows(100..110).into_bytes()).await?;
    let cut = packed[..packed.len() / 2].to_vec();
    publish(&js, Some("zstd"), cut.clone()).await?;
    // And a plain one after them.
    publish(&js, None, rows(200..210).into_bytes()).await?;

    wait_exactly(&stack, "SELECT count() FROM events", 60).await?;
    let parked = parked(&stack, 2).await?;
    // Parked in whichever order their flights settle: told apart by their encoding.
    let by_encoding = |encoding: &str| {
        parked
            .iter()
            .find(|p| p["headers"]["Sluice-Encoding"] == encoding)
            .with_context(|| format!("no row parked with Sluice-Encoding {encoding}: {parked:?}"))
    };
    let unknown = by_encoding("br")?;
    let headers = &unknown["headers"];
    assert_eq!(headers["Sluice-Error-Class"], "Undecodable", "{unknown}");
    assert_eq!(headers["Sluice-Encoding"], "br", "{unknown}");
    let reason = headers["Sluice-Error"].as_str().unwrap_or_default();
    assert!(reason.contains("\"br\""), "{unknown}");
    // Parked as it came: its ten rows, untouched.
    assert_eq!(unknown["row"], Value::String(rows(100..110)), "{unknown}");
    let corrupt = by_encoding("zstd")?;
    assert_eq!(corrupt["headers"]["Sluice-Error-Class"], "Undecodable");
    assert_eq!(corrupt["headers"]["Sluice-Encoding"], "zstd");
    let reason = corrupt["headers"]["Sluice-Error"]
        .as_str()
        .unwrap_or_default();
    assert!(
        reason.starts_with("the payload is not valid zstd"),
        "{corrupt}"
    );
    let m = stack.metrics_parsed().await?;
    let undecodable = [
        ("tenant", TENANT),
        ("table", "events"),
        ("reason", "undecodable"),
    ];
    assert_eq!(m.value("sluice_rows_parked_total", &undecodable), Some(2.0));

    // A replay cannot decode them either: they stay parked, and nothing is inserted.
    let (status, _, report) = stack
        .admin_request(
            reqwest::Method::POST,
            "/admin/dlq/replay",
            Some(sluice_harness::ADMIN_TOKEN),
            Some(&json!({"tenant": TENANT, "table": "events", "limit": 10, "dry_run": false})),
        )
        .await?;
    assert_eq!(status, 200, "{report}");
    assert_eq!(report["replayed"], 0, "{report}");
    assert_eq!(report["skipped"], 2, "{report}");
    assert_eq!(stack.dlq_rows("events").await?.len(), 2);
    assert_eq!(stack.count("SELECT count() FROM events").await?, 60);
    Ok(())
}

/// `[nats] stream_compression`: S2 on both streams where the server has it (2.10+), off
/// again when the setting is; refused with the server's version named on 2.9.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_compression_is_set_where_the_server_has_it_and_refused_by_name_where_not(
) -> Result<()> {
    let test = "stream_compression_is_set_where_the_server_has_it_and_refused_by_name_where_not";
    let flavor = NatsFlavor::from_env()?;
    if available(test, flavor.binary())?.is_none() {
        return Ok(());
    }
    let server = NatsServer::start(flavor).await?;
    let js = jetstream::new(async_nats::connect(server.url()).await?);
    let mut settings = StreamSettings {
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
        stream_compression: StreamCompression::S2,
        partitions: 1,
    };
    let version = js.client().server_info().version;
    let compression_of = |name: &'static str| {
        let js = js.clone();
        async move {
            let mut stream = js.get_stream(name).await?;
            anyhow::Ok(stream.info().await?.config.compression.clone())
        }
    };
    if version.starts_with("2.9.") {
        let e = ensure_streams(&js, &settings)
            .await
            .expect_err("2.9 cannot compress a stream");
        assert!(
            e.to_string()
                .contains(&format!("nats-server {version} cannot compress a stream")),
            "{e:#}"
        );
        // Nothing was made half-way: the setting off, the streams are made as before.
        settings.stream_compression = StreamCompression::None;
        ensure_streams(&js, &settings).await?;
        return Ok(());
    }
    ensure_streams(&js, &settings).await?;
    assert_eq!(compression_of("INGEST").await?, Some(Compression::S2));
    assert_eq!(compression_of("DLQ").await?, Some(Compression::S2));
    settings.stream_compression = StreamCompression::None;
    ensure_streams(&js, &settings).await?;
    assert_eq!(compression_of("INGEST").await?, Some(Compression::None));
    assert_eq!(compression_of("DLQ").await?, Some(Compression::None));
    Ok(())
}
