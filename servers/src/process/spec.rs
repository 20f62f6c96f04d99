//! What to run: program, arguments, environment. Kept after the first start so a
//! stopped or killed child can be started again exactly as it was.

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};

/// A recipe for a child process.
#[derive(Clone, Debug)]
pub struct ProcessSpec {
    pub(crate) name: String,
    pub(crate) program: PathBuf,
    pub(crate) args: Vec<OsString>,
    pub(crate) env: Vec<(OsString, OsString)>,
    pub(crate) env_remove: Vec<OsString>,
    pub(crate) current_dir: Option<PathBuf>,
    /// Log files the program writes itself (ClickHouse's server.log), shown in tails.
    pub(crate) log_files: Vec<PathBuf>,
}

// === impl ProcessSpec ===

impl ProcessSpec {
    /// Runs `program`; the child is named after the program's file name in errors.
    pub fn new(program: impl AsRef<Path>) -> Self {
        let program = program.as_ref().to_path_buf();
        let name = program
            .file_name()
            .map(|name| name.to_string_lossy().into_owned())
            .unwrap_or_else(|| program.display().to_string());
        Self {
            name,
            program,
            args: Vec::new(),
            env: Vec::new(),
            env_remove: Vec::new(),
            current_dir: None,
            log_files: Vec::new(),
        }
    }

    /// The name used in errors and log file names.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    pub fn arg(mut self, arg: impl AsRef<OsStr>) -> Self {
        self.args.push(arg.as_ref().to_os_string());
        self
    }

    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.args
            .extend(args.into_iter().map(|arg| arg.as_ref().to_os_string()));
        self
    }

    /// Sets one variable; the rest of the environment is inherited.
    pub fn env(mut self, key: impl AsRef<OsStr>, value: impl AsRef<OsStr>) -> Self {
        self.env
            .push((key.as_ref().to_os_string(), value.as_ref().to_os_string()));
        self
    }

    pub fn envs<I, K, V>(mut self, vars: I) -> Self
    where
        I: IntoIterator<Item = (K, V)>,
        K: AsRef<OsStr>,
        V: AsRef<OsStr>,
    {
        for (key, value) in vars {
            self = self.env(key, value);
        }
        self
    }

    /// Removes one inherited variable.
    pub fn env_remove(mut self, key: impl AsRef<OsStr>) -> Self {
        self.env_remove.push(key.as_ref().to_os_string());
        self
    }

    pub fn current_dir(mut self, dir: impl AsRef<Path>) -> Self {
        self.current_dir = Some(dir.as_ref().to_path_buf());
        self
    }

    /// A log file the program writes itself, so that tails and searches include it.
    pub fn log_file(mut self, path: impl AsRef<Path>) -> Self {
        self.log_files.push(path.as_ref().to_path_buf());
        self
    }

    pub fn program(&self) -> &Path {
        &self.program
    }

    pub fn get_args(&self) -> &[OsString] {
        &self.args
    }

    pub fn get_name(&self) -> &str {
        &self.name
    }

    /// The command line as one string, for error messages.
    pub fn display(&self) -> String {
        let mut line = self.program.display().to_string();
        for arg in &self.args {
            line.push(' ');
            line.push_str(&arg.to_string_lossy());
        }
        line
    }
}

/// The first file called `name` in a directory of `PATH`, for finding a server's binary
/// where its package did not put it.
pub fn on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
}
