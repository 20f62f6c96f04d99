//! A tiny shutdown signal (mini-redis style): one `ShutdownTrigger`, any number of
//! `Shutdown` listeners; `recv()` resolves once the trigger fired (or was dropped).

use tokio::sync::watch;

/// The sending half: `trigger()` tells every listener.
#[derive(Debug)]
pub struct ShutdownTrigger {
    tx: watch::Sender<bool>,
}

/// The listening half; clone freely.
#[derive(Clone, Debug)]
pub struct Shutdown {
    rx: watch::Receiver<bool>,
}

pub fn channel() -> (ShutdownTrigger, Shutdown) {
    let (tx, rx) = watch::channel(false);
    (ShutdownTrigger { tx }, Shutdown { rx })
}

impl ShutdownTrigger {
    pub fn trigger(&self) {
        let _ = self.tx.send(true);
    }

    pub fn subscribe(&self) -> Shutdown {
        Shutdown {
            rx: self.tx.subscribe(),
        }
    }
}

impl Shutdown {
    pub fn is_shutdown(&self) -> bool {
        *self.rx.borrow()
    }

    /// Resolves when the trigger fired (immediately if it already had).
    pub async fn recv(&mut self) {
        let _ = self.rx.wait_for(|v| *v).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn every_listener_hears_it() {
        let (t, s) = channel();
        let mut a = s.clone();
        let mut b = t.subscribe();
        assert!(!a.is_shutdown());
        t.trigger();
        a.recv().await;
        b.recv().await;
        assert!(s.is_shutdown());
    }
}
