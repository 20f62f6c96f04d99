//! Every way a query can fail, the HTTP status each one maps to, and the JSON body.
//!
//! The body always carries `{error, code, class, retryable, query_id}`:
//! - `code`: ClickHouse's exception code, or `null` when the gateway refused the
//!   request itself, the failure was a transport one, or the answer carried none;
//! - `class`: the classifier's class (`rejected`, `denied`, `unavailable`, `unknown`),
//!   or `timeout` for a 504 (a deadline is not a verdict on the query);
//! - `retryable`: whether sending the same request again later is sensible; true only
//!   for 503 and 429, which also carry `Retry-After`.
//!
//! ClickHouse failures go through the shared classifier, with two overrides that only
//! hold on this path: code 159 (ClickHouse's own `max_execution_time`) is a timeout,
//! never retried; code 164 (readonly) means a write was attempted, a permission
//! matter (403), not an outage to wait out.

use std::time::Duration;

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Map, Value};
use sluice_actors::{Class, ClickHouseError};

use super::kill::KillOutcome;
use super::request::RequestError;
use super::QUERY_ID_HEADER;
use crate::clickhouse::classify::MISSING_TABLE_CODES;
use crate::http::tenant::TenantError;

/// ClickHouse's own time limit stopped the query.
pub const TIMEOUT_EXCEEDED: u32 = 159;
/// A write (or a setting change) refused because the session is read-only.
pub const READONLY: u32 = 164;
/// The result crossed `max_result_rows` / `max_result_bytes`.
pub const TOO_MANY_ROWS_OR_BYTES: u32 = 396;
/// A setting ClickHouse does not know: how a server without query parameters answers
/// `param_<name>`.
pub use crate::clickhouse::classify::UNKNOWN_SETTING;
/// Besides a missing table or database (the classifier's `MISSING_TABLE_CODES`), an
/// unknown identifier (47) or column (16) names something the query asked for that is
/// not there: a 404 on this path only.
pub const NOT_FOUND_QUERY_CODES: &[u32] = &[47, 16];

/// Whether a code says the query named something ClickHouse does not have.
fn is_not_found(code: u32) -> bool {
    MISSING_TABLE_CODES.contains(&code) || NOT_FOUND_QUERY_CODES.contains(&code)
}

/// Who stopped a query that ran out of time, and what is known of how: the answer's
/// text and its `kill_sent` / `kill_confirmed` are both made from this, so they cannot
/// tell different stories.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoppedBy {
    /// ClickHouse's `max_execution_time` (code 159), set to this.
    ClickHouse { server_limit: Duration },
    /// The client deadline passed first; Sluice tried to kill the query.
    Sluice(KillOutcome),
}

impl StoppedBy {
    /// Whether ClickHouse accepted Sluice's `KILL QUERY`.
    fn kill_sent(&self) -> bool {
        matches!(self, StoppedBy::Sluice(kill) if kill.sent)
    }

    /// Whether Sluice saw the query gone from ClickHouse after its kill.
    fn kill_confirmed(&self) -> bool {
        matches!(self, StoppedBy::Sluice(kill) if kill.confirmed_gone)
    }

    /// The 504's `error`: what stopped the query, and what became of the kill.
    fn message(&self) -> String {
        const LATE: &str = "the query did not finish within its timeout";
        const STILL_ENDS: &str = "ClickHouse's own time limit still ends it";
        let kill = match self {
            StoppedBy::ClickHouse { server_limit } => {
                return format!(
                    "ClickHouse stopped the query at its time limit (max_execution_time = {} s, the request's timeout less the server margin); not retried: a retry would repeat the same heavy work",
                    server_limit.as_secs()
                )
            }
            StoppedBy::Sluice(kill) => kill,
        };
        let why = kill.problem.as_deref().unwrap_or("no answer");
        match (kill.sent, kill.confirmed_gone) {
            (true, true) => format!("{LATE}; Sluice killed it on ClickHouse (confirmed gone)"),
            (true, false) => format!(
                "{LATE}; Sluice sent KILL QUERY but could not confirm it stopped ({why}); {STILL_ENDS}"
            ),
            (false, true) => format!(
                "{LATE}; ClickHouse did not take Sluice's KILL QUERY ({why}), but the query is no longer running there"
            ),
            (false, false) => format!(
                "{LATE}; ClickHouse did not take Sluice's KILL QUERY and the query could not be confirmed stopped ({why}); {STILL_ENDS}"
            ),
        }
    }
}

