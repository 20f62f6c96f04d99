//! Whether other publishers reach the queue. Sluice's ingest API publishes on each
//! partition's own subjects; any other publisher publishes on
//! `<subject_prefix>.<tenant>.<table>[.<key>]`, which reaches a partition only through
//! the nats-server's subject mapping (`sluice check-config` prints the one `[nats]
//! partitions` needs). With the mapping missing, made for another count, or left behind
//! after going back to one stream, those publishers get "no responders" (or their rows
//! land in a stream Sluice does not read), and nothing of Sluice's own says so.
//!
//! Sluice cannot read a server's mappings, so it asks the way a publisher would: a
//! publish on such a subject carrying `Nats-Expected-Stream` with a name no stream can
//! have is refused by whichever stream takes the subject, and the refusal names that
//! stream (error 10060, nothing stored); with no stream taking it, the answer is "no
//! responders". nats-server 2.9.10 and 2.15.1 answer alike.
//!
//! What it found is logged when it changes (WARN while subjects go astray), shown in
//! `GET /admin/nats` (`publishers`) and counted by `sluice_nats_subjects_astray`. A
//! server's mapping changes with a reload, so it is asked again every [`EVERY`].

use std::time::Duration;

use async_nats::{header, Client, HeaderMap, Request, RequestErrorKind};
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::config::StreamSettings;
use crate::telemetry::metrics::NATS_SUBJECTS_ASTRAY;

/// How often the subjects are asked again.
const EVERY: Duration = Duration::from_secs(60);
/// How long one ask waits for its answer.
const ANSWER_WITHIN: Duration = Duration::from_secs(2);
/// The tables asked of (each with and without a key): enough that a mapping made for
/// another partition count sends some of them astray but in rare cases.
const TABLES: usize = 8;
/// The tenant asked of: no configuration names it, and nothing is stored for it.
const TENANT: &str = "sluice_route_check";
/// The stream a probe expects: a stream's name has no dot, so no stream is it.
const NO_STREAM: &str = "sluice.route.check";
/// How many times a subject that went astray is asked again before it counts.
const CONFIRMATIONS: usize = 2;
/// How long after it went astray a subject is asked again: longer than a stream's
/// leader election usually takes.
const CONFIRM_AFTER: Duration = Duration::from_secs(3);
/// How many astray subjects are kept to be shown.
const SHOWN: usize = 4;

/// What the last check found.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct PublisherRoutes {
    /// Subjects asked of.
    pub asked: usize,
    /// How many of them reached no stream of the queue.
    pub astray: usize,
    /// The first few of those, with where each went.
    pub examples: Vec<Astray>,
    /// Asks with no answer (NATS away, a timeout): the check says nothing of them.
    pub unanswered: usize,
}

/// A subject that reached no stream of the queue.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Astray {
    pub subject: String,
    /// The stream that took it, one Sluice does not read; `None`: no stream did.
    pub reached: Option<String>,
}

/// Where one ask went.
#[derive(Debug, PartialEq, Eq)]
enum Reached {
    Stream(String),
    Nowhere,
    Unanswered,
}

/// The stream's refusal of a probe (error 10060): the stream is all that is read.
#[derive(Deserialize)]
struct Refusal {
    stream: Option<String>,
}

/// Ask now, then every [`EVERY`] for as long as the process runs; each finding is
/// published on `found`.
pub async fn keep_checking(
    client: Client,
    settings: StreamSettings,
    found: watch::Sender<Option<PublisherRoutes>>,
) {
    loop {
        if client.connection_state() == async_nats::connection::State::Connected {
            let routes = check(&client, &settings).await;
            let before = found.borrow().clone();
            log_change(&settings, before.as_ref(), &routes);
            metrics::gauge!(NATS_SUBJECTS_ASTRAY).set(routes.astray as f64);
            found.send_replace(Some(routes));
        }
        tokio::time::sleep(EVERY).await;
    }
}

