//! Fakes for the ports: a recording [`FakeDelivery`] (with its [`Journal`]), a scripted
//! [`ScriptedInserter`] and an in-memory [`FakeSource`]. Used by this crate's tests and
//! the throughput example; public so the binary's tests can drive the tree too.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::Notify;

use crate::ports::*;

// === Delivery ===

/// What happened to one delivery.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    Acked,
    /// Acked, and JetStream's confirmation awaited.
    AckedConfirmed,
    Naked(Duration),
    Parked(Parking),
    /// One row of a many-row message parked (the message is acked after).
    ParkedRow(u32, Parking),
    /// The DLQ publish failed; the delivery came back to the caller.
    ParkFailed(Parking),
    Progress,
    /// Dropped without being settled (the real adapter naks it at once).
    DroppedUnsettled,
    /// Split into parts of one shard each, published as messages of their own, then
    /// acked (counted as an ack).
    Split(Vec<(usize, Bytes)>),
    /// A manifest was recorded (by a [`FakeManifestStore`] over this journal; sequence 0):
    /// `true` once its verdicts are. Orders the store's writes among the acks.
    ManifestRecorded(bool),
}

impl Event {
    fn terminal(&self) -> bool {
        !matches!(
            self,
            Event::Progress
                | Event::ParkFailed(_)
                | Event::ParkedRow(..)
                | Event::ManifestRecorded(_)
        )
    }
}

/// Records what happened to every [`FakeDelivery`] it made.
#[derive(Debug, Default)]
pub struct Journal {
    record: bool,
    events: Mutex<Vec<(u64, Event)>>,
    next_seq: AtomicU64,
    /// Every message made, by sequence: what a store reads from the stream.
    payloads: Mutex<std::collections::HashMap<u64, (Arc<str>, Bytes)>>,
    pub dlq_fails: AtomicBool,
    /// A progress never completes (a NATS client whose outbound queue is full and
    /// does not drain): what the keepalive must not wait on.
    pub progress_hangs: AtomicBool,
    acks: AtomicU64,
    naks: AtomicU64,
    parks: AtomicU64,
    dropped: AtomicU64,
}

