//! `KILL QUERY` and the confirmation that a query is gone.
//!
//! Why: ClickHouse does not stop a query when its HTTP client goes away (18.16 has no
//! `cancel_http_readonly_queries_on_client_close`; verified: a heavy scan keeps running
//! after the client disconnects). A gateway that answers 504 and forgets the query
//! leaves it burning threads, and a client retry then doubles the work: the exact
//! avalanche seed 001 describes. So when the deadline passes, Sluice kills the query by
//! its id, and before retrying a query whose previous attempt might still run, it
//! confirms through `system.processes` that it no longer does.
//!
//! The killer has its own HTTP client (its own connections: a saturated query pool
//! must not hold the kill back) and its own short timeout (`[query] kill_timeout`),
//! bounding the whole kill-and-confirm step.

use std::time::Duration;

use tokio::time::Instant;

use super::id::QueryId;
use super::metrics;
use crate::clickhouse::endpoint::{self, Endpoint};

#[derive(Clone, Debug)]
pub struct Killer {
    endpoint: Endpoint,
    timeout: Duration,
}

/// What a kill-and-confirm step achieved.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KillOutcome {
    /// ClickHouse accepted the `KILL QUERY` statement.
    pub sent: bool,
    /// The query was still running and ClickHouse stopped it.
    pub found: bool,
    /// `system.processes` showed no row with the id before the kill deadline.
    pub confirmed_gone: bool,
    /// What went wrong, if anything (for logs).
    pub problem: Option<String>,
}

impl Killer {
    pub fn new(endpoint: Endpoint, timeout: Duration) -> Self {
        Killer { endpoint, timeout }
    }

    /// Kill the query, then poll until it is confirmed gone; all within `kill_timeout`.
    pub async fn kill_and_confirm(&self, id: &QueryId) -> KillOutcome {
        let deadline = Instant::now() + self.timeout;
        let mut outcome = KillOutcome::default();
        match tokio::time::timeout_at(deadline, self.kill(id)).await {
            Ok(Ok(found)) => {
                outcome.sent = true;
                outcome.found = found;
                if found {
                    metrics::killed();
                }
            }
            Ok(Err(problem)) => outcome.problem = Some(format!("KILL QUERY failed: {problem}")),
            Err(_) => {
                outcome.problem = Some(format!(
                    "KILL QUERY got no answer within {:?}",
                    self.timeout
                ))
            }
        }
        match self.confirm_gone(id, deadline).await {
            Ok(()) => outcome.confirmed_gone = true,
            Err(problem) => {
                let p = match outcome.problem.take() {
                    Some(earlier) => format!("{earlier}; {problem}"),
                    None => problem,
                };
                outcome.problem = Some(p);
            }
        }
        outcome
    }

    /// Poll `system.processes` until no row carries `id`, or `deadline` passes.
    pub async fn confirm_gone(&self, id: &QueryId, deadline: Instant) -> Result<(), String> {
        let mut pause = Duration::from_millis(25);
        let mut last_problem = String::from("no answer from system.processes");
        loop {
            match tokio::time::timeout_at(deadline, self.running(id)).await {
                Ok(Ok(false)) => return Ok(()),
                Ok(Ok(true)) => last_problem = "the query is still in system.processes".into(),
                Ok(Err(p)) => last_problem = p,
                Err(_) => break,
            }
            let next = Instant::now() + pause;
            if next >= deadline {
                break;
            }
            tokio::time::sleep_until(next).await;
            pause = (pause * 2).min(Duration::from_millis(200));
        }
        Err(format!(
            "could not confirm within {:?} that the query is gone: {last_problem}",
            self.timeout
        ))
    }

    /// `KILL QUERY ... SYNC`: answers once the query has stopped. `Ok(true)` when the
    /// query was running (ClickHouse lists the queries it killed, one per line).
    async fn kill(&self, id: &QueryId) -> Result<bool, String> {
        let sql = format!("KILL QUERY WHERE query_id = {} SYNC", id.sql_literal());
        let text = self.run(sql).await?;
        Ok(text.lines().any(|l| !l.trim().is_empty()))
    }

    async fn running(&self, id: &QueryId) -> Result<bool, String> {
        let sql = format!(
            "SELECT count() FROM system.processes WHERE query_id = {}",
            id.sql_literal()
        );
        let text = self.run(sql).await?;
        match text.trim().parse::<u64>() {
            Ok(n) => Ok(n > 0),
            Err(_) => Err(format!(
                "unexpected answer from system.processes: {:?}",
                truncate(&text)
            )),
        }
    }

    async fn run(&self, sql: String) -> Result<String, String> {
        let params = [("readonly".to_string(), "2".to_string())];
        let response = self
            .endpoint
            .post(&params, sql)
            .header(reqwest::header::CONTENT_TYPE, endpoint::SQL_CONTENT_TYPE)
            .send()
            .await
            .map_err(|e| endpoint::transport_error(e).message)?;
        if !response.status().is_success() {
            let e = endpoint::read_error(response).await;
            return Err(e.message);
        }
        // Both answers are a few lines; cap anyway, nothing from outside is unbounded.
        let mut response = response;
        let mut body = Vec::new();
        while let Some(chunk) = response
            .chunk()
            .await
            .map_err(|e| endpoint::transport_error(e).message)?
        {
            body.extend_from_slice(&chunk);
            if body.len() > 64 * 1024 {
                return Err("answer larger than 64 KiB".into());
            }
        }
        Ok(String::from_utf8_lossy(&body).into_owned())
    }
}

fn truncate(s: &str) -> String {
    s.chars().take(200).collect()
}
