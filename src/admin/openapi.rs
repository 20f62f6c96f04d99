//! The admin endpoint's OpenAPI document (`GET /openapi.json` on the admin listener):
//! every route of `admin::router`, every status each can answer and its body, and
//! which want the admin token.

use std::sync::OnceLock;

use crate::config::MAX_NAME_LEN;
use axum::response::Response;
use serde_json::{json, Value};
use sluice_actors::observe::NodeKind;

use super::dlq::{MAX_LIMIT, PEEK_DEFAULT, REPLAY_DEFAULT};
use super::page::{SCRIPT_PATH, STYLE_PATH};
use crate::openapi::{
    body_timeout_response, count_parameter, document as openapi_document, json_response,
    media_response, name_parameter, name_schema, schema, serve, TABLE_PATTERN, TENANT_PATTERN,
};

pub async fn document() -> Response {
    static BUILT: OnceLock<String> = OnceLock::new();
    serve(&BUILT, build)
}

/// The document.
pub fn build() -> Value {
    openapi_document(
        "Sluice admin endpoint",
        "Health, readiness and metrics for the orchestrator and the scraper; the live actor \
         tree, each table's row rates, the NATS side and the dead-letter queue for the \
         operator, and the page that shows them. Routes marked with `adminToken` want \
         `Authorization: Bearer <token>` when `[admin] token_env` names one; without a \
         token the endpoint listens on loopback only and asks for none.",
        paths(),
        components(),
    )
}

/// The answers every route with the token check can give.
fn guarded(mut responses: Value) -> Value {
    responses["401"] = json!({
        "description": "No `Authorization: Bearer <token>` header.",
        "headers": {"WWW-Authenticate": {"schema": {"type": "string", "enum": ["Bearer"]}}},
        "content": {"application/json": {"schema": schema("Error")}},
    });
    responses["403"] = json_response("The token is not the admin token.", schema("Error"));
    responses
}

/// `<tenant>.<table>`: what a purge's `confirm` must look like (the two names of its
/// path, which OpenAPI cannot say).
fn confirm_pattern() -> String {
    let bare = |p: &str| p.trim_start_matches('^').trim_end_matches('$').to_string();
    format!("^{}\\.{}$", bare(TENANT_PATTERN), bare(TABLE_PATTERN))
}

fn token() -> Value {
    json!([{ "adminToken": [] }])
}

fn open() -> Value {
    json!([])
}

fn error(description: &str) -> Value {
    json_response(description, schema("Error"))
}

fn tenant_table() -> Value {
    json!([
        name_parameter("tenant", TENANT_PATTERN, "The tenant.", "acme"),
        name_parameter("table", TABLE_PATTERN, "The table.", "events"),
    ])
}

fn bad_names() -> Value {
    error("A tenant or table that is not a name, or a query string that does not parse.")
}

fn unavailable() -> Value {
    error("The DLQ stream cannot be read or written right now (NATS is unreachable).")
}

fn fault_injection_off() -> Value {
    error("Fault injection is off (`[admin] fault_injection = true` turns it on).")
}