impl Journal {
    /// Records every event (tests).
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            record: true,
            ..Default::default()
        })
    }

    /// Counts only (throughput runs).
    pub fn counting() -> Arc<Self> {
        Arc::new(Self::default())
    }

    pub fn delivery(
        self: &Arc<Self>,
        subject: &Arc<str>,
        payload: impl Into<Bytes>,
    ) -> FakeDelivery {
        let seq = self.next_seq.fetch_add(1, Ordering::Relaxed) + 1;
        let payload = payload.into();
        if self.record {
            self.payloads
                .lock()
                .unwrap()
                .insert(seq, (subject.clone(), payload.clone()));
        }
        FakeDelivery {
            seq,
            deliveries: 1,
            subject: subject.clone(),
            payload,
            journal: self.clone(),
            settled: false,
            alive_since: Mutex::new(tokio::time::Instant::now()),
            parked_whole: Mutex::new(None),
            part: None,
            undecodable: None,
        }
    }

    /// Message `seq` delivered again (its `deliveries`-th delivery), as JetStream does
    /// after a nak or `ack_wait`.
    pub fn redeliver(self: &Arc<Self>, seq: u64, deliveries: u64) -> FakeDelivery {
        let (subject, payload) = self.payload(seq).expect("a message this journal made");
        FakeDelivery {
            seq,
            deliveries,
            subject,
            payload,
            journal: self.clone(),
            settled: false,
            alive_since: Mutex::new(tokio::time::Instant::now()),
            parked_whole: Mutex::new(None),
            part: None,
            undecodable: None,
        }
    }

    /// The subject and payload of message `seq`, as the stream holds it.
    pub fn payload(&self, seq: u64) -> Option<(Arc<str>, Bytes)> {
        self.payloads.lock().unwrap().get(&seq).cloned()
    }

    /// Message `seq` leaves the stream unsettled (an operator deleting it by hand).
    pub fn remove_from_stream(&self, seq: u64) {
        self.payloads.lock().unwrap().remove(&seq);
    }

    /// `n` rows `{"n":i}` on `subject`.
    pub fn rows(self: &Arc<Self>, subject: &str, n: usize) -> Vec<FakeDelivery> {
        let s: Arc<str> = Arc::from(subject);
        (0..n)
            .map(|i| self.delivery(&s, format!("{{\"n\":{i}}}")))
            .collect()
    }

    fn push(&self, seq: u64, e: Event) {
        match e {
            Event::Acked | Event::AckedConfirmed | Event::Split(_) => &self.acks,
            Event::Naked(_) => &self.naks,
            Event::Parked(_) | Event::ParkedRow(..) => &self.parks,
            Event::DroppedUnsettled => &self.dropped,
            _ => {
                if self.record {
                    self.events.lock().unwrap().push((seq, e));
                }
                return;
            }
        }
        .fetch_add(1, Ordering::Relaxed);
        if self.record {
            self.events.lock().unwrap().push((seq, e));
        }
    }

    pub fn events(&self) -> Vec<(u64, Event)> {
        self.events.lock().unwrap().clone()
    }

    pub fn acked(&self) -> u64 {
        self.acks.load(Ordering::Relaxed)
    }
    pub fn naked(&self) -> u64 {
        self.naks.load(Ordering::Relaxed)
    }
    pub fn parked(&self) -> u64 {
        self.parks.load(Ordering::Relaxed)
    }
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
    /// Rows settled one way or another (acked, naked, parked, dropped).
    pub fn settled(&self) -> u64 {
        self.acked() + self.naked() + self.parked() + self.dropped()
    }

    pub fn nak_delays(&self) -> Vec<(u64, Duration)> {
        self.events()
            .into_iter()
            .filter_map(|(s, e)| match e {
                Event::Naked(d) => Some((s, d)),
                _ => None,
            })
            .collect()
    }

    pub fn parkings(&self) -> Vec<(u64, Parking)> {
        self.events()
            .into_iter()
            .filter_map(|(s, e)| match e {
                Event::Parked(p) | Event::ParkedRow(_, p) => Some((s, p)),
                _ => None,
            })
            .collect()
    }

    pub fn seqs_where(&self, f: impl Fn(&Event) -> bool) -> Vec<u64> {
        let mut v: Vec<u64> = self
            .events()
            .into_iter()
            .filter(|(_, e)| f(e))
            .map(|(s, _)| s)
            .collect();
        v.sort_unstable();
        v
    }

    /// The terminal events of one delivery.
    pub fn terminal(&self, seq: u64) -> Vec<Event> {
        self.events()
            .into_iter()
            .filter(|(s, e)| *s == seq && e.terminal())
            .map(|(_, e)| e)
            .collect()
    }

    /// Every delivery made so far was settled exactly once. Returns the offenders.
    pub fn not_settled_once(&self) -> Vec<(u64, usize)> {
        let made = self.next_seq.load(Ordering::Relaxed);
        let mut counts = vec![0usize; made as usize + 1];
        for (s, e) in self.events() {
            if e.terminal() {
                counts[s as usize] += 1;
            }
        }
        counts
            .iter()
            .enumerate()
            .skip(1)
            .filter(|(_, c)| **c != 1)
            .map(|(s, c)| (s as u64, *c))
            .collect()
    }
}

/// A recording delivery. Dropped unsettled, it records `DroppedUnsettled` (where the
/// real adapter naks it).
#[derive(Debug)]
pub struct FakeDelivery {
    pub seq: u64,
    pub deliveries: u64,
    subject: Arc<str>,
    payload: Bytes,
    journal: Arc<Journal>,
    settled: bool,
    /// Moved on by `progress()`.
    alive_since: Mutex<tokio::time::Instant>,
    /// Published to the DLQ whole (`park_message`): its ack is recorded as
    /// [`Event::Parked`], as [`Delivery::park`] records it.
    parked_whole: Mutex<Option<Parking>>,
    /// What its split's record says of it, when it is a part of a message split by
    /// shard ([`FakeDelivery::as_part`]).
    part: Option<Result<PartCopy, SettleError>>,
    /// See [`Delivery::undecodable`].
    undecodable: Option<String>,
}

impl FakeDelivery {
    /// A part of a split message that its split's record judges `judged`.
    pub fn as_part(mut self, judged: Result<PartCopy, SettleError>) -> Self {
        self.part = Some(judged);
        self
    }

    /// A delivery whose payload the adapter could not decode, for `reason`.
    pub fn undecodable(mut self, reason: &str) -> Self {
        self.undecodable = Some(reason.to_owned());
        self
    }

    fn settle(mut self, e: Event) {
        self.settled = true;
        let e = match (&e, self.parked_whole.lock().unwrap().take()) {
            (Event::Acked | Event::AckedConfirmed, Some(parking)) => Event::Parked(parking),
            _ => e,
        };
        self.journal.push(self.seq, e);
    }
}

impl Drop for FakeDelivery {
    fn drop(&mut self) {
        if !self.settled {
            self.journal.push(self.seq, Event::DroppedUnsettled);
        }
    }
}

