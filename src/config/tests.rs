use std::collections::BTreeMap;
use std::time::Duration;

use super::key::Key;
use super::*;

fn env(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn problems(text: &str, vars: &[(&str, &str)]) -> Vec<String> {
    match Config::from_parts("test.toml", text, &env(vars)) {
        Ok(_) => panic!("expected problems"),
        Err(e) => e.problems,
    }
}

#[test]
fn the_example_config_is_valid() {
    let text = include_str!("../../config.toml");
    let config = Config::from_parts("config.toml", text, &env(&[])).expect("example config");
    assert_eq!(config.nats.streams.stream, "INGEST");
    assert_eq!(config.nats.streams.max_bytes, 1 << 30);
    assert_eq!(config.nats.streams.ack_wait, Duration::from_secs(60));
    assert_eq!(
        config.targets["main"].insert_timeout,
        Duration::from_secs(30)
    );
    assert_eq!(config.tenants["acme"].target.as_deref(), Some("main"));
    assert_eq!(config.table_settings("acme", "events").batch_rows, 500);
    assert_eq!(config.table_settings("acme", "clicks").batch_rows, 10_000);
    assert_eq!(config.table_settings("acme", "clicks").batch_bytes, 8 << 20);
    let summary = config.summary();
    assert!(summary.contains("main: http://127.0.0.1:8123"), "{summary}");
    assert!(summary.contains("acme.events: batch_rows 500"), "{summary}");
}

#[test]
fn an_empty_file_has_defaults() {
    let config = Config::from_parts("x", "", &env(&[])).expect("defaults");
    assert_eq!(config.nats.seeds, ["nats://127.0.0.1:4222"]);
    assert_eq!(config.ingest.batch_rows, 10_000);
    assert!(config.targets.is_empty());
    assert!(config.query.is_none());
}

#[test]
fn credentials_in_the_nats_url_are_refused_without_printing_them() {
    for (text, vars) in [
        (
            "[nats]\nurl = \"nats://alice:hunter2@127.0.0.1:4222\"\n",
            vec![],
        ),
        (
            "",
            vec![(
                "SLUICE_NATS_URL",
                "nats://10.0.0.1:4222,hunter2@10.0.0.2:4222",
            )],
        ),
    ] {
        let p = problems(text, &vars);
        assert_eq!(p.len(), 1, "{p:?}");
        assert!(p[0].contains("[nats] url"), "{}", p[0]);
        assert!(p[0].contains("carries credentials"), "{}", p[0]);
        assert!(
            p[0].contains("password_env") && p[0].contains("token_env"),
            "{}",
            p[0]
        );
        assert!(p[0].contains("***@"), "{}", p[0]);
        assert!(!p[0].contains("hunter2"), "{}", p[0]);
    }
}

#[test]
fn unknown_key_names_the_key_and_its_line() {
    let p = problems(
        "[nats]\nurl = \"nats://x:4222\"\nmax_byte = \"1GiB\"\n",
        &[],
    );
    assert_eq!(p.len(), 1);
    assert!(p[0].contains("max_byte"), "{}", p[0]);
    assert!(p[0].contains("line 3"), "{}", p[0]);
}

#[test]
fn unknown_section_is_refused() {
    let p = problems("[natz]\nurl = \"x\"\n", &[]);
    assert!(p[0].contains("natz") && p[0].contains("line 1"), "{}", p[0]);
}

#[test]
fn sizes_and_durations_need_units() {
    let p = problems("[ingest]\nbatch_bytes = 8000000\n", &[]);
    assert!(
        p[0].contains("needs a unit") && p[0].contains("line 2"),
        "{}",
        p[0]
    );
    let p = problems("[nats]\nack_wait = \"60\"\n", &[]);
    assert!(p[0].contains("needs a unit"), "{}", p[0]);
    let p = problems("[nats]\nmax_bytes = \"1Gb\"\n", &[]);
    assert!(p[0].contains("unknown unit"), "{}", p[0]);
}

#[test]
fn every_problem_is_reported_at_once() {
    let text = r#"
[clickhouse.targets.main]
url = "ftp://x"
database = "no-dashes"

[tenants.acme]
target = "missing"

[tenants."bad name"]
target = "main"

[tables."acme"]
batch_rows = 5

[api]
listen = "nowhere"
auth = "none"
"#;
    let p = problems(text, &[]);
    let all = p.join("\n");
    assert!(all.contains("scheme must be http or https"), "{all}");
    assert!(all.contains("database = \"no-dashes\""), "{all}");
    assert!(all.contains("target = \"missing\""), "{all}");
    assert!(
        all.contains("\"bad name\" is not a valid tenant name"),
        "{all}"
    );
    assert!(all.contains("must be \"tenant.table\""), "{all}");
    assert!(all.contains("[api] listen = \"nowhere\""), "{all}");
    assert!(p.len() >= 6, "{all}");
}

#[test]
fn secrets_come_from_the_environment_and_never_print() {
    let text = r#"
[clickhouse.targets.main]
url = "http://127.0.0.1:8123"
password_env = "CH_PW"
[tenants.acme]
target = "main"
token_env = "ACME_TOKEN"
"#;
    let p = problems(text, &[]);
    let all = p.join("\n");
    assert!(all.contains("CH_PW is not set"), "{all}");
    assert!(all.contains("ACME_TOKEN is not set"), "{all}");

    let config = Config::from_parts(
        "t",
        text,
        &env(&[("CH_PW", "pw-123"), ("ACME_TOKEN", "tok-456")]),
    )
    .expect("config");
    assert_eq!(
        config.targets["main"].password.as_ref().map(|s| s.expose()),
        Some("pw-123")
    );
    assert_eq!(
        config.tenant_for_token("tok-456").map(|t| t.name.as_str()),
        Some("acme")
    );
    assert!(config.tenant_for_token("tok-45").is_none());
    let printed = format!("{config:?}\n{}", config.summary());
    assert!(!printed.contains("pw-123") && !printed.contains("tok-456"));
}

#[test]
fn a_target_lists_the_replicas_of_one_shard_or_shards_of_replicas() {
    let text = r#"
[clickhouse.targets.one]
[clickhouse.targets.pair]
url = "http://a1:8123, http://a2:8123/"
[clickhouse.targets.grid]
shards = ["http://a1:8123,http://a2:8123", "http://b1:8123,http://b2:8124"]
"#;
    let config = Config::from_parts("t", text, &env(&[])).expect("config");
    let t = &config.targets;
    assert_eq!(t["one"].shards, vec![vec!["http://127.0.0.1:8123"]]);
    assert_eq!(t["one"].replica_names(), vec![vec!["one"]]);
    assert_eq!(
        t["pair"].shards,
        vec![vec!["http://a1:8123", "http://a2:8123"]]
    );
    assert_eq!(
        t["grid"].replica_names(),
        vec![vec!["a1:8123", "a2:8123"], vec!["b1:8123", "b2:8124"]]
    );
    // From the environment: `;` between the shards.
    let config = Config::from_parts(
        "env",
        "",
        &env(&[(
            "SLUICE_CLICKHOUSE_TARGETS_MAIN_SHARDS",
            "http://a1:8123,http://a2:8123;http://b1:8123",
        )]),
    )
    .expect("env config");
    assert_eq!(
        config.targets["main"].shards,
        vec![
            vec!["http://a1:8123", "http://a2:8123"],
            vec!["http://b1:8123"]
        ]
    );
}

#[test]
fn a_cluster_layout_that_cannot_be_is_refused_naming_the_key() {
    let p = problems(
        "[clickhouse.targets.main]\nurl = \"http://a:8123\"\nshards = [\"http://b:8123\"]\n",
        &[],
    );
    assert!(
        p.iter()
            .any(|l| l.contains("set url") && l.contains("not both")),
        "{p:?}"
    );
    let p = problems(
        "[clickhouse.targets.main]\nshards = [\"http://a:8123,http://b:8123\", \"http://b:8123\", \" , \"]\n",
        &[],
    );
    let all = p.join("\n");
    assert!(all.contains("[clickhouse.targets.main] shards"), "{all}");
    assert!(
        all.contains("b:8123 is listed twice (shard 1 and shard 2)"),
        "{all}"
    );
    assert!(all.contains("shard 3 lists no server"), "{all}");
    let p = problems(
        "[clickhouse.targets.main]\nurl = \"http://a:8123,ftp://b\"\n",
        &[],
    );
    assert!(p[0].contains("scheme must be http or https"), "{p:?}");
}

/// issue 37.3: `shards = []` (in the file, or an empty variable) lists no server; it
/// was taken for "no shards" and the target wrote to the local default server.
#[test]
fn an_empty_shard_list_is_refused_not_taken_for_the_default_server() {
    let p = problems("[clickhouse.targets.main]\nshards = []\n", &[]);
    assert!(
        p.iter().any(|l| l.contains("[clickhouse.targets.main] shards")
            && l.contains("lists no shard")),
        "{p:?}"
    );
    let p = problems("", &[("SLUICE_CLICKHOUSE_TARGETS_MAIN_SHARDS", "")]);
    assert!(p.iter().any(|l| l.contains("lists no shard")), "{p:?}");
}

#[test]
fn credentials_in_a_url_are_refused() {
    let p = problems(
        "[clickhouse.targets.main]\nurl = \"http://u:p@127.0.0.1:8123\"\n",
        &[],
    );
    assert!(p[0].contains("carries credentials"), "{}", p[0]);
}

#[test]
fn environment_overrides_every_section() {
    let config = Config::from_parts(
        "env",
        "",
        &env(&[
            ("SLUICE_NATS_URL", "nats://10.0.0.1:4222"),
            ("SLUICE_NATS_MAX_BYTES", "2GiB"),
            ("SLUICE_CLICKHOUSE_TARGETS_MAIN_URL", "http://ch:8123"),
            ("SLUICE_CLICKHOUSE_TARGETS_MAIN_PASSWORD_ENV", "CH_PW"),
            ("CH_PW", "x"),
            ("SLUICE_TENANTS_ACME_TARGET", "main"),
            ("SLUICE_TABLES_ACME__EVENTS_BATCH_ROWS", "250"),
            ("SLUICE_INGEST_DLQ", "false"),
            ("SLUICE_API_AUTH", "none"),
            ("SLUICE_API_LISTEN", "0.0.0.0:8080"),
            ("SLUICE_LOG_FORMAT", "json"),
        ]),
    )
    .expect("env-only config");
    assert_eq!(config.nats.seeds, ["nats://10.0.0.1:4222"]);
    assert_eq!(config.nats.streams.max_bytes, 2 << 30);
    assert_eq!(config.targets["main"].shards, vec![vec!["http://ch:8123"]]);
    assert!(config.targets["main"].password.is_some());
    assert_eq!(config.tenants["acme"].target.as_deref(), Some("main"));
    assert_eq!(config.table_settings("acme", "events").batch_rows, 250);
    assert!(!config.table_settings("acme", "events").dlq);
    assert!(!config.ingest.dlq);
    assert_eq!(config.api.listen.port(), 8080);
    assert_eq!(config.log.format, LogFormat::Json);
}

#[test]
fn a_bad_override_names_the_variable() {
    let p = problems("", &[("SLUICE_NATS_MAX_ACK_PENDING", "lots")]);
    assert!(p[0].contains("SLUICE_NATS_MAX_ACK_PENDING"), "{}", p[0]);
    let p = problems("", &[("SLUICE_NATS_ACK_WAIT", "60")]);
    assert!(
        p[0].contains("SLUICE_NATS_ACK_WAIT") && p[0].contains("needs a unit"),
        "{}",
        p[0]
    );
}

#[test]
fn admin_without_token_is_loopback_only() {
    let config =
        Config::from_parts("t", "[admin]\nlisten = \"0.0.0.0:9090\"\n", &env(&[])).expect("config");
    assert!(config.admin.listen.ip().is_loopback());
    assert_eq!(config.admin.listen.port(), 9090);
    assert!(config.warnings.iter().any(|w| w.contains("loopback only")));
    let config = Config::from_parts(
        "t",
        "[admin]\nlisten = \"0.0.0.0:9090\"\n",
        &env(&[("SLUICE_ADMIN_TOKEN", "adm")]),
    )
    .expect("config");
    assert!(!config.admin.listen.ip().is_loopback());
    assert!(config.admin.token.is_some());
}

#[test]
fn token_auth_needs_tokens() {
    let p = problems(
        "[clickhouse.targets.main]\n[tenants.acme]\ntarget = \"main\"\n",
        &[],
    );
    assert!(p[0].contains("no tenant has a token"), "{}", p[0]);
}

#[test]
fn query_section_resolves_its_target() {
    let text = r#"
[clickhouse.targets.main]
url = "http://127.0.0.1:8123"
[query]
target = "main"
user = "reader"
password_env = "Q_PW"
"#;
    let config = Config::from_parts("t", text, &env(&[("Q_PW", "r")])).expect("config");
    let q = config.query.expect("query on");
    assert_eq!(
        q.servers,
        vec![("main".to_owned(), "http://127.0.0.1:8123".to_owned())]
    );
    assert_eq!(q.user, "reader");
    let p = problems("[query]\ntarget = \"nope\"\n", &[]);
    assert!(p[0].contains("target = \"nope\""), "{}", p[0]);
}

#[test]
fn identifiers() {
    assert!(is_table_name("events_2024"));
    assert!(is_table_name("_x"));
    assert!(!is_table_name("2events"));
    assert!(!is_table_name("ev-ents"));
    assert!(!is_table_name("ev.ents"));
    assert!(!is_table_name(""));
    assert!(!is_table_name("a;DROP TABLE x"));
    assert!(is_tenant_name("acme-eu"));
    assert!(!is_tenant_name("-acme"));
    assert!(!is_tenant_name("acme eu"));
    // The cap, as the rules state it, and the docs state the rules as they are.
    let longest = "t".repeat(MAX_NAME_LEN);
    assert!(is_table_name(&longest) && is_tenant_name(&longest));
    let longer = "t".repeat(MAX_NAME_LEN + 1);
    assert!(!is_table_name(&longer) && !is_tenant_name(&longer));
    let docs = include_str!("../../docs/operations.md");
    for rule in [TABLE_NAME_RULE, TENANT_NAME_RULE] {
        assert!(
            docs.contains(&format!("`{rule}`")),
            "docs/operations.md lacks {rule}"
        );
    }
}

#[test]
fn limits_at_the_door_have_defaults_overrides_and_bounds() {
    let config = Config::from_parts("t", "", &env(&[])).expect("defaults");
    let (api, admin) = (&config.api, &config.admin);
    assert_eq!(
        (
            api.max_json_depth,
            api.max_tables_per_tenant,
            api.fd_reserve
        ),
        (64, 500, 256)
    );
    assert_eq!(
        api.limits,
        ListenerLimits {
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(60),
        }
    );
    assert_eq!((api.max_connections, admin.max_connections), (None, 64));
    assert_eq!(admin.limits.idle_timeout, Duration::from_secs(60));

    let text =
        "[api]\nidle_timeout = \"5s\"\nmax_connections = 100\n[admin]\nheader_timeout = \"2s\"\n";
    let config = Config::from_parts(
        "t",
        text,
        &env(&[
            ("SLUICE_API_MAX_JSON_DEPTH", "16"),
            ("SLUICE_API_BODY_TIMEOUT", "1m"),
            ("SLUICE_ADMIN_MAX_CONNECTIONS", "8"),
            ("SLUICE_API_FD_RESERVE", "1000"),
        ]),
    )
    .expect("config");
    assert_eq!(config.api.max_json_depth, 16);
    assert_eq!(config.api.fd_reserve, 1000);
    assert_eq!(config.api.limits.idle_timeout, Duration::from_secs(5));
    assert_eq!(config.api.limits.body_timeout, Duration::from_secs(60));
    assert_eq!(config.api.max_connections, Some(100));
    assert_eq!(config.admin.limits.header_timeout, Duration::from_secs(2));
    assert_eq!(config.admin.max_connections, 8);

    let p = problems(
        "[api]\nmax_json_depth = 0\nmax_tables_per_tenant = 0\nidle_timeout = \"0s\"\nmax_connections = 0\n[admin]\nbody_timeout = \"0s\"\n",
        &[],
    );
    let all = p.join("\n");
    for needle in [
        "[api] max_json_depth = 0",
        "[api] max_tables_per_tenant = 0",
        "[api] idle_timeout must be longer than zero",
        "[api] max_connections = 0",
        "[admin] body_timeout must be longer than zero",
    ] {
        assert!(all.contains(needle), "{needle} not in:\n{all}");
    }
    let p = problems("[api]\nheader_timeout = 10\n", &[]);
    assert!(p[0].contains("needs a unit"), "{}", p[0]);
    let p = problems("[api]\nmax_json_depth = 5000\n", &[]);
    assert!(p[0].contains("must be 1 to 1000"), "{}", p[0]);

    // A reserve below what the ClickHouse clients may hold is worth a warning.
    let config = Config::from_parts(
        "t",
        "[api]\nfd_reserve = 10\n[clickhouse.targets.main]\ninsert_concurrency = 50\n",
        &env(&[]),
    )
    .expect("config");
    assert!(
        config
            .warnings
            .iter()
            .any(|w| w.contains("fd_reserve = 10")),
        "{:?}",
        config.warnings
    );
}

#[test]
fn the_manifest_store_has_defaults_and_overrides() {
    let config = Config::from_parts("x", "", &env(&[])).expect("defaults");
    assert_eq!(config.nats.manifest_bucket, "SLUICE_MANIFESTS");
    assert_eq!(config.nats.manifest_max_bytes, 256 << 20);
    assert!(config.exactly_once, "exactly-once is on by default");
    assert!(config
        .summary()
        .contains("manifests in bucket SLUICE_MANIFESTS"));

    let config = Config::from_parts(
        "env",
        "[nats]\nmanifest_bucket = \"A\"\n[ingest]\nexactly_once = true\n",
        &env(&[
            ("SLUICE_NATS_MANIFEST_BUCKET", "staging_manifests"),
            ("SLUICE_NATS_MANIFEST_MAX_BYTES", "64MiB"),
            ("SLUICE_INGEST_EXACTLY_ONCE", "false"),
        ]),
    )
    .expect("overridden");
    assert_eq!(config.nats.manifest_bucket, "staging_manifests");
    assert_eq!(config.nats.manifest_max_bytes, 64 << 20);
    assert!(!config.exactly_once);
    assert!(config.summary().contains("off: every table at-least-once"));
}

#[test]
fn a_bad_manifest_store_is_refused_with_the_reason() {
    let p = problems(
        "[nats]\nmanifest_bucket = \"sluice.manifests\"\nmanifest_max_bytes = \"64KiB\"\n",
        &[],
    );
    assert!(
        p.iter()
            .any(|p| p.contains("manifest_bucket = \"sluice.manifests\" is not a valid")),
        "{p:?}"
    );
    assert!(
        p.iter()
            .any(|p| p.contains("manifest_max_bytes = 64KiB: must be at least 1MiB")),
        "{p:?}"
    );
    let p = problems("[nats]\nstream = \"KV_M\"\nmanifest_bucket = \"M\"\n", &[]);
    assert!(p[0].contains("kept in stream KV_M"), "{p:?}");
    // Exactly-once is one switch for the whole pipeline, not per table.
    let p = problems(
        "[tenants.acme]\n[tables.\"acme.events\"]\nexactly_once = false\n",
        &[],
    );
    assert!(p[0].contains("exactly_once"), "{p:?}");
    let p = problems("", &[("SLUICE_INGEST_EXACTLY_ONCE", "sometimes")]);
    assert!(p[0].contains("SLUICE_INGEST_EXACTLY_ONCE"), "{p:?}");
}

#[test]
fn chunks_of_the_ingest_api_have_defaults_overrides_and_bounds() {
    let config = Config::from_parts("t", "", &env(&[])).expect("defaults");
    assert_eq!(
        (config.api.chunk_rows, config.api.chunk_bytes),
        (100, 1 << 20)
    );

    let config = Config::from_parts(
        "t",
        "[api]\nchunk_rows = 250\nmax_row_bytes = \"64KiB\"\n",
        &env(&[("SLUICE_API_CHUNK_BYTES", "256KiB")]),
    )
    .expect("config");
    assert_eq!(
        (config.api.chunk_rows, config.api.chunk_bytes),
        (250, 256 << 10)
    );
    assert!(
        config
            .summary()
            .contains("messages of at most 250 rows and 256KiB"),
        "{}",
        config.summary()
    );

    let p = problems("[api]\nchunk_rows = 0\nchunk_bytes = \"512KiB\"\n", &[]).join("\n");
    assert!(
        p.contains("[api] chunk_rows = 0: must be 1 to 100000"),
        "{p}"
    );
    // The default max_row_bytes (1 MiB) would not fit a 512 KiB message.
    assert!(
        p.contains("[api] chunk_bytes = 512KiB is below max_row_bytes = 1MiB"),
        "{p}"
    );
    let p = problems("[api]\nchunk_bytes = \"65MiB\"\n", &[]).join("\n");
    assert!(p.contains("at most 64MiB"), "{p}");
    let p = problems("", &[("SLUICE_API_CHUNK_ROWS", "lots")]).join("\n");
    assert!(p.contains("SLUICE_API_CHUNK_ROWS"), "{p}");

    // Chunks the stream's budget can barely hold, or bigger than a table's batches,
    // work but are worth a word.
    let config = Config::from_parts(
        "t",
        "[nats]\nmax_bytes = \"2MiB\"\n[api]\nchunk_rows = 20000\n",
        &env(&[]),
    )
    .expect("config");
    let warnings = config.warnings.join("\n");
    assert!(
        warnings.contains("more than a quarter of [nats] max_bytes = 2MiB"),
        "{warnings}"
    );
    assert!(
        warnings.contains("chunk_rows = 20000 is above [ingest] batch_rows = 10000"),
        "{warnings}"
    );
}

#[test]
fn a_missing_tables_grace_has_a_default_and_overrides_per_table() {
    let config = Config::from_parts("x", "", &env(&[])).expect("defaults");
    assert_eq!(
        config.table_settings("acme", "events").missing_table_grace,
        Duration::from_secs(600)
    );

    let config = Config::from_parts(
        "x",
        "[api]\nauth = \"none\"\n\n[tenants.acme]\n\n[ingest]\nmissing_table_grace = \"2m\"\n\n[tables.\"acme.events\"]\nmissing_table_grace = \"30s\"\n",
        &env(&[("SLUICE_TABLES_ACME__CLICKS_MISSING_TABLE_GRACE", "0s")]),
    )
    .expect("overridden");
    assert_eq!(
        config.table_settings("acme", "events").missing_table_grace,
        Duration::from_secs(30)
    );
    assert_eq!(
        config.table_settings("acme", "clicks").missing_table_grace,
        Duration::ZERO,
        "0s: park at once (no wait)"
    );
    assert_eq!(
        config.table_settings("acme", "other").missing_table_grace,
        Duration::from_secs(120)
    );
    let summary = config.summary();
    assert!(
        summary.contains("acme.events: ") && summary.contains("missing_table_grace 30s"),
        "{summary}"
    );

    let p = problems(
        "[api]\nauth = \"none\"\n\n[tenants.acme]\n\n[tables.\"acme.events\"]\nmissing_table_grace = 30\n",
        &[],
    );
    assert!(p.iter().any(|l| l.contains("missing_table_grace")), "{p:?}");
}

#[test]
fn a_shard_key_is_a_tables_own_and_must_name_a_column() {
    let config = Config::from_parts(
        "x",
        "[api]\nauth = \"none\"\n\n[tenants.acme]\n\n[tables.\"acme.events\"]\nshard_key = \"user_id\"\n",
        &env(&[("SLUICE_TABLES_ACME__CLICKS_SHARD_KEY", "account")]),
    )
    .expect("a shard key per table");
    let key = |table: &str| config.table_settings("acme", table).shard_key.clone();
    assert_eq!(key("events").as_deref(), Some("user_id"));
    assert_eq!(key("clicks").as_deref(), Some("account"));
    assert_eq!(
        key("other"),
        None,
        "no default: rows go to the shards in turn"
    );
    let summary = config.summary();
    assert!(summary.contains("shard_key \"user_id\""), "{summary}");

    let p = problems(
        "[api]\nauth = \"none\"\n\n[tenants.acme]\n\n[tables.\"acme.events\"]\nshard_key = \"\"\n",
        &[],
    );
    assert!(
        p.iter()
            .any(|l| l.contains("shard_key") && l.contains("not a column name")),
        "{p:?}"
    );
    let p = problems(
        "[api]\nauth = \"none\"\n\n[tenants.acme]\n\n[ingest]\nshard_key = \"user_id\"\n",
        &[],
    );
    assert!(
        p.iter().any(|l| l.contains("shard_key")),
        "a table's own: {p:?}"
    );
}

#[test]
fn a_shard_key_on_a_target_of_one_shard_is_said_to_place_nothing() {
    let text = |target: &str| {
        format!(
            r#"
[api]
auth = "none"
[clickhouse.targets.one]
url = "http://a1:8123, http://a2:8123"
[clickhouse.targets.grid]
shards = ["http://a1:8123", "http://b1:8123"]
[tenants.acme]
target = "{target}"
[tables."acme.events"]
shard_key = "user_id"
"#
        )
    };
    let placing = |w: &String| w.contains("shard_key") && w.contains("places nothing");
    let config =
        Config::from_parts("t", &text("one"), &env(&[])).expect("a warning, not a problem");
    let warning = config.warnings.iter().find(|w| placing(w));
    assert!(
        warning.is_some_and(|w| w.contains("[tables.\"acme.events\"]") && w.contains("\"one\"")),
        "{:?}",
        config.warnings
    );
    let config = Config::from_parts("t", &text("grid"), &env(&[])).expect("config");
    assert!(
        !config.warnings.iter().any(placing),
        "two shards: the key places rows ({:?})",
        config.warnings
    );
}

#[test]
fn the_idempotency_bucket_has_defaults_and_refuses_a_bad_name_or_budget() {
    let config = Config::from_parts("x", "", &env(&[])).expect("defaults");
    assert_eq!(config.nats.idempotency_bucket, "SLUICE_IDEMPOTENCY");
    assert_eq!(config.nats.idempotency_max_bytes, 256 << 20);
    assert!(config
        .summary()
        .contains("idempotency keys: records in bucket SLUICE_IDEMPOTENCY (max 256MiB)"));
    let config = Config::from_parts(
        "env",
        "",
        &env(&[("SLUICE_NATS_IDEMPOTENCY_MAX_BYTES", "8MiB")]),
    )
    .expect("overridden");
    assert_eq!(config.nats.idempotency_max_bytes, 8 << 20);

    let p = problems(
        "[nats]\nidempotency_bucket = \"a.b\"\nidempotency_max_bytes = \"64KiB\"\n",
        &[],
    );
    assert!(
        p.iter()
            .any(|p| p.contains("idempotency_bucket = \"a.b\" is not a valid")),
        "{p:?}"
    );
    assert!(
        p.iter()
            .any(|p| p.contains("idempotency_max_bytes = 64KiB: must be at least 1MiB")),
        "{p:?}"
    );
    for clash in [
        "[nats]\nidempotency_bucket = \"SLUICE_MANIFESTS\"\n",
        "[nats]\nstream = \"KV_K\"\nidempotency_bucket = \"K\"\n",
    ] {
        let p = problems(clash, &[]);
        assert!(p[0].contains("idempotency_bucket"), "{clash}: {p:?}");
    }
}

#[test]
fn every_problem_of_a_file_is_reported_in_one_run_each_with_its_line() {
    // Problems serde finds (a bad duration, an unknown key, a wrong type, an unknown
    // choice, a bad log level, an unknown section) and problems of the whole, together.
    let text = r#"[nats]
ack_wait = "60"
max_byte = "1GiB"

[api]
auth = "tokn"
max_json_depth = "deep"
max_row_bytes = "2MiB"
max_request_bytes = "1MiB"

[natz]
url = "x"

[log]
level = "eror"

[tables."acme.events"]
batch_rows = 0
"#;
    let p = problems(text, &[]);
    let want = [
        ("line 2: [nats] ack_wait:", "needs a unit"),
        ("line 3: [nats] max_byte:", "unknown field `max_byte`"),
        ("line 6: [api] auth:", "expected `token` or `none`"),
        ("line 7: [api] max_json_depth:", "expected a whole number"),
        (
            "lines 8, 9: [api] max_row_bytes = 2MiB",
            "is above max_request_bytes",
        ),
        ("line 11: [natz]:", "unknown field `natz`"),
        ("line 15: [log] level:", "`eror` is not a level"),
        (
            "line 17: [tables.\"acme.events\"]:",
            "tenant \"acme\" is not defined",
        ),
        (
            "line 18: [tables.\"acme.events\"] batch_rows = 0",
            "must be at least 1",
        ),
    ];
    for (start, says) in want {
        assert!(
            p.iter().any(|l| l.starts_with(start) && l.contains(says)),
            "no problem starting {start:?} and saying {says:?} in {p:#?}"
        );
    }
    // In the file's order.
    let lines: Vec<usize> = p
        .iter()
        .filter_map(|l| l.strip_prefix("line ").or(l.strip_prefix("lines ")))
        .filter_map(|l| l.split([':', ',']).next()?.parse().ok())
        .collect();
    assert!(lines.windows(2).all(|w| w[0] <= w[1]), "{p:#?}");
}

#[test]
fn a_file_that_is_not_toml_says_where_each_break_is() {
    let p = problems("[nats]\nurl = \"x\nstream = 5\n[api\n", &[]);
    assert!(
        p.iter().any(|l| l.starts_with("line 2: not TOML")),
        "{p:#?}"
    );
    assert!(
        p.iter().any(|l| l.starts_with("line 4: not TOML")),
        "{p:#?}"
    );
    // What parses is still read: its problems come in the same run.
    assert!(
        p.iter()
            .any(|l| l.starts_with("line 3: [nats] stream:") && l.contains("a string")),
        "{p:#?}"
    );
}

#[test]
fn a_problem_from_the_environment_names_its_variable() {
    let p = problems(
        "[api]\nauth = \"none\"\n",
        &[
            ("SLUICE_API_AUTH", "tokn"),
            ("SLUICE_API_MAX_ROW_BYTES", "64MiB"),
            ("SLUICE_NATS_REPLICAS", "0"),
        ],
    );
    let all = p.join("\n");
    assert!(
        all.contains(
            "SLUICE_API_AUTH: [api] auth: unknown variant `tokn`, expected `token` or `none`"
        ),
        "{all}"
    );
    assert!(
        all.contains("SLUICE_API_MAX_ROW_BYTES: [api] max_row_bytes = 64MiB is above max_request_bytes = 10MiB"),
        "{all}"
    );
    assert!(
        all.contains("SLUICE_NATS_REPLICAS: [nats] replicas = 0: must be 1 to 5"),
        "{all}"
    );
}

#[test]
fn a_value_refused_as_written_brings_no_echo_from_its_default() {
    // ingest_memory = 4MiB is below the default max_request_bytes (10MiB), which is
    // only in force because the written "2M" could not be read: one problem, not two.
    let p = problems(
        "[api]\nmax_request_bytes = \"2M\"\ningest_memory = \"4MiB\"\n",
        &[],
    );
    assert_eq!(p.len(), 1, "{p:#?}");
    assert!(
        p[0].starts_with("line 2: [api] max_request_bytes:"),
        "{p:#?}"
    );
}

#[test]
fn the_row_limit_follows_a_lower_request_limit_unless_set() {
    let config = Config::from_parts("t", "[api]\nmax_request_bytes = \"256KiB\"\n", &env(&[]))
        .expect("a lower request limit alone is taken");
    assert_eq!(
        (config.api.max_request_bytes, config.api.max_row_bytes),
        (256 << 10, 256 << 10)
    );
    assert!(
        config
            .summary()
            .contains("requests up to 256KiB, rows up to 256KiB"),
        "{}",
        config.summary()
    );
    let config = Config::from_parts("t", "", &env(&[])).expect("defaults");
    assert_eq!(config.api.max_row_bytes, 1 << 20);
    let config = Config::from_parts(
        "t",
        "[api]\nmax_request_bytes = \"256KiB\"\nmax_row_bytes = \"64KiB\"\n",
        &env(&[]),
    )
    .expect("a smaller row limit");
    assert_eq!(config.api.max_row_bytes, 64 << 10);
    // Set above the request limit: refused, with the link and both lines.
    let p = problems(
        "[api]\nmax_request_bytes = \"256KiB\"\nmax_row_bytes = \"1MiB\"\n",
        &[],
    );
    assert!(
        p[0].starts_with("lines 2, 3: [api] max_row_bytes = 1MiB is above max_request_bytes = 256KiB: a row is part of a request"),
        "{p:#?}"
    );
}

#[test]
fn a_log_level_that_is_no_level_is_refused_wherever_it_is_set() {
    for (text, vars, names) in [
        ("[log]\nlevel = \"eror\"\n", vec![], "line 2: [log] level:"),
        (
            "",
            vec![("SLUICE_LOG_LEVEL", "loud")],
            "SLUICE_LOG_LEVEL: [log] level:",
        ),
        ("", vec![("RUST_LOG", "loud")], "RUST_LOG"),
        (
            "[log]\nlevel = \"info,sluice_actors\"\n",
            vec![],
            "line 2: [log] level:",
        ),
    ] {
        let p = problems(text, &vars);
        assert_eq!(p.len(), 1, "{p:#?}");
        assert!(p[0].starts_with(names), "{p:#?}");
        assert!(
            p[0].contains("trace, debug, info, warn, error or off"),
            "{p:#?}"
        );
    }
    for level in ["error", "warn,sluice_actors=debug"] {
        let config = Config::from_parts(
            "t",
            &format!("[log]\nlevel = \"{level}\"\n"),
            &env(&[("RUST_LOG", "info")]),
        )
        .expect(level);
        assert_eq!(config.log.level, level);
    }
}

#[test]
fn every_choice_refuses_an_unknown_value_naming_the_key_and_the_choices() {
    // Read off the types: a choice added to file.rs is checked here without a word.
    let choices: Vec<_> = schema::keys()
        .iter()
        .filter_map(|k| match k.kind {
            schema::ValueKind::Choice(words) => Some((k, words)),
            _ => None,
        })
        .collect();
    assert!(choices.len() >= 2, "{choices:?}");
    for (spec, words) in choices {
        let path: Vec<&str> = spec
            .path
            .iter()
            .map(|s| match s {
                schema::Segment::Key(k) => *k,
                schema::Segment::Name => "x",
            })
            .collect();
        let (name, section) = path.split_last().expect("a key has a name");
        let key = Key::table(section.iter().copied()).key(name);
        let text = format!("[{}]\n{name} = \"nonsense\"\n", section.join("."));
        let var = format!("SLUICE_{}", path.join("_").to_ascii_uppercase());
        for (text, vars, place) in [
            (text.as_str(), vec![], "line 2".to_string()),
            ("", vec![(var.as_str(), "nonsense")], var.clone()),
        ] {
            let p = problems(text, &vars);
            let line = p
                .iter()
                .find(|l| l.contains("nonsense"))
                .unwrap_or_else(|| panic!("{key}: {p:#?}"));
            assert!(line.starts_with(&format!("{place}: {key}:")), "{line}");
            for word in words {
                assert!(line.contains(&format!("`{word}`")), "{word} not in {line}");
            }
        }
    }
}

/// config.toml with its commented-out keys and sections written in (`# key = ...` and
/// `# [section]` lose their `# `): every key the example shows, set.
fn every_key_config_toml_shows(example: &str) -> String {
    fn shows_a_key(line: &str) -> Option<&str> {
        let rest = line
            .strip_prefix('#')
            .map(|r| r.strip_prefix(' ').unwrap_or(r))?;
        let name_end = rest
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(rest.len());
        let is_key = name_end > 0 && rest[name_end..].trim_start().starts_with('=');
        (is_key || rest.starts_with('[')).then_some(rest)
    }
    example
        .lines()
        .map(|line| shows_a_key(line).unwrap_or(line))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Every key of the document, with whether its line carries a comment after the value,
/// and the line.
fn keys_with_comments(text: &str) -> Vec<(Vec<String>, bool, usize)> {
    let root = toml::de::DeTable::parse(text).expect("config.toml with every key shown parses");
    let mut out = Vec::new();
    let mut stack = vec![(Vec::new(), root.into_inner())];
    while let Some((path, table)) = stack.pop() {
        for (key, value) in table {
            let mut here: Vec<String> = path.clone();
            here.push(key.get_ref().to_string());
            let span = value.span();
            match value.into_inner() {
                toml::de::DeValue::Table(inner) => stack.push((here, inner)),
                _ => {
                    let after = text[span.end..].split('\n').next().unwrap_or_default();
                    let line = 1 + text[..span.start].matches('\n').count();
                    out.push((here, after.trim_start().starts_with('#'), line));
                }
            }
        }
    }
    out
}

/// The guard on config.toml: every key the configuration takes (read off its types, so
/// a key added later fails here until documented) is shown there, set or commented
/// out, with a comment on its line saying what it does; and every key shown is one
/// the configuration takes, with a value of the right kind.
#[test]
fn config_toml_shows_every_key_with_a_comment() {
    let shown = every_key_config_toml_shows(include_str!("../../config.toml"));
    if let Err(e) = toml::from_str::<file::FileConfig>(&shown) {
        panic!("config.toml shows a key Sluice does not take as written:\n{e}");
    }
    let found = keys_with_comments(&shown);
    let mut problems = Vec::new();
    for spec in schema::keys() {
        let fits = |path: &[String]| {
            path.len() == spec.path.len()
                && spec.path.iter().zip(path).all(|(s, p)| match s {
                    schema::Segment::Key(k) => k == p,
                    schema::Segment::Name => true,
                })
        };
        let shown: Vec<_> = found.iter().filter(|(path, ..)| fits(path)).collect();
        if shown.is_empty() {
            problems.push(format!("{} is not in config.toml", spec.dotted()));
        }
        for (path, commented, line) in shown {
            if !*commented {
                problems.push(format!(
                    "config.toml line {line}: {} says nothing of what it does",
                    path.join(".")
                ));
            }
        }
    }
    assert!(problems.is_empty(), "{problems:#?}");
}

#[test]
fn partitions_are_counted_and_printed_with_the_server_mapping() {
    let config = Config::from_parts(
        "x",
        "[nats]\npartitions = 3\nmax_bytes = \"3GiB\"\n",
        &env(&[]),
    )
    .expect("three partitions");
    assert_eq!(config.nats.streams.partitions, 3);
    let summary = config.summary();
    assert!(
        summary.contains("partitions: 3 streams INGEST_0..INGEST_2 (subjects ingest_part.<n>.<tenant>.<table>, max 1GiB each)"),
        "{summary}"
    );
    assert!(
        summary.contains("\"ingest.*.*\": \"ingest_part.{{partition(3,1,2)}}"),
        "the mapping for the nats-server: {summary}"
    );
    assert_eq!(
        Config::from_parts("x", "", &env(&[]))
            .map(|c| c.nats.streams.partitions)
            .ok(),
        Some(1),
        "one partition by default"
    );
    for bad in ["0", "65"] {
        let p = problems(&format!("[nats]\npartitions = {bad}\n"), &[]);
        assert!(
            p.iter()
                .any(|p| p.contains(&format!("[nats] partitions = {bad}: must be 1 to 64"))),
            "{p:?}"
        );
    }
    // Exactly-once (on by default) holds across partitions.
    assert!(
        Config::from_parts("x", "[nats]\npartitions = 2\n", &env(&[]))
            .is_ok_and(|c| c.exactly_once && c.nats.streams.partitions == 2)
    );
    // And so does a shard_key: each partition's stream has its split records.
    let keyed = Config::from_parts(
        "x",
        "[api]\nauth = \"none\"\n[nats]\npartitions = 2\n[tenants.acme]\n[tables.\"acme.events\"]\nshard_key = \"user_id\"\n",
        &env(&[]),
    );
    assert!(keyed.is_ok(), "{:?}", keyed.err());
}