/// Every subject asked of, at once; one that goes astray is asked again, twice, a few
/// seconds apart, and counts only if it goes astray each time: on a NATS cluster a
/// partition's stream answers nothing while it elects a leader, which reads as "no
/// stream" for a moment.
pub async fn check(client: &Client, settings: &StreamSettings) -> PublisherRoutes {
    let ours: Vec<String> = settings
        .each_partition()
        .into_iter()
        .map(|p| p.stream)
        .collect();
    let mut asking = subjects(&settings.subject_prefix);
    let mut routes = PublisherRoutes {
        asked: asking.len(),
        ..PublisherRoutes::default()
    };
    for round in 0..=CONFIRMATIONS {
        if round > 0 {
            if asking.is_empty() {
                break;
            }
            tokio::time::sleep(CONFIRM_AFTER).await;
        }
        let answers = futures::future::join_all(asking.iter().map(|s| ask(client, s))).await;
        let mut again = Vec::new();
        for (subject, reached) in asking.into_iter().zip(answers) {
            let reached = match reached {
                Reached::Stream(stream) if ours.contains(&stream) => continue,
                Reached::Stream(stream) => Some(stream),
                Reached::Nowhere => None,
                Reached::Unanswered => {
                    routes.unanswered += 1;
                    continue;
                }
            };
            if round < CONFIRMATIONS {
                again.push(subject);
                continue;
            }
            routes.astray += 1;
            if routes.examples.len() < SHOWN {
                routes.examples.push(Astray { subject, reached });
            }
        }
        asking = again;
    }
    routes
}

/// `<prefix>.<tenant>.t<n>` and `<prefix>.<tenant>.t<n>.k<n>`, as other publishers
/// publish.
fn subjects(prefix: &str) -> Vec<String> {
    (0..TABLES)
        .flat_map(|n| {
            [
                format!("{prefix}.{TENANT}.t{n}"),
                format!("{prefix}.{TENANT}.t{n}.k{n}"),
            ]
        })
        .collect()
}

/// Where a publish on `subject` goes, asked so that nothing is stored.
async fn ask(client: &Client, subject: &str) -> Reached {
    let mut headers = HeaderMap::new();
    headers.insert(header::NATS_EXPECTED_STREAM, NO_STREAM);
    let request = Request::new()
        .headers(headers)
        .payload(Bytes::new())
        .timeout(Some(ANSWER_WITHIN));
    match client.send_request(subject.to_owned(), request).await {
        Ok(answer) => match serde_json::from_slice::<Refusal>(&answer.payload) {
            Ok(Refusal {
                stream: Some(stream),
            }) => Reached::Stream(stream),
            // Not a stream's answer: something else listens on the subject.
            _ => Reached::Unanswered,
        },
        Err(e) if e.kind() == RequestErrorKind::NoResponders => Reached::Nowhere,
        Err(_) => Reached::Unanswered,
    }
}

/// A WARN when subjects go astray (first seen, or others than before), an INFO once
/// none does and some were answered (a check nothing answered says nothing).
fn log_change(settings: &StreamSettings, before: Option<&PublisherRoutes>, now: &PublisherRoutes) {
    let was_astray = before.is_some_and(|b| b.astray > 0);
    if now.astray == 0 {
        if was_astray && now.unanswered < now.asked {
            tracing::info!(prefix = %settings.subject_prefix,
                "publishers' subjects reach the queue again (the server's subject mapping matches [nats] partitions)");
        }
        return;
    }
    if before.is_some_and(|b| b.examples == now.examples) {
        return;
    }
    let example = &now.examples[0];
    let went = match &example.reached {
        Some(stream) => format!("went to stream {stream}, which Sluice does not read"),
        None => "reached no stream (publishers get \"no responders\")".to_owned(),
    };
    let fix = if settings.partitioned() {
        format!(
            "give the nats-server the subject mapping for [nats] partitions = {} (sluice check-config prints it)",
            settings.partitions
        )
    } else {
        "remove the subject mapping left from another [nats] partitions".to_owned()
    };
    tracing::warn!(astray = now.astray, asked = now.asked, subject = %example.subject,
        "publishers on {}.<tenant>.<table> do not reach the queue: {} {went}; {fix}. Sluice's own ingest API is not affected",
        settings.subject_prefix, example.subject);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_table_is_asked_with_and_without_a_key() {
        let asked = subjects("ingest");
        assert_eq!(asked.len(), 2 * TABLES);
        assert_eq!(asked[0], "ingest.sluice_route_check.t0");
        assert_eq!(asked[1], "ingest.sluice_route_check.t0.k0");
        for subject in &asked {
            let parsed = sluice_actors::parse_subject("ingest", subject);
            assert!(
                parsed.is_some_and(|(tenant, _)| tenant == TENANT),
                "{subject} is a subject other publishers use"
            );
        }
    }
}