impl Delivery for FakeDelivery {
    fn payload(&self) -> &Bytes {
        &self.payload
    }

    fn undecodable(&self) -> Option<&str> {
        self.undecodable.as_deref()
    }

    fn subject(&self) -> &str {
        &self.subject
    }

    fn meta(&self) -> DeliveryMeta {
        DeliveryMeta {
            subject: self.subject.to_string(),
            stream_sequence: self.seq,
            deliveries: self.deliveries,
        }
    }

    fn position(&self) -> Position {
        Position {
            stream_sequence: self.seq,
            deliveries: self.deliveries,
        }
    }

    async fn ack(self) -> Result<(), SettleError> {
        self.settle(Event::Acked);
        Ok(())
    }

    async fn ack_confirmed(self) -> Result<(), SettleError> {
        self.settle(Event::AckedConfirmed);
        Ok(())
    }

    fn is_split_part(&self) -> bool {
        self.part.is_some()
    }

    async fn judge_part(&self) -> Result<PartCopy, SettleError> {
        self.part.clone().unwrap_or(Ok(PartCopy::Counted))
    }

    async fn park_row(&self, line: u32, _row: Bytes, parking: &Parking) -> Result<(), SettleError> {
        if self.journal.dlq_fails.load(Ordering::Relaxed) {
            self.journal
                .push(self.seq, Event::ParkFailed(parking.clone()));
            return Err(SettleError("DLQ full".into()));
        }
        self.journal
            .push(self.seq, Event::ParkedRow(line, parking.clone()));
        Ok(())
    }

    async fn park_message(&self, parking: &Parking) -> Result<(), SettleError> {
        if self.journal.dlq_fails.load(Ordering::Relaxed) {
            self.journal
                .push(self.seq, Event::ParkFailed(parking.clone()));
            return Err(SettleError("DLQ full".into()));
        }
        *self.parked_whole.lock().unwrap() = Some(parking.clone());
        Ok(())
    }

    fn progress(
        &self,
    ) -> impl std::future::Future<Output = Result<(), SettleError>> + Send + 'static {
        let (journal, seq) = (self.journal.clone(), self.seq);
        *self.alive_since.lock().unwrap() = tokio::time::Instant::now();
        async move {
            if journal.progress_hangs.load(Ordering::Relaxed) {
                std::future::pending::<()>().await;
            }
            journal.push(seq, Event::Progress);
            Ok(())
        }
    }

    fn alive_since(&self) -> tokio::time::Instant {
        *self.alive_since.lock().unwrap()
    }

    async fn nak(self, delay: Duration) -> Result<(), SettleError> {
        self.settle(Event::Naked(delay));
        Ok(())
    }

    async fn split(self, parts: Vec<(usize, Bytes)>) -> Result<(), (Self, SettleError)> {
        self.settle(Event::Split(parts));
        Ok(())
    }

    async fn park(self, parking: &Parking) -> Result<(), (Self, SettleError)> {
        if self.journal.dlq_fails.load(Ordering::Relaxed) {
            self.journal
                .push(self.seq, Event::ParkFailed(parking.clone()));
            return Err((self, SettleError("DLQ full".into())));
        }
        self.settle(Event::Parked(parking.clone()));
        Ok(())
    }
}

// === Errors ===

/// An answer with ClickHouse exception code `code`, of the class the test says.
///
/// Built by class, never from a copy of the classifier's code lists (those live in one
/// place, the `sluice` crate's classifier): a test states what the classifier would
/// say of the code it scripts. Add `.table_scoped()` / `.splittable()` for the flags.
pub fn answer(class: Class, code: u32) -> ClickHouseError {
    ClickHouseError {
        class,
        code: Some(code),
        table_scoped: false,
        splittable: false,
        missing_table: false,
        status: Some(500),
        no_answer: None,
        message: format!("Code: {code}. DB::Exception: scripted"),
    }
}

/// ClickHouse judged the rows (CANNOT_PARSE_INPUT and the like).
pub fn rejected(code: u32) -> ClickHouseError {
    answer(Class::Rejected, code)
}

/// ClickHouse could not take them now.
pub fn unavailable(code: u32) -> ClickHouseError {
    answer(Class::Unavailable, code)
}

/// The connection's configuration (user, password, grants).
pub fn denied(code: u32) -> ClickHouseError {
    answer(Class::Denied, code)
}

/// A codeless HTTP answer, of the class the test says.
pub fn status(status: u16, class: Class) -> ClickHouseError {
    ClickHouseError {
        class,
        code: None,
        table_scoped: false,
        splittable: false,
        missing_table: false,
        status: Some(status),
        no_answer: None,
        message: format!("HTTP {status}"),
    }
}

