//! Running one query against ClickHouse: the timeout protocol and the retry policy.
//!
//! One request, one `query_id`, one deadline (`timeout_ms` from arrival), shared by
//! every attempt:
//! - each attempt sets ClickHouse's `max_execution_time` to the time left minus
//!   `server_margin`, in whole seconds rounded down and at least 1 (ClickHouse 18.16
//!   truncates fractions, and truncates 0.5 to 0, which means *no limit*), so the
//!   server normally stops the query first and answers code 159: a 504, never retried;
//! - if the deadline passes anyway, the attempt is abandoned, `KILL QUERY` is sent on
//!   the killer's own connection and its effect confirmed in `system.processes`, and
//!   only then is 504 answered (with `kill_sent` / `kill_confirmed`);
//! - only Unavailable failures are retried: at most `max_attempts` attempts, a
//!   full-jitter pause before each retry, a token from the global budget for each, and
//!   only if the pause still fits before the deadline;
//! - before a retry whose previous attempt may still be running (a transport failure
//!   after the request went out, or a codeless answer from something in front of
//!   ClickHouse), that attempt is killed and confirmed gone; unconfirmed, no retry.
//!   Every attempt also carries `replace_running_query=1` with the same id, so even a
//!   straggler that reaches ClickHouse late is replaced, never run twice.
//!
//! A failure that ClickHouse itself answered with an exception code ended that attempt
//! on the server: nothing to kill.
//!
//! The target may be a cluster: each attempt runs on one of its servers (any shard),
//! taken in turn, one that could not be reached passed over (`servers.rs`). An attempt
//! whose connection was never made did not start: it goes to the next server at once,
//! no retry spent. A kill goes to the server that ran the attempt.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use sluice_actors::ClickHouseError;
use tokio::time::Instant;

use super::errors::{map_clickhouse, QueryError, StoppedBy, TIMEOUT_EXCEEDED};
use super::id::QueryId;
use super::limits::Limits;
use super::metrics;
use super::pacing::RetryPacing;
use super::request::{RequestLimits, ValidQuery};
use super::response::{self, Relay, RelayError};
use super::retry_budget::RetryBudget;
use super::servers::QueryServers;
use crate::clickhouse::endpoint;
use crate::config::QueryConfig;

/// The query gateway proper: servers (each with its killer), budget, limits.
#[derive(Debug)]
pub struct Gateway {
    config: QueryConfig,
    /// `Retry-After` for an Unavailable answer (`[api] retry_after`).
    retry_after: Duration,
    servers: QueryServers,
    budget: RetryBudget,
    pacing: RetryPacing,
    limits: Limits,
}

/// A query that succeeded.
#[derive(Debug)]
pub struct Success {
    pub relay: Relay,
    pub attempts: u32,
}

/// How one attempt failed.
enum AttemptFailure {
    /// A classified failure; `maybe_running`: the query may still run on the server;
    /// `started`: the request reached it (a connection never made did not).
    Failed {
        error: ClickHouseError,
        maybe_running: bool,
        started: bool,
    },
    /// A failure no retry can change.
    Final(QueryError),
}

impl Gateway {
    pub fn new(config: &QueryConfig, retry_after: Duration) -> anyhow::Result<Self> {
        Ok(Gateway {
            config: config.clone(),
            retry_after,
            servers: QueryServers::new(config)?,
            budget: RetryBudget::new(config.retry_budget, config.retry_refill_per_sec),
            pacing: RetryPacing {
                base: config.backoff_base,
                max: config.backoff_max,
            },
            limits: Limits::new(config.concurrency, config.tenant_concurrency),
        })
    }

    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    pub fn budget(&self) -> &RetryBudget {
        &self.budget
    }

    pub fn request_limits(&self) -> RequestLimits {
        RequestLimits {
            default_timeout: self.config.default_timeout,
            max_timeout: self.config.max_timeout,
        }
    }

    /// The byte cap on a relayed result; `None` when `max_result_bytes = 0`, which
    /// ClickHouse reads as "no limit" and so does the relay (it still streams, so
    /// memory stays bounded by the window).
    pub fn result_cap(&self) -> Option<u64> {
        (self.config.max_result_bytes > 0).then_some(self.config.max_result_bytes)
    }

