//! Making sure a fault will hit something before injecting the next step.
//!
//! ClickHouse faults first catch an insert: a scenario about a server that freezes or
//! dies mid-insert proves nothing when no insert was out at that moment, and an insert
//! seen "in flight" in a snapshot may have been answered just before the fault. So the
//! fault comes in two steps. ClickHouse is frozen (SIGSTOP, every thread stopped), and
//! then the scenario waits until the fault proxy has an INSERT the frozen server holds:
//! one passed to it after the freeze (that one cannot have been answered), or one
//! passed before and still unanswered a second after it. Sluice's flight for it stays
//! out until ClickHouse continues or dies, or the insert timeout passes. Only then does
//! the scenario go on (kill it, send SIGTERM to Sluice, keep it frozen).
//!
//! A stop or kill of Sluice first waits for rows it holds: JetStream's own count of
//! deliveries not yet acked, read fresh from the server.

use std::time::Duration;

use anyhow::{Context, Result};

use super::{Backlog, Scenario};
use crate::proxy::RequestRecord;

/// How long a frozen ClickHouse may wait to hold an INSERT. Sluice sends one as soon as
/// a flight slot is free; when every slot held an insert at the freeze, those are held.
const CATCH_DEADLINE: Duration = Duration::from_secs(40);

/// How long after the freeze a request sent before it and still unanswered counts as
/// held by the frozen server: an answer the server wrote just before it stopped is on
/// its way to the proxy for far less (loopback), and then marks the request answered.
const ANSWER_IN_TRANSIT: Duration = Duration::from_secs(1);

// === impl Scenario ===

impl Scenario {
    /// Freezes ClickHouse and returns once an INSERT has reached it through the proxy
    /// (see the module's doc); returns that INSERT as the proxy logged it. Needs the
    /// proxy ([`crate::StackOptions::with_proxy`]).
    pub async fn freeze_clickhouse_mid_insert(&mut self) -> Result<RequestRecord> {
        self.freeze_clickhouse_catching(
            "an INSERT to reach the frozen ClickHouse",
            forwarded_insert,
        )
        .await
    }

    /// Freezes ClickHouse and returns once a flight's first request has reached it: an
    /// INSERT, or the question a flight asks before its insert after an outage (which
    /// settings the server knows: Sluice asks it again once a server was down, so the
    /// first flight after a crash may hang on it rather than on its insert).
    pub async fn freeze_clickhouse_mid_flight(&mut self) -> Result<RequestRecord> {
        self.freeze_clickhouse_catching("a flight's request to reach the frozen ClickHouse", |r| {
            forwarded_insert(r) || forwarded_settings_lookup(r)
        })
        .await
    }

    /// Kills ClickHouse with -9 while a flight's request is out (see
    /// [`Scenario::freeze_clickhouse_mid_flight`]).
    pub async fn kill_clickhouse_mid_flight(&mut self) -> Result<RequestRecord> {
        let caught = self.freeze_clickhouse_mid_flight().await?;
        self.stack.clickhouse.kill9().await?;
        Ok(caught)
    }

    async fn freeze_clickhouse_catching(
        &mut self,
        what: &str,
        caught: impl Fn(&RequestRecord) -> bool,
    ) -> Result<RequestRecord> {
        anyhow::ensure!(
            self.stack.proxy.is_some(),
            "catching an insert needs the fault proxy (StackOptions::with_proxy)"
        );
        self.stack.clickhouse.sigstop().await?;
        let frozen_at = tokio::time::Instant::now();
        let proxy = self.stack.proxy.as_ref().context("no proxy")?;
        // Every request numbered from here on came after every thread had stopped.
        let first = proxy.requests_seen();
        // Or one sent before and still unanswered: when every flight slot held such an
        // insert at the freeze, they time out, the server is judged down and only the
        // pool's probes (no insert) go to it until it answers again.
        let held = |record: &RequestRecord| {
            record.seq >= first || (!record.answered && frozen_at.elapsed() >= ANSWER_IN_TRANSIT)
        };
        proxy
            .wait_for_request(0, what, CATCH_DEADLINE, |record| {
                held(record) && caught(record)
            })
            .await
            .with_context(|| self.logs())
    }

    /// Kills ClickHouse with -9 while an insert is out: freezes it and catches an
    /// insert first ([`Scenario::freeze_clickhouse_mid_insert`]).
    pub async fn kill_clickhouse_mid_insert(&mut self) -> Result<RequestRecord> {
        let caught = self.freeze_clickhouse_mid_insert().await?;
        self.stack.clickhouse.kill9().await?;
        Ok(caught)
    }
}

// === impl Scenario (rows held) ===

impl Scenario {
    /// Waits until JetStream has delivered rows that are not yet acked (the consumer's
    /// `ack_pending`): a Sluice holds them, in its buffers or in flight.
    pub async fn wait_rows_held(&self, deadline: Duration) -> Result<Backlog> {
        self.wait_backlog("rows held by Sluice", deadline, |b| b.ack_pending > 0)
            .await
    }

    /// Waits until the ingest stream's backlog, read fresh from JetStream, satisfies
    /// `done`; returns it.
    pub async fn wait_backlog(
        &self,
        what: &str,
        deadline: Duration,
        done: impl Fn(&Backlog) -> bool,
    ) -> Result<Backlog> {
        let done = &done;
        crate::wait_for(what, deadline, Duration::from_millis(20), || async move {
            let backlog = self.jet.backlog().await?;
            anyhow::ensure!(done(&backlog), "not yet: {backlog:?}");
            Ok(backlog)
        })
        .await
        .with_context(|| self.logs())
    }
}

/// Sluice's questions of the server's version and the settings it knows (asked in that
/// order before a flight's insert after an outage), sent on to ClickHouse.
fn forwarded_settings_lookup(record: &RequestRecord) -> bool {
    let sql = record.sql_text();
    record.action.ends_with("pass")
        && (sql.contains("SELECT version()") || sql.contains("FROM system.settings"))
}

/// An INSERT the proxy sent on to ClickHouse (by the script or by a rule).
fn forwarded_insert(record: &RequestRecord) -> bool {
    record.action.ends_with("pass") && record.sql_text().contains("INSERT INTO")
}
