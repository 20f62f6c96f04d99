//! A [`ScriptedInserter`]: ClickHouse answering as a test scripts it, recording what it was sent.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;

use super::*;
use crate::ports::*;

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
        Arc::default()
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
