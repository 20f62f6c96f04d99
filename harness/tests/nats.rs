//! nats-server as the harness runs it: JetStream on, the store surviving stop, kill -9
//! and restart on the same port, SIGSTOP freezing it, and no process left on drop.
//!
//! These run under the flavour `SLUICE_TEST_NATS` names (the test command runs this
//! binary once per flavour); `each_flavour_starts_with_jetstream` starts both.

use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use async_nats::jetstream::{self, stream};
use sluice_harness::{
    available, http_client_builder, process_exists, wait_for, NatsFlavor, NatsServer,
};

const DEADLINE: Duration = Duration::from_secs(10);
const POLL: Duration = Duration::from_millis(20);

/// The flavour of this run, or `None` (with a notice) if its binary is missing.
fn flavor_or_skip(test: &str) -> Result<Option<NatsFlavor>> {
    let flavor = NatsFlavor::from_env()?;
    Ok(available(test, flavor.binary())?.map(|_| flavor))
}

async fn jetstream(server: &NatsServer) -> Result<jetstream::Context> {
    let client = async_nats::ConnectOptions::new()
        .connection_timeout(Duration::from_secs(2))
        .connect(server.url())
        .await
        .with_context(|| format!("connecting to {}", server.url()))?;
    Ok(jetstream::new(client))
}

/// Creates a file-backed stream `name` and publishes `count` acknowledged messages.
async fn stream_with_messages(server: &NatsServer, name: &str, count: u64) -> Result<()> {
    let js = jetstream(server).await?;
    js.create_stream(stream::Config {
        name: name.to_owned(),
        subjects: vec![format!("{name}.>")],
        storage: stream::StorageType::File,
        ..Default::default()
    })
    .await
    .context("creating a stream")?;
    for i in 0..count {
        js.publish(format!("{name}.rows"), format!("row {i}").into())
            .await
            .context("publishing")?
            .await
            .context("waiting for the publish ack")?;
    }
    Ok(())
}

async fn messages_in(server: &NatsServer, name: &str) -> Result<u64> {
    let js = jetstream(server).await?;
    let info = js
        .get_stream(name)
        .await
        .context("looking up the stream")?
        .get_info()
        .await
        .context("reading stream info")?;
    Ok(info.state.messages)
}

#[tokio::test]
async fn starts_with_jetstream_on_a_loopback_port() -> Result<()> {
    let Some(flavor) = flavor_or_skip("starts_with_jetstream_on_a_loopback_port")? else {
        return Ok(());
    };
    let server = NatsServer::start(flavor.clone()).await?;
    assert!(
        server.url().starts_with("nats://127.0.0.1:"),
        "{}",
        server.url()
    );
    assert!(server.jetstream_enabled().await?);
    let jsz = server.jsz().await?;
    let store = jsz["config"]["store_dir"]
        .as_str()
        .context("store_dir in /jsz")?;
    assert!(
        Path::new(store).starts_with(server.store_dir()),
        "{store} is not under {}",
        server.store_dir().display()
    );
    // A set storage limit, not the disk space free when it started: Sluice's default
    // streams (2.25 GiB) fit whatever the machine has left.
    assert_eq!(
        jsz["config"]["max_storage"].as_u64(),
        Some(64 << 30),
        "{jsz}"
    );
    assert_eq!(server.version(), flavor.version()?);
    stream_with_messages(&server, "SMOKE", 2).await?;
    assert_eq!(messages_in(&server, "SMOKE").await?, 2);
    Ok(())
}

#[tokio::test]
async fn each_flavour_starts_with_jetstream() -> Result<()> {
    let mut versions = Vec::new();
    for flavor in [NatsFlavor::Debian, NatsFlavor::Current] {
        let test = format!("each_flavour_starts_with_jetstream ({flavor})");
        if available(&test, flavor.binary())?.is_none() {
            continue;
        }
        let server = NatsServer::start(flavor.clone()).await?;
        assert!(
            server.jetstream_enabled().await?,
            "{flavor}: JetStream is off"
        );
        eprintln!("{flavor}: nats-server {}", server.version());
        versions.push(server.version().to_owned());
    }
    if versions.len() == 2 {
        assert_ne!(
            versions[0], versions[1],
            "both flavours run the same version"
        );
    }
    Ok(())
}

#[tokio::test]
async fn stop_and_start_again_keep_the_store_and_port() -> Result<()> {
    let Some(flavor) = flavor_or_skip("stop_and_start_again_keep_the_store_and_port")? else {
        return Ok(());
    };
    let mut server = NatsServer::start(flavor).await?;
    stream_with_messages(&server, "KEEP", 3).await?;
    let url = server.url();

    // A graceful exit, not the SIGKILL fallback. (2.9.10 exits with status 1 on SIGTERM,
    // current releases with 0: only "it exited by itself" is common to both.)
    let status = server.stop().await?;
    assert_eq!(
        status.signal(),
        None,
        "nats-server ignored SIGTERM: {status}"
    );
    assert!(
        server.log_tail(5).contains("Server Exiting"),
        "{}",
        server.log_tail(20)
    );
    assert!(!server.is_running());
    assert!(
        std::net::TcpStream::connect(server.addr()).is_err(),
        "port still open"
    );

    server.start_again().await?;
    assert_eq!(server.url(), url);
    assert_eq!(messages_in(&server, "KEEP").await?, 3);
    Ok(())
}

#[tokio::test]
async fn kill9_then_start_again_keeps_acknowledged_messages() -> Result<()> {
    let Some(flavor) = flavor_or_skip("kill9_then_start_again_keeps_acknowledged_messages")? else {
        return Ok(());
    };
    let mut server = NatsServer::start(flavor).await?;
    stream_with_messages(&server, "CRASH", 5).await?;
    let status = server.kill9().await?;
    assert!(!status.success());
    server.start_again().await?;
    assert_eq!(messages_in(&server, "CRASH").await?, 5);
    Ok(())
}

#[tokio::test]
async fn sigstop_freezes_and_sigcont_thaws() -> Result<()> {
    let Some(flavor) = flavor_or_skip("sigstop_freezes_and_sigcont_thaws")? else {
        return Ok(());
    };
    let mut server = NatsServer::start(flavor).await?;
    let http = http_client_builder()?
        .timeout(Duration::from_millis(300))
        .build()?;
    let healthz = format!("{}/healthz", server.monitor_url());

    server.sigstop().await?;
    let frozen = http.get(&healthz).send().await;
    assert!(
        frozen.as_ref().is_err_and(reqwest::Error::is_timeout),
        "a frozen server answered: {frozen:?}"
    );
    assert!(server.is_running(), "a stopped process counts as running");

    server.sigcont().await?;
    wait_for("healthz after SIGCONT", DEADLINE, POLL, || async {
        let response = http.get(&healthz).send().await?.error_for_status()?;
        Ok(response.text().await?)
    })
    .await?;
    Ok(())
}

#[tokio::test]
async fn dropping_the_server_kills_its_process() -> Result<()> {
    let Some(flavor) = flavor_or_skip("dropping_the_server_kills_its_process")? else {
        return Ok(());
    };
    let server = NatsServer::start(flavor).await?;
    let pid = server.pid().context("a running server has a pid")?;
    let dir = server.dir().to_path_buf();
    ensure!(process_exists(pid), "pid {pid} gone before drop");
    drop(server);
    // Drop kills and reaps synchronously: no polling needed.
    assert!(!process_exists(pid), "pid {pid} still alive after drop");
    assert!(!dir.exists(), "temp dir {} left behind", dir.display());
    Ok(())
}
