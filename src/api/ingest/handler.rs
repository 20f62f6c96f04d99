//! `POST /v1/ingest/{table}`: a request's rows published to `<prefix>.<tenant>.<table>`
//! in NDJSON messages of up to `[api] chunk_rows` rows (`chunk`), each with the stream's
//! ack awaited before its rows count as accepted (`publishing`).
//!
//! A full or unreachable stream stops the request where it is: the rows of chunks
//! already acked stay accepted, the answer is 503 with `Retry-After`, and a client
//! retrying with the same body and `Idempotency-Key` stores only the chunks not stored
//! yet (`idempotency`).
//!
//! Before any row is published the request must name a tenant, a table the tenant's
//! ClickHouse target has (`clickhouse::catalog`) within the tenant's table cap
//! (`tables`), a media type and a usable key, and a keyed request must hold its key.
//! Rows are then split off the body one at a time (`parse`) and gathered into chunks
//! sent as they close, so a request never holds a list of its rows or of its refusals
//! (only the open chunk's, and a copy of the chunks in flight); the answer
//! (`reply`) lists the first `MAX_LISTED_ERRORS` refusals.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse as _, Response};
use tokio::sync::{AcquireError, SemaphorePermit};

use super::chunk::ChunkLimits;
use super::idempotency::{
    self, BodyUse, Claim, Decision, End, Fingerprint, Idempotency, IdempotencyKey, Keyed, Opened,
    Split, MAX_MESSAGE_ID_LEN,
};
use super::memory::IngestMemory;
use super::parse::{self, Framing, RowLimits};
use super::publishing::{KeyedChunks, Outcome, Publishing, Stop};
use super::reply::{self, come_back, failure, IngestReply};
use super::tables::TenantTables;
use crate::clickhouse::clients::TargetCatalog;
use crate::config::{is_table_name, TABLE_NAME_RULE};
use crate::http::tenant::{Tenant, TenantResolver};
use crate::nats::{IngestStreams, LandedChunks, PublishError};
use crate::telemetry::metrics as m;

/// What the ingest endpoint needs.
pub struct IngestState {
    pub tenants: TenantResolver,
    /// `MAX_PUBLISHING` permits: requests publishing at once.
    pub publishing: tokio::sync::Semaphore,
    /// Where rows go: a publisher per partition of the queue.
    pub publisher: IngestStreams,
    /// `[api] max_request_bytes`: a longer body is refused (413).
    pub max_request_bytes: usize,
    /// `[api] ingest_memory`: room for the bodies of the requests in progress.
    pub memory: IngestMemory,
    pub max_row_bytes: usize,
    /// `[api] chunk_rows` and `chunk_bytes`: what one message may carry (the bytes are
    /// capped again by the server's `max_payload`, known once connected).
    pub chunks: ChunkLimits,
    /// `[api] compression`: how each message is stored; `None`: plain.
    pub compression: Option<crate::nats::Compression>,
    /// Rows nested deeper are refused (ClickHouse's parser recurses once per level).
    pub max_json_depth: usize,
    pub retry_after: Duration,
    /// `[api] publish_retry_for`: how long a chunk JetStream did not take is sent again.
    pub publish_retry_for: Duration,
    /// The tables of each ClickHouse target, by target name.
    pub catalogs: HashMap<String, TargetCatalog>,
    /// The tables each tenant writes to, capped.
    pub tables: TenantTables,
    /// The `Idempotency-Key` records.
    pub keys: Idempotency,
    /// The keyed chunks the consumer settled (in the same bucket).
    pub landed: LandedChunks,
    /// How long a claim holds a key (twice `[api] body_timeout`).
    pub key_lease: Duration,
}

pub async fn ingest(
    State(state): State<Arc<IngestState>>,
    Path(table): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let response = handle(&state, &table, &headers, body).await;
    metrics::counter!(m::INGEST_REQUESTS, "status" => response.status().as_u16().to_string())
        .increment(1);
    response
}

