use super::*;

fn refused(sql: &str) -> SqlError {
    match check_read_only(sql) {
        Ok(()) => panic!("accepted: {sql}"),
        Err(e) => e,
    }
}

#[test]
fn reads_pass() {
    for sql in [
        "SELECT 1",
        "select 1;",
        "  \n\t-- a comment\nSELECT 1",
        "/* leading */ SELECT count() FROM t",
        "((SELECT 1))",
        "( /* c */ SELECT 1)",
        "WITH 1 AS x SELECT x",
        "SHOW TABLES",
        "show full tables from db like '%x%'",
        "SHOW DATABASES",
        "SHOW CREATE TABLE t",
        "SHOW CREATE TEMPORARY TABLE t",
        "DESCRIBE TABLE t",
        "desc t",
        "EXISTS TABLE t",
        "EXPLAIN SELECT 1",
        "SELECT ';' AS semi",
        "SELECT 'it''s; DROP TABLE x'",
        "SELECT 'a\\'; DROP TABLE x'",
        "SELECT \"weird;col\" FROM t",
        "SELECT `x;y` FROM t",
        "SELECT format FROM t",
        "SELECT format('{} {}', 'a', 'b')",
        "SELECT x AS format FROM t",
        "SELECT t.format FROM t",
        "SELECT t.settings FROM t",
        "SELECT `settings` FROM t",
        "SELECT 1 -- trailing; DROP TABLE x",
        "SELECT 1 /* ; DROP */",
        "SELECT 1e10, 0x1F, 1.5",
        "SELECT 'ünïcödé' AS s, ü FROM t",
        "SELECT 'url(1)', 'system.processes', 'SETTINGS x = 1' FROM t",
    ] {
        assert_eq!(check_read_only(sql), Ok(()), "{sql}");
    }
}

#[test]
fn reads_with_functions_tables_and_joins_pass() {
    for sql in [
        "SELECT count() FROM numbers(10)",
        "SELECT * FROM numbers_mt(10) AS n JOIN zeros(3) AS z ON 1",
        "SELECT number FROM system.numbers LIMIT 3",
        "SELECT dummy FROM system.one",
        "SELECT * FROM `system`.\"one\"",
        "SELECT lower(s), f(a, b) FROM t WHERE g(x) IN (SELECT h(y) FROM u)",
        "SELECT a, lower(b) FROM t1, t2 WHERE c = d ORDER BY a, lower(b) LIMIT 1, 2",
        "SELECT * FROM t1 AS a LEFT JOIN t2 AS b ON a.x = b.x AND lower(a.y) = b.y",
        "SELECT * FROM t1 JOIN t2 USING (a, b)",
        "SELECT x FROM t ARRAY JOIN arr AS x, splitByChar(',', s) AS y",
        "SELECT x FROM t LEFT ARRAY JOIN arrayMap(v -> v + 1, arr) AS x",
        "SELECT extract(DAY FROM toDate(d)), substring(s FROM lower(t)) FROM t",
        "SELECT trim(BOTH ' ' FROM lower(s)) FROM t",
        "SELECT * FROM (SELECT a, b FROM t) AS s, u WHERE s.a = u.a",
        "WITH x AS (SELECT 1 AS a) SELECT a FROM x GROUP BY a HAVING count() > 0",
        "SELECT count() FROM t SAMPLE 0.1",
        "DESCRIBE TABLE numbers(10)",
        "SELECT system.one.dummy FROM system.one",
    ] {
        assert_eq!(check_read_only(sql), Ok(()), "{sql}");
    }
}

#[test]
fn writes_are_refused_as_writes() {
    for (sql, kw) in [
        ("INSERT INTO t VALUES (1)", "INSERT"),
        ("insert into t values (1)", "INSERT"),
        ("ALTER TABLE t DELETE WHERE 1", "ALTER"),
        ("DROP TABLE t", "DROP"),
        (
            "/* hi */ CREATE TABLE x (a UInt8) ENGINE = Memory",
            "CREATE",
        ),
        ("TRUNCATE TABLE t", "TRUNCATE"),
        ("KILL QUERY WHERE 1", "KILL"),
        ("SYSTEM SHUTDOWN", "SYSTEM"),
        ("SET readonly = 0", "SET"),
        ("(INSERT INTO t VALUES (1))", "INSERT"),
        ("OPTIMIZE TABLE t FINAL", "OPTIMIZE"),
    ] {
        let err = refused(sql);
        assert_eq!(err, SqlError::Write(kw.into()), "{sql}");
        assert!(err.is_write());
        assert!(err.to_string().contains("read-only"), "{err}");
        assert!(err.to_string().contains(kw), "{err}");
    }
}

#[test]
fn several_statements_are_refused() {
    for sql in [
        "SELECT 1; SELECT 2",
        "SELECT 1; DROP TABLE t",
        "SELECT 1;;",
        "SELECT 1; -- then\nINSERT INTO t VALUES (1)",
        "SELECT 1 # ; DROP TABLE t",
        "SELECT $$; DROP TABLE t$$",
        "SELECT 1 // ; DROP TABLE t",
    ] {
        let err = refused(sql);
        assert_eq!(err, SqlError::MultiStatement, "{sql}");
        assert!(!err.is_write());
    }
}