fn paths() -> Value {
    let page = json!({"get": {
        "summary": "The admin page",
        "description": "The page an operator acts from: rates and plots per table, each ClickHouse target's breaker, the NATS side, the DLQ with replay and purge. Self-contained (no outside asset); its script reads the routes below with the token entered on the page.",
        "operationId": "page",
        "tags": ["page"],
        "security": open(),
        "responses": {"200": media_response("The page.", "text/html")},
    }});
    json!({
        "/healthz": {"get": {
            "summary": "Liveness",
            "operationId": "healthz",
            "tags": ["probes"],
            "security": open(),
            "responses": {"200": json_response("The process is alive.", json!({
                "type": "object",
                "required": ["status"],
                "properties": {"status": {"type": "string", "enum": ["alive"]}},
            }))},
        }},
        "/readyz": {"get": {
            "summary": "Readiness",
            "description": "Ready when NATS is connected, the consumer runs and every ClickHouse target answered a probe.",
            "operationId": "readyz",
            "tags": ["probes"],
            "security": open(),
            "responses": {
                "200": json_response("Ready.", schema("Readiness")),
                "503": json_response("Not ready, with every reason.", schema("Readiness")),
            },
        }},
        "/metrics": {"get": {
            "summary": "Prometheus metrics",
            "operationId": "metrics",
            "tags": ["probes"],
            "security": open(),
            "responses": {"200": media_response("The Prometheus text format 0.0.4.", "text/plain")},
        }},
        "/openapi.json": {"get": {
            "summary": "This document",
            "operationId": "openapi",
            "tags": ["probes"],
            "security": open(),
            "responses": {"200": json_response("The OpenAPI document of the admin endpoint.", json!({"type": "object"}))},
        }},
        "/favicon.ico": {"get": {
            "summary": "The page's icon",
            "operationId": "favicon",
            "tags": ["page"],
            "security": open(),
            "responses": {"200": media_response("An SVG icon.", "image/svg+xml")},
        }},
        "/admin": page.clone(),
        "/admin/": page,
        SCRIPT_PATH: {"get": {
            "summary": "The page's script",
            "operationId": "pageScript",
            "tags": ["page"],
            "security": open(),
            "responses": {"200": media_response("JavaScript.", "text/javascript")},
        }},
        STYLE_PATH: {"get": {
            "summary": "The page's style sheet",
            "operationId": "pageStyle",
            "tags": ["page"],
            "security": open(),
            "responses": {"200": media_response("CSS.", "text/css")},
        }},
        "/admin/actors": {"get": {
            "summary": "The live actor tree",
            "description": "Each actor's published snapshot: the consumer, each ClickHouse target's pool (its breaker) and each table (buffer, backoff, exactly-once state, a missing table's grace). Read without waiting on any actor.",
            "operationId": "actors",
            "tags": ["pipeline"],
            "security": token(),
            "responses": guarded(json!({"200": json_response("The tree, from its root.", schema("TreeNode"))})),
        }},
        "/admin/rates": {"get": {
            "summary": "Each table's row rates",
            "description": "Rows per second received, inserted and parked per table over the last minute, and a point per sample over the last ten minutes, from samples of the row counters kept in the process.",
            "operationId": "rates",
            "tags": ["pipeline"],
            "security": token(),
            "responses": guarded(json!({"200": json_response("The rates.", schema("Rates"))})),
        }},
        "/admin/nats": {"get": {
            "summary": "The NATS side",
            "description": "The connection, the server it reached, the stream, the consumer and its lag, as the process knows them (nothing is asked of NATS).",
            "operationId": "nats",
            "tags": ["pipeline"],
            "security": token(),
            "responses": guarded(json!({"200": json_response("The NATS overview.", schema("Nats"))})),
        }},
        "/admin/dlq": {"get": {
            "summary": "Parked rows per table",
            "operationId": "dlqCounts",
            "tags": ["dlq"],
            "security": token(),
            "responses": guarded(json!({
                "200": json_response("The counts.", schema("DlqCounts")),
                "503": unavailable(),
            })),
        }},
        "/admin/dlq/replay": {"post": {
            "summary": "Replay a table's parked rows",
            "description": "Publishes up to `limit` parked rows of the table back to the ingest stream, each under its replay id (the DLQ stream, its creation time and the row's sequence there) with a mark written first, and removes each from the DLQ once the stream stored it. Rows that are not JSON objects stay parked (`skipped`); so does a row whose earlier replay was cut off before the stream's answer (`failed`, with the reason: a replay never publishes it again). `dry_run` counts without changing anything.",
            "operationId": "dlqReplay",
            "tags": ["dlq"],
            "security": token(),
            "requestBody": {"required": true, "content": {"application/json": {"schema": schema("ReplayRequest")}}},
            "responses": guarded(json!({
                "200": json_response("What the replay did.", schema("ReplayReport")),
                "400": error("The body is not a replay request, names no tenant or table, or asks for no row or more rows than the most."),
                "408": body_timeout_response("[admin]"),
                "503": unavailable(),
            })),
        }},
        "/admin/dlq/{tenant}/{table}": {
            "parameters": tenant_table(),
            "get": {
                "summary": "Peek at a table's parked rows",
                "description": "A page of parked rows, oldest first, with every `Sluice-*` header (the reason, where the row came from); nothing is consumed.",
                "operationId": "dlqPeek",
                "tags": ["dlq"],
                "security": token(),
                "parameters": [
                    count_parameter("limit", 1, MAX_LIMIT as u64, &format!("Rows on the page (default {PEEK_DEFAULT}).")),
                    count_parameter("after", 0, u64::MAX, "Only rows whose DLQ sequence is above this: the previous page's `next_after`."),
                ],
                "responses": guarded(json!({
                    "200": json_response("A page of rows.", schema("PeekPage")),
                    "400": error("A tenant or table that is not a name, a `limit` over the most, or a query string that does not parse."),
                    "503": unavailable(),
                })),
            },
            "delete": {
                "summary": "Purge a table's parked rows",
                "description": "Deletes every parked row of the table. It cannot be undone, so the request names the table twice: `?confirm=<tenant>.<table>`.",
                "operationId": "dlqPurge",
                "tags": ["dlq"],
                "security": token(),
                "parameters": [{
                    "name": "confirm",
                    "in": "query",
                    "required": true,
                    "description": "`<tenant>.<table>`, the table named again; without it, or with another name, nothing is deleted (400).",
                    "schema": {"type": "string", "pattern": confirm_pattern(), "minLength": 3, "maxLength": 2 * MAX_NAME_LEN + 1},
                    "example": "acme.events",
                }],
                "responses": guarded(json!({
                    "200": json_response("The rows were deleted.", schema("Purged")),
                    "400": error("No or another `confirm`, or a tenant or table that is not a name."),
                    "503": unavailable(),
                })),
            },
        },
        "/admin/debug/panic/{tenant}/{table}": {"post": {
            "summary": "Fault injection: panic a table's actor",
            "description": "For chaos tests only: makes the table's actor panic, to see the supervisor respawn it. Answers 404 unless `[admin] fault_injection = true`.",
            "operationId": "debugPanicTable",
            "tags": ["debug"],
            "security": token(),
            "parameters": tenant_table(),
            "responses": guarded(json!({
                "200": json_response("The actor was told to panic.", schema("Panicked")),
                "400": bad_names(),
                "404": fault_injection_off(),
                "409": error("The table has no running actor."),
            })),
        }},
        "/admin/debug/panic-pool/{target}": {"post": {
            "summary": "Fault injection: panic a target's pool actor",
            "description": "For chaos tests only. Answers 404 unless `[admin] fault_injection = true`.",
            "operationId": "debugPanicPool",
            "tags": ["debug"],
            "security": token(),
            "parameters": [{
                "name": "target",
                "in": "path",
                "required": true,
                "description": "The ClickHouse target's name.",
                "schema": {"type": "string"},
                "example": "main",
            }],
            "responses": guarded(json!({
                "200": json_response("The actor was told to panic.", schema("Panicked")),
                "404": fault_injection_off(),
                "409": error("No such target, or its pool is not running."),
            })),
        }},
    })
}