#[derive(Debug)]
pub enum QueryError {
    /// No `[query]` section: the gateway is off.
    Off,
    Tenant(TenantError),
    Request(RequestError),
    /// The workload class or the tenant is at its concurrency limit.
    TooManyQueries {
        message: String,
    },
    /// A classified failure from ClickHouse (or the way to it), not retried further.
    ClickHouse {
        error: ClickHouseError,
        attempts: u32,
        retry_after: Duration,
    },
    /// An Unavailable failure that would have been retried, but the budget is empty.
    BudgetExhausted {
        error: ClickHouseError,
        attempts: u32,
        retry_after: Duration,
    },
    /// An Unavailable failure not retried because the previous attempt could not be
    /// confirmed gone: a retry might run the query twice at once.
    NotConfirmedGone {
        error: ClickHouseError,
        attempts: u32,
        retry_after: Duration,
    },
    Timeout {
        timeout: Duration,
        stopped_by: StoppedBy,
        attempts: u32,
    },
    /// The relayed result crossed the gateway's byte cap before the status was sent.
    ResultTooLarge {
        limit_bytes: u64,
    },
    /// The answer was not JSON (the statement chose its own format somehow).
    NotJson {
        content_type: String,
    },
}

/// What a ClickHouse failure becomes on the query path: status, class label, retryable.
pub fn map_clickhouse(class: Class, code: Option<u32>) -> (StatusCode, &'static str, bool) {
    match (class, code) {
        (_, Some(TIMEOUT_EXCEEDED)) => (StatusCode::GATEWAY_TIMEOUT, "timeout", false),
        (_, Some(READONLY)) => (StatusCode::FORBIDDEN, "denied", false),
        (Class::Rejected, Some(c)) if is_not_found(c) => (StatusCode::NOT_FOUND, "rejected", false),
        (Class::Rejected, _) => (StatusCode::BAD_REQUEST, "rejected", false),
        (Class::Denied, _) => (StatusCode::FORBIDDEN, "denied", false),
        (Class::Unavailable, _) => (StatusCode::SERVICE_UNAVAILABLE, "unavailable", true),
        (Class::Unknown, _) => (StatusCode::BAD_GATEWAY, "unknown", false),
    }
}

/// ClickHouse's message with a sentence in front saying what it means here.
fn clickhouse_message(error: &ClickHouseError, status: StatusCode) -> String {
    let ch = error.message.trim();
    let lead = meaning(error, status);
    if ch.is_empty() {
        lead.to_string()
    } else {
        format!("{lead}: {ch}")
    }
}

/// What a ClickHouse failure means on the query path, in a few words.
fn meaning(error: &ClickHouseError, status: StatusCode) -> &'static str {
    match error.code {
        Some(READONLY) => {
            "the query gateway is read-only: ClickHouse refused the statement in readonly mode"
        }
        Some(TIMEOUT_EXCEEDED) => {
            "ClickHouse stopped the query at its time limit (max_execution_time, the request's timeout less the server margin); a retry would repeat the same heavy work"
        }
        Some(TOO_MANY_ROWS_OR_BYTES) => {
            "the result is larger than the gateway allows (max_result_rows / max_result_bytes): add a LIMIT or aggregate"
        }
        Some(UNKNOWN_SETTING) if error.message.contains("param_") => {
            "this ClickHouse server does not support query parameters ({name:Type} with params); inline the values or upgrade ClickHouse"
        }
        _ => match status {
            StatusCode::NOT_FOUND => "not found",
            StatusCode::BAD_REQUEST => "ClickHouse rejected the query",
            StatusCode::FORBIDDEN => "ClickHouse refused the query user",
            StatusCode::SERVICE_UNAVAILABLE => "ClickHouse is unavailable",
            _ => "ClickHouse answered with an error nothing explains",
        },
    }
}

