//! Isolation of the rows ClickHouse refuses, by bisection.
//!
//! A batch answered Rejected (or Splittable, when it has several rows) is split in
//! halves; a half that inserts is settled as inserted; a failing half is split again; a
//! single row rejected again is judged rejected (the settlement parks it on the DLQ, or,
//! with the table's DLQ off, naks it with the cap delay). One bad row among 10,000 costs at most ~2·log2(n) requests;
//! k bad rows about 2·k·log2(n) (4 and ~3·k when the server names the row, below).
//!
//! - When a range failed and its left half inserted, the right half must fail too: it is
//!   split without being tried whole (a single row is always tried: its own answer is
//!   the verdict, and the Parking carries it).
//! - Splittable (too many parts/partitions, memory limit) on a multi-row batch: the first
//!   row is tried alone before the bisection; when it fails the same way the server is
//!   the problem after all, and isolation stops there (two requests in all).
//! - A rejection that names its row (ClickHouse ends a parse error with `(at row N)`,
//!   1-based within the request, in every version from 18.x on) splits the range there
//!   instead of in the middle: the rows before it, the named row alone, the rows after
//!   it. One bad row among 10,000 then costs 4 requests and about 1.5 times the rows'
//!   parsing instead of ~28 requests and ~2.3 times (measured with sluice-bench: one bad
//!   row per 10,000 slowed a run by 28% with plain bisection). The hint only chooses
//!   the split: every row is still settled by its own request's answer, and a row is
//!   parked only when rejected alone. A hint proven wrong (the named row inserts fine
//!   alone; e.g. a server counting rows per parsing chunk) turns hints off for the rest
//!   of the isolation, so a wrong hint costs at most three requests, never row-by-row.
//! - A rejection the same for the whole batch that names no row (the table or its
//!   database does not exist) stops the isolation like an outage: splitting cannot
//!   find a row at fault where none is.
//! - Any answer that is not Rejected (and not Splittable on several rows) stops the
//!   isolation: inserted rows stay inserted, rejected rows stay rejected, every row not
//!   yet judged (the failing range and all untried ones) stays pending, for the caller
//!   to hand back under the breaker.
//!
//! The algorithm is a plain async fn over an [`Inserter`] and a [`Batch`]; it only
//! judges rows (one [`RowVerdict`] each): the batch settles them afterwards.

use std::time::Duration;

use tokio::time::Instant;

use crate::batch::keepalive::Keepalive;
use crate::batch::{Batch, RowVerdict};
use crate::ledger::session::LedgerSession;
use crate::ledger::split::RowRange;
use crate::ledger::LedgerRefusal;
use crate::metrics::ReplicaMetrics;
use crate::ports::{Class, ClickHouseError, Delivery, InsertRequest, Inserter, TableKey};

/// Everything an isolation needs besides the verdicts.
pub struct Isolation<'a, I, D> {
    pub inserter: &'a I,
    pub table: &'a TableKey,
    pub skip_unknown_fields: bool,
    pub metrics: Option<&'a ReplicaMetrics>,
    pub keepalive: Keepalive,
    pub batch: &'a Batch<D>,
    /// The batch's record (exactly-once; a no-op for a batch that is not recorded):
    /// every request carries the token of its range, a range is sent on its own only
    /// once a split listing it is recorded (see `ledger::split`), and an availability
    /// answer splits only what nobody can have sent before (see `ledger::session`).
    pub record: &'a mut LedgerSession,
    /// The batch has lost ClickHouse's connection again and again while ClickHouse
    /// answered in between (it may crash on a row of it): a lost connection is then
    /// taken as a rejection of what was sent, provided ClickHouse answers again within
    /// `revive_within` — a real outage still stops the isolation.
    pub suspect: Option<Duration>,
}

/// What an isolation did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct BisectReport {
    pub requests: usize,
    /// Rows judged inserted.
    pub inserted: usize,
    /// Rows judged rejected alone.
    pub rejected: usize,
    /// Rows still pending, for the caller to hand back under the breaker.
    pub unsettled: usize,
    /// The outage that stopped the isolation.
    pub stopped_by: Option<ClickHouseError>,
    /// At least one answer was not an outage (the server judged something).
    pub answered: bool,
    /// The last rejection seen (for the table's last error).
    pub last_rejection: Option<ClickHouseError>,
    /// A split could not be recorded (the store down, or another flight recorded the
    /// batch meanwhile): the isolation stopped before sending anything unrecorded.
    pub store_failed: Option<LedgerRefusal>,
    /// The ranges not judged when the isolation stopped, as it held them (each to be
    /// sent as it is when the batch is formed again).
    pub untried: Vec<RowRange>,
}

