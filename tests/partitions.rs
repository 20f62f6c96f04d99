//! The ingest queue in partitions (`[nats] partitions`, issue 40) on real servers: rows
//! sent to the API and published by others (through the nats-server's subject mapping,
//! by table or by a key that spreads one table) land once, spread over every
//! partition's stream, each consumed by its own ConsumerActor; and changing the number
//! of partitions with rows waiting (ClickHouse refusing inserts) moves every waiting
//! row to the new layout, removes the old streams, and lands each row once.

use std::time::Duration;

use anyhow::{bail, Context, Result};
use async_nats::jetstream;
use serde_json::{json, Value};
use sluice_actors::server_mapping;
use sluice_harness::{wait_for, Mode, Respond, Rule, Stack, StackOptions, TENANT};

mod ingest_common;

use ingest_common::{wait_exactly, SLUICE};

const DEADLINE: Duration = Duration::from_secs(60);
const POLL: Duration = Duration::from_millis(200);

const EVENTS: &str = "CREATE TABLE events (id UInt64, v String) ENGINE = MergeTree ORDER BY id";

fn body(ids: std::ops::Range<u64>) -> Vec<u8> {
    ids.map(|id| json!({"id": id, "v": "x".repeat(20)}).to_string() + "\n")
        .collect::<String>()
        .into_bytes()
}

async fn post(stack: &Stack, ids: std::ops::Range<u64>) -> Result<()> {
    let n = ids.end - ids.start;
    let (status, reply) = stack
        .ingest_raw("events", "application/x-ndjson", body(ids), &[])
        .await?;
    if status != 202 || reply["accepted"] != json!(n) {
        bail!("ingest answered {status} {reply}");
    }
    Ok(())
}

async fn jetstream_of(stack: &Stack) -> Result<jetstream::Context> {
    let client = async_nats::connect(stack.nats.url())
        .await
        .context("connecting to NATS")?;
    Ok(jetstream::new(client))
}

