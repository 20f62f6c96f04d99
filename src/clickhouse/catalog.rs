//! Which tables a ClickHouse target has, so the ingest API takes rows only for real
//! tables: a client inventing table names would otherwise make an actor and metric
//! series for each.
//!
//! One catalog per target: the tables of its database (`system.tables`), read with the
//! target's ingest credentials through its insert client (no HTTP client of its own)
//! and cached. A table the cache lacks makes the catalog read the list again, at most
//! once per `min_refresh`; lookups meanwhile are answered from the cache. A table is
//! reported missing only when the latest read succeeded and did not list it. When
//! ClickHouse cannot be asked, a lookup says so ([`CatalogError`]) and the caller
//! decides: the ingest API then takes the rows, which wait in the queue like any row
//! during an outage.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::time::Instant;

use super::table_info::TableInfo;

/// The table list could not be read (ClickHouse down, denied, too slow), so nothing is
/// known of a table the cache lacks.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("cannot read the tables of ClickHouse target {target}: {message}")]
pub struct CatalogError {
    pub target: String,
    pub message: String,
}

/// Where a catalog reads a database's tables from: ClickHouse through a target's insert
/// client, or a fake in tests.
pub trait TableSource: Send + Sync + 'static {
    fn list_tables(
        &self,
        database: &str,
    ) -> impl Future<Output = Result<Vec<TableInfo>, String>> + Send;
}

/// The tables of one target's database, cached.
pub struct Catalog<S> {
    target: String,
    database: String,
    source: Arc<S>,
    /// Reads of the list at most this often: misses in between are answered from the
    /// cache, so a client sending made-up names cannot turn each into a query.
    min_refresh: Duration,
    /// The longest a read may take before the lookup gives up on it.
    timeout: Duration,
    state: Mutex<State>,
    /// One read at a time: misses arriving meanwhile wait for its answer.
    reading: tokio::sync::Mutex<()>,
}

#[derive(Default)]
struct State {
    tables: HashMap<String, TableInfo>,
    last_read: Option<Instant>,
    /// Why the last read failed; `None` after a success.
    failure: Option<String>,
    /// Whether a read ever succeeded.
    loaded: bool,
}

/// How often a catalog reads the list at most, by default.
pub const MIN_REFRESH: Duration = Duration::from_secs(1);

/// How long a lookup waits for the list: past it the table is not checked, and a
/// request is not held for a ClickHouse that hangs.
pub const READ_TIMEOUT: Duration = Duration::from_secs(2);

// === impl Catalog ===

impl<S: TableSource> Catalog<S> {
    pub fn new(target: &str, database: &str, source: Arc<S>, timeout: Duration) -> Self {
        Catalog {
            target: target.to_string(),
            database: database.to_string(),
            source,
            min_refresh: MIN_REFRESH,
            timeout,
            state: Mutex::new(State::default()),
            reading: tokio::sync::Mutex::new(()),
        }
    }

    pub fn target(&self) -> &str {
        &self.target
    }

    /// The table as ClickHouse last listed it. `Ok(None)`: the latest read of the list
    /// succeeded and the table was not in it. `Err`: the table is not cached and the
    /// list could not be read, so nothing is known.
    ///
    /// A name the cache lacks makes a new read of the list, unless one happened within
    /// `min_refresh` (or while this lookup waited for another's read): then the answer
    /// is that read's.
    pub async fn lookup(&self, table: &str) -> Result<Option<TableInfo>, CatalogError> {
        let asked = Instant::now();
        if let Some(info) = self.state().tables.get(table) {
            return Ok(Some(info.clone()));
        }
        let _one_read = self.reading.lock().await;
        if let Some(answer) = self.recent_answer(table, asked) {
            return answer;
        }
        let read = match tokio::time::timeout(self.timeout, self.source.list_tables(&self.database))
            .await
        {
            Ok(read) => read,
            Err(_) => Err(format!(
                "no answer within {}",
                humantime::format_duration(self.timeout)
            )),
        };
        self.remember(read);
        self.answer(&self.state(), table)
    }

    /// The answer of a read made recently enough to stand, if any.
    fn recent_answer(
        &self,
        table: &str,
        asked: Instant,
    ) -> Option<Result<Option<TableInfo>, CatalogError>> {
        let state = self.state();
        let at = state.last_read?;
        (at >= asked || at.elapsed() < self.min_refresh).then(|| self.answer(&state, table))
    }

    fn answer(&self, state: &State, table: &str) -> Result<Option<TableInfo>, CatalogError> {
        if let Some(info) = state.tables.get(table) {
            return Ok(Some(info.clone()));
        }
        match &state.failure {
            None if state.loaded => Ok(None),
            failure => Err(CatalogError {
                target: self.target.clone(),
                message: failure.clone().unwrap_or_default(),
            }),
        }
    }

