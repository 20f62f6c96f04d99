//! One seed's world: the servers (stream, bucket, ClickHouse), the hosts and the
//! instances on them (each the real actor tree, `sluice_actors::start`, over the
//! fakes), the rows published, and the faults. [`run`] plays a seed: faults and rows
//! for a while, then everything healed and settled, then the checks.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use sluice_actors::{PipelineConfig, PipelineHandle, Target, WallClock};
use tokio::time::Instant;

use crate::clickhouse::{ClickHouse, SimInserter};
use crate::coverage::{Coverage, Reached};
use crate::dice::Dice;
use crate::kv::Kv;
use crate::net::{Host, Life, Link, Port};
use crate::plan::{Plan, TABLES};
use crate::store::SimStore;
use crate::stream::{SimDelivery, SimSourceFactory, Stream};

/// How long the world may take to settle once healed (simulated time).
const SETTLE_WITHIN: Duration = Duration::from_secs(30 * 60);
/// The wall clock's epoch at the start of a run (ms).
const EPOCH_MS: u64 = 1_800_000_000_000;

/// A row as published: its id and whether ClickHouse rejects it.
pub struct Row {
    pub id: String,
    pub bad: bool,
}

/// One message as published.
pub struct Published {
    pub table: String,
    pub rows: Vec<Row>,
}

struct Instance {
    handle: PipelineHandle<SimDelivery>,
    port: Port,
}

/// Something due later.
#[derive(Clone, Copy, Debug)]
enum Later {
    Restart(usize),
    Heal(usize, Link),
    Unfreeze(usize),
    Reconnect(usize),
    LagBack(usize),
    ReplicaUp(usize),
}

pub struct World {
    pub plan: Plan,
    pub dice: Dice,
    pub cov: Arc<Coverage>,
    pub stream: Arc<Stream>,
    pub kv: Arc<Kv>,
    pub ch: Arc<ClickHouse>,
    hosts: Vec<Arc<Host>>,
    instances: Vec<Option<Instance>>,
    lives: u64,
    seed: u64,
    pub published: BTreeMap<u64, Published>,
    next_row: u64,
    later: BTreeMap<(Instant, u64), Later>,
    /// Numbers what is due later (two things due at one instant keep their order).
    later_n: u64,
    /// The wall clock runs ahead of the runtime's by this.
    wall_skew_ms: Arc<AtomicU64>,
    start: Instant,
}

impl World {
    fn new(seed: u64) -> Self {
        let dice = Dice::new(seed);
        let cov = Arc::new(Coverage::default());
        let plan = Plan::draw(&dice);
        let stream = Arc::new(Stream::new(
            plan.partitions,
            plan.ack_wait,
            dice.clone(),
            cov.clone(),
            plan.ack_answer_lost,
        ));
        let replicas = plan.shards * plan.replicas + 1;
        let ch = Arc::new(ClickHouse::new(
            plan.shards + 1,
            replicas,
            plan.kinds.clone(),
            plan.weather,
            cov.clone(),
        ));
        let hosts = (0..plan.instances)
            .map(|index| {
                let host = Host {
                    index,
                    ..Host::default()
                };
                host.watch_lag_ms
                    .store(plan.watch_lag_ms, Ordering::Relaxed);
                Arc::new(host)
            })
            .collect();
        Self {
            instances: (0..plan.instances).map(|_| None).collect(),
            plan,
            dice,
            cov,
            stream,
            kv: Arc::new(Kv::new()),
            ch,
            hosts,
            lives: 0,
            seed,
            published: BTreeMap::new(),
            next_row: 0,
            later: BTreeMap::new(),
            later_n: 0,
            wall_skew_ms: Arc::new(AtomicU64::new(0)),
            start: Instant::now(),
        }
    }

    /// Target `main` (its shards of replicas) and `solo`, as this life reaches them.
    fn targets(&self, port: &Port) -> Vec<Target<SimInserter>> {
        let server = |shard: usize, replica: usize| {
            Arc::new(SimInserter {
                ch: self.ch.clone(),
                shard,
                replica,
                port: port.clone(),
            })
        };
        let main = (0..self.plan.shards)
            .map(|s| {
                (0..self.plan.replicas)
                    .map(|r| {
                        let replica = s * self.plan.replicas + r;
                        (format!("ch-{s}-{r}:8123"), server(s, replica))
                    })
                    .collect()
            })
            .collect();
        let solo_replica = self.plan.shards * self.plan.replicas;
        vec![
            Target::sharded("main", main),
            Target::new("solo", server(self.plan.shards, solo_replica)),
        ]
    }

