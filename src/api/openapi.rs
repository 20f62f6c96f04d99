//! The API listener's OpenAPI document (`GET /openapi.json` on the API listener): the
//! ingest and query routes, every status each can answer with its body and headers,
//! and the two ways a request names its tenant.

use std::sync::OnceLock;

use axum::response::Response;
use serde_json::{json, Value};

use super::ingest::MAX_LISTED_ERRORS;
use crate::config::AuthMode;
use crate::openapi::{
    body_timeout_response, document as openapi_document, json_response, name_parameter,
    name_schema, schema, serve, TABLE_PATTERN, TENANT_PATTERN,
};
use crate::query::{ATTEMPTS_HEADER, MAX_REQUEST_BYTES, QUERY_ID_HEADER, RESULT_CAP_HEADER};

/// `GET /openapi.json`: the document of the running configuration's `[api] auth` (the
/// security a client must meet, and the answers it can get, are those of this listener).
pub async fn document(auth: AuthMode) -> Response {
    static BY_TOKEN: OnceLock<String> = OnceLock::new();
    static BY_HEADER: OnceLock<String> = OnceLock::new();
    match auth {
        AuthMode::Token => serve(&BY_TOKEN, || build(AuthMode::Token)),
        AuthMode::None => serve(&BY_HEADER, || build(AuthMode::None)),
    }
}

/// The document of a listener whose tenants are named as `auth` says.
pub fn build(auth: AuthMode) -> Value {
    let naming = match auth {
        AuthMode::Token => "by its bearer token (`tenantToken`: `[api] auth = \"token\"`)",
        AuthMode::None => "by its `X-Tenant` header (`[api] auth = \"none\"`: the API authenticates nobody, a proxy in front does)",
    };
    openapi_document(
        "Sluice API",
        &format!(
            "Rows into ClickHouse through NATS JetStream (`POST /v1/ingest/{{table}}`) and guarded \
             read-only queries (`POST /v1/query`). Every request names its tenant {naming}."
        ),
        paths(auth),
        components(auth),
    )
}

/// An operation as `auth` answers it. With `auth = "none"` the API authenticates
/// nobody (a proxy in front does): the tenant is a required `X-Tenant` header, a request
/// without one is a 400, and none is refused for a token (401).
fn answered_under(auth: AuthMode, mut operation: Value) -> Value {
    if auth == AuthMode::None {
        if let Some(responses) = operation["responses"].as_object_mut() {
            responses.remove("401");
        }
        let tenant = json!({
            "name": "X-Tenant",
            "in": "header",
            "required": true,
            "description": "The tenant the request is for, sent once.",
            "schema": name_schema(TENANT_PATTERN),
            "example": "acme",
        });
        match operation["parameters"].as_array_mut() {
            Some(parameters) => parameters.insert(0, tenant),
            None => operation["parameters"] = json!([tenant]),
        }
    }
    operation
}

/// Who may call: the tenant's bearer token, or (a proxy authenticating in front) nobody
/// is asked for anything.
fn tenant_security(auth: AuthMode) -> Value {
    match auth {
        AuthMode::Token => json!([{ "tenantToken": [] }]),
        AuthMode::None => json!([]),
    }
}

fn paths(auth: AuthMode) -> Value {
    json!({
        "/v1/ingest/{table}": {"post": answered_under(auth, ingest(auth))},
        "/v1/query": {"post": answered_under(auth, query(auth))},
        "/openapi.json": {"get": {
            "summary": "This document",
            "operationId": "openapi",
            "tags": ["meta"],
            "security": [],
            "responses": {"200": json_response("The OpenAPI document of the API listener.", json!({"type": "object"}))},
        }},
    })
}

fn ingest_reply(description: &str) -> Value {
    json_response(description, schema("IngestReply"))
}

/// An answer that is an ingest reply, or a refusal of the tenant before it.
fn ingest_reply_or_tenant(description: &str) -> Value {
    json_response(
        description,
        json!({"anyOf": [schema("IngestReply"), schema("TenantError")]}),
    )
}

/// An answer that may be given again, as it was, to a retry under the same
/// `Idempotency-Key`.
fn replayable(mut response: Value) -> Value {
    response["headers"] = json!({"Idempotent-Replayed": {
        "description": "`true` when this is the answer given before to a request with the same `Idempotency-Key` and body: nothing was stored this time.",
        "schema": {"type": "string", "enum": ["true"]},
    }});
    response
}

fn retry_after() -> Value {
    json!({"Retry-After": {
        "description": "Seconds to wait before sending the same request again.",
        "schema": {"type": "integer", "minimum": 1},
    }})
}