impl ClickHouseError {
    /// The failure backs off its table alone.
    pub fn table_scoped(mut self) -> Self {
        self.table_scoped = true;
        self
    }

    /// A multi-row batch may succeed when split.
    pub fn splittable(mut self) -> Self {
        self.splittable = true;
        self
    }

    /// The table or its database does not exist (the whole batch, no row named).
    pub fn table_missing(mut self) -> Self {
        self.missing_table = true;
        self
    }
}

/// No connection made (the server was not there): the rows were never sent.
pub fn refused(what: &str) -> ClickHouseError {
    no_answer(crate::NoAnswer::Refused, what)
}

/// The connection lost with no answer (reset, closed mid-answer): what a ClickHouse
/// that crashes on the rows looks like.
pub fn lost(what: &str) -> ClickHouseError {
    no_answer(crate::NoAnswer::Lost, what)
}

/// No answer within the request's timeout (a frozen or slow server).
pub fn timed_out(what: &str) -> ClickHouseError {
    no_answer(crate::NoAnswer::TimedOut, what)
}

/// A transport failure (no HTTP answer), for `why`.
fn no_answer(why: crate::NoAnswer, what: &str) -> ClickHouseError {
    ClickHouseError {
        class: Class::Unavailable,
        code: None,
        table_scoped: false,
        splittable: false,
        missing_table: false,
        status: None,
        no_answer: Some(why),
        message: what.to_owned(),
    }
}

// === Inserter ===

pub type Answer = Result<(), ClickHouseError>;
type Rule = Arc<dyn Fn(&InsertRequest) -> Option<Answer> + Send + Sync>;

/// One recorded insert request.
#[derive(Clone, Debug)]
pub struct Recorded {
    pub table: TableKey,
    pub rows: usize,
    pub body: Bytes,
    pub token: Option<String>,
    pub answer: Answer,
    /// Whether its rows went in although the answer was lost: a request in flight when
    /// [`ScriptedInserter::crash_on`]'s row took the server down.
    pub committed_unanswered: bool,
    /// Whether no other request was in flight at any moment of it.
    pub alone: bool,
}

impl Recorded {
    pub fn lines(&self) -> Vec<String> {
        String::from_utf8_lossy(&self.body)
            .lines()
            .map(str::to_owned)
            .collect()
    }
}

/// Answers each insert from a queue of scripted answers, then from rules (first match),
/// then the default. Records every request.
#[derive(Default)]
pub struct ScriptedInserter {
    queue: Mutex<VecDeque<Answer>>,
    rules: Mutex<Vec<Rule>>,
    default: Mutex<Option<ClickHouseError>>,
    probe: Mutex<Option<ClickHouseError>>,
    latency: Mutex<Duration>,
    record: bool,
    requests: Mutex<Vec<Recorded>>,
    count: AtomicUsize,
    rows_ok: AtomicUsize,
    probes: AtomicU32,
    /// What `deduplicates()` answers for every table.
    dedup: AtomicBool,
    dedup_window: Mutex<Option<DedupWindow>>,
    /// The requests in flight, by their number: whether another overlapped them, and
    /// whether a crash took their answer.
    in_flight: Mutex<InFlight>,
}

#[derive(Default)]
struct InFlight {
    next: u64,
    requests: std::collections::HashMap<u64, Overlap>,
    /// `crash_on`'s needle, and how many requests carrying it are in flight.
    crash_needle: Option<&'static str>,
    crashing: usize,
}

#[derive(Default, Clone, Copy)]
struct Overlap {
    overlapped: bool,
    crashed: bool,
}

impl InFlight {
    fn start(&mut self, carries_needle: bool) -> u64 {
        let id = self.next;
        self.next += 1;
        let overlapped = !self.requests.is_empty();
        for other in self.requests.values_mut() {
            other.overlapped = true;
            other.crashed |= carries_needle;
        }
        if carries_needle {
            self.crashing += 1;
        }
        let crashed = self.crashing > 0;
        self.requests.insert(
            id,
            Overlap {
                overlapped,
                crashed,
            },
        );
        id
    }

    fn end(&mut self, id: u64, carries_needle: bool) -> Overlap {
        if carries_needle {
            self.crashing -= 1;
        }
        self.requests.remove(&id).unwrap_or_default()
    }

    fn carries_needle(&self, body: &[u8]) -> bool {
        self.crash_needle
            .is_some_and(|n| body.windows(n.len()).any(|w| w == n.as_bytes()))
    }
}

