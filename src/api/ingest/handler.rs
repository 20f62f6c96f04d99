//! `POST /v1/ingest/{table}`: a request's rows published to `<prefix>.<tenant>.<table>`
//! in NDJSON messages of up to `[api] chunk_rows` rows (`chunk`), each with the stream's
//! ack awaited before its rows count as accepted (`publishing`).
//!
//! A full or unreachable stream stops the request where it is: the rows of chunks
//! already acked stay accepted, the answer is 503 with `Retry-After`, and a client
//! retrying with the same body and `Idempotency-Key` gets the same chunks under the
//! same message ids, so the stored ones are not stored twice.
//!
//! Before any row is published the request must name a tenant, a table the tenant's
//! ClickHouse target has (`clickhouse::catalog`) within the tenant's table cap
//! (`tables`), a media type and a usable key. Rows are then split off the body one at
//! a time (`parse`) and gathered into chunks sent as they close, so a request never
//! holds a list of its rows or of its refusals (only the open chunk's, and a copy of
//! the chunks in flight); the answer lists the first `MAX_LISTED_ERRORS` refusals.

use std::collections::HashMap;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;
use std::sync::Arc;

use super::chunk::ChunkLimits;
use super::memory::IngestMemory;
use super::parse::{self, Framing, Refused, RowError, RowLimits};
use super::publishing::{max_message_id_len, Publishing};
use super::tables::TenantTables;
use crate::api::tenant::{Tenant, TenantResolver};
use crate::clickhouse::catalog::Catalog;
use crate::config::{is_table_name, TABLE_NAME_RULE};
use crate::nats::{PublishError, Publisher};
use crate::telemetry::metrics as m;

/// The longest `Idempotency-Key` taken (it becomes a JetStream message id).
const MAX_IDEMPOTENCY_KEY: usize = 128;

/// Refused rows an answer lists (`rejected` counts them all): enough to fix a producer,
/// and an answer that stays small whatever the body holds.
pub const MAX_LISTED_ERRORS: usize = 100;

/// What the ingest endpoint needs.
pub struct IngestState {
    pub tenants: TenantResolver,
    /// `MAX_PUBLISHING` permits: requests publishing at once.
    pub publishing: tokio::sync::Semaphore,
    pub publisher: Publisher,
    pub subject_prefix: String,
    /// `[api] max_request_bytes`: a longer body is refused (413).
    pub max_request_bytes: usize,
    /// `[api] ingest_memory`: room for the bodies of the requests in progress.
    pub memory: IngestMemory,
    pub max_row_bytes: usize,
    /// `[api] chunk_rows` and `chunk_bytes`: what one message may carry (the bytes are
    /// capped again by the server's `max_payload`, known once connected).
    pub chunks: ChunkLimits,
    /// Rows nested deeper are refused (ClickHouse's parser recurses once per level).
    pub max_json_depth: usize,
    pub retry_after: Duration,
    /// `[api] publish_retry_for`: how long a chunk JetStream did not take is sent again.
    pub publish_retry_for: Duration,
    /// The tables of each ClickHouse target, by target name.
    pub catalogs: HashMap<String, Catalog>,
    /// The tables each tenant writes to, capped.
    pub tables: TenantTables,
}

