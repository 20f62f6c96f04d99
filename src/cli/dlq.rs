//! `sluice dlq list | peek | replay | purge`: the dead-letter queue from a shell,
//! through the admin endpoint, with the admin page's confirmations: a replay asks y/N,
//! a purge wants the table's name typed (`--yes` answers for a script).
//!
//! `sluice dlq replay acme.events` sends the request the page's Replay button sends.

use std::io::{BufRead as _, Write as _};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Subcommand};

use super::admin_client::AdminClient;
use crate::admin::{check_limit, PeekPage, Purged, ReplayRequest, DLQ_MAX_LIMIT};
use crate::config::{is_table_name, is_tenant_name, TABLE_NAME_RULE, TENANT_NAME_RULE};
use crate::nats::{DlqCounts, ParkedRow, ReplayReport};

#[derive(Debug, Args)]
pub struct DlqArgs {
    /// The admin endpoint.
    #[arg(
        long,
        env = "SLUICE_ADMIN_URL",
        default_value = "http://127.0.0.1:9090",
        global = true
    )]
    url: String,
    /// The admin token; from the environment rather than a flag, which others can read
    /// in the process list.
    #[arg(
        long,
        env = "SLUICE_ADMIN_TOKEN",
        hide_env_values = true,
        global = true
    )]
    token: Option<String>,
    /// Give up on the admin endpoint after this long.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration, global = true)]
    timeout: Duration,
    #[command(subcommand)]
    command: DlqCommand,
}

#[derive(Debug, Subcommand)]
enum DlqCommand {
    /// Parked rows per table.
    List,
    /// A page of a table's parked rows, oldest first, each with ClickHouse's reason;
    /// nothing is consumed.
    Peek {
        /// The table, as `<tenant>.<table>`.
        #[arg(value_parser = parse_table)]
        table: TableName,
        /// Rows on the page (1 to 10,000).
        #[arg(long, default_value_t = 20, value_parser = parse_limit)]
        limit: usize,
        /// Only rows after this DLQ sequence (the `--after` the previous page printed).
        #[arg(long, default_value_t = 0)]
        after: u64,
        /// Print the endpoint's JSON answer instead.
        #[arg(long)]
        json: bool,
    },
    /// Send a table's parked rows back to the ingest stream (after y/N, unless --yes).
    Replay {
        /// The table, as `<tenant>.<table>`.
        #[arg(value_parser = parse_table)]
        table: TableName,
        /// Rows to replay at most (1 to 10,000: the most the endpoint takes a request).
        #[arg(long, default_value_t = DLQ_MAX_LIMIT, value_parser = parse_limit)]
        limit: usize,
        /// Count what would be replayed; change nothing (asks nothing).
        #[arg(long)]
        dry_run: bool,
        /// Do not ask.
        #[arg(long, short)]
        yes: bool,
    },
    /// Delete a table's parked rows for good (after the table's name is typed, unless
    /// --yes).
    Purge {
        /// The table, as `<tenant>.<table>`.
        #[arg(value_parser = parse_table)]
        table: TableName,
        /// Do not ask.
        #[arg(long, short)]
        yes: bool,
    },
}

/// `<tenant>.<table>`, both names.
#[derive(Clone, Debug, PartialEq, Eq)]
struct TableName {
    tenant: String,
    table: String,
}

impl std::fmt::Display for TableName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.tenant, self.table)
    }
}

fn parse_table(text: &str) -> Result<TableName, String> {
    match text.split_once('.') {
        Some((tenant, table)) if is_tenant_name(tenant) && is_table_name(table) => Ok(TableName {
            tenant: tenant.to_string(),
            table: table.to_string(),
        }),
        _ => Err(format!(
            "{text:?} is not <tenant>.<table> (a tenant {TENANT_NAME_RULE}, a table {TABLE_NAME_RULE}), e.g. acme.events"
        )),
    }
}

/// A page's or a replay's rows: 1 to [`DLQ_MAX_LIMIT`] (a page of none would say
/// nothing of what is parked).
fn parse_limit(text: &str) -> Result<usize, String> {
    let n: usize = text
        .parse()
        .map_err(|_| format!("{text:?} is not a count of rows"))?;
    check_limit(n)
}