impl ScriptedInserter {
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            record: true,
            ..Default::default()
        })
    }

    /// Answers Ok to everything and records only counts (throughput runs).
    pub fn instant() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// The next inserts answer these, in order.
    pub fn script(&self, answers: impl IntoIterator<Item = Answer>) {
        self.queue.lock().unwrap().extend(answers);
    }

    pub fn rule(&self, f: impl Fn(&InsertRequest) -> Option<Answer> + Send + Sync + 'static) {
        self.rules.lock().unwrap().push(Arc::new(f));
    }

    pub fn clear_rules(&self) {
        self.rules.lock().unwrap().clear();
    }

    /// Reject (code 27, CANNOT_PARSE_INPUT) every request whose body contains `needle`.
    pub fn reject_containing(&self, needle: &'static str) {
        self.rule(move |r| {
            let hay = &r.body[..];
            hay.windows(needle.len())
                .any(|w| w == needle.as_bytes())
                .then(|| Err(rejected(27)))
        });
    }

    /// A request whose body contains `needle` takes the server down, as a row that
    /// crashes ClickHouse does: it and every request in flight beside it lose the
    /// connection (answered like a reset), and those others went in before the server
    /// died (`Recorded::committed_unanswered`, counted in `rows_inserted`). Scripts and
    /// rules are not asked for these requests.
    pub fn crash_on(&self, needle: &'static str) {
        self.in_flight.lock().unwrap().crash_needle = Some(needle);
    }

    /// What every insert answers when nothing else matched (`None`: Ok).
    pub fn set_default(&self, e: Option<ClickHouseError>) {
        *self.default.lock().unwrap() = e;
    }

    /// What `probe()` answers (`None`: Ok).
    pub fn set_probe(&self, e: Option<ClickHouseError>) {
        *self.probe.lock().unwrap() = e;
    }

    /// Whether every table deduplicates inserts (exactly-once) or not (the default).
    pub fn set_dedup(&self, on: bool) {
        self.dedup.store(on, Ordering::Relaxed);
    }

    /// The deduplication window the table reports (none by default).
    pub fn set_dedup_window(&self, window: Option<DedupWindow>) {
        *self.dedup_window.lock().unwrap() = window;
    }

    /// Every insert takes this long (paused time makes it free).
    pub fn set_latency(&self, d: Duration) {
        *self.latency.lock().unwrap() = d;
    }

    pub fn requests(&self) -> Vec<Recorded> {
        self.requests.lock().unwrap().clone()
    }

    pub fn request_count(&self) -> usize {
        self.count.load(Ordering::Relaxed)
    }

    pub fn rows_inserted(&self) -> usize {
        self.rows_ok.load(Ordering::Relaxed)
    }

    pub fn probe_count(&self) -> u32 {
        self.probes.load(Ordering::Relaxed)
    }

    fn answer(&self, r: &InsertRequest) -> Answer {
        if let Some(a) = self.queue.lock().unwrap().pop_front() {
            return a;
        }
        // Called outside the lock: a rule may panic (a flight's bug, injected).
        let rules: Vec<Rule> = self.rules.lock().unwrap().clone();
        for rule in rules {
            if let Some(a) = rule(r) {
                return a;
            }
        }
        match &*self.default.lock().unwrap() {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }
}

impl Inserter for ScriptedInserter {
    async fn insert(&self, request: InsertRequest) -> Result<(), ClickHouseError> {
        let latency = *self.latency.lock().unwrap();
        let (id, bomb) = {
            let mut in_flight = self.in_flight.lock().unwrap();
            let bomb = in_flight.carries_needle(&request.body);
            (in_flight.start(bomb), bomb)
        };
        if !latency.is_zero() {
            tokio::time::sleep(latency).await;
        }
        let overlap = self.in_flight.lock().unwrap().end(id, bomb);
        self.count.fetch_add(1, Ordering::Relaxed);
        let committed_unanswered = overlap.crashed && !bomb;
        let a = if overlap.crashed {
            Err(lost("connection closed before message completed"))
        } else {
            self.answer(&request)
        };
        if a.is_ok() || committed_unanswered {
            self.rows_ok.fetch_add(request.rows, Ordering::Relaxed);
        }
        if self.record {
            self.requests.lock().unwrap().push(Recorded {
                table: request.table.clone(),
                rows: request.rows,
                body: request.body.clone(),
                token: request.dedup_token.clone(),
                answer: a.clone(),
                committed_unanswered,
                alone: !overlap.overlapped,
            });
        }
        a
    }