// === impl Isolation ===

impl<I: Inserter, D: Delivery> Isolation<'_, I, D> {
    /// Send rows `lo..hi` as one request.
    pub async fn insert(&mut self, lo: usize, hi: usize) -> Result<(), ClickHouseError> {
        if lo >= hi {
            // No rows, no insert: ClickHouse refuses an empty body (code 381), and an
            // isolation taking that for a rejection would split the empty range into
            // empty ranges for ever (a flight of a batch whose every message went back
            // as a copy did, 329,852 times).
            return Ok(());
        }
        let request = InsertRequest {
            table: self.table.clone(),
            body: self.batch.slice(lo, hi),
            rows: hi - lo,
            skip_unknown_fields: self.skip_unknown_fields,
            dedup_token: self.record.token_of(lo, hi, self.batch.rows()),
        };
        let started = Instant::now();
        let traced = tracing::enabled!(tracing::Level::TRACE).then(|| {
            (
                request.dedup_token.clone(),
                ends_of(&request.body),
                self.batch.sequences(),
            )
        });
        if traced.is_some() {
            // Its pair, "insert", comes with the answer: one without it is the await
            // a flight that does not end is in.
            tracing::trace!(table = %self.table.table, lo, hi, "insert sent");
        }
        let out = self
            .keepalive
            .run(self.inserter.insert(request), self.batch)
            .await;
        if let Some((token, (first, last), sequences)) = traced {
            // Where a row went, should it be found twice (what the chaos suite's
            // failures are read with): the rows sent, the block's token, the answer.
            tracing::trace!(table = %self.table.table, lo, hi, rows = self.batch.rows(),
                first_seq = sequences.first().copied().unwrap_or(0),
                last_seq = sequences.last().copied().unwrap_or(0),
                messages = sequences.len(), token = token.as_deref().unwrap_or("-"),
                first, last, answer = ?out.as_ref().map_err(|e| e.to_string()),
                "insert");
        }
        if let Some(m) = self.metrics {
            m.request(
                out.as_ref().err().map(|e| e.class),
                started.elapsed().as_secs_f64(),
            );
        }
        out
    }
}

/// The first and the last row of a request's body, cut to 48 bytes each (trace only).
fn ends_of(body: &bytes::Bytes) -> (String, String) {
    let text = String::from_utf8_lossy(body);
    let mut lines = text.lines().filter(|l| !l.trim().is_empty());
    let cut = |l: &str| l.chars().take(48).collect::<String>();
    let first = lines.next().map(cut).unwrap_or_default();
    let last = lines.next_back().map(cut).unwrap_or_else(|| first.clone());
    (first, last)
}

/// A rejection that judges rows: splitting can find the ones at fault. A rejection the
/// same for every row (the table does not exist) names none: isolation stops there.
fn judges_rows(err: &ClickHouseError) -> bool {
    err.class == Class::Rejected && !err.missing_table
}

/// What a lost connection means for a suspect batch: a rejection of the rows sent when
/// ClickHouse answers again soon after (it went down on them), an outage otherwise.
pub async fn lost_on_rows<I: Inserter>(
    inserter: &I,
    err: ClickHouseError,
    revive_within: Duration,
) -> ClickHouseError {
    if !err.lost_connection() || !answers_again(inserter, revive_within).await {
        return err;
    }
    ClickHouseError {
        class: Class::Rejected,
        code: None,
        table_scoped: false,
        splittable: false,
        missing_table: false,
        status: None,
        no_answer: None,
        message: format!(
            "ClickHouse dropped the connection each time these rows were sent, and answered again in between (it may crash on one of them): {}",
            err.message
        ),
    }
}

/// Whether the target answers a probe within `within` (probing at growing intervals).
async fn answers_again<I: Inserter>(inserter: &I, within: Duration) -> bool {
    let give_up = Instant::now() + within;
    let mut wait = Duration::from_millis(250);
    loop {
        if inserter.probe().await.is_ok() {
            return true;
        }
        let now = Instant::now();
        if now >= give_up {
            return false;
        }
        tokio::time::sleep(wait.min(give_up - now)).await;
        wait = (wait * 2).min(Duration::from_secs(5));
    }
}

