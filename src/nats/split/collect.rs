//! Records whose split is over, removed once nothing of them can come any more.
//!
//! A record must stay while a copy of one of its parts may still be delivered: the
//! copy must then find it, or a surplus copy would be taken for one no record judges
//! and inserted. Every copy of a split's parts is stored before its message is acked
//! (a split publishes only while it holds the message, and the message is acked only
//! once every part is recorded). So the first pass after the ack reads the stream's
//! last sequence, which every such copy is at or below, and the record is removed (its
//! key purged, no marker left) once the consumer's ack floor has passed that sequence
//! or the stream's first sequence is beyond it: every copy is then acked or gone. On a
//! NATS cluster both values count as every pass of the last minute read them
//! (`super::super::manifest`'s trusted floor: a new leader can show them lower).
//!
//! Only the instance that acked the message removes its record, from memory: a record
//! an instance left behind (it stopped first) expires with the bucket's `max_age`, as
//! one whose parts wait longer than that does (docs/operations.md, "ClickHouse
//! clusters"). What a copy that finds no record does: `SplitRecords::judge`.

use std::sync::Weak;
use std::time::Duration;

use async_nats::jetstream::consumer;
use tokio::time::Instant;

use super::{lock, SplitRecords};
use crate::nats::manifest::{Floor, TrustedFloor};

/// How often each instance removes the records of its finished splits.
const COLLECT_EVERY: Duration = Duration::from_secs(10);

/// Remove finished records every [`COLLECT_EVERY`], for as long as `records` lives.
pub async fn keep_collecting(records: Weak<SplitRecords>) {
    let mut tick = tokio::time::interval(COLLECT_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut trusted = TrustedFloor::default();
    loop {
        tick.tick().await;
        let Some(records) = records.upgrade() else {
            return;
        };
        if lock(&records.done).is_empty() {
            continue;
        }
        match collect(&records, &mut trusted).await {
            Ok(0) => {}
            Ok(removed) => tracing::debug!(removed, "split records removed"),
            Err(e) => tracing::debug!(error = %e, "split records not collected now"),
        }
    }
}

/// One pass: the records removed.
async fn collect(records: &SplitRecords, trusted: &mut TrustedFloor) -> Result<usize, String> {
    let s = &records.settings;
    let mut stream = records
        .js
        .get_stream(&s.stream)
        .await
        .map_err(|e| format!("reading stream {}: {e}", s.stream))?;
    let state = stream
        .info()
        .await
        .map_err(|e| format!("reading stream {}: {e}", s.stream))?
        .state
        .clone();
    let ack_floor = stream
        .get_consumer::<consumer::pull::Config>(&s.consumer)
        .await
        .map_err(|e| format!("reading consumer {}: {e}", s.consumer))?
        .info()
        .await
        .map_err(|e| format!("reading consumer {}: {e}", s.consumer))?
        .ack_floor
        .stream_sequence;
    let read = Floor {
        ack_floor,
        first_sequence: state.first_sequence,
    };
    let floor = trusted.read(Instant::now(), read, s.replicas);
    let due: Vec<super::Done> = {
        let mut done = lock(&records.done);
        for d in done.iter_mut() {
            d.stored_by.get_or_insert(state.last_sequence);
        }
        let (due, kept) = std::mem::take(&mut *done).into_iter().partition(|d| {
            d.stored_by
                .is_some_and(|by| by <= floor.ack_floor || by < floor.first_sequence)
        });
        *done = kept;
        due
    };
    let mut removed = 0;
    for d in due {
        match records.keys.purge(&d.key).await {
            Ok(()) => removed += 1,
            Err(e) => {
                tracing::debug!(key = %d.key, error = %e, "a split record stays for the next pass");
                lock(&records.done).push(d);
            }
        }
    }
    Ok(removed)
}
