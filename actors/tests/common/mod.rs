//! A pipeline on fakes, with time paused.
#![allow(dead_code)]

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use sluice_actors::testkit::{
    FakeDelivery, FakeManifestStore, FakeQueue, FakeSourceFactory, Journal, ScriptedInserter,
};
use sluice_actors::*;

pub struct Rig {
    pub handle: PipelineHandle<FakeDelivery>,
    pub queue: Arc<FakeQueue>,
    pub journal: Arc<Journal>,
    pub ins: HashMap<String, Arc<ScriptedInserter>>,
    /// The manifest store, when the rig was made with one (exactly-once).
    pub store: Option<Arc<FakeManifestStore>>,
}

pub fn settings() -> PipelineSettings {
    PipelineSettings {
        jitter_seed: Some(7),
        // The pool's own idle probe would close windows behind the tests' backs.
        idle_probe_after: Duration::from_secs(3600),
        ..Default::default()
    }
}

pub fn tables(batch_rows: usize) -> TableSettingsResolver {
    TableSettingsResolver::new(TableSettings {
        batch_rows,
        batch_age: Duration::from_secs(3600),
        ..Default::default()
    })
}

pub async fn rig(
    targets: &[&str],
    tenants: &[(&str, &str)],
    tables: TableSettingsResolver,
    settings: PipelineSettings,
) -> Rig {
    rig_with_store(targets, tenants, tables, settings, false).await
}

/// A rig whose pipeline records batch manifests in a [`FakeManifestStore`] (it
/// deduplicates where its inserter says so: `ScriptedInserter::set_dedup`).
pub async fn rig_with_store(
    targets: &[&str],
    tenants: &[(&str, &str)],
    tables: TableSettingsResolver,
    settings: PipelineSettings,
    with_store: bool,
) -> Rig {
    let mut ins = HashMap::new();
    let targets = targets
        .iter()
        .map(|t| {
            let i = ScriptedInserter::new();
            ins.insert(t.to_string(), i.clone());
            Target::new(t, i)
        })
        .collect();
    rig_of(targets, ins, tenants, tables, settings, with_store).await
}

/// Target `main` on these shards of servers (a scripted inserter each, `ins` keyed by
/// server name), tenant `acme` on it.
pub async fn cluster(shards: &[&[&str]], batch_rows: usize, with_store: bool) -> Rig {
    let mut ins = HashMap::new();
    let shards = shards
        .iter()
        .map(|replicas| {
            replicas
                .iter()
                .map(|name| {
                    let i = ScriptedInserter::new();
                    ins.insert(name.to_string(), i.clone());
                    (name.to_string(), i)
                })
                .collect()
        })
        .collect();
    let targets = vec![Target::sharded("main", shards)];
    let tenants = &[("acme", "main")];
    rig_of(
        targets,
        ins,
        tenants,
        tables(batch_rows),
        settings(),
        with_store,
    )
    .await
}

async fn rig_of(
    targets: Vec<Target<ScriptedInserter>>,
    ins: HashMap<String, Arc<ScriptedInserter>>,
    tenants: &[(&str, &str)],
    tables: TableSettingsResolver,
    settings: PipelineSettings,
    with_store: bool,
) -> Rig {
    let journal = Journal::new();
    let store = with_store.then(|| FakeManifestStore::new(&journal));
    let queue = FakeQueue::new();
    let handle = start(PipelineConfig {
        source: FakeSourceFactory {
            queue: queue.clone(),
        },
        targets,
        tenants: tenants
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect(),
        tables,
        settings,
        manifests: store
            .clone()
            .map(|s| s as Arc<dyn sluice_actors::ManifestStore>),
    })
    .await
    .expect("pipeline starts");
    let rig = Rig {
        handle,
        queue,
        journal,
        ins,
        store,
    };
    assert!(
        rig.until(Duration::from_secs(30), |r| r.handle.readiness().is_ok())
            .await,
        "{:?}",
        rig.handle.readiness()
    );
    rig
}

/// One target `main`, tenant `acme` on it.
pub async fn simple(batch_rows: usize) -> Rig {
    rig(
        &["main"],
        &[("acme", "main")],
        tables(batch_rows),
        settings(),
    )
    .await
}

impl Rig {
    pub fn main(&self) -> &Arc<ScriptedInserter> {
        &self.ins["main"]
    }

    /// The inserter of server (or one-server target) `name`.
    pub fn server(&self, name: &str) -> &Arc<ScriptedInserter> {
        &self.ins[name]
    }

    /// Publish `n` rows `{"n":i}` (or `{"bad":i}` for indexes in `bad`) on `subject`.
    pub fn push(&self, subject: &str, n: usize, bad: &[usize]) -> Vec<u64> {
        let s: Arc<str> = Arc::from(subject);
        let rows: Vec<FakeDelivery> = (0..n)
            .map(|i| {
                let p = if bad.contains(&i) {
                    format!("{{\"bad\":{i}}}")
                } else {
                    format!("{{\"n\":{i}}}")
                };
                self.journal.delivery(&s, p)
            })
            .collect();
        let seqs = rows.iter().map(|d| d.seq).collect();
        self.queue.push(rows);
        seqs
    }

    /// Publish one-row messages `{"n":i}` on `subject`, each a part of a split message
    /// that its split's record judges as given (`None`: no part): their sequences.
    pub fn push_parts(
        &self,
        subject: &str,
        judged: Vec<Option<Result<PartCopy, SettleError>>>,
    ) -> Vec<u64> {
        let s: Arc<str> = Arc::from(subject);
        let rows: Vec<FakeDelivery> = judged
            .into_iter()
            .enumerate()
            .map(|(i, judged)| {
                let d = self.journal.delivery(&s, format!("{{\"n\":{i}}}"));
                match judged {
                    Some(judged) => d.as_part(judged),
                    None => d,
                }
            })
            .collect();
        let seqs = rows.iter().map(|d| d.seq).collect();
        self.queue.push(rows);
        seqs
    }

    /// Poll `cond` until it holds or `within` (paused time) passed.
    pub async fn until(&self, within: Duration, cond: impl Fn(&Rig) -> bool) -> bool {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if cond(self) {
                return true;
            }
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Wait until `n` rows have been settled (any way).
    pub async fn settled(&self, n: u64) {
        let ok = self
            .until(Duration::from_secs(60), |r| r.journal.settled() >= n)
            .await;
        assert!(
            ok,
            "only {} of {n} rows settled; events {:?}",
            self.journal.settled(),
            self.journal.events()
        );
    }

    pub fn node(&self, kind: &str, name: &str) -> Option<Value> {
        fn find(v: &Value, kind: &str, name: &str) -> Option<Value> {
            if v["kind"] == kind && v["name"] == name {
                return Some(v.clone());
            }
            v["children"]
                .as_array()?
                .iter()
                .find_map(|c| find(c, kind, name))
        }
        find(&self.handle.tree_json(), kind, name)
    }

    pub fn pool_state(&self, target: &str) -> String {
        self.node("pool", target)
            .map(|n| {
                n["state"]["breaker"]["state"]
                    .as_str()
                    .unwrap_or("")
                    .to_owned()
            })
            .unwrap_or_default()
    }

    pub fn table(&self, key: &str) -> Option<Value> {
        self.node("table", key)
    }

    pub fn table_backoff(&self, key: &str) -> String {
        self.table(key)
            .map(|n| {
                n["state"]["backoff"]["state"]
                    .as_str()
                    .unwrap_or("")
                    .to_owned()
            })
            .unwrap_or_default()
    }
}