/// The answer to every ingest request.
#[derive(Debug, Default, Serialize)]
pub struct IngestReply {
    /// Rows stored in the ingest stream (acknowledged by JetStream).
    pub accepted: usize,
    /// Of the accepted rows, those JetStream had already stored under the same
    /// `Idempotency-Key`: stored once.
    pub duplicates: usize,
    /// Rows refused (bad JSON, not an object, too large, too deep, not UTF-8).
    pub rejected: usize,
    /// Rows not stored because the stream was full or unreachable: send them again.
    pub not_stored: usize,
    /// The first `MAX_LISTED_ERRORS` refused rows, by index (`rejected` counts all).
    pub errors: Vec<RowError>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
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

async fn handle(state: &IngestState, table: &str, headers: &HeaderMap, body: Body) -> Response {
    let tenant = match state.tenants.resolve(headers) {
        Ok(t) => t,
        Err(e) => return e.into_response(),
    };
    if !is_table_name(table) {
        return failure(
            StatusCode::NOT_FOUND,
            format!("{table:?} is not a table name ({TABLE_NAME_RULE})"),
        );
    }
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok());
    let Some(framing) = Framing::from_content_type(content_type) else {
        return failure(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            format!(
                "Content-Type {} is not taken: send application/json (an object or an array of objects), application/x-ndjson (one object per line) or application/json-seq (one object per record)",
                content_type.unwrap_or("(none)")
            ),
        );
    };
    let key = match idempotency_key(headers) {
        Ok(k) => k,
        Err(e) => return failure(StatusCode::BAD_REQUEST, e),
    };
    if let Err(refusal) = admit_table(state, &tenant, table).await {
        return refusal;
    }
    // Only now is the body read: a request refused above costs none of it.
    let Some(_room) = state.memory.reserve(headers).await else {
        return busy(
            state,
            format!(
                "the ingest requests in progress hold [api] ingest_memory; no room came within {}: send again later",
                humantime::format_duration(state.memory.wait())
            ),
        );
    };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse().ok());
    let body = match read_body(body, declared, state.max_request_bytes).await {
        Ok(b) => b,
        Err(refusal) => return refusal,
    };
    let room = message_room(
        state.publisher.context().client().max_payload(),
        key.as_deref(),
    );
    let limits = RowLimits {
        max_bytes: row_limit(state.max_row_bytes, room),
        max_depth: state.max_json_depth,
    };
    let rows = match parse::rows(&body, framing, limits) {
        Ok(rows) => rows,
        Err(e) => return failure(StatusCode::BAD_REQUEST, e.0),
    };

    let subject = format!("{}.{}.{table}", state.subject_prefix, tenant.name);
    let Ok(_publishing) = state.publishing.acquire().await else {
        return failure(StatusCode::SERVICE_UNAVAILABLE, "sluice is stopping".into());
    };
    let mut reply = IngestReply::default();
    // Without a connection every publish would wait out its ack timeout (and the byte
    // budget's stream lookup) before failing: tell the client at once instead.
    let not_connected = (state.publisher.context().client().connection_state()
        != async_nats::connection::State::Connected)
        .then(|| PublishError::Unavailable("not connected to NATS right now".into()));
    let chunks = ChunkLimits {
        rows: state.chunks.rows,
        bytes: state.chunks.bytes.min(room),
    };
    let mut publishing = Publishing::new(
        &state.publisher,
        subject,
        key.as_deref(),
        chunks,
        state.publish_retry_for,
        not_connected,
    );
    for item in rows {
        match item {
            Ok((_, row)) => publishing.add(row).await,
            Err(refused) => reply.refuse(refused),
        }
    }
    let outcome = publishing.finish().await;
    if outcome.rows + reply.rejected == 0 {
        return failure(StatusCode::BAD_REQUEST, "the body holds no rows".into());
    }
    reply.accepted = outcome.accepted;
    reply.duplicates = outcome.duplicates;
    reply.not_stored = outcome.rows - outcome.accepted;
    let labels = [
        ("tenant", tenant.name.clone()),
        ("table", table.to_string()),
    ];
    metrics::counter!(m::INGEST_ROWS, &labels).increment(reply.accepted as u64);
    metrics::counter!(m::INGEST_MESSAGES, &labels).increment(outcome.messages as u64);
    // Even at 0: the series exists from the table's first request, so an `increase()`
    // alert sees the first refused row.
    metrics::counter!(m::INGEST_ROWS_REJECTED, &labels).increment(reply.rejected as u64);

    match outcome.stop {
        Some(PublishError::Refused(why)) if reply.not_stored > 0 => {
            reply.error = Some(why);
            (StatusCode::BAD_REQUEST, Json(reply)).into_response()
        }
        Some(e) if reply.not_stored > 0 => {
            reply.error = Some(format!("{e}; send the request again (the same body with the same Idempotency-Key stores none of its rows twice)"));
            let mut response = (StatusCode::SERVICE_UNAVAILABLE, Json(reply)).into_response();
            let secs = state.retry_after.as_secs().max(1).to_string();
            if let Ok(value) = HeaderValue::from_str(&secs) {
                response.headers_mut().insert(header::RETRY_AFTER, value);
            }
            response
        }
        _ if reply.rejected > 0 => (StatusCode::BAD_REQUEST, Json(reply)).into_response(),
        _ => (StatusCode::ACCEPTED, Json(reply)).into_response(),
    }
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

