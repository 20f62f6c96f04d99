//! Where Debian's `zookeeper` package put ZooKeeper, and the Java that runs it.
//!
//! The server is started as `java -cp <jars> QuorumPeerMain zoo.cfg` rather than through
//! `zkServer.sh`: the script's environment file fixes the log directory to
//! `/var/log/zookeeper` and its config to `/etc/zookeeper`, and nothing of the test's
//! may go there.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use anyhow::{bail, Result};

use crate::process::on_path;

/// The server's jar; its manifest names the jars it needs.
pub const ZOOKEEPER_JAR: &str = "/usr/share/java/zookeeper.jar";

/// Debian's `java` (package default-jre-headless, which `zookeeper` pulls in).
pub const JAVA_BIN: &str = "/usr/bin/java";

/// slf4j's binding that logs to stderr: without a binding ZooKeeper logs nothing. From
/// libslf4j-java, which the `zookeeper` package pulls in.
const LOGGING_JAR: &str = "/usr/share/java/slf4j-simple.jar";

/// slf4j's silent binding, for the one-shot command-line client.
const SILENT_JAR: &str = "/usr/share/java/slf4j-nop.jar";

const INSTALL: &str = "run `apt-get install zookeeper` (it pulls in a Java runtime)";

/// A Java runtime and the ZooKeeper jars.
#[derive(Clone, Debug)]
pub struct Installation {
    pub java: PathBuf,
    pub jar: PathBuf,
}

// === impl Installation ===

impl Installation {
    /// Debian's package, or an error naming it.
    pub fn find() -> Result<Self> {
        let jar = jar()?;
        let java = Some(PathBuf::from(JAVA_BIN))
            .filter(|path| path.is_file())
            .or_else(|| on_path("java"));
        let Some(java) = java else {
            bail!("java is not installed (not at {JAVA_BIN}, not on PATH): {INSTALL}");
        };
        Ok(Self { java, jar })
    }

    /// The class path for the server: the jar and, when installed, a logging binding.
    pub(crate) fn server_classpath(&self) -> OsString {
        self.classpath(LOGGING_JAR)
    }

    /// The class path for the command-line client, which should print only answers.
    pub(crate) fn client_classpath(&self) -> OsString {
        self.classpath(SILENT_JAR)
    }

    fn classpath(&self, binding: &str) -> OsString {
        let mut classpath = self.jar.clone().into_os_string();
        if Path::new(binding).is_file() {
            classpath.push(":");
            classpath.push(binding);
        }
        classpath
    }
}

/// The ZooKeeper jar, or an error naming the package to install (for skipping a test
/// when it is missing).
pub fn jar() -> Result<PathBuf> {
    let jar = PathBuf::from(ZOOKEEPER_JAR);
    if jar.is_file() {
        Ok(jar)
    } else {
        bail!("ZooKeeper is not installed ({ZOOKEEPER_JAR} is missing): {INSTALL}")
    }
}
