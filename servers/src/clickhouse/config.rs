//! The server and users configuration the harness writes for clickhouse-server.
//!
//! Minimal, every path inside the server's temp dir, listening on 127.0.0.1 only. The
//! `<yandex>` root is what 18.16 requires; current servers accept it as a legacy alias
//! of `<clickhouse>`.

use std::path::Path;

use anyhow::{Context, Result};

/// The unrestricted user (empty password), used by the harness itself.
pub const DEFAULT_USER: &str = "default";
pub const DEFAULT_PASSWORD: &str = "";

/// The user Sluice inserts as (profile `default`).
pub const INGEST_USER: &str = "ingest";
pub const INGEST_PASSWORD: &str = "ingest-secret";

/// The user Sluice's query gateway runs as: profile `readonly` (`readonly=2`: no
/// writes, but per-request settings such as `max_execution_time` are allowed).
pub const QUERY_USER: &str = "query";
pub const QUERY_PASSWORD: &str = "query-secret";

/// A user like `ingest` whose profile defaults `input_format_skip_unknown_fields` to 1,
/// as current ClickHouse releases do: there an insert that pins nothing drops an
/// unknown field silently instead of failing with code 117. Tests use it to prove
/// that Sluice sends the setting explicitly.
pub const SKIPPING_USER: &str = "skipping";
pub const SKIPPING_PASSWORD: &str = "skipping-secret";

/// Ports the server listens on.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Ports {
    pub http: u16,
    pub tcp: u16,
}

/// Writes `config.xml` and `users.xml` into `dir` (data under `dir/data`, logs under
/// `dir/log`) and returns the path of `config.xml`.
pub(crate) fn write(dir: &Path, ports: Ports) -> Result<std::path::PathBuf> {
    for sub in ["log", "data", "tmp", "user_files", "format_schemas"] {
        let path = dir.join(sub);
        std::fs::create_dir_all(&path).with_context(|| format!("creating {}", path.display()))?;
    }
    let config = dir.join("config.xml");
    std::fs::write(&config, server_xml(dir, ports))
        .with_context(|| format!("writing {}", config.display()))?;
    let users = dir.join("users.xml");
    std::fs::write(&users, users_xml()).with_context(|| format!("writing {}", users.display()))?;
    Ok(config)
}

/// The level the servers log at: warnings and errors only (their logs are read when a
/// test fails, and a loaded server's debug lines would slow the runs down).
const LOG_LEVEL: &str = "warning";

/// The level a server restarted after a crash logs at: its metadata load, table by
/// table, so that a start 18.16 refuses names the step that threw.
const DETAILED_LOG_LEVEL: &str = "debug";

/// Makes the server in `dir` log at [`DETAILED_LOG_LEVEL`] from its next start on.
pub(crate) fn log_in_detail(dir: &Path) -> Result<()> {
    let config = dir.join("config.xml");
    let text = std::fs::read_to_string(&config)
        .with_context(|| format!("reading {}", config.display()))?;
    let detailed = text.replacen(
        &format!("<level>{LOG_LEVEL}</level>"),
        &format!("<level>{DETAILED_LOG_LEVEL}</level>"),
        1,
    );
    std::fs::write(&config, detailed).with_context(|| format!("writing {}", config.display()))
}

/// ClickHouse's own log files, for log tails.
pub(crate) fn log_files(dir: &Path) -> [std::path::PathBuf; 2] {
    [dir.join("log/server.log"), dir.join("log/err.log")]
}

fn server_xml(dir: &Path, ports: Ports) -> String {
    let dir = xml_escape(&dir.display().to_string());
    let Ports { http, tcp } = ports;
    format!(
        r#"<?xml version="1.0"?>
<yandex>
  <logger>
    <level>{LOG_LEVEL}</level>
    <log>{dir}/log/server.log</log>
    <errorlog>{dir}/log/err.log</errorlog>
    <size>10M</size>
    <count>1</count>
  </logger>
  <http_port>{http}</http_port>
  <tcp_port>{tcp}</tcp_port>
  <listen_host>127.0.0.1</listen_host>
  <max_connections>4096</max_connections>
  <keep_alive_timeout>3</keep_alive_timeout>
  <max_concurrent_queries>100</max_concurrent_queries>
  <uncompressed_cache_size>8589934592</uncompressed_cache_size>
  <mark_cache_size>536870912</mark_cache_size>
  <path>{dir}/data/</path>
  <tmp_path>{dir}/tmp/</tmp_path>
  <user_files_path>{dir}/user_files/</user_files_path>
  <format_schema_path>{dir}/format_schemas/</format_schema_path>
  <users_config>users.xml</users_config>
  <default_profile>default</default_profile>
  <default_database>default</default_database>
  <mlock_executable>false</mlock_executable>
</yandex>
"#
    )
}

/// A profile of `users.xml`: its settings (and the profile it inherits).
pub(crate) struct Profile {
    pub name: &'static str,
    pub inherits: Option<&'static str>,
    pub settings: &'static [(&'static str, &'static str)],
}