/// Messages stored in `stream` (since it was made: its last sequence), or `None`
/// when there is no such stream.
async fn stored(js: &jetstream::Context, stream: &str) -> Result<Option<u64>> {
    match js.get_stream(stream).await {
        Ok(mut s) => Ok(Some(s.info().await?.state.last_sequence)),
        Err(e) if e.to_string().contains("stream not found") => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Messages waiting in `stream` now (0 when there is no such stream).
async fn waiting(js: &jetstream::Context, stream: &str) -> Result<u64> {
    match js.get_stream(stream).await {
        Ok(mut s) => Ok(s.info().await?.state.messages),
        Err(e) if e.to_string().contains("stream not found") => Ok(0),
        Err(e) => Err(e.into()),
    }
}

fn partitioned(options: StackOptions, partitions: usize) -> StackOptions {
    options.with_nats_config(server_mapping("ingest", partitions))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_spread_over_three_partitions_and_every_row_lands_once() -> Result<()> {
    let mut stack = Stack::start(partitioned(StackOptions::default(), 3)).await?;
    stack.clickhouse.exec(EVENTS).await?;
    stack.set("nats.partitions", 3);
    stack.set("ingest.exactly_once", false);
    // Ten rows a message: 60 messages from the API, at random over the partitions.
    stack.set("api.chunk_rows", 10);
    stack.start_sluice(SLUICE).await?;

    for i in 0..6 {
        post(&stack, i * 100..(i + 1) * 100).await?;
    }
    // Another publisher, on the subjects the mapping partitions: by table, and by a
    // key after the table (one table over every partition).
    let js = jetstream_of(&stack).await?;
    for id in 600..900u64 {
        let subject = match id % 2 {
            0 => format!("ingest.{TENANT}.events"),
            _ => format!("ingest.{TENANT}.events.user-{id}"),
        };
        let row = json!({"id": id, "v": "p"}).to_string();
        js.publish(subject, row.into())
            .await
            .context("publishing")?
            .await
            .context("the publish ack")?;
    }

    wait_exactly(&stack, "SELECT count() FROM events", 900).await?;
    assert_eq!(stack.count("SELECT uniqExact(id) FROM events").await?, 900);
    // Every partition took some: 360 messages, each partition's share far from 0.
    let mut counts = Vec::new();
    for n in 0..3 {
        counts.push(stored(&js, &format!("INGEST_{n}")).await?.unwrap_or(0));
    }
    assert_eq!(counts.iter().sum::<u64>(), 360, "{counts:?}");
    assert!(counts.iter().all(|&c| c >= 40), "{counts:?}");
    assert_eq!(
        stored(&js, "INGEST").await?,
        None,
        "no unpartitioned stream"
    );
    // A consumer actor per partition, each on its stream, the service ready.
    let (status, tree) = stack.admin_get("/admin/actors").await?;
    assert_eq!(status, 200, "{tree}");
    let consumers: Vec<(String, String)> = tree["children"]
        .as_array()
        .context("the root's children")?
        .iter()
        .filter(|c| c["kind"] == "consumer")
        .map(|c| {
            (
                c["name"].as_str().unwrap_or_default().to_owned(),
                c["status"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        consumers,
        [
            ("INGEST_0".to_owned(), "running".to_owned()),
            ("INGEST_1".to_owned(), "running".to_owned()),
            ("INGEST_2".to_owned(), "running".to_owned())
        ],
        "{tree}"
    );
    let (status, ready) = stack.admin_get("/readyz").await?;
    assert_eq!(status, 200, "{ready}");
    // Other publishers' subjects reach the queue through the mapping, and asking so
    // stored nothing (the 360 above are all the messages there are).
    let publishers = publisher_routes(&stack).await?;
    assert_eq!(
        (&publishers["asked"], &publishers["astray"]),
        (&json!(16), &json!(0)),
        "{publishers}"
    );
    Ok(())
}

/// `/admin/nats`'s `publishers`, once the first check answered.
async fn publisher_routes(stack: &Stack) -> Result<Value> {
    wait_for(
        "the check of the publishers' subjects",
        DEADLINE,
        POLL,
        || async {
            let (status, nats) = stack.admin_get("/admin/nats").await?;
            match &nats["publishers"] {
                _ if status != 200 => bail!("/admin/nats answered {status}: {nats}"),
                Value::Null => bail!("not checked yet"),
                publishers => Ok(publishers.clone()),
            }
        },
    )
    .await
}

/// Three partitions on a server without the subject mapping: Sluice's own API still
/// lands every row, but what other publishers publish on `ingest.<tenant>.<table>`
/// reaches no stream ("no responders"), and Sluice says so: `/admin/nats` names such a
/// subject, the gauge counts every subject asked, and a WARN tells what to give the
/// server. Asking stores nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_without_the_subject_mapping_is_reported() -> Result<()> {
    let mut stack = Stack::start(StackOptions::default()).await?;
    stack.clickhouse.exec(EVENTS).await?;
    stack.set("nats.partitions", 3);
    stack.start_sluice(SLUICE).await?;
    post(&stack, 0..100).await?;
    wait_exactly(&stack, "SELECT count() FROM events", 100).await?;

    let publishers = publisher_routes(&stack).await?;
    assert_eq!(
        (&publishers["asked"], &publishers["astray"]),
        (&json!(16), &json!(16)),
        "{publishers}"
    );
    let example = &publishers["examples"][0];
    assert_eq!(
        (&example["subject"], &example["reached"]),
        (&json!("ingest.sluice_route_check.t0"), &Value::Null),
        "{publishers}"
    );
    let astray = stack
        .metrics_parsed()
        .await?
        .value("sluice_nats_subjects_astray", &[]);
    assert_eq!(astray, Some(16.0));
    let output = stack.sluice_output(0)?;
    assert!(
        output.contains("give the nats-server the subject mapping for [nats] partitions = 3"),
        "{output}"
    );
    // A publisher on the table's subject is refused, nothing stored for it.
    let js = jetstream_of(&stack).await?;
    let refused = match js
        .publish(format!("ingest.{TENANT}.events"), "{}".into())
        .await
    {
        Ok(ack) => ack.await.err(),
        Err(e) => Some(e),
    };
    assert!(refused.is_some(), "stored without a mapping");
    let mut stored_total = 0;
    for n in 0..3 {
        stored_total += stored(&js, &format!("INGEST_{n}")).await?.unwrap_or(0);
    }
    // Only the API's messages (one chunk of 100 rows by default: at most 100).
    assert!((1..=100).contains(&stored_total), "{stored_total}");
    Ok(())
}

/// Stops sluice process `index` (SIGTERM: a graceful shutdown).
async fn stop(stack: &mut Stack, index: usize) -> Result<()> {
    stack.sluice[index].sigterm()?;
    stack.sluice[index]
        .wait_exit(Duration::from_secs(30))
        .await
        .map(|_| ())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changing_the_partitions_moves_every_waiting_row_once() -> Result<()> {
    // No subject mapping: the API publishes on the layout of its configuration (a
    // mapping belongs with the partitions it names, changed with them).
    let mut stack = Stack::start(StackOptions::default().with_proxy()).await?;
    stack.clickhouse.exec(EVENTS).await?;
    stack.set("ingest.exactly_once", false);
    stack.set("api.chunk_rows", 10);
    stack.set("pipeline.backoff_initial", "200ms");
    stack.set("pipeline.backoff_max", "1s");
    // A stop hands back what is held without waiting on inserts that cannot go.
    stack.set("pipeline.shutdown_deadline", "1s");
    // In most runs one message of a stopped instance stays pending until ack_wait
    // (consumer info meanwhile: ack_pending 1, redelivered 1, though the instance
    // handed back all 500 rows at its stop; cause not found): a short ack_wait keeps
    // each change's wait short.
    stack.set("nats.ack_wait", "5s");
    let proxy = stack.proxy.as_ref().context("a stack with a proxy")?;
    // ClickHouse takes no insert: the rows wait in the queue through both changes.
    proxy.add_rule(Rule::contains(
        "INSERT",
        Mode::Respond(Respond::status_only(503)),
    ));
    let js = jetstream_of(&stack).await?;

    // One partition: 500 rows wait in INGEST.
    let first = stack.start_sluice(SLUICE).await?;
    post(&stack, 0..500).await?;
    stop(&mut stack, first).await?;
    assert_eq!(waiting(&js, "INGEST").await?, 50);

    // Three: INGEST's 50 messages move to INGEST_0..2, and INGEST is removed.
    stack.set("nats.partitions", 3);
    let second = stack.start_sluice(SLUICE).await?;
    wait_for("INGEST drained and removed", DEADLINE, POLL, || async {
        match stored(&js, "INGEST").await? {
            None => Ok(()),
            Some(_) => bail!("INGEST still holds {}", waiting(&js, "INGEST").await?),
        }
    })
    .await?;
    post(&stack, 500..800).await?;
    let mut held = 0;
    for n in 0..3 {
        held += waiting(&js, &format!("INGEST_{n}")).await?;
    }
    assert_eq!(
        held, 80,
        "50 moved and 30 new messages wait in the partitions"
    );
    stop(&mut stack, second).await?;

    // Back to one: the partitions' messages move to INGEST, the partitions go.
    stack.set("nats.partitions", 1);
    stack.start_sluice(SLUICE).await?;
    wait_for(
        "INGEST_0..2 drained and removed",
        DEADLINE,
        POLL,
        || async {
            let mut left = Vec::new();
            for n in 0..3 {
                let name = format!("INGEST_{n}");
                if stored(&js, &name).await?.is_some() {
                    left.push(name);
                }
            }
            match left.is_empty() {
                true => Ok(()),
                false => bail!("still there: {left:?}"),
            }
        },
    )
    .await?;
    assert_eq!(waiting(&js, "INGEST").await?, 80);

    // ClickHouse takes inserts again: every row, once.
    stack
        .proxy
        .as_ref()
        .context("a stack with a proxy")?
        .clear_rules();
    wait_exactly(&stack, "SELECT count() FROM events", 800).await?;
    assert_eq!(stack.count("SELECT uniqExact(id) FROM events").await?, 800);
    let parked: Vec<Value> = stack.dlq_rows("events").await?;
    assert!(parked.is_empty(), "nothing parked: {parked:?}");
    Ok(())
}
