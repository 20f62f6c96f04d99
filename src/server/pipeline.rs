//! From the configuration to the running actor tree, and the admin endpoint's view of it.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use anyhow::Context as _;
use async_nats::jetstream;
use futures::future::BoxFuture;
use sluice_actors::{
    BackoffPolicy, Failpoint, PipelineConfig, PipelineHandle, PipelineSettings, TableKey,
    TableOverrides, TableSettings, TableSettingsResolver,
};

use crate::admin::PipelineView;
use crate::clickhouse::clients::TargetClients;
use crate::config::{self, Config, StreamSettings};
use crate::nats::{
    keep_collecting_splits, DlqWriter, JetStreamSourceFactory, JsDelivery, JsManifestStore,
    LandedChunks, ManifestSettings, Publisher, SplitRecords, SplitSettings,
};

/// Start the actor tree: a target per configured one with a pool per server
/// (inserting through `inserters`, by target name), the consumer on the durable
/// consumer.
pub async fn start(
    config: &Config,
    js: jetstream::Context,
    streams: StreamSettings,
    inserters: &BTreeMap<String, Arc<TargetClients>>,
    failpoint: Option<Failpoint>,
) -> anyhow::Result<PipelineHandle<JsDelivery>> {
    let settings = pipeline_settings(config, failpoint);
    // A keyed request's chunk is marked landed before its ack (`nats::LandedChunks`).
    let landed = LandedChunks::new(super::listeners::idempotency_keys(config, js.clone()));
    let mut dlq = DlqWriter::new(
        Publisher::new(js.clone(), &streams.dlq_stream, streams.dlq_max_bytes),
        streams.dlq_subject_prefix.clone(),
    )
    .with_landed(Arc::new(landed))
    .crashing_after_split_parts(settings.failpoint == Some(Failpoint::CrashAfterSplitParts));
    // Messages split by shard are recorded, their parts judged by the records; an
    // instance removes the records of the splits it finished (`nats::split`). Each
    // partition's stream has its records, and its parts are published into it.
    for partition in streams.each_partition() {
        let splits = Arc::new(SplitRecords::new(
            js.clone(),
            SplitSettings {
                stream: partition.stream.clone(),
                ..SplitSettings::from(&config.nats)
            },
        ));
        tokio::spawn(keep_collecting_splits(Arc::downgrade(&splits)));
        dlq = dlq
            .with_ingest(Publisher::new(
                js.clone(),
                &partition.stream,
                partition.max_bytes,
            ))
            .with_splits(splits);
    }
    // Only a replicated stream can keep a message acked here (`nats::AckedHere`).
    if streams.replicas > 1 {
        dlq = dlq.recording_acks();
    }
    let dlq = Arc::new(dlq);
    // Exactly-once: the store shares the deliveries' client (a confirmed ack covers
    // the acks sent before it on that connection only).
    let manifests = config.exactly_once.then(|| {
        Arc::new(JsManifestStore::start(
            js.clone(),
            ManifestSettings::from(&config.nats),
        ))
    });
    let source = JetStreamSourceFactory::new(js, streams, dlq, config.pipeline.pull_batch)
        .with_max_held_rows(config.pipeline.max_held_rows)
        .with_manifests(manifests.clone());
    let targets = inserters
        .values()
        .map(|clients| clients.pipeline_target())
        .collect();
    let tenants: HashMap<String, String> = config
        .tenants
        .values()
        .filter_map(|t| Some((t.name.clone(), t.target.clone()?)))
        .collect();
    sluice_actors::start(PipelineConfig {
        source,
        targets,
        tenants,
        tables: table_settings(config),
        settings,
        manifests: manifests.map(|m| m as Arc<dyn sluice_actors::ManifestStore>),
    })
    .await
    .context("starting the actor tree")
}

pub fn pipeline_settings(config: &Config, failpoint: Option<Failpoint>) -> PipelineSettings {
    let backoff = BackoffPolicy {
        initial: config.pipeline.backoff_initial,
        max: config.pipeline.backoff_max,
        ..BackoffPolicy::default()
    };
    PipelineSettings {
        subject_prefix: config.nats.streams.subject_prefix.clone(),
        stream: config.nats.streams.stream.clone(),
        pull_batch: config.pipeline.pull_batch,
        max_inflight_flushes: config.pipeline.max_inflight_flushes,
        idle_table_after: config.pipeline.idle_table_after,
        shutdown_deadline: config.pipeline.shutdown_deadline,
        ack_wait: config.nats.streams.ack_wait,
        pool_backoff: backoff,
        table_backoff: backoff,
        failpoint,
        ..PipelineSettings::default()
    }
}

/// The environment variable that sets a failpoint: a crash on purpose, for the tests of
/// what a crash leaves behind. Never set it in production.
pub const FAILPOINT_ENV: &str = "SLUICE_TEST_FAILPOINT";

pub fn failpoint_from_env() -> Option<Failpoint> {
    let value = std::env::var(FAILPOINT_ENV).ok()?;
    match value.parse() {
        Ok(failpoint) => {
            tracing::warn!(failpoint = %value, "{FAILPOINT_ENV} is set: this process crashes on purpose");
            Some(failpoint)
        }
        Err(e) => {
            tracing::warn!(error = %e, "{FAILPOINT_ENV} ignored");
            None
        }
    }
}

pub fn table_settings(config: &Config) -> TableSettingsResolver {
    let convert = |s: &config::TableSettings| TableSettings {
        batch_rows: s.batch_rows,
        batch_bytes: s.batch_bytes,
        batch_age: s.batch_age,
        dlq: s.dlq,
        skip_unknown_fields: s.skip_unknown_fields,
        missing_table_grace: s.missing_table_grace,
        shard_key: s.shard_key.as_deref().map(sluice_actors::ShardKey::new),
    };
    let mut resolver = TableSettingsResolver::new(convert(&config.ingest));
    for ((tenant, table), s) in &config.tables {
        let s = convert(s);
        resolver = resolver.with_override(
            &format!("{tenant}.{table}"),
            TableOverrides {
                batch_rows: Some(s.batch_rows),
                batch_bytes: Some(s.batch_bytes),
                batch_age: Some(s.batch_age),
                dlq: Some(s.dlq),
                skip_unknown_fields: Some(s.skip_unknown_fields),
                missing_table_grace: Some(s.missing_table_grace),
                shard_key: s.shard_key.as_ref().map(|k| k.column().to_owned()),
            },
        );
    }
    resolver
}

/// The running pipeline as the admin endpoint sees it.
pub struct PipelineAdapter {
    handle: PipelineHandle<JsDelivery>,
}

impl PipelineAdapter {
    pub fn new(handle: PipelineHandle<JsDelivery>) -> Self {
        Self { handle }
    }

    pub fn handle(&self) -> &PipelineHandle<JsDelivery> {
        &self.handle
    }
}

impl PipelineView for PipelineAdapter {
    fn tree_json(&self) -> serde_json::Value {
        self.handle.tree_json()
    }

    fn readiness(&self) -> Result<(), Vec<String>> {
        self.handle.readiness()
    }

    fn inject_table_panic(&self, tenant: &str, table: &str) -> BoxFuture<'_, Result<(), String>> {
        let key = TableKey::new(tenant, table);
        Box::pin(async move { self.handle.inject_panic(&key).await })
    }

    fn inject_pool_panic(&self, target: &str) -> BoxFuture<'_, Result<(), String>> {
        let target = target.to_string();
        Box::pin(async move { self.handle.inject_pool_panic(&target).await })
    }
}
