//! The admin endpoint, on its own port: health and readiness for the orchestrator,
//! Prometheus metrics, the live actor tree, each table's row rates, the NATS side, the
//! DLQ tools, the page an operator acts from, and the endpoint's OpenAPI document.
//!
//! `/healthz`, `/readyz`, `/metrics`, the page with its assets and `/openapi.json`
//! answer without a token (probes and scrapers rarely carry secrets; none of them
//! reveals row data). Every other route under `/admin/` wants
//! `Authorization: Bearer <token>` when a token is configured; without one, the
//! endpoint is bound to loopback only (see `config`).

mod auth;
mod dlq;
pub mod history;
mod nats;
mod openapi;
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
use crate::openapi::Routes;
pub use dlq::{check_limit, PeekPage, Purged, ReplayRequest, MAX_LIMIT as DLQ_MAX_LIMIT};
use history::{RatesView, SharedHistory};
pub use nats::NatsView;

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

pub struct AdminState {
    pub token: Option<Secret>,
    pub pipeline: Arc<dyn PipelineView>,
    pub nats: NatsView,
    pub dlq: Dlq,
    pub metrics: PrometheusHandle,
    /// The last ten minutes of each table's row rates.
    pub history: Arc<SharedHistory>,
    pub fault_injection: bool,
}

pub fn router(state: Arc<AdminState>) -> Router {
    let protected = protected_routes().map(|r| {
        r.route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            auth::require_token,
        ))
    });
    public_routes()
        .merge(protected)
        .map(|r| r.with_state(state))
        .into_router()
}

/// What answers without a token.
fn public_routes() -> Routes<Arc<AdminState>> {
    Routes::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/openapi.json", get(openapi::document))
        .route("/favicon.ico", get(page::favicon))
        .route("/admin", get(page::page))
        .route("/admin/", get(page::page))
        .route(page::SCRIPT_PATH, get(page::script))
        .route(page::STYLE_PATH, get(page::style))
}

/// What wants the admin token (when one is configured).
fn protected_routes() -> Routes<Arc<AdminState>> {
    Routes::new()
        .route("/admin/actors", get(actors))
        .route("/admin/rates", get(rates))
        .route("/admin/nats", get(nats_overview))
        .route("/admin/dlq", get(dlq::counts))
        .route("/admin/dlq/replay", post(dlq::replay))
        .route(
            "/admin/dlq/{tenant}/{table}",
            get(dlq::peek).delete(dlq::purge),
        )
        .route("/admin/debug/panic/{tenant}/{table}", post(panic_table))
        .route("/admin/debug/panic-pool/{target}", post(panic_pool))
}

async fn healthz() -> Json<serde_json::Value> {
    Json(json!({ "status": "alive" }))
}

async fn readyz(State(state): State<Arc<AdminState>>) -> Response {
    let mut reasons = Vec::new();
    if !state.nats.connected() {
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

async fn rates(State(state): State<Arc<AdminState>>) -> Json<RatesView> {
    Json(state.history.view())
}

async fn nats_overview(State(state): State<Arc<AdminState>>) -> Json<nats::NatsOverview> {
    Json(state.nats.overview(&state.pipeline.tree_json()))
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