    async fn deduplicates(&self, _table: &TableKey) -> Result<Dedup, ClickHouseError> {
        let exactly_once = self.dedup.load(Ordering::Relaxed);
        Ok(Dedup {
            exactly_once,
            why: if exactly_once {
                "scripted: deduplicates"
            } else {
                "scripted: does not deduplicate"
            }
            .into(),
            window: *self.dedup_window.lock().unwrap(),
        })
    }

    async fn probe(&self) -> Result<ServerInfo, ClickHouseError> {
        self.probes.fetch_add(1, Ordering::Relaxed);
        match &*self.probe.lock().unwrap() {
            Some(e) => Err(e.clone()),
            None => Ok(ServerInfo {
                version: "fake 1.0".into(),
            }),
        }
    }
}

// === Source ===

/// The queue a [`FakeSource`] pulls from; push rows into it from the test.
#[derive(Debug, Default)]
pub struct FakeQueue {
    q: Mutex<VecDeque<FakeDelivery>>,
    notify: Notify,
    /// The next N pulls fail.
    pub fail_pulls: AtomicU32,
    /// The next N connects fail.
    pub fail_connects: AtomicU32,
    pub connects: AtomicU32,
    pub pending: AtomicU64,
}

impl FakeQueue {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    pub fn push(&self, rows: impl IntoIterator<Item = FakeDelivery>) {
        self.q.lock().unwrap().extend(rows);
        self.notify.notify_one();
    }

