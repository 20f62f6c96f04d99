//! The current engine's HTTP front (chdb behind `front.py`) answers as ClickHouse's HTTP
//! interface does: settings from the URL for that request only, the body as an
//! insert's data, the exception code in its header and the status ClickHouse gives it.
//! It runs whatever `SLUICE_TEST_CLICKHOUSE` says: these tests are about the front.

use anyhow::{Context, Result};
use sluice_harness::{
    ClickHouseFlavor, ClickHouseOptions, ClickHouseServer, INGEST_PASSWORD, INGEST_USER,
};

async fn front() -> Result<ClickHouseServer> {
    ClickHouseServer::start_with(ClickHouseOptions::default().flavor(ClickHouseFlavor::Current))
        .await
}

/// A request (URL parameters, body) and the status and exception code it must get.
type Case<'a> = (&'a [(&'a str, &'a str)], &'a str, u16, &'a str);

/// (status, exception code header, body) of one request.
async fn ask(
    server: &ClickHouseServer,
    params: &[(&str, &str)],
    body: &str,
) -> Result<(u16, Option<String>, String)> {
    let url = reqwest::Url::parse_with_params(&format!("{}/", server.http_url()), params)?;
    let response = sluice_harness::loopback_client(std::time::Duration::from_secs(30))?
        .post(url)
        .basic_auth(INGEST_USER, Some(INGEST_PASSWORD))
        .body(body.to_owned())
        .send()
        .await
        .context("asking the front")?;
    let status = response.status().as_u16();
    let code = response
        .headers()
        .get("x-clickhouse-exception-code")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    Ok((status, code, response.text().await?))
}

#[tokio::test]
async fn a_requests_settings_do_not_reach_the_next_one() -> Result<()> {
    let server = front().await?;
    let sql = "SELECT getSetting('max_threads'), getSetting('insert_deduplicate')";
    let (status, _, set) = ask(
        &server,
        &[
            ("query", sql),
            ("max_threads", "3"),
            ("insert_deduplicate", "0"),
        ],
        "",
    )
    .await?;
    assert_eq!((status, set.trim()), (200, "3\tfalse"));
    let (_, _, after) = ask(&server, &[("query", sql)], "").await?;
    let (threads, deduplicate) = after.trim().split_once('\t').context("two columns")?;
    assert!(threads != "3" && deduplicate == "true", "{after}");
    // A CREATE takes its settings by SET, each put back after it.
    let (status, _, _) = ask(
        &server,
        &[("max_threads", "5")],
        "CREATE TABLE t (id UInt64) ENGINE = MergeTree ORDER BY id",
    )
    .await?;
    assert_eq!(status, 200);
    let (_, _, after_create) = ask(&server, &[("query", sql)], "").await?;
    assert_eq!(after_create, after);
    Ok(())
}

#[tokio::test]
async fn the_body_is_an_inserts_data_and_failures_carry_clickhouses_code_and_status() -> Result<()>
{
    let server = front().await?;
    server
        .exec("CREATE TABLE events (id UInt64, n UInt32) ENGINE = MergeTree ORDER BY id")
        .await?;
    let insert = "INSERT INTO `default`.`events` FORMAT JSONEachRow";
    let (status, code, _) = ask(
        &server,
        &[("query", insert), ("async_insert", "0")],
        "{\"id\":1,\"n\":2}\n{\"id\":2,\"n\":3}\n",
    )
    .await?;
    assert_eq!((status, code), (200, None));
    assert_eq!(server.count("events").await?, 2);

    // ClickHouse's exceptionCodeToHTTPStatus: parse errors 400, unknown names 404,
    // anything else 500; a refused login 403.
    let cases: [Case; 5] = [
        (
            &[("query", insert)],
            "{\"id\":3,\"n\":\"abc\"}\n",
            400,
            "27",
        ),
        (&[("query", insert)], "{\"id\":3,\"n\":-1}\n", 400, "72"),
        (&[("query", "SELECT throwIf(1)")], "", 500, "395"),
        (&[("query", "SELECT * FROM nope")], "", 404, "60"),
        (
            &[("query", "SELECT 1"), ("no_such_setting", "1")],
            "",
            404,
            "115",
        ),
    ];
    for (params, body, want_status, want_code) in cases {
        let (status, code, text) = ask(&server, params, body).await?;
        assert_eq!(
            (status, code.as_deref()),
            (want_status, Some(want_code)),
            "{params:?}: {text}"
        );
        assert!(
            text.starts_with(&format!("Code: {want_code}. DB::Exception: "))
                && text.contains("(version 26."),
            "{text}"
        );
    }
    let refused = sluice_harness::loopback_client(std::time::Duration::from_secs(30))?
        .post(format!("{}/", server.http_url()))
        .basic_auth(INGEST_USER, Some("wrong"))
        .body("SELECT 1")
        .send()
        .await?;
    assert_eq!(refused.status().as_u16(), 403);
    assert_eq!(server.count("events").await?, 2);
    Ok(())
}

