//! The TargetActor, its PoolActor and its TableActors driven by messages alone — no
//! consumer, no root: a TargetActor is spawned by hand with a recorder standing in for
//! the root supervisor, rows are sent to it as the consumer would, and what its actors
//! decided is read where a user would see it (the rows' fate on the fake queue, the
//! requests ClickHouse got, the snapshots of `/admin/actors`) and where a successor
//! would (the memory the target reports).
//!
//! Time is paused: every window and jitter below is exact.

use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef, DerivedActorRef};
use serde_json::Value;
use sluice_actors::context::Common;
use sluice_actors::observe::{self, NodeKind, Registry, ROOT_ID};
use sluice_actors::placement::TargetServers;
use sluice_actors::pool::PoolDebug;
use sluice_actors::protocol::TableReport;
use sluice_actors::routing::Routed;
use sluice_actors::targets::{
    TargetActor, TargetArgs, TargetDebug, TargetMemory, TargetMsg, TargetReport,
};
use sluice_actors::testkit::{
    refused, unavailable, Event, FakeDelivery, Journal, ScriptedInserter,
};
use sluice_actors::*;
use tokio::sync::mpsc;

// === a root that records ===

/// What the recorder stands in for: the root supervisor, as far as a target speaks to
/// it.
enum RootStandIn {
    Target(TargetReport),
    Orphan(TableReport),
}

impl From<TargetReport> for RootStandIn {
    fn from(r: TargetReport) -> Self {
        RootStandIn::Target(r)
    }
}

impl TryFrom<RootStandIn> for TargetReport {
    type Error = ();
    fn try_from(m: RootStandIn) -> Result<Self, ()> {
        match m {
            RootStandIn::Target(r) => Ok(r),
            _ => Err(()),
        }
    }
}

impl From<TableReport> for RootStandIn {
    fn from(r: TableReport) -> Self {
        RootStandIn::Orphan(r)
    }
}

impl TryFrom<RootStandIn> for TableReport {
    type Error = ();
    fn try_from(m: RootStandIn) -> Result<Self, ()> {
        match m {
            RootStandIn::Orphan(r) => Ok(r),
            _ => Err(()),
        }
    }
}

/// Keeps the last memory a target reported.
struct Recorder;

impl Actor for Recorder {
    type Msg = RootStandIn;
    type State = mpsc::UnboundedSender<TargetMemory>;
    type Arguments = mpsc::UnboundedSender<TargetMemory>;

    async fn pre_start(
        &self,
        _: ActorRef<Self::Msg>,
        tx: Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        Ok(tx)
    }

    async fn handle(
        &self,
        _: ActorRef<Self::Msg>,
        msg: Self::Msg,
        tx: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        if let RootStandIn::Target(TargetReport::Remember { memory, .. }) = msg {
            let _ = tx.send(*memory);
        }
        Ok(())
    }
}

// === the rig ===

const TARGET: &str = "main";

struct TargetRig {
    target: ActorRef<TargetMsg<FakeDelivery>>,
    servers: Arc<TargetServers<ScriptedInserter>>,
    /// The target's one server (the first, when it has several).
    ins: Arc<ScriptedInserter>,
    journal: Arc<Journal>,
    common: Arc<Common>,
    memories: mpsc::UnboundedReceiver<TargetMemory>,
    recorder: ActorRef<RootStandIn>,
}

fn common(batch_rows: usize) -> Arc<Common> {
    common_with(batch_rows, |t| t)
}

/// [`common`], its tables' settings as `tables` makes them.
fn common_with(
    batch_rows: usize,
    tables: impl FnOnce(TableSettingsResolver) -> TableSettingsResolver,
) -> Arc<Common> {
    let settings = PipelineSettings {
        jitter_seed: Some(11),
        // The pool's own probes would close windows behind the tests' backs.
        idle_probe_after: Duration::from_secs(3600),
        idle_probe_every: Duration::from_secs(3600),
        ..Default::default()
    };
    let tables = tables(TableSettingsResolver::new(TableSettings {
        batch_rows,
        batch_age: Duration::from_secs(3600),
        ..Default::default()
    }));
    let registry = Registry::new(settings.stale_after);
    registry.register(ROOT_ID, NodeKind::Root, "sluice", None);
    registry.register(
        &observe::target_id(TARGET),
        NodeKind::Target,
        TARGET,
        Some(ROOT_ID),
    );
    Common::new(settings, tables, registry, None)
}

