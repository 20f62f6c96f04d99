//! What the ingest endpoint answers: the counts of every row of a request, the status
//! they make, and the answers given before any row is read.

use std::time::Duration;

use axum::http::{header, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;

use super::parse::{Refused, RowError};
use super::publishing::{Outcome, Stop};
use crate::nats::PublishError;

/// Refused rows an answer lists (`rejected` counts them all): enough to fix a producer,
/// and an answer that stays small whatever the body holds.
pub const MAX_LISTED_ERRORS: usize = 100;

/// Set on an answer given again for a request already answered under its
/// `Idempotency-Key` (nothing was published this time).
pub const REPLAYED_HEADER: HeaderName = HeaderName::from_static("idempotent-replayed");

/// The answer to every ingest request.
#[derive(Debug, Default, Serialize)]
pub struct IngestReply {
    /// Rows stored in the ingest stream (acknowledged by JetStream), by this request
    /// or by an earlier one under the same `Idempotency-Key`.
    pub accepted: usize,
    /// Of the accepted rows, those an earlier request under the same `Idempotency-Key`
    /// had stored: stored once.
    pub duplicates: usize,
    /// Rows refused (bad JSON, not an object, too large, too deep, not UTF-8).
    pub rejected: usize,
    /// Rows not stored because the stream was full or unreachable: send them again.
    pub not_stored: usize,
    /// The first `MAX_LISTED_ERRORS` refused rows, by index (`rejected` counts all).
    pub errors: Vec<RowError>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

// === impl IngestReply ===

impl IngestReply {
    /// Count a refused row; list it while the list is short.
    pub fn refuse(&mut self, refused: Refused) {
        self.rejected += 1;
        if self.errors.len() < MAX_LISTED_ERRORS {
            self.errors.push(refused.into_error());
        }
    }

    /// Take the publishing's counts, and say what status they make: 503 while rows
    /// are not stored for a reason that passes (the same request sent again stores
    /// them), 400 when JetStream refused them or rows were refused, else 202.
    pub fn settle(&mut self, outcome: &mut Outcome) -> StatusCode {
        self.accepted = outcome.accepted;
        self.duplicates = outcome.duplicates;
        self.not_stored = outcome.rows - outcome.accepted;
        match outcome.stop.take() {
            Some(Stop::Publish(PublishError::Refused(why))) if self.not_stored > 0 => {
                self.error = Some(why);
                StatusCode::BAD_REQUEST
            }
            Some(stop) if self.not_stored > 0 => {
                self.error = Some(format!("{stop}; send the request again (the same body with the same Idempotency-Key stores none of its rows twice)"));
                StatusCode::SERVICE_UNAVAILABLE
            }
            _ if self.rejected > 0 => StatusCode::BAD_REQUEST,
            _ => StatusCode::ACCEPTED,
        }
    }

    /// The answer, with `Retry-After` on a 503.
    pub fn into_response(self, status: StatusCode, retry_after: Duration) -> Response {
        let mut response = (status, Json(self)).into_response();
        if status == StatusCode::SERVICE_UNAVAILABLE {
            add_retry_after(&mut response, retry_after);
        }
        response
    }
}

/// An answer with no row counted: the request was refused before its rows were read.
pub fn failure(status: StatusCode, error: String) -> Response {
    let body = IngestReply {
        error: Some(error),
        ..Default::default()
    };
    (status, Json(body)).into_response()
}

/// A refusal the same request may overcome later (a 503, a 409), with `Retry-After`.
pub fn come_back(status: StatusCode, error: String, retry_after: Duration) -> Response {
    let mut response = failure(status, error);
    add_retry_after(&mut response, retry_after);
    response
}

/// The answer recorded under a request's `Idempotency-Key`, given again.
pub fn replay(status: StatusCode, reply: String) -> Response {
    let mut response = (status, reply).into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    headers.insert(REPLAYED_HEADER, HeaderValue::from_static("true"));
    response
}

/// The answer's body as recorded for a replay: what [`IngestReply::into_response`]
/// sends.
pub fn recorded(reply: &IngestReply) -> Option<String> {
    serde_json::to_string(reply).ok()
}

fn add_retry_after(response: &mut Response, retry_after: Duration) {
    if let Ok(value) = HeaderValue::from_str(&retry_after.as_secs().max(1).to_string()) {
        response.headers_mut().insert(header::RETRY_AFTER, value);
    }
}
