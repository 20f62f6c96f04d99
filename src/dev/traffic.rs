//! `sluice dev --demo-traffic`: sample rows through the ingest API, a few bad ones among
//! them, and a progress line every few seconds, so a newcomer sees rows land in
//! ClickHouse and bad rows parked on the DLQ within seconds, the way a real producer's
//! rows would go.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use serde_json::{json, Value};

/// One request every `SEND_EVERY` with `ROWS_PER_REQUEST` rows: 50 rows/s, enough to
/// watch and too little to matter on a laptop.
const SEND_EVERY: Duration = Duration::from_millis(200);
const ROWS_PER_REQUEST: u64 = 10;
/// One row in `BAD_EVERY` carries a string in a numeric column: ClickHouse rejects it
/// and Sluice parks it, alone, with the reason.
const BAD_EVERY: u64 = 50;
/// How often the progress line is logged.
const PROGRESS_EVERY: Duration = Duration::from_secs(3);

/// Where the demo sends and what it asks.
#[derive(Clone, Debug)]
pub struct Endpoints {
    /// `http://127.0.0.1:8080`
    pub api: String,
    /// `http://127.0.0.1:9090`
    pub admin: String,
    /// ClickHouse's HTTP interface.
    pub clickhouse: String,
    pub tenant: String,
    /// `events` (in the target's database, `default`).
    pub table: String,
}

#[derive(Default)]
struct Counts {
    sent: AtomicU64,
    bad: AtomicU64,
    refused: AtomicU64,
}

/// Sends rows until aborted, logging progress every few seconds.
pub async fn run(endpoints: Endpoints) {
    let client = match crate::clickhouse::endpoint::client_builder()
        .timeout(Duration::from_secs(10))
        .build()
    {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(error = %e, "demo traffic cannot start: no HTTP client");
            return;
        }
    };
    let counts = Arc::new(Counts::default());
    // Both in this task, so aborting it stops both.
    tokio::join!(
        send(&client, &endpoints, &counts),
        report(client.clone(), endpoints.clone(), counts.clone())
    );
}

