//! Publishing a known row set while a fault happens, as a well-behaved client would.
//!
//! A [`Feed`] runs in the background: it sends its rows in chunks at a steady pace
//! (so rows keep flowing while the scenario injects its fault) and retries each chunk
//! until it is accepted or the feed's deadline passes:
//!
//! - through the ingest API ([`Route::Api`]): one POST per chunk with an
//!   `Idempotency-Key`, resent with the same key after a 503 or a 409 (waiting
//!   `Retry-After`) or a transport error, so a retried chunk is stored once. Any other status fails
//!   the feed: a client would not retry it, so it is a finding.
//! - straight to JetStream ([`Route::JetStream`]): every other chunk as one many-row
//!   NDJSON message, the chunks between one publish per row, each with a
//!   `Nats-Msg-Id`; failed publishes retried with the same id. Used where the API
//!   itself is under fire (Sluice killed) and rows must keep arriving.
//!
//! Either way a share of the rows arrives many to a message, bad rows among them: the
//! API chunks each request's rows into messages of up to `[api] chunk_rows` rows by
//! itself, and half of a JetStream feed's chunks are one message each.
//!
//! A row counts as published once the API answered 202 for its chunk or JetStream
//! acknowledged it (its message): that is the set nothing may be lost from.

use std::collections::BTreeSet;
use std::future::IntoFuture as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use async_nats::jetstream;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::rows::RowSet;
use crate::stack::TENANT;

/// How long a client waits after a transport error before resending.
const TRANSPORT_RETRY: Duration = Duration::from_millis(200);
/// The longest `Retry-After` the feed honours (a bound, so a wrong header cannot stall
/// a scenario).
const MAX_RETRY_AFTER: Duration = Duration::from_secs(5);
/// Each HTTP request's own timeout.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(20);
/// How long the acks of one chunk published straight to JetStream are waited for,
/// together.
const ACK_WAIT: Duration = Duration::from_secs(5);

/// How fast rows go out: `chunk` rows every `every`.
#[derive(Clone, Copy, Debug)]
pub struct Pace {
    pub chunk: usize,
    pub every: Duration,
}

impl Pace {
    pub fn new(chunk: usize, every: Duration) -> Self {
        Self { chunk, every }
    }

    /// Everything at once, in chunks of `chunk`.
    pub fn burst(chunk: usize) -> Self {
        Self::new(chunk, Duration::ZERO)
    }
}

/// Where a feed sends its rows.
#[derive(Clone)]
pub enum Route {
    /// `POST {base_url}/v1/ingest/{table}` as `tenant` (`X-Tenant`; [`TENANT`] unless
    /// [`Route::api_as`] says otherwise), the `k`-th request under the key
    /// `<key_prefix>-<k>` when a prefix is given (feeds given one prefix share their
    /// keys), else under a key of the feed's own.
    Api {
        base_url: String,
        http: reqwest::Client,
        tenant: String,
        key_prefix: Option<String>,
    },
    /// Straight to `{subject_prefix}.{TENANT}.{table}` on JetStream.
    JetStream {
        js: Box<jetstream::Context>,
        subject_prefix: String,
    },
}

impl Route {
    /// The ingest API at `base_url` (e.g. [`crate::Stack::api_url`]).
    pub fn api(base_url: impl Into<String>) -> Result<Self> {
        let http = crate::http::http_client_builder()?
            .timeout(REQUEST_TIMEOUT)
            .connect_timeout(Duration::from_secs(2))
            .build()
            .context("building the feed's HTTP client")?;
        Ok(Self::Api {
            base_url: base_url.into(),
            http,
            tenant: TENANT.into(),
            key_prefix: None,
        })
    }

    /// The ingest API at `base_url` as `tenant`, with keys `<key_prefix>-<k>`.
    pub fn api_as(base_url: impl Into<String>, tenant: &str, key_prefix: &str) -> Result<Self> {
        let mut route = Self::api(base_url)?;
        if let Self::Api {
            tenant: as_tenant,
            key_prefix: keys,
            ..
        } = &mut route
        {
            *as_tenant = tenant.into();
            *keys = Some(key_prefix.into());
        }
        Ok(route)
    }

    /// JetStream through `js`, on the stack's subject prefix (`ingest`).
    pub fn jetstream(js: jetstream::Context) -> Self {
        Self::JetStream {
            js: Box::new(js),
            subject_prefix: "ingest".into(),
        }
    }
}

