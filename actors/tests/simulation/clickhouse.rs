//! ClickHouse, per shard: each table keeps the rows it took and the log of its blocks'
//! ids (the `insert_deduplication_token`, or the body's hash), within a window of the
//! last `blocks` ids no older than `seconds` before its newest block (a block id that
//! left it is forgotten: the same block again goes in again). It parses a block before
//! it looks at its id (a bad row rejects every attempt of its block), and counts parts
//! before either (252, "too many parts", and 241, memory, answered to a retry of a block
//! it holds, too). An insert can go in and lose its answer. The replicas of a shard
//! share its tables, as a Replicated table's replicas share block ids.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sluice_actors::testkit::{refused, rejected, timed_out, unavailable};
use sluice_actors::{
    ClickHouseError, Dedup, DedupWindow, InsertRequest, Inserter, ServerInfo, TableKey,
};
use tokio::time::Instant;

use crate::coverage::{Coverage, Reached};
use crate::net::{Link, Port};

/// How a table deduplicates.
#[derive(Clone, Copy, Debug)]
pub struct TableKind {
    /// Reported exactly-once (Sluice records its batches).
    pub exactly_once: bool,
    /// Its window; `None`: it takes every block.
    pub window: Option<DedupWindow>,
}

/// How often things go wrong, for one run.
#[derive(Clone, Copy, Debug)]
pub struct Weather {
    /// An insert that went in loses its answer.
    pub answer_lost: f64,
    /// A retry of a block the table holds is answered 252 (parts counted first).
    pub retry_busy: f64,
    /// Under pressure, an insert is answered 252 or 241.
    pub busy_under_pressure: f64,
}

#[derive(Default)]
struct TableLog {
    /// Row id → times it went in.
    rows: BTreeMap<String, u32>,
    /// The window's block ids, oldest first, with the server's time they went in at.
    blocks: VecDeque<(String, u64)>,
    known: BTreeSet<String>,
    /// Ids the window let go of.
    forgotten: BTreeSet<String>,
    /// Rows taken again under an id the window had let go of (the precondition of
    /// exactly-once failed: their copies are no hole of the ledger).
    excused: BTreeSet<String>,
    /// Ids answered "busy" as a retry, not sent again yet.
    busy_retries: BTreeSet<String>,
}

#[derive(Default)]
struct Shard {
    tables: BTreeMap<String, TableLog>,
    /// Too many parts / memory until then.
    pressure_until: Option<Instant>,
}

pub struct ClickHouse {
    shards: Vec<Mutex<Shard>>,
    kinds: BTreeMap<String, TableKind>,
    /// Each replica down (refusing connections), by its global number.
    pub down: Vec<AtomicBool>,
    /// The servers' clock runs ahead of the runtime's by this (a clock jump).
    pub skew_ms: AtomicU64,
    start: Instant,
    weather: Weather,
    cov: Arc<Coverage>,
}

fn table_name(t: &TableKey) -> String {
    format!("{}.{}", t.tenant, t.table)
}

/// The row ids of a body (`{"id":"r1",...}` per line) and whether one is bad.
fn rows_of(body: &[u8]) -> (Vec<String>, bool) {
    let text = String::from_utf8_lossy(body);
    let mut ids = Vec::new();
    let mut bad = false;
    for line in text.lines() {
        bad |= line.contains("\"bad\"");
        if let Some(rest) = line.split("\"id\":\"").nth(1) {
            ids.push(rest.split('"').next().unwrap_or_default().to_owned());
        }
    }
    (ids, bad)
}

