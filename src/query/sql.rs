//! A conservative check of the SQL a tenant sends, before anything reaches ClickHouse.
//!
//! The real guard against writes is ClickHouse's `readonly=2`, pinned on every request.
//! This check exists so that a write attempt is refused with a clear 403 before it costs
//! a round trip, and never looks like an outage (ClickHouse answers a write under
//! readonly with code 164, which the ingest path treats as Unavailable).
//!
//! It is a small lexer, not a parser: it knows comments, strings and quoted
//! identifiers well enough to find the leading keyword, statement separators and two
//! clauses the gateway owns (`SETTINGS`, `FORMAT`). Where it is unsure it refuses: it
//! never treats as a comment or string anything ClickHouse might read as code (block
//! comments are not nested, `#` and `$$` are plain characters), so whatever ClickHouse
//! could execute, this lexer has seen as tokens.

use std::fmt;

/// Statements a read-only gateway runs.
pub const READ_KEYWORDS: &[&str] = &[
    "SELECT", "WITH", "SHOW", "DESCRIBE", "DESC", "EXISTS", "EXPLAIN",
];

/// Statements that write or administer: refused as writes (403), not as nonsense (400).
const WRITE_KEYWORDS: &[&str] = &[
    "INSERT", "ALTER", "DROP", "CREATE", "TRUNCATE", "RENAME", "ATTACH", "DETACH", "OPTIMIZE",
    "KILL", "SYSTEM", "SET", "USE", "GRANT", "REVOKE", "DELETE", "UPDATE", "CHECK", "EXCHANGE",
    "UNDROP", "REPLACE", "BACKUP", "RESTORE", "MOVE", "UPSERT", "MERGE",
];

/// Why a statement is refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SqlError {
    /// Nothing but whitespace and comments.
    Empty,
    /// A string, quoted identifier or block comment that never ends.
    Unterminated(&'static str),
    /// More than one statement.
    MultiStatement,
    /// A statement that writes or administers (the keyword, upper-cased).
    Write(String),
    /// A leading word that is not a read statement the gateway knows.
    NotRead(String),
    /// The statement does not start with a keyword at all.
    NoKeyword,
    /// A `SETTINGS` clause: it would override the limits the gateway sets.
    SettingsClause,
    /// A `FORMAT` clause: the output format is the request's `format` field.
    FormatClause,
}

impl SqlError {
    /// Writes are refused as a permission matter (403); the rest are bad requests (400).
    pub fn is_write(&self) -> bool {
        matches!(self, SqlError::Write(_))
    }
}

impl fmt::Display for SqlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let allowed = READ_KEYWORDS.join(", ");
        match self {
            SqlError::Empty => write!(f, "sql is empty"),
            SqlError::Unterminated(what) => write!(f, "sql has an unterminated {what}"),
            SqlError::MultiStatement => write!(
                f,
                "sql holds more than one statement; send one statement per request"
            ),
            SqlError::Write(kw) => write!(
                f,
                "the query gateway is read-only: {kw} statements are refused (allowed: {allowed})"
            ),
            SqlError::NotRead(word) => write!(
                f,
                "sql must be a read statement starting with one of {allowed}; it starts with {word:?}"
            ),
            SqlError::NoKeyword => write!(
                f,
                "sql must be a read statement starting with one of {allowed}"
            ),
            SqlError::SettingsClause => write!(
                f,
                "a SETTINGS clause is not accepted: the gateway sets the query's time and result limits itself"
            ),
            SqlError::FormatClause => write!(
                f,
                "a FORMAT clause is not accepted: choose the output with the request's \"format\" field (JSON or JSONCompact)"
            ),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Token {
    /// A bare word, upper-cased.
    Word(String),
    /// A string literal, quoted identifier or number: opaque.
    Literal,
    Punct(char),
}

/// Check one statement; `Ok` means it may be sent (ClickHouse still has the last word).
pub fn check_read_only(sql: &str) -> Result<(), SqlError> {
    let tokens = lex(sql)?;
    if tokens.is_empty() {
        return Err(SqlError::Empty);
    }
    // One statement, optionally followed by a single `;` and nothing else.
    if let Some(pos) = tokens.iter().position(|t| *t == Token::Punct(';')) {
        if pos + 1 != tokens.len() {
            return Err(SqlError::MultiStatement);
        }
        if pos == 0 {
            return Err(SqlError::Empty);
        }
    }
    let body: &[Token] = match tokens.last() {
        Some(Token::Punct(';')) => &tokens[..tokens.len() - 1],
        _ => &tokens,
    };

    let first = body.iter().find(|t| **t != Token::Punct('('));
    match first {
        Some(Token::Word(word)) => {
            if READ_KEYWORDS.contains(&word.as_str()) {
                // fine
            } else if WRITE_KEYWORDS.contains(&word.as_str()) {
                return Err(SqlError::Write(word.clone()));
            } else {
                return Err(SqlError::NotRead(word.clone()));
            }
        }
        _ => return Err(SqlError::NoKeyword),
    }

    for (i, token) in body.iter().enumerate() {
        let prev_is_dot = i > 0 && body[i - 1] == Token::Punct('.');
        if prev_is_dot {
            continue; // `system.settings`, `t.format`: names, not clauses
        }
        match token {
            // `SETTINGS name = value`: the clause, wherever it sits (subqueries too).
            Token::Word(w)
                if w == "SETTINGS"
                    && matches!(body.get(i + 1), Some(Token::Word(_)))
                    && body.get(i + 2) == Some(&Token::Punct('=')) =>
            {
                return Err(SqlError::SettingsClause);
            }
            // `FORMAT Name` at the end of the statement (or before SETTINGS).
            Token::Word(w)
                if w == "FORMAT"
                    && matches!(body.get(i + 1), Some(Token::Word(_)))
                    && match body.get(i + 2) {
                        None => true,
                        Some(Token::Word(next)) => next == "SETTINGS",
                        Some(_) => false,
                    } =>
            {
                return Err(SqlError::FormatClause);
            }
            _ => {}
        }
    }
    Ok(())
}

fn lex(sql: &str) -> Result<Vec<Token>, SqlError> {
    let bytes = sql.as_bytes();
    let mut tokens = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i];
        match c {
            _ if c.is_ascii_whitespace() => i += 1,
            b'-' if bytes.get(i + 1) == Some(&b'-') => {
                while i < bytes.len() && bytes[i] != b'\n' {
                    i += 1;
                }
            }
            b'/' if bytes.get(i + 1) == Some(&b'*') => {
                let rest = &sql[i + 2..];
                match rest.find("*/") {
                    Some(end) => i += 2 + end + 2,
                    None => return Err(SqlError::Unterminated("comment")),
                }
            }
            b'\'' | b'"' | b'`' => {
                i = skip_quoted(bytes, i)?;
                tokens.push(Token::Literal);
            }
            _ if c.is_ascii_alphabetic() || c == b'_' => {
                let start = i;
                while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_') {
                    i += 1;
                }
                tokens.push(Token::Word(sql[start..i].to_ascii_uppercase()));
            }
            _ if c.is_ascii_digit() => {
                // Numbers, including `1e10`, `0x1F`, `1.5`: one opaque token.
                while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'.') {
                    i += 1;
                }
                tokens.push(Token::Literal);
            }
            _ if c.is_ascii() => {
                tokens.push(Token::Punct(c as char));
                i += 1;
            }
            _ => {
                // A non-ASCII character outside quotes: step over the whole char.
                let ch = sql[i..].chars().next().unwrap_or('\u{FFFD}');
                tokens.push(Token::Punct(ch));
                i += ch.len_utf8().max(1);
            }
        }
    }
    Ok(tokens)
}

