//! What lies between one instance and the servers: its host (partitions, a freeze, its
//! NATS connection) and its life (a crash ends it). Every fake asks its port before it
//! answers an instance: a crashed life is answered nothing, ever (its futures never
//! complete, its dropped deliveries hand nothing back), a frozen host waits, a cut link
//! fails after a client's timeout.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::dice::Dice;

/// One machine an instance runs on, across its restarts.
#[derive(Default)]
pub struct Host {
    pub index: usize,
    /// Cut from the NATS server (the stream and the bucket).
    pub cut_nats: AtomicBool,
    /// Cut from the bucket's leader only (a NATS cluster): the stream still answers.
    pub cut_kv: AtomicBool,
    /// Cut from ClickHouse.
    pub cut_ch: AtomicBool,
    /// Stopped (SIGSTOP, a VM paused): nothing it sends leaves until it goes on.
    pub frozen: AtomicBool,
    /// Acks sent now are lost with the connection (which is made again after).
    pub dropping_acks: AtomicBool,
    /// Acks of these queue partitions (a bit each) sent now are lost on their way to
    /// the partition's consumer leader (a route between NATS servers dropped), while the
    /// other partitions' acks go through.
    pub dropping_partitions: AtomicU64,
    /// The NATS client's connection count (a reconnect after a cut or a drop).
    pub connects: AtomicU64,
    /// How long the bucket's watch takes to show a write here.
    pub watch_lag_ms: AtomicU64,
}

/// One run of an instance: gone for good once crashed.
#[derive(Default)]
pub struct Life {
    pub crashed: AtomicBool,
}

/// Which link a call goes over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Link {
    Stream,
    Kv,
    ClickHouse,
}

#[derive(Clone)]
pub struct Port {
    pub host: Arc<Host>,
    pub life: Arc<Life>,
    pub dice: Dice,
}

impl Port {
    pub fn alive(&self) -> bool {
        !self.life.crashed.load(Ordering::Relaxed)
    }

    pub fn connects(&self) -> u64 {
        self.host.connects.load(Ordering::Relaxed)
    }

    pub fn is_cut(&self, link: Link) -> bool {
        let h = &self.host;
        match link {
            Link::Stream => h.cut_nats.load(Ordering::Relaxed),
            Link::Kv => h.cut_nats.load(Ordering::Relaxed) || h.cut_kv.load(Ordering::Relaxed),
            Link::ClickHouse => h.cut_ch.load(Ordering::Relaxed),
        }
    }

    /// Before a call over `link`: never returns for a crashed instance, waits while its
    /// host is frozen, and fails (after a client's timeout) while the link is cut.
    pub async fn over(&self, link: Link) -> Result<(), String> {
        loop {
            if !self.alive() {
                std::future::pending::<()>().await;
            }
            if !self.host.frozen.load(Ordering::Relaxed) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        if self.is_cut(link) {
            tokio::time::sleep(self.dice.ms(1, 3000)).await;
            self.dead_end().await;
            return Err(format!("{link:?}: no route (simulated partition)"));
        }
        Ok(())
    }

    /// After a call: a life that crashed meanwhile is answered nothing.
    pub async fn dead_end(&self) {
        if !self.alive() {
            std::future::pending::<()>().await;
        }
    }
}
