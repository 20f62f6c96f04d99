//! The ingest stream: a JetStream work queue with one durable pull consumer that every
//! instance pulls from, and the DLQ beside it.
//!
//! Faithful to what the ledger relies on: a delivered message is leased for `ack_wait`
//! (renewed by progress) and delivered again, to whoever pulls, once the lease runs
//! out; an ack removes the message by its stream sequence, whoever sends it (a holder
//! whose lease ran out too); a nak frees only the delivery it answers, after its
//! delay; a connection that drops loses the acks sent on it (the later confirmed ack
//! fails with them: JetStream handles one connection's acks in order); a consumer
//! leader change hands every unacked delivery out again at once.
//!
//! The queue may be in partitions (1 to 3 streams, each with its consumer: one source
//! each): a message is named as the adapter names it (`Position::in_partition`), and
//! a partition's acks can be lost on their own (the route to its consumer's leader),
//! failing only that partition's confirmed ack.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use sluice_actors::{
    Delivery, DeliveryMeta, Parking, Position, SettleError, Source, SourceError, SourceFactory,
};
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::coverage::{Coverage, Reached};
use crate::dice::Dice;
use crate::net::{Link, Port};
use crate::store::SimStore;

/// How long an empty pull waits for messages before it returns (the consumer looks
/// around in between).
const PULL_WAIT: Duration = Duration::from_millis(500);

pub struct Stream {
    state: Mutex<State>,
    /// The queue's partitions.
    pub partitions: usize,
    /// A message became available.
    arrived: Notify,
    pub ack_wait: Duration,
    pub dice: Dice,
    pub cov: Arc<Coverage>,
    /// How likely a confirmed ack, applied, loses its answer.
    pub ack_answer_lost: f64,
}

#[derive(Default)]
struct State {
    /// Each partition's last stream sequence.
    last_seq: Vec<u64>,
    messages: BTreeMap<u64, Message>,
    /// Rows published to the DLQ: (stream sequence, line; `None`: the whole message).
    dlq: Vec<(u64, Option<u32>)>,
}

struct Message {
    subject: Arc<str>,
    payload: Bytes,
    deliveries: u64,
    lease: Lease,
}

enum Lease {
    /// To be delivered from `at` on.
    Free { at: Instant },
    /// Delivered to `host`'s instance, until `until` (then to be delivered again).
    Held { host: usize, until: Instant },
}

/// One message handed to a puller.
struct Handed {
    seq: u64,
    deliveries: u64,
    subject: Arc<str>,
    payload: Bytes,
}