fn missing_table(catalog: &Catalog, table: &str) -> Response {
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
/// message-id header a request's key makes.
fn message_room(max_payload: usize, key: Option<&str>) -> usize {
    // "NATS/1.0\r\n" "Nats-Msg-Id: " <key> "-" <index> "\r\n" "\r\n"
    let id_header = key.map_or(0, |k| 10 + 13 + max_message_id_len(k.len()) + 2 + 2);
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

fn idempotency_key(headers: &HeaderMap) -> Result<Option<String>, String> {
    let Some(value) = headers.get("idempotency-key") else {
        return Ok(None);
    };
    let key = value
        .to_str()
        .map_err(|_| "Idempotency-Key must be visible ASCII".to_string())?
        .trim();
    if key.is_empty()
        || key.len() > MAX_IDEMPOTENCY_KEY
        || !key.chars().all(|c| c.is_ascii_graphic())
    {
        return Err(format!(
            "Idempotency-Key must be 1 to {MAX_IDEMPOTENCY_KEY} visible ASCII characters"
        ));
    }
    Ok(Some(key.to_string()))
}

// === impl IngestReply ===

impl IngestReply {
    /// Count a refused row; list it while the list is short.
    fn refuse(&mut self, refused: Refused) {
        self.rejected += 1;
        if self.errors.len() < MAX_LISTED_ERRORS {
            self.errors.push(refused.into_error());
        }
    }
}

/// The whole body, or the answer for one that is too long or broke off. `declared` is
/// what `Content-Length` said: the buffer is made that large at once (within the limit).
async fn read_body(body: Body, declared: Option<usize>, limit: usize) -> Result<Bytes, Response> {
    use futures::StreamExt as _;
    let mut stream = body.into_data_stream();
    let mut read = bytes::BytesMut::with_capacity(declared.unwrap_or(0).min(limit));
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| {
            failure(
                StatusCode::BAD_REQUEST,
                format!("the request body could not be read: {e}"),
            )
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

/// 503 with `Retry-After`: nothing was taken, the same request may come again.
fn busy(state: &IngestState, error: String) -> Response {
    let mut response = failure(StatusCode::SERVICE_UNAVAILABLE, error);
    if let Ok(value) = HeaderValue::from_str(&state.retry_after.as_secs().max(1).to_string()) {
        response.headers_mut().insert(header::RETRY_AFTER, value);
    }
    response
}

fn failure(status: StatusCode, error: String) -> Response {
    let body = IngestReply {
        error: Some(error),
        ..Default::default()
    };
    (status, Json(body)).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_and_chunks_fit_a_nats_message_with_their_headers() {
        let mib = 1 << 20;
        assert_eq!(message_room(mib, None), mib);
        assert_eq!(row_limit(1000, message_room(mib, None)), 1000);
        assert_eq!(row_limit(mib, message_room(mib, None)), mib - PARK_HEADROOM);
        let keyed = message_room(mib, Some("k"));
        assert!(keyed < mib - 40, "{keyed}");
        assert!(row_limit(mib, keyed) < mib - PARK_HEADROOM - 40);
        assert_eq!(row_limit(mib, message_room(100, None)), 0);
        // The header of the longest id a 128-byte key makes fits the room left.
        let key = "k".repeat(MAX_IDEMPOTENCY_KEY);
        let id = super::super::publishing::message_id(&key, usize::MAX);
        let header = "NATS/1.0\r\nNats-Msg-Id: ".len() + id.len() + 4;
        assert!(message_room(mib, Some(&key)) + header <= mib);
    }
}