/// What a feed has seen so far; read while it runs.
#[derive(Debug, Default)]
pub struct Progress {
    /// Rows accepted.
    pub accepted: AtomicU64,
    /// 503 answers from the ingest API.
    pub unavailable: AtomicU64,
    /// Of those, answers that carried `Retry-After`.
    pub retry_after: AtomicU64,
    /// Requests or publishes that failed without an answer.
    pub transport_errors: AtomicU64,
    /// The last refusal or failure seen, for diagnostics.
    last_failure: std::sync::Mutex<Option<String>>,
    /// Ids published straight to JetStream whose ack was lost (timed out, the node
    /// gone) and were published again under the same message id: JetStream is to store
    /// them once, but around a stream leader's change it may have stored both.
    resent: std::sync::Mutex<BTreeSet<u64>>,
}

impl Progress {
    /// The last refusal (a 503's body) or transport error the feed saw.
    pub fn last_failure(&self) -> Option<String> {
        self.last_failure
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn resent(&self, ids: impl IntoIterator<Item = u64>) {
        self.resent
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend(ids);
    }

    fn failed(&self, what: String) {
        *self.last_failure.lock().unwrap_or_else(|e| e.into_inner()) = Some(what);
    }

    fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    pub fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }
}

/// The rows a feed got accepted.
#[derive(Clone, Debug)]
pub struct Published {
    pub table: String,
    /// The row set the feed sent (to tell good rows from bad by id).
    pub rows: RowSet,
    /// Ids accepted (API 202 or JetStream ack): nothing of these may be lost.
    pub accepted: BTreeSet<u64>,
    /// Ids whose chunk was never confirmed before the deadline: they may or may not be
    /// stored, so they are left out of the reckoning (a passing run has none).
    pub unconfirmed: BTreeSet<u64>,
    /// The last refusal or failure the feed saw (why rows are unconfirmed).
    pub last_failure: Option<String>,
    /// Ids published again after their ack was lost (see `Progress::resent`).
    pub resent: BTreeSet<u64>,
}

// === impl Published ===

impl Published {
    /// Bad rows a scenario published by hand (a row no [`RowSet`] writes, such as a
    /// nesting bomb), accepted by JetStream: counted with the rest, they belong on the
    /// DLQ.
    pub fn bad_rows(table: &str, rows: RowSet) -> Self {
        Self {
            table: table.to_owned(),
            accepted: rows.ids().iter().copied().collect(),
            rows,
            unconfirmed: BTreeSet::new(),
            last_failure: None,
            resent: BTreeSet::new(),
        }
    }
}

/// A running feed.
pub struct Feed {
    table: String,
    progress: Arc<Progress>,
    task: JoinHandle<Result<Published>>,
}

// === impl Feed ===

impl Feed {
    /// Starts sending `rows` to `table` through `route` at `pace`; gives up on rows not
    /// accepted within `deadline`.
    pub fn start(route: Route, table: &str, rows: RowSet, pace: Pace, deadline: Duration) -> Self {
        let progress = Arc::new(Progress::default());
        let task = tokio::spawn(run(
            route,
            table.to_owned(),
            rows,
            pace,
            Instant::now() + deadline,
            progress.clone(),
        ));
        Self {
            table: table.to_owned(),
            progress,
            task,
        }
    }

    pub fn table(&self) -> &str {
        &self.table
    }

    pub fn progress(&self) -> &Progress {
        &self.progress
    }

    /// Rows accepted so far.
    pub fn accepted(&self) -> u64 {
        Progress::get(&self.progress.accepted)
    }

    /// Whether the feed has sent everything (or given up).
    pub fn is_finished(&self) -> bool {
        self.task.is_finished()
    }

    /// Waits until at least `n` rows were accepted.
    pub async fn wait_accepted(&self, n: u64, deadline: Duration) -> Result<()> {
        crate::wait_until(
            &format!("the feed of {} to have {n} rows accepted", self.table),
            deadline,
            Duration::from_millis(20),
            || async move { self.accepted() >= n },
        )
        .await
    }

    /// Waits until the ingest API has answered 503 at least `n` times.
    pub async fn wait_unavailable(&self, n: u64, deadline: Duration) -> Result<()> {
        crate::wait_until(
            &format!("the feed of {} to see {n} answers 503", self.table),
            deadline,
            Duration::from_millis(20),
            || async move { Progress::get(&self.progress.unavailable) >= n },
        )
        .await
    }

