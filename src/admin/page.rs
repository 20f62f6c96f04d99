//! `GET /admin/`: one self-contained page (no CDN, no build step) that shows the actor
//! tree, readiness and the DLQ, refreshed every 1.5 s. The page carries no data itself;
//! its script reads the JSON endpoints with the token from the URL fragment or a box.

use axum::http::header;
use axum::response::IntoResponse;

const PAGE: &str = include_str!("page.html");

pub async fn page() -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        PAGE,
    )
}