/// A request that passed every check made before its body is read.
struct Admitted {
    tenant: Tenant,
    framing: Framing,
    key: Option<IdempotencyKey>,
}

async fn handle(state: &IngestState, table: &str, headers: &HeaderMap, body: Body) -> Response {
    let admitted = match admit(state, table, headers).await {
        Ok(admitted) => admitted,
        Err(refusal) => return refusal,
    };
    // Only now is the body read: a request refused above costs none of it.
    let Some(_room) = state.memory.reserve(headers).await else {
        return come_back(
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "the ingest requests in progress hold [api] ingest_memory; no room came within {}: send again later",
                humantime::format_duration(state.memory.wait())
            ),
            state.retry_after,
        );
    };
    let mut stop = not_connected(state);
    let keyed = match open_key(state, &admitted, table, &mut stop).await {
        Ok(keyed) => keyed,
        Err(refusal) => return refusal,
    };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse().ok());
    let body = match read_body(body, declared, state.max_request_bytes).await {
        Ok(b) => b,
        Err(refusal) => return refusal,
    };
    let split = split_for(state, admitted.key.is_some());
    let claim = match decide_key(state, keyed, admitted.framing, &body, split, &mut stop).await {
        Ok(claim) => claim,
        Err(answer) => return answer,
    };
    publish(state, &admitted, table, &body, split, claim, stop).await
}

/// Without a connection every publish (and the key's record) would wait out its
/// timeout before failing: the reason to tell the client at once instead.
fn not_connected(state: &IngestState) -> Option<Stop> {
    let connected = state
        .publisher
        .first()
        .context()
        .client()
        .connection_state()
        == async_nats::connection::State::Connected;
    (!connected).then(|| {
        Stop::Publish(PublishError::Unavailable(
            "not connected to NATS right now".into(),
        ))
    })
}

/// The key, before the body is read: a request in progress under it is answered (409)
/// now; a bucket that cannot be used stops the request (`stop`: nothing published).
async fn open_key(
    state: &IngestState,
    admitted: &Admitted,
    table: &str,
    stop: &mut Option<Stop>,
) -> Result<Option<Box<Keyed>>, Response> {
    let (Some(key), None) = (admitted.key.clone(), &stop) else {
        return Ok(None);
    };
    let scope = state.keys.scope(&admitted.tenant.name, table, key);
    match state.keys.open(scope).await {
        Opened::InProgress => Err(in_progress(state.retry_after)),
        Opened::Keyed(keyed) => Ok(Some(keyed)),
        Opened::Unusable(e) => {
            *stop = Some(e.into());
            Ok(None)
        }
    }
}

/// A keyed request's decision, from its body: publish holding the key, or the answer
/// (the first one again, 422, 409).
async fn decide_key(
    state: &IngestState,
    keyed: Option<Box<Keyed>>,
    framing: Framing,
    body: &Bytes,
    split: Split,
    stop: &mut Option<Stop>,
) -> Result<Option<Claim>, Response> {
    let Some(keyed) = keyed else {
        return Ok(None);
    };
    let body = BodyUse {
        fingerprint: Fingerprint::of(framing, body),
        split,
    };
    match keyed.decide(body).await {
        Decision::Publish(claim) => Ok(Some(claim)),
        Decision::Replay { status, reply } => Err(reply::replay(status, reply)),
        Decision::Mismatch => Err(mismatch()),
        Decision::InProgress => Err(in_progress(state.retry_after)),
        Decision::Unusable(e) => {
            *stop = Some(e.into());
            Ok(None)
        }
    }
}

