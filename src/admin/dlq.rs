//! The DLQ tools over HTTP: counts, peek, replay, purge.

use std::sync::Arc;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};

use super::{error, AdminState};
use crate::config::{is_table_name, is_tenant_name, TABLE_NAME_RULE, TENANT_NAME_RULE};
use crate::nats::ParkedRow;

/// The most rows one peek or replay takes.
pub const MAX_LIMIT: usize = 10_000;
/// Rows a replay takes when the request names no `limit`.
pub const REPLAY_DEFAULT: usize = 1000;
/// Rows a peek shows when the request names no `limit`.
pub const PEEK_DEFAULT: usize = 20;

pub async fn counts(State(state): State<Arc<AdminState>>) -> Response {
    match state.dlq.counts().await {
        Ok(c) => Json(c).into_response(),
        Err(e) => unavailable(e),
    }
}

#[derive(Deserialize)]
pub struct PeekParams {
    limit: Option<usize>,
    /// Show rows whose DLQ sequence is above this (the previous page's `next_after`).
    after: Option<u64>,
}

/// One page of a table's parked rows (as `sluice dlq peek` reads it too).
#[derive(Debug, Serialize, Deserialize)]
pub struct PeekPage {
    pub tenant: String,
    pub table: String,
    pub rows: Vec<ParkedRow>,
    /// `after` for the next page; `null` when this page is the last.
    pub next_after: Option<u64>,
}

/// The answer to a purge.
#[derive(Debug, Serialize, Deserialize)]
pub struct Purged {
    pub tenant: String,
    pub table: String,
    pub purged: u64,
}

/// A replay request (as `sluice dlq replay` sends it too).
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplayRequest {
    pub tenant: String,
    pub table: String,
    pub limit: Option<usize>,
    #[serde(default)]
    pub dry_run: bool,
}

/// `GET /admin/dlq/{tenant}/{table}?limit=&after=`: parked rows, oldest first, a page
/// at a time, without consuming them.
pub async fn peek(
    State(state): State<Arc<AdminState>>,
    Path((tenant, table)): Path<(String, String)>,
    params: Result<Query<PeekParams>, QueryRejection>,
) -> Response {
    if let Some(refusal) = bad_names(&tenant, &table) {
        return refusal;
    }
    let Query(params) = match params {
        Ok(p) => p,
        Err(e) => return bad_query("?limit=<rows>&after=<sequence>", e),
    };
    let limit = match checked_limit(params.limit, PEEK_DEFAULT) {
        Ok(l) => l,
        Err(why) => return error(StatusCode::BAD_REQUEST, &why),
    };
    let after = params.after.unwrap_or(0);
    match state.dlq.peek_after(&tenant, &table, after, limit).await {
        Ok(rows) => {
            // A full page may have a next one; a short one is the last.
            let next_after = (rows.len() == limit)
                .then(|| rows.last().map(|r| r.sequence))
                .flatten();
            Json(PeekPage {
                tenant,
                table,
                rows,
                next_after,
            })
            .into_response()
        }
        Err(e) => unavailable(e),
    }
}

pub async fn replay(
    State(state): State<Arc<AdminState>>,
    body: Result<Json<ReplayRequest>, axum::extract::rejection::JsonRejection>,
) -> Response {
    let Json(request) = match body {
        Ok(b) => b,
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                &format!(
                    "expected {{\"tenant\", \"table\", \"limit\"?, \"dry_run\"?}}: {}",
                    e.body_text()
                ),
            )
        }
    };
    if let Some(refusal) = bad_names(&request.tenant, &request.table) {
        return refusal;
    }
    let limit = match checked_limit(request.limit, REPLAY_DEFAULT) {
        Ok(l) => l,
        Err(why) => return error(StatusCode::BAD_REQUEST, &why),
    };
    match state
        .dlq
        .replay(&request.tenant, &request.table, limit, request.dry_run)
        .await
    {
        Ok(report) => Json(report).into_response(),
        Err(e) => unavailable(e),
    }
}

#[derive(Deserialize)]
pub struct PurgeParams {
    confirm: Option<String>,
}

/// Deleting parked rows cannot be undone, so the request must name the table twice:
/// `DELETE /admin/dlq/acme/events?confirm=acme.events`.
pub async fn purge(
    State(state): State<Arc<AdminState>>,
    Path((tenant, table)): Path<(String, String)>,
    params: Result<Query<PurgeParams>, QueryRejection>,
) -> Response {
    if let Some(refusal) = bad_names(&tenant, &table) {
        return refusal;
    }
    let Query(params) = match params {
        Ok(p) => p,
        Err(e) => return bad_query("?confirm=<tenant>.<table>", e),
    };
    let expected = format!("{tenant}.{table}");
    if params.confirm.as_deref() != Some(expected.as_str()) {
        return error(
            StatusCode::BAD_REQUEST,
            &format!("purging cannot be undone: add ?confirm={expected}"),
        );
    }
    match state.dlq.purge(&tenant, &table).await {
        Ok(purged) => Json(Purged {
            tenant,
            table,
            purged,
        })
        .into_response(),
        Err(e) => unavailable(e),
    }
}

/// The `limit` asked for (else `default`), or why it is refused (see [`check_limit`]).
fn checked_limit(asked: Option<usize>, default: usize) -> Result<usize, String> {
    asked.map_or(Ok(default), check_limit)
}

/// Rows a peek or a replay takes: 1 to [`MAX_LIMIT`]. More is told so rather than
/// quietly given less, and none would answer a page with no row, which says nothing of
/// what is parked.
pub fn check_limit(n: usize) -> Result<usize, String> {
    match n {
        0 => Err(format!(
            "limit 0 takes no row: take 1 to {MAX_LIMIT} rows a request"
        )),
        n if n <= MAX_LIMIT => Ok(n),
        n => Err(format!(
            "limit {n} is over {MAX_LIMIT}: take at most {MAX_LIMIT} rows a request"
        )),
    }
}

/// A refusal of names that are not identifiers; `None` when both are fine.
fn bad_names(tenant: &str, table: &str) -> Option<Response> {
    if is_tenant_name(tenant) && is_table_name(table) {
        None
    } else {
        Some(error(
            StatusCode::BAD_REQUEST,
            &format!("tenant and table must be names (tenant {TENANT_NAME_RULE}; table {TABLE_NAME_RULE})"),
        ))
    }
}

/// A query string that does not parse: a JSON 400 like every other admin refusal
/// (axum's own answer is plain text).
fn bad_query(expected: &str, e: QueryRejection) -> Response {
    error(
        StatusCode::BAD_REQUEST,
        &format!("expected {expected}: {}", e.body_text()),
    )
}

fn unavailable(e: anyhow::Error) -> Response {
    error(StatusCode::SERVICE_UNAVAILABLE, &format!("{e:#}"))
}