async fn send(client: &reqwest::Client, endpoints: &Endpoints, counts: &Counts) {
    let url = format!("{}/v1/ingest/{}", endpoints.api, endpoints.table);
    let mut tick = tokio::time::interval(SEND_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut next_id: u64 = 1;
    let mut last_warning: Option<tokio::time::Instant> = None;
    loop {
        tick.tick().await;
        let mut body = String::new();
        let mut bad = 0;
        for id in next_id..next_id + ROWS_PER_REQUEST {
            let row = sample_row(id);
            if row["amount"].is_string() {
                bad += 1;
            }
            body.push_str(&row.to_string());
            body.push('\n');
        }
        next_id += ROWS_PER_REQUEST;
        let answer = client
            .post(&url)
            .header("X-Tenant", &endpoints.tenant)
            .header(reqwest::header::CONTENT_TYPE, "application/x-ndjson")
            .body(body)
            .send()
            .await;
        let problem = match answer {
            Ok(r) if r.status().is_success() => {
                let reply: Value = match r.bytes().await {
                    Ok(b) => serde_json::from_slice(&b).unwrap_or(Value::Null),
                    Err(_) => Value::Null,
                };
                let accepted = reply["accepted"].as_u64().unwrap_or(0);
                counts.sent.fetch_add(accepted, Ordering::Relaxed);
                if accepted == ROWS_PER_REQUEST {
                    counts.bad.fetch_add(bad, Ordering::Relaxed);
                }
                None
            }
            Ok(r) => {
                counts
                    .refused
                    .fetch_add(ROWS_PER_REQUEST, Ordering::Relaxed);
                let status = r.status();
                Some(format!("{status}: {}", r.text().await.unwrap_or_default()))
            }
            Err(e) => {
                counts
                    .refused
                    .fetch_add(ROWS_PER_REQUEST, Ordering::Relaxed);
                Some(e.to_string())
            }
        };
        if let Some(problem) = problem {
            // A refused request is worth seeing, not worth a line five times a second.
            let due = last_warning.is_none_or(|at| at.elapsed() >= Duration::from_secs(5));
            if due {
                tracing::warn!(%problem, "demo traffic: the ingest API refused rows");
                last_warning = Some(tokio::time::Instant::now());
            }
        }
    }
}

/// A sample event; every `BAD_EVERY`th has `"amount": "n/a"`, which a Float64 column
/// cannot take.
pub fn sample_row(id: u64) -> Value {
    const ACTIONS: [&str; 5] = ["view", "click", "add_to_cart", "purchase", "share"];
    let amount = if id % BAD_EVERY == 0 {
        json!("n/a")
    } else {
        json!((id * 37 % 10_000) as f64 / 100.0)
    };
    json!({
        "ts": clickhouse_datetime(SystemTime::now()),
        "id": id,
        "user_id": id * 7919 % 1000,
        "action": ACTIONS[(id % ACTIONS.len() as u64) as usize],
        "amount": amount,
        "duration_ms": id * 131 % 5000,
    })
}

/// `YYYY-MM-DD hh:mm:ss` (UTC), the DateTime text every ClickHouse version parses.
fn clickhouse_datetime(at: SystemTime) -> String {
    let text = humantime::format_rfc3339_seconds(at).to_string();
    text.trim_end_matches('Z').replacen('T', " ", 1)
}

async fn report(client: reqwest::Client, endpoints: Endpoints, counts: Arc<Counts>) {
    let mut tick = tokio::time::interval(PROGRESS_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The first tick is immediate: nothing to report yet.
    tick.tick().await;
    loop {
        tick.tick().await;
        let in_clickhouse = clickhouse_count(&client, &endpoints)
            .await
            .map(|n| n.to_string())
            .unwrap_or_else(|e| format!("? ({e})"));
        let parked = parked_count(&client, &endpoints)
            .await
            .map(|n| n.to_string())
            .unwrap_or_else(|e| format!("? ({e})"));
        let refused = counts.refused.load(Ordering::Relaxed);
        tracing::info!(
            "demo traffic: {} rows sent ({} bad) | {in_clickhouse} in ClickHouse | {parked} parked on the DLQ{}",
            counts.sent.load(Ordering::Relaxed),
            counts.bad.load(Ordering::Relaxed),
            if refused > 0 {
                format!(" | {refused} refused by the API")
            } else {
                String::new()
            }
        );
    }
}

async fn clickhouse_count(client: &reqwest::Client, e: &Endpoints) -> Result<u64, String> {
    let response = client
        .post(format!("{}/", e.clickhouse))
        .body(format!("SELECT count() FROM default.{}", e.table))
        .send()
        .await
        .map_err(|e| e.to_string())?;
    let status = response.status();
    let text = response.text().await.map_err(|e| e.to_string())?;
    if !status.is_success() {
        return Err(format!("{status}"));
    }
    text.trim().parse().map_err(|_| format!("{text:?}"))
}

async fn parked_count(client: &reqwest::Client, e: &Endpoints) -> Result<u64, String> {
    let response = client
        .get(format!("{}/admin/dlq", e.admin))
        .send()
        .await
        .map_err(|e| e.to_string())?;
    let status = response.status();
    if !status.is_success() {
        return Err(format!("{status}"));
    }
    let body = response.bytes().await.map_err(|e| e.to_string())?;
    let counts: Value = serde_json::from_slice(&body).map_err(|e| e.to_string())?;
    counts["total"]
        .as_u64()
        .ok_or_else(|| format!("no total in {counts}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_row_in_fifty_is_bad() {
        let bad = (1..=500)
            .filter(|id| sample_row(*id)["amount"].is_string())
            .count();
        assert_eq!(bad, 10);
        assert!(sample_row(1)["amount"].is_f64());
    }

    #[test]
    fn datetimes_are_clickhouse_text() {
        let at = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        assert_eq!(clickhouse_datetime(at), "2023-11-14 22:13:20");
    }
}