fn judge(verdicts: &mut [RowVerdict], lo: usize, hi: usize, verdict: RowVerdict) -> usize {
    for v in &mut verdicts[lo..hi] {
        *v = verdict.clone();
    }
    hi - lo
}

#[derive(Debug)]
struct Range {
    lo: usize,
    hi: usize,
    /// Known to fail with this (not tried whole).
    known: Option<ClickHouseError>,
    /// A right half: if its left sibling inserts, it inherits the parent's failure.
    inherit: Option<ClickHouseError>,
    left: bool,
    /// Where the request that produced `known` started, when `known` is that request's
    /// own answer for exactly this range (so its `(at row N)` counts from here).
    known_at: Option<usize>,
    /// The single row a hint named: inserting fine alone proves the hint wrong.
    hinted: bool,
    /// A range of a recorded split this isolation resumed: an earlier attempt may have
    /// sent it, so an availability answer does not split it (its pieces would be new
    /// blocks beside the one ClickHouse may have); only a rejection does.
    inherited: bool,
}

impl Range {
    fn new(lo: usize, hi: usize) -> Self {
        Self {
            lo,
            hi,
            known: None,
            inherit: None,
            left: false,
            known_at: None,
            hinted: false,
            inherited: false,
        }
    }
}

/// The 1-based row a rejection names: the last `(at row N)` of its message (the
/// message quotes the input before it, so an earlier occurrence may be row data).
pub fn row_hint(err: &ClickHouseError) -> Option<usize> {
    const MARK: &str = "(at row ";
    let at = err.message.rfind(MARK)? + MARK.len();
    let digits = err.message.get(at..)?;
    let end = digits.find(')')?;
    digits.get(..end)?.trim().parse().ok()
}

/// A single row judged for a lost connection is sent once more before it is parked: it
/// must take the server down twice on its own (`Ok`: it went in this time). Anything
/// else passes through.
async fn confirm_alone<I: Inserter, D: Delivery>(
    iso: &mut Isolation<'_, I, D>,
    lo: usize,
    hi: usize,
    err: ClickHouseError,
) -> Result<(), ClickHouseError> {
    let Some(within) = iso.suspect else {
        return Err(err);
    };
    let for_a_lost_connection =
        err.class == Class::Rejected && err.code.is_none() && err.status.is_none();
    if hi - lo != 1 || !for_a_lost_connection {
        return Err(err);
    }
    match iso.insert(lo, hi).await {
        Ok(()) => Ok(()),
        Err(again) => Err(lost_on_rows(iso.inserter, again, within).await),
    }
}

/// Isolate the rows of the batch after the whole batch failed with `first`. Every
/// verdict is `Pending` on entry; the ones still `Pending` on return are unsettled.
pub async fn bisect<I: Inserter, D: Delivery>(
    iso: &mut Isolation<'_, I, D>,
    verdicts: &mut [RowVerdict],
    first: ClickHouseError,
) -> BisectReport {
    let n = verdicts.len();
    let mut report = BisectReport::default();
    if first.class == Class::Rejected {
        report.answered = true;
        report.last_rejection = Some(first.clone());
    }
    let mut stack: Vec<Range> = Vec::with_capacity(64);
    if first.class != Class::Rejected && n > 1 {
        // Splittable: is it the batch's size, or the server? Ask with one row.
        stack.push(Range {
            known: Some(first),
            ..Range::new(1, n)
        });
        report.requests += 1;
        match send(iso, verdicts, &stack, 0, 1).await {
            Err(e) => {
                report.store_failed = Some(e);
                return stopped(report, verdicts, stack, Some(Range::new(0, 1)));
            }
            Ok(Ok(())) => {
                report.answered = true;
                report.inserted += judge(verdicts, 0, 1, RowVerdict::Inserted);
            }
            Ok(Err(e)) if judges_rows(&e) => {
                report.answered = true;
                report.rejected += judge(verdicts, 0, 1, RowVerdict::Rejected(e.clone().into()));
                report.last_rejection = Some(e);
            }
            Ok(Err(e)) => {
                report.stopped_by = Some(e);
                return stopped(report, verdicts, stack, Some(Range::new(0, 1)));
            }
        }
    } else {
        stack.push(Range {
            known: Some(first),
            known_at: Some(0),
            ..Range::new(0, n)
        });
    }
    isolate(iso, verdicts, stack, report).await
}