async fn spawn_target(
    common: &Arc<Common>,
    servers: &Arc<TargetServers<ScriptedInserter>>,
    memory: TargetMemory,
    recorder: &ActorRef<RootStandIn>,
) -> ActorRef<TargetMsg<FakeDelivery>> {
    let root: DerivedActorRef<TargetReport> = recorder.get_derived();
    let orphans: DerivedActorRef<TableReport> = recorder.get_derived();
    let args = TargetArgs {
        index: 0,
        servers: servers.clone(),
        common: common.clone(),
        memory,
        root,
        orphans,
        fail_spawn: false,
    };
    let (target, _) = Actor::spawn(
        None,
        TargetActor::<ScriptedInserter, FakeDelivery>::default(),
        args,
    )
    .await
    .expect("the target spawns");
    target
}

impl TargetRig {
    async fn new(batch_rows: usize) -> Self {
        let ins = ScriptedInserter::new();
        Self::with_servers(batch_rows, vec![vec![(TARGET.to_owned(), ins)]]).await
    }

    /// A target of these shards of (name, inserter) replicas.
    async fn with_servers(
        batch_rows: usize,
        shards: Vec<Vec<(String, Arc<ScriptedInserter>)>>,
    ) -> Self {
        Self::with_common(common(batch_rows), shards).await
    }

    async fn with_common(
        common: Arc<Common>,
        shards: Vec<Vec<(String, Arc<ScriptedInserter>)>>,
    ) -> Self {
        let ins = shards[0][0].1.clone();
        let target: Arc<str> = Arc::from(TARGET);
        let servers = Arc::new(TargetServers::new(
            &target,
            shards,
            common.settings.pool_backoff.probe_handback_min,
        ));
        for r in &servers.replicas {
            common.registry.register(
                &observe::pool_id(TARGET, &r.name),
                NodeKind::Pool,
                &r.name,
                Some(&observe::target_id(TARGET)),
            );
        }
        let (tx, memories) = mpsc::unbounded_channel();
        let (recorder, _) = Actor::spawn(None, Recorder, tx).await.expect("recorder");
        let memory = TargetMemory::new(&servers, &common);
        let target = spawn_target(&common, &servers, memory, &recorder).await;
        let rig = Self {
            target,
            servers,
            ins,
            journal: Journal::new(),
            common,
            memories,
            recorder,
        };
        assert!(
            rig.until(Duration::from_secs(5), |r| r
                .pools()
                .iter()
                .all(|p| p["state"]["probed_ok"] == true))
                .await
        );
        rig
    }

    /// Rows for `table`, sent to the target as the consumer sends them.
    fn rows(&self, table: &str, n: usize) -> Vec<u64> {
        let subject: Arc<str> = Arc::from(format!("ingest.acme.{table}"));
        let rows: Vec<FakeDelivery> = (0..n)
            .map(|i| self.journal.delivery(&subject, format!("{{\"n\":{i}}}")))
            .collect();
        let seqs = rows.iter().map(|d| d.seq).collect();
        let routed = Routed::Messages {
            key: TableKey::new("acme", table),
            messages: rows,
        };
        self.target
            .cast(TargetMsg::Routed(routed))
            .expect("the target runs");
        seqs
    }

    fn tree(&self) -> Value {
        self.common.registry.tree_json()
    }

    fn target_node(&self) -> Value {
        self.tree()["children"]
            .as_array()
            .and_then(|c| c.iter().find(|n| n["kind"] == "target").cloned())
            .unwrap_or(Value::Null)
    }

    fn children(&self, kind: &str) -> Vec<Value> {
        self.target_node()["children"]
            .as_array()
            .map(|c| c.iter().filter(|n| n["kind"] == kind).cloned().collect())
            .unwrap_or_default()
    }

    fn pools(&self) -> Vec<Value> {
        self.children("pool")
    }

    fn pool_node(&self) -> Value {
        self.pools().first().cloned().unwrap_or(Value::Null)
    }

    fn breaker(&self) -> Value {
        self.pool_node()["state"]["breaker"].clone()
    }

    fn replica_breaker(&self, replica: &str) -> String {
        self.pools()
            .iter()
            .find(|p| p["name"] == replica)
            .and_then(|p| p["state"]["breaker"]["state"].as_str().map(str::to_owned))
            .unwrap_or_default()
    }