    /// Waits for the feed to end and returns what it got accepted.
    pub async fn finish(self, deadline: Duration) -> Result<Published> {
        let table = self.table.clone();
        let mut task = self.task;
        match tokio::time::timeout(deadline, &mut task).await {
            Ok(joined) => joined.map_err(|e| anyhow!("the feed of {table} panicked: {e}"))?,
            Err(_) => {
                task.abort();
                let p = &self.progress;
                bail!(
                    "the feed of {table} did not end within {deadline:?} ({} rows accepted, {} answers 503, {} transport errors; the last failure: {})",
                    Progress::get(&p.accepted),
                    Progress::get(&p.unavailable),
                    Progress::get(&p.transport_errors),
                    p.last_failure().unwrap_or_else(|| "none".into())
                )
            }
        }
    }
}

async fn run(
    route: Route,
    table: String,
    rows: RowSet,
    pace: Pace,
    end: Instant,
    progress: Arc<Progress>,
) -> Result<Published> {
    let started = Instant::now();
    let mut accepted = BTreeSet::new();
    let mut unconfirmed = BTreeSet::new();
    let run_id = format!(
        "{:x}",
        std::process::id() as u64 * 1_000_003 + started_nanos()
    );
    for (k, chunk) in rows.ids().chunks(pace.chunk.max(1)).enumerate() {
        let due = started + pace.every * k as u32;
        if due > Instant::now() {
            tokio::time::sleep_until(due.min(end)).await;
        }
        let done = match &route {
            Route::Api {
                base_url,
                http,
                tenant,
                key_prefix,
            } => {
                let key = match key_prefix {
                    Some(prefix) => format!("{prefix}-{k}"),
                    None => format!("chaos-{run_id}-{table}-{k}"),
                };
                let to = ApiTarget {
                    base_url,
                    http,
                    tenant,
                    table: &table,
                };
                send_api(&to, &rows, chunk, &key, end, &progress).await?
            }
            Route::JetStream { js, subject_prefix } => {
                let subject = format!("{subject_prefix}.{TENANT}.{table}");
                if k % 2 == 1 {
                    send_jetstream_batched(js, &subject, &rows, chunk, end, &progress).await
                } else {
                    send_jetstream(js, &subject, &rows, chunk, end, &progress).await
                }
            }
        };
        for id in chunk {
            if done.contains(id) {
                accepted.insert(*id);
            } else {
                unconfirmed.insert(*id);
            }
        }
    }
    Ok(Published {
        table,
        rows,
        accepted,
        unconfirmed,
        last_failure: progress.last_failure(),
        resent: progress
            .resent
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone(),
    })
}

fn started_nanos() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos() as u64)
        .unwrap_or(0)
}

/// Where an API feed's requests go.
struct ApiTarget<'a> {
    base_url: &'a str,
    http: &'a reqwest::Client,
    tenant: &'a str,
    table: &'a str,
}

/// One chunk through the API, resent until 202 or the deadline (after a 503, or a 409:
/// the same key's request still in progress). Returns the ids accepted (all of the
/// chunk, or none).
async fn send_api(
    to: &ApiTarget<'_>,
    rows: &RowSet,
    chunk: &[u64],
    key: &str,
    end: Instant,
    progress: &Progress,
) -> Result<BTreeSet<u64>> {
    let ApiTarget {
        base_url,
        http,
        tenant,
        table,
    } = *to;
    let body = rows.ndjson(chunk);
    let url = format!("{base_url}/v1/ingest/{table}");
    while Instant::now() < end {
        let sent = http
            .post(&url)
            .header("X-Tenant", tenant)
            .header("Content-Type", "application/x-ndjson")
            .header("Idempotency-Key", key)
            .body(body.clone())
            .send()
            .await;
        let response = match sent {
            Ok(r) => r,
            Err(e) => {
                Progress::add(&progress.transport_errors, 1);
                progress.failed(format!("POST /v1/ingest/{table}: {e}"));
                tokio::time::sleep_until((Instant::now() + TRANSPORT_RETRY).min(end)).await;
                continue;
            }
        };
        let status = response.status().as_u16();
        match status {
            202 => {
                Progress::add(&progress.accepted, chunk.len() as u64);
                return Ok(chunk.iter().copied().collect());
            }
            503 | 409 => {
                if status == 503 {
                    Progress::add(&progress.unavailable, 1);
                }
                let wait = match retry_after(&response) {
                    Some(wait) => {
                        Progress::add(&progress.retry_after, 1);
                        wait
                    }
                    None => Duration::from_secs(1),
                };
                let text = response.text().await.unwrap_or_default();
                progress.failed(format!("{status}: {text}"));
                tokio::time::sleep_until((Instant::now() + wait).min(end)).await;
            }
            _ => {
                let text = response.text().await.unwrap_or_default();
                bail!("POST /v1/ingest/{table} answered {status} (a client would not retry this): {text}");
            }
        }
    }
    Ok(BTreeSet::new())
}