/// What the gateway answers for a ClickHouse failure, in one line, read off
/// [`map_clickhouse`]: `sluice classify` prints it, so the two cannot disagree.
pub fn query_action(error: &ClickHouseError) -> String {
    let (status, label, retryable) = map_clickhouse(error.class, error.code);
    let status_code = status.as_u16();
    let meaning = meaning(error, status);
    if retryable {
        format!(
            "{status_code} {label}, retried: with full-jitter backoff inside the request's deadline, at most [query] max_attempts attempts, each taking a token from the retry budget; then {status_code} with Retry-After and \"retryable\": true ({meaning})"
        )
    } else {
        format!("{status_code} {label}, never retried: {meaning}")
    }
}

impl QueryError {
    /// The HTTP status a client sees.
    pub fn status(&self) -> StatusCode {
        match self {
            QueryError::Off => StatusCode::NOT_FOUND,
            QueryError::Tenant(t) => t.status(),
            QueryError::Request(RequestError::Sql(e)) if e.is_write() => StatusCode::FORBIDDEN,
            QueryError::Request(RequestError::BodyTimedOut(_)) => StatusCode::REQUEST_TIMEOUT,
            QueryError::Request(_) => StatusCode::BAD_REQUEST,
            QueryError::TooManyQueries { .. } => StatusCode::TOO_MANY_REQUESTS,
            QueryError::ClickHouse { error, .. } => map_clickhouse(error.class, error.code).0,
            QueryError::BudgetExhausted { .. } | QueryError::NotConfirmedGone { .. } => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            QueryError::Timeout { .. } => StatusCode::GATEWAY_TIMEOUT,
            QueryError::ResultTooLarge { .. } | QueryError::NotJson { .. } => {
                StatusCode::BAD_REQUEST
            }
        }
    }

    /// `Retry-After` for 503 and 429.
    fn retry_after(&self) -> Option<Duration> {
        match self {
            QueryError::TooManyQueries { .. } => Some(Duration::from_secs(1)),
            QueryError::ClickHouse {
                error, retry_after, ..
            } if map_clickhouse(error.class, error.code).2 => Some(*retry_after),
            QueryError::BudgetExhausted { retry_after, .. }
            | QueryError::NotConfirmedGone { retry_after, .. } => Some(*retry_after),
            _ => None,
        }
    }

    /// The JSON body (without `query_id`, which the caller adds).
    pub fn body(&self) -> Map<String, Value> {
        let (error, code, class, retryable) = self.summary();
        let mut body = Map::new();
        body.insert("error".into(), json!(error));
        body.insert("code".into(), code);
        body.insert("class".into(), json!(class));
        body.insert("retryable".into(), json!(retryable));
        for (key, value) in self.details() {
            body.insert(key.into(), value);
        }
        body
    }