    /// Run `query` until it succeeds, fails for good, or `deadline` passes.
    pub async fn execute(
        &self,
        query: &ValidQuery,
        id: &QueryId,
        deadline: Instant,
    ) -> Result<Success, QueryError> {
        let mut attempts: u32 = 0;
        loop {
            attempts += 1;
            let server_limit = server_limit(deadline, self.config.server_margin);
            let ran_on = AtomicUsize::new(0);
            let outcome = tokio::time::timeout_at(
                deadline,
                self.attempt_anywhere(query, id, server_limit, &ran_on),
            )
            .await;
            let server = ran_on.load(Ordering::Relaxed);
            let (error, maybe_running) = match outcome {
                Ok(Ok(relay)) => return Ok(Success { relay, attempts }),
                Ok(Err(AttemptFailure::Final(e))) => return Err(e),
                Ok(Err(AttemptFailure::Failed {
                    error,
                    maybe_running,
                    ..
                })) => (error, maybe_running),
                Err(_) => return Err(self.deadline_passed(query, id, attempts, server).await),
            };

            if error.code == Some(TIMEOUT_EXCEEDED) {
                return Err(QueryError::Timeout {
                    timeout: query.timeout,
                    stopped_by: StoppedBy::ClickHouse { server_limit },
                    attempts,
                });
            }
            let give_up = |error: ClickHouseError| QueryError::ClickHouse {
                error,
                attempts,
                retry_after: self.retry_after,
            };
            if !worth_retrying(&error) || attempts >= self.config.max_attempts {
                return Err(give_up(error));
            }
            let pause = self.pacing.pause(attempts - 1);
            if Instant::now() + pause >= deadline {
                return Err(give_up(error));
            }
            if let Err(wait) = self.budget.try_take() {
                tracing::warn!(query_id = %id, attempts, "retry budget empty: answering 503 without retrying");
                return Err(QueryError::BudgetExhausted {
                    error,
                    attempts,
                    retry_after: wait.unwrap_or(self.retry_after).max(Duration::from_secs(1)),
                });
            }
            if maybe_running {
                let kill = self.servers.get(server).killer.kill_and_confirm(id).await;
                if !kill.confirmed_gone {
                    tracing::warn!(
                        query_id = %id,
                        attempts,
                        problem = kill.problem.as_deref().unwrap_or(""),
                        "previous attempt not confirmed gone: not retrying"
                    );
                    return Err(QueryError::NotConfirmedGone {
                        error,
                        attempts,
                        retry_after: self.retry_after,
                    });
                }
            }
            let wake = Instant::now() + pause;
            if wake >= deadline {
                return Err(give_up(error));
            }
            tracing::info!(
                query_id = %id,
                attempt = attempts + 1,
                pause_ms = pause.as_millis() as u64,
                code = ?error.code,
                "retrying query after an Unavailable failure: {}",
                first_line(&error.message)
            );
            tokio::time::sleep_until(wake).await;
            metrics::retried();
        }
    }

    /// The deadline passed during an attempt: kill the query on the server that ran it,
    /// confirm, then 504.
    async fn deadline_passed(
        &self,
        query: &ValidQuery,
        id: &QueryId,
        attempts: u32,
        server: usize,
    ) -> QueryError {
        let server = self.servers.get(server);
        let kill = server.killer.kill_and_confirm(id).await;
        tracing::warn!(
            query_id = %id,
            server = %server.name,
            timeout_ms = query.timeout.as_millis() as u64,
            kill_sent = kill.sent,
            kill_found = kill.found,
            kill_confirmed = kill.confirmed_gone,
            problem = kill.problem.as_deref().unwrap_or(""),
            "query deadline passed: KILL QUERY tried"
        );
        QueryError::Timeout {
            timeout: query.timeout,
            stopped_by: StoppedBy::Sluice(kill),
            attempts,
        }
    }

    /// One attempt, on the first server that can be reached (in the servers' order);
    /// `ran_on` says which server the attempt went to (the last one tried).
    async fn attempt_anywhere(
        &self,
        query: &ValidQuery,
        id: &QueryId,
        server_limit: Duration,
        ran_on: &AtomicUsize,
    ) -> Result<Relay, AttemptFailure> {
        let mut last = None;
        for server in self.servers.next_order() {
            ran_on.store(server, Ordering::Relaxed);
            match self.attempt(query, id, server_limit, server).await {
                Err(AttemptFailure::Failed {
                    error,
                    started: false,
                    maybe_running,
                }) => {
                    // The query did not start there: the next server, at once.
                    tracing::info!(query_id = %id, server = %self.servers.get(server).name,
                        error = %error.message, "the query could not reach this server: trying another");
                    self.servers.unreachable(server);
                    last = Some(AttemptFailure::Failed {
                        error,
                        started: false,
                        maybe_running,
                    });
                }
                outcome => {
                    self.servers.answered(server);
                    return outcome;
                }
            }
        }
        Err(last.unwrap_or(AttemptFailure::Final(QueryError::Off)))
    }

    async fn attempt(
        &self,
        query: &ValidQuery,
        id: &QueryId,
        server_limit: Duration,
        server: usize,
    ) -> Result<Relay, AttemptFailure> {
        let params = self.settings(query, id, server_limit);
        let request = self
            .servers
            .get(server)
            .endpoint
            .post(&params, query.sql.clone())
            .header(reqwest::header::CONTENT_TYPE, endpoint::SQL_CONTENT_TYPE);
        let response = match request.send().await {
            Ok(r) => r,
            Err(e) => {
                // A connection never made carried no query; anything later might have.
                let started = !e.is_connect();
                return Err(AttemptFailure::Failed {
                    error: endpoint::transport_error(e),
                    maybe_running: started,
                    started,
                });
            }
        };
        if !response.status().is_success() {
            let error = endpoint::read_error(response).await;
            // An exception code means ClickHouse ended this query itself; a codeless
            // status may come from a proxy while the query still runs behind it.
            let maybe_running = error.code.is_none();
            return Err(AttemptFailure::Failed {
                error,
                maybe_running,
                started: true,
            });
        }
        let cap = self.result_cap().unwrap_or(u64::MAX);
        match response::read_window(response, cap).await {
            Ok(relay) if is_json(relay.content_type()) => Ok(relay),
            Ok(relay) => Err(AttemptFailure::Final(QueryError::NotJson {
                content_type: relay.content_type().to_string(),
            })),
            Err(RelayError::TooLarge { cap }) => {
                Err(AttemptFailure::Final(QueryError::ResultTooLarge {
                    limit_bytes: cap,
                }))
            }
            // With wait_end_of_query=1 a 200 means the query had finished.
            Err(RelayError::Transport(error)) => Err(AttemptFailure::Failed {
                error,
                maybe_running: false,
                started: true,
            }),
        }
    }

