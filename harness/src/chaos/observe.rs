//! Looking at the pipeline from outside: the ingest stream's backlog and the DLQ read
//! straight from JetStream (independent of Sluice, which may be dead), and each live
//! Sluice's own view from `/admin/actors`.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{anyhow, Context, Result};
use async_nats::jetstream::{self, stream::LastRawMessageErrorKind};
use serde_json::Value;

use super::rows::{id_of, leading_id};
use crate::stack::TENANT;

/// Names of the stack's streams and consumer (Sluice's defaults).
pub const INGEST_STREAM: &str = "INGEST";
pub const DLQ_STREAM: &str = "DLQ";
pub const CONSUMER: &str = "sluice";
pub const DLQ_PREFIX: &str = "dlq";

/// JetStream error code for "no message found".
const NO_MESSAGE_FOUND: u64 = 10037;

/// A JetStream client of the test itself.
#[derive(Clone)]
pub struct JetStreamView {
    js: jetstream::Context,
}

/// The ingest stream as JetStream sees it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Backlog {
    /// Messages still in the (work-queue) stream: normally the rows not yet acked.
    pub messages: u64,
    /// The stream's first and last sequence.
    pub first_seq: u64,
    pub last_seq: u64,
    /// Not yet delivered to the consumer.
    pub pending: u64,
    /// Delivered and not yet acked.
    pub ack_pending: u64,
    /// Delivered more than once so far.
    pub redelivered: u64,
    /// The consumer's ack floor (stream sequence): everything up to it is acked.
    pub ack_floor: u64,
    /// The last stream sequence delivered to the consumer.
    pub delivered: u64,
}

impl Backlog {
    /// The consumer has nothing left: every row delivered and acked (or parked).
    pub fn consumer_done(&self) -> bool {
        self.pending == 0 && self.ack_pending == 0
    }

    /// Messages still stored although the consumer has acked everything: a nats-server
    /// that crashed (kill -9) can recover a work-queue stream with acked messages it
    /// had not yet removed. They are never delivered again (their rows were inserted)
    /// but they take room in the stream's `max_bytes`.
    pub fn stranded(&self) -> u64 {
        if self.consumer_done() {
            self.messages
        } else {
            0
        }
    }
}

/// One row on the DLQ.
#[derive(Clone, Debug)]
pub struct ParkedRow {
    pub sequence: u64,
    pub subject: String,
    /// The row's id, when the payload is a scenario's row.
    pub id: Option<u64>,
    pub headers: BTreeMap<String, String>,
    pub payload: String,
}

// === impl JetStreamView ===

impl JetStreamView {
    /// Connects to `url` (one server, or a cluster's nodes comma-separated); the client
    /// reconnects by itself across server restarts, and leaves a frozen node within a
    /// few seconds (pings every second).
    pub async fn connect(url: &str) -> Result<Self> {
        let seeds: Vec<&str> = url.split(',').collect();
        let client = async_nats::ConnectOptions::new()
            .name("sluice-chaos")
            .connection_timeout(Duration::from_secs(5))
            .request_timeout(Some(Duration::from_secs(5)))
            .ping_interval(Duration::from_secs(1))
            .max_reconnects(None)
            .reconnect_delay_callback(|attempts| {
                Duration::from_millis(50u64 << attempts.min(4)).min(Duration::from_secs(1))
            })
            .connect(seeds.as_slice())
            .await
            .with_context(|| format!("connecting to NATS at {url}"))?;
        Ok(Self {
            js: jetstream::new(client),
        })
    }

    pub fn context(&self) -> &jetstream::Context {
        &self.js
    }

    /// The ingest stream's messages and its consumer's counts; of a partitioned queue
    /// (`[nats] partitions`: no `INGEST`, streams `INGEST_0`, `INGEST_1`...), the sums
    /// of its partitions' (their sequences those of the last partition).
    pub async fn backlog(&self) -> Result<Backlog> {
        match self.stream_backlog(INGEST_STREAM).await {
            Ok(backlog) => Ok(backlog),
            Err(e) if !format!("{e:#}").contains("stream not found") => Err(e),
            Err(e) => {
                let mut sum: Option<Backlog> = None;
                // Bounded: a queue has at most 64 partitions.
                for n in 0..64 {
                    let Ok(b) = self.stream_backlog(&format!("{INGEST_STREAM}_{n}")).await else {
                        break;
                    };
                    let s = sum.get_or_insert_with(Backlog::default);
                    s.messages += b.messages;
                    s.pending += b.pending;
                    s.ack_pending += b.ack_pending;
                    s.redelivered += b.redelivered;
                    (s.first_seq, s.last_seq) = (b.first_seq, b.last_seq);
                    (s.ack_floor, s.delivered) = (b.ack_floor, b.delivered);
                }
                sum.ok_or(e)
            }
        }
    }