fn challenge() -> Value {
    json!({"WWW-Authenticate": {"schema": {"type": "string", "enum": ["Bearer"]}}})
}

fn ingest(auth: AuthMode) -> Value {
    // One row, or an array of them.
    let rows = json!({"oneOf": [
        {"type": "object"},
        {"type": "array", "minItems": 1, "items": {"type": "object"}},
    ]});
    let example = json!([{"id": 1, "name": "a"}, {"id": 2, "name": "b"}]);
    let content = json!({
        "application/json": {"schema": rows.clone(), "example": example.clone()},
        // The rows as an array here; on the wire one JSON object per line.
        "application/x-ndjson": {"schema": rows.clone(), "example": example},
        // The rows as an array here; on the wire each is an RFC 7464 record.
        "application/json-seq": {"schema": rows},
    });
    json!({
        "summary": "Send rows to a table",
        "description": "Stores the request's rows in the ingest stream, in messages of up to `[api] chunk_rows` rows, each acknowledged by JetStream before its rows count as accepted; Sluice then inserts them into the tenant's ClickHouse table. A row ClickHouse judges bad is parked on the dead-letter stream with the reason. Rows that are not JSON objects, too large or too deep are refused by index while the good rows of the request are accepted (400).",
        "operationId": "ingest",
        "tags": ["ingest"],
        "security": tenant_security(auth),
        "parameters": [
            name_parameter("table", TABLE_PATTERN, "The ClickHouse table, in the tenant's target's database.", "events"),
            {
                "name": "Idempotency-Key",
                "in": "header",
                "required": false,
                "description": "Makes a retry safe: the same body sent again with the same key (for this tenant and table) stores none of its rows twice and gets the first answer again (`Idempotent-Replayed: true`); another body under it is refused (422), and a retry while the first is in progress waits (409). 1 to 128 visible ASCII characters.",
                "schema": {"type": "string", "minLength": 1, "maxLength": 128, "pattern": "^[!-~]+$"},
            },
        ],
        "requestBody": {
            "required": true,
            "description": "The rows: a JSON object or an array of objects (`application/json`), one object per line (`application/x-ndjson`), or one object per RFC 7464 record (`application/json-seq`). The schemas of the last two show the rows as an array; on the wire each row is a line or a record.",
            "content": content,
        },
        "responses": {
            "202": replayable(ingest_reply("Every row was stored in the ingest stream.")),
            "400": replayable(ingest_reply_or_tenant("Some rows were refused (`errors` says which and why; the others were accepted), the body holds no rows or is not readable, the `Idempotency-Key` is not usable, the stream refused a message, or the request names no tenant (`X-Tenant` missing, not a name, or sent twice).")),
            "401": {
                "description": "No bearer token, or an `Authorization` header that is not `Bearer <token>`.",
                "headers": challenge(),
                "content": {"application/json": {"schema": schema("TenantError")}},
            },
            "403": ingest_reply_or_tenant("The token belongs to no tenant, or the tenant writes to as many tables as `[api] max_tables_per_tenant` allows."),
            "404": ingest_reply_or_tenant("Not a table name, a table the tenant's ClickHouse target does not have, or (with `auth = \"none\"`) no such tenant."),
            "408": body_timeout_response("[api]"),
            "409": {
                "description": "A request with the same `Idempotency-Key` (for this tenant and table) is in progress: send this one again after `Retry-After`; it then gets that request's answer.",
                "headers": retry_after(),
                "content": {"application/json": {"schema": schema("IngestReply")}},
            },
            "413": ingest_reply("The body is over `[api] max_request_bytes`: split it."),
            "415": ingest_reply("A `Content-Type` that is not taken: send `application/json`, `application/x-ndjson` or `application/json-seq`."),
            "422": ingest_reply("The `Idempotency-Key` was used for another body (for this tenant and table, within `[nats] duplicate_window`): a retry must send the same body; another request needs another key."),
            "503": {
                "description": "The stream is full or unreachable, or the requests in progress hold all of `[api] ingest_memory`: the rows counted in `not_stored` were not stored. Send the same body with the same `Idempotency-Key` again after `Retry-After`.",
                "headers": retry_after(),
                "content": {"application/json": {"schema": schema("IngestReply")}},
            },
        },
    })
}

fn query_error(description: &str) -> Value {
    json!({
        "description": description,
        "headers": {QUERY_ID_HEADER: query_id_header()},
        "content": {"application/json": {"schema": schema("QueryError")}},
    })
}

fn query_id_header() -> Value {
    json!({"description": "The query's id (in the logs and ClickHouse's query log).", "schema": {"type": "string"}})
}

fn retryable_query_error(description: &str) -> Value {
    let mut response = query_error(description);
    response["headers"]["Retry-After"] = retry_after()["Retry-After"].clone();
    response
}

