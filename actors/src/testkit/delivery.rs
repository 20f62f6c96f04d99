//! A recording [`FakeDelivery`] and its [`Journal`]: what happened to each delivery.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;

use crate::ports::*;

/// What happened to one delivery.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    Acked,
    /// Acked, and JetStream's confirmation awaited.
    AckedConfirmed,
    Naked(Duration),
    Parked(Parking),
    /// One row of a many-row message parked (the message is acked after).
    ParkedRow(u32, Parking),
    /// The DLQ publish failed; the delivery came back to the caller.
    ParkFailed(Parking),
    Progress,
    /// Dropped without being settled (the real adapter naks it at once).
    DroppedUnsettled,
    /// Split into parts of one shard each, published as messages of their own, then
    /// acked (counted as an ack).
    Split(Vec<(usize, Bytes)>),
    /// A manifest was recorded (by a [`FakeManifestStore`] over this journal; sequence 0):
    /// `true` once its verdicts are. Orders the store's writes among the acks.
    ManifestRecorded(bool),
}

impl Event {
    fn terminal(&self) -> bool {
        !matches!(
            self,
            Event::Progress
                | Event::ParkFailed(_)
                | Event::ParkedRow(..)
                | Event::ManifestRecorded(_)
        )
    }
}

/// Records what happened to every [`FakeDelivery`] it made.
#[derive(Debug, Default)]
pub struct Journal {
    record: bool,
    events: Mutex<Vec<(u64, Event)>>,
    next_seq: AtomicU64,
    /// Every message made, by sequence: what a store reads from the stream.
    payloads: Mutex<std::collections::HashMap<u64, (Arc<str>, Bytes)>>,
    pub dlq_fails: AtomicBool,
    /// A progress never completes (a NATS client whose outbound queue is full and
    /// does not drain): what the keepalive must not wait on.
    pub progress_hangs: AtomicBool,
    acks: AtomicU64,
    naks: AtomicU64,
    parks: AtomicU64,
    dropped: AtomicU64,
}

