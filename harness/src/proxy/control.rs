//! The proxy's shared state: the script of modes, the rules, the counters and the
//! request log. Connection tasks ask it what to do; the test's handle changes it.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use tokio::sync::watch;

use super::mode::Mode;
use super::record::RequestRecord;
use super::rule::Rule;

/// The script: rules first, then queued modes one per request, then the fallback.
#[derive(Debug)]
pub(crate) struct Script {
    pub rules: Vec<Rule>,
    pub queue: VecDeque<Mode>,
    pub fallback: Mode,
}

/// What was decided for one request, and why.
#[derive(Debug)]
pub(crate) struct Decision {
    pub mode: Mode,
    /// `Some(i)` when rule `i` (in insertion order) decided.
    pub rule: Option<usize>,
}

/// State shared between the handle, the listener and the connections.
#[derive(Debug)]
pub(crate) struct Shared {
    script: Mutex<Script>,
    log: Mutex<Vec<RequestRecord>>,
    pub seen: AtomicU64,
    pub forwarded: AtomicU64,
    pub accepted: AtomicU64,
    /// Whether the listening port should be open (false in [`Mode::Refuse`]).
    pub want_open: watch::Sender<bool>,
    /// Bumped to make every open connection reset itself.
    pub reset_all: watch::Sender<u64>,
}

// === impl Shared ===

impl Shared {
    pub fn new() -> Self {
        Self {
            script: Mutex::new(Script {
                rules: Vec::new(),
                queue: VecDeque::new(),
                fallback: Mode::PassThrough,
            }),
            log: Mutex::new(Vec::new()),
            seen: AtomicU64::new(0),
            forwarded: AtomicU64::new(0),
            accepted: AtomicU64::new(0),
            want_open: watch::Sender::new(true),
            reset_all: watch::Sender::new(0),
        }
    }

    fn script(&self) -> MutexGuard<'_, Script> {
        // A panic elsewhere must not hide what the proxy was told to do.
        self.script
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn log(&self) -> MutexGuard<'_, Vec<RequestRecord>> {
        self.log
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Changes the script, then opens or closes the port to match it. Closing it
    /// (switching to `Refuse`) also resets every open connection: the server is gone.
    pub fn edit<T>(&self, change: impl FnOnce(&mut Script) -> T) -> T {
        let mut script = self.script();
        let out = change(&mut script);
        self.sync_port(&script, true);
        out
    }

    /// Reads the script.
    pub fn read<T>(&self, look: impl FnOnce(&Script) -> T) -> T {
        look(&self.script())
    }

    /// The port is closed only while refusing is the steady mode: an empty queue and a
    /// `Refuse` fallback.
    fn sync_port(&self, script: &Script, reset_connections: bool) {
        let open = !(script.queue.is_empty() && script.fallback == Mode::Refuse);
        let closing = self.want_open.send_if_modified(|current| {
            let changed = *current != open;
            *current = open;
            changed
        }) && !open;
        if closing && reset_connections {
            self.reset_all.send_modify(|generation| *generation += 1);
        }
    }

    /// Whether deciding needs the request body (a rule looks at bodies).
    pub fn needs_body(&self) -> bool {
        self.script().rules.iter().any(Rule::needs_body)
    }

    /// Decides what to do with one request: the first matching rule (counting down its
    /// uses), else the next queued mode, else the fallback.
    ///
    /// When this takes the last queued mode before a `Refuse` fallback, the port closes
    /// but open connections are left alone, so this request still gets its mode (the
    /// last 503 of "503, then refuse" is answered); their next requests are reset.
    pub fn decide(&self, query: Option<&str>, body: Option<&[u8]>) -> Decision {
        let mut script = self.script();
        let decision = Self::choose(&mut script, query, body);
        self.sync_port(&script, false);
        decision
    }

    fn choose(script: &mut Script, query: Option<&str>, body: Option<&[u8]>) -> Decision {
        if let Some(index) = script.rules.iter().position(|r| r.matches(query, body)) {
            let rule = &mut script.rules[index];
            let mode = rule.mode.clone();
            if let Some(remaining) = &mut rule.remaining {
                *remaining = remaining.saturating_sub(1);
                if *remaining == 0 {
                    script.rules.remove(index);
                }
            }
            return Decision {
                mode,
                rule: Some(index),
            };
        }
        let mode = script
            .queue
            .pop_front()
            .unwrap_or_else(|| script.fallback.clone());
        Decision { mode, rule: None }
    }

    /// Counts a request and logs it, numbering it in log order. Done once the proxy
    /// has decided and read what it reads, so a count a test waited for always has its
    /// record.
    /// Returns the number given.
    pub fn record(&self, mut record: RequestRecord) -> u64 {
        let mut log = self.log();
        let seq = Self::bump(&self.seen);
        record.seq = seq;
        log.push(record);
        seq
    }

    /// Notes that the upstream answered request `seq` (if the log still holds it).
    pub fn answered(&self, seq: u64) {
        let mut log = self.log();
        let at = log.partition_point(|record| record.seq < seq);
        if let Some(record) = log.get_mut(at).filter(|record| record.seq == seq) {
            record.answered = true;
        }
    }

    pub fn records(&self) -> Vec<RequestRecord> {
        self.log().clone()
    }

    /// The records numbered `first` and after. The log is in `seq` order: `record`
    /// numbers and appends under one lock.
    pub fn records_since(&self, first: u64) -> Vec<RequestRecord> {
        let log = self.log();
        let start = log.partition_point(|record| record.seq < first);
        log[start..].to_vec()
    }

    pub fn clear_records(&self) {
        self.log().clear();
    }

    pub fn count(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::SeqCst)
    }

    pub fn bump(counter: &AtomicU64) -> u64 {
        counter.fetch_add(1, Ordering::SeqCst)
    }
}
