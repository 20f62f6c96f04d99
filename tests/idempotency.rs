//! `Idempotency-Key` on real servers, as a client sees it (the IETF draft's rules): a
//! key belongs to its tenant and table; the same key and body again get the first
//! answer, on any instance, across restarts of Sluice and nats-server; another body
//! under a used key is 422; a retry while the first request is in progress is 409;
//! a claim left by a crashed Sluice lapses after its lease; a request ended by a 503
//! stores only its missing rows when sent again.

mod ingest_common;

use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use ingest_common::{
    filling_stack, ndjson, post, post_to, settled_with, stack_with, wait_exactly, Reply, AS_TENANT,
    EVENTS, JSON, LAND, NDJSON, SLUICE,
};
use serde_json::{json, Value};
use sluice::api::ingest::idempotency;
use sluice::api::ingest::parse::Framing;
use sluice::nats::chunk_message_id;
use sluice_harness::{wait_for, wait_until, Metrics, Stack, TENANT};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tokio::time::Instant;

const EVENTS2: &str =
    "CREATE TABLE events2 (id UInt64, name String) ENGINE = MergeTree ORDER BY id";

fn rows(ids: std::ops::Range<u64>, name: &str) -> String {
    ndjson(ids.map(|id| json!({"id": id, "name": name})))
}

fn keyed(key: &str) -> [(&str, &str); 3] {
    [AS_TENANT, NDJSON, ("Idempotency-Key", key)]
}

fn replayed(r: &Reply) -> bool {
    r.headers
        .get("idempotent-replayed")
        .and_then(|v| v.to_str().ok())
        == Some("true")
}

/// A keyed request answered again must be the first answer: status and body.
fn assert_first_answer(again: &Reply, first: &Reply) {
    assert_eq!(
        (again.status, &again.body),
        (first.status, &first.body),
        "not the first answer: {again} (first: {first})"
    );
    assert!(replayed(again), "not marked as a replay: {again}");
}

/// Posts until the answer is not a 503 (NATS coming back); the first other answer.
async fn post_until_answered(
    http: &reqwest::Client,
    stack: &Stack,
    table: &str,
    body: &str,
    headers: &[(&str, &str)],
) -> Result<Reply> {
    wait_for(
        "an answer other than 503",
        LAND,
        Duration::from_millis(250),
        || async move {
            let r = post(http, stack, table, body.to_string(), headers).await?;
            if r.status == 503 {
                bail!("{r}")
            }
            Ok(r)
        },
    )
    .await
}

/// Waits until the instance's `sluice_ingest_idempotency_total{outcome}` reaches `n`.
async fn wait_outcome(stack: &Stack, index: usize, outcome: &str, n: f64) -> Result<()> {
    wait_until(
        &format!("{n} keys {outcome}"),
        Duration::from_secs(10),
        Duration::from_millis(20),
        || async move {
            let Ok(text) = stack.metrics_of(index).await else {
                return false;
            };
            Metrics::parse(&text)
                .ok()
                .and_then(|m| m.value("sluice_ingest_idempotency_total", &[("outcome", outcome)]))
                >= Some(n)
        },
    )
    .await
}

/// A request whose headers and first body bytes are sent and whose rest is held back:
/// it is in progress (its body still being read) until [`Trickled::finish`].
struct Trickled {
    stream: TcpStream,
    rest: Vec<u8>,
}

impl Trickled {
    async fn start(port: u16, table: &str, key: &str, body: &str) -> Result<Self> {
        let mut stream = TcpStream::connect(("127.0.0.1", port)).await?;
        let head = format!(
            "POST /v1/ingest/{table} HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Tenant: {}\r\nContent-Type: application/x-ndjson\r\nIdempotency-Key: {key}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            AS_TENANT.1,
            body.len()
        );
        let (first, rest) = body.as_bytes().split_at(body.len() / 2);
        stream.write_all(head.as_bytes()).await?;
        stream.write_all(first).await?;
        stream.flush().await?;
        Ok(Self {
            stream,
            rest: rest.to_vec(),
        })
    }

