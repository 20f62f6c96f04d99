//! A real ZooKeeper (standalone) on a free loopback port, its data in a temp dir.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Context, Result};
use tempfile::TempDir;

use super::client;
use super::install::Installation;
use crate::ports::free_port;
use crate::process::{server_lifecycle, start_ready, ManagedProcess, ProcessSpec};

/// How long a (re)started ZooKeeper gets to serve: a JVM start, about half a second on
/// an idle 2-core machine and several times that under a parallel build.
pub const ZOOKEEPER_READY_DEADLINE: Duration = Duration::from_secs(60);

/// Roots handed out by [`ZooKeeper::new_root`] in this process.
static ROOTS: AtomicU64 = AtomicU64::new(0);

/// A running standalone ZooKeeper whose data lives in a temp dir removed on drop
/// (after the process is killed).
#[derive(Debug)]
pub struct ZooKeeper {
    // Field order matters: the process is killed before its directory is removed.
    process: ManagedProcess,
    install: Installation,
    port: u16,
    dir: TempDir,
}

/// A node of a ZooKeeper that a ClickHouse uses as its root (`<zookeeper><root>`): the
/// paths of its Replicated tables live under it, apart from any other ClickHouse's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ZooKeeperRoot {
    pub addr: SocketAddr,
    /// `/name`: ClickHouse refuses to start its ZooKeeper session if it is missing.
    pub path: String,
}

// === impl ZooKeeper ===

impl ZooKeeper {
    /// Starts ZooKeeper from Debian's package and waits until it serves clients.
    pub async fn start() -> Result<Self> {
        let install = Installation::find()?;
        let dir = tempfile::Builder::new()
            .prefix("sluice-zookeeper-")
            .tempdir()
            .context("creating a temp dir for ZooKeeper")?;
        let data = dir.path().join("data");
        std::fs::create_dir_all(&data).with_context(|| format!("creating {}", data.display()))?;

        let prepare = || {
            let port = free_port()?;
            let config = dir.path().join("zoo.cfg");
            std::fs::write(&config, zoo_cfg(&data, port))
                .with_context(|| format!("writing {}", config.display()))?;
            Ok((server_spec(&install, &config), port))
        };
        let check = |&port: &u16| client::serving(loopback(port));
        let logs = dir.path().join("logs");
        let (process, port) =
            start_ready("zookeeper", &logs, ZOOKEEPER_READY_DEADLINE, prepare, check).await?;
        Ok(Self {
            process,
            install,
            port,
            dir,
        })
    }

    /// Polls `srvr` until the server serves, failing early (with the log tail) if the
    /// JVM exits.
    async fn wait_ready(&mut self) -> Result<()> {
        let addr = self.addr();
        self.process
            .wait_ready("zookeeper", ZOOKEEPER_READY_DEADLINE, || {
                client::serving(addr)
            })
            .await
    }

    /// Sends a four-letter command (`srvr` or `ruok`) and returns the answer.
    pub async fn four_letter(&self, command: &str) -> Result<String> {
        client::four_letter(self.addr(), command).await
    }

    /// Creates `path` (`/name`, one level) unless it exists, and returns it as a root
    /// for a ClickHouse. Two ClickHouses given the same root are replicas of each
    /// other's Replicated tables (with different `{replica}` macros).
    pub async fn root(&self, path: &str) -> Result<ZooKeeperRoot> {
        client::create_node(
            &self.install,
            self.addr(),
            path,
            &self.dir.path().join("logs"),
        )
        .await?;
        Ok(ZooKeeperRoot {
            addr: self.addr(),
            path: path.to_owned(),
        })
    }

    /// A root no other ClickHouse of this process was given (`/clickhouse-<pid>-<n>`),
    /// created: see [`ZooKeeper::root`].
    pub async fn new_root(&self) -> Result<ZooKeeperRoot> {
        let n = ROOTS.fetch_add(1, Ordering::Relaxed);
        self.root(&format!("/clickhouse-{}-{n}", std::process::id()))
            .await
    }

    /// `127.0.0.1:PORT`, the client port.
    pub fn addr(&self) -> SocketAddr {
        loopback(self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The temp dir with zoo.cfg, the data and the logs.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    // --- lifecycle ---

    server_lifecycle!();
}

fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from((Ipv4Addr::LOCALHOST, port))
}

/// The JVM kept small and quick to start: one GC thread set, the client compiler only,
/// no perf-data file in /tmp, a heap cap well below the JVM's default quarter of RAM.
fn server_spec(install: &Installation, config: &Path) -> ProcessSpec {
    ProcessSpec::new(&install.java)
        .name("zookeeper")
        .args([
            "-Xmx256m",
            "-XX:+UseSerialGC",
            "-XX:TieredStopAtLevel=1",
            "-XX:-UsePerfData",
            "-XX:+ExitOnOutOfMemoryError",
        ])
        .arg("-cp")
        .arg(install.server_classpath())
        .arg("org.apache.zookeeper.server.quorum.QuorumPeerMain")
        .arg(config)
}

/// Standalone, on 127.0.0.1 only, no admin server (it would take port 8080), the
/// four-letter commands the readiness check and tests use, and no fsync: the data must
/// survive a kill of the process, not of the machine.
fn zoo_cfg(data: &Path, port: u16) -> String {
    format!(
        "tickTime=2000\n\
         dataDir={}\n\
         clientPort={port}\n\
         clientPortAddress=127.0.0.1\n\
         admin.enableServer=false\n\
         4lw.commands.whitelist=srvr,ruok\n\
         maxClientCnxns=0\n\
         forceSync=no\n\
         preAllocSize=4096\n",
        data.display()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_config_listens_on_loopback_with_its_data_in_the_dir() {
        let cfg = zoo_cfg(Path::new("/tmp/z/data"), 12_345);
        for line in [
            "dataDir=/tmp/z/data",
            "clientPort=12345",
            "clientPortAddress=127.0.0.1",
            "admin.enableServer=false",
        ] {
            assert!(
                cfg.lines().any(|l| l == line),
                "{line} missing from:\n{cfg}"
            );
        }
    }
}