    pub fn len(&self) -> usize {
        self.q.lock().unwrap().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

pub struct FakeSource {
    queue: Arc<FakeQueue>,
}

impl Source for FakeSource {
    type Delivery = FakeDelivery;

    async fn pull(&mut self, max: usize) -> Result<Vec<FakeDelivery>, SourceError> {
        if self
            .queue
            .fail_pulls
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
            .is_ok()
        {
            return Err(SourceError("connection lost (scripted)".into()));
        }
        loop {
            {
                let mut q = self.queue.q.lock().unwrap();
                if !q.is_empty() {
                    let n = max.min(q.len());
                    return Ok(q.drain(..n).collect());
                }
            }
            let notified = self.queue.notify.notified();
            if tokio::time::timeout(Duration::from_millis(100), notified)
                .await
                .is_err()
            {
                return Ok(vec![]);
            }
        }
    }

    async fn pending(&mut self) -> Option<u64> {
        Some(self.queue.pending.load(Ordering::Relaxed))
    }
}

pub struct FakeSourceFactory {
    pub queue: Arc<FakeQueue>,
}

impl SourceFactory for FakeSourceFactory {
    type Source = FakeSource;

    async fn connect(&self) -> Result<FakeSource, SourceError> {
        self.queue.connects.fetch_add(1, Ordering::Relaxed);
        if self
            .queue
            .fail_connects
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
            .is_ok()
        {
            return Err(SourceError("connection refused (scripted)".into()));
        }
        Ok(FakeSource {
            queue: self.queue.clone(),
        })
    }
}

// === ManifestStore ===

/// An in-memory manifest store over a [`Journal`] (which plays the stream: `fetch` reads
/// its payloads; a message acked or parked has left it). Keeps the real store's rule (of
/// two batches claiming a message, the one recorded first wins) and reports its changes
/// as the real one does. Counts what it is asked; can be made to fail.
#[derive(Debug)]
pub struct FakeManifestStore {
    journal: Arc<Journal>,
    state: Mutex<FakeStoreState>,
    /// Every write (claim or update), in order.
    pub records: Mutex<Vec<crate::ledger::Manifest>>,
    pub forgotten: Mutex<Vec<String>>,
    /// Manifests withdrawn (their batch could not be formed whole again).
    pub withdrawn: Mutex<Vec<String>>,
    /// `forget` leaves the removal to a collector, as the NATS store does on a cluster
    /// or after a reconnect (the manifest stays).
    pub defer_forget: AtomicBool,
    /// Writes fail while set (NATS down, the bucket full).
    pub fail_writes: AtomicBool,
    pub fetches: AtomicUsize,
    /// Once, as the next fetch starts: this manifest written and these messages gone
    /// from the stream (another instance gathering the same batch sent and settled it,
    /// then acked the messages it held, while the batch was gathered here).
    pub settled_elsewhere_before_fetch: Mutex<Option<(crate::ledger::Manifest, Vec<u64>)>>,
}

#[derive(Debug, Default)]
struct FakeStoreState {
    revision: u64,
    manifests: std::collections::HashMap<String, (u64, Arc<crate::ledger::Manifest>)>,
    changes: Vec<crate::ledger::LedgerChange>,
}

/// The incarnation of the fake ingest stream.
pub const FAKE_INCARNATION: u64 = 1_700_000_000_000_000_000;

impl FakeManifestStore {
    pub fn new(journal: &Arc<Journal>) -> Arc<Self> {
        Arc::new(Self {
            journal: journal.clone(),
            state: Mutex::default(),
            records: Mutex::default(),
            forgotten: Mutex::default(),
            withdrawn: Mutex::default(),
            defer_forget: AtomicBool::new(false),
            fail_writes: AtomicBool::new(false),
            fetches: AtomicUsize::new(0),
            settled_elsewhere_before_fetch: Mutex::default(),
        })
    }

    pub fn get(&self, id: &str) -> Option<Arc<crate::ledger::Manifest>> {
        self.state
            .lock()
            .unwrap()
            .manifests
            .get(id)
            .map(|(_, m)| m.clone())
    }

    /// The manifests recorded and not forgotten.
    pub fn open_ids(&self) -> Vec<String> {
        let mut ids: Vec<String> = self
            .state
            .lock()
            .unwrap()
            .manifests
            .keys()
            .cloned()
            .collect();
        ids.sort();
        ids
    }

    /// The recorded batch holding a message, if any (the one recorded first).
    pub fn holding(&self, stream_sequence: u64) -> Option<Arc<crate::ledger::Manifest>> {
        self.state
            .lock()
            .unwrap()
            .manifests
            .values()
            .filter(|(_, m)| m.holds(stream_sequence))
            .min_by_key(|(r, _)| *r)
            .map(|(_, m)| m.clone())
    }

    fn write_fails(&self) -> Result<(), crate::ledger::StoreError> {
        if self.fail_writes.load(Ordering::Relaxed) {
            Err(crate::ledger::StoreError(
                "the manifest bucket is unavailable (scripted)".into(),
            ))
        } else {
            Ok(())
        }
    }

    /// Records `manifest` as another instance would have (whatever the store held
    /// before); returns the store's revision of it.
    pub fn plant(&self, manifest: &crate::ledger::Manifest) -> u64 {
        self.put(manifest)
    }

    /// Records `manifest`; returns the store's revision of it.
    fn put(&self, manifest: &crate::ledger::Manifest) -> u64 {
        self.journal
            .push(0, Event::ManifestRecorded(manifest.is_settled()));
        self.records.lock().unwrap().push(manifest.clone());
        let mut state = self.state.lock().unwrap();
        state.revision += 1;
        let revision = state.revision;
        let manifest = Arc::new(manifest.clone());
        state
            .manifests
            .insert(manifest.id.clone(), (revision, manifest.clone()));
        state
            .changes
            .push(crate::ledger::LedgerChange::Put { revision, manifest });
        revision
    }

    /// The compare-and-set of every write after a claim: the record must still be at
    /// `expected`.
    fn expect(&self, id: &str, expected: u64) -> Result<(), crate::ledger::UpdateError> {
        let state = self.state.lock().unwrap();
        match state.manifests.get(id) {
            Some((revision, _)) if *revision == expected => Ok(()),
            _ => Err(crate::ledger::UpdateError::Superseded { id: id.to_owned() }),
        }
    }

    fn remove(&self, id: &str) {
        let mut state = self.state.lock().unwrap();
        if let Some((_, m)) = state.manifests.remove(id) {
            state.revision += 1;
            let revision = Some(state.revision);
            state.changes.push(crate::ledger::LedgerChange::Removed {
                table: m.table.clone(),
                id: id.to_string(),
                revision,
            });
        }
    }

    /// Whether the message is still in the stream: made, and neither acked nor parked.
    fn in_stream_now(&self, seq: u64) -> bool {
        self.journal.payload(seq).is_some()
            && !self
                .journal
                .terminal(seq)
                .iter()
                .any(|e| matches!(e, Event::Acked | Event::AckedConfirmed | Event::Parked(_)))
    }
}

impl crate::ledger::ManifestStore for FakeManifestStore {
    fn incarnation(&self) -> Option<u64> {
        Some(FAKE_INCARNATION)
    }

    fn claim<'a>(
        &'a self,
        manifest: &'a crate::ledger::Manifest,
    ) -> futures::future::BoxFuture<'a, Result<u64, crate::ledger::ClaimError>> {
        Box::pin(async move {
            self.write_fails()
                .map_err(crate::ledger::ClaimError::Unavailable)?;
            let earlier = self
                .state
                .lock()
                .unwrap()
                .manifests
                .values()
                .find(|(_, m)| manifest.messages.iter().any(|s| m.holds(*s)))
                .map(|(_, m)| m.id.clone());
            if let Some(earlier) = earlier {
                return Err(crate::ledger::ClaimError::Conflict {
                    id: manifest.id.clone(),
                    earlier,
                });
            }
            Ok(self.put(manifest))
        })
    }