/// The checks made before the body is read: tenant, table, media type, key.
async fn admit(
    state: &IngestState,
    table: &str,
    headers: &HeaderMap,
) -> Result<Admitted, Response> {
    let tenant = state
        .tenants
        .resolve(headers)
        .map_err(|e| e.into_response())?;
    if !is_table_name(table) {
        return Err(failure(
            StatusCode::NOT_FOUND,
            format!("{table:?} is not a table name ({TABLE_NAME_RULE})"),
        ));
    }
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok());
    let Some(framing) = Framing::from_content_type(content_type) else {
        return Err(failure(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            format!(
                "Content-Type {} is not taken: send application/json (an object or an array of objects), application/x-ndjson (one object per line) or application/json-seq (one object per record)",
                content_type.unwrap_or("(none)")
            ),
        ));
    };
    let key =
        idempotency::from_headers(headers).map_err(|e| failure(StatusCode::BAD_REQUEST, e))?;
    admit_table(state, &tenant, table).await?;
    Ok(Admitted {
        tenant,
        framing,
        key,
    })
}

/// Parse the rows, publish the accepted ones, answer; record the end under the key.
async fn publish(
    state: &IngestState,
    admitted: &Admitted,
    table: &str,
    body: &Bytes,
    split: Split,
    claim: Option<Claim>,
    mut stop: Option<Stop>,
) -> Response {
    // A resumed request splits its body as it was first split.
    let split = claim.as_ref().map_or(split, Claim::split);
    let limits = RowLimits {
        max_bytes: split.row_bytes,
        max_depth: split.depth,
    };
    let rows = match parse::rows(body, admitted.framing, limits) {
        Ok(rows) => rows,
        Err(e) => {
            let refusal = failure(StatusCode::BAD_REQUEST, e.0);
            return settle(claim, &Outcome::default(), None, refusal).await;
        }
    };
    let Ok(_permit) = publishing_permit(state, claim.as_ref(), &mut stop).await else {
        let stopping = failure(StatusCode::SERVICE_UNAVAILABLE, "sluice is stopping".into());
        return settle(claim, &Outcome::default(), None, stopping).await;
    };
    let keyed = claim.as_ref().map(|claim| KeyedChunks {
        stem: claim.message_stem(),
        stored_before: claim.stored_before(),
        deadline: claim.deadline(),
        lease: state.key_lease,
        landed: &state.landed,
        resumed: claim.resumed(),
    });
    let chunks = ChunkLimits {
        rows: split.chunk_rows,
        bytes: split.chunk_bytes,
    };
    let mut reply = IngestReply::default();
    let mut publishing = Publishing::new(
        &state.publisher,
        (&admitted.tenant.name, table),
        keyed,
        chunks,
        state.publish_retry_for,
        stop,
    )
    .compressed(state.compression);
    for item in rows {
        match item {
            Ok((_, row)) => publishing.add(row).await,
            Err(refused) => reply.refuse(refused),
        }
    }
    let mut outcome = publishing.finish().await;
    if outcome.rows + reply.rejected == 0 {
        let refusal = failure(StatusCode::BAD_REQUEST, "the body holds no rows".into());
        return settle(claim, &outcome, None, refusal).await;
    }
    let status = reply.settle(&mut outcome);
    count_rows(&admitted.tenant.name, table, &reply, &outcome);
    let answer = Some((status, &reply));
    let end = claim.as_ref().map(|claim| end_of(claim, &outcome, answer));
    let response = reply.into_response(status, state.retry_after);
    if let (Some(claim), Some(end)) = (claim, end) {
        claim.finish(end).await;
    }
    response
}

/// A place among the requests publishing at once (`MAX_PUBLISHING`). A keyed request
/// waits no longer than its lease: then `stop` says so, and nothing is sent. An error
/// when Sluice is stopping.
async fn publishing_permit<'s>(
    state: &'s IngestState,
    claim: Option<&Claim>,
    stop: &mut Option<Stop>,
) -> Result<Option<SemaphorePermit<'s>>, AcquireError> {
    let Some(deadline) = claim.map(Claim::deadline) else {
        return state.publishing.acquire().await.map(Some);
    };
    match tokio::time::timeout_at(deadline, state.publishing.acquire()).await {
        Ok(permit) => permit.map(Some),
        Err(_) => {
            stop.get_or_insert(Stop::LeaseEnded(state.key_lease));
            Ok(None)
        }
    }
}

