//! The HTTP surfaces clients use: ingest and query, on the API listener, with the
//! listener's OpenAPI document.
//!
//! The query surface lives in `crate::query` and is mounted here with `query::route`;
//! what the surfaces share (tenant resolution, the headers sent once) is in `crate::http`.

pub mod ingest;
mod openapi;

use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, FromRef};
use axum::routing::{get, post};
use axum::Router;

use crate::config::AuthMode;
use crate::openapi::Routes;
use crate::query::QueryState;
use ingest::IngestState;

/// What the API listener's routes need.
#[derive(Clone)]
pub struct ApiState {
    pub ingest: Arc<IngestState>,
    pub query: QueryState,
}

impl FromRef<ApiState> for Arc<IngestState> {
    fn from_ref(state: &ApiState) -> Self {
        state.ingest.clone()
    }
}

impl FromRef<ApiState> for QueryState {
    fn from_ref(state: &ApiState) -> Self {
        state.query.clone()
    }
}

/// Every route of the API listener; `max_request_bytes` is `[api] max_request_bytes`.
pub fn routes(max_request_bytes: usize, auth: AuthMode) -> Routes<ApiState> {
    Routes::new()
        .route(
            "/v1/ingest/{table}",
            post(ingest::ingest).layer(DefaultBodyLimit::max(max_request_bytes)),
        )
        .route("/v1/query", crate::query::route())
        .route("/openapi.json", get(move || openapi::document(auth)))
}

/// The API listener's router.
pub fn router(state: ApiState, max_request_bytes: usize, auth: AuthMode) -> Router {
    routes(max_request_bytes, auth)
        .map(|r| r.with_state(state))
        .into_router()
}