    /// One stream's messages and its consumer's counts.
    async fn stream_backlog(&self, name: &str) -> Result<Backlog> {
        let mut stream = self
            .js
            .get_stream(name)
            .await
            .map_err(|e| anyhow!("reading stream {name}: {e}"))?;
        let state = stream
            .info()
            .await
            .map_err(|e| anyhow!("reading stream {name}: {e}"))?
            .state
            .clone();
        let consumer = stream
            .consumer_info(CONSUMER)
            .await
            .map_err(|e| anyhow!("reading consumer {CONSUMER} of {name}: {e}"))?;
        Ok(Backlog {
            messages: state.messages,
            first_seq: state.first_sequence,
            last_seq: state.last_sequence,
            pending: consumer.num_pending,
            ack_pending: consumer.num_ack_pending as u64,
            redelivered: consumer.num_redelivered as u64,
            ack_floor: consumer.ack_floor.stream_sequence,
            delivered: consumer.delivered.stream_sequence,
        })
    }

    /// Every row parked for `table` (tenant [`TENANT`]), oldest first, read without
    /// consuming anything. An absent DLQ stream means nothing is parked.
    pub async fn parked(&self, table: &str) -> Result<Vec<ParkedRow>> {
        let started = tokio::time::Instant::now();
        // Bounded by `DLQ_UNAVAILABLE`, as the reads below.
        let (stream, last) = loop {
            let read = async {
                let mut stream = self.js.get_stream(DLQ_STREAM).await?;
                let last = stream.info().await?.state.last_sequence;
                Ok::<_, async_nats::Error>((stream, last))
            };
            match read.await {
                Ok(read) => break read,
                Err(e) if e.to_string().contains("not found") => return Ok(Vec::new()),
                Err(e) if started.elapsed() >= DLQ_UNAVAILABLE => {
                    return Err(anyhow!(
                        "reading stream {DLQ_STREAM}: {e} (for {DLQ_UNAVAILABLE:?})"
                    ))
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        };
        let subject = format!("{DLQ_PREFIX}.{TENANT}.{table}");
        let mut rows = Vec::new();
        let mut next = 1u64;
        // Bounded: each step moves past one stored message, and waits out a stream
        // that cannot answer for a while (a NATS cluster electing its leader after a
        // fault answers 503 "temporarily unavailable") for at most `DLQ_UNAVAILABLE`.
        let mut unavailable_since: Option<tokio::time::Instant> = None;
        while next <= last {
            let message = match stream
                .get_first_raw_message_by_subject(&subject, next)
                .await
            {
                Ok(m) => m,
                Err(e) if no_message(&e) => break,
                Err(e) => {
                    let since = *unavailable_since.get_or_insert_with(tokio::time::Instant::now);
                    if since.elapsed() >= DLQ_UNAVAILABLE {
                        return Err(anyhow!(
                            "reading the DLQ at {next}: {e} (for {DLQ_UNAVAILABLE:?})"
                        ));
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
            };
            unavailable_since = None;
            next = message.sequence + 1;
            let payload = String::from_utf8_lossy(&message.payload).into_owned();
            let id = serde_json::from_str::<Value>(&payload)
                .ok()
                .as_ref()
                .and_then(id_of)
                .or_else(|| leading_id(&payload));
            let headers = message
                .headers
                .iter()
                .map(|(k, v)| {
                    let value = v.iter().map(|v| v.as_str()).collect::<Vec<_>>().join(",");
                    (k.to_string(), value)
                })
                .collect();
            rows.push(ParkedRow {
                sequence: message.sequence,
                subject: message.subject.to_string(),
                id,
                headers,
                payload,
            });
        }
        Ok(rows)
    }
}

/// How long reading the DLQ waits for a stream that does not answer.
const DLQ_UNAVAILABLE: Duration = Duration::from_secs(30);

fn no_message(e: &async_nats::jetstream::stream::LastRawMessageError) -> bool {
    match e.kind() {
        LastRawMessageErrorKind::NoMessageFound => true,
        LastRawMessageErrorKind::JetStream(j) => j.error_code().0 == NO_MESSAGE_FOUND,
        _ => e.to_string().contains("no message found"),
    }
}

/// What a live Sluice holds, from its `/admin/actors` tree: rows buffered in table
/// actors and flushes in flight, summed over the tables.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Held {
    pub buffered_rows: u64,
    pub flights: u64,
}

/// Sums the table nodes of an `/admin/actors` answer.
pub fn held_in_tree(tree: &Value) -> Held {
    let mut held = Held::default();
    let mut stack = vec![tree];
    // Bounded by the tree's size: each node is visited once.
    while let Some(node) = stack.pop() {
        if node.get("kind").and_then(Value::as_str) == Some("table") {
            let state = &node["state"];
            held.buffered_rows += state["buffered_rows"].as_u64().unwrap_or(0);
            held.flights += state["flights"].as_u64().unwrap_or(0);
        }
        if let Some(children) = node.get("children").and_then(Value::as_array) {
            stack.extend(children.iter());
        }
    }
    held
}

/// Each flight out in an `/admin/actors` answer, as `table: stage for N ms (age M ms)`:
/// what a pipeline that does not go quiet is doing.
pub fn flights_out_in_tree(tree: &Value) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![tree];
    // Bounded by the tree's size: each node is visited once.
    while let Some(node) = stack.pop() {
        if node.get("kind").and_then(Value::as_str) == Some("table") {
            let state = &node["state"];
            for f in state["flights_out"].as_array().into_iter().flatten() {
                out.push(format!(
                    "{}: {} for {} ms (age {} ms)",
                    state["table"].as_str().unwrap_or("?"),
                    f["stage"].as_str().unwrap_or("?"),
                    f["stage_ms"].as_u64().unwrap_or(0),
                    f["age_ms"].as_u64().unwrap_or(0),
                ));
            }
        }
        if let Some(children) = node.get("children").and_then(Value::as_array) {
            stack.extend(children.iter());
        }
    }
    out
}

/// The state of `table`'s node in an `/admin/actors` answer (the first one found).
pub fn table_state<'a>(tree: &'a Value, table: &str) -> Option<&'a Value> {
    let mut stack = vec![tree];
    // Bounded by the tree's size: each node is visited once.
    while let Some(node) = stack.pop() {
        if node.get("kind").and_then(Value::as_str) == Some("table")
            && node["state"]["table"] == table
        {
            return Some(&node["state"]);
        }
        if let Some(children) = node.get("children").and_then(Value::as_array) {
            stack.extend(children.iter());
        }
    }
    None
}