pub fn run(args: DlqArgs) -> ExitCode {
    let runtime = match super::small_runtime() {
        Ok(r) => r,
        Err(code) => return code,
    };
    let client = match AdminClient::new(&args.url, args.token, args.timeout) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{e:#}");
            return ExitCode::from(2);
        }
    };
    let outcome = runtime.block_on(async {
        match args.command {
            DlqCommand::List => list(&client).await,
            DlqCommand::Peek {
                table,
                limit,
                after,
                json,
            } => peek(&client, &table, limit, after, json).await,
            DlqCommand::Replay {
                table,
                limit,
                dry_run,
                yes,
            } => replay(&client, &table, limit, dry_run, yes).await,
            DlqCommand::Purge { table, yes } => purge(&client, &table, yes).await,
        }
    });
    match outcome {
        Ok(code) => code,
        Err(e) => {
            eprintln!("{e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn list(client: &AdminClient) -> anyhow::Result<ExitCode> {
    let counts: DlqCounts = client.get("/admin/dlq").await?;
    if counts.tables.is_empty() {
        println!("no row is parked");
        return Ok(ExitCode::SUCCESS);
    }
    let names: Vec<String> = counts
        .tables
        .iter()
        .map(|t| format!("{}.{}", t.tenant, t.table))
        .collect();
    let width = names.iter().map(String::len).max().unwrap_or(0);
    for (name, t) in names.iter().zip(&counts.tables) {
        println!("{name:<width$}  {:>10}", t.rows);
    }
    println!(
        "{} parked in {} tables",
        rows(counts.total),
        counts.tables.len()
    );
    Ok(ExitCode::SUCCESS)
}

async fn peek(
    client: &AdminClient,
    table: &TableName,
    limit: usize,
    after: u64,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let path = format!(
        "/admin/dlq/{}/{}?limit={limit}&after={after}",
        table.tenant, table.table
    );
    if json {
        let page: serde_json::Value = client.get(&path).await?;
        println!("{page:#}");
        return Ok(ExitCode::SUCCESS);
    }
    let page: PeekPage = client.get(&path).await?;
    if page.rows.is_empty() {
        println!(
            "{table}: no parked row{}",
            if after > 0 { " after that" } else { "" }
        );
    }
    for row in &page.rows {
        print_row(row);
    }
    if let Some(next) = page.next_after {
        println!("more: sluice dlq peek {table} --after {next}");
    }
    Ok(ExitCode::SUCCESS)
}

fn print_row(row: &ParkedRow) {
    let h = |name: &str| row.headers.get(name).map(String::as_str);
    let mut about = vec![format!("#{}", row.sequence)];
    if let Some(at) = h("Sluice-Parked-At") {
        about.push(format!("parked {at}"));
    }
    if let Some(class) = h("Sluice-Error-Class") {
        about.push(match h("Sluice-Error-Code") {
            Some(code) => format!("{class} (code {code})"),
            None => class.to_string(),
        });
    }
    match h("Sluice-Deliveries") {
        Some("1") => about.push("1 delivery".to_string()),
        Some(n) => about.push(format!("{n} deliveries")),
        None => {}
    }
    println!("{}", about.join(" · "));
    println!(
        "  reason: {}",
        h("Sluice-Error").unwrap_or("(no reason recorded)")
    );
    println!("  row:    {}", row.row);
    if let Some(bytes) = &row.row_base64 {
        println!("  bytes:  {bytes} (base64: the row is not UTF-8)");
    }
}

async fn replay(
    client: &AdminClient,
    table: &TableName,
    limit: usize,
    dry_run: bool,
    yes: bool,
) -> anyhow::Result<ExitCode> {
    if !dry_run && !yes {
        let parked = parked_rows(client, table).await?;
        if parked == 0 {
            println!("{table}: no row is parked");
            return Ok(ExitCode::SUCCESS);
        }
        let some = if parked as usize > limit {
            format!("the first {limit} of the {parked}")
        } else {
            format!("the {parked}")
        };
        let question = format!(
            "Send {some} parked rows of {table} back to the ingest stream? Each is inserted \
             again; a row that fails again is parked again with the new reason. [y/N] "
        );
        if !matches!(ask(&question)?.trim(), "y" | "Y" | "yes" | "Yes") {
            eprintln!("nothing replayed");
            return Ok(ExitCode::FAILURE);
        }
    }
    let request = ReplayRequest {
        tenant: table.tenant.clone(),
        table: table.table.clone(),
        limit: Some(limit),
        dry_run,
    };
    let report: ReplayReport = client.post("/admin/dlq/replay", &request).await?;
    let verb = if report.dry_run {
        "would be replayed"
    } else {
        "replayed"
    };
    println!(
        "{table}: {} {verb}, {} skipped (not JSON objects), {} failed",
        rows(report.replayed),
        report.skipped,
        report.failed
    );
    for error in &report.errors {
        eprintln!("  {error}");
    }
    Ok(if report.failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

async fn purge(client: &AdminClient, table: &TableName, yes: bool) -> anyhow::Result<ExitCode> {
    let name = table.to_string();
    if !yes {
        let parked = parked_rows(client, table).await?;
        let question = format!(
            "Purging deletes the {} parked of {table} for good: it cannot be undone. Type {table} to confirm: ",
            rows(parked)
        );
        if ask(&question)?.trim() != name {
            eprintln!("nothing purged: the name typed was not {table}");
            return Ok(ExitCode::FAILURE);
        }
    }
    let purged: Purged = client
        .delete(&format!(
            "/admin/dlq/{}/{}?confirm={name}",
            table.tenant, table.table
        ))
        .await?;
    println!("{table}: {} purged", rows(purged.purged));
    Ok(ExitCode::SUCCESS)
}

/// Rows parked for `table` now.
async fn parked_rows(client: &AdminClient, table: &TableName) -> anyhow::Result<u64> {
    let counts: DlqCounts = client.get("/admin/dlq").await?;
    Ok(counts
        .tables
        .iter()
        .find(|t| t.tenant == table.tenant && t.table == table.table)
        .map_or(0, |t| t.rows))
}

/// Asks on stderr (stdout stays the command's output) and reads one line of stdin;
/// no answer (end of input) is an empty one.
fn ask(question: &str) -> anyhow::Result<String> {
    let mut stderr = std::io::stderr();
    write!(stderr, "{question}")?;
    stderr.flush()?;
    let mut answer = String::new();
    std::io::stdin().lock().read_line(&mut answer)?;
    Ok(answer)
}

fn rows(n: u64) -> String {
    if n == 1 {
        "1 row".to_string()
    } else {
        format!("{n} rows")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_is_tenant_dot_table() {
        assert_eq!(
            parse_table("acme.events"),
            Ok(TableName {
                tenant: "acme".into(),
                table: "events".into()
            })
        );
        assert_eq!(
            parse_table("my-tenant.t_1").map(|t| t.to_string()),
            Ok("my-tenant.t_1".to_string())
        );
        for bad in [
            "events",
            "acme.",
            ".events",
            "acme.ev-ents",
            "a*.events",
            "acme.a.b",
        ] {
            assert!(parse_table(bad).is_err(), "{bad}");
        }
    }
}
