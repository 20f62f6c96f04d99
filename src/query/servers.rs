//! The servers a query may run on: every server of the gateway's target, any shard (a
//! `Distributed` table answers from any of them), each with its own endpoint and its
//! own killer (a `KILL QUERY` goes to the server that ran the query).
//!
//! A server a query could not reach (the connection was never made: the query did not
//! start there) is passed over for [`DOWN_FOR`], and the query tries the next one at
//! once; a server that answered is healthy again. The order is a pure function of
//! which servers are down and whose turn it is ([`order`]).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use super::kill::Killer;
use crate::clickhouse::endpoint::{Connections, Endpoint};
use crate::config::QueryConfig;

/// How long a server that could not be reached is passed over.
pub const DOWN_FOR: Duration = Duration::from_secs(5);

/// One server of the gateway's target.
#[derive(Debug)]
pub struct QueryServer {
    /// `host:port`, or the target's name for a target of one server (logs).
    pub name: String,
    pub endpoint: Endpoint,
    /// On the server's own connections: a saturated query pool must not hold the kill
    /// back.
    pub killer: Killer,
    down_until: Mutex<Option<Instant>>,
}

#[derive(Debug)]
pub struct QueryServers {
    servers: Vec<QueryServer>,
    /// Whose turn it is to take the next query.
    turn: AtomicUsize,
}

impl QueryServers {
    pub fn new(config: &QueryConfig) -> anyhow::Result<Self> {
        let connections = |connect_timeout, request_timeout| Connections {
            connect_timeout,
            // Below ClickHouse's keep_alive_timeout (3 s, 18.16 too).
            idle_timeout: Duration::from_secs(2),
            max_idle: config.concurrency.max(1),
            request_timeout,
        };
        let servers = config
            .servers
            .iter()
            .map(|(name, url)| {
                let endpoint = Endpoint::new(
                    url,
                    &config.user,
                    config.password.clone(),
                    connections(config.connect_timeout, None),
                )?;
                let kill_endpoint = Endpoint::new(
                    url,
                    &config.user,
                    config.password.clone(),
                    connections(
                        config.connect_timeout.min(config.kill_timeout),
                        Some(config.kill_timeout),
                    ),
                )?;
                Ok(QueryServer {
                    name: name.clone(),
                    endpoint,
                    killer: Killer::new(kill_endpoint, config.kill_timeout),
                    down_until: Mutex::new(None),
                })
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        anyhow::ensure!(!servers.is_empty(), "the query target has no server");
        Ok(Self {
            servers,
            turn: AtomicUsize::new(0),
        })
    }

    pub fn get(&self, index: usize) -> &QueryServer {
        &self.servers[index]
    }

    /// The servers in the order the next query tries them.
    pub fn next_order(&self) -> Vec<usize> {
        let now = Instant::now();
        let down: Vec<bool> = self.servers.iter().map(|s| s.is_down(now)).collect();
        let start = self.turn.fetch_add(1, Ordering::Relaxed);
        order(&down, start)
    }

    /// Server `index` could not be reached: passed over for [`DOWN_FOR`].
    pub fn unreachable(&self, index: usize) {
        *self.servers[index].lock() = Some(Instant::now() + DOWN_FOR);
    }

    /// Server `index` answered.
    pub fn answered(&self, index: usize) {
        *self.servers[index].lock() = None;
    }
}

impl QueryServer {
    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Instant>> {
        self.down_until.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn is_down(&self, now: Instant) -> bool {
        self.lock().is_some_and(|until| now < until)
    }
}

/// The order a query tries `down.len()` servers in: the ones up first, from `start` on
/// in turn, then the ones down (the one down longest first would need their times;
/// in turn is enough: none is known to answer).
pub fn order(down: &[bool], start: usize) -> Vec<usize> {
    let n = down.len();
    let rotation = (0..n).map(|i| (start + i) % n.max(1));
    let (up, down): (Vec<usize>, Vec<usize>) = rotation.partition(|&i| !down[i]);
    up.into_iter().chain(down).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_take_the_servers_in_turn_and_a_server_down_last() {
        assert_eq!(order(&[false, false, false], 1), vec![1, 2, 0]);
        assert_eq!(order(&[false, true, false], 1), vec![2, 0, 1]);
        assert_eq!(order(&[true, true], 0), vec![0, 1]);
        assert_eq!(order(&[false], 7), vec![0]);
    }
}