/// The value of a Prometheus sample: the sum of every series of `name` whose labels
/// include all of `labels` (e.g. `&[("kind", "table")]`); 0 when there is none.
pub fn metric_value(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    let mut total = 0.0;
    for line in text.lines() {
        let Some(rest) = line.strip_prefix(name) else {
            continue;
        };
        let (label_text, value) = match rest.chars().next() {
            Some('{') => match rest.split_once('}') {
                Some((l, v)) => (&l[1..], v),
                None => continue,
            },
            Some(' ') => ("", rest),
            _ => continue,
        };
        let matches = labels
            .iter()
            .all(|(k, v)| label_text.contains(&format!("{k}=\"{v}\"")));
        if matches {
            total += value.trim().parse::<f64>().unwrap_or(0.0);
        }
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_prometheus_samples() {
        let text = "# TYPE sluice_actor_restarts_total counter\n\
                    sluice_actor_restarts_total{kind=\"table\"} 3\n\
                    sluice_actor_restarts_total{kind=\"pool\"} 1\n\
                    sluice_retries_total{table=\"a\",reason=\"denied\"} 10\n\
                    sluice_retries_total{table=\"b\",reason=\"denied\"} 5\n\
                    sluice_retries_total_other 7\n\
                    sluice_buffered_rows 2\n";
        assert_eq!(
            metric_value(text, "sluice_actor_restarts_total", &[("kind", "table")]),
            3.0
        );
        assert_eq!(
            metric_value(text, "sluice_retries_total", &[("reason", "denied")]),
            15.0
        );
        assert_eq!(metric_value(text, "sluice_buffered_rows", &[]), 2.0);
        assert_eq!(metric_value(text, "sluice_missing", &[]), 0.0);
    }

    #[test]
    fn sums_table_nodes() {
        let tree = serde_json::json!({
            "kind": "root", "state": {}, "children": [
                {"kind": "pool", "state": {}, "children": [
                    {"kind": "table", "state": {"buffered_rows": 5, "flights": 1}, "children": []},
                    {"kind": "table", "state": {"buffered_rows": 2, "flights": 0}, "children": []}
                ]}
            ]
        });
        assert_eq!(
            held_in_tree(&tree),
            Held {
                buffered_rows: 7,
                flights: 1
            }
        );
    }
}