/// Go on with an isolation a recorded split stopped (an outage, a crash, another
/// instance): its untried ranges are sent as they are, first, and split from there.
/// `verdicts` holds the split's judged rows on entry (the untried ones `Pending`).
pub async fn resume<I: Inserter, D: Delivery>(
    iso: &mut Isolation<'_, I, D>,
    verdicts: &mut [RowVerdict],
    untried: &[RowRange],
) -> BisectReport {
    let stack = untried
        .iter()
        .map(|r| Range {
            inherited: true,
            ..Range::new(r.lo(), r.hi())
        })
        .collect();
    isolate(iso, verdicts, stack, BisectReport::default()).await
}

/// Send rows `lo..hi`, recording the split first when they are not a range it lists
/// (`stack`: the ranges the isolation holds besides this one). `Err`: the split could
/// not be recorded, nothing was sent.
async fn send<I: Inserter, D: Delivery>(
    iso: &mut Isolation<'_, I, D>,
    verdicts: &[RowVerdict],
    stack: &[Range],
    lo: usize,
    hi: usize,
) -> Result<Result<(), ClickHouseError>, LedgerRefusal> {
    let rows = verdicts.len();
    if !iso.record.may_send(lo, hi, rows) {
        let mut untried: Vec<RowRange> = stack.iter().map(|r| RowRange::new(r.lo, r.hi)).collect();
        untried.push(RowRange::new(lo, hi));
        iso.record.record_split(verdicts, untried).await?;
    }
    Ok(iso.insert(lo, hi).await)
}

/// The report of an isolation that stopped with `current` (the range it was on) and
/// `stack` not judged.
fn stopped(
    mut report: BisectReport,
    verdicts: &[RowVerdict],
    stack: Vec<Range>,
    current: Option<Range>,
) -> BisectReport {
    report.untried = stack
        .iter()
        .chain(current.as_ref())
        .map(|r| RowRange::new(r.lo, r.hi))
        .collect();
    report.unsettled = verdicts
        .iter()
        .filter(|v| matches!(v, RowVerdict::Pending))
        .count();
    report
}

/// The isolation proper: take ranges off `stack` until none is left or an answer stops
/// it.
async fn isolate<I: Inserter, D: Delivery>(
    iso: &mut Isolation<'_, I, D>,
    verdicts: &mut [RowVerdict],
    mut stack: Vec<Range>,
    mut report: BisectReport,
) -> BisectReport {
    let mut hints = true;
    while let Some(r) = stack.pop() {
        iso.keepalive.tick(iso.batch).await;
        let size = r.hi - r.lo;
        let (err, err_at) = match r.known {
            Some(ref e) if size >= 2 => (e.clone(), r.known_at),
            _ => {
                report.requests += 1;
                let answer = match send(iso, verdicts, &stack, r.lo, r.hi).await {
                    Ok(answer) => answer,
                    Err(e) => {
                        report.store_failed = Some(e);
                        return stopped(report, verdicts, stack, Some(r));
                    }
                };
                match answer {
                    Ok(()) => {
                        report.answered = true;
                        if r.hinted {
                            // The named row was fine: the server's row numbers are not
                            // ours (or the failure was elsewhere). Halves from now on.
                            hints = false;
                        }
                        report.inserted += judge(verdicts, r.lo, r.hi, RowVerdict::Inserted);
                        if r.left {
                            if let Some(sibling) = stack.last_mut() {
                                if sibling.lo == r.hi && sibling.known.is_none() {
                                    sibling.known = sibling.inherit.take();
                                }
                            }
                        }
                        continue;
                    }
                    Err(e) => match iso.suspect {
                        Some(within) => (lost_on_rows(iso.inserter, e, within).await, Some(r.lo)),
                        None => (e, Some(r.lo)),
                    },
                }
            }
        };
        let err = match confirm_alone(iso, r.lo, r.hi, err).await {
            Ok(()) => {
                report.answered = true;
                report.inserted += judge(verdicts, r.lo, r.hi, RowVerdict::Inserted);
                continue;
            }
            Err(err) => err,
        };
        let rejected = judges_rows(&err);
        if rejected || (err.splittable && size >= 2 && !r.inherited) {
            report.answered = true;
            if size == 1 {
                report.rejected += judge(
                    verdicts,
                    r.lo,
                    r.hi,
                    RowVerdict::Rejected(err.clone().into()),
                );
                report.last_rejection = Some(err);
            } else {
                if rejected {
                    report.last_rejection = Some(err.clone());
                }
                let hint = err_at.filter(|_| rejected && hints);
                push_pieces(&mut stack, &r, err, hint);
            }
        } else {
            report.stopped_by = Some(err);
            return stopped(report, verdicts, stack, Some(r));
        }
    }
    stopped(report, verdicts, stack, None)
}

