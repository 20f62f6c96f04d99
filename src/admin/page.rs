//! `GET /admin/`: the page an operator acts from (what is stuck and why, and how to fix
//! it), served whole from the binary: its HTML, script, style sheet and icon are
//! compiled in, and its Content-Security-Policy lets it load nothing from anywhere
//! else. The page carries no data itself: its script reads the JSON routes with the
//! token the operator entered once (kept in the tab's sessionStorage), every 2 s.

use axum::http::header;
use axum::response::IntoResponse;

const HTML: &str = include_str!("page/index.html");
const SCRIPT: &str = include_str!("page/page.js");
const STYLE: &str = include_str!("page/page.css");
const ICON: &str = include_str!("page/favicon.svg");

/// Where the page's script and style sheet are served (the HTML names them).
pub const SCRIPT_PATH: &str = "/admin/assets/page.js";
pub const STYLE_PATH: &str = "/admin/assets/page.css";

/// Only this origin, for everything: no outside script, style, image or connection,
/// no inline script, and the page is never framed.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; \
connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

pub async fn page() -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
            (header::CONTENT_SECURITY_POLICY, CSP),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::REFERRER_POLICY, "no-referrer"),
        ],
        HTML,
    )
}

pub async fn script() -> impl IntoResponse {
    asset("text/javascript; charset=utf-8", SCRIPT)
}

pub async fn style() -> impl IntoResponse {
    asset("text/css; charset=utf-8", STYLE)
}

/// The browser asks for `/favicon.ico` by itself: an answer, so that no page of the
/// endpoint logs a 404 for it.
pub async fn favicon() -> impl IntoResponse {
    asset("image/svg+xml", ICON)
}

/// A compiled-in file; `no-cache` makes the browser check again rather than keep an
/// old binary's page.
fn asset(content_type: &'static str, body: &'static str) -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "no-cache"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        body,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_html_names_its_assets_and_nothing_from_elsewhere() {
        assert!(HTML.contains(&format!(r#"src="{SCRIPT_PATH}""#)));
        assert!(HTML.contains(&format!(r#"href="{STYLE_PATH}""#)));
        // No URL elsewhere; the script names the SVG namespace, which loads nothing.
        let script = SCRIPT.replace("\"http://www.w3.org/2000/svg\"", "");
        for text in [HTML, script.as_str(), STYLE] {
            assert!(!text.contains("http://") && !text.contains("https://"));
        }
        // No inline script: the policy would refuse it.
        assert_eq!(HTML.matches("<script").count(), 1);
        assert!(!HTML.contains("onclick="));
    }
}
