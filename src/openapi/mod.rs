//! The OpenAPI 3 documents each listener serves at `/openapi.json` (the API's is
//! written beside the API in `api::openapi`, the admin endpoint's beside it in
//! `admin::openapi`), and what they share: the route recorder their routers are built
//! with, so a test holds each document against the routes really served, the pieces
//! every document repeats, and serving one.
//!
//! The documents are written by hand, as data; what keeps them true: the tests beside
//! each (every routed path documented and nothing else, the status lists the metrics
//! register), the integration test that probes every documented method and every other
//! one, and schemathesis run against a live Sluice on real servers in the test suite
//! (every answer as documented).

mod routes;

use std::collections::BTreeSet;
use std::sync::OnceLock;

use axum::http::header;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use crate::config::MAX_NAME_LEN;
pub use routes::Routes;

/// The OpenAPI version the documents are written in.
pub const OPENAPI_VERSION: &str = "3.0.3";

/// A whole document.
pub fn document(title: &str, description: &str, paths: Value, components: Value) -> Value {
    json!({
        "openapi": OPENAPI_VERSION,
        "info": {
            "title": title,
            "version": env!("CARGO_PKG_VERSION"),
            "description": description,
            "license": {"name": "Apache-2.0"},
        },
        "paths": paths,
        "components": components,
    })
}

/// `{"$ref": "#/components/schemas/<name>"}`.
pub fn schema(name: &str) -> Value {
    json!({ "$ref": format!("#/components/schemas/{name}") })
}

/// A response with a JSON body.
pub fn json_response(description: &str, body: Value) -> Value {
    json!({
        "description": description,
        "content": {"application/json": {"schema": body}},
    })
}

/// The 408 a listener answers when a request's body did not arrive within its
/// `body_timeout` (`section`: `[api]` or `[admin]`), whatever the operation; the
/// connection closes after it.
pub fn body_timeout_response(section: &str) -> Value {
    json!({
        "description": format!("The body did not arrive within `{section} body_timeout` (30 s by default): send the request again, faster. The connection is closed."),
        "headers": {"Connection": {"schema": {"type": "string", "enum": ["close"]}}},
        "content": {"application/json": {"schema": {
            "type": "object",
            "required": ["error"],
            "properties": {"error": {"type": "string"}},
        }}},
    })
}

/// A response with a body of another media type (text, HTML, an image).
pub fn media_response(description: &str, media_type: &str) -> Value {
    json!({
        "description": description,
        "content": {media_type: {"schema": {"type": "string"}}},
    })
}

/// A tenant's name, as `config::is_tenant_name` takes it.
pub const TENANT_PATTERN: &str = "^[A-Za-z_][A-Za-z0-9_-]*$";
/// A table's name, as `config::is_table_name` takes it.
pub const TABLE_PATTERN: &str = "^[A-Za-z_][A-Za-z0-9_]*$";

/// The schema of a tenant's or a table's name.
pub fn name_schema(pattern: &str) -> Value {
    json!({"type": "string", "pattern": pattern, "minLength": 1, "maxLength": MAX_NAME_LEN})
}

/// A path parameter holding a tenant's or a table's name.
pub fn name_parameter(name: &str, pattern: &str, description: &str, example: &str) -> Value {
    json!({
        "name": name,
        "in": "path",
        "required": true,
        "description": description,
        "schema": name_schema(pattern),
        "example": example,
    })
}

/// An integer query parameter from `minimum` to `maximum`.
pub fn count_parameter(name: &str, minimum: u64, maximum: u64, description: &str) -> Value {
    json!({
        "name": name,
        "in": "query",
        "required": false,
        "description": description,
        "schema": {"type": "integer", "minimum": minimum, "maximum": maximum},
    })
}

/// Serves a document, built once.
pub fn serve(built: &'static OnceLock<String>, build: impl FnOnce() -> Value) -> Response {
    let text = built.get_or_init(|| build().to_string());
    (
        [
            (header::CONTENT_TYPE, "application/json"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        text.as_str(),
    )
        .into_response()
}

/// The paths a document describes.
pub fn documented_paths(document: &Value) -> BTreeSet<String> {
    document["paths"]
        .as_object()
        .map(|paths| paths.keys().cloned().collect())
        .unwrap_or_default()
}

/// Every `$ref` of a document that points at nothing in it, for the tests.
pub fn dangling_refs(document: &Value) -> Vec<String> {
    fn walk(node: &Value, root: &Value, out: &mut Vec<String>) {
        match node {
            Value::Object(map) => {
                if let Some(Value::String(target)) = map.get("$ref") {
                    let found = target
                        .strip_prefix('#')
                        .and_then(|pointer| root.pointer(pointer));
                    if found.is_none() {
                        out.push(target.clone());
                    }
                }
                map.values().for_each(|v| walk(v, root, out));
            }
            Value::Array(items) => items.iter().for_each(|v| walk(v, root, out)),
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(document, document, &mut out);
    out
}

/// The statuses a document gives one operation.
pub fn documented_statuses(document: &Value, path: &str, method: &str) -> BTreeSet<u16> {
    document["paths"][path][method]["responses"]
        .as_object()
        .map(|r| r.keys().filter_map(|s| s.parse().ok()).collect())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dangling_ref_is_found() {
        let doc = json!({
            "components": {"schemas": {"A": {"type": "string"}}},
            "paths": {"/x": {"get": {"responses": {"200": {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/B"}}}}}}}},
            "more": [{"$ref": "#/components/schemas/A"}],
        });
        assert_eq!(
            dangling_refs(&doc),
            vec!["#/components/schemas/B".to_string()]
        );
        assert_eq!(
            documented_statuses(&doc, "/x", "get"),
            BTreeSet::from([200])
        );
    }
}