    /// Everything an attempt pins, as URL parameters: the query path's contract with
    /// ClickHouse. Sent on every request so the query user's profile cannot loosen it.
    fn settings(
        &self,
        query: &ValidQuery,
        id: &QueryId,
        server_limit: Duration,
    ) -> Vec<(String, String)> {
        let c = &self.config;
        let mut params: Vec<(String, String)> = [
            ("database", c.database.clone()),
            ("query_id", id.to_string()),
            // Forbids writes but, unlike readonly=1, lets the request set the rest.
            ("readonly", "2".into()),
            ("max_execution_time", server_limit.as_secs().to_string()),
            // `break` would turn a timeout into a partial result answered 200.
            ("timeout_overflow_mode", "throw".into()),
            ("max_result_rows", c.max_result_rows.to_string()),
            ("max_result_bytes", c.max_result_bytes.to_string()),
            ("result_overflow_mode", "throw".into()),
            // Errors arrive as a status, never half-way through a 200.
            ("wait_end_of_query", "1".into()),
            ("default_format", query.format.clickhouse_name().into()),
            ("replace_running_query", "1".into()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        for (name, value) in &query.params {
            params.push((format!("param_{name}"), value.clone()));
        }
        params
    }
}

/// Whether a failure may be retried at all: Unavailable as the query path reads it.
/// 164 (readonly) is Unavailable to the classifier but a refused write here, and 159
/// is ClickHouse's own time limit: neither is worth a retry.
pub fn worth_retrying(error: &ClickHouseError) -> bool {
    map_clickhouse(error.class, error.code).2
}

/// ClickHouse's `max_execution_time` for an attempt: the time left before `deadline`
/// less `margin`, in whole seconds rounded down, never below 1 (0 means no limit).
pub fn server_limit(deadline: Instant, margin: Duration) -> Duration {
    server_limit_for(deadline.saturating_duration_since(Instant::now()), margin)
}

pub fn server_limit_for(remaining: Duration, margin: Duration) -> Duration {
    Duration::from_secs(remaining.saturating_sub(margin).as_secs().max(1))
}

fn is_json(content_type: &str) -> bool {
    content_type
        .split(';')
        .next()
        .is_some_and(|t| t.trim().eq_ignore_ascii_case("application/json"))
}

fn first_line(s: &str) -> &str {
    s.lines().next().unwrap_or("")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_limit_rounds_down_to_whole_seconds_and_never_reaches_zero() {
        let ms = Duration::from_millis;
        let m = ms(500);
        assert_eq!(server_limit_for(ms(10_000), m), Duration::from_secs(9));
        assert_eq!(server_limit_for(ms(2_000), m), Duration::from_secs(1));
        assert_eq!(server_limit_for(ms(2_600), m), Duration::from_secs(2));
        assert_eq!(server_limit_for(ms(1_200), m), Duration::from_secs(1));
        assert_eq!(server_limit_for(ms(800), m), Duration::from_secs(1));
        assert_eq!(server_limit_for(Duration::ZERO, m), Duration::from_secs(1));
    }

    #[test]
    fn only_unavailable_failures_are_worth_a_retry() {
        use crate::clickhouse::classify;
        let retry = |e: ClickHouseError| worth_retrying(&e);
        assert!(retry(classify::from_code(745, Some(500), String::new())));
        assert!(retry(classify::from_code(394, Some(500), String::new())));
        assert!(retry(classify::from_response(503, None, "")));
        assert!(retry(classify::transport(
            sluice_actors::NoAnswer::Refused,
            "connection refused"
        )));
        assert!(!retry(classify::from_code(159, Some(500), String::new())));
        assert!(!retry(classify::from_code(164, Some(500), String::new())));
        assert!(!retry(classify::from_code(60, Some(404), String::new())));
        assert!(!retry(classify::from_code(193, Some(401), String::new())));
        assert!(!retry(classify::from_response(500, None, "<html>")));
    }

    #[test]
    fn json_content_types() {
        assert!(is_json("application/json; charset=UTF-8"));
        assert!(is_json("application/json"));
        assert!(!is_json("text/tab-separated-values; charset=UTF-8"));
        assert!(!is_json(""));
    }
}
