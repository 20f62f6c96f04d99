//! `[log] format = "json"`: every line the process writes is one JSON object, and every
//! line about a table names its tenant and table in fields of their own, so a log
//! pipeline can filter by them.

use std::time::Duration;

use anyhow::{bail, Result};
use serde_json::{json, Value};
use sluice_harness::{wait_for, Stack, StackOptions, TENANT};

use crate::*;

/// Distinctive names, so "a line about the table" is a line that mentions them.
const TABLE: &str = "jsonlog_events";
const ORPHAN: &str = "jsonlog_orphan";
const ORPHAN_TABLE: &str = "jsonlog_lost";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_logs_are_json_and_table_lines_name_tenant_and_table() -> Result<()> {
    let mut stack = Stack::start(StackOptions::default()).await?;
    stack
        .clickhouse
        .exec(&format!(
            "CREATE TABLE {TABLE} (id UInt64, name String) ENGINE = MergeTree ORDER BY id"
        ))
        .await?;
    stack.set("log.format", "json");
    stack.set("log.level", "info");
    stack.set("pipeline.backoff_initial", "300ms");
    stack.set("pipeline.backoff_max", "1s");
    // A tenant without a ClickHouse target: its rows are parked whole.
    stack.set(
        &format!("tenants.{ORPHAN}"),
        toml::Value::Table(toml::Table::new()),
    );
    stack.start_sluice(SLUICE).await?;

    // Rows that land; a table actor that panics and is respawned.
    ingest_ok(&stack, TABLE, &[json!({"id": 1, "name": "a"})]).await?;
    wait_count(&stack, &format!("SELECT count() FROM {TABLE}"), 1).await?;
    panic_table_and_wait_respawn(&stack, TENANT, TABLE).await?;

    // The orphan tenant's rows are parked whole.
    let response = stack
        .http()
        .post(format!("{}/v1/ingest/{ORPHAN_TABLE}", stack.api_url()))
        .header("X-Tenant", ORPHAN)
        .header("Content-Type", "application/json")
        .body(json!({"id": 1}).to_string())
        .send()
        .await?;
    assert_eq!(response.status().as_u16(), 202);
    wait_for("the orphan row is parked", DEADLINE, POLL, || async {
        match dlq_count(&stack, ORPHAN, ORPHAN_TABLE).await? {
            1 => Ok(()),
            n => bail!("{n} parked"),
        }
    })
    .await?;

    // An outage while the table has rows, and its end.
    stack.clickhouse.stop().await?;
    ingest_ok(&stack, TABLE, &[json!({"id": 2, "name": "b"})]).await?;
    wait_node(&stack, "pool", "main", "the breaker opens", |n| {
        n["state"]["breaker"]["state"] != "closed"
    })
    .await?;
    stack.clickhouse.start_again().await?;
    wait_count(&stack, &format!("SELECT count() FROM {TABLE}"), 2).await?;
    // A clean stop: the shutdown lines too.
    stack.sluice[0].stop(Duration::from_secs(20)).await?;

    let output = stack.sluice_output(0)?;
    let mut lines = 0;
    let mut about_tables = 0;
    let mut panics = 0;
    let mut problems = Vec::new();
    for line in output.lines() {
        // The harness's own markers between starts.
        if line.starts_with("=== start #") || line.trim().is_empty() {
            continue;
        }
        lines += 1;
        let event: Value = match serde_json::from_str(line) {
            Ok(v @ Value::Object(_)) => v,
            _ => {
                problems.push(format!("not a JSON object: {line}"));
                continue;
            }
        };
        if let Err(e) = serde_json::from_str::<NoDuplicateKeys>(line) {
            problems.push(format!("{e}: {line}"));
        }
        if event.get("panic").is_some() {
            panics += 1;
        }
        // A panic's message is free text from wherever it was raised; the structured
        // line of the supervisor that respawns the actor is the one about the table.
        let mut about = event.clone();
        if let Some(fields) = about.as_object_mut() {
            fields.remove("panic");
            fields.remove("backtrace");
        }
        let about = about.to_string();
        for field in ["timestamp", "level", "message"] {
            if !event[field].is_string() {
                problems.push(format!("no {field}: {line}"));
            }
        }
        for (tenant, table) in [(TENANT, TABLE), (ORPHAN, ORPHAN_TABLE)] {
            if about.contains(table) {
                about_tables += 1;
                if event["tenant"] != tenant || event["table"] != table {
                    problems.push(format!(
                        "about {tenant}.{table} without tenant/table fields: {line}"
                    ));
                }
            }
        }
        // A field is there or absent, never an empty placeholder.
        for field in ["tenant", "table"] {
            if event[field] == "" {
                problems.push(format!("empty {field} field: {line}"));
            }
        }
    }
    assert!(
        problems.is_empty(),
        "{}\n\nthe whole log:\n{output}",
        problems.join("\n")
    );
    assert!(lines >= 5, "too few log lines to judge:\n{output}");
    // The events above must have been logged: a respawn, a park, an outage and its end.
    for needle in ["respawn", "parked", "unavailable", "again"] {
        assert!(
            output.lines().any(|l| l.contains(needle)
                && (l.contains(TABLE) || l.contains(ORPHAN_TABLE) || l.contains("\"pool\""))),
            "no line about {needle:?}:\n{output}"
        );
    }
    assert!(
        about_tables >= 3,
        "too few lines about the tables:\n{output}"
    );
    assert_eq!(panics, 1, "the injected panic is one JSON event:\n{output}");
    Ok(())
}

/// A JSON object whose keys are all distinct: a field named like one of the
/// formatter's own (`target`, `level`...) would give a line two of the same key, and
/// most parsers silently keep only one of them.
struct NoDuplicateKeys;

impl<'de> serde::Deserialize<'de> for NoDuplicateKeys {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = NoDuplicateKeys;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<NoDuplicateKeys, A::Error> {
                let mut seen = std::collections::BTreeSet::new();
                while let Some(key) = map.next_key::<String>()? {
                    map.next_value::<serde::de::IgnoredAny>()?;
                    if !seen.insert(key.clone()) {
                        return Err(serde::de::Error::custom(format!(
                            "the key {key:?} appears twice"
                        )));
                    }
                }
                Ok(NoDuplicateKeys)
            }
        }
        d.deserialize_map(Visitor)
    }
}