/// Record how a keyed request ended (see [`end_of`]), then give its answer.
async fn settle(
    claim: Option<Claim>,
    outcome: &Outcome,
    answer: Option<(StatusCode, &IngestReply)>,
    response: Response,
) -> Response {
    if let Some(claim) = claim {
        let end = end_of(&claim, outcome, answer);
        claim.finish(end).await;
    }
    response
}

/// How a keyed request ended, for its key's record: it sent nothing (the key is free
/// again), it stopped with rows not stored (the chunks stored, by it or before it), or
/// it has a final answer (`answer`, a status other than 503).
fn end_of(claim: &Claim, outcome: &Outcome, answer: Option<(StatusCode, &IngestReply)>) -> End {
    if outcome.sent == 0 && claim.stored_before().is_empty() {
        return End::Unused;
    }
    let last = answer
        .filter(|(status, _)| *status != StatusCode::SERVICE_UNAVAILABLE)
        .and_then(|(status, reply)| Some((status, reply::recorded(reply)?)));
    match last {
        Some((status, reply)) => End::Answered { status, reply },
        None => {
            let mut stored = claim.stored_before().clone();
            stored.extend(&outcome.stored);
            End::Unfinished { stored }
        }
    }
}

/// The per-table counters: rows stored now (not those an earlier request under the
/// key stored), messages stored, rows refused.
fn count_rows(tenant: &str, table: &str, reply: &IngestReply, outcome: &Outcome) {
    let labels = [("tenant", tenant.to_string()), ("table", table.to_string())];
    metrics::counter!(m::INGEST_ROWS, &labels)
        .increment((reply.accepted - reply.duplicates) as u64);
    metrics::counter!(m::INGEST_MESSAGES, &labels).increment(outcome.messages as u64);
    // Even at 0: the series exists from the table's first request, so an `increase()`
    // alert sees the first refused row.
    metrics::counter!(m::INGEST_ROWS_REJECTED, &labels).increment(reply.rejected as u64);
}

/// How this instance splits a body now: the configured limits, within what one NATS
/// message can carry beside its headers.
fn split_for(state: &IngestState, keyed: bool) -> Split {
    let room = message_room(
        state.publisher.first().context().client().max_payload(),
        keyed,
    );
    Split {
        chunk_rows: state.chunks.rows,
        chunk_bytes: state.chunks.bytes.min(room),
        row_bytes: row_limit(state.max_row_bytes, room),
        depth: state.max_json_depth,
    }
}

/// 409: another request holds the key.
fn in_progress(retry_after: Duration) -> Response {
    come_back(
        StatusCode::CONFLICT,
        "a request with this Idempotency-Key is in progress: send this one again once that one is answered (it then gets that answer)".into(),
        retry_after,
    )
}

/// 422: the key was used for another body.
fn mismatch() -> Response {
    failure(
        StatusCode::UNPROCESSABLE_ENTITY,
        "this Idempotency-Key was used for another body (for this tenant and table, within [nats] duplicate_window): a retry must send the same body; another request needs another key".into(),
    )
}

/// Whether rows for `table` are taken from this tenant: the tenant's ClickHouse target
/// must have the table (404 when its latest table list positively lacks it; taken
/// unchecked when the list cannot be read, since such rows wait out an outage in the
/// queue like any other), and the tenant must stay within its table cap (403). A
/// tenant without a target is not checked: its rows are parked whole, as ever.
async fn admit_table(state: &IngestState, tenant: &Tenant, table: &str) -> Result<(), Response> {
    let catalog = tenant
        .target
        .as_ref()
        .and_then(|target| state.catalogs.get(target));
    if let Some(catalog) = catalog {
        match catalog.lookup(table).await {
            Ok(Some(_)) => {}
            Ok(None) => return Err(missing_table(catalog, table)),
            Err(e) => tracing::debug!(error = %e, table, "ingest: table not checked"),
        }
    }
    state
        .tables
        .admit(&tenant.name, table)
        .map_err(|e| failure(StatusCode::FORBIDDEN, e.to_string()))
}