/// `Nats.partitions`: each partition of the queue.
fn nats_partitions() -> Value {
    json!({
        "type": "array",
        "description": "Each partition of the queue ([nats] partitions; one when not partitioned): its stream, its consumer's lag and figures, where its leaders are.",
        "items": {
            "type": "object",
            "required": ["stream", "subjects", "consumer_lag_messages", "pulled_messages", "pulled_rows", "stalls", "waiting_for", "placement"],
            "properties": {
                "stream": {"type": "string"},
                "subjects": {"type": "string"},
                "consumer_lag_messages": {"type": "integer", "nullable": true},
                "pulled_messages": {"type": "integer", "minimum": 0},
                "pulled_rows": {"type": "integer", "minimum": 0},
                "stalls": {"type": "integer", "minimum": 0},
                "waiting_for": {"type": "string", "nullable": true},
                "placement": {"type": "object", "nullable": true},
            },
        },
    })
}

/// `Nats.publishers`: whether other publishers' subjects reach the queue.
fn nats_publishers() -> Value {
    json!({
        "type": "object",
        "nullable": true,
        "description": "Whether what other publishers publish (<subject_prefix>.<tenant>.<table>[.<key>]) reaches a stream of the queue, as last asked of the server (every minute; null before the first answer). With partitions only the server's subject mapping sends it there; `sluice check-config` prints the mapping to give.",
        "required": ["asked", "astray", "examples", "unanswered"],
        "properties": {
            "asked": {"type": "integer", "minimum": 0, "description": "Subjects asked of."},
            "astray": {"type": "integer", "minimum": 0, "description": "Those that reached no stream of the queue (sluice_nats_subjects_astray)."},
            "examples": {"type": "array", "items": {
                "type": "object",
                "required": ["subject", "reached"],
                "properties": {
                    "subject": {"type": "string"},
                    "reached": {"type": "string", "nullable": true, "description": "The stream that took it, one Sluice does not read; null: none did (publishers get \"no responders\")."},
                },
            }},
            "unanswered": {"type": "integer", "minimum": 0, "description": "Asks with no answer (NATS away): the check says nothing of them."},
        },
    })
}