impl Stream {
    pub fn new(
        partitions: usize,
        ack_wait: Duration,
        dice: Dice,
        cov: Arc<Coverage>,
        ack_answer_lost: f64,
    ) -> Self {
        Self {
            state: Mutex::new(State {
                last_seq: vec![0; partitions.max(1)],
                ..State::default()
            }),
            partitions: partitions.max(1),
            arrived: Notify::new(),
            ack_wait,
            dice,
            cov,
            ack_answer_lost,
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Publish a message (accepted: JetStream stored it) into a partition the dice
    /// pick; returns its name in the queue.
    pub fn publish(&self, subject: &str, payload: String) -> u64 {
        let partition = self.dice.below(self.partitions as u64) as usize;
        let mut s = self.state();
        s.last_seq[partition] += 1;
        let seq = Position::in_partition(partition, s.last_seq[partition]);
        s.messages.insert(
            seq,
            Message {
                subject: Arc::from(subject),
                payload: Bytes::from(payload),
                deliveries: 0,
                lease: Lease::Free { at: Instant::now() },
            },
        );
        drop(s);
        self.arrived.notify_waiters();
        seq
    }

    /// Up to `max` messages of `partition` whose turn has come, leased to `host`.
    fn take(&self, host: usize, max: usize, partition: usize) -> Vec<Handed> {
        let now = Instant::now();
        let until = now + self.ack_wait;
        let mut s = self.state();
        let mut out = Vec::new();
        let range = Position::in_partition(partition, 0)..Position::in_partition(partition + 1, 0);
        for (seq, m) in s.messages.range_mut(range) {
            if out.len() >= max {
                break;
            }
            let due = match m.lease {
                Lease::Free { at } => at <= now,
                Lease::Held { until, .. } => {
                    let due = until <= now;
                    if due {
                        self.cov.hit(Reached::Redelivered);
                    }
                    due
                }
            };
            if !due {
                continue;
            }
            m.deliveries += 1;
            m.lease = Lease::Held { host, until };
            self.cov.trace(&[2, *seq, host as u64, m.deliveries]);
            out.push(Handed {
                seq: *seq,
                deliveries: m.deliveries,
                subject: m.subject.clone(),
                payload: m.payload.clone(),
            });
        }
        out
    }

    /// When the next message not due now comes due (a nak's delay, a lease).
    fn next_due(&self) -> Option<Instant> {
        self.state()
            .messages
            .values()
            .map(|m| match m.lease {
                Lease::Free { at } => at,
                Lease::Held { until, .. } => until,
            })
            .min()
    }

    fn ack(&self, seq: u64, host: usize) {
        let mut s = self.state();
        self.cov.trace(&[3, seq, host as u64]);
        if let Some(m) = s.messages.remove(&seq) {
            if let Lease::Held { host: holder, .. } = m.lease {
                if holder != host {
                    self.cov.hit(Reached::StaleAck);
                }
            }
        }
    }

    fn nak(&self, seq: u64, deliveries: u64, delay: Duration) {
        let mut s = self.state();
        if let Some(m) = s.messages.get_mut(&seq) {
            if m.deliveries == deliveries && matches!(m.lease, Lease::Held { .. }) {
                m.lease = Lease::Free {
                    at: Instant::now() + delay,
                };
            }
        }
        drop(s);
        if delay.is_zero() {
            self.arrived.notify_waiters();
        }
    }

    /// Progress is taken by stream sequence: it renews whoever's lease it is.
    /// A progress for delivery `deliveries` of message `seq`: renews the lease of its
    /// holder, whoever that is now (nats-server renews by stream sequence); returns
    /// whether the lease renewed is that delivery's.
    fn progress(&self, seq: u64, deliveries: u64) -> bool {
        let until = Instant::now() + self.ack_wait;
        let Some(m) = self.state().messages.get_mut(&seq).map(|m| {
            if let Lease::Held { until: u, .. } = &mut m.lease {
                *u = until;
            }
            m.deliveries == deliveries && matches!(m.lease, Lease::Held { .. })
        }) else {
            return false;
        };
        m
    }

    fn park(&self, seq: u64, line: Option<u32>) {
        self.state().dlq.push((seq, line));
        self.cov.hit(Reached::RowsParked);
    }

    /// A new consumer leader: every unacked delivery goes out again now.
    pub fn leader_change(&self) {
        let now = Instant::now();
        for m in self.state().messages.values_mut() {
            if let Lease::Held { .. } = m.lease {
                m.lease = Lease::Free { at: now };
            }
        }
        self.arrived.notify_waiters();
    }

    /// A message's payload while it is in the stream (`None`: acked, gone).
    pub fn payload(&self, seq: u64) -> Option<Bytes> {
        self.state().messages.get(&seq).map(|m| m.payload.clone())
    }

    /// Partition `partition`'s consumer's ack floor and its stream's first sequence.
    pub fn floor(&self, partition: usize) -> (u64, u64) {
        let s = self.state();
        let range = Position::in_partition(partition, 0)..Position::in_partition(partition + 1, 0);
        let last = s.last_seq.get(partition).copied().unwrap_or(0);
        match s.messages.range(range).next() {
            Some((first, _)) => {
                let first = Position::sequence_of(*first);
                (first - 1, first)
            }
            None => (last, last + 1),
        }
    }

    /// Messages of `partition` in the stream.
    fn held_in(&self, partition: usize) -> usize {
        let range = Position::in_partition(partition, 0)..Position::in_partition(partition + 1, 0);
        self.state().messages.range(range).count()
    }

    pub fn is_empty(&self) -> bool {
        self.state().messages.is_empty()
    }

    pub fn left(&self) -> Vec<u64> {
        self.state().messages.keys().copied().collect()
    }

    pub fn parked(&self) -> Vec<(u64, Option<u32>)> {
        self.state().dlq.clone()
    }
}

/// One delivered message, as the real adapter behaves (`src/nats/delivery/`).
pub struct SimDelivery {
    seq: u64,
    deliveries: u64,
    subject: Arc<str>,
    payload: Bytes,
    stream: Arc<Stream>,
    port: Port,
    /// When the stream last heard of this delivery (shared with progress in flight).
    alive_since: Arc<Mutex<Instant>>,
    /// When it was handed to this host.
    received_at: Instant,
    settled: bool,
}

impl SimDelivery {
    fn host(&self) -> usize {
        self.port.host.index
    }

    /// Its acks are lost now: the connection's, or its partition's route.
    fn dropping(&self) -> bool {
        let partition = Position::partition_of(self.seq);
        self.port.host.dropping_acks.load(Ordering::Relaxed)
            || self.port.host.dropping_partitions.load(Ordering::Relaxed) & (1 << partition) != 0
    }

    /// Ack once the link lets it (lost with a dropping connection: `Ok` all the same,
    /// as a fire-and-forget publish is).
    async fn send_ack(&mut self) -> Result<(), SettleError> {
        self.settled = true;
        self.port.over(Link::Stream).await.map_err(SettleError)?;
        if !self.dropping() {
            self.stream.ack(self.seq, self.host());
        }
        Ok(())
    }
}

impl Drop for SimDelivery {
    fn drop(&mut self) {
        // The real adapter naks a delivery dropped unsettled; a dead process cannot.
        if !self.settled && self.port.alive() && !self.port.is_cut(Link::Stream) && !self.dropping()
        {
            self.stream.nak(self.seq, self.deliveries, Duration::ZERO);
        }
    }
}

impl Delivery for SimDelivery {
    fn payload(&self) -> &Bytes {
        &self.payload
    }

    fn subject(&self) -> &str {
        &self.subject
    }

    fn meta(&self) -> DeliveryMeta {
        DeliveryMeta {
            subject: self.subject.to_string(),
            stream_sequence: Position::sequence_of(self.seq),
            deliveries: self.deliveries,
        }
    }

    fn position(&self) -> Position {
        Position {
            stream_sequence: self.seq,
            deliveries: self.deliveries,
        }
    }

    async fn ack(mut self) -> Result<(), SettleError> {
        self.send_ack().await
    }

    async fn ack_confirmed(mut self) -> Result<(), SettleError> {
        self.settled = true;
        self.port.over(Link::Stream).await.map_err(SettleError)?;
        if self.dropping() {
            return Err(SettleError("the connection dropped: ack lost".into()));
        }
        self.stream.ack(self.seq, self.host());
        if self.stream.dice.chance(self.stream.ack_answer_lost) {
            return Err(SettleError("the ack's confirmation was lost".into()));
        }
        Ok(())
    }

    fn progress(
        &self,
    ) -> impl std::future::Future<Output = Result<(), SettleError>> + Send + 'static {
        // The port's contract: `alive_since` is when JetStream last heard of the
        // message, so a progress counts once it reached the stream. (The NATS adapter,
        // src/nats/delivery, counts it when handed to the client: an instance cut off
        // from NATS, whose client buffers the publishes, would believe its leases live
        // while JetStream delivers the messages elsewhere.)
        let (port, stream, seq) = (self.port.clone(), self.stream.clone(), self.seq);
        let (deliveries, alive_since) = (self.deliveries, self.alive_since.clone());
        let dropping = self.dropping();
        async move {
            let sent = Instant::now();
            port.over(Link::Stream).await.map_err(SettleError)?;
            if !dropping
                && !port.host.dropping_acks.load(Ordering::Relaxed)
                && stream.progress(seq, deliveries)
            {
                *alive_since.lock().unwrap_or_else(|e| e.into_inner()) = sent;
            }
            Ok(())
        }
    }

    fn alive_since(&self) -> Instant {
        *self.alive_since.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn received_at(&self) -> Instant {
        self.received_at
    }

    async fn nak(mut self, delay: Duration) -> Result<(), SettleError> {
        self.settled = true;
        self.port.over(Link::Stream).await.map_err(SettleError)?;
        if !self.dropping() {
            self.stream.nak(self.seq, self.deliveries, delay);
        }
        Ok(())
    }

    async fn park_row(
        &self,
        line: u32,
        _row: Bytes,
        _parking: &Parking,
    ) -> Result<(), SettleError> {
        self.port.over(Link::Stream).await.map_err(SettleError)?;
        self.stream.park(self.seq, Some(line));
        Ok(())
    }

    async fn park_message(&self, _parking: &Parking) -> Result<(), SettleError> {
        self.port.over(Link::Stream).await.map_err(SettleError)?;
        self.stream.park(self.seq, None);
        Ok(())
    }

    async fn split(self, _parts: Vec<(usize, Bytes)>) -> Result<(), (Self, SettleError)> {
        Err((
            self,
            SettleError("messages split by shard are not simulated".into()),
        ))
    }

    async fn park(mut self, parking: &Parking) -> Result<(), (Self, SettleError)> {
        if let Err(e) = self.park_message(parking).await {
            return Err((self, e));
        }
        let _ = self.send_ack().await;
        Ok(())
    }
}

/// The durable consumer as one instance opens it.
pub struct SimSourceFactory {
    pub stream: Arc<Stream>,
    pub port: Port,
    pub store: Arc<SimStore>,
}

pub struct SimSource {
    stream: Arc<Stream>,
    port: Port,
    store: Arc<SimStore>,
    partition: usize,
}

impl SourceFactory for SimSourceFactory {
    type Source = SimSource;

    fn partitions(&self) -> Option<Vec<String>> {
        (self.stream.partitions > 1).then(|| {
            (0..self.stream.partitions)
                .map(|p| format!("S_{p}"))
                .collect()
        })
    }

    async fn connect(&self, partition: usize) -> Result<SimSource, SourceError> {
        self.port.over(Link::Stream).await.map_err(SourceError)?;
        Ok(SimSource {
            stream: self.stream.clone(),
            port: self.port.clone(),
            store: self.store.clone(),
            partition,
        })
    }
}

impl Source for SimSource {
    type Delivery = SimDelivery;

    async fn pull(&mut self, max: usize) -> Result<Vec<SimDelivery>, SourceError> {
        self.port.over(Link::Stream).await.map_err(SourceError)?;
        // The source does not pull before the store's index holds every record in the
        // bucket (at connect and after every reconnect).
        if !self.store.caught_up() {
            tokio::time::sleep(Duration::from_millis(100)).await;
            return Ok(Vec::new());
        }
        let mut handed = self.stream.take(self.port.host.index, max, self.partition);
        if handed.is_empty() {
            let wake = self
                .stream
                .next_due()
                .map_or(Instant::now() + PULL_WAIT, |at| {
                    at.min(Instant::now() + PULL_WAIT)
                });
            let arrived = self.stream.arrived.notified();
            tokio::select! {
                biased;
                _ = arrived => {}
                _ = tokio::time::sleep_until(wake.max(Instant::now() + Duration::from_millis(1))) => {}
            }
            self.port.over(Link::Stream).await.map_err(SourceError)?;
            handed = self.stream.take(self.port.host.index, max, self.partition);
        }
        let now = Instant::now();
        Ok(handed
            .into_iter()
            .map(|h| SimDelivery {
                seq: h.seq,
                deliveries: h.deliveries,
                subject: h.subject,
                payload: h.payload,
                stream: self.stream.clone(),
                port: self.port.clone(),
                alive_since: Arc::new(Mutex::new(now)),
                received_at: now,
                settled: false,
            })
            .collect())
    }

    async fn pending(&mut self) -> Option<u64> {
        Some(self.stream.held_in(self.partition) as u64)
    }
}
