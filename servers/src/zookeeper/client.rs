//! Talking to a ZooKeeper: its four-letter commands over a plain socket, and its own
//! command-line client (`ZooKeeperMain`) for the one write needed here, creating a root
//! node, so that no client of ZooKeeper's protocol has to live in this crate.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::install::Installation;
use crate::process::{ManagedProcess, ProcessSpec, ERROR_LOG_LINES};

/// How long one four-letter command may take, connecting included.
const FOUR_LETTER_TIMEOUT: Duration = Duration::from_secs(2);

/// How long the command-line client gets: a JVM start, which takes seconds on a loaded
/// machine.
const CLIENT_DEADLINE: Duration = Duration::from_secs(60);

/// Sends a four-letter command (`srvr`, `ruok`; zoo.cfg allows those) and returns the
/// answer; the server closes the connection after it.
pub(crate) async fn four_letter(addr: SocketAddr, command: &str) -> Result<String> {
    let exchange = async {
        let mut stream = TcpStream::connect(addr)
            .await
            .with_context(|| format!("connecting to ZooKeeper at {addr}"))?;
        stream.write_all(command.as_bytes()).await?;
        let mut answer = String::new();
        stream.read_to_string(&mut answer).await?;
        anyhow::Ok(answer)
    };
    tokio::time::timeout(FOUR_LETTER_TIMEOUT, exchange)
        .await
        .with_context(|| {
            format!("`{command}` to ZooKeeper at {addr} took over {FOUR_LETTER_TIMEOUT:?}")
        })?
        .with_context(|| format!("`{command}` to ZooKeeper at {addr}"))
}

/// Ok once the server serves clients. `ruok` answers `imok` as soon as the port is
/// open, before the server has loaded its data; `srvr` names the mode only once it
/// serves.
pub(crate) async fn serving(addr: SocketAddr) -> Result<()> {
    let answer = four_letter(addr, "srvr").await?;
    if answer.contains("Mode: ") {
        Ok(())
    } else {
        bail!("`srvr` answered {:?}", answer.trim())
    }
}

/// A node path the client can create in one step: `/name`, one level, of letters,
/// digits, `-`, `_` and `.`.
pub(crate) fn check_root_path(path: &str) -> Result<()> {
    let name = path.strip_prefix('/').unwrap_or_default();
    let valid = !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if !valid {
        bail!(
            "ZooKeeper root {path:?}: expected `/name`, one level, of letters, digits, \
             `-`, `_` and `.`"
        );
    }
    Ok(())
}

/// Creates the empty persistent node `path` (open to all, like any node the CLI
/// makes), unless it exists. Its output goes to `log_dir`.
pub(crate) async fn create_node(
    install: &Installation,
    addr: SocketAddr,
    path: &str,
    log_dir: &Path,
) -> Result<()> {
    check_root_path(path)?;
    let spec = ProcessSpec::new(&install.java)
        .name("zookeeper-cli")
        .args([
            "-XX:+UseSerialGC",
            "-XX:TieredStopAtLevel=1",
            "-XX:-UsePerfData",
        ])
        .arg("-cp")
        .arg(install.client_classpath())
        .arg("org.apache.zookeeper.ZooKeeperMain")
        .args(["-server", &addr.to_string(), "create", path]);
    let mut client = ManagedProcess::start(spec, log_dir)?;
    let status = client.wait_exit(CLIENT_DEADLINE).await?;
    if status.success() || client.logs_contain(&format!("Node already exists: {path}")) {
        return Ok(());
    }
    bail!(
        "ZooKeeper's client could not create {path} at {addr} ({status})\n{}",
        client.log_tail(ERROR_LOG_LINES)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_paths_are_one_plain_level() {
        for good in ["/clickhouse", "/clickhouse-123-4", "/a.b_c"] {
            assert!(check_root_path(good).is_ok(), "{good}");
        }
        for bad in ["", "/", "clickhouse", "/a/b", "/a b", "/a;rm", "/é"] {
            let error = check_root_path(bad).err().map(|e| e.to_string());
            assert!(
                error
                    .as_deref()
                    .is_some_and(|e| e.contains("expected `/name`")),
                "{bad:?}: {error:?}"
            );
        }
    }
}