/// A user of `users.xml`.
pub(crate) struct User {
    pub name: &'static str,
    pub password: &'static str,
    pub profile: &'static str,
}

/// Every profile the harness's servers have: what `users.xml` is written from, and what
/// the current engine's front applies per user (it has no `users.xml`).
pub(crate) const PROFILES: &[Profile] = &[
    Profile {
        name: "default",
        inherits: None,
        settings: &[("max_memory_usage", "2000000000")],
    },
    Profile {
        name: "readonly",
        inherits: None,
        settings: &[("readonly", "2")],
    },
    Profile {
        name: "skips_unknown_fields",
        inherits: Some("default"),
        settings: &[("input_format_skip_unknown_fields", "1")],
    },
];

/// Every user the harness's servers have.
pub(crate) const USERS: &[User] = &[
    User {
        name: DEFAULT_USER,
        password: DEFAULT_PASSWORD,
        profile: "default",
    },
    User {
        name: INGEST_USER,
        password: INGEST_PASSWORD,
        profile: "default",
    },
    User {
        name: SKIPPING_USER,
        password: SKIPPING_PASSWORD,
        profile: "skips_unknown_fields",
    },
    User {
        name: QUERY_USER,
        password: QUERY_PASSWORD,
        profile: "readonly",
    },
];

/// A profile's settings, those it inherits first.
pub(crate) fn profile_settings(name: &str) -> Vec<(&'static str, &'static str)> {
    let Some(profile) = PROFILES.iter().find(|p| p.name == name) else {
        return Vec::new();
    };
    let mut settings = profile.inherits.map(profile_settings).unwrap_or_default();
    settings.extend_from_slice(profile.settings);
    settings
}

/// `users.xml`, from [`PROFILES`] and [`USERS`].
fn users_xml() -> String {
    let mut profiles = String::new();
    for profile in PROFILES {
        profiles.push_str(&format!("    <{}>\n", profile.name));
        if let Some(parent) = profile.inherits {
            profiles.push_str(&format!("      <profile>{parent}</profile>\n"));
        }
        for (name, value) in profile.settings {
            profiles.push_str(&format!("      <{name}>{}</{name}>\n", xml_escape(value)));
        }
        profiles.push_str(&format!("    </{}>\n", profile.name));
    }
    let mut users = String::new();
    for user in USERS {
        users.push_str(&format!(
            "    <{name}>\n      <password>{password}</password>\n      \
             <networks><ip>::/0</ip></networks>\n      <profile>{profile}</profile>\n      \
             <quota>default</quota>\n    </{name}>\n",
            name = user.name,
            password = xml_escape(user.password),
            profile = user.profile,
        ));
    }
    format!(
        r#"<?xml version="1.0"?>
<yandex>
  <profiles>
{profiles}  </profiles>
  <quotas>
    <default>
      <interval>
        <duration>3600</duration>
        <queries>0</queries>
        <errors>0</errors>
        <result_rows>0</result_rows>
        <read_rows>0</read_rows>
        <execution_time>0</execution_time>
      </interval>
    </default>
  </quotas>
  <users>
{users}  </users>
</yandex>
"#
    )
}

/// Writes `config.d/merge_tree.xml`: server-wide MergeTree settings (read at start).
pub(crate) fn write_merge_tree(dir: &Path, settings: &[(&str, u64)]) -> Result<()> {
    let config_d = dir.join("config.d");
    std::fs::create_dir_all(&config_d)
        .with_context(|| format!("creating {}", config_d.display()))?;
    let lines: String = settings
        .iter()
        .map(|(name, value)| format!("    <{name}>{value}</{name}>\n"))
        .collect();
    let path = config_d.join("merge_tree.xml");
    std::fs::write(
        &path,
        format!("<?xml version=\"1.0\"?>\n<yandex>\n  <merge_tree>\n{lines}  </merge_tree>\n</yandex>\n"),
    )
    .with_context(|| format!("writing {}", path.display()))
}

pub(crate) fn xml_escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_users_file_matches_the_constants() {
        for secret in [INGEST_PASSWORD, QUERY_PASSWORD, SKIPPING_PASSWORD] {
            assert!(users_xml().contains(&format!("<password>{secret}</password>")));
        }
        for user in [DEFAULT_USER, INGEST_USER, QUERY_USER, SKIPPING_USER] {
            assert!(users_xml().contains(&format!("<{user}>")));
        }
    }

    #[test]
    fn every_path_is_inside_the_dir() {
        let xml = server_xml(Path::new("/tmp/x"), Ports { http: 1, tcp: 2 });
        for tag in [
            "log",
            "errorlog",
            "path",
            "tmp_path",
            "user_files_path",
            "format_schema_path",
        ] {
            assert!(
                xml.contains(&format!("<{tag}>/tmp/x/")),
                "<{tag}> is outside the dir"
            );
        }
        assert!(xml.contains("<http_port>1</http_port>"));
        assert!(xml.contains("<tcp_port>2</tcp_port>"));
    }
}
