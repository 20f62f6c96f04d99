//! The check of the SQL a tenant sends, before anything reaches ClickHouse: the guard
//! that keeps a query within the gateway's limits whatever it says.
//!
//! ClickHouse alone cannot be that guard. The query profile is `readonly=2`, which
//! forbids writes but lets a request change settings (the gateway needs that to send
//! `max_execution_time` and `query_id`), so a `SETTINGS` clause in the query would
//! lift the limits; and 18.16 has no settings constraints (19.14 brought them). Table
//! functions reach out or around (`url()` fetches any URL the server can reach,
//! `remote()` reads as another user), and `system.processes` shows other users' query
//! text. So the gateway refuses, never rewrites:
//! - anything but one read statement (writes are 403, the rest 400);
//! - a `SETTINGS` clause (the gateway pins the query's limits) and a `FORMAT` clause
//!   (the output is the request's `format`);
//! - a table function other than `numbers`/`zeros` (`names.rs`): any `name(` where a
//!   table goes, and any known table function's name followed by `(` anywhere;
//! - a table of `system` or `information_schema` outside a small allow-list, and the
//!   `SHOW` forms that read the server's state;
//! - a quoted identifier with a backslash escape, since servers decode those
//!   differently and what it names cannot be known here, and a query parameter of
//!   type `Identifier`, whose value ClickHouse splices in as a name the check never
//!   sees.
//!
//! It is a small lexer and a token scan, not a parser. Bare keywords count whatever
//! their case; quoted identifiers (`"system"`, `` `url` ``) count as the names they
//! spell, never as keywords, as ClickHouse reads them. Comments are read every way a
//! server might read them (`lex.rs`), and the statement must pass in each reading.
//! Where it is unsure it refuses.

mod check;
mod lex;
mod names;

#[cfg(test)]
mod tests;

use std::fmt;

pub use names::{ALLOWED_SYSTEM_TABLES, ALLOWED_TABLE_FUNCTIONS, SERVER_DATABASES};

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
    /// A table function outside the allow-list (its name as written).
    TableFunction(String),
    /// A table of a server database outside the allow-list (`system.processes`).
    SystemTable(String),
    /// A `SHOW` form that reads the server's state (the word after `SHOW`).
    Show(String),
    /// A quoted identifier with a backslash escape.
    EscapedIdentifier,
    /// A query parameter of type `Identifier` (its name): its value becomes a name.
    IdentifierParameter(String),
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
                "a SETTINGS clause is not accepted: the gateway sets the query's time and result limits itself (a column named settings can be written `settings`)"
            ),
            SqlError::FormatClause => write!(
                f,
                "a FORMAT clause is not accepted: choose the output with the request's \"format\" field (JSON or JSONCompact)"
            ),
            SqlError::TableFunction(name) => write!(
                f,
                "the table function {name}() is not accepted: queries read ClickHouse tables, and of the table functions only {} are allowed",
                ALLOWED_TABLE_FUNCTIONS.join(", ")
            ),
            SqlError::SystemTable(table) => write!(
                f,
                "{table} is not accepted: of the {} tables only {} are allowed",
                SERVER_DATABASES.join(" and "),
                ALLOWED_SYSTEM_TABLES
                    .iter()
                    .map(|t| format!("system.{t}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            SqlError::Show(what) => write!(
                f,
                "{} is not accepted: the gateway runs SHOW TABLES, SHOW DATABASES, SHOW COLUMNS and SHOW CREATE TABLE",
                format!("SHOW {what}").trim_end()
            ),
            SqlError::IdentifierParameter(name) => write!(
                f,
                "the query parameter {{{name}:Identifier}} is not accepted: a parameter carries a value, never a table or column name (write names in the sql)"
            ),
            SqlError::EscapedIdentifier => write!(
                f,
                "a quoted identifier with a backslash escape is not accepted: write the name without escapes"
            ),
        }
    }
}

/// Check one statement; `Ok` means it may be sent (ClickHouse still has the last word).
/// It must pass in every reading a server may take; a reading a server could not lex
/// at all (an unterminated string or comment) is one that server refuses itself.
pub fn check_read_only(sql: &str) -> Result<(), SqlError> {
    let mut unreadable = None;
    let mut readable = false;
    for reading in lex::Reading::all() {
        match lex::lex(sql, reading) {
            Ok(tokens) => {
                check::check(&tokens)?;
                readable = true;
            }
            Err(lex::Unterminated(what)) => {
                unreadable.get_or_insert(SqlError::Unterminated(what));
            }
        }
    }
    match unreadable {
        Some(error) if !readable => Err(error),
        _ => Ok(()),
    }
}