impl Journal {
    /// Records every event (tests).
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            record: true,
            ..Default::default()
        })
    }

    /// Counts only (throughput runs).
    pub fn counting() -> Arc<Self> {
        Arc::new(Self::default())
    }

    pub fn delivery(
        self: &Arc<Self>,
        subject: &Arc<str>,
        payload: impl Into<Bytes>,
    ) -> FakeDelivery {
        let seq = self.next_seq.fetch_add(1, Ordering::Relaxed) + 1;
        let payload = payload.into();
        if self.record {
            self.payloads
                .lock()
                .unwrap()
                .insert(seq, (subject.clone(), payload.clone()));
        }
        self.handed(seq, 1, subject.clone(), payload)
    }

    /// Delivery `deliveries` of message `seq`, handed out now.
    fn handed(
        self: &Arc<Self>,
        seq: u64,
        deliveries: u64,
        subject: Arc<str>,
        payload: Bytes,
    ) -> FakeDelivery {
        let now = tokio::time::Instant::now();
        FakeDelivery {
            seq,
            deliveries,
            subject,
            payload,
            journal: self.clone(),
            settled: false,
            alive_since: Mutex::new(now),
            received_at: now,
            parked_whole: Mutex::new(None),
            part: None,
            undecodable: None,
        }
    }

    /// Message `seq` delivered again (its `deliveries`-th delivery), as JetStream does
    /// after a nak or `ack_wait`.
    pub fn redeliver(self: &Arc<Self>, seq: u64, deliveries: u64) -> FakeDelivery {
        let (subject, payload) = self.payload(seq).expect("a message this journal made");
        self.handed(seq, deliveries, subject, payload)
    }

    /// The subject and payload of message `seq`, as the stream holds it.
    pub fn payload(&self, seq: u64) -> Option<(Arc<str>, Bytes)> {
        self.payloads.lock().unwrap().get(&seq).cloned()
    }

    /// Message `seq` leaves the stream unsettled (an operator deleting it by hand).
    pub fn remove_from_stream(&self, seq: u64) {
        self.payloads.lock().unwrap().remove(&seq);
    }

    /// `n` rows `{"n":i}` on `subject`.
    pub fn rows(self: &Arc<Self>, subject: &str, n: usize) -> Vec<FakeDelivery> {
        let s: Arc<str> = Arc::from(subject);
        (0..n)
            .map(|i| self.delivery(&s, format!("{{\"n\":{i}}}")))
            .collect()
    }

    pub(super) fn push(&self, seq: u64, e: Event) {
        match e {
            Event::Acked | Event::AckedConfirmed | Event::Split(_) => &self.acks,
            Event::Naked(_) => &self.naks,
            Event::Parked(_) | Event::ParkedRow(..) => &self.parks,
            Event::DroppedUnsettled => &self.dropped,
            _ => {
                if self.record {
                    self.events.lock().unwrap().push((seq, e));
                }
                return;
            }
        }
        .fetch_add(1, Ordering::Relaxed);
        if self.record {
            self.events.lock().unwrap().push((seq, e));
        }
    }

    pub fn events(&self) -> Vec<(u64, Event)> {
        self.events.lock().unwrap().clone()
    }

    pub fn acked(&self) -> u64 {
        count(&self.acks)
    }
    pub fn naked(&self) -> u64 {
        count(&self.naks)
    }
    pub fn parked(&self) -> u64 {
        count(&self.parks)
    }
    pub fn dropped(&self) -> u64 {
        count(&self.dropped)
    }
    /// Rows settled one way or another (acked, naked, parked, dropped).
    pub fn settled(&self) -> u64 {
        self.acked() + self.naked() + self.parked() + self.dropped()
    }

    pub fn nak_delays(&self) -> Vec<(u64, Duration)> {
        self.events()
            .into_iter()
            .filter_map(|(s, e)| match e {
                Event::Naked(d) => Some((s, d)),
                _ => None,
            })
            .collect()
    }

    pub fn parkings(&self) -> Vec<(u64, Parking)> {
        self.events()
            .into_iter()
            .filter_map(|(s, e)| match e {
                Event::Parked(p) | Event::ParkedRow(_, p) => Some((s, p)),
                _ => None,
            })
            .collect()
    }

    /// The terminal events of one delivery.
    pub fn terminal(&self, seq: u64) -> Vec<Event> {
        self.events()
            .into_iter()
            .filter(|(s, e)| *s == seq && e.terminal())
            .map(|(_, e)| e)
            .collect()
    }

    /// Every delivery made so far was settled exactly once. Returns the offenders.
    pub fn not_settled_once(&self) -> Vec<(u64, usize)> {
        let made = self.next_seq.load(Ordering::Relaxed);
        let mut counts = vec![0usize; made as usize + 1];
        for (s, e) in self.events() {
            if e.terminal() {
                counts[s as usize] += 1;
            }
        }
        counts
            .iter()
            .enumerate()
            .skip(1)
            .filter(|(_, c)| **c != 1)
            .map(|(s, c)| (s as u64, *c))
            .collect()
    }
}

/// A recording delivery. Dropped unsettled, it records `DroppedUnsettled` (where the
/// real adapter naks it).
#[derive(Debug)]
pub struct FakeDelivery {
    pub seq: u64,
    pub deliveries: u64,
    subject: Arc<str>,
    payload: Bytes,
    journal: Arc<Journal>,
    settled: bool,
    /// Moved on by `progress()`.
    alive_since: Mutex<tokio::time::Instant>,
    /// When it was made (delivered).
    received_at: tokio::time::Instant,
    /// Published to the DLQ whole (`park_message`): its ack is recorded as
    /// [`Event::Parked`], as [`Delivery::park`] records it.
    parked_whole: Mutex<Option<Parking>>,
    /// What its split's record says of it, when it is a part of a message split by
    /// shard ([`FakeDelivery::as_part`]).
    part: Option<Result<PartCopy, SettleError>>,
    /// See [`Delivery::undecodable`].
    undecodable: Option<String>,
}

impl FakeDelivery {
    /// A part of a split message that its split's record judges `judged`.
    pub fn as_part(mut self, judged: Result<PartCopy, SettleError>) -> Self {
        self.part = Some(judged);
        self
    }

