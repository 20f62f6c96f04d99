//! Whether a shard's servers replicate one table. A batch's retry may go to another
//! replica of its shard, and ClickHouse drops it there as a duplicate only if that
//! server's table shares the first one's replication path (`zookeeper_path`): the
//! block ids live there. A swapped `shards` list or a `{shard}` macro typo puts
//! servers of different shards (or with their own paths) in one shard of Sluice's: a
//! retry moved to the "twin" goes in as a new block, while every server alone says
//! its table deduplicates. So each shard's servers are compared, table by table: a
//! table whose servers do not share one path (or that some of them lack) is not
//! exactly-once, and the reason names each server's path.
//!
//! A server that does not answer is left out of the comparison (it takes no batch
//! while it does not answer) and asked again at the next refresh.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::endpoint::{read_error, transport_error, Endpoint};
use super::features::FEATURES_TTL;
use crate::config::TargetConfig;

/// One server's Replicated tables of a database: table → `zookeeper_path`.
pub type ReplicationPaths = BTreeMap<String, String>;

/// The servers of one shard, to compare their tables' replication paths.
pub struct ShardReplicas {
    /// 1-based, as the reasons name it.
    shard: usize,
    servers: Vec<(String, Endpoint)>,
    database: String,
    within: Duration,
    /// Per table, what the last comparison found (`Some`: why they differ) and when.
    known: Mutex<HashMap<String, (Option<String>, Instant)>>,
}

// === impl ShardReplicas ===

impl ShardReplicas {
    /// Shard `shard` (0-based) of `target`: its servers `urls`, named `names`.
    pub fn new(
        target: &TargetConfig,
        shard: usize,
        urls: &[String],
        names: &[String],
    ) -> anyhow::Result<Self> {
        let servers = urls
            .iter()
            .zip(names)
            .map(|(url, name)| Ok((name.clone(), Endpoint::of_target(target, url, 1)?)))
            .collect::<anyhow::Result<Vec<_>>>()?;
        Ok(Self {
            shard: shard + 1,
            servers,
            database: target.database.clone(),
            within: target.insert_timeout,
            known: Mutex::new(HashMap::new()),
        })
    }

    /// Why the shard's servers do not replicate `table` as one, or `None` (they do, the
    /// shard has one server, or fewer than two of them answered). Asked at most every
    /// [`FEATURES_TTL`] per table.
    pub async fn not_one_table(&self, table: &str) -> Option<String> {
        if self.servers.len() < 2 {
            return None;
        }
        if let Some((why, at)) = self.lock().get(table) {
            if at.elapsed() < FEATURES_TTL {
                return why.clone();
            }
        }
        let answers = self.paths().await;
        let why = mismatch(self.shard, table, &answers);
        let before = self
            .lock()
            .insert(table.to_owned(), (why.clone(), Instant::now()));
        if let Some(why) = &why {
            if before.is_none_or(|(was, _)| was.as_ref() != Some(why)) {
                tracing::warn!(shard = self.shard, table, "{why}");
            }
        }
        why
    }

    /// Every server's Replicated tables (or why it did not answer).
    pub async fn paths(&self) -> Vec<(String, Result<ReplicationPaths, String>)> {
        let mut answers = Vec::new();
        for (name, endpoint) in &self.servers {
            answers.push((name.clone(), self.paths_of(endpoint).await));
        }
        answers
    }

    async fn paths_of(&self, endpoint: &Endpoint) -> Result<ReplicationPaths, String> {
        // The database is an identifier, checked by the configuration.
        let sql = format!(
            "SELECT table, zookeeper_path FROM system.replicas WHERE database = '{}' FORMAT TSV",
            self.database
        );
        let response = endpoint
            .post::<&str, &str>(&[], sql)
            .timeout(self.within)
            .send()
            .await
            .map_err(|e| transport_error(e).message)?;
        if !response.status().is_success() {
            return Err(read_error(response).await.message);
        }
        let text = response
            .text()
            .await
            .map_err(|e| transport_error(e).message)?;
        Ok(text
            .lines()
            .filter_map(|line| line.split_once('\t'))
            .map(|(table, path)| (table.to_owned(), path.to_owned()))
            .collect())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, (Option<String>, Instant)>> {
        self.known.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Why the servers of shard `shard` that answered do not replicate `table` as one
/// table: some have it with different paths, or some have it and others do not. `None`
/// when they agree (a table no server replicates agrees too: it is not Replicated).
pub fn mismatch(
    shard: usize,
    table: &str,
    answers: &[(String, Result<ReplicationPaths, String>)],
) -> Option<String> {
    let seen: Vec<(&str, Option<&str>)> = answers
        .iter()
        .filter_map(|(name, answer)| {
            let paths = answer.as_ref().ok()?;
            Some((name.as_str(), paths.get(table).map(String::as_str)))
        })
        .collect();
    let distinct: BTreeSet<Option<&str>> = seen.iter().map(|(_, path)| *path).collect();
    if seen.len() < 2 || distinct.len() < 2 {
        return None;
    }
    let each: Vec<String> = seen
        .iter()
        .map(|(name, path)| match path {
            Some(path) => format!("{name} at {path}"),
            None => format!("{name} has no Replicated table {table}"),
        })
        .collect();
    Some(format!(
        "the servers of shard {shard} do not replicate one table ({}): a retry moved to \
         another replica of the shard would go in as a new block there, so Sluice inserts \
         this table at least once. Check the `shards` list (each entry lists the replicas \
         of one shard) and each server's {{shard}} macro",
        each.join("; ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server(name: &str, tables: &[(&str, &str)]) -> (String, Result<ReplicationPaths, String>) {
        let paths = tables
            .iter()
            .map(|(t, p)| ((*t).to_owned(), (*p).to_owned()))
            .collect();
        (name.to_owned(), Ok(paths))
    }

    #[test]
    fn servers_of_two_shards_in_one_are_named_with_their_paths() {
        let answers = [
            server(
                "a1:8123",
                &[("events", "/clickhouse/tables/01/default/events")],
            ),
            server(
                "b2:8123",
                &[("events", "/clickhouse/tables/02/default/events")],
            ),
        ];
        let why = mismatch(1, "events", &answers).unwrap_or_default();
        assert!(
            why.starts_with(
                "the servers of shard 1 do not replicate one table (a1:8123 at \
                 /clickhouse/tables/01/default/events; b2:8123 at \
                 /clickhouse/tables/02/default/events)"
            ) && why.contains("Sluice inserts this table at least once"),
            "{why}"
        );
    }

    #[test]
    fn a_server_without_the_table_differs_and_agreeing_or_silent_servers_do_not() {
        let path = "/clickhouse/tables/01/default/events";
        let missing = [
            server("a1", &[("events", path)]),
            server("a2", &[("clicks", path)]),
        ];
        let why = mismatch(2, "events", &missing).unwrap_or_default();
        assert!(why.contains("a2 has no Replicated table events"), "{why}");

        let agree = [
            server("a1", &[("events", path)]),
            server("a2", &[("events", path)]),
            ("a3".to_owned(), Err("refused".to_owned())),
        ];
        assert_eq!(mismatch(1, "events", &agree), None);
        assert_eq!(
            mismatch(1, "plain", &agree),
            None,
            "not Replicated anywhere"
        );
        let one_answered = [
            server("a1", &[("events", path)]),
            ("a2".to_owned(), Err("refused".to_owned())),
        ];
        assert_eq!(mismatch(1, "events", &one_answered), None);
    }
}