/// FNV-1a of a body: its block id when no token names it.
fn hash_of(body: &[u8]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in body {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("hash-{h:016x}")
}

impl ClickHouse {
    pub fn new(
        shards: usize,
        replicas: usize,
        kinds: BTreeMap<String, TableKind>,
        weather: Weather,
        cov: Arc<Coverage>,
    ) -> Self {
        Self {
            shards: (0..shards).map(|_| Mutex::default()).collect(),
            kinds,
            down: (0..replicas).map(|_| AtomicBool::new(false)).collect(),
            skew_ms: AtomicU64::new(0),
            start: Instant::now(),
            weather,
            cov,
        }
    }

    fn shard(&self, i: usize) -> std::sync::MutexGuard<'_, Shard> {
        self.shards[i].lock().unwrap_or_else(|e| e.into_inner())
    }

    fn server_ms(&self) -> u64 {
        Instant::now().duration_since(self.start).as_millis() as u64
            + self.skew_ms.load(Ordering::Relaxed)
    }

    pub fn pressure(&self, shard: usize, until: Instant) {
        self.shard(shard).pressure_until = Some(until);
    }

    pub fn heal(&self) {
        for i in 0..self.shards.len() {
            self.shard(i).pressure_until = None;
        }
        for d in &self.down {
            d.store(false, Ordering::Relaxed);
        }
    }

    pub fn kind(&self, table: &str) -> TableKind {
        self.kinds[table]
    }

    /// Each row id of `table` with the times it went in (all shards), and the rows
    /// excused (taken again past the window).
    pub fn contents(&self, table: &str) -> (BTreeMap<String, u32>, BTreeSet<String>) {
        let mut rows = BTreeMap::new();
        let mut excused = BTreeSet::new();
        for i in 0..self.shards.len() {
            if let Some(log) = self.shard(i).tables.get(table) {
                for (id, n) in &log.rows {
                    *rows.entry(id.clone()).or_insert(0) += n;
                }
                excused.extend(log.excused.iter().cloned());
            }
        }
        (rows, excused)
    }

    /// The server's answer to one insert, and what it did (`committed`: the rows went in
    /// or were there).
    fn take(
        &self,
        shard: usize,
        req: &InsertRequest,
        dice: &crate::dice::Dice,
    ) -> (Result<(), ClickHouseError>, bool) {
        let name = table_name(&req.table);
        let kind = self.kind(&name);
        let now_ms = self.server_ms();
        let mut s = self.shard(shard);
        let pressed = s.pressure_until.is_some_and(|u| Instant::now() < u);
        let id = req
            .dedup_token
            .clone()
            .unwrap_or_else(|| hash_of(&req.body));
        let log = s.tables.entry(name).or_default();
        let busy = || {
            if dice.chance(0.5) {
                unavailable(252).splittable().table_scoped()
            } else {
                unavailable(241).splittable()
            }
        };
        let holds = kind.window.is_some() && log.known.contains(&id);
        if log.busy_retries.remove(&id) {
            self.cov.hit(Reached::SplitRefused);
        }
        if holds && dice.chance(self.weather.retry_busy) {
            log.busy_retries.insert(id);
            self.cov.hit(Reached::Availability);
            return (Err(busy()), false);
        }
        if pressed && req.rows > 1 && dice.chance(self.weather.busy_under_pressure) {
            self.cov.hit(Reached::Availability);
            return (Err(busy()), false);
        }
        let (ids, bad) = rows_of(&req.body);
        if bad {
            self.cov.hit(Reached::RejectedRows);
            return (Err(rejected(27)), false);
        }
        if holds {
            self.cov.hit(Reached::DedupHit);
            return (Ok(()), true);
        }
        crate::coverage::log(format_args!(
            "ch shard {shard} {} {id} rows {ids:?}",
            req.table.table
        ));
        let again = log.forgotten.remove(&id);
        if again {
            self.cov.hit(Reached::RetryPastWindow);
        }
        for row in ids {
            if again {
                log.excused.insert(row.clone());
            }
            *log.rows.entry(row).or_insert(0) += 1;
        }
        if let Some(w) = kind.window {
            log.known.insert(id.clone());
            log.blocks.push_back((id, now_ms));
            let newest = log.blocks.back().map_or(0, |b| b.1);
            let oldest_kept = w
                .seconds
                .map_or(0, |s| newest.saturating_sub(s.as_millis() as u64));
            while log.blocks.len() as u64 > w.blocks
                || log.blocks.front().is_some_and(|b| b.1 < oldest_kept)
            {
                if let Some((gone, _)) = log.blocks.pop_front() {
                    log.known.remove(&gone);
                    log.forgotten.insert(gone);
                }
            }
        }
        (Ok(()), true)
    }
}

/// One instance's client of one replica.
pub struct SimInserter {
    pub ch: Arc<ClickHouse>,
    pub shard: usize,
    pub replica: usize,
    pub port: Port,
}

impl SimInserter {
    async fn reach(&self) -> Result<(), ClickHouseError> {
        self.port
            .over(Link::ClickHouse)
            .await
            .map_err(|e| refused(&e))?;
        if self.ch.down[self.replica].load(Ordering::Relaxed) {
            return Err(refused("connection refused (replica down)"));
        }
        Ok(())
    }
}

impl Inserter for SimInserter {
    async fn insert(&self, request: InsertRequest) -> Result<(), ClickHouseError> {
        self.reach().await?;
        tokio::time::sleep(self.port.dice.ms(1, 40)).await;
        self.port.dead_end().await;
        let (answer, committed) = self.ch.take(self.shard, &request, &self.port.dice);
        self.ch.cov.trace(&[
            1,
            self.port.host.index as u64,
            Coverage::text(request.dedup_token.as_deref().unwrap_or("-")),
            answer
                .as_ref()
                .err()
                .and_then(|e| e.code)
                .map_or(0, u64::from),
            u64::from(committed),
        ]);
        // The answer comes back over the same link: cut (or the replica gone) meanwhile,
        // or simply lost, the client times out with the rows in.
        let lost = committed && self.port.dice.chance(self.ch.weather.answer_lost);
        if lost || self.reach().await.is_err() {
            if committed {
                self.ch.cov.hit(Reached::CommittedAnswerLost);
            }
            tokio::time::sleep(Duration::from_secs(5)).await;
            self.port.dead_end().await;
            return Err(timed_out("no answer within the insert timeout (simulated)"));
        }
        answer
    }

    async fn probe(&self) -> Result<ServerInfo, ClickHouseError> {
        self.reach().await?;
        Ok(ServerInfo {
            version: "simulated".into(),
        })
    }

    async fn deduplicates(&self, table: &TableKey) -> Result<Dedup, ClickHouseError> {
        self.reach().await?;
        let kind = self.ch.kind(&table_name(table));
        Ok(Dedup {
            exactly_once: kind.exactly_once,
            why: "simulated".into(),
            window: kind.window,
        })
    }
}
