//! SIGTERM and SIGINT, and a tiny `Shutdown` for the listeners.

use tokio::sync::watch;

/// Resolves with the signal's name when SIGTERM or SIGINT arrives.
pub async fn wait() -> &'static str {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) {
            (Ok(mut term), Ok(mut int)) => tokio::select! {
                _ = term.recv() => "SIGTERM",
                _ = int.recv() => "SIGINT",
            },
            _ => {
                let _ = tokio::signal::ctrl_c().await;
                "SIGINT"
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
        "ctrl-c"
    }
}

/// Told once, heard by every listener (mini-redis style).
#[derive(Clone)]
pub struct Shutdown {
    tx: watch::Sender<bool>,
}

impl Shutdown {
    pub fn new() -> Self {
        Self {
            tx: watch::channel(false).0,
        }
    }

    pub fn trigger(&self) {
        self.tx.send_replace(true);
    }

    /// Resolves once `trigger` was called.
    pub async fn wait(&self) {
        let mut rx = self.tx.subscribe();
        let _ = rx.wait_for(|stop| *stop).await;
    }
}

impl Default for Shutdown {
    fn default() -> Self {
        Self::new()
    }
}
