//! The manifest bucket: a JetStream key-value bucket as the store uses it. Every write
//! gets the bucket's next revision; a write names what it expects there (nothing or a
//! removal marker: a create; a revision: a compare-and-set; nothing at all: anyway);
//! a removal leaves a marker. The log of writes is what each instance's watch reads,
//! each with its own lag.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use sluice_actors::Manifest;
use tokio::time::Instant;

use crate::mark::Mark;

/// A key's value now: a record, or the marker of its removal.
#[derive(Clone)]
pub struct Entry {
    pub revision: u64,
    pub value: Option<Arc<Manifest>>,
}

/// One write, as the watch delivers it.
#[derive(Clone)]
pub struct Logged {
    pub revision: u64,
    pub key: String,
    pub value: Option<Arc<Manifest>>,
    pub at: Instant,
}

/// What a write expects to find.
#[derive(Clone, Copy, Debug)]
pub enum Expect {
    /// No value (nothing, or a removal marker): a claim.
    Create,
    /// The value at this revision: every later write of a record.
    Revision(u64),
    /// Whatever is there.
    Anything,
}

/// The key is not as the write expected.
#[derive(Debug)]
pub struct NotAsExpected;

pub struct Kv {
    state: Mutex<State>,
    /// The last revision written (what a watch waits on).
    head: Mark,
}

#[derive(Default)]
struct State {
    revision: u64,
    keys: BTreeMap<String, Entry>,
    log: Vec<Logged>,
    /// Writes tried, and a hash of them (the run's trace).
    writes: u64,
    trace: u64,
}

impl Kv {
    pub fn new() -> Self {
        Self {
            state: Mutex::default(),
            head: Mark::default(),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn head(&self) -> &Mark {
        &self.head
    }

    fn fits(entry: Option<&Entry>, expect: Expect) -> bool {
        match expect {
            Expect::Create => entry.is_none_or(|e| e.value.is_none()),
            Expect::Revision(r) => entry.is_some_and(|e| e.value.is_some() && e.revision == r),
            Expect::Anything => true,
        }
    }

    /// Write `value` (a record, or `None`: remove) under `key` if it is as `expect`
    /// says; returns the write's revision.
    pub fn write(
        &self,
        key: &str,
        value: Option<Arc<Manifest>>,
        expect: Expect,
    ) -> Result<u64, NotAsExpected> {
        let mut s = self.state();
        let fits = Self::fits(s.keys.get(key), expect);
        s.writes += 1;
        s.trace = s
            .trace
            .wrapping_mul(31)
            .wrapping_add(u64::from(fits) + 2 * value.is_some() as u64)
            ^ key.len() as u64;
        crate::coverage::log(format_args!(
            "kv {key} {expect:?} fits {fits} -> {:?}",
            value.as_ref().map(|m| &m.state)
        ));
        if !fits {
            return Err(NotAsExpected);
        }
        s.revision += 1;
        let revision = s.revision;
        s.keys.insert(
            key.to_owned(),
            Entry {
                revision,
                value: value.clone(),
            },
        );
        s.log.push(Logged {
            revision,
            key: key.to_owned(),
            value,
            at: Instant::now(),
        });
        drop(s);
        self.head.set(revision);
        Ok(revision)
    }

    pub fn get(&self, key: &str) -> Option<Entry> {
        self.state().keys.get(key).cloned()
    }

    /// The writes after `revision`, in order.
    pub fn since(&self, revision: u64) -> Vec<Logged> {
        let s = self.state();
        let from = s.log.partition_point(|l| l.revision <= revision);
        s.log[from..].to_vec()
    }

    /// Every record now, and the revision that is as of.
    pub fn snapshot(&self) -> (u64, Vec<(String, Entry)>) {
        let s = self.state();
        let values = s
            .keys
            .iter()
            .filter(|(_, e)| e.value.is_some())
            .map(|(k, e)| (k.clone(), e.clone()))
            .collect();
        (s.revision, values)
    }

    /// A hash of every write tried, in order.
    pub fn trace(&self) -> u64 {
        let s = self.state();
        s.trace ^ s.writes.rotate_left(32)
    }

    /// The records left (at the end of a run: none may be).
    pub fn records(&self) -> Vec<Arc<Manifest>> {
        self.state()
            .keys
            .values()
            .filter_map(|e| e.value.clone())
            .collect()
    }
}
