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
    let cases: [(&[(&str, &str)], &str, u16, &str); 5] = [
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
