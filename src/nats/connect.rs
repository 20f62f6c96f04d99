//! The NATS connection, with the configured credentials, to the first seed server that
//! answers (`[nats] url`: one server, or several nodes of a cluster).

use std::time::Duration;

use anyhow::Context as _;

use crate::config::{NatsAuth, NatsConfig};

/// How often the client pings a quiet server. Three pings unanswered and the connection
/// is taken for dead and replaced (through another seed, or a server the cluster
/// announced): a server frozen with its socket open (SIGSTOP, a paused VM) is left
/// within about three times this, not the client's default of three minutes, and
/// the pull, the publishes and the manifest watch move to a live node.
pub const PING_INTERVAL: Duration = Duration::from_secs(2);

/// Connect to NATS. With `retry_initial`, a server that is not up yet is retried in the
/// background (Sluice starts, reports not-ready, and connects when NATS comes); without
/// it a failure is returned at once (CLI tools, tests).
pub async fn connect(
    config: &NatsConfig,
    retry_initial: bool,
) -> anyhow::Result<async_nats::Client> {
    let mut options = async_nats::ConnectOptions::new()
        .name("sluice")
        .connection_timeout(Duration::from_secs(5))
        .request_timeout(Some(Duration::from_secs(10)))
        // The client's command queue: acks of a 10,000-row batch go through it at once.
        .client_capacity(65_536)
        .subscription_capacity(65_536)
        .ping_interval(PING_INTERVAL)
        .max_reconnects(None)
        .reconnect_delay_callback(|attempts| {
            // 100 ms doubling to 5 s: a restarted nats-server is picked up quickly.
            let exp = attempts.min(6) as u32;
            Duration::from_millis(100u64 << exp).min(Duration::from_secs(5))
        });
    options = match &config.auth {
        NatsAuth::None => options,
        NatsAuth::UserPassword { user, password } => {
            options.user_and_password(user.clone(), password.expose().to_string())
        }
        NatsAuth::Token(token) => options.token(token.expose().to_string()),
        NatsAuth::CredsFile(path) => options
            .credentials_file(path)
            .await
            .with_context(|| format!("reading NATS credentials file {}", path.display()))?,
    };
    if retry_initial {
        options = options.retry_on_initial_connect();
    }
    options
        .connect(config.seeds.as_slice())
        .await
        .with_context(|| format!("connecting to NATS at {}", config.seeds_text()))
}

/// Wait up to `deadline` for the background connection (see `retry_initial`).
pub async fn wait_connected(client: &async_nats::Client, deadline: Duration) -> bool {
    let until = tokio::time::Instant::now() + deadline;
    loop {
        if client.connection_state() == async_nats::connection::State::Connected {
            return true;
        }
        if tokio::time::Instant::now() >= until {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