    fn table_node(&self, table: &str) -> Value {
        self.children("table")
            .into_iter()
            .find(|n| n["name"] == format!("acme.{table}"))
            .unwrap_or(Value::Null)
    }

    fn table_backoff(&self, table: &str) -> Value {
        self.table_node(table)["state"]["backoff"].clone()
    }

    async fn until(&self, within: Duration, cond: impl Fn(&Self) -> bool) -> bool {
        let deadline = tokio::time::Instant::now() + within;
        while tokio::time::Instant::now() < deadline {
            if cond(self) {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        cond(self)
    }

    fn naks(&self, seqs: &[u64]) -> Vec<Duration> {
        seqs.iter()
            .flat_map(|s| self.journal.terminal(*s))
            .filter_map(|e| match e {
                Event::Naked(d) => Some(d),
                _ => None,
            })
            .collect()
    }

    fn settled(&self, seqs: &[u64]) -> bool {
        seqs.iter().all(|s| !self.journal.terminal(*s).is_empty())
    }

    fn acked(&self, seqs: &[u64]) -> bool {
        seqs.iter()
            .all(|s| self.journal.terminal(*s) == vec![Event::Acked])
    }

    /// Open the pool's breaker: one batch of `table` meets a refused connection.
    async fn open_breaker(&self, table: &str) -> Duration {
        self.ins.set_default(Some(refused("connection refused")));
        let seqs = self.rows(table, 3);
        assert!(
            self.until(Duration::from_secs(5), |r| r.settled(&seqs))
                .await
        );
        assert_eq!(self.breaker()["state"], "open", "{}", self.tree());
        let naks = self.naks(&seqs);
        assert_eq!(naks.len(), 3);
        naks[0]
    }

    fn window_left(&self) -> Duration {
        Duration::from_millis(self.breaker()["window_remaining_ms"].as_u64().unwrap_or(0))
    }

    /// A successor's breaker kept the window `left` (less at most `taken` since), and
    /// acts on it: arrivals go back, no request.
    async fn the_window_is_kept(&self, left: Duration, taken: Duration) {
        let kept = self.window_left();
        assert!(kept <= left && kept + taken >= left, "{kept:?} of {left:?}");
        let before = self.ins.request_count();
        let arrivals = self.rows("events", 2);
        assert!(
            self.until(Duration::from_millis(100), |r| r.settled(&arrivals))
                .await
        );
        assert_eq!(self.ins.request_count(), before);
        assert_eq!(self.naks(&arrivals).len(), 2);
    }

    /// The last memory the target reported.
    fn last_memory(&mut self) -> TargetMemory {
        let mut memory = None;
        while let Ok(m) = self.memories.try_recv() {
            memory = Some(m);
        }
        memory.expect("the target reported its memory")
    }
}

// === the written contract ===

#[tokio::test(start_paused = true)]
async fn an_open_window_hands_arrivals_back_with_what_is_left_of_it_and_sends_nothing() {
    let r = TargetRig::new(3).await;
    let window = r.open_breaker("events").await;
    assert!(window > Duration::ZERO && window <= Duration::from_secs(1));
    tokio::time::advance(window / 4).await;
    let arrivals = r.rows("events", 2);
    assert!(
        r.until(Duration::from_millis(50), |r| r.settled(&arrivals))
            .await
    );
    let naks = r.naks(&arrivals);
    // Handed straight back with the rest of the window (give or take the polling step).
    for d in &naks {
        assert!(
            *d <= window - window / 4 && *d + Duration::from_millis(60) >= window - window / 4,
            "{d:?} against a window of {window:?}"
        );
    }
    assert_eq!(
        r.ins.request_count(),
        1,
        "no request while the window is open"
    );
    assert_eq!(r.table_backoff("events")["state"], "closed");
}

#[tokio::test(start_paused = true)]
async fn one_probe_when_several_tables_are_ready_the_instant_a_window_ends() {
    let r = TargetRig::new(3).await;
    let window = r.open_breaker("events").await;
    // The window ends; ClickHouse is back but slow, so the probe stays out a while.
    r.ins.set_default(None);
    r.ins.set_latency(Duration::from_secs(2));
    tokio::time::advance(window).await;
    let tables = ["events", "clicks", "views", "orders"];
    let batches: Vec<Vec<u64>> = tables.iter().map(|t| r.rows(t, 3)).collect();
    assert!(
        r.until(Duration::from_millis(500), |r| r.breaker()["state"]
            == "probing")
            .await
    );
    // Exactly one request went: the probe. The other tables' batches were handed back
    // with the probe hand-back delay, no request.
    assert!(
        r.until(Duration::from_millis(1500), |r| {
            batches.iter().filter(|b| r.settled(b)).count() == tables.len() - 1
        })
        .await
    );
    let handed_back: Vec<Duration> = batches.iter().flat_map(|b| r.naks(b)).collect();
    assert_eq!(handed_back.len(), 3 * (tables.len() - 1));
    assert!(handed_back.iter().all(|d| *d == Duration::from_millis(500)));
    // The probe answers: closed. In all, ClickHouse saw the failed flight and the probe.
    assert!(
        r.until(Duration::from_secs(3), |r| r.breaker()["state"] == "closed")
            .await
    );
    assert_eq!(r.ins.request_count(), 2, "the failed flight and one probe");
}

#[tokio::test(start_paused = true)]
async fn a_late_failure_neither_escalates_nor_reopens() {
    let r = TargetRig::new(3).await;
    // Two flights leave while closed; ClickHouse refuses both, the second much later.
    r.ins.set_default(Some(refused("connection refused")));
    r.ins.set_latency(Duration::from_millis(100));
    let first = r.rows("events", 3);
    tokio::time::advance(Duration::from_millis(10)).await;
    r.ins.set_latency(Duration::from_millis(400));
    let second = r.rows("clicks", 3);
    assert!(
        r.until(Duration::from_millis(150), |r| r.settled(&first))
            .await
    );
    let window = r.naks(&first)[0];
    let until = r.breaker()["window_until"].clone();
    assert!(
        r.until(Duration::from_secs(1), |r| r.settled(&second))
            .await
    );
    // The second answer belongs to a flight admitted before the window opened: late.
    // The window is the same one, and the late rows went back with its remainder.
    assert_eq!(r.breaker()["window_until"], until);
    assert!(r.naks(&second).iter().all(|d| *d < window));
    // After a late failure the window still escalates from its first step: the probe
    // that fails next opens the second step (≤ 2 s), not a third one (≤ 4 s).
    tokio::time::sleep(Duration::from_secs(2)).await;
    r.ins.set_latency(Duration::ZERO);
    let probe = r.rows("events", 3);
    assert!(r.until(Duration::from_secs(1), |r| r.settled(&probe)).await);
    let next = r.naks(&probe)[0];
    assert!(
        next > Duration::from_secs(1) / 2 && next <= Duration::from_secs(2),
        "{next:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_tables_backoff_is_its_own_and_a_neighbours_success_does_not_close_it() {
    let r = TargetRig::new(3).await;
    r.ins
        .rule(|req| (&*req.table.table == "ro").then(|| Err(unavailable(242).table_scoped())));
    let ro = r.rows("ro", 3);
    assert!(r.until(Duration::from_secs(1), |r| r.settled(&ro)).await);
    assert_eq!(r.table_backoff("ro")["state"], "open");
    assert_eq!(r.breaker()["state"], "closed", "the target answered");
    let fine = r.rows("events", 3);
    assert!(r.until(Duration::from_secs(1), |r| r.settled(&fine)).await);
    assert!(fine
        .iter()
        .all(|s| r.journal.terminal(*s) == vec![Event::Acked]));
    assert_eq!(r.table_backoff("ro")["state"], "open");
    // Its arrivals go back without a request.
    let before = r.ins.request_count();
    let more = r.rows("ro", 3);
    assert!(r.until(Duration::from_secs(1), |r| r.settled(&more)).await);
    assert_eq!(r.ins.request_count(), before);
    assert!(!r.naks(&more).is_empty());
}

#[tokio::test(start_paused = true)]
async fn two_tables_failed_together_get_different_jittered_windows() {
    let r = TargetRig::new(3).await;
    r.ins.rule(|_| Some(Err(unavailable(242).table_scoped())));
    let a = r.rows("events", 3);
    let b = r.rows("clicks", 3);
    assert!(
        r.until(Duration::from_secs(1), |r| r.settled(&a) && r.settled(&b))
            .await
    );
    let (wa, wb) = (r.naks(&a)[0], r.naks(&b)[0]);
    assert_ne!(
        wa, wb,
        "the same outage, two tables: their retries must not line up"
    );
    for w in [wa, wb] {
        assert!(
            w >= Duration::from_millis(500) && w <= Duration::from_secs(1),
            "{w:?}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn the_breaker_outlives_its_pool_through_its_target() {
    let r = TargetRig::new(3).await;
    r.open_breaker("events").await;
    let left = r.window_left();
    // The pool dies; its target respawns it from what it last reported.
    let asked = r
        .target
        .call(
            |tx| TargetMsg::Debug(TargetDebug::PanicPool(TARGET.into(), PoolDebug::Panic, tx)),
            None,
        )
        .await
        .expect("the target answers");
    assert!(matches!(asked, ractor::rpc::CallResult::Success(true)));
    assert!(
        r.until(Duration::from_secs(1), |r| r.pool_node()["restarts"] == 1
            && r.breaker()["state"] == "open")
            .await,
        "{}",
        r.tree()
    );
    r.the_window_is_kept(left, Duration::from_millis(250)).await;
}

#[tokio::test(start_paused = true)]
async fn the_breaker_and_a_tables_backoff_outlive_their_target_through_the_supervisor() {
    let mut r = TargetRig::new(3).await;
    r.ins
        .rule(|req| (&*req.table.table == "ro").then(|| Err(unavailable(242).table_scoped())));
    let ro = r.rows("ro", 3);
    assert!(r.until(Duration::from_secs(1), |r| r.settled(&ro)).await);
    r.ins.clear_rules();
    r.open_breaker("events").await;
    let left = r.window_left();
    // The target dies with its pool and tables; the root hands what it last reported
    // to the successor.
    r.target
        .cast(TargetMsg::Debug(TargetDebug::Panic))
        .expect("the target runs");
    assert!(
        r.until(Duration::from_secs(1), |r| r.target.get_status()
            == ractor::ActorStatus::Stopped)
            .await
    );
    let memory = r.last_memory();
    assert!(
        memory.tables[&TableKey::new("acme", "ro")]
            .carry_over
            .as_ref()
            .is_some_and(|c| c.still_running()),
        "the read-only table's backoff is remembered"
    );
    r.target = spawn_target(&r.common, &r.servers, memory, &r.recorder).await;
    assert!(
        r.until(Duration::from_millis(100), |r| r.breaker()["state"]
            == "open")
            .await
    );
    r.the_window_is_kept(left, Duration::from_millis(150)).await;
}

// === shards and replicas ===

/// A target of two shards of two replicas: a1, a2 | b1, b2.
async fn two_by_two(batch_rows: usize) -> TargetRig {
    TargetRig::with_servers(batch_rows, two_shards_of_two()).await
}

fn two_shards_of_two() -> Vec<Vec<(String, Arc<ScriptedInserter>)>> {
    [["a1", "a2"], ["b1", "b2"]]
        .iter()
        .map(|s| {
            s.iter()
                .map(|n| (n.to_string(), ScriptedInserter::new()))
                .collect()
        })
        .collect()
}

impl TargetRig {
    fn server(&self, name: &str) -> &Arc<ScriptedInserter> {
        &self
            .servers
            .replicas
            .iter()
            .find(|r| &*r.name == name)
            .expect("a server of the rig")
            .inserter
    }

    fn requests_by_server(&self) -> Vec<usize> {
        ["a1", "a2", "b1", "b2"]
            .iter()
            .map(|n| self.server(n).request_count())
            .collect()
    }
}

#[tokio::test(start_paused = true)]
async fn fresh_batches_take_the_shards_in_turn_and_a_replica_down_is_passed_over_for_its_twin() {
    let r = two_by_two(3).await;
    for _ in 0..4 {
        let seqs = r.rows("events", 3);
        assert!(r.until(Duration::from_secs(1), |r| r.acked(&seqs)).await);
    }
    assert_eq!(
        r.requests_by_server(),
        vec![1, 1, 1, 1],
        "shards in turn, replicas in turn"
    );
    // a1 goes down: the batch it had goes back, its breaker opens, and shard 1's
    // batches go to a2 while the window lasts.
    r.server("a1")
        .set_default(Some(refused("cannot connect: connection refused")));
    let lost = r.rows("events", 3);
    assert!(r.until(Duration::from_secs(1), |r| r.settled(&lost)).await);
    assert_eq!(r.naks(&lost).len(), 3);
    assert_eq!(r.replica_breaker("a1"), "open");
    assert_eq!(r.replica_breaker("a2"), "closed");
    for _ in 0..4 {
        let seqs = r.rows("events", 3);
        assert!(r.until(Duration::from_secs(1), |r| r.acked(&seqs)).await);
    }
    assert_eq!(r.requests_by_server(), vec![2, 3, 2, 2]);
    // The table shows where its last batches went.
    let last = r.table_node("events")["state"]["last_batches"].clone();
    let replicas: Vec<&str> = last
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["replica"].as_str().unwrap())
        .collect();
    assert_eq!(
        &replicas[replicas.len() - 4..],
        &["b1", "a2", "b2", "a2"],
        "{last}"
    );
    assert_eq!(r.table_node("events")["state"]["shards"], 2);
}

#[tokio::test(start_paused = true)]
async fn a_shard_with_every_replica_down_leaves_fresh_batches_to_the_other_shard() {
    let r = two_by_two(3).await;
    for name in ["a1", "a2"] {
        r.server(name)
            .set_default(Some(refused("cannot connect: connection refused")));
    }
    let mut handed_back = 0;
    let mut acked = 0;
    for _ in 0..8 {
        let seqs = r.rows("events", 3);
        assert!(r.until(Duration::from_secs(1), |r| r.settled(&seqs)).await);
        if r.acked(&seqs) {
            acked += 1;
        } else {
            handed_back += 1;
        }
    }
    assert_eq!(r.replica_breaker("a1"), "open");
    assert_eq!(r.replica_breaker("a2"), "open");
    // One batch found each of a1 and a2 down; every other went to shard 2.
    assert_eq!(handed_back, 2, "{}", r.tree());
    assert_eq!(acked, 6);
    assert_eq!(r.requests_by_server(), vec![1, 1, 3, 3]);
    // Arrivals are not handed back while a server of the target takes rows.
    assert!(r
        .pools()
        .iter()
        .any(|p| p["state"]["breaker"]["state"] == "closed"));
}

/// `acme.keyed` places its rows by `user` on [`two_by_two`]'s shards.
async fn two_by_two_keyed(batch_rows: usize) -> TargetRig {
    let common = common_with(batch_rows, |t| {
        t.with_override(
            "acme.keyed",
            TableOverrides {
                shard_key: Some("user".into()),
                ..Default::default()
            },
        )
    });
    TargetRig::with_common(common, two_shards_of_two()).await
}

/// A user whose rows go to each shard of two, by the table's key.
fn a_user_per_shard() -> [String; 2] {
    let key = ShardKey::new("user");
    let of = |u: &str| key.shard_of_row(format!(r#"{{"user":"{u}"}}"#).as_bytes(), 2);
    let mut users = (0..100).map(|i| format!("u{i}"));
    let first = users.find(|u| of(u) == 0).expect("a user of shard 1");
    let second = users.find(|u| of(u) == 1).expect("a user of shard 2");
    [first, second]
}

impl TargetRig {
    /// One message to `acme.keyed` with a row per user given.
    fn keyed_message(&self, users: &[&str]) -> u64 {
        let subject: Arc<str> = Arc::from("ingest.acme.keyed");
        let rows: Vec<String> = users
            .iter()
            .enumerate()
            .map(|(n, u)| format!(r#"{{"user":"{u}","n":{n}}}"#))
            .collect();
        let d = self.journal.delivery(&subject, rows.join("\n"));
        let seq = d.seq;
        self.target
            .cast(TargetMsg::Routed(Routed::Messages {
                key: TableKey::new("acme", "keyed"),
                messages: vec![d],
            }))
            .expect("the target runs");
        seq
    }
}

#[tokio::test(start_paused = true)]
async fn a_shard_key_sends_each_users_rows_to_its_shard_and_a_shard_down_holds_back_its_own_only() {
    let r = two_by_two_keyed(3).await;
    let [on_a, on_b] = a_user_per_shard();
    for name in ["a1", "a2"] {
        r.server(name)
            .set_default(Some(refused("cannot connect: connection refused")));
    }
    let mut b_messages = Vec::new();
    let mut a_messages = Vec::new();
    for _ in 0..4 {
        b_messages.push(r.keyed_message(&[&on_b, &on_b, &on_b]));
        a_messages.push(r.keyed_message(&[&on_a, &on_a, &on_a]));
        let sent = [b_messages.clone(), a_messages.clone()].concat();
        assert!(
            r.until(Duration::from_secs(1), |r| r.settled(&sent)).await,
            "{}",
            r.tree()
        );
    }
    // Shard 2's rows landed while shard 1 was down; shard 1's went back, every time.
    assert!(r.acked(&b_messages), "{}", r.tree());
    assert_eq!(r.naks(&a_messages).len(), 4, "{}", r.tree());
    for name in ["b1", "b2"] {
        for req in r.server(name).requests() {
            let body = String::from_utf8_lossy(&req.body);
            assert!(
                !body.contains(&on_a),
                "{name} was sent shard 1's rows: {body}"
            );
        }
    }
    assert_eq!(
        r.server("b1").request_count() + r.server("b2").request_count(),
        4
    );

    // A message holding both users' rows is split into a message per shard.
    let both = r.keyed_message(&[&on_a, &on_b, &on_a]);
    assert!(
        r.until(Duration::from_secs(1), |r| r.settled(&[both]))
            .await
    );
    let parts = match r.journal.terminal(both).as_slice() {
        [Event::Split(parts)] => parts.clone(),
        other => panic!("the message was not split: {other:?}"),
    };
    assert_eq!(r.table_node("keyed")["state"]["shard_key"], "user");
    let row = |u: &str, n: usize| format!("{{\"user\":\"{u}\",\"n\":{n}}}\n");
    assert_eq!(
        parts,
        vec![
            (0, bytes::Bytes::from(row(&on_a, 0) + &row(&on_a, 2))),
            (1, bytes::Bytes::from(row(&on_b, 1))),
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn a_replica_read_only_for_one_table_is_passed_over_for_that_table_only() {
    let r = two_by_two(3).await;
    r.server("a1")
        .rule(|req| (&*req.table.table == "ro").then(|| Err(unavailable(242).table_scoped())));
    for table in ["ro", "events"] {
        for _ in 0..4 {
            let seqs = r.rows(table, 3);
            assert!(r.until(Duration::from_secs(1), |r| r.settled(&seqs)).await);
        }
    }
    // `ro` met 242 on a1 once: its own backoff there opened, a1's breaker did not.
    assert_eq!(r.replica_breaker("a1"), "closed", "{}", r.tree());
    let ro = &r.table_node("ro")["state"];
    let on_a1 = ro["replica_backoffs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["replica"] == "a1")
        .unwrap()["backoff"]["state"]
        .clone();
    assert_eq!(on_a1, "open", "{ro}");
    assert_eq!(
        ro["backoff"]["state"], "closed",
        "the table still sends elsewhere"
    );
    // `events` still went to a1 on its turn; `ro`, after its 242, went to a2 instead.
    let a1: Vec<String> = r
        .server("a1")
        .requests()
        .iter()
        .map(|q| q.table.table.to_string())
        .collect();
    assert_eq!(a1, vec!["ro", "events"]);
    assert_eq!(r.server("a2").request_count(), 2);
}

#[tokio::test(start_paused = true)]
async fn the_admin_tree_names_every_replica_with_its_shard_and_breaker() {
    let r = two_by_two(3).await;
    r.server("b2")
        .set_default(Some(refused("cannot connect: connection refused")));
    for _ in 0..4 {
        let seqs = r.rows("events", 3);
        assert!(r.until(Duration::from_secs(1), |r| r.settled(&seqs)).await);
    }
    let pools: Vec<(String, u64, String)> = r
        .pools()
        .iter()
        .map(|p| {
            (
                p["name"].as_str().unwrap().to_owned(),
                p["state"]["shard"].as_u64().unwrap(),
                p["state"]["breaker"]["state"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let want = [
        ("a1", 1, "closed"),
        ("a2", 1, "closed"),
        ("b1", 2, "closed"),
        ("b2", 2, "open"),
    ]
    .map(|(n, s, b)| (n.to_owned(), s, b.to_owned()));
    assert_eq!(pools, want.to_vec());
    let target = &r.target_node()["state"];
    assert_eq!(
        target["shards"],
        serde_json::json!([["a1", "a2"], ["b1", "b2"]])
    );
}