#[test]
fn nested_comment_openers_are_read_both_ways() {
    // 18.16 ends the comment at the first close and sees a second statement.
    assert_eq!(
        refused("SELECT 1 /* /* */ ; DROP TABLE t; /* */"),
        SqlError::MultiStatement
    );
    // A current server nests: what 18.16 sees as comment-then-code, it sees as comment.
    assert_eq!(check_read_only("SELECT 1 /* /* */ x */"), Ok(()));
}

#[test]
fn empty_and_odd_inputs() {
    assert_eq!(check_read_only(""), Err(SqlError::Empty));
    assert_eq!(check_read_only("  -- only a comment"), Err(SqlError::Empty));
    assert_eq!(check_read_only("/* x */ ;"), Err(SqlError::Empty));
    assert_eq!(
        check_read_only("SELECT 'x"),
        Err(SqlError::Unterminated("string"))
    );
    assert_eq!(
        check_read_only("SELECT `x"),
        Err(SqlError::Unterminated("quoted identifier"))
    );
    assert_eq!(
        check_read_only("SELECT 1 /* x"),
        Err(SqlError::Unterminated("comment"))
    );
    assert_eq!(
        check_read_only("SELEC 1"),
        Err(SqlError::NotRead("SELEC".into()))
    );
    assert_eq!(check_read_only("42"), Err(SqlError::NoKeyword));
    assert_eq!(check_read_only("'SELECT'"), Err(SqlError::NoKeyword));
}

#[test]
fn settings_clause_is_refused_however_it_is_written() {
    for sql in [
        "SELECT 1 SETTINGS max_execution_time = 1000",
        "SELECT 1 settings max_result_rows=0",
        "SELECT * FROM (SELECT 1 SETTINGS max_threads = 64)",
        // Quoted names, as the issue found them.
        "SELECT 1 SETTINGS `max_execution_time` = 0, `max_threads` = 64",
        "SELECT 1 SETTINGS \"max_execution_time\" = 0",
        // Comments, every kind a server may skip, between the words.
        "SELECT 1 SETTINGS /* x */ max_execution_time = 0",
        "SELECT 1 SETTINGS -- x\n max_execution_time = 0",
        "SELECT 1 SETTINGS # x\n max_execution_time = 0",
        "SELECT 1 SETTINGS // x\n max_execution_time = 0",
        "SELECT 1 SETTINGS /* /* */ */ max_execution_time = 0",
        // Case, and whitespace ClickHouse skips that other lexers might not.
        "SELECT 1 SeTtInGs max_execution_time = 0",
        "SELECT 1 SETTINGS\u{b}max_execution_time = 0",
        "SELECT 1\u{a0}SETTINGS\u{a0}max_execution_time = 0",
        "SELECT 1 FORMAT JSON SETTINGS x = 1",
    ] {
        let err = refused(sql);
        assert!(
            matches!(err, SqlError::SettingsClause | SqlError::FormatClause),
            "{sql}: {err:?}"
        );
        assert!(err.to_string().contains("not accepted"), "{err}");
    }
}

#[test]
fn format_clause_is_refused() {
    for sql in [
        "SELECT 1 FORMAT TSV",
        "SELECT 1 format Native;",
        "SELECT 1 FORMAT `TabSeparated`",
        "SELECT 1 FORMAT /* c */ \"CSV\"",
    ] {
        assert_eq!(refused(sql), SqlError::FormatClause, "{sql}");
    }
}

#[test]
fn table_functions_are_refused_however_they_are_written() {
    for (sql, name) in [
        (
            "SELECT * FROM url('http://127.0.0.1:9090/metrics', 'TSV', 'line String')",
            "url",
        ),
        (
            "SELECT * FROM remote('127.0.0.1:9000', 'default', 'events', 'default', '')",
            "remote",
        ),
        ("SELECT * FROM URL('http://x/', 'TSV', 'a String')", "URL"),
        ("SELECT * FROM `url`('http://x/', 'TSV', 'a String')", "url"),
        ("SELECT * FROM \"remote\"('h', 'd', 't')", "remote"),
        ("SELECT * FROM /* c */ url /* c */ ('http://x/')", "url"),
        ("SELECT * FROM\u{a0}url('http://x/')", "url"),
        (
            "SELECT * FROM t, remoteSecure('h', 'd', 't')",
            "remoteSecure",
        ),
        (
            "SELECT * FROM t JOIN cluster('c', 'd', 't') USING a",
            "cluster",
        ),
        (
            "SELECT * FROM file('/etc/passwd', 'TSV', 'l String')",
            "file",
        ),
        ("SELECT file('/etc/passwd')", "file"),
        ("SELECT * FROM s3('http://x/b/k')", "s3"),
        ("SELECT * FROM merge('system', '^proc')", "merge"),
        ("SELECT * FROM view(SELECT 1)", "view"),
        ("SELECT * FROM format(JSONEachRow, '{\"a\": 1}')", "format"),
        (
            "SELECT * FROM tomorrowsTableFunction('x')",
            "tomorrowsTableFunction",
        ),
        ("SELECT * FROM t WHERE x IN url('http://x/')", "url"),
        (
            "SELECT x FROM (SELECT * FROM mysql('h', 'd', 't', 'u', 'p'))",
            "mysql",
        ),
        ("SELECT extract(DAY FROM d) FROM url('http://x/')", "url"),
        ("DESCRIBE TABLE url('http://x/', 'TSV')", "url"),
        ("DESC remote('h', 'd', 't')", "remote"),
        ("EXISTS TABLE odbc('dsn', 't')", "odbc"),
        ("SELECT * FROM t1, t2, tomorrows('x')", "tomorrows"),
    ] {
        let err = refused(sql);
        assert_eq!(err, SqlError::TableFunction(name.into()), "{sql}");
        assert!(err.to_string().contains(&format!("{name}()")), "{err}");
        assert!(
            err.to_string().contains("numbers"),
            "names what is allowed: {err}"
        );
    }
}