    fn earlier_claim(&self, manifest: &crate::ledger::Manifest) -> Option<String> {
        let state = self.state.lock().unwrap();
        let order = state
            .manifests
            .get(&manifest.id)
            .map_or(manifest.claim_order(u64::MAX), |(r, m)| m.claim_order(*r));
        state
            .manifests
            .values()
            .filter(|(_, m)| m.id != manifest.id)
            .filter(|(r, m)| m.claim_order(*r) < order)
            .find(|(_, m)| manifest.messages.iter().any(|s| m.holds(*s)))
            .map(|(_, m)| m.id.clone())
    }

    fn update<'a>(
        &'a self,
        manifest: &'a crate::ledger::Manifest,
        expected: u64,
    ) -> futures::future::BoxFuture<'a, Result<u64, crate::ledger::UpdateError>> {
        Box::pin(async move {
            self.write_fails()
                .map_err(crate::ledger::UpdateError::Unavailable)?;
            self.expect(&manifest.id, expected)?;
            Ok(self.put(manifest))
        })
    }

    fn current<'a>(
        &'a self,
        id: &'a str,
    ) -> futures::future::BoxFuture<
        'a,
        Result<Option<crate::ledger::Recorded>, crate::ledger::StoreError>,
    > {
        Box::pin(async move {
            let state = self.state.lock().unwrap();
            Ok(state.manifests.get(id).map(|(revision, m)| {
                let order = m.claim_order(*revision);
                crate::ledger::Recorded {
                    manifest: (**m).clone().claimed_as(order),
                    revision: *revision,
                }
            }))
        })
    }

    fn forget<'a>(
        &'a self,
        id: &'a str,
    ) -> futures::future::BoxFuture<'a, Result<(), crate::ledger::StoreError>> {
        Box::pin(async move {
            self.write_fails()?;
            if !self.defer_forget.load(Ordering::Relaxed) {
                self.remove(id);
            }
            self.forgotten.lock().unwrap().push(id.to_owned());
            Ok(())
        })
    }

    fn withdraw<'a>(
        &'a self,
        id: &'a str,
        expected: u64,
    ) -> futures::future::BoxFuture<'a, Result<(), crate::ledger::UpdateError>> {
        Box::pin(async move {
            self.write_fails()
                .map_err(crate::ledger::UpdateError::Unavailable)?;
            self.expect(id, expected)?;
            self.remove(id);
            self.withdrawn.lock().unwrap().push(id.to_owned());
            Ok(())
        })
    }

    fn fetch<'a>(
        &'a self,
        stream_sequences: &'a [u64],
    ) -> futures::future::BoxFuture<'a, Result<Vec<Bytes>, crate::ledger::FetchError>> {
        Box::pin(async move {
            let elsewhere = self.settled_elsewhere_before_fetch.lock().unwrap().take();
            if let Some((manifest, acked)) = elsewhere {
                self.put(&manifest);
                for seq in acked {
                    self.journal.remove_from_stream(seq);
                }
            }
            self.fetches
                .fetch_add(stream_sequences.len(), Ordering::Relaxed);
            stream_sequences
                .iter()
                .map(|s| {
                    self.journal.payload(*s).map(|(_, p)| p).ok_or(
                        crate::ledger::FetchError::Gone {
                            stream_sequence: *s,
                        },
                    )
                })
                .collect()
        })
    }

    fn in_stream<'a>(
        &'a self,
        stream_sequences: &'a [u64],
    ) -> futures::future::BoxFuture<'a, Result<Vec<bool>, crate::ledger::StoreError>> {
        Box::pin(async move {
            Ok(stream_sequences
                .iter()
                .map(|s| self.in_stream_now(*s))
                .collect())
        })
    }

    fn changes(&self) -> crate::ledger::Changes {
        let changes = std::mem::take(&mut self.state.lock().unwrap().changes);
        if changes.is_empty() {
            crate::ledger::Changes::None
        } else {
            crate::ledger::Changes::Some(changes)
        }
    }

    fn of_table(&self, table: &TableKey) -> crate::ledger::LedgerSnapshot {
        let state = self.state.lock().unwrap();
        crate::ledger::LedgerSnapshot {
            as_of: state.revision,
            manifests: state
                .manifests
                .values()
                .filter(|(_, m)| m.table == *table)
                .map(|(r, m)| (*r, m.clone()))
                .collect(),
        }
    }
}
