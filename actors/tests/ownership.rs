//! The PoolActor and its TableActors driven by messages alone — no consumer, no root:
//! a PoolActor is spawned by hand with a recorder standing in for the root supervisor,
//! rows are sent to it as the consumer would, and what it decided is read where a user
//! would see it (the rows' fate on the fake queue, the requests ClickHouse got, the
//! snapshots of `/admin/actors`) and where its successor would (the memory it reports).
//!
//! Time is paused: every window and jitter below is exact.

use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef, DerivedActorRef};
use serde_json::Value;
use sluice_actors::context::Common;
use sluice_actors::metrics::TargetMetrics;
use sluice_actors::observe::{self, NodeKind, Registry, ROOT_ID};
use sluice_actors::pool::{PoolActor, PoolArgs, PoolDebug, PoolMemory, PoolMsg, PoolReport};
use sluice_actors::routing::Routed;
use sluice_actors::table::TableReport;
use sluice_actors::testkit::{
    transport, unavailable, Event, FakeDelivery, Journal, ScriptedInserter,
};
use sluice_actors::*;
use tokio::sync::mpsc;

// === a root that records ===

/// What the recorder stands in for: the root supervisor, as far as a pool speaks to it.
enum RootStandIn {
    Pool(PoolReport),
    Orphan(TableReport),
}

impl From<PoolReport> for RootStandIn {
    fn from(r: PoolReport) -> Self {
        RootStandIn::Pool(r)
    }
}