fn query(auth: AuthMode) -> Value {
    let mut unauthorized =
        query_error("No bearer token, or an `Authorization` header that is not `Bearer <token>`.");
    unauthorized["headers"]["WWW-Authenticate"] = challenge()["WWW-Authenticate"].clone();
    json!({
        "summary": "Run a read-only query",
        "description": "Runs one read statement as `[query]`'s user with a server-side time limit below the request's deadline, `KILL QUERY` when the deadline passes, and retries of outages only, under a global retry budget. Statements that could change the limits or reach around them (`SETTINGS`, `FORMAT`, most table functions and system tables) are refused (400).",
        "operationId": "query",
        "tags": ["query"],
        "security": tenant_security(auth),
        "requestBody": {
            "required": true,
            "description": format!("At most {MAX_REQUEST_BYTES} bytes."),
            "content": {"application/json": {
                "schema": schema("QueryRequest"),
                "example": {"sql": "SELECT count() AS rows FROM events", "timeout_ms": 5000},
            }},
        },
        "responses": {
            "200": {
                "description": "The result, in ClickHouse's JSON or JSONCompact format.",
                "headers": {
                    QUERY_ID_HEADER: query_id_header(),
                    ATTEMPTS_HEADER: {"description": "Attempts the query took.", "schema": {"type": "integer", "minimum": 1}},
                    RESULT_CAP_HEADER: {"description": "The byte cap applied to the result (`[query] max_result_bytes`), when one is.", "schema": {"type": "integer"}},
                },
                "content": {"application/json": {"schema": schema("QueryResult")}},
            },
            "400": query_error("The body is not a query request, the statement is refused, ClickHouse rejected it, or the result is over the gateway's cap."),
            "401": unauthorized,
            "403": query_error("The token belongs to no tenant, the statement writes, or ClickHouse refused the query user."),
            "404": query_error("The gateway is off (no `[query]` section), the statement names a table, column or identifier ClickHouse does not have, or (with `auth = \"none\"`) no such tenant."),
            "408": body_timeout_response("[api]"),
            "429": retryable_query_error("The workload or the tenant is at its concurrency limit: no queue, send it again later."),
            "502": query_error("ClickHouse answered with an error nothing explains."),
            "503": retryable_query_error("ClickHouse is unavailable (after the retries the budget allowed)."),
            "504": query_error("The query ran out of time (`stopped_by` says whether ClickHouse or Sluice stopped it; `kill_confirmed` whether it is gone)."),
        },
    })
}