/// The defaults of the current engine that Sluice's settings and arithmetic answer
/// (docs/operations.md, "ClickHouse and NATS versions"): read from the engine, so a
/// new pin of chdb-core that changes one fails here first.
#[tokio::test]
async fn the_current_defaults_sluice_pins_against() -> Result<()> {
    let server = front().await?;
    let settings = server
        .exec(
            "SELECT name, value FROM system.settings WHERE name IN ('async_insert', \
             'deduplicate_insert', 'insert_deduplicate', \
             'deduplicate_blocks_in_dependent_materialized_views', \
             'input_format_skip_unknown_fields') ORDER BY name",
        )
        .await?;
    assert_eq!(
        settings,
        "async_insert\t1\ndeduplicate_blocks_in_dependent_materialized_views\t1\n\
         deduplicate_insert\tenable\ninput_format_skip_unknown_fields\t1\n\
         insert_deduplicate\t1\n"
    );
    let windows = server
        .exec(
            "SELECT name, value FROM system.merge_tree_settings WHERE name IN \
             ('replicated_deduplication_window', 'replicated_deduplication_window_seconds', \
              'non_replicated_deduplication_window') ORDER BY name",
        )
        .await?;
    assert_eq!(
        windows,
        "non_replicated_deduplication_window\t0\nreplicated_deduplication_window\t10000\n\
         replicated_deduplication_window_seconds\t3600\n"
    );
    Ok(())
}

/// A token names its rows for good: on 26.x the same token with other rows is dropped
/// without a word, so Sluice must never send one token with two sets of rows (its
/// tokens name the stream's incarnation and the batch's message sequences, and a
/// range of its rows: `Manifest::token_of`). And `async_insert=0`, which Sluice pins,
/// still makes an insert's answer mean its rows are in.
#[tokio::test]
async fn a_reused_token_with_other_rows_is_dropped_and_async_insert_0_holds() -> Result<()> {
    let server = front().await?;
    server
        .exec(
            "CREATE TABLE events (id UInt64) ENGINE = MergeTree ORDER BY id \
             SETTINGS non_replicated_deduplication_window = 100",
        )
        .await?;
    let insert = "INSERT INTO events FORMAT JSONEachRow";
    for (rows, want) in [("{\"id\":1}\n{\"id\":2}\n", 2), ("{\"id\":3}\n", 2)] {
        let (status, _, text) = ask(
            &server,
            &[
                ("query", insert),
                ("async_insert", "0"),
                ("insert_deduplicate", "1"),
                ("deduplicate_insert", "enable"),
                ("insert_deduplication_token", "sluice-1-7"),
            ],
            rows,
        )
        .await?;
        assert_eq!(status, 200, "{text}");
        // Counted at once: with async_insert=0 the answer comes once the rows are in.
        assert_eq!(server.count("events").await?, want, "after {rows:?}");
    }
    Ok(())
}