fn missing_table(catalog: &TargetCatalog, table: &str) -> Response {
    failure(
        StatusCode::NOT_FOUND,
        format!(
            "ClickHouse target {} has no table {table:?} in its database (create it first; a new table is seen within a second)",
            catalog.target()
        ),
    )
}

/// Room a parked row needs beside its bytes on the DLQ: the `Sluice-*` headers, of
/// which ClickHouse's message alone may take 1 KiB.
const PARK_HEADROOM: usize = 4096;

/// What one message may carry beside its headers: the server's `max_payload` less the
/// message-id header a keyed request's chunks carry.
fn message_room(max_payload: usize, keyed: bool) -> usize {
    // "NATS/1.0\r\n" "Nats-Msg-Id: " <stem> "-" <index> "\r\n" "\r\n"
    let id_header = if keyed {
        10 + 13 + MAX_MESSAGE_ID_LEN + 2 + 2
    } else {
        0
    };
    max_payload.saturating_sub(id_header)
}

/// The largest row taken: `[api] max_row_bytes`, but never more than a NATS message can
/// carry with its headers, on the ingest stream (the message id) and on the DLQ (the
/// `Sluice-*` headers of a row parked alone). A row over it is refused by index like
/// any oversized row; publishing it would fail and stop the rest of the request, or
/// leave it unparkable.
fn row_limit(configured: usize, room: usize) -> usize {
    configured.min(room.saturating_sub(PARK_HEADROOM))
}

/// The whole body, or the answer for one that is too long or broke off. `declared` is
/// what `Content-Length` said: the buffer is made that large at once (within the limit).
async fn read_body(body: Body, declared: Option<usize>, limit: usize) -> Result<Bytes, Response> {
    use futures::StreamExt as _;
    let mut stream = body.into_data_stream();
    let mut read = bytes::BytesMut::with_capacity(declared.unwrap_or(0).min(limit));
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| match crate::http::body_timed_out(&e) {
            // Answered by the listener; counted here as what the client sees.
            Some(timed_out) => failure(StatusCode::REQUEST_TIMEOUT, timed_out.to_string()),
            None => failure(
                StatusCode::BAD_REQUEST,
                format!("the request body could not be read: {e}"),
            ),
        })?;
        if read.len() + chunk.len() > limit {
            return Err(failure(
                StatusCode::PAYLOAD_TOO_LARGE,
                "the request body is over [api] max_request_bytes: split it".into(),
            ));
        }
        read.extend_from_slice(&chunk);
    }
    Ok(read.freeze())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_and_chunks_fit_a_nats_message_with_their_headers() {
        let mib = 1 << 20;
        assert_eq!(message_room(mib, false), mib);
        assert_eq!(row_limit(1000, message_room(mib, false)), 1000);
        assert_eq!(
            row_limit(mib, message_room(mib, false)),
            mib - PARK_HEADROOM
        );
        let keyed = message_room(mib, true);
        assert!(keyed < mib - 40, "{keyed}");
        assert!(row_limit(mib, keyed) < mib - PARK_HEADROOM - 40);
        assert_eq!(row_limit(mib, message_room(100, false)), 0);
        // The header of the longest id fits the room left.
        let id = crate::nats::chunk_message_id(&"f".repeat(32), usize::MAX);
        let header = "NATS/1.0\r\nNats-Msg-Id: ".len() + id.len() + 4;
        assert!(message_room(mib, true) + header <= mib);
    }
}