    /// What every error body says: the message, ClickHouse's code (`null` when the
    /// gateway answered alone), the class and whether a retry may help.
    fn summary(&self) -> (String, Value, &'static str, bool) {
        match self {
            QueryError::Off => (
                "the query gateway is off: the configuration has no [query] section (set [query] target to enable POST /v1/query)".into(),
                Value::Null,
                "rejected",
                false,
            ),
            QueryError::Tenant(t) => (t.to_string(), Value::Null, t.class_label(), false),
            QueryError::Request(r) => {
                let class = if self.status() == StatusCode::FORBIDDEN {
                    "denied"
                } else {
                    "rejected"
                };
                (r.message(), Value::Null, class, false)
            }
            QueryError::TooManyQueries { message } => {
                (message.clone(), Value::Null, "unavailable", true)
            }
            QueryError::ClickHouse { error, .. } => {
                let (status, class, retryable) = map_clickhouse(error.class, error.code);
                (clickhouse_message(error, status), json!(error.code), class, retryable)
            }
            QueryError::BudgetExhausted { error, .. } => (
                format!(
                    "ClickHouse is unavailable and the gateway's retry budget is spent, so the query was not retried: {}",
                    error.message.trim()
                ),
                json!(error.code),
                "unavailable",
                true,
            ),
            QueryError::NotConfirmedGone { error, .. } => (
                format!(
                    "ClickHouse is unavailable; the query was not retried because its previous attempt could not be confirmed stopped: {}",
                    error.message.trim()
                ),
                json!(error.code),
                "unavailable",
                true,
            ),
            QueryError::Timeout { stopped_by, .. } => {
                let code = match stopped_by {
                    StoppedBy::ClickHouse { .. } => json!(TIMEOUT_EXCEEDED),
                    StoppedBy::Sluice(_) => Value::Null,
                };
                (stopped_by.message(), code, "timeout", false)
            }
            QueryError::ResultTooLarge { limit_bytes } => (
                format!(
                    "the result is larger than the gateway relays ({limit_bytes} bytes, [query] max_result_bytes): add a LIMIT, select fewer columns or aggregate"
                ),
                Value::Null,
                "rejected",
                false,
            ),
            QueryError::NotJson { content_type } => (
                format!(
                    "ClickHouse answered {content_type:?}, not JSON: the statement must not choose its own output format; use the request's \"format\" field"
                ),
                Value::Null,
                "rejected",
                false,
            ),
        }
    }

    /// The fields only some errors carry (attempts made, ClickHouse's HTTP status, what
    /// stopped a query that timed out, the result limit).
    fn details(&self) -> Vec<(&'static str, Value)> {
        match self {
            QueryError::ClickHouse {
                error, attempts, ..
            } => {
                let mut details = vec![("attempts", json!(attempts))];
                if let Some(s) = error.status {
                    details.push(("clickhouse_status", json!(s)));
                }
                details
            }
            QueryError::BudgetExhausted { attempts, .. }
            | QueryError::NotConfirmedGone { attempts, .. } => vec![("attempts", json!(attempts))],
            QueryError::Timeout {
                timeout,
                stopped_by,
                attempts,
            } => vec![
                ("attempts", json!(attempts)),
                (
                    "timeout_ms",
                    json!(u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX)),
                ),
                (
                    "stopped_by",
                    json!(match stopped_by {
                        StoppedBy::ClickHouse { .. } => "clickhouse",
                        StoppedBy::Sluice(_) => "sluice",
                    }),
                ),
                ("kill_sent", json!(stopped_by.kill_sent())),
                ("kill_confirmed", json!(stopped_by.kill_confirmed())),
            ],
            QueryError::ResultTooLarge { limit_bytes } => vec![("limit_bytes", json!(limit_bytes))],
            _ => Vec::new(),
        }
    }

    /// The full answer: status, `Retry-After` where due, `X-Sluice-Query-Id`, JSON body.
    pub fn into_response_for(self, query_id: &str) -> Response {
        let status = self.status();
        let mut body = self.body();
        body.insert("query_id".into(), json!(query_id));
        let mut response = (status, axum::Json(Value::Object(body))).into_response();
        let headers = response.headers_mut();
        if let Ok(v) = HeaderValue::from_str(query_id) {
            headers.insert(QUERY_ID_HEADER, v);
        }
        if let Some(after) = self.retry_after() {
            headers.insert(
                header::RETRY_AFTER,
                HeaderValue::from(retry_after_secs(after)),
            );
        }
        if let QueryError::Tenant(t) = &self {
            if let Some(challenge) = t.www_authenticate() {
                headers.insert(
                    header::WWW_AUTHENTICATE,
                    HeaderValue::from_static(challenge),
                );
            }
        }
        response
    }
}