impl TryFrom<RootStandIn> for PoolReport {
    type Error = ();
    fn try_from(m: RootStandIn) -> Result<Self, ()> {
        match m {
            RootStandIn::Pool(r) => Ok(r),
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

/// Keeps the last memory a pool reported.
struct Recorder;

impl Actor for Recorder {
    type Msg = RootStandIn;
    type State = mpsc::UnboundedSender<PoolMemory>;
    type Arguments = mpsc::UnboundedSender<PoolMemory>;

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
        if let RootStandIn::Pool(PoolReport::Remember { memory, .. }) = msg {
            let _ = tx.send(*memory);
        }
        Ok(())
    }
}

// === the rig ===

const TARGET: &str = "main";

struct PoolRig {
    pool: ActorRef<PoolMsg<FakeDelivery>>,
    ins: Arc<ScriptedInserter>,
    journal: Arc<Journal>,
    common: Arc<Common>,
    memories: mpsc::UnboundedReceiver<PoolMemory>,
    recorder: ActorRef<RootStandIn>,
}

fn common(batch_rows: usize) -> Arc<Common> {
    let settings = PipelineSettings {
        jitter_seed: Some(11),
        // The pool's own probes would close windows behind the tests' backs.
        idle_probe_after: Duration::from_secs(3600),
        idle_probe_every: Duration::from_secs(3600),
        ..Default::default()
    };
    let tables = TableSettingsResolver::new(TableSettings {
        batch_rows,
        batch_age: Duration::from_secs(3600),
        ..Default::default()
    });
    let registry = Registry::new(settings.stale_after);
    registry.register(ROOT_ID, NodeKind::Root, "sluice", None);
    registry.register(
        &observe::pool_id(TARGET),
        NodeKind::Pool,
        TARGET,
        Some(ROOT_ID),
    );
    Common::new(settings, tables, registry, None)
}

async fn spawn_pool(
    common: &Arc<Common>,
    ins: &Arc<ScriptedInserter>,
    memory: PoolMemory,
    recorder: &ActorRef<RootStandIn>,
) -> ActorRef<PoolMsg<FakeDelivery>> {
    let root: DerivedActorRef<PoolReport> = recorder.get_derived();
    let orphans: DerivedActorRef<TableReport> = recorder.get_derived();
    let args = PoolArgs {
        index: 0,
        target: Arc::from(TARGET),
        inserter: ins.clone(),
        common: common.clone(),
        memory,
        root,
        orphans,
        fail_spawn: false,
    };
    let (pool, _) = Actor::spawn(
        None,
        PoolActor::<ScriptedInserter, FakeDelivery>::default(),
        args,
    )
    .await
    .expect("the pool spawns");
    pool
}

impl PoolRig {
    async fn new(batch_rows: usize) -> Self {
        let common = common(batch_rows);
        let ins = ScriptedInserter::new();
        let (tx, memories) = mpsc::unbounded_channel();
        let (recorder, _) = Actor::spawn(None, Recorder, tx).await.expect("recorder");
        let target: Arc<str> = Arc::from(TARGET);
        let memory = PoolMemory::new(&target, &common, &TargetMetrics::new(TARGET));
        let pool = spawn_pool(&common, &ins, memory, &recorder).await;
        let rig = Self {
            pool,
            ins,
            journal: Journal::new(),
            common,
            memories,
            recorder,
        };
        assert!(
            rig.until(Duration::from_secs(5), |r| r.pool_node()["state"]
                ["probed_ok"]
                == true)
                .await
        );
        rig
    }

    /// Rows for `table`, sent to the pool as the consumer sends them.
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
        self.pool
            .cast(PoolMsg::Routed(routed))
            .expect("the pool runs");
        seqs
    }

    fn tree(&self) -> Value {
        self.common.registry.tree_json()
    }

    fn pool_node(&self) -> Value {
        self.tree()["children"]
            .as_array()
            .and_then(|c| c.iter().find(|n| n["kind"] == "pool").cloned())
            .unwrap_or(Value::Null)
    }

    fn breaker(&self) -> Value {
        self.pool_node()["state"]["breaker"].clone()
    }

    fn table_backoff(&self, table: &str) -> Value {
        self.pool_node()["children"]
            .as_array()
            .and_then(|c| {
                c.iter()
                    .find(|n| n["name"] == format!("acme.{table}"))
                    .map(|n| n["state"]["backoff"].clone())
            })
            .unwrap_or(Value::Null)
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

    /// Open the pool's breaker: one batch of `table` meets a refused connection.
    async fn open_breaker(&self, table: &str) -> Duration {
        self.ins.set_default(Some(transport("connection refused")));
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
}

// === the written contract ===

#[tokio::test(start_paused = true)]
async fn an_open_window_hands_arrivals_back_with_what_is_left_of_it_and_sends_nothing() {
    let r = PoolRig::new(3).await;
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
    let r = PoolRig::new(3).await;
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
    let r = PoolRig::new(3).await;
    // Two flights leave while closed; ClickHouse refuses both, the second much later.
    r.ins.set_default(Some(transport("connection refused")));
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
    let r = PoolRig::new(3).await;
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
    let r = PoolRig::new(3).await;
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
async fn the_breaker_outlives_its_pool_through_the_supervisor() {
    let mut r = PoolRig::new(3).await;
    r.open_breaker("events").await;
    let left = r.window_left();
    // The pool dies; the root hands what it last reported to the successor.
    r.pool
        .cast(PoolMsg::Debug(PoolDebug::Panic))
        .expect("the pool runs");
    assert!(
        r.until(Duration::from_secs(1), |r| r.pool.get_status()
            == ractor::ActorStatus::Stopped)
            .await
    );
    let mut memory = None;
    while let Ok(m) = r.memories.try_recv() {
        memory = Some(m);
    }
    let memory = memory.expect("the pool reported its memory");
    let successor = spawn_pool(&r.common, &r.ins, memory, &r.recorder).await;
    r.pool = successor;
    assert!(
        r.until(Duration::from_millis(100), |r| r.breaker()["state"]
            == "open")
            .await
    );
    let kept = r.window_left();
    assert!(
        kept <= left && kept + Duration::from_millis(150) >= left,
        "{kept:?} of {left:?}"
    );
    // And it acts on it: arrivals go back, no request.
    let before = r.ins.request_count();
    let arrivals = r.rows("events", 2);
    assert!(
        r.until(Duration::from_millis(100), |r| r.settled(&arrivals))
            .await
    );
    assert_eq!(r.ins.request_count(), before);
    assert_eq!(r.naks(&arrivals).len(), 2);
}
