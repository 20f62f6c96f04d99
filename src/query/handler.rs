//! `POST /v1/query`: the axum handler, from request to answer.
//!
//! Order of checks, cheapest and least trusting first: the tenant (who is asking),
//! the body (what is asked, including the read-only SQL check), admission (is there a
//! slot), then ClickHouse. Every answer carries `X-Sluice-Query-Id`, errors included,
//! and is counted in `sluice_query_total{status}`.

use axum::body::{Body, Bytes};
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::Response;
use tokio::time::Instant;

use super::errors::QueryError;
use super::id::QueryId;
use super::request::{self, RequestError};
use super::response::{self, RESULT_CAP_HEADER};
use super::{metrics, QueryState, ATTEMPTS_HEADER, QUERY_ID_HEADER};

/// What the log line of a finished query says beside its status.
#[derive(Default)]
struct Trace {
    tenant: Option<String>,
    attempts: u32,
}

pub async fn query(
    State(state): State<QueryState>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let started = Instant::now();
    let id = QueryId::generate();
    let mut trace = Trace::default();
    let response = match run(&state, &headers, body, &id, started, &mut trace).await {
        Ok(response) => response,
        Err(error) => {
            if let QueryError::ClickHouse { attempts, .. }
            | QueryError::BudgetExhausted { attempts, .. }
            | QueryError::NotConfirmedGone { attempts, .. }
            | QueryError::Timeout { attempts, .. } = &error
            {
                trace.attempts = *attempts;
            }
            error.into_response_for(id.as_str())
        }
    };
    let status = response.status();
    let elapsed = started.elapsed();
    metrics::answered(status.as_u16(), elapsed);
    let tenant = trace.tenant.as_deref().unwrap_or("-");
    let ms = elapsed.as_millis() as u64;
    if status.is_server_error() {
        tracing::warn!(query_id = %id, tenant, status = status.as_u16(), attempts = trace.attempts, ms, "query answered");
    } else {
        tracing::info!(query_id = %id, tenant, status = status.as_u16(), attempts = trace.attempts, ms, "query answered");
    }
    response
}

async fn run(
    state: &QueryState,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
    id: &QueryId,
    started: Instant,
    trace: &mut Trace,
) -> Result<Response, QueryError> {
    let gateway = state.gateway().ok_or(QueryError::Off)?;
    let tenant = state
        .tenants()
        .resolve(headers)
        .map_err(QueryError::Tenant)?;
    trace.tenant = Some(tenant.name.clone());

    let body = body.map_err(|rejection| {
        if let Some(timed_out) = crate::http::body_timed_out(&rejection) {
            return QueryError::Request(RequestError::BodyTimedOut(timed_out.to_string()));
        }
        QueryError::Request(RequestError::Invalid(
            if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
                format!(
                    "the request body is larger than {} bytes",
                    super::MAX_REQUEST_BYTES
                )
            } else {
                format!("cannot read the request body: {rejection}")
            },
        ))
    })?;
    let query = request::parse(&body, gateway.request_limits()).map_err(QueryError::Request)?;
    let deadline = started + query.timeout;

    let admission = gateway
        .limits()
        .try_admit(&tenant.name)
        .map_err(|refused| QueryError::TooManyQueries {
            message: refused.to_string(),
        })?;

    tracing::debug!(query_id = %id, tenant = %tenant.name, timeout_ms = query.timeout.as_millis() as u64, "query admitted");
    let success = gateway.execute(&query, id, deadline).await?;
    trace.attempts = success.attempts;
    let attempts = success.attempts;

    let content_type = HeaderValue::from_str(success.relay.content_type())
        .unwrap_or_else(|_| HeaderValue::from_static("application/json"));
    let body: Body = response::body(success.relay, admission, id.clone(), deadline);
    let mut response = Response::new(body);
    let h = response.headers_mut();
    h.insert(header::CONTENT_TYPE, content_type);
    if let Ok(v) = HeaderValue::from_str(id.as_str()) {
        h.insert(QUERY_ID_HEADER, v);
    }
    h.insert(ATTEMPTS_HEADER, HeaderValue::from(attempts));
    if let Some(cap) = gateway.result_cap() {
        h.insert(RESULT_CAP_HEADER, HeaderValue::from(cap));
    }
    Ok(response)
}
