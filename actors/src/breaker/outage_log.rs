//! Outage logging cadence: WARN when an outage starts, at most every `every` (30 s)
//! while it lasts, INFO with its duration when inserts are taken again.
//!
//! Pure: it decides *whether* to log; the
//! [`ScopedBreaker`](crate::breaker::scoped::ScopedBreaker) writes the line with the
//! target (pool) or the tenant and table fields.

use std::time::Duration;

use tokio::time::Instant;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutageEvent {
    /// WARN: the outage starts.
    Started,
    /// WARN: still down after `lasted`; `suppressed` failures were not logged since.
    Continuing { lasted: Duration, suppressed: u64 },
    /// INFO: inserts are taken again after `lasted`.
    Ended { lasted: Duration },
}

#[derive(Clone, Debug)]
pub struct OutageLog {
    every: Duration,
    started: Option<Instant>,
    last_warn: Option<Instant>,
    suppressed: u64,
}

impl OutageLog {
    pub fn new(every: Duration) -> Self {
        Self {
            every,
            started: None,
            last_warn: None,
            suppressed: 0,
        }
    }

    /// A failure was seen (any failure of the outage, late ones included).
    pub fn on_failure(&mut self, now: Instant) -> Option<OutageEvent> {
        match (self.started, self.last_warn) {
            (None, _) => {
                self.started = Some(now);
                self.last_warn = Some(now);
                self.suppressed = 0;
                Some(OutageEvent::Started)
            }
            (Some(start), Some(last)) if now.saturating_duration_since(last) < self.every => {
                let _ = start;
                self.suppressed += 1;
                None
            }
            (Some(start), _) => {
                self.last_warn = Some(now);
                let suppressed = std::mem::take(&mut self.suppressed);
                Some(OutageEvent::Continuing {
                    lasted: now.saturating_duration_since(start),
                    suppressed,
                })
            }
        }
    }

    /// Inserts are taken again.
    pub fn on_recovered(&mut self, now: Instant) -> Option<OutageEvent> {
        let start = self.started.take()?;
        self.last_warn = None;
        self.suppressed = 0;
        Some(OutageEvent::Ended {
            lasted: now.saturating_duration_since(start),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warn_at_start_at_most_every_30s_info_at_the_end() {
        let mut log = OutageLog::new(Duration::from_secs(30));
        let t0 = Instant::now();
        assert_eq!(log.on_failure(t0), Some(OutageEvent::Started));
        // A failure every second for a minute and a half: WARNs at 30 s and 60 s, 90 s only.
        let mut warns = vec![];
        for s in 1..=90u64 {
            let now = t0 + Duration::from_secs(s);
            if let Some(e) = log.on_failure(now) {
                warns.push((s, e));
            }
        }
        assert_eq!(
            warns,
            vec![
                (
                    30,
                    OutageEvent::Continuing {
                        lasted: Duration::from_secs(30),
                        suppressed: 29
                    }
                ),
                (
                    60,
                    OutageEvent::Continuing {
                        lasted: Duration::from_secs(60),
                        suppressed: 29
                    }
                ),
                (
                    90,
                    OutageEvent::Continuing {
                        lasted: Duration::from_secs(90),
                        suppressed: 29
                    }
                ),
            ]
        );
        assert_eq!(
            log.on_recovered(t0 + Duration::from_secs(95)),
            Some(OutageEvent::Ended {
                lasted: Duration::from_secs(95)
            })
        );
        // Recovering twice logs once; the next outage starts afresh.
        assert_eq!(log.on_recovered(t0 + Duration::from_secs(96)), None);
        assert_eq!(
            log.on_failure(t0 + Duration::from_secs(97)),
            Some(OutageEvent::Started)
        );
    }
}
