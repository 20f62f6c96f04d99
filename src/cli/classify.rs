//! `sluice classify`: what Sluice would do with a ClickHouse failure.
//!
//! Each line comes from the path's own rule, never from a table kept here: the ingest
//! line from the classifier, the query line from the gateway's mapping.

use std::process::ExitCode;

use crate::clickhouse::classify;
use crate::query;

pub fn run(what: &str) -> ExitCode {
    let Some(error) = classify::from_text(what) else {
        eprintln!(
            "cannot classify {what:?}: give an exception code (252), an error text starting with \"Code: NNN\", or status:NNN"
        );
        return ExitCode::from(2);
    };
    let mut flags = Vec::new();
    if error.table_scoped {
        flags.push("table-scoped");
    }
    if error.splittable {
        flags.push("splittable");
    }
    if error.missing_table {
        flags.push("missing-table");
    }
    println!("class: {}", error.class);
    match error.code {
        Some(code) => println!("code: {code}"),
        None => println!("code: (none)"),
    }
    println!(
        "flags: {}",
        if flags.is_empty() {
            "none".to_string()
        } else {
            flags.join(", ")
        }
    );
    println!("ingest: {}", classify::ingest_action(&error));
    println!("query: {}", query::query_action(&error));
    ExitCode::SUCCESS
}
