//! The current engine's process: `front.py` (ClickHouse's HTTP interface in front of
//! chdb) run by the Python that has `chdb-core`, on one free loopback port, its data
//! in the server's temp dir.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde_json::{json, Map, Value};

use super::config::{profile_settings, USERS};
use super::flavor::{CHDB_CORE_VERSION, CHDB_PYTHON_ENV};
use crate::process::ProcessSpec;

/// The front's source, written into each server's dir (the test binaries run from
/// anywhere).
const FRONT_PY: &str = include_str!("front.py");

/// The Python to run the front with.
pub(crate) fn python() -> PathBuf {
    std::env::var_os(CHDB_PYTHON_ENV)
        .filter(|path| !path.is_empty())
        .map_or_else(|| PathBuf::from("python3"), PathBuf::from)
}

/// What to install when the front cannot start: part of its start's error.
pub(crate) fn install_hint() -> String {
    format!(
        "the current ClickHouse engine is PyPI's chdb-core {CHDB_CORE_VERSION} run by {} \
         (scripts/test installs it: `python3 -m pip install chdb-core=={CHDB_CORE_VERSION}`; \
         {CHDB_PYTHON_ENV} names another Python)",
        python().display()
    )
}

/// Writes the front into `dir` and returns how to run it on `port` with its data in
/// `dir/data`.
pub(crate) fn spec(dir: &Path, port: u16) -> Result<ProcessSpec> {
    let script = dir.join("front.py");
    if !script.exists() {
        std::fs::write(&script, FRONT_PY)
            .with_context(|| format!("writing {}", script.display()))?;
    }
    let data = dir.join("data");
    std::fs::create_dir_all(&data).with_context(|| format!("creating {}", data.display()))?;
    Ok(ProcessSpec::new(python())
        .name("chdb-front")
        .arg(&script)
        .arg("--port")
        .arg(port.to_string())
        .arg("--data")
        .arg(&data)
        .arg("--users")
        .arg(users_json().to_string())
        .current_dir(dir))
}

/// `{user: {password, settings}}`: the harness's users as the front applies them.
fn users_json() -> Value {
    let mut users = Map::new();
    for user in USERS {
        let settings: Map<String, Value> = profile_settings(user.profile)
            .into_iter()
            .map(|(name, value)| (name.to_owned(), json!(value)))
            .collect();
        users.insert(
            user.name.to_owned(),
            json!({ "password": user.password, "settings": settings }),
        );
    }
    Value::Object(users)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_user_reaches_the_front_with_its_profile() {
        let users = users_json();
        assert_eq!(users["query"]["settings"]["readonly"], "2");
        assert_eq!(
            users["skipping"]["settings"]["input_format_skip_unknown_fields"],
            "1"
        );
        assert_eq!(
            users["skipping"]["settings"]["max_memory_usage"],
            "2000000000"
        );
        assert_eq!(users["ingest"]["password"], "ingest-secret");
    }
}
