//! Publishing the rows into a stream as fast as JetStream takes them: acked publishes,
//! pipelined (a window of acks outstanding), so every row is known stored before a
//! phase counts on it. One row per message, or many (NDJSON, one row per line).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};
use async_nats::jetstream::{self, context::PublishAckFuture};
use bytes::Bytes;

use crate::rows::RowGen;

/// Publish acks outstanding at once.
const WINDOW: usize = 8192;

/// Which rows to publish: ids `first..first + count`, one in `bad_every` made bad.
#[derive(Clone, Debug)]
pub struct Batch {
    pub subject: String,
    pub first_id: u64,
    pub count: u64,
    /// Every `bad_every`-th row (counting from the middle of each run) is bad.
    pub bad_every: Option<u64>,
    /// Rows per message (the last message may have fewer).
    pub rows_per_message: usize,
}

impl Batch {
    pub fn is_bad(&self, i: u64) -> bool {
        self.bad_every
            .is_some_and(|every| every > 0 && i % every == every / 2)
    }

    /// How many bad rows the batch holds.
    pub fn bad_rows(&self) -> u64 {
        (0..self.count).filter(|&i| self.is_bad(i)).count() as u64
    }
}

/// A JetStream context with room for the publish window.
pub fn context(client: async_nats::Client) -> jetstream::Context {
    jetstream::ContextBuilder::new()
        .max_ack_inflight(WINDOW * 2)
        .timeout(Duration::from_secs(30))
        .build(client)
}

/// Publish the batch; returns how long it took.
pub async fn publish(js: &jetstream::Context, gen: &RowGen, batch: &Batch) -> Result<Duration> {
    let started = Instant::now();
    let subject = async_nats::Subject::from(batch.subject.as_str());
    let mut window: VecDeque<PublishAckFuture> = VecDeque::with_capacity(WINDOW);
    let per_message = batch.rows_per_message.max(1) as u64;
    let mut row = String::with_capacity(gen.row_bytes + 64);
    let mut message = Vec::with_capacity((gen.row_bytes + 1) * per_message as usize);
    let mut i = 0;
    while i < batch.count {
        message.clear();
        for j in i..(i + per_message).min(batch.count) {
            gen.row(batch.first_id + j, batch.is_bad(j), &mut row);
            if !message.is_empty() {
                message.push(b'\n');
            }
            message.extend_from_slice(row.as_bytes());
        }
        let ack = js
            .publish(subject.clone(), Bytes::copy_from_slice(&message))
            .await
            .with_context(|| format!("publishing row {i} to {}", batch.subject))?;
        window.push_back(ack);
        if window.len() >= WINDOW {
            if let Some(ack) = window.pop_front() {
                confirm(ack, &batch.subject).await?;
            }
        }
        i += per_message;
    }
    while let Some(ack) = window.pop_front() {
        confirm(ack, &batch.subject).await?;
    }
    Ok(started.elapsed())
}

async fn confirm(ack: PublishAckFuture, subject: &str) -> Result<()> {
    let ack = ack
        .await
        .with_context(|| format!("waiting for a publish ack on {subject}"))?;
    if ack.duplicate {
        bail!("a row published to {subject} was taken as a duplicate");
    }
    Ok(())
}