#[test]
fn server_tables_are_refused_however_they_are_written() {
    for (sql, table) in [
        ("SELECT query FROM system.processes", "system.processes"),
        ("SELECT * FROM SYSTEM.PROCESSES", "SYSTEM.PROCESSES"),
        ("SELECT * FROM `system`.`processes`", "system.processes"),
        ("SELECT * FROM \"system\".\"query_log\"", "system.query_log"),
        (
            "SELECT * FROM system /* x */ . /* y */ users",
            "system.users",
        ),
        ("SELECT * FROM system // x\n.processes", "system.processes"),
        ("SELECT * FROM system # x\n.processes", "system.processes"),
        (
            "SELECT * FROM system /* /* */ */ .processes",
            "system.processes",
        ),
        ("SELECT * FROM system\u{b}.processes", "system.processes"),
        (
            "SELECT * FROM t WHERE x IN (SELECT query FROM system.processes)",
            "system.processes",
        ),
        (
            "SELECT * FROM t JOIN system.settings AS s ON 1",
            "system.settings",
        ),
        ("DESCRIBE TABLE system.processes", "system.processes"),
        (
            "SELECT * FROM information_schema.tables",
            "information_schema.tables",
        ),
        (
            "SELECT * FROM INFORMATION_SCHEMA.COLUMNS",
            "INFORMATION_SCHEMA.COLUMNS",
        ),
    ] {
        let err = refused(sql);
        assert_eq!(err, SqlError::SystemTable(table.into()), "{sql}");
        assert!(err.to_string().contains(table), "{err}");
        assert!(
            err.to_string().contains("system.one"),
            "names what is allowed: {err}"
        );
    }
}

#[test]
fn show_forms_that_read_the_server_are_refused() {
    for (sql, what) in [
        ("SHOW PROCESSLIST", "PROCESSLIST"),
        ("show processlist", "PROCESSLIST"),
        ("SHOW USERS", "USERS"),
        ("SHOW GRANTS", "GRANTS"),
        ("SHOW SETTINGS LIKE '%'", "SETTINGS"),
        ("SHOW CREATE USER default", "CREATE USER"),
        ("SHOW ACCESS", "ACCESS"),
        ("SHOW", ""),
    ] {
        let err = refused(sql);
        assert_eq!(err, SqlError::Show(what.into()), "{sql}");
        assert!(err.to_string().contains("SHOW TABLES"), "{err}");
        assert!(
            err.to_string()
                .starts_with(&format!("{} is not", format!("SHOW {what}").trim_end())),
            "{err}"
        );
    }
}

#[test]
fn escaped_quoted_names_are_refused() {
    for sql in [
        "SELECT * FROM `\\x73ystem`.processes",
        "SELECT * FROM `sys\\Ntem`.processes",
        "SELECT * FROM \"u\\rl\"('http://x/')",
        "SELECT `a\\`b` FROM t",
    ] {
        assert_eq!(refused(sql), SqlError::EscapedIdentifier, "{sql}");
    }
}

#[test]
fn identifier_parameters_are_refused() {
    for (sql, name) in [
        ("SELECT query FROM {t:Identifier}", "t"),
        ("SELECT {c: identifier} FROM t", "c"),
        ("SELECT * FROM {db:Identifier}.{t:Identifier}", "db"),
    ] {
        assert_eq!(
            refused(sql),
            SqlError::IdentifierParameter(name.into()),
            "{sql}"
        );
    }
    // Parameters that carry values stay.
    assert_eq!(
        check_read_only("SELECT * FROM t WHERE id = {id:UInt64} AND s = {s:String}"),
        Ok(())
    );
}

#[test]
fn refusals_are_bad_requests_not_writes() {
    for sql in [
        "SELECT 1 SETTINGS max_threads = 1",
        "SELECT * FROM url('http://x/')",
        "SELECT * FROM system.processes",
        "SHOW PROCESSLIST",
    ] {
        assert!(!refused(sql).is_write(), "{sql}");
    }
}