fn retry_after(response: &reqwest::Response) -> Option<Duration> {
    let secs: u64 = response
        .headers()
        .get("retry-after")?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()?;
    Some(Duration::from_secs(secs).clamp(Duration::from_millis(100), MAX_RETRY_AFTER))
}

/// One chunk straight to JetStream (pipelined), failed rows resent with the same
/// message id until the deadline. Returns the ids acknowledged.
async fn send_jetstream(
    js: &jetstream::Context,
    subject: &str,
    rows: &RowSet,
    chunk: &[u64],
    end: Instant,
    progress: &Progress,
) -> BTreeSet<u64> {
    let mut done = BTreeSet::new();
    let mut todo: Vec<u64> = chunk.to_vec();
    while !todo.is_empty() && Instant::now() < end {
        let mut acks = Vec::with_capacity(todo.len());
        let mut failed = Vec::new();
        for id in &todo {
            let mut headers = async_nats::HeaderMap::new();
            // The subject is part of the id: a table and its Replicated twin get the same
            // rows, and JetStream would take the second for a duplicate of the first.
            headers.insert(
                async_nats::header::NATS_MESSAGE_ID,
                format!("chaos-{subject}-{id}").as_str(),
            );
            match js
                .publish_with_headers(subject.to_owned(), headers, rows.row(*id).into())
                .await
            {
                Ok(ack) => acks.push((*id, ack)),
                Err(e) => {
                    progress.failed(format!("publishing: {e}"));
                    failed.push(*id);
                }
            }
        }
        // One wait for the chunk's acks, not one per ack: acks lost with a node would
        // otherwise cost the client's timeout each, one after the other.
        let acked_by = Instant::now() + ACK_WAIT;
        for (id, ack) in acks {
            let answer = tokio::time::timeout_at(acked_by, ack.into_future())
                .await
                .unwrap_or_else(|_| {
                    Err(async_nats::jetstream::context::PublishError::new(
                        async_nats::jetstream::context::PublishErrorKind::TimedOut,
                    ))
                });
            match answer {
                Ok(_) => {
                    done.insert(id);
                }
                Err(e) => {
                    progress.failed(format!("publish ack: {e}"));
                    progress.resent([id]);
                    failed.push(id);
                }
            }
        }
        Progress::add(&progress.accepted, (todo.len() - failed.len()) as u64);
        if !failed.is_empty() {
            Progress::add(&progress.transport_errors, failed.len() as u64);
            tokio::time::sleep_until((Instant::now() + TRANSPORT_RETRY).min(end)).await;
        }
        todo = failed;
    }
    done
}

/// One chunk straight to JetStream as one NDJSON message of all its rows, resent with
/// the same message id until acknowledged or the deadline. Returns the ids
/// acknowledged (all of the chunk, or none).
async fn send_jetstream_batched(
    js: &jetstream::Context,
    subject: &str,
    rows: &RowSet,
    chunk: &[u64],
    end: Instant,
    progress: &Progress,
) -> BTreeSet<u64> {
    let (Some(first), Some(last)) = (chunk.first(), chunk.last()) else {
        return BTreeSet::new();
    };
    // The subject is part of the id, as for one-row messages: a table and its twin get
    // the same rows, and JetStream would take the second for a duplicate of the first.
    let id = format!("chaos-{subject}-{first}-to-{last}");
    let payload = bytes::Bytes::from(rows.ndjson(chunk));
    while Instant::now() < end {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(async_nats::header::NATS_MESSAGE_ID, id.as_str());
        let acked = match js
            .publish_with_headers(subject.to_owned(), headers, payload.clone())
            .await
        {
            Ok(ack) => ack.await.map_err(|e| format!("publish ack: {e}")),
            Err(e) => Err(format!("publishing: {e}")),
        };
        match acked {
            Ok(_) => {
                Progress::add(&progress.accepted, chunk.len() as u64);
                return chunk.iter().copied().collect();
            }
            Err(e) => {
                progress.resent(chunk.iter().copied());
                progress.failed(format!("{e} (a message of {} rows)", chunk.len()));
                Progress::add(&progress.transport_errors, 1);
                tokio::time::sleep_until((Instant::now() + TRANSPORT_RETRY).min(end)).await;
            }
        }
    }
    BTreeSet::new()
}