    async fn start_instance(&mut self, slot: usize) {
        self.lives += 1;
        let port = Port {
            host: self.hosts[slot].clone(),
            life: Arc::new(Life::default()),
            dice: self.dice.clone(),
        };
        let store = SimStore::start(
            self.kv.clone(),
            self.stream.clone(),
            port.clone(),
            self.cov.clone(),
            self.plan.kv_answer_lost,
        );
        let (start, skew) = (self.start, self.wall_skew_ms.clone());
        let mut settings = self
            .plan
            .settings(self.seed.wrapping_mul(1_000).wrapping_add(self.lives));
        settings.wall_clock = WallClock::simulated(move || {
            EPOCH_MS
                + Instant::now().duration_since(start).as_millis() as u64
                + skew.load(Ordering::Relaxed)
        });
        let handle = sluice_actors::start(PipelineConfig {
            source: SimSourceFactory {
                stream: self.stream.clone(),
                port: port.clone(),
                store: store.clone(),
            },
            targets: self.targets(&port),
            tenants: [("acme", "main"), ("beta", "solo")]
                .iter()
                .map(|(t, g)| (t.to_string(), g.to_string()))
                .collect(),
            tables: self.plan.tables(),
            settings,
            manifests: Some(store),
        })
        .await
        .expect("an instance starts");
        self.instances[slot] = Some(Instance { handle, port });
    }

    /// The instance on `slot` dies: every actor and all it held gone, nothing more
    /// sent by it.
    fn crash(&mut self, slot: usize) -> bool {
        let Some(i) = self.instances[slot].take() else {
            return false;
        };
        i.port.life.crashed.store(true, Ordering::Relaxed);
        i.handle.kill();
        true
    }

    fn due(&mut self, after: Duration, what: Later) {
        self.later_n += 1;
        self.later
            .insert((Instant::now() + after, self.later_n), what);
    }

    async fn apply(&mut self, what: Later) {
        match what {
            Later::Restart(slot) => {
                if self.instances[slot].is_none() {
                    self.start_instance(slot).await;
                }
            }
            Later::Heal(slot, link) => {
                let h = &self.hosts[slot];
                match link {
                    Link::Stream => {
                        h.cut_nats.store(false, Ordering::Relaxed);
                        h.connects.fetch_add(1, Ordering::Relaxed);
                    }
                    Link::Kv => h.cut_kv.store(false, Ordering::Relaxed),
                    Link::ClickHouse => h.cut_ch.store(false, Ordering::Relaxed),
                }
            }
            Later::Unfreeze(slot) => self.hosts[slot].frozen.store(false, Ordering::Relaxed),
            Later::Reconnect(slot) => {
                let h = &self.hosts[slot];
                h.dropping_acks.store(false, Ordering::Relaxed);
                h.dropping_partitions.store(0, Ordering::Relaxed);
                h.connects.fetch_add(1, Ordering::Relaxed);
            }
            Later::LagBack(slot) => self.hosts[slot]
                .watch_lag_ms
                .store(self.plan.watch_lag_ms, Ordering::Relaxed),
            Later::ReplicaUp(r) => self.ch.down[r].store(false, Ordering::Relaxed),
        }
    }

    /// Let the world run until `until`, doing what falls due on the way.
    async fn run_until(&mut self, until: Instant) {
        loop {
            let next = self.later.keys().next().copied();
            match next {
                Some(key) if key.0 <= until => {
                    tokio::time::sleep_until(key.0).await;
                    if let Some(what) = self.later.remove(&key) {
                        self.apply(what).await;
                    }
                }
                _ => {
                    tokio::time::sleep_until(until).await;
                    return;
                }
            }
        }
    }

    fn publish(&mut self, messages: u64) {
        for _ in 0..messages {
            let (table, _) = *self.dice.pick(&TABLES);
            let rows: Vec<Row> = (0..1 + self.dice.below(3))
                .map(|_| {
                    self.next_row += 1;
                    Row {
                        id: format!("r{}", self.next_row),
                        bad: self.dice.chance(0.03),
                    }
                })
                .collect();
            let payload: Vec<String> = rows
                .iter()
                .map(|r| match r.bad {
                    true => format!("{{\"id\":\"{}\",\"bad\":1}}", r.id),
                    false => format!("{{\"id\":\"{}\"}}", r.id),
                })
                .collect();
            let seq = self
                .stream
                .publish(&format!("ingest.{table}"), payload.join("\n"));
            self.published.insert(
                seq,
                Published {
                    table: table.to_owned(),
                    rows,
                },
            );
        }
    }