/// The pieces of a failed range, onto the stack: before the row the server named (at
/// `hint`, the range's first row's number as the server counts), the row alone, after
/// it; without a name in range, its halves (the right one inherits the error, tried
/// only once the left one is in).
fn push_pieces(stack: &mut Vec<Range>, r: &Range, err: ClickHouseError, hint: Option<usize>) {
    let named = hint
        .and_then(|at| Some(at + row_hint(&err)?.checked_sub(1)?))
        .filter(|k| (r.lo..r.hi).contains(k));
    if let Some(k) = named {
        // Before the named row, the row alone, after it (tried in that
        // order: the stack pops the last pushed first).
        if k + 1 < r.hi {
            stack.push(Range::new(k + 1, r.hi));
        }
        stack.push(Range {
            hinted: true,
            ..Range::new(k, k + 1)
        });
        if k > r.lo {
            stack.push(Range::new(r.lo, k));
        }
        return;
    }
    let mid = r.lo + (r.hi - r.lo) / 2;
    stack.push(Range {
        inherit: Some(err),
        ..Range::new(mid, r.hi)
    });
    stack.push(Range {
        left: true,
        ..Range::new(r.lo, mid)
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::{SettlePlan, Settled};
    use crate::testkit::{lost, rejected, unavailable, Event, Journal, ScriptedInserter};
    use std::sync::Arc;
    use std::time::Duration;

    const CAP: Duration = Duration::from_secs(30);
    const OUTAGE: Duration = Duration::from_secs(1);

    /// What one isolation judged and what settling its verdicts did.
    struct Run {
        report: BisectReport,
        settled: Settled,
        /// The rows left pending (handed back with `OUTAGE`).
        pending: Vec<u64>,
        parked: usize,
        inserted: usize,
        left_unacked: usize,
        dlq_failures: usize,
    }

    async fn run(
        ins: &ScriptedInserter,
        journal: &Arc<Journal>,
        n: usize,
        bad: &[usize],
        dlq: bool,
    ) -> Run {
        let subject: Arc<str> = Arc::from("ingest.acme.events");
        let rows: Vec<_> = (0..n)
            .map(|i| {
                let p = if bad.contains(&i) {
                    format!("{{\"bad\":{i}}}")
                } else {
                    format!("{{\"n\":{i}}}")
                };
                journal.delivery(&subject, p)
            })
            .collect();
        let batch = Batch::new(rows, Instant::now());
        let key = TableKey::new("acme", "events");
        let first = ins
            .insert(InsertRequest {
                table: key.clone(),
                body: batch.slice(0, n),
                rows: n,
                skip_unknown_fields: false,
                dedup_token: None,
            })
            .await
            .unwrap_err();
        let mut verdicts = vec![RowVerdict::Pending; n];
        let report = {
            let mut iso = test_isolation(ins, &key, &batch);
            bisect(&mut iso, &mut verdicts, first).await
        };
        let pending = batch
            .deliveries()
            .zip(&verdicts)
            .filter(|(_, v)| matches!(v, RowVerdict::Pending))
            .map(|(d, _)| d.seq)
            .collect();
        let plan = SettlePlan {
            table: &key,
            dlq,
            cap_delay: CAP,
            pending_delay: OUTAGE,
            confirm: false,
        };
        let settled = batch.settle(verdicts, &plan).await;
        Run {
            report,
            parked: settled.parked,
            inserted: settled.inserted,
            left_unacked: settled.handed_back - settled.pending,
            dlq_failures: settled.dlq_failures,
            settled,
            pending,
        }
    }

    /// An isolation of `batch` into `key` without metrics, a record or a suspect row.
    fn test_isolation<'a, I, D>(
        inserter: &'a I,
        key: &'a TableKey,
        batch: &'a Batch<D>,
    ) -> Isolation<'a, I, D> {
        Isolation {
            inserter,
            table: key,
            skip_unknown_fields: false,
            metrics: None,
            keepalive: Keepalive::new(Duration::from_secs(60), Instant::now()),
            batch,
            // A test's isolation lives as long as its test.
            record: Box::leak(Box::new(LedgerSession::unrecorded())),
            suspect: None,
        }
    }

    /// A batch with no rows ends its isolation at once, sending nothing (it used to
    /// send empty inserts for ever, each refused with code 381).
    #[tokio::test(start_paused = true)]
    async fn an_empty_batch_is_judged_without_an_insert() {
        let ins = ScriptedInserter::new();
        let journal = Journal::new();
        let batch: Batch<crate::testkit::FakeDelivery> = Batch::new(Vec::new(), Instant::now());
        let key = TableKey::new("acme", "events");
        let empty_body = ClickHouseError {
            message: "Code: 381, e.displayText() = DB::Exception: There is neither Transfer-Encoding header nor Content-Length header".into(),
            ..rejected(381)
        };
        let mut verdicts = Vec::new();
        let mut iso = test_isolation(&*ins, &key, &batch);
        assert_eq!(iso.insert(0, 0).await, Ok(()));
        let report = tokio::time::timeout(
            Duration::from_secs(60),
            bisect(&mut iso, &mut verdicts, empty_body),
        )
        .await
        .expect("the isolation of an empty batch never ended");
        assert_eq!((report.inserted, report.rejected), (0, 0));
        assert_eq!(ins.request_count(), 0);
        drop(journal);
    }

    #[tokio::test(start_paused = true)]
    async fn one_bad_row_among_ten_thousand_costs_at_most_forty_requests() {
        for bad in [0usize, 1, 4999, 5000, 7777, 9999] {
            let ins = ScriptedInserter::new();
            ins.reject_containing("bad");
            let journal = Journal::new();
            let r = run(&ins, &journal, 10_000, &[bad], true).await;
            assert_eq!(r.parked, 1);
            assert_eq!(r.inserted, 9_999);
            assert!(r.pending.is_empty());
            let total = ins.request_count();
            assert!(total <= 40, "bad row {bad}: {total} requests");
            assert_eq!(journal.parkings()[0].0, bad as u64 + 1);
            assert!(journal.not_settled_once().is_empty());
        }
    }

    /// For 2, 5, 10 and 25 bad rows spread over 10,000, each rejected by what `reject`
    /// scripts: each count and the requests its isolation took (every bad row parked,
    /// every other inserted, every message settled once).
    async fn requests_for_bad_rows(reject: fn(&ScriptedInserter)) -> Vec<(usize, usize)> {
        let n = 10_000usize;
        let mut costs = Vec::new();
        for k in [2usize, 5, 10, 25] {
            let bad: Vec<usize> = (0..k).map(|i| (i * 7919 + 13) % n).collect();
            let ins = ScriptedInserter::new();
            reject(&ins);
            let journal = Journal::new();
            let r = run(&ins, &journal, n, &bad, true).await;
            assert_eq!((r.parked, r.inserted), (k, n - k));
            assert!(journal.not_settled_once().is_empty());
            costs.push((k, ins.request_count()));
        }
        costs
    }

    #[tokio::test(start_paused = true)]
    async fn k_bad_rows_cost_about_two_k_log_n() {
        for (k, requests) in requests_for_bad_rows(|ins| ins.reject_containing("bad")).await {
            let bound = (2.0 * k as f64 * 10_000f64.log2()).ceil() as usize + 1;
            assert!(requests <= bound, "k={k}: {requests} > {bound}");
        }
    }

    /// Reject every request holding a line with `needle`, naming the first such line
    /// the way ClickHouse does (`(at row N)`, 1-based), plus `offset` (a server whose
    /// row numbers are not ours).
    fn reject_naming_the_row(ins: &ScriptedInserter, needle: &'static str, offset: isize) {
        ins.rule(move |r| {
            let i = r
                .body
                .split(|&b| b == b'\n')
                .position(|line| line.windows(needle.len()).any(|w| w == needle.as_bytes()))?;
            let named = (i as isize + 1 + offset).max(1);
            Some(Err(ClickHouseError {
                // The quoted input may hold the marker too: the last one counts.
                message: format!(
                    "Code: 27, e.displayText() = DB::Exception: Cannot parse input: expected \" before: (at row 77){needle}: (while read the value of key id): (at row {named})"
                ),
                ..rejected(27)
            }))
        });
    }

    #[test]
    fn the_row_a_rejection_names() {
        let e = |m: &str| ClickHouseError {
            message: m.to_owned(),
            ..rejected(27)
        };
        assert_eq!(
            row_hint(&e(
                "Cannot parse input: (at row 3)\n, e.what() = DB::Exception"
            )),
            Some(3)
        );
        assert_eq!(
            row_hint(&e("before: (at row 9) x: (at row 5001)")),
            Some(5001)
        );
        assert_eq!(
            row_hint(&e("Code: 27. DB::Exception: ...: (at row 12)\n: While executing ParallelParsingBlockInputFormat. (CANNOT_PARSE_INPUT_ASSERTION_FAILED)")),
            Some(12)
        );
        assert_eq!(
            row_hint(&e("Code: 60. Table default.x doesn't exist")),
            None
        );
        assert_eq!(row_hint(&e("(at row x)")), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_rejection_that_names_its_row_isolates_it_in_four_requests() {
        for bad in [0usize, 1, 4999, 5000, 7777, 9999] {
            let ins = ScriptedInserter::new();
            reject_naming_the_row(&ins, "bad", 0);
            let journal = Journal::new();
            let r = run(&ins, &journal, 10_000, &[bad], true).await;
            assert_eq!((r.parked, r.inserted), (1, 9_999), "bad row {bad}");
            assert!(r.pending.is_empty());
            // The whole batch, the rows before, the row alone, the rows after (no
            // "before" for the first row, no "after" for the last).
            let expected = 4 - usize::from(bad == 0) - usize::from(bad == 9_999);
            assert_eq!(ins.request_count(), expected, "bad row {bad}");
            assert_eq!(journal.parkings()[0].0, bad as u64 + 1);
            assert!(journal.not_settled_once().is_empty());
        }
    }

    #[tokio::test(start_paused = true)]
    async fn named_rows_cost_about_three_requests_each() {
        let naming = |ins: &ScriptedInserter| reject_naming_the_row(ins, "bad", 0);
        for (k, requests) in requests_for_bad_rows(naming).await {
            assert!(requests <= 3 * k + 1, "k={k}: {requests}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_wrong_row_number_costs_a_few_requests_then_halves_take_over() {
        for offset in [-3isize, 1, 250, -100_000] {
            let ins = ScriptedInserter::new();
            reject_naming_the_row(&ins, "bad", offset);
            let journal = Journal::new();
            let r = run(&ins, &journal, 10_000, &[6_123], true).await;
            assert_eq!((r.parked, r.inserted), (1, 9_999), "offset {offset}");
            assert!(r.pending.is_empty());
            assert_eq!(journal.parkings()[0].0, 6_124);
            assert!(
                ins.request_count() <= 44,
                "offset {offset}: {}",
                ins.request_count()
            );
            assert!(journal.not_settled_once().is_empty());
        }
        // A row number past the batch is ignored: plain halves.
        let ins = ScriptedInserter::new();
        reject_naming_the_row(&ins, "bad", 1_000_000);
        let journal = Journal::new();
        let r = run(&ins, &journal, 10_000, &[42], true).await;
        assert_eq!((r.parked, r.inserted), (1, 9_999));
        assert!(ins.request_count() <= 40);
    }

    #[tokio::test(start_paused = true)]
    async fn the_parked_row_carries_class_code_and_error() {
        let ins = ScriptedInserter::new();
        ins.rule(|r| {
            let s = String::from_utf8_lossy(&r.body);
            s.contains("bad").then(|| Err(rejected(6)))
        });
        let journal = Journal::new();
        let r = run(&ins, &journal, 8, &[3], true).await;
        assert_eq!(r.parked, 1);
        let (seq, p) = &journal.parkings()[0];
        assert_eq!(*seq, 4);
        assert_eq!(p.class, Class::Rejected);
        assert_eq!(p.code, Some(6));
        assert!(p.error.contains("Code: 6"));
        assert_eq!(p.table, TableKey::new("acme", "events"));
    }

    #[tokio::test(start_paused = true)]
    async fn dlq_off_naks_the_rejected_row_with_the_cap() {
        let ins = ScriptedInserter::new();
        ins.reject_containing("bad");
        let journal = Journal::new();
        let r = run(&ins, &journal, 4, &[2], false).await;
        assert_eq!((r.parked, r.left_unacked, r.inserted), (0, 1, 3));
        assert_eq!(journal.nak_delays(), vec![(3, CAP)]);
        assert_eq!(journal.parked(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn dlq_publish_failure_naks_and_counts() {
        let ins = ScriptedInserter::new();
        ins.reject_containing("bad");
        let journal = Journal::new();
        journal
            .dlq_fails
            .store(true, std::sync::atomic::Ordering::Relaxed);
        let r = run(&ins, &journal, 4, &[1], true).await;
        assert_eq!((r.parked, r.dlq_failures, r.left_unacked), (0, 1, 1));
        assert_eq!(journal.terminal(2), vec![Event::Naked(CAP)]);
        assert!(journal.not_settled_once().is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn an_outage_mid_isolation_stops_it_and_leaves_exactly_the_untried_rows() {
        let ins = ScriptedInserter::new();
        // Whole batch rejected; then: left half [0,4) rejected, [0,2) ok, [2,3) ok,
        // [3,4) rejected alone -> parked; then the server goes away.
        ins.script([
            Err(rejected(27)),
            Err(rejected(27)),
            Ok(()),
            Ok(()),
            Err(rejected(27)),
            Err(lost("connection reset by peer")),
        ]);
        let journal = Journal::new();
        let r = run(&ins, &journal, 8, &[], true).await;
        assert_eq!(r.inserted, 3);
        assert_eq!(r.parked, 1);
        assert_eq!(r.report.unsettled, 4);
        assert_eq!(
            r.report.stopped_by.as_ref().map(|e| e.class),
            Some(Class::Unavailable)
        );
        assert_eq!(r.pending, vec![5, 6, 7, 8]);
        assert_eq!(journal.acked(), 3);
        assert_eq!(journal.parked(), 1);
        assert_eq!(r.settled.pending, 4);
        for seq in [5, 6, 7, 8] {
            assert_eq!(journal.terminal(seq), vec![Event::Naked(OUTAGE)]);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_rejection_that_names_no_row_stops_the_isolation_with_nothing_split_further() {
        let ins = ScriptedInserter::new();
        // The whole batch: a bad row; then the table is dropped under the isolation.
        ins.script([Err(rejected(27)), Ok(()), Err(rejected(60).table_missing())]);
        let journal = Journal::new();
        let r = run(&ins, &journal, 16, &[], true).await;
        assert_eq!(
            ins.request_count(),
            3,
            "no split after the table went missing"
        );
        assert!(r
            .report
            .stopped_by
            .as_ref()
            .is_some_and(|e| e.missing_table));
        assert_eq!((r.inserted, r.parked), (8, 0));
        assert_eq!(r.pending.len(), 8, "the rest waits for the table");
    }

    #[tokio::test(start_paused = true)]
    async fn splittable_batch_is_split_and_every_row_lands() {
        // Too many partitions: any request with more than 3 rows fails with 252.
        let ins = ScriptedInserter::new();
        ins.rule(|r| (r.rows > 3).then(|| Err(unavailable(252).table_scoped().splittable())));
        let journal = Journal::new();
        let r = run(&ins, &journal, 50, &[], true).await;
        assert_eq!(r.inserted, 50);
        assert!(r.report.stopped_by.is_none() && r.report.answered);
        assert!(r.pending.is_empty());
        assert_eq!(journal.acked(), 50);
    }

    #[tokio::test(start_paused = true)]
    async fn splittable_that_fails_on_one_row_is_an_outage_after_two_requests() {
        let ins = ScriptedInserter::new();
        ins.set_default(Some(unavailable(241).splittable()));
        let journal = Journal::new();
        let r = run(&ins, &journal, 100, &[], true).await;
        assert_eq!(ins.request_count(), 2);
        assert_eq!(r.report.stopped_by.as_ref().and_then(|e| e.code), Some(241));
        assert_eq!(r.pending.len(), 100);
        assert_eq!(journal.acked() + journal.parked(), 0);
    }
}