    /// A delivery whose payload the adapter could not decode, for `reason`.
    pub fn undecodable(mut self, reason: &str) -> Self {
        self.undecodable = Some(reason.to_owned());
        self
    }

    fn settle(mut self, e: Event) {
        self.settled = true;
        let e = match (&e, self.parked_whole.lock().unwrap().take()) {
            (Event::Acked | Event::AckedConfirmed, Some(parking)) => Event::Parked(parking),
            _ => e,
        };
        self.journal.push(self.seq, e);
    }
}

impl Drop for FakeDelivery {
    fn drop(&mut self) {
        if !self.settled {
            self.journal.push(self.seq, Event::DroppedUnsettled);
        }
    }
}

impl Delivery for FakeDelivery {
    fn payload(&self) -> &Bytes {
        &self.payload
    }

    fn undecodable(&self) -> Option<&str> {
        self.undecodable.as_deref()
    }

    fn subject(&self) -> &str {
        &self.subject
    }

    fn meta(&self) -> DeliveryMeta {
        DeliveryMeta {
            subject: self.subject.to_string(),
            stream_sequence: self.seq,
            deliveries: self.deliveries,
        }
    }

    fn position(&self) -> Position {
        Position {
            stream_sequence: self.seq,
            deliveries: self.deliveries,
        }
    }

    async fn ack(self) -> Result<(), SettleError> {
        self.settle(Event::Acked);
        Ok(())
    }

    async fn ack_confirmed(self) -> Result<(), SettleError> {
        self.settle(Event::AckedConfirmed);
        Ok(())
    }

    fn is_split_part(&self) -> bool {
        self.part.is_some()
    }

    async fn judge_part(&self) -> Result<PartCopy, SettleError> {
        self.part.clone().unwrap_or(Ok(PartCopy::Counted))
    }

    async fn park_row(&self, line: u32, _row: Bytes, parking: &Parking) -> Result<(), SettleError> {
        if self.journal.dlq_fails.load(Ordering::Relaxed) {
            self.journal
                .push(self.seq, Event::ParkFailed(parking.clone()));
            return Err(SettleError("DLQ full".into()));
        }
        self.journal
            .push(self.seq, Event::ParkedRow(line, parking.clone()));
        Ok(())
    }

    async fn park_message(&self, parking: &Parking) -> Result<(), SettleError> {
        if self.journal.dlq_fails.load(Ordering::Relaxed) {
            self.journal
                .push(self.seq, Event::ParkFailed(parking.clone()));
            return Err(SettleError("DLQ full".into()));
        }
        *self.parked_whole.lock().unwrap() = Some(parking.clone());
        Ok(())
    }

    fn progress(
        &self,
    ) -> impl std::future::Future<Output = Result<(), SettleError>> + Send + 'static {
        let (journal, seq) = (self.journal.clone(), self.seq);
        *self.alive_since.lock().unwrap() = tokio::time::Instant::now();
        async move {
            if journal.progress_hangs.load(Ordering::Relaxed) {
                std::future::pending::<()>().await;
            }
            journal.push(seq, Event::Progress);
            Ok(())
        }
    }

    fn alive_since(&self) -> tokio::time::Instant {
        *self.alive_since.lock().unwrap()
    }

    fn received_at(&self) -> tokio::time::Instant {
        self.received_at
    }

    async fn nak(self, delay: Duration) -> Result<(), SettleError> {
        self.settle(Event::Naked(delay));
        Ok(())
    }

    async fn split(self, parts: Vec<(usize, Bytes)>) -> Result<(), (Self, SettleError)> {
        self.settle(Event::Split(parts));
        Ok(())
    }

    async fn park(self, parking: &Parking) -> Result<(), (Self, SettleError)> {
        if self.journal.dlq_fails.load(Ordering::Relaxed) {
            self.journal
                .push(self.seq, Event::ParkFailed(parking.clone()));
            return Err((self, SettleError("DLQ full".into())));
        }
        self.settle(Event::Parked(parking.clone()));
        Ok(())
    }
}

fn count(counter: &AtomicU64) -> u64 {
    counter.load(Ordering::Relaxed)
}
