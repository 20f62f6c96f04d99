//! The admin bearer token.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use super::AdminState;

/// With a token configured, every protected route wants `Authorization: Bearer <it>`.
/// Without one, the endpoint listens on loopback only and lets local callers in.
pub async fn require_token(
    State(state): State<Arc<AdminState>>,
    request: Request,
    next: Next,
) -> Response {
    let Some(token) = &state.token else {
        return next.run(request).await;
    };
    let presented = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().strip_prefix("Bearer "))
        .map(str::trim);
    match presented {
        Some(p) if token.matches(p) => next.run(request).await,
        Some(_) => (
            StatusCode::FORBIDDEN,
            Json(json!({ "error": "wrong admin token" })),
        )
            .into_response(),
        None => (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, "Bearer")],
            Json(json!({ "error": "the admin endpoint wants Authorization: Bearer <token>" })),
        )
            .into_response(),
    }
}
