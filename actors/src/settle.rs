//! Rows that leave an actor without an insert: handed back (nak with a delay) or parked
//! whole. Both run as tracked tasks, off the mailbox, so an actor never waits on NATS
//! for them and a shutdown waits for them.

use std::sync::Arc;
use std::time::Duration;

use crate::context::Common;
use crate::metrics::TableMetrics;
use crate::ports::{Class, Delivery, Parking, TableKey};

/// Hand rows back (nak with `delay`): a window is open, a probe is out, the table is
/// restarting or full. Counted as `backoff` retries when the table is known.
pub fn hand_back<D: Delivery>(
    common: &Arc<Common>,
    metrics: Option<&TableMetrics>,
    rows: Vec<D>,
    delay: Duration,
) {
    if rows.is_empty() {
        return;
    }
    let n = rows.len();
    if let Some(m) = metrics {
        m.retries_backoff.increment(n as u64);
    }
    common.stats.handed_back(n);
    common.tracker.spawn(async move {
        for d in rows {
            let _ = d.nak(delay).await;
        }
    });
}

/// Why a whole group of rows is parked without an insert.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParkReason {
    /// The tenant has no ClickHouse target.
    NoTarget,
    /// The subject is not `<prefix>.<tenant>.<table>`.
    InvalidSubject,
    /// The payload cannot be decoded (`Delivery::undecodable`).
    Undecodable,
}

/// Park a whole group (or, with the table's DLQ off, nak it with the cap delay).
pub fn park_all<D: Delivery>(
    common: &Arc<Common>,
    key: TableKey,
    error: Arc<str>,
    dlq: bool,
    reason: ParkReason,
    m: TableMetrics,
    rows: Vec<D>,
) {
    let task_common = common.clone();
    common.tracker.spawn(async move {
        let common = task_common;
        let cap = common.settings.pool_backoff.max;
        let parking = Parking {
            table: key.clone(),
            class: Class::Rejected,
            code: None,
            error: error.to_string(),
        };
        let (mut parked, mut failed, mut naked) = (0usize, 0usize, 0usize);
        for d in rows {
            if !dlq {
                naked += 1;
                let _ = d.nak(cap).await;
                continue;
            }
            match d.park(&parking).await {
                Ok(()) => parked += 1,
                Err((d, _)) => {
                    failed += 1;
                    let _ = d.nak(cap).await;
                }
            }
        }
        let counter = match reason {
            ParkReason::NoTarget => &m.parked_no_target,
            ParkReason::InvalidSubject => &m.parked_invalid,
            ParkReason::Undecodable => &m.parked_undecodable,
        };
        counter.increment(parked as u64);
        m.dlq_failures.increment(failed as u64);
        common.stats.parked(parked);
        common.stats.dlq_failures(failed);
        common.stats.handed_back(failed + naked);
        if parked + failed + naked > 0 {
            tracing::warn!(tenant = %key.tenant, table = %key.table, parked, dlq_failures = failed, left_unacked = naked,
                error = %error, "rows parked whole");
        }
    });
}