/// Whole seconds, rounded up, at least 1: `Retry-After: 0` invites an instant retry.
pub fn retry_after_secs(d: Duration) -> u64 {
    let secs = d.as_secs() + u64::from(d.subsec_nanos() > 0);
    secs.max(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clickhouse::classify;

    fn ch(status: u16, body: &str) -> QueryError {
        QueryError::ClickHouse {
            error: classify::from_response(status, None, body),
            attempts: 1,
            retry_after: Duration::from_secs(5),
        }
    }

    fn reply(e: QueryError) -> (StatusCode, Option<String>, Value) {
        let response = e.into_response_for("q-1");
        let status = response.status();
        let retry_after = response
            .headers()
            .get(header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        assert_eq!(
            response
                .headers()
                .get(QUERY_ID_HEADER)
                .and_then(|v| v.to_str().ok()),
            Some("q-1")
        );
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        let bytes = rt
            .block_on(axum::body::to_bytes(response.into_body(), 1 << 20))
            .expect("body");
        let body: Value = serde_json::from_slice(&bytes).expect("json body");
        for key in ["error", "code", "class", "retryable", "query_id"] {
            assert!(body.get(key).is_some(), "{key} missing in {body}");
        }
        assert_eq!(body["query_id"], "q-1");
        (status, retry_after, body)
    }

    #[test]
    fn the_mapping_table() {
        // (class, code) -> (status, class label, retryable)
        let cases: &[(Class, Option<u32>, u16, &str, bool)] = &[
            (Class::Rejected, Some(60), 404, "rejected", false),
            (Class::Rejected, Some(81), 404, "rejected", false),
            (Class::Rejected, Some(47), 404, "rejected", false),
            (Class::Rejected, Some(16), 404, "rejected", false),
            (Class::Rejected, Some(62), 400, "rejected", false),
            (Class::Rejected, Some(46), 400, "rejected", false),
            (Class::Rejected, Some(396), 400, "rejected", false),
            (Class::Rejected, None, 400, "rejected", false),
            (Class::Denied, Some(193), 403, "denied", false),
            (Class::Denied, Some(192), 403, "denied", false),
            (Class::Denied, None, 403, "denied", false),
            (Class::Unavailable, Some(745), 503, "unavailable", true),
            (Class::Unavailable, Some(394), 503, "unavailable", true),
            (Class::Unavailable, None, 503, "unavailable", true),
            (Class::Unavailable, Some(159), 504, "timeout", false),
            (Class::Unavailable, Some(164), 403, "denied", false),
            (Class::Unknown, None, 502, "unknown", false),
        ];
        for (class, code, status, label, retryable) in cases {
            let got = map_clickhouse(*class, *code);
            assert_eq!(
                (got.0.as_u16(), got.1, got.2),
                (*status, *label, *retryable),
                "{class:?} {code:?}"
            );
        }
    }

    #[test]
    fn the_action_line_is_read_off_the_mapping() {
        let line = |code: u32| query_action(&classify::from_code(code, Some(500), String::new()));
        for (code, starts) in [
            // 164 is Unavailable to the classifier, a refused write to the gateway.
            (164, "403 denied, never retried"),
            (159, "504 timeout, never retried"),
            (60, "404 rejected, never retried"),
            (745, "503 unavailable, retried"),
        ] {
            assert!(line(code).starts_with(starts), "{code}: {}", line(code));
        }
        assert!(line(745).contains("retry budget"), "{}", line(745));
        let codeless = query_action(&classify::from_response(500, None, "<html>"));
        assert!(
            codeless.starts_with("502 unknown, never retried"),
            "{codeless}"
        );
    }

    #[test]
    fn bodies_from_real_clickhouse_answers() {
        // Bodies as ClickHouse 18.16 writes them (no exception header).
        let (s, ra, b) = reply(ch(
            404,
            "Code: 60, e.displayText() = DB::Exception: Table default.nope doesn't exist., e.what() = DB::Exception",
        ));
        assert_eq!((s.as_u16(), ra), (404, None));
        assert_eq!(
            (b["code"].clone(), b["class"].clone()),
            (json!(60), json!("rejected"))
        );
        assert_eq!(b["retryable"], false);
        assert!(b["error"]
            .as_str()
            .is_some_and(|e| e.contains("doesn't exist")));

        let (s, _, b) = reply(ch(
            400,
            "Code: 62, e.displayText() = DB::Exception: Syntax error",
        ));
        assert_eq!((s.as_u16(), b["code"].clone()), (400, json!(62)));

        let (s, _, b) = reply(ch(
            401,
            "Code: 193, e.displayText() = DB::Exception: Wrong password for user query",
        ));
        assert_eq!((s.as_u16(), b["class"].clone()), (403, json!("denied")));

        let (s, _, b) = reply(ch(
            500,
            "Code: 164, e.displayText() = DB::Exception: Cannot insert into table in readonly mode",
        ));
        assert_eq!(
            (s.as_u16(), b["class"].clone(), b["retryable"].clone()),
            (403, json!("denied"), json!(false))
        );
        assert!(b["error"].as_str().is_some_and(|e| e.contains("read-only")));

        let (s, _, b) = reply(ch(
            500,
            "Code: 396, e.displayText() = DB::Exception: Limit for result exceeded, max rows: 5.00",
        ));
        assert_eq!(s.as_u16(), 400);
        assert!(b["error"].as_str().is_some_and(|e| e.contains("LIMIT")));

        let (s, _, b) = reply(ch(
            404,
            "Code: 115, e.displayText() = DB::Exception: Unknown setting param_x",
        ));
        assert_eq!(s.as_u16(), 400);
        assert!(b["error"]
            .as_str()
            .is_some_and(|e| e.contains("query parameters")));
    }

    #[test]
    fn unavailable_carries_retry_after_and_retryable() {
        let (s, ra, b) = reply(ch(503, "Code: 745. DB::Exception: overloaded"));
        assert_eq!((s.as_u16(), ra.as_deref()), (503, Some("5")));
        assert_eq!(
            (b["retryable"].clone(), b["class"].clone()),
            (json!(true), json!("unavailable"))
        );
        assert_eq!(b["code"], 745);
        let (s, ra, b) = reply(QueryError::ClickHouse {
            error: classify::transport(sluice_actors::NoAnswer::Refused, "connection refused"),
            attempts: 3,
            retry_after: Duration::from_millis(1500),
        });
        assert_eq!((s.as_u16(), ra.as_deref()), (503, Some("2")));
        assert_eq!(
            (b["code"].clone(), b["attempts"].clone()),
            (Value::Null, json!(3))
        );
        let (s, ra, b) = reply(QueryError::BudgetExhausted {
            error: classify::from_response(503, None, ""),
            attempts: 1,
            retry_after: Duration::ZERO,
        });
        assert_eq!((s.as_u16(), ra.as_deref()), (503, Some("1")));
        assert!(b["error"]
            .as_str()
            .is_some_and(|e| e.contains("retry budget")));
    }

    #[test]
    fn unknown_is_502() {
        let (s, ra, b) = reply(ch(500, "<html>oops</html>"));
        assert_eq!((s.as_u16(), ra), (502, None));
        assert_eq!(b["class"], "unknown");
    }

    #[test]
    fn timeouts_say_who_stopped_the_query_and_whether_the_kill_was_confirmed() {
        let (s, ra, b) = reply(QueryError::Timeout {
            timeout: Duration::from_millis(800),
            stopped_by: StoppedBy::Sluice(KillOutcome {
                sent: true,
                found: true,
                confirmed_gone: true,
                problem: None,
            }),
            attempts: 1,
        });
        assert_eq!((s.as_u16(), ra), (504, None));
        assert_eq!(b["class"], "timeout");
        assert_eq!(b["retryable"], false);
        assert_eq!(b["timeout_ms"], 800);
        assert_eq!(b["stopped_by"], "sluice");
        assert_eq!(
            (b["kill_sent"].clone(), b["kill_confirmed"].clone()),
            (json!(true), json!(true))
        );
        assert!(b["error"]
            .as_str()
            .is_some_and(|e| e.contains("confirmed gone")));
        let (_, _, b) = reply(QueryError::Timeout {
            timeout: Duration::from_secs(2),
            stopped_by: StoppedBy::ClickHouse {
                server_limit: Duration::from_secs(1),
            },
            attempts: 1,
        });
        assert_eq!(
            (b["code"].clone(), b["stopped_by"].clone()),
            (json!(159), json!("clickhouse"))
        );
        assert_eq!(
            (b["kill_sent"].clone(), b["kill_confirmed"].clone()),
            (json!(false), json!(false))
        );
    }

    /// The text never says a kill was sent or confirmed that the fields say was not.
    #[test]
    fn a_timeout_says_what_became_of_the_kill_as_its_fields_do() {
        for (sent, confirmed_gone) in [(true, true), (true, false), (false, true), (false, false)] {
            let (_, _, b) = reply(QueryError::Timeout {
                timeout: Duration::from_millis(800),
                stopped_by: StoppedBy::Sluice(KillOutcome {
                    sent,
                    found: false,
                    confirmed_gone,
                    problem: Some("KILL QUERY got no answer within 1s".into()),
                }),
                attempts: 1,
            });
            assert_eq!(
                (b["kill_sent"].clone(), b["kill_confirmed"].clone()),
                (json!(sent), json!(confirmed_gone))
            );
            let error = b["error"].as_str().unwrap_or_default();
            assert_eq!(
                error.contains("Sluice sent KILL QUERY"),
                sent && !confirmed_gone,
                "{error}"
            );
            assert_eq!(
                error.contains("did not take Sluice's KILL QUERY"),
                !sent,
                "{error}"
            );
            assert_eq!(
                error.contains("confirmed gone") || error.contains("no longer running"),
                confirmed_gone,
                "{error}"
            );
            if !sent {
                assert!(error.contains("got no answer"), "says why: {error}");
            }
        }
    }

    #[test]
    fn gateway_refusals() {
        let (s, _, b) = reply(QueryError::Off);
        assert_eq!(s.as_u16(), 404);
        assert!(b["error"]
            .as_str()
            .is_some_and(|e| e.contains("gateway is off")));
        let (s, ra, b) = reply(QueryError::TooManyQueries {
            message: "busy".into(),
        });
        assert_eq!((s.as_u16(), ra.as_deref()), (429, Some("1")));
        assert_eq!(b["retryable"], true);
        let (s, _, b) = reply(QueryError::Request(RequestError::Sql(
            super::super::sql::SqlError::Write("DROP".into()),
        )));
        assert_eq!((s.as_u16(), b["class"].clone()), (403, json!("denied")));
        let (s, _, b) = reply(QueryError::Request(RequestError::Invalid("bad".into())));
        assert_eq!((s.as_u16(), b["class"].clone()), (400, json!("rejected")));
        let (s, _, b) = reply(QueryError::ResultTooLarge { limit_bytes: 1000 });
        assert_eq!((s.as_u16(), b["limit_bytes"].clone()), (400, json!(1000)));
    }

    #[test]
    fn retry_after_rounds_up_to_whole_seconds() {
        assert_eq!(retry_after_secs(Duration::ZERO), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(1)), 1);
        assert_eq!(retry_after_secs(Duration::from_secs(5)), 5);
        assert_eq!(retry_after_secs(Duration::from_millis(5001)), 6);
    }
}