    /// Sends the rest of the body; the answer's status and body.
    async fn finish(mut self) -> Result<(u16, Value)> {
        self.stream.write_all(&self.rest).await?;
        let mut answer = Vec::new();
        tokio::time::timeout(LAND, self.stream.read_to_end(&mut answer))
            .await
            .context("no answer to the trickled request")??;
        let text = String::from_utf8_lossy(&answer);
        let status = text
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .with_context(|| format!("not an HTTP answer: {text:?}"))?;
        let body = text
            .split_once("\r\n\r\n")
            .map(|(_, body)| body)
            .unwrap_or_default();
        Ok((status, serde_json::from_str(body)?))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_belongs_to_its_tenant_and_table() -> Result<()> {
    // The README's own example key, used by two tenants and for two tables.
    let stack = stack_with(
        &[EVENTS, EVENTS2],
        &[("tenants.globex.target", "main".into())],
    )
    .await?;
    let http = stack.http().clone();
    let key = ("Idempotency-Key", "batch-0001");
    for (tenant, table, ids) in [
        ("acme", "events", 1..4),
        ("globex", "events", 11..14),
        ("acme", "events2", 21..24),
    ] {
        let body = rows(ids, tenant);
        let r = post(
            &http,
            &stack,
            table,
            body,
            &[("X-Tenant", tenant), NDJSON, key],
        )
        .await?;
        assert_eq!(
            (r.status, r.n("accepted"), r.n("duplicates")),
            (202, 3, 0),
            "{tenant} to {table}: {r}"
        );
        assert!(!replayed(&r), "{tenant} to {table}: {r}");
    }
    wait_exactly(&stack, "SELECT count() FROM events", 6).await?;
    wait_exactly(&stack, "SELECT count() FROM events2", 3).await?;
    assert_eq!(
        stack
            .count("SELECT count() FROM events WHERE name = 'globex'")
            .await?,
        3
    );
    Ok(())
}

/// issue 37.2: a second deployment on the same NATS (staging beside production),
/// given its own names as docs/deploy.md lists them and left to share the
/// idempotency bucket: a key production used is another request there. The same key
/// and body are stored by staging too (not answered with production's answer, storing
/// nothing), and another body under a key production used is stored, not refused 422.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_deployment_sharing_the_bucket_never_takes_the_first_ones_answers() -> Result<()> {
    let mut stack = stack_with(&[EVENTS], &[]).await?;
    stack.clickhouse.exec("CREATE DATABASE staging").await?;
    stack
        .clickhouse
        .exec("CREATE TABLE staging.events (id UInt64, name String) ENGINE = MergeTree ORDER BY id")
        .await?;
    stack.fresh_ports()?;
    for (key, value) in [
        ("nats.stream", "STAGING"),
        ("nats.dlq_stream", "STAGING_DLQ"),
        ("nats.subject_prefix", "staging"),
        ("nats.dlq_subject_prefix", "staging_dlq"),
        ("nats.manifest_bucket", "STAGING_MANIFESTS"),
        ("clickhouse.targets.main.database", "staging"),
    ] {
        stack.set(key, value);
    }
    let staging = stack.start_sluice(SLUICE).await?;
    let http = stack.http().clone();
    let (production_url, staging_url) = (stack.api_url_of(0)?, stack.api_url_of(staging)?);

    let body = rows(1..4, "same");
    let first = post_to(
        &http,
        &production_url,
        "events",
        body.clone(),
        &keyed("batch-0001"),
    )
    .await?;
    assert_eq!((first.status, first.n("accepted")), (202, 3), "{first}");
    let there = post_to(&http, &staging_url, "events", body, &keyed("batch-0001")).await?;
    assert!(
        !replayed(&there),
        "staging answered with production's answer: {there}"
    );
    assert_eq!(
        (there.status, there.n("accepted"), there.n("duplicates")),
        (202, 3, 0),
        "{there}"
    );

    let mine = post_to(
        &http,
        &production_url,
        "events",
        rows(4..6, "p"),
        &keyed("batch-0002"),
    )
    .await?;
    assert_eq!(mine.status, 202, "{mine}");
    let other = post_to(
        &http,
        &staging_url,
        "events",
        rows(6..8, "s"),
        &keyed("batch-0002"),
    )
    .await?;
    assert_eq!(
        (other.status, other.n("accepted")),
        (202, 2),
        "another body under a key production used: {other}"
    );

    wait_exactly(&stack, "SELECT count() FROM events", 5).await?;
    wait_exactly(&stack, "SELECT count() FROM staging.events", 5).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_key_and_body_get_the_first_answer_on_any_instance_and_after_a_restart(
) -> Result<()> {
    let mut stack = stack_with(&[EVENTS], &[]).await?;
    stack.fresh_ports()?;
    let second = stack.start_sluice(SLUICE).await?;
    let http = stack.http().clone();
    let (first_url, second_url) = (stack.api_url_of(0)?, stack.api_url_of(second)?);

    // Two good rows and a bad one: the first answer is a 400 listing the refusal.
    let body = "{\"id\": 1, \"name\": \"a\"}\nnot json\n{\"id\": 2, \"name\": \"b\"}\n";
    let first = post_to(&http, &first_url, "events", body, &keyed("order-77")).await?;
    assert_eq!(
        (first.status, first.n("accepted"), first.n("rejected")),
        (400, 2, 1),
        "{first}"
    );
    assert!(!replayed(&first), "{first}");

    // The retry lands on the other instance: the same answer, nothing stored again.
    let again = post_to(&http, &second_url, "events", body, &keyed("order-77")).await?;
    assert_first_answer(&again, &first);
    // The draft's form of the header, a quoted string, is the same key.
    let quoted = post_to(&http, &second_url, "events", body, &keyed("\"order-77\"")).await?;
    assert_first_answer(&quoted, &first);

    // Sluice restarted: the key's record is in JetStream, not in the process.
    stack.sluice[0].restart().await?;
    stack.wait_ready(0, LAND).await?;
    let again = post_to(&http, &first_url, "events", body, &keyed("order-77")).await?;
    assert_first_answer(&again, &first);

    // Nothing stored twice: a row sent after the retries lands after any duplicate.
    settled_with(&stack, 100, 3).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_body_under_a_used_key_is_422_and_stores_nothing() -> Result<()> {
    let stack = stack_with(&[EVENTS], &[]).await?;
    let http = stack.http().clone();
    let first = post(&http, &stack, "events", rows(1..4, "first"), &keyed("k-1")).await?;
    assert_eq!((first.status, first.n("accepted")), (202, 3), "{first}");

    let other = post(
        &http,
        &stack,
        "events",
        rows(10..13, "other"),
        &keyed("k-1"),
    )
    .await?;
    assert_eq!(other.status, 422, "{other}");
    assert_eq!(other.n("accepted"), 0, "{other}");
    assert!(
        other.body["error"]
            .as_str()
            .is_some_and(|e| e.contains("another body")),
        "{other}"
    );
    // The same rows framed as a JSON array are another body too.
    let array =
        json!([{"id": 1, "name": "first"}, {"id": 2, "name": "first"}, {"id": 3, "name": "first"}]);
    let r = post(
        &http,
        &stack,
        "events",
        array.to_string(),
        &[AS_TENANT, JSON, ("Idempotency-Key", "k-1")],
    )
    .await?;
    assert_eq!(r.status, 422, "{r}");

    // The first body still gets its answer.
    let again = post(&http, &stack, "events", rows(1..4, "first"), &keyed("k-1")).await?;
    assert_first_answer(&again, &first);
    settled_with(&stack, 100, 4).await?;
    assert_eq!(
        stack
            .count("SELECT count() FROM events WHERE name = 'other'")
            .await?,
        0
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_while_the_first_request_is_in_progress_is_409() -> Result<()> {
    let stack = stack_with(&[EVENTS], &[]).await?;
    let http = stack.http().clone();
    let body = rows(1..4, "slow");

    // The first request's body comes slowly: it holds the key meanwhile.
    let slow = Trickled::start(stack.api_port, "events", "slow-1", &body).await?;
    wait_outcome(&stack, 0, "claimed", 1.0).await?;
    let busy = post(&http, &stack, "events", body.clone(), &keyed("slow-1")).await?;
    assert_eq!((busy.status, busy.n("accepted")), (409, 0), "{busy}");
    assert!(busy.headers.contains_key("retry-after"), "{busy}");
    assert!(
        busy.body["error"]
            .as_str()
            .is_some_and(|e| e.contains("in progress")),
        "{busy}"
    );

    // The first request completes; the retry then gets its answer.
    let (status, first) = slow.finish().await?;
    assert_eq!(
        (status, first["accepted"].as_u64()),
        (202, Some(3)),
        "{first}"
    );
    let again = post(&http, &stack, "events", body, &keyed("slow-1")).await?;
    assert_eq!((again.status, &again.body), (202, &first), "{again}");
    assert!(replayed(&again), "{again}");
    wait_exactly(&stack, "SELECT count() FROM events", 3).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_left_by_a_crashed_sluice_lapses_after_its_lease() -> Result<()> {
    // A lease of twice body_timeout (10 s), lapsed 10 s after that.
    const LAPSES_AFTER: Duration = Duration::from_secs(20);
    let mut stack = stack_with(&[EVENTS], &[("api.body_timeout", "5s".into())]).await?;
    let http = stack.http().clone();
    let body = rows(1..4, "crash");

    let slow = Trickled::start(stack.api_port, "events", "crash-1", &body).await?;
    wait_outcome(&stack, 0, "claimed", 1.0).await?;
    let claimed = Instant::now();
    stack.sluice[0].kill9().await?;
    drop(slow);
    stack.restart_sluice(0).await?;

    // The dead request's claim still holds the key...
    let busy = post(&http, &stack, "events", body.clone(), &keyed("crash-1")).await?;
    ensure!(
        claimed.elapsed() < LAPSES_AFTER - Duration::from_secs(3),
        "the restart took {:?}: too long to see the claim held",
        claimed.elapsed()
    );
    assert_eq!(busy.status, 409, "{busy}");
    // ...until it lapses; then the retry takes the key over and stores the rows once.
    let taken = wait_for(
        "the lapsed claim taken over",
        LAPSES_AFTER + Duration::from_secs(20),
        Duration::from_millis(500),
        || {
            let (http, stack, body) = (&http, &stack, body.clone());
            async move {
                let r = post(http, stack, "events", body, &keyed("crash-1")).await?;
                match r.status {
                    409 => bail!("{r}"),
                    _ => Ok(r),
                }
            }
        },
    )
    .await?;
    assert_eq!((taken.status, taken.n("accepted")), (202, 3), "{taken}");
    let held = claimed.elapsed();
    assert!(
        held >= Duration::from_secs(10),
        "the key was taken over after {held:?}, within the claim's lease"
    );
    wait_outcome(&stack, 0, "taken_over", 1.0).await?;
    wait_exactly(&stack, "SELECT count() FROM events", 3).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_answer_holds_across_a_nats_server_restart() -> Result<()> {
    let mut stack = stack_with(&[EVENTS], &[]).await?;
    let http = stack.http().clone();
    let body = rows(1..4, "before");
    let first = post(&http, &stack, "events", body.clone(), &keyed("restart-1")).await?;
    assert_eq!((first.status, first.n("accepted")), (202, 3), "{first}");
    // Inserted and acked: the work queue no longer holds the messages, and a restarted
    // nats-server no longer knows their ids.
    wait_exactly(&stack, "SELECT count() FROM events", 3).await?;

    stack.nats.stop().await?;
    stack.nats.start_again().await?;
    let again = post_until_answered(&http, &stack, "events", &body, &keyed("restart-1")).await?;
    assert_first_answer(&again, &first);
    let other = post(
        &http,
        &stack,
        "events",
        rows(7..9, "other"),
        &keyed("restart-1"),
    )
    .await?;
    assert_eq!(other.status, 422, "{other}");

    settled_with(&stack, 100, 4).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_ended_by_a_503_stores_only_its_missing_rows_even_after_a_nats_restart(
) -> Result<()> {
    // Messages of 10 rows (~3.3 KB): the stream takes some of a request's, not all.
    let mut stack = filling_stack("64KiB", &[("api.chunk_rows", 10.into())]).await?;
    let http = stack.http().clone();
    let pad = "p".repeat(300);
    let padded = |ids: std::ops::Range<u64>| ndjson(ids.map(|id| json!({"id": id, "name": pad})));
    let fill = post(&http, &stack, "events", padded(0..150), &keyed("fill-1")).await?;
    assert_eq!((fill.status, fill.n("accepted")), (202, 150), "{fill}");
    let body = padded(150..250);
    let first = post(&http, &stack, "events", body.clone(), &keyed("order-9")).await?;
    assert_eq!(first.status, 503, "{first}");
    let stored = first.n("accepted");
    assert!(stored > 0 && stored < 100, "not full mid-request: {first}");

    // The stored rows are inserted and acked, and nats-server restarts: it no longer
    // knows their messages' ids, but the key's record lists their chunks.
    stack.clickhouse.start_again().await?;
    wait_exactly(&stack, "SELECT count() FROM events", 150 + stored).await?;
    stack.nats.stop().await?;
    stack.nats.start_again().await?;
    let done = post_until_answered(&http, &stack, "events", &body, &keyed("order-9")).await?;
    assert_eq!(
        (done.status, done.n("accepted"), done.n("duplicates")),
        (202, 100, stored),
        "{done}"
    );
    assert!(
        !replayed(&done),
        "a resumed request is not a replay: {done}"
    );
    wait_exactly(&stack, "SELECT count() FROM events", 250).await?;
    assert_eq!(
        stack.count("SELECT count(DISTINCT id) FROM events").await?,
        250
    );
    // Now answered for good: the same body again gets that answer.
    let again = post(&http, &stack, "events", body, &keyed("order-9")).await?;
    assert_first_answer(&again, &done);
    Ok(())
}

/// Marks chunk `index` of the keyed NDJSON request (`key`, `body`) to `events` landed,
/// as the consumer does before it acks a keyed chunk (`nats::LandedChunks`).
async fn plant_landed_mark(stack: &Stack, key: &str, body: &str, index: usize) -> Result<()> {
    let mut headers = axum::http::HeaderMap::new();
    headers.insert("idempotency-key", key.parse()?);
    let key = idempotency::from_headers(&headers)
        .map_err(|e| anyhow::anyhow!("{e}"))?
        .context("no key")?;
    let stem = idempotency::ScopedKey::new("INGEST", TENANT, "events", key).message_stem(
        &idempotency::Fingerprint::of(Framing::Ndjson, body.as_bytes()),
    );
    let client = async_nats::connect(stack.nats.url()).await?;
    let kv = async_nats::jetstream::new(client)
        .get_key_value("SLUICE_IDEMPOTENCY")
        .await
        .context("the idempotency bucket")?;
    kv.put(
        format!("landed.{}", chunk_message_id(&stem, index)),
        bytes::Bytes::new(),
    )
    .await
    .context("planting the mark")?;
    Ok(())
}

/// The marks of keyed chunks in the idempotency bucket (`landed.<message id>`), sorted.
async fn landed_marks(stack: &Stack) -> Result<Vec<String>> {
    use futures::TryStreamExt as _;
    let client = async_nats::connect(stack.nats.url()).await?;
    let kv = async_nats::jetstream::new(client)
        .get_key_value("SLUICE_IDEMPOTENCY")
        .await
        .context("the idempotency bucket")?;
    let mut marks: Vec<String> = kv
        .keys()
        .await?
        .try_filter(|k| std::future::ready(k.starts_with("landed.")))
        .try_collect()
        .await?;
    marks.sort();
    Ok(marks)
}

/// The consumer marks each keyed chunk landed before it acks it (what a retry asks,
/// below), and the marks outlive a nats-server restart; a message without a key costs
/// no mark.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_keyed_chunk_is_marked_landed_once_settled_and_the_marks_outlive_a_restart(
) -> Result<()> {
    let mut stack = stack_with(&[EVENTS], &[("api.chunk_rows", 10.into())]).await?;
    let http = stack.http().clone();
    let body = rows(0..25, "marked");
    let keyed_reply = post(&http, &stack, "events", body.clone(), &keyed("mark-1")).await?;
    assert_eq!(
        (keyed_reply.status, keyed_reply.n("accepted")),
        (202, 25),
        "{keyed_reply}"
    );
    let plain = post(
        &http,
        &stack,
        "events",
        rows(100..105, "plain"),
        &[AS_TENANT, NDJSON],
    )
    .await?;
    assert_eq!(plain.status, 202, "{plain}");
    wait_exactly(&stack, "SELECT count() FROM events", 30).await?;

    let mut headers = axum::http::HeaderMap::new();
    headers.insert("idempotency-key", "mark-1".parse()?);
    let key = idempotency::from_headers(&headers)
        .map_err(|e| anyhow::anyhow!("{e}"))?
        .context("no key")?;
    let stem = idempotency::ScopedKey::new("INGEST", TENANT, "events", key).message_stem(
        &idempotency::Fingerprint::of(Framing::Ndjson, body.as_bytes()),
    );
    let expected: Vec<String> = (0..3)
        .map(|i| format!("landed.{}", chunk_message_id(&stem, i)))
        .collect();
    // Marked before the ack, and the rows counted once acked: there by now, but the
    // last ack may trail the count by a moment.
    let marks = wait_for(
        "the three chunks marked",
        Duration::from_secs(10),
        Duration::from_millis(100),
        || async {
            let marks = landed_marks(&stack).await?;
            ensure!(marks.len() >= expected.len(), "{marks:?}");
            Ok(marks)
        },
    )
    .await?;
    assert_eq!(marks, expected);
    stack.nats.stop().await?;
    stack.nats.start_again().await?;
    let after = wait_for(
        "the bucket read after the restart",
        Duration::from_secs(20),
        Duration::from_millis(200),
        || landed_marks(&stack),
    )
    .await?;
    assert_eq!(after, expected, "the marks outlive the restart");
    Ok(())
}

/// A retry sends no chunk the consumer marked landed. A chunk of the first request
/// whose ack was lost (its key's record does not list it) may have been consumed and
/// acked before nats-server restarted, and a restarted server no longer knows its
/// message id: sent again, it would be stored and inserted twice. The consumer marks
/// each keyed chunk landed before its ack, and a resumed request asks first. Here the
/// mark is planted for the first chunk the first request did not store, so what the
/// retry did shows in the table: that chunk's rows are counted as stored before and
/// were not sent (they are not in the table); every other row is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_request_sends_no_chunk_the_consumer_marked_landed() -> Result<()> {
    let mut stack = filling_stack("64KiB", &[("api.chunk_rows", 10.into())]).await?;
    let http = stack.http().clone();
    let pad = "p".repeat(300);
    let padded = |ids: std::ops::Range<u64>| ndjson(ids.map(|id| json!({"id": id, "name": pad})));
    let fill = post(&http, &stack, "events", padded(0..150), &keyed("fill-2")).await?;
    assert_eq!((fill.status, fill.n("accepted")), (202, 150), "{fill}");
    let body = padded(150..250);
    let first = post(&http, &stack, "events", body.clone(), &keyed("order-7")).await?;
    assert_eq!(first.status, 503, "{first}");
    let stored = first.n("accepted");
    assert!(stored > 0 && stored < 90, "not full mid-request: {first}");
    // Chunks are stored in order: the first `stored / 10` of them.
    let marked = usize::try_from(stored / 10)?;
    plant_landed_mark(&stack, "order-7", &body, marked).await?;

    stack.clickhouse.start_again().await?;
    wait_exactly(&stack, "SELECT count() FROM events", 150 + stored).await?;
    let done = post_until_answered(&http, &stack, "events", &body, &keyed("order-7")).await?;
    assert_eq!(
        (done.status, done.n("accepted"), done.n("duplicates")),
        (202, 100, stored + 10),
        "{done}"
    );
    wait_exactly(&stack, "SELECT count() FROM events", 250 - 10).await?;
    let first_unsent = 150 + stored;
    assert_eq!(
        stack
            .count(&format!(
                "SELECT count() FROM events WHERE id >= {first_unsent} AND id < {}",
                first_unsent + 10
            ))
            .await?,
        0,
        "the marked chunk was sent"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_stored_whole_is_answered_again_while_the_stream_is_full() -> Result<()> {
    let stack = filling_stack("64KiB", &[]).await?;
    let http = stack.http().clone();
    let pad = "p".repeat(300);
    let padded = |ids: std::ops::Range<u64>| ndjson(ids.map(|id| json!({"id": id, "name": pad})));
    let body = padded(0..20);
    let first = post(&http, &stack, "events", body.clone(), &keyed("whole-1")).await?;
    assert_eq!((first.status, first.n("accepted")), (202, 20), "{first}");

    // Fill the stream (ClickHouse is stopped: nothing drains) until it refuses.
    let mut full = false;
    for n in 1..100u64 {
        let key = format!("fill-{n}");
        let r = post(
            &http,
            &stack,
            "events",
            padded(n * 20..n * 20 + 20),
            &keyed(&key),
        )
        .await?;
        if r.status == 503 {
            full = true;
            break;
        }
        assert_eq!(r.status, 202, "{r}");
    }
    assert!(full, "the stream never filled");

    // The client resends the request already stored whole (its answer was lost): all
    // its rows are stored, and the answer says so.
    let again = post(&http, &stack, "events", body, &keyed("whole-1")).await?;
    assert_first_answer(&again, &first);
    assert_eq!(again.n("not_stored"), 0, "{again}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_idempotency_bucket_answers_503_and_requests_without_a_key_go_on() -> Result<()> {
    const BUDGET: u64 = 1 << 20;
    let stack = stack_with(&[EVENTS], &[("nats.idempotency_max_bytes", "1MiB".into())]).await?;
    let http = stack.http().clone();
    // The first keyed request sets the bucket up.
    let first = post(&http, &stack, "events", rows(1..3, "first"), &keyed("k-0")).await?;
    assert_eq!(first.status, 202, "{first}");

    // Fill it to its budget from outside (records a busy day would leave).
    let client = async_nats::connect(stack.nats.url()).await?;
    let js = async_nats::jetstream::new(client);
    let filler = bytes::Bytes::from(vec![b'x'; 64 << 10]);
    let mut stored = 0;
    for n in 0..64 {
        let published = js
            .publish(format!("$KV.SLUICE_IDEMPOTENCY.filler.{n}"), filler.clone())
            .await?
            .await;
        if published.is_err() {
            break; // the server's own limit (exact on current servers)
        }
        let stream = js.get_stream("KV_SLUICE_IDEMPOTENCY").await?;
        stored = stream.cached_info().state.bytes;
        if stored >= BUDGET {
            break;
        }
    }
    assert!(
        stored + (64 << 10) >= BUDGET,
        "the bucket holds {stored} bytes"
    );

    // Sluice reads the bucket's size at most every 200 ms: probe with throwaway keys
    // until it refuses one.
    let probes = std::sync::atomic::AtomicU64::new(0);
    wait_for(
        "a keyed request refused for the full bucket",
        LAND,
        Duration::from_millis(50),
        || async {
            let n = probes.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let key = format!("probe-{n}");
            let r = post(
                &http,
                &stack,
                "events",
                rows(1000 + n..1001 + n, "probe"),
                &keyed(&key),
            )
            .await?;
            if r.status == 503 {
                Ok(())
            } else {
                bail!("{r}")
            }
        },
    )
    .await?;
    // A keyed request publishes nothing it cannot record, and says why.
    let r = post(
        &http,
        &stack,
        "events",
        rows(10..13, "keyed"),
        &keyed("k-1"),
    )
    .await?;
    assert_eq!(
        (r.status, r.n("accepted"), r.n("not_stored")),
        (503, 0, 3),
        "{r}"
    );
    assert!(r.headers.contains_key("retry-after"), "{r}");
    assert!(
        r.body["error"]
            .as_str()
            .is_some_and(|e| e.contains("idempotency bucket SLUICE_IDEMPOTENCY is full")),
        "{r}"
    );
    // Requests without a key are not held up.
    let r = post(
        &http,
        &stack,
        "events",
        rows(20..23, "plain"),
        &[AS_TENANT, NDJSON],
    )
    .await?;
    assert_eq!((r.status, r.n("accepted")), (202, 3), "{r}");
    let probed = probes.load(std::sync::atomic::Ordering::Relaxed) - 1;
    settled_with(&stack, 100, 2 + probed + 3 + 1).await?;
    assert_eq!(
        stack
            .count("SELECT count() FROM events WHERE name = 'keyed'")
            .await?,
        0
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_whose_write_got_no_answer_does_not_hold_the_key_for_its_lease() -> Result<()> {
    let mut stack = stack_with(&[EVENTS], &[]).await?;
    let http = stack.http().clone();
    // The bucket is set up by a first keyed request.
    let r = post(&http, &stack, "events", rows(1..2, "first"), &keyed("k-0")).await?;
    assert_eq!(r.status, 202, "{r}");

    // nats-server frozen: the claim's write gets no answer, and lands once it thaws.
    stack.nats.sigstop().await?;
    let body = rows(10..13, "frozen");
    let frozen = post(&http, &stack, "events", body.clone(), &keyed("k-1")).await;
    stack.nats.sigcont().await?;
    let frozen = frozen?;
    assert_eq!(
        (frozen.status, frozen.n("not_stored")),
        (503, 3),
        "{frozen}"
    );

    // The request that wrote it is gone (it answered 503), and its claim with it: the
    // retry is taken within seconds, not after the claim's lease (70 s here).
    let thawed = Instant::now();
    let r = wait_for(
        "the retry taken",
        Duration::from_secs(30),
        Duration::from_millis(500),
        || async {
            let r = post(&http, &stack, "events", body.clone(), &keyed("k-1")).await?;
            match r.status {
                503 | 409 => bail!("{r}"),
                _ => Ok(r),
            }
        },
    )
    .await?;
    assert_eq!((r.status, r.n("accepted")), (202, 3), "{r}");
    assert!(thawed.elapsed() < Duration::from_secs(30));
    settled_with(&stack, 100, 5).await?;
    Ok(())
}
