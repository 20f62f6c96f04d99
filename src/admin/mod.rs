//! The admin endpoint, on its own port: health and readiness for the orchestrator,
//! Prometheus metrics, the live actor tree, the DLQ tools and a small page.
//!
//! `/healthz`, `/readyz` and `/metrics` answer without a token (probes and scrapers
//! rarely carry secrets; they reveal no row data). Everything under `/admin/` except
//! the page itself wants `Authorization: Bearer <token>` when a token is configured;
//! without one, the endpoint is bound to loopback only (see `config`).

mod auth;
mod dlq;
mod page;

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures::future::BoxFuture;
use metrics_exporter_prometheus::PrometheusHandle;
use serde_json::json;

use crate::config::{is_table_name, is_tenant_name, Secret};
use crate::nats::Dlq;

/// What the admin endpoint reads from the running pipeline, without waiting on it.
pub trait PipelineView: Send + Sync + 'static {
    /// The live actor tree as JSON.
    fn tree_json(&self) -> serde_json::Value;
    /// `Ok` when the consumer runs and every target answered a probe; else the reasons.
    fn readiness(&self) -> Result<(), Vec<String>>;
    /// Fault injection for chaos tests: panic inside a table's actor.
    fn inject_table_panic(&self, tenant: &str, table: &str) -> BoxFuture<'_, Result<(), String>>;
    /// Fault injection for chaos tests: panic inside a target's pool actor.
    fn inject_pool_panic(&self, target: &str) -> BoxFuture<'_, Result<(), String>>;
}

/// Whether NATS is connected right now (for readiness).
pub type NatsConnected = Arc<dyn Fn() -> bool + Send + Sync>;

pub struct AdminState {
    pub token: Option<Secret>,
    pub pipeline: Arc<dyn PipelineView>,
    pub nats_connected: NatsConnected,
    pub dlq: Dlq,
    pub metrics: PrometheusHandle,
    pub fault_injection: bool,
}

pub fn router(state: Arc<AdminState>) -> Router {
    let protected = Router::new()
        .route("/admin/actors", get(actors))
        .route("/admin/dlq", get(dlq::counts))
        .route("/admin/dlq/replay", post(dlq::replay))
        .route(
            "/admin/dlq/{tenant}/{table}",
            get(dlq::peek).delete(dlq::purge),
        )
        .route("/admin/debug/panic/{tenant}/{table}", post(panic_table))
        .route("/admin/debug/panic-pool/{target}", post(panic_pool))
        .route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            auth::require_token,
        ));
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/admin", get(page::page))
        .route("/admin/", get(page::page))
        .merge(protected)
        .with_state(state)
}

async fn healthz() -> Json<serde_json::Value> {
    Json(json!({ "status": "alive" }))
}

async fn readyz(State(state): State<Arc<AdminState>>) -> Response {
    let mut reasons = Vec::new();
    if !(state.nats_connected)() {
        reasons.push("NATS is not connected".to_string());
    }
    if let Err(more) = state.pipeline.readiness() {
        reasons.extend(more);
    }
    if reasons.is_empty() {
        (StatusCode::OK, Json(json!({ "ready": true }))).into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({ "ready": false, "reasons": reasons })),
        )
            .into_response()
    }
}

async fn metrics(State(state): State<Arc<AdminState>>) -> Response {
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        state.metrics.render(),
    )
        .into_response()
}

async fn actors(State(state): State<Arc<AdminState>>) -> Json<serde_json::Value> {
    Json(state.pipeline.tree_json())
}

async fn panic_table(
    State(state): State<Arc<AdminState>>,
    Path((tenant, table)): Path<(String, String)>,
) -> Response {
    if !state.fault_injection {
        return error(
            StatusCode::NOT_FOUND,
            "fault injection is off ([admin] fault_injection = true turns it on)",
        );
    }
    if !is_tenant_name(&tenant) || !is_table_name(&table) {
        return error(StatusCode::BAD_REQUEST, "not a tenant or table name");
    }
    match state.pipeline.inject_table_panic(&tenant, &table).await {
        Ok(()) => Json(json!({ "panicked": format!("{tenant}.{table}") })).into_response(),
        Err(e) => error(StatusCode::CONFLICT, &e),
    }
}

async fn panic_pool(State(state): State<Arc<AdminState>>, Path(target): Path<String>) -> Response {
    if !state.fault_injection {
        return error(
            StatusCode::NOT_FOUND,
            "fault injection is off ([admin] fault_injection = true turns it on)",
        );
    }
    match state.pipeline.inject_pool_panic(&target).await {
        Ok(()) => Json(json!({ "panicked": target })).into_response(),
        Err(e) => error(StatusCode::CONFLICT, &e),
    }
}

fn error(status: StatusCode, message: &str) -> Response {
    (status, Json(json!({ "error": message }))).into_response()
}
