//! Parts of messages split by shard, judged before they join a batch.
//!
//! A message whose rows belong to several shards is published again as one message per
//! shard (`Delivery::split`). A part can be stored twice (published again past
//! JetStream's duplicate window, after a crash or a split that failed half way); the
//! split's record names the one copy of each part that counts, and only that one may
//! be inserted. So a flight asks each part it holds, before its batch is claimed or
//! sent (recorded or not: a table inserted at least once must not take a copy either),
//! and leaves the others out: a surplus copy is acked without an insert, one whose
//! record cannot be read now goes back to be judged again. Messages that are no part
//! cost one `is_split_part` each and nothing else.

use std::sync::Arc;

use futures::StreamExt as _;

use crate::context::Common;
use crate::metrics::TableMetrics;
use crate::ports::{Delivery, PartCopy, SettleError, TableKey};
use crate::settle::hand_back;

/// Parts judged at once: each is a read (and at most one write) of a record.
const JUDGED_AT_ONCE: usize = 32;

/// `deliveries` without the copies of parts that must not go in, in their order.
/// Surplus copies are acked here, and those that cannot be judged now go back for
/// `store_retry`.
pub async fn keep_counted<D: Delivery>(
    common: &Arc<Common>,
    key: &TableKey,
    metrics: &TableMetrics,
    deliveries: Vec<D>,
) -> Vec<D> {
    if !deliveries.iter().any(Delivery::is_split_part) {
        return deliveries;
    }
    let judged: Vec<(D, Option<Result<PartCopy, SettleError>>)> = futures::stream::iter(deliveries)
        .map(|d| async move {
            let judgment = match d.is_split_part() {
                true => Some(d.judge_part().await),
                false => None,
            };
            (d, judgment)
        })
        .buffered(JUDGED_AT_ONCE)
        .collect()
        .await;
    let mut kept = Vec::with_capacity(judged.len());
    let mut unjudged = Vec::new();
    let mut surplus = Vec::new();
    let mut unrecorded = 0u64;
    let mut last_error = None;
    for (d, judgment) in judged {
        match judgment {
            None | Some(Ok(PartCopy::Counted)) => kept.push(d),
            Some(Ok(PartCopy::Unrecorded)) => {
                unrecorded += 1;
                kept.push(d);
            }
            Some(Ok(PartCopy::Surplus)) => surplus.push(d),
            Some(Err(e)) => {
                last_error = Some(e);
                unjudged.push(d);
            }
        }
    }
    if unrecorded > 0 {
        metrics.split_parts_unrecorded.increment(unrecorded);
        tracing::warn!(tenant = %key.tenant, table = %key.table, parts = unrecorded,
            "parts of split messages found no record of their split (it expired, or its parts were acked and these came again): inserted, at least once");
    }
    if !surplus.is_empty() {
        metrics.split_copies_dropped.increment(surplus.len() as u64);
        tracing::debug!(tenant = %key.tenant, table = %key.table, copies = surplus.len(),
            "copies of split messages' parts that their split does not count: acked without an insert");
        // An ack lost here brings the copy back, judged surplus again.
        futures::future::join_all(surplus.into_iter().map(Delivery::ack)).await;
    }
    if let Some(e) = last_error {
        tracing::warn!(tenant = %key.tenant, table = %key.table, parts = unjudged.len(), error = %e,
            "parts of split messages could not be judged by their split's record now: they go back");
        hand_back(common, None, unjudged, common.settings.store_retry);
    }
    kept
}
