//! The DLQ tools over HTTP: counts, peek, replay, purge.

use std::sync::Arc;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::json;

use super::{error, AdminState};
use crate::config::{is_table_name, is_tenant_name, TABLE_NAME_RULE, TENANT_NAME_RULE};

/// The most rows one peek or replay takes.
const MAX_LIMIT: usize = 10_000;

pub async fn counts(State(state): State<Arc<AdminState>>) -> Response {
    match state.dlq.counts().await {
        Ok(c) => Json(c).into_response(),
        Err(e) => unavailable(e),
    }
}

#[derive(Deserialize)]
pub struct PeekParams {
    limit: Option<usize>,
}

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
        Err(e) => return bad_query("?limit=<rows>", e),
    };
    let limit = params.limit.unwrap_or(20).min(MAX_LIMIT);
    match state.dlq.peek(&tenant, &table, limit).await {
        Ok(rows) => Json(json!({ "tenant": tenant, "table": table, "rows": rows })).into_response(),
        Err(e) => unavailable(e),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplayRequest {
    tenant: String,
    table: String,
    limit: Option<usize>,
    #[serde(default)]
    dry_run: bool,
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
    let limit = request.limit.unwrap_or(1000).min(MAX_LIMIT);
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
        Ok(purged) => {
            Json(json!({ "tenant": tenant, "table": table, "purged": purged })).into_response()
        }
        Err(e) => unavailable(e),
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
