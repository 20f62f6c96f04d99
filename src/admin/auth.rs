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
        .and_then(bearer_token);
    match presented {
        // In constant time (`Secret::matches`): how long a refusal takes tells nothing
        // about how much of the token was right.
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

/// The token of `Bearer <token>`; the scheme is case-insensitive (RFC 9110 11.1), as
/// the ingest API reads it.
fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim().split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

#[cfg(test)]
mod tests {
    use super::bearer_token;

    #[test]
    fn bearer_scheme_any_case() {
        assert_eq!(bearer_token("Bearer abc"), Some("abc"));
        assert_eq!(bearer_token("bearer  abc "), Some("abc"));
        assert_eq!(bearer_token("BEARER abc"), Some("abc"));
        assert_eq!(bearer_token("Basic abc"), None);
        assert_eq!(bearer_token("Bearer "), None);
        assert_eq!(bearer_token("abc"), None);
    }
}