fn components(auth: AuthMode) -> Value {
    // The one way this listener takes a tenant; none to authenticate with `auth = "none"`.
    let schemes = match auth {
        AuthMode::Token => json!({"tenantToken": {
            "type": "http",
            "scheme": "bearer",
            "description": "`[api] auth = \"token\"`: the tenant's token (from the variable its `token_env` names). The token names the tenant.",
        }}),
        AuthMode::None => json!({}),
    };
    json!({
        "securitySchemes": schemes,
        "schemas": {
            "RowError": {
                "type": "object",
                "required": ["index", "reason"],
                "properties": {
                    "index": {"type": "integer", "minimum": 0, "description": "The row's position in the request, from 0."},
                    "line": {"type": "integer", "minimum": 1, "description": "For NDJSON, the line it was on."},
                    "reason": {"type": "string"},
                },
            },
            "IngestReply": {
                "type": "object",
                "required": ["accepted", "duplicates", "rejected", "not_stored", "errors"],
                "properties": {
                    "accepted": {"type": "integer", "minimum": 0, "description": "Rows stored in the ingest stream, by this request or an earlier one under the same Idempotency-Key."},
                    "duplicates": {"type": "integer", "minimum": 0, "description": "Of the accepted rows, those an earlier request under the same Idempotency-Key stored: stored once."},
                    "rejected": {"type": "integer", "minimum": 0, "description": "Rows refused."},
                    "not_stored": {"type": "integer", "minimum": 0, "description": "Rows not stored because the stream was full or unreachable: send them again."},
                    "errors": {"type": "array", "maxItems": MAX_LISTED_ERRORS, "items": schema("RowError"), "description": format!("The first {MAX_LISTED_ERRORS} refused rows.")},
                    "error": {"type": "string", "description": "Why the request, or its rest, was not taken."},
                },
            },
            "TenantError": {
                "type": "object",
                "required": ["error", "code", "class", "retryable"],
                "properties": {
                    "error": {"type": "string"},
                    "code": {"type": "integer", "nullable": true, "description": "Always null: the refusal is Sluice's own."},
                    "class": {"type": "string", "enum": ["denied", "rejected"]},
                    "retryable": {"type": "boolean"},
                },
            },
            "QueryRequest": {
                "type": "object",
                "additionalProperties": false,
                "required": ["sql"],
                "properties": {
                    "sql": {"type": "string", "description": "One read statement; `{name:Type}` placeholders take `params`."},
                    "params": {"type": "object", "additionalProperties": {"nullable": true, "oneOf": [{"type": "string"}, {"type": "number"}, {"type": "boolean"}]}},
                    "timeout_ms": {"type": "integer", "minimum": 1, "nullable": true, "description": "The deadline; at most `[query] max_timeout`; null or absent: `[query] default_timeout`."},
                    "format": {"type": "string", "nullable": true, "description": "`JSON` (rows as objects; null or absent) or `JSONCompact` (rows as arrays), any case."},
                },
            },
            "QueryResult": {
                "type": "object",
                "required": ["meta", "data"],
                "properties": {
                    "meta": {"type": "array", "items": {"type": "object", "properties": {"name": {"type": "string"}, "type": {"type": "string"}}}},
                    "data": {"type": "array"},
                    "rows": {"type": "integer"},
                    "statistics": {"type": "object"},
                },
            },
            "QueryError": {
                "type": "object",
                "required": ["error", "code", "class", "retryable", "query_id"],
                "properties": {
                    "error": {"type": "string"},
                    "code": {"type": "integer", "nullable": true, "description": "ClickHouse's exception code, or null when the gateway refused the request itself."},
                    "class": {"type": "string", "enum": ["rejected", "denied", "unavailable", "unknown", "timeout"]},
                    "retryable": {"type": "boolean", "description": "Whether the same request later is sensible (429 and 503)."},
                    "query_id": {"type": "string"},
                    "attempts": {"type": "integer", "minimum": 0},
                    "clickhouse_status": {"type": "integer"},
                    "timeout_ms": {"type": "integer"},
                    "stopped_by": {"type": "string", "enum": ["clickhouse", "sluice"]},
                    "kill_sent": {"type": "boolean"},
                    "kill_confirmed": {"type": "boolean"},
                    "limit_bytes": {"type": "integer"},
                },
            },
        },
    })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;
    use crate::openapi::{dangling_refs, documented_paths, documented_statuses};
    use crate::telemetry::metrics::{INGEST_STATUSES, QUERY_STATUSES};

    #[test]
    fn every_routed_path_is_documented_and_nothing_else() {
        for auth in [AuthMode::Token, AuthMode::None] {
            let doc = build(auth);
            let routed: BTreeSet<String> = super::super::routes(1 << 20, auth)
                .paths()
                .iter()
                .map(|p| p.to_string())
                .collect();
            assert_eq!(documented_paths(&doc), routed);
            assert_eq!(dangling_refs(&doc), Vec::<String>::new());
        }
    }

    #[test]
    fn the_statuses_are_those_the_metrics_count() {
        let doc = build(AuthMode::Token);
        let ingest: BTreeSet<u16> = INGEST_STATUSES.iter().copied().collect();
        assert_eq!(
            documented_statuses(&doc, "/v1/ingest/{table}", "post"),
            ingest
        );
        let query: BTreeSet<u16> = QUERY_STATUSES.iter().copied().collect();
        assert_eq!(documented_statuses(&doc, "/v1/query", "post"), query);
    }

    /// issue 38.6: the document served describes the running configuration: a bearer
    /// token where one is asked for; with `auth = "none"` no security at all (the API
    /// authenticates nobody), the tenant a required `X-Tenant` header, and no 401.
    #[test]
    fn the_document_describes_the_tenants_as_the_configuration_names_them() {
        let doc = build(AuthMode::Token);
        assert!(doc["components"]["securitySchemes"]["tenantToken"].is_object());
        let doc_none = build(AuthMode::None);
        assert_eq!(doc_none["components"]["securitySchemes"], json!({}));
        for path in ["/v1/ingest/{table}", "/v1/query"] {
            let operation = &doc["paths"][path]["post"];
            assert_eq!(
                operation["security"],
                json!([{ "tenantToken": [] }]),
                "{path}"
            );
            assert!(documented_statuses(&doc, path, "post").contains(&401));

            let operation = &doc_none["paths"][path]["post"];
            assert_eq!(operation["security"], json!([]), "{path}");
            assert!(!documented_statuses(&doc_none, path, "post").contains(&401));
            let tenant = &operation["parameters"][0];
            assert_eq!(
                (&tenant["name"], &tenant["in"], &tenant["required"]),
                (&json!("X-Tenant"), &json!("header"), &json!(true)),
                "{path}"
            );
        }
    }
}
