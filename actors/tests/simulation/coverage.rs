//! What the seeds reached: one counter per interesting state. A run of seeds that
//! never reaches one of the states [`Reached::MUST`] names fails: the search did not
//! look where the holes were.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

macro_rules! reached {
    ($($name:ident: $text:literal,)*) => {
        /// An interesting state a run reached.
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub enum Reached { $($name,)* }

        impl Reached {
            pub const ALL: &'static [Reached] = &[$(Reached::$name,)*];

            pub fn as_str(self) -> &'static str {
                match self { $(Reached::$name => $text,)* }
            }
        }
    };
}

reached! {
    ClaimConflict: "claim conflict",
    ClaimUnjudged: "claim written, answer lost or unjudged",
    LeaseLost: "claim given up by its claimer",
    CasSuperseded: "compare-and-set superseded",
    SplitRecorded: "split recorded",
    SplitResumed: "split resumed",
    SplitRefused: "availability answer to a retry waited out whole",
    SettledByRecord: "copies settled by a record",
    RecordWithdrawn: "record withdrawn",
    RecordCollected: "record collected",
    ForgetDeferred: "forget deferred to the collector",
    RetryPastWindow: "retry past the dedup window",
    DedupHit: "retry deduplicated",
    Availability: "availability answer (252/241)",
    CommittedAnswerLost: "committed, answer lost",
    RejectedRows: "rows rejected",
    RowsParked: "rows parked",
    KvAnswerLost: "kv write applied, answer lost",
    StaleAck: "ack from a holder whose lease ran out",
    Redelivered: "redelivered after ack_wait",
    Crash: "instance crashed",
    Freeze: "instance frozen",
    Partition: "partition",
    LostAcks: "acks lost with a connection",
    LeaderChange: "consumer leader change",
    WatchLag: "kv watch lagging",
    ClockJump: "clock jump",
    BatchAcrossStreams: "a batch across queue partitions",
    PartitionAcksLost: "one queue partition's acks lost",
}

impl Reached {
    /// The states a CI run of seeds must reach.
    pub const MUST: &'static [Reached] = &[
        Reached::ClaimConflict,
        Reached::ClaimUnjudged,
        Reached::LeaseLost,
        Reached::CasSuperseded,
        Reached::SplitRecorded,
        Reached::SplitResumed,
        Reached::SplitRefused,
        Reached::SettledByRecord,
        Reached::RecordWithdrawn,
        Reached::RetryPastWindow,
        Reached::DedupHit,
        Reached::CommittedAnswerLost,
        Reached::RowsParked,
        Reached::KvAnswerLost,
        Reached::StaleAck,
        Reached::Crash,
        Reached::Freeze,
        Reached::LostAcks,
        Reached::LeaderChange,
        Reached::BatchAcrossStreams,
        Reached::PartitionAcksLost,
    ];
}

/// The counters of one run (or the sum of many), and the run's trace: a hash of what
/// the servers saw, in order (a seed that replays exactly has the same).
#[derive(Default)]
pub struct Coverage {
    counts: [AtomicU64; 32],
    trace: AtomicU64,
}

impl Coverage {
    /// Fold one thing the servers saw into the trace.
    pub fn trace(&self, what: &[u64]) {
        log(format_args!("{what:?}"));
        let mut h = self.trace.load(Ordering::Relaxed) ^ 0xcbf2_9ce4_8422_2325;
        for w in what {
            h ^= *w;
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        self.trace.store(h, Ordering::Relaxed);
    }

    /// A string as the trace takes it.
    pub fn text(s: &str) -> u64 {
        s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        })
    }

    pub fn digest(&self) -> u64 {
        self.trace.load(Ordering::Relaxed)
    }

    pub fn hit(&self, what: Reached) {
        self.counts[what as usize].fetch_add(1, Ordering::Relaxed);
    }

    pub fn get(&self, what: Reached) -> u64 {
        self.counts[what as usize].load(Ordering::Relaxed)
    }

    pub fn add(&self, other: &Coverage) {
        for what in Reached::ALL {
            self.counts[*what as usize].fetch_add(other.get(*what), Ordering::Relaxed);
        }
    }

    /// The states never reached among those that must be.
    pub fn missing(&self) -> Vec<&'static str> {
        Reached::MUST
            .iter()
            .filter(|w| self.get(**w) == 0)
            .map(|w| w.as_str())
            .collect()
    }

    pub fn report(&self) -> String {
        let mut out = String::new();
        for what in Reached::ALL {
            let must = if Reached::MUST.contains(what) {
                "*"
            } else {
                " "
            };
            let _ = writeln!(out, "  {must} {:<48} {}", what.as_str(), self.get(*what));
        }
        out
    }
}

/// With `SIM_TRACE` set, print what happened and when (a replayed seed, followed).
pub fn log(what: std::fmt::Arguments<'_>) {
    if std::env::var_os("SIM_TRACE").is_some() {
        static START: std::sync::OnceLock<tokio::time::Instant> = std::sync::OnceLock::new();
        let at = START.get_or_init(tokio::time::Instant::now).elapsed();
        eprintln!("TRACE {at:?} {what}");
    }
}