fn components() -> Value {
    let nullable_string = json!({"type": "string", "nullable": true});
    json!({
        "securitySchemes": {
            "adminToken": {
                "type": "http",
                "scheme": "bearer",
                "description": "The admin token, from the variable `[admin] token_env` names.",
            },
        },
        "schemas": {
            "Error": {
                "type": "object",
                "required": ["error"],
                "properties": {"error": {"type": "string", "description": "What went wrong, and what to do."}},
            },
            "Readiness": {
                "type": "object",
                "required": ["ready"],
                "properties": {
                    "ready": {"type": "boolean"},
                    "reasons": {"type": "array", "items": {"type": "string"}},
                },
            },
            "TreeNode": {
                "type": "object",
                "required": ["kind", "name", "status", "restarts", "snapshot_age_ms", "stale", "state", "children"],
                "properties": {
                    "kind": {"type": "string", "enum": NodeKind::ALL.map(NodeKind::name)},
                    "name": {"type": "string"},
                    "status": {"type": "string", "enum": ["starting", "running", "stopping", "failed", "restarting"]},
                    "restarts": {"type": "integer", "minimum": 0},
                    "last_error": {"type": "string"},
                    "snapshot_age_ms": {"type": "integer", "minimum": 0},
                    "stale": {"type": "boolean", "description": "The actor should have published and has not for longer than the stale threshold."},
                    "state": {
                        "type": "object",
                        "description": "The kind's snapshot: a consumer's connection, pulls and lag (`pending`); a target's shards; a pool's `breaker`, probe, server version, shard and replica; a table's buffer, `backoff`, counts, `exactly_once` with `exactly_once_why`, `missing_table` with `grace_left_ms`.",
                    },
                    "children": {"type": "array", "items": schema("TreeNode")},
                },
            },
            "RateFigures": {
                "type": "object",
                "required": ["received", "inserted", "parked"],
                "properties": {
                    "received": {"type": "number", "minimum": 0},
                    "inserted": {"type": "number", "minimum": 0},
                    "parked": {"type": "number", "minimum": 0},
                },
            },
            "TableRates": {
                "type": "object",
                "required": ["tenant", "table", "last_minute", "received_total", "inserted_total", "parked_total", "series"],
                "properties": {
                    "tenant": {"type": "string"},
                    "table": {"type": "string"},
                    "last_minute": {
                        "description": "Rows per second over the last minute (or the samples there are); null until two samples were taken.",
                        "nullable": true,
                        "allOf": [schema("RateFigures")],
                    },
                    "received_total": {"type": "integer", "minimum": 0},
                    "inserted_total": {"type": "integer", "minimum": 0},
                    "parked_total": {"type": "integer", "minimum": 0},
                    "series": {
                        "type": "object",
                        "description": "A point per sample interval, oldest first: the interval's rates, and how many seconds before this answer it ended.",
                        "required": ["ago_s", "received", "inserted", "parked"],
                        "properties": {
                            "ago_s": {"type": "array", "items": {"type": "number", "minimum": 0}},
                            "received": {"type": "array", "items": {"type": "number", "minimum": 0}},
                            "inserted": {"type": "array", "items": {"type": "number", "minimum": 0}},
                            "parked": {"type": "array", "items": {"type": "number", "minimum": 0}},
                        },
                    },
                },
            },
            "Rates": {
                "type": "object",
                "required": ["period_s", "window_s", "untracked_tables", "tables"],
                "properties": {
                    "period_s": {"type": "integer", "description": "Seconds between samples."},
                    "window_s": {"type": "integer", "description": "How far back the series go."},
                    "untracked_tables": {"type": "integer", "minimum": 0, "description": "Tables not kept, the most being kept already."},
                    "tables": {"type": "array", "items": schema("TableRates")},
                },
            },
            "Nats": {
                "type": "object",
                "required": ["connected", "url", "server", "stream", "subjects", "consumer", "dlq_stream", "consumer_lag_messages", "pulled_messages", "pulled_rows", "reconnects", "last_error", "stalls", "last_stall", "waiting_for", "placement", "partitions", "publishers"],
                "properties": {
                    "connected": {"type": "boolean"},
                    "url": {"type": "string", "description": "The seeds of `[nats] url`, as configured."},
                    "server": {
                        "type": "object",
                        "nullable": true,
                        "description": "The server the connection reached; null before it reached one.",
                        "required": ["name", "version", "address", "cluster", "jetstream"],
                        "properties": {
                            "name": {"type": "string"},
                            "version": {"type": "string"},
                            "address": {"type": "string"},
                            "cluster": nullable_string,
                            "jetstream": {"type": "boolean"},
                        },
                    },
                    "stream": {"type": "string"},
                    "subjects": {"type": "string"},
                    "consumer": {"type": "string"},
                    "dlq_stream": {"type": "string"},
                    "consumer_lag_messages": {"type": "integer", "nullable": true, "description": "Messages not yet delivered to the consumer."},
                    "pulled_messages": {"type": "integer", "minimum": 0},
                    "pulled_rows": {"type": "integer", "minimum": 0},
                    "reconnects": {"type": "integer", "minimum": 0},
                    "last_error": nullable_string,
                    "stalls": {"type": "integer", "minimum": 0, "description": "Pulls found lost and replaced without a restart (sluice_consumer_stalls_total)."},
                    "last_stall": {"type": "string", "nullable": true, "enum": ["heartbeats_missed", "leadership_change", "pending_undelivered", "stream_ahead_of_consumer", "acks_held_by_nobody", null], "description": "Why the last lost pull was replaced."},
                    "waiting_for": {"type": "string", "nullable": true, "enum": ["consumer_leader", "manifest_index", null], "description": "What the consumer waits for before it pulls again (an election, the manifest index), while it waits."},
                    "placement": {
                        "type": "object",
                        "nullable": true,
                        "description": "Where the stream and the consumer live, as the last lag poll read them: the server connected to, each group's leader (null during an election) and replicas with their lag.",
                        "required": ["connected_server"],
                        "properties": {
                            "connected_server": {"type": "string"},
                            "stream": schema("NatsGroup"),
                            "consumer": schema("NatsGroup"),
                        },
                    },
                    "partitions": nats_partitions(),
                    "publishers": nats_publishers(),
                },
            },
            "NatsGroup": {
                "type": "object",
                "required": ["name", "leader", "replicas"],
                "properties": {
                    "name": {"type": "string"},
                    "leader": nullable_string,
                    "replicas": {"type": "array", "items": {
                        "type": "object",
                        "required": ["name", "current", "offline"],
                        "properties": {
                            "name": {"type": "string"},
                            "current": {"type": "boolean"},
                            "offline": {"type": "boolean"},
                            "lag": {"type": "integer", "minimum": 0},
                        },
                    }},
                },
            },
            "DlqCounts": {
                "type": "object",
                "required": ["total", "tables"],
                "properties": {
                    "total": {"type": "integer", "minimum": 0},
                    "tables": {"type": "array", "items": {
                        "type": "object",
                        "required": ["tenant", "table", "rows"],
                        "properties": {
                            "tenant": {"type": "string"},
                            "table": {"type": "string"},
                            "rows": {"type": "integer", "minimum": 0},
                        },
                    }},
                },
            },
            "ParkedRow": {
                "type": "object",
                "required": ["sequence", "subject", "headers", "row"],
                "properties": {
                    "sequence": {"type": "integer", "minimum": 1, "description": "The row's sequence in the DLQ stream."},
                    "subject": {"type": "string"},
                    "headers": {
                        "type": "object",
                        "description": "Every `Sluice-*` header: `Sluice-Error-Class`, `Sluice-Error-Code`, `Sluice-Error` (ClickHouse's reason), `Sluice-Original-Subject`, `Sluice-Original-Sequence`, `Sluice-Deliveries`, `Sluice-Parked-At` (RFC 3339), `Sluice-Original-Line`.",
                        "additionalProperties": {"type": "string"},
                    },
                    "row": {"type": "string", "description": "The row as parked, byte for byte: its text, never parsed and printed again (keys in their order, numbers and escapes as written). Bytes that are not UTF-8 show as U+FFFD here, and exactly in `row_base64`."},
                    "row_base64": {"type": "string", "format": "byte", "description": "The row's bytes in base64; only when they are not UTF-8."},
                },
            },
            "PeekPage": {
                "type": "object",
                "required": ["tenant", "table", "rows", "next_after"],
                "properties": {
                    "tenant": {"type": "string"},
                    "table": {"type": "string"},
                    "rows": {"type": "array", "items": schema("ParkedRow")},
                    "next_after": {"type": "integer", "nullable": true, "description": "`after` for the next page; null on the last page."},
                },
            },
            "ReplayRequest": {
                "type": "object",
                "additionalProperties": false,
                "required": ["tenant", "table"],
                "properties": {
                    "tenant": name_schema(TENANT_PATTERN),
                    "table": name_schema(TABLE_PATTERN),
                    "limit": {"type": "integer", "nullable": true, "minimum": 1, "maximum": MAX_LIMIT, "description": format!("Rows to replay at most (default {REPLAY_DEFAULT}).")},
                    "dry_run": {"type": "boolean", "default": false},
                },
                "example": {"tenant": "acme", "table": "events", "limit": 1000, "dry_run": true},
            },
            "ReplayReport": {
                "type": "object",
                "required": ["dry_run", "replayed", "skipped", "failed", "errors"],
                "properties": {
                    "dry_run": {"type": "boolean"},
                    "replayed": {"type": "integer", "minimum": 0, "description": "Rows published back to the ingest stream (in a dry run: that would be)."},
                    "skipped": {"type": "integer", "minimum": 0, "description": "Rows that are not JSON objects: left parked."},
                    "failed": {"type": "integer", "minimum": 0, "description": "Rows whose publish or removal failed: left parked (a retry does not double them)."},
                    "errors": {"type": "array", "items": {"type": "string"}},
                },
            },
            "Purged": {
                "type": "object",
                "required": ["tenant", "table", "purged"],
                "properties": {
                    "tenant": {"type": "string"},
                    "table": {"type": "string"},
                    "purged": {"type": "integer", "minimum": 0},
                },
            },
            "Panicked": {
                "type": "object",
                "required": ["panicked"],
                "properties": {"panicked": {"type": "string"}},
            },
        },
    })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;
    use crate::openapi::{dangling_refs, documented_paths};

    #[test]
    fn every_routed_path_is_documented_and_nothing_else() {
        let doc = build();
        let routed: BTreeSet<String> = super::super::public_routes()
            .paths()
            .iter()
            .chain(super::super::protected_routes().paths())
            .map(|p| p.to_string())
            .collect();
        assert_eq!(documented_paths(&doc), routed);
        assert_eq!(dangling_refs(&doc), Vec::<String>::new());
    }

    #[test]
    fn the_token_is_asked_exactly_where_the_router_checks_it() {
        let doc = build();
        let protected: BTreeSet<&str> = super::super::protected_routes()
            .paths()
            .iter()
            .copied()
            .collect();
        for (path, item) in doc["paths"].as_object().into_iter().flatten() {
            for (method, operation) in item.as_object().into_iter().flatten() {
                if method == "parameters" {
                    continue;
                }
                let wants_token = operation["security"] == token();
                assert_eq!(
                    wants_token,
                    protected.contains(path.as_str()),
                    "{method} {path}"
                );
                let statuses = crate::openapi::documented_statuses(&doc, path, method);
                assert_eq!(
                    statuses.contains(&401) && statuses.contains(&403),
                    wants_token,
                    "{method} {path}: 401 and 403 go with the token"
                );
            }
        }
    }
}
