//! What one seed makes of the world: how many instances, the stream's `ack_wait`, the
//! targets' shards and replicas, the tables and their windows, how often things go
//! wrong, and the actors' settings.

use std::collections::BTreeMap;
use std::time::Duration;

use sluice_actors::{DedupWindow, PipelineSettings, TableSettings, TableSettingsResolver};

use crate::clickhouse::{TableKind, Weather};
use crate::dice::Dice;

/// A table of the workload: its name (`tenant.table`) and whether target `main` has it.
pub const TABLES: [(&str, &str); 3] = [
    ("acme.events", "main"),
    ("acme.clicks", "main"),
    ("beta.logs", "solo"),
];

pub struct Plan {
    pub instances: usize,
    /// The queue's partitions (streams, each with its consumer): 1 to 3.
    pub partitions: usize,
    pub ack_wait: Duration,
    /// Target `main`'s shards, each of `replicas` servers; target `solo` is one more
    /// shard of one server.
    pub shards: usize,
    pub replicas: usize,
    pub kinds: BTreeMap<String, TableKind>,
    pub weather: Weather,
    pub kv_answer_lost: f64,
    pub ack_answer_lost: f64,
    /// How long faults are injected and rows published.
    pub active: Duration,
    pub batch_rows: usize,
    pub batch_age: Duration,
    /// The watches' usual lag.
    pub watch_lag_ms: u64,
}

impl Plan {
    pub fn draw(dice: &Dice) -> Self {
        let window = |blocks: (u64, u64), seconds: (u64, u64)| DedupWindow {
            blocks: dice.range(blocks.0..blocks.1),
            seconds: Some(Duration::from_secs(dice.range(seconds.0..seconds.1))),
        };
        let mut kinds = BTreeMap::new();
        kinds.insert(
            "acme.events".to_owned(),
            TableKind {
                exactly_once: true,
                window: Some(window((30, 300), (60, 600))),
            },
        );
        // A window small enough for a redelivery to come after it.
        kinds.insert(
            "acme.clicks".to_owned(),
            TableKind {
                exactly_once: true,
                window: Some(window((2, 10), (5, 40))),
            },
        );
        kinds.insert(
            "beta.logs".to_owned(),
            TableKind {
                exactly_once: false,
                window: None,
            },
        );
        let replicas = 1 + dice.below(2) as usize;
        Self {
            partitions: 1 + dice.below(3) as usize,
            instances: 2 + dice.below(2) as usize,
            ack_wait: Duration::from_secs(*dice.pick(&[4, 8, 15])),
            shards: 1 + dice.below(2) as usize,
            replicas,
            kinds,
            weather: Weather {
                answer_lost: dice.range(0..12) as f64 / 100.0,
                retry_busy: dice.range(10..70) as f64 / 100.0,
                busy_under_pressure: dice.range(30..90) as f64 / 100.0,
            },
            kv_answer_lost: dice.range(0..6) as f64 / 100.0,
            ack_answer_lost: dice.range(0..6) as f64 / 100.0,
            active: Duration::from_secs(dice.range(30..80)),
            batch_rows: dice.range(2..10) as usize,
            batch_age: dice.ms(100, 1000),
            watch_lag_ms: dice.range(0..150),
        }
    }

    pub fn tables(&self) -> TableSettingsResolver {
        TableSettingsResolver::new(TableSettings {
            batch_rows: self.batch_rows,
            batch_age: self.batch_age,
            ..TableSettings::default()
        })
    }

    /// The actors' settings for one life of an instance (`jitter_seed` its own).
    pub fn settings(&self, jitter_seed: u64) -> PipelineSettings {
        let backoff = sluice_actors::BackoffPolicy {
            initial: Duration::from_millis(500),
            max: Duration::from_secs(5),
            probe_handback_min: Duration::from_millis(200),
        };
        PipelineSettings {
            ack_wait: self.ack_wait,
            pull_batch: 50,
            pool_backoff: backoff,
            table_backoff: backoff,
            // Rows that crash ClickHouse are not simulated: no connection is lost.
            poison_strikes: 1_000,
            jitter_seed: Some(jitter_seed),
            ..PipelineSettings::default()
        }
    }
}