/// The index just past a quoted token starting at `start`. Backslash escapes and a
/// doubled quote both stay inside, as ClickHouse reads them.
fn skip_quoted(bytes: &[u8], start: usize) -> Result<usize, SqlError> {
    let quote = bytes[start];
    let what = match quote {
        b'\'' => "string",
        _ => "quoted identifier",
    };
    let mut i = start + 1;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' => i += 2,
            q if q == quote => {
                if bytes.get(i + 1) == Some(&quote) {
                    i += 2;
                } else {
                    return Ok(i + 1);
                }
            }
            _ => i += 1,
        }
    }
    Err(SqlError::Unterminated(what))
}

#[cfg(test)]
mod tests {
    use super::*;

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
            "DESCRIBE TABLE t",
            "desc t",
            "EXISTS TABLE t",
            "EXPLAIN SELECT 1",
            "SELECT ';' AS semi",
            "SELECT 'it''s; DROP TABLE x'",
            "SELECT 'a\\'; DROP TABLE x'",
            "SELECT \"weird;col\" FROM t",
            "SELECT `x;y` FROM t",
            "SELECT * FROM system.settings WHERE name = 'max_threads'",
            "SELECT name FROM system.settings",
            "SELECT format FROM t",
            "SELECT format('{} {}', 'a', 'b')",
            "SELECT x AS format FROM t",
            "SELECT t.format FROM t",
            "SELECT 1 -- trailing; DROP TABLE x",
            "SELECT 1 /* ; DROP */",
            "SELECT 1e10, 0x1F, 1.5",
            "SELECT 'ünïcödé' AS s, ü FROM t",
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
            let err = check_read_only(sql).expect_err(sql);
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
        ] {
            let err = check_read_only(sql).expect_err(sql);
            assert_eq!(err, SqlError::MultiStatement, "{sql}");
            assert!(!err.is_write());
        }
    }

    #[test]
    fn nested_comment_openers_end_at_the_first_close() {
        // ClickHouse versions differ on nesting; ending early shows us more tokens.
        let err = check_read_only("SELECT 1 /* /* */ ; DROP TABLE t; /* */").expect_err("x");
        assert_eq!(err, SqlError::MultiStatement);
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
    fn settings_clause_is_refused() {
        for sql in [
            "SELECT 1 SETTINGS max_execution_time = 1000",
            "SELECT 1 settings max_result_rows=0",
            "SELECT * FROM (SELECT 1 SETTINGS max_threads = 64)",
        ] {
            assert_eq!(check_read_only(sql), Err(SqlError::SettingsClause), "{sql}");
        }
    }

    #[test]
    fn format_clause_is_refused() {
        for sql in [
            "SELECT 1 FORMAT TSV",
            "SELECT 1 format Native;",
            "SELECT 1 FORMAT JSON SETTINGS x = 1",
        ] {
            let err = check_read_only(sql).expect_err(sql);
            assert!(
                matches!(err, SqlError::FormatClause | SqlError::SettingsClause),
                "{sql}: {err:?}"
            );
        }
    }
}
