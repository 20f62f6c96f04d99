//! Every metric the actors emit (docs/architecture.md, "Contracts") is registered with the documented labels.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit};
use sluice_actors::metrics as m;
use sluice_actors::testkit::refused;
use sluice_actors::TableKey;

#[derive(Default, Clone)]
struct Keys(
    Arc<Mutex<BTreeMap<String, BTreeSet<Vec<String>>>>>,
    Arc<Mutex<BTreeSet<String>>>,
);

impl Keys {
    fn add(&self, key: &Key) {
        let mut labels: Vec<String> = key.labels().map(|l| l.key().to_owned()).collect();
        labels.sort();
        self.0
            .lock()
            .unwrap()
            .entry(key.name().to_owned())
            .or_default()
            .insert(labels);
    }
}

impl Recorder for Keys {
    fn describe_counter(&self, k: KeyName, _: Option<Unit>, _: SharedString) {
        self.1.lock().unwrap().insert(k.as_str().to_owned());
    }
    fn describe_gauge(&self, k: KeyName, _: Option<Unit>, _: SharedString) {
        self.1.lock().unwrap().insert(k.as_str().to_owned());
    }
    fn describe_histogram(&self, k: KeyName, _: Option<Unit>, _: SharedString) {
        self.1.lock().unwrap().insert(k.as_str().to_owned());
    }
    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        self.add(key);
        Counter::noop()
    }
    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        self.add(key);
        Gauge::noop()
    }
    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        self.add(key);
        Histogram::noop()
    }
}

#[tokio::test(start_paused = true)]
async fn every_ingest_metric_is_registered_with_its_labels() {
    let keys = Keys::default();
    metrics::set_global_recorder(keys.clone()).unwrap();
    m::describe(m::ACTOR_METRICS);
    let r = simple(4).await;
    r.main().reject_containing("bad");
    r.push("ingest.acme.events", 4, &[2]);
    r.push("ingest.ghost.events", 1, &[]);
    r.settled(5).await;
    r.handle
        .inject_panic(&TableKey::new("acme", "events"))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    r.main().set_default(Some(refused("refused")));
    r.push("ingest.acme.events", 4, &[]);
    r.settled(9).await;
    r.handle.shutdown().await;

    let got = keys.0.lock().unwrap().clone();
    let want: &[(&str, &[&str])] = &[
        (m::ROWS_RECEIVED, &["table", "tenant"]),
        (m::ROWS_INSERTED, &["table", "tenant"]),
        (m::ROWS_PARKED, &["reason", "table", "tenant"]),
        (m::RETRIES, &["reason", "table"]),
        (m::INSERT_REQUESTS, &["outcome", "replica", "target"]),
        (m::INSERT_DURATION, &["replica", "target"]),
        (m::BATCH_ROWS, &["table"]),
        (m::BREAKER_STATE, &["replica", "target"]),
        (m::TABLE_BACKOFF, &["table", "tenant"]),
        (m::BUFFERED_ROWS, &["table", "tenant"]),
        (m::CONSUMER_PENDING, &["stream"]),
        (m::ACTOR_RESTARTS, &["kind"]),
        (m::DLQ_PUBLISH_FAILURES, &["table", "tenant"]),
    ];
    for (name, labels) in want {
        let sets = got
            .get(*name)
            .unwrap_or_else(|| panic!("{name} never registered: {got:?}"));
        let labels: Vec<String> = labels.iter().map(|s| s.to_string()).collect();
        assert_eq!(sets, &BTreeSet::from([labels]), "{name}");
    }
    let described = keys.1.lock().unwrap().clone();
    for name in m::ACTOR_METRICS.iter().map(|d| d.name) {
        assert!(described.contains(name), "{name} not described");
    }
}