    /// One random step of the active phase.
    async fn act(&mut self) {
        let slot = self.dice.below(self.hosts.len() as u64) as usize;
        let ack_wait = self.plan.ack_wait.as_millis() as u64;
        match self.dice.below(100) {
            0..=44 => {
                let n = 1 + self.dice.below(5);
                self.publish(n);
            }
            45..=47 if self.crash(slot) => {
                self.cov.hit(Reached::Crash);
                let back = self.dice.ms(200, 3 * ack_wait);
                self.due(back, Later::Restart(slot));
            }
            48..=53 => {
                let link = *self.dice.pick(&[Link::Stream, Link::Kv, Link::ClickHouse]);
                let h = &self.hosts[slot];
                match link {
                    Link::Stream => h.cut_nats.store(true, Ordering::Relaxed),
                    Link::Kv => h.cut_kv.store(true, Ordering::Relaxed),
                    Link::ClickHouse => h.cut_ch.store(true, Ordering::Relaxed),
                }
                self.cov.hit(Reached::Partition);
                let heal = self.dice.ms(300, 2 * ack_wait);
                self.due(heal, Later::Heal(slot, link));
            }
            54..=57 => {
                self.hosts[slot].frozen.store(true, Ordering::Relaxed);
                self.cov.hit(Reached::Freeze);
                let thaw = self.dice.ms(ack_wait / 2, 3 * ack_wait);
                self.due(thaw, Later::Unfreeze(slot));
            }
            58..=60 if self.plan.partitions > 1 && self.dice.chance(0.5) => {
                let partition = self.dice.below(self.plan.partitions as u64);
                self.hosts[slot]
                    .dropping_partitions
                    .fetch_or(1 << partition, Ordering::Relaxed);
                self.cov.hit(Reached::PartitionAcksLost);
                let back = self.dice.ms(20, 1_000);
                self.due(back, Later::Reconnect(slot));
            }
            58..=60 => {
                self.hosts[slot]
                    .dropping_acks
                    .store(true, Ordering::Relaxed);
                self.cov.hit(Reached::LostAcks);
                let back = self.dice.ms(20, 1_000);
                self.due(back, Later::Reconnect(slot));
            }
            61..=62 => {
                self.stream.leader_change();
                self.cov.hit(Reached::LeaderChange);
            }
            63..=65 => {
                let lag = self.dice.range(1_000..9_000);
                self.hosts[slot].watch_lag_ms.store(lag, Ordering::Relaxed);
                self.cov.hit(Reached::WatchLag);
                let back = self.dice.ms(1_000, 20_000);
                self.due(back, Later::LagBack(slot));
            }
            66..=71 => {
                let shard = self.dice.below(self.plan.shards as u64 + 1) as usize;
                let until = Instant::now() + self.dice.ms(500, 10_000);
                self.ch.pressure(shard, until);
            }
            72..=73 => {
                let r = self.dice.below(self.ch.down.len() as u64) as usize;
                self.ch.down[r].store(true, Ordering::Relaxed);
                let up = self.dice.ms(500, 10_000);
                self.due(up, Later::ReplicaUp(r));
            }
            74..=75 => {
                self.cov.hit(Reached::ClockJump);
                let jump = self.dice.range(5_000..120_000);
                if self.dice.chance(0.5) {
                    self.ch.skew_ms.fetch_add(jump, Ordering::Relaxed);
                } else {
                    self.wall_skew_ms.fetch_add(jump, Ordering::Relaxed);
                }
            }
            _ => {}
        }
    }

    /// Every fault ends, every instance runs.
    async fn heal(&mut self) {
        let later = std::mem::take(&mut self.later);
        for what in later.into_values() {
            self.apply(what).await;
        }
        for h in &self.hosts {
            h.frozen.store(false, Ordering::Relaxed);
        }
        self.ch.heal();
        for slot in 0..self.instances.len() {
            if self.instances[slot].is_none() {
                self.start_instance(slot).await;
            }
        }
    }

    /// Wait (bounded) until nothing is left: the stream empty, no record in the bucket.
    async fn settle(&mut self) -> bool {
        let deadline = Instant::now() + SETTLE_WITHIN;
        while Instant::now() < deadline {
            tokio::time::sleep(Duration::from_secs(1)).await;
            if self.stream.is_empty() && self.kv.records().is_empty() {
                return true;
            }
        }
        false
    }

    fn kill_all(&mut self) {
        for slot in 0..self.instances.len() {
            self.crash(slot);
        }
    }
}

/// Play one seed: returns what went wrong, if anything.
pub async fn run(seed: u64) -> (Result<(), String>, Arc<Coverage>) {
    let mut w = World::new(seed);
    for slot in 0..w.hosts.len() {
        w.start_instance(slot).await;
    }
    let active_until = Instant::now() + w.plan.active;
    while Instant::now() < active_until {
        let next = Instant::now() + w.dice.ms(20, 1_500);
        w.run_until(next.min(active_until)).await;
        w.act().await;
    }
    w.heal().await;
    let settled = w.settle().await;
    let verdict = crate::check::check(&w, settled);
    w.cov.trace(&[w.kv.trace()]);
    w.kill_all();
    (verdict, w.cov.clone())
}
