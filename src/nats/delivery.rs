//! A row delivered by JetStream, as the actors' `Delivery`: ack, progress, nak with a
//! delay, or park on the dead-letter stream with the reason in its headers.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_nats::jetstream::{self, AckKind};
use async_nats::HeaderMap;
use bytes::Bytes;
use sluice_actors::{Delivery, DeliveryMeta, Parking, SettleError};

use super::publish::{PublishError, Publisher};

/// The most of ClickHouse's message a DLQ header carries.
const MAX_ERROR_HEADER: usize = 1024;

/// Publishes parked rows to `dlq.<tenant>.<table>`. Shared by every delivery.
pub struct DlqWriter {
    publisher: Publisher,
    subject_prefix: String,
}

impl DlqWriter {
    pub fn new(publisher: Publisher, subject_prefix: impl Into<String>) -> Self {
        Self {
            publisher,
            subject_prefix: subject_prefix.into(),
        }
    }

    /// The DLQ headers of DESIGN.md, every one of them.
    fn headers(parking: &Parking, meta: &DeliveryMeta) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(
            "Sluice-Tenant",
            header_value(&parking.table.tenant).as_str(),
        );
        h.insert("Sluice-Table", header_value(&parking.table.table).as_str());
        h.insert("Sluice-Error-Class", parking.class.to_string().as_str());
        h.insert(
            "Sluice-Error-Code",
            parking
                .code
                .map(|c| c.to_string())
                .unwrap_or_default()
                .as_str(),
        );
        h.insert(
            "Sluice-Error",
            header_value(truncate(&parking.error, MAX_ERROR_HEADER)).as_str(),
        );
        h.insert(
            "Sluice-Original-Subject",
            header_value(&meta.subject).as_str(),
        );
        h.insert(
            "Sluice-Original-Sequence",
            meta.stream_sequence.to_string().as_str(),
        );
        h.insert("Sluice-Deliveries", meta.deliveries.to_string().as_str());
        h.insert(
            "Sluice-Parked-At",
            humantime::format_rfc3339_millis(SystemTime::now())
                .to_string()
                .as_str(),
        );
        h
    }
}

/// One delivered row. Dropped without being settled, it is naked at once (see the
/// `Delivery` contract): a crashed actor hands its rows back instead of stranding them
/// until `ack_wait`.
pub struct JsDelivery {
    message: Option<jetstream::Message>,
    dlq: Arc<DlqWriter>,
}

// === impl JsDelivery ===

impl JsDelivery {
    pub fn new(message: jetstream::Message, dlq: Arc<DlqWriter>) -> Self {
        Self {
            message: Some(message),
            dlq,
        }
    }

    pub fn subject(&self) -> &str {
        self.message
            .as_ref()
            .map(|m| m.subject.as_str())
            .unwrap_or("")
    }

    async fn settle(&mut self, kind: AckKind) -> Result<(), SettleError> {
        let Some(message) = self.message.take() else {
            return Ok(());
        };
        message
            .ack_with(kind)
            .await
            .map_err(|e| SettleError(format!("settling a row: {e}")))
    }
}

impl Delivery for JsDelivery {
    fn payload(&self) -> &Bytes {
        static EMPTY: Bytes = Bytes::from_static(b"");
        self.message.as_ref().map(|m| &m.payload).unwrap_or(&EMPTY)
    }

    fn subject(&self) -> &str {
        self.message
            .as_ref()
            .map(|m| m.subject.as_str())
            .unwrap_or("")
    }

    fn meta(&self) -> DeliveryMeta {
        let Some(message) = self.message.as_ref() else {
            return DeliveryMeta {
                subject: String::new(),
                stream_sequence: 0,
                deliveries: 0,
            };
        };
        let (stream_sequence, deliveries) = message
            .info()
            .map(|i| (i.stream_sequence, u64::try_from(i.delivered).unwrap_or(0)))
            .unwrap_or((0, 0));
        DeliveryMeta {
            subject: message.subject.to_string(),
            stream_sequence,
            deliveries,
        }
    }

    async fn ack(mut self) -> Result<(), SettleError> {
        self.settle(AckKind::Ack).await
    }

    async fn progress(&self) -> Result<(), SettleError> {
        match self.message.as_ref() {
            Some(m) => m
                .ack_with(AckKind::Progress)
                .await
                .map_err(|e| SettleError(format!("sending progress: {e}"))),
            None => Ok(()),
        }
    }

    async fn nak(mut self, delay: Duration) -> Result<(), SettleError> {
        let kind = if delay.is_zero() {
            AckKind::Nak(None)
        } else {
            AckKind::Nak(Some(delay))
        };
        self.settle(kind).await
    }

    async fn park(mut self, parking: &Parking) -> Result<(), (Self, SettleError)> {
        let meta = self.meta();
        let Some(message) = self.message.as_ref() else {
            return Ok(());
        };
        let (stream, published) = message
            .info()
            .map(|i| (i.stream.to_string(), i.published.unix_timestamp_nanos()))
            .unwrap_or_default();
        let subject = format!(
            "{}.{}.{}",
            self.dlq.subject_prefix, parking.table.tenant, parking.table.table
        );
        // The same row parked twice (its ack lost after the park) is stored once. The
        // publish time is part of the id so that a row of a stream recreated within the
        // DLQ's duplicate window, reusing a sequence, is not taken for a duplicate.
        let id = format!("park-{stream}-{}-{published}", meta.stream_sequence);
        let headers = DlqWriter::headers(parking, &meta);
        let payload = message.payload.clone();
        match self
            .dlq
            .publisher
            .publish(subject, payload, Some(headers), Some(&id))
            .await
        {
            Ok(_) => {
                // Parked. Should the ack be lost, the row comes back, is parked again
                // under the same id, and the DLQ keeps one copy.
                if let Err(e) = self.settle(AckKind::Ack).await {
                    tracing::warn!(tenant = %parking.table.tenant, table = %parking.table.table, error = %e,
                        "row parked but its ack failed; it will be redelivered and parked once more");
                }
                Ok(())
            }
            // `QueueFull` reads "the ingest stream is full", which is not the one here: an
            // operator must not go looking at the wrong stream.
            Err(PublishError::QueueFull) => Err((
                self,
                SettleError(
                    "publishing to the DLQ: the DLQ stream is full ([nats] dlq_max_bytes); the row stays unacked"
                        .into(),
                ),
            )),
            Err(e) => Err((self, SettleError(format!("publishing to the DLQ: {e}")))),
        }
    }
}

impl Drop for JsDelivery {
    fn drop(&mut self) {
        let Some(message) = self.message.take() else {
            return;
        };
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let _ = message.ack_with(AckKind::Nak(None)).await;
            });
        }
    }
}

/// NATS header values cannot hold CR or LF: a multi-line ClickHouse message is folded.
fn header_value(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect::<String>()
        .trim()
        .to_string()
}

/// At most `max` bytes, cut at a character boundary.
fn truncate(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_values_are_single_lines_and_capped() {
        assert_eq!(
            header_value("Code: 27\r\n, e.what()"),
            "Code: 27  , e.what()"
        );
        let long = "é".repeat(1000);
        let cut = truncate(&long, MAX_ERROR_HEADER);
        assert!(cut.len() <= MAX_ERROR_HEADER && cut.len() >= MAX_ERROR_HEADER - 1);
    }
}