    fn remember(&self, read: Result<Vec<TableInfo>, String>) {
        let mut state = self.state();
        state.last_read = Some(Instant::now());
        match read {
            Ok(tables) => {
                if state.failure.take().is_some() {
                    tracing::info!(target = %self.target, tables = tables.len(), "the table list of the ClickHouse target can be read again");
                }
                state.loaded = true;
                state.tables = tables.into_iter().map(|t| (t.name.clone(), t)).collect();
            }
            Err(why) => {
                if state.failure.is_none() {
                    tracing::warn!(target = %self.target, error = %why, "cannot read the table list of the ClickHouse target; rows for tables it does not know are taken unchecked until it can be read");
                } else {
                    tracing::debug!(target = %self.target, error = %why, "the table list still cannot be read");
                }
                state.failure = Some(why);
            }
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves a consistent map: take it as is.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// A database whose tables and availability the test sets; counts the reads.
    struct Fake {
        tables: Mutex<Result<Vec<&'static str>, String>>,
        reads: AtomicUsize,
        stall: Mutex<Option<Duration>>,
    }

    impl Fake {
        fn new() -> Self {
            Fake {
                tables: Mutex::new(Ok(Vec::new())),
                reads: AtomicUsize::new(0),
                stall: Mutex::new(None),
            }
        }

        fn set(&self, tables: Result<Vec<&'static str>, &str>) {
            *self.tables.lock().expect("lock") = tables.map_err(str::to_string);
        }

        fn reads(&self) -> usize {
            self.reads.load(Ordering::SeqCst)
        }
    }

    impl TableSource for Fake {
        async fn list_tables(&self, _database: &str) -> Result<Vec<TableInfo>, String> {
            self.reads.fetch_add(1, Ordering::SeqCst);
            let stall = *self.stall.lock().expect("lock");
            if let Some(d) = stall {
                tokio::time::sleep(d).await;
            }
            let tables = self.tables.lock().expect("lock").clone()?;
            Ok(tables
                .into_iter()
                .map(|name| TableInfo {
                    name: name.to_string(),
                    engine: "MergeTree".into(),
                    engine_full: "MergeTree ORDER BY id".into(),
                    ..TableInfo::default()
                })
                .collect())
        }
    }

    fn catalog(fake: &Arc<Fake>) -> Catalog<Fake> {
        Catalog::new("main", "default", fake.clone(), Duration::from_secs(2))
    }

    #[tokio::test(start_paused = true)]
    async fn misses_read_the_list_at_most_once_per_interval() {
        let fake = Arc::new(Fake::new());
        fake.set(Ok(vec!["events"]));
        let catalog = catalog(&fake);

        let info = catalog
            .lookup("events")
            .await
            .expect("read")
            .expect("there");
        assert_eq!((info.engine.as_str(), fake.reads()), ("MergeTree", 1));
        // A hit costs nothing.
        assert!(catalog.lookup("events").await.expect("hit").is_some());
        assert_eq!(fake.reads(), 1);
        // Misses within the interval are answered from the last read.
        for name in ["a", "b", "c", "d"] {
            assert_eq!(catalog.lookup(name).await, Ok(None));
        }
        assert_eq!(fake.reads(), 1);
        // A table created meanwhile is seen by the first miss after the interval.
        fake.set(Ok(vec!["events", "clicks"]));
        assert_eq!(catalog.lookup("clicks").await, Ok(None));
        tokio::time::advance(MIN_REFRESH).await;
        assert!(catalog.lookup("clicks").await.expect("read").is_some());
        assert_eq!(fake.reads(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn when_clickhouse_cannot_be_asked_nothing_is_known_but_the_cache_still_answers() {
        let fake = Arc::new(Fake::new());
        fake.set(Err("connection refused"));
        let catalog = catalog(&fake);
        let e = catalog.lookup("events").await.expect_err("unknown");
        assert!(e.to_string().contains("connection refused"), "{e}");
        // Within the interval: the same answer, no new read.
        assert!(catalog.lookup("other").await.is_err());
        assert_eq!(fake.reads(), 1);

        // Loaded once, then down: a cached table is still known, a missing one is not
        // declared missing on the strength of an old list.
        tokio::time::advance(MIN_REFRESH).await;
        fake.set(Ok(vec!["events"]));
        assert!(catalog.lookup("events").await.expect("read").is_some());
        fake.set(Err("connection refused"));
        tokio::time::advance(MIN_REFRESH).await;
        assert!(catalog.lookup("events").await.expect("cached").is_some());
        assert!(catalog.lookup("clicks").await.is_err());
        assert_eq!(fake.reads(), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_read_gives_up_after_the_timeout_and_concurrent_misses_share_one_read() {
        let fake = Arc::new(Fake::new());
        fake.set(Ok(vec!["events"]));
        *fake.stall.lock().expect("lock") = Some(Duration::from_secs(10));
        let catalog = catalog(&fake);
        let started = Instant::now();
        let (a, b, c) = tokio::join!(
            catalog.lookup("x"),
            catalog.lookup("y"),
            catalog.lookup("events")
        );
        assert!(a.is_err() && b.is_err() && c.is_err(), "{a:?} {b:?} {c:?}");
        assert!(a.expect_err("e").message.contains("no answer within 2s"));
        assert_eq!(fake.reads(), 1);
        assert!(started.elapsed() < Duration::from_secs(3));
    }
}
