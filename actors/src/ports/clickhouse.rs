//! The ClickHouse port: an [`Inserter`], the request it takes and the classified
//! failures it answers with.

use std::fmt;
use std::future::Future;
use std::time::Duration;

use bytes::Bytes;
use serde::Serialize;

use super::TableKey;

// === Class ===

/// What a failed insert says about the rows it carried.
///
/// The line is drawn at the exception code: a code means ClickHouse read the request
/// and judged it, so any code that is not known to mean "cannot take it now" or "the
/// connection is misconfigured" is a verdict on the rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Class {
    /// The rows are at fault: isolate them and park the ones rejected alone.
    Rejected,
    /// ClickHouse cannot take them now: keep them queued and back off.
    Unavailable,
    /// The connection's configuration (user, password, grants): back off, never park.
    Denied,
    /// Nothing says a row was judged: back off, never park.
    Unknown,
}

impl Class {
    pub fn as_str(self) -> &'static str {
        match self {
            Class::Rejected => "rejected",
            Class::Unavailable => "unavailable",
            Class::Denied => "denied",
            Class::Unknown => "unknown",
        }
    }

    /// An outage of the pool (or, when table-scoped, of one table): the rows are kept.
    pub fn is_outage(self) -> bool {
        !matches!(self, Class::Rejected)
    }
}

impl fmt::Display for Class {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self {
            Class::Rejected => "Rejected",
            Class::Unavailable => "Unavailable",
            Class::Denied => "Denied",
            Class::Unknown => "Unknown",
        };
        f.write_str(name)
    }
}

// === ClickHouseError ===

/// A classified failure of one request to ClickHouse: an insert (the actors judge rows
/// by it) or a query (the gateway answers and retries by it). One type, because one
/// classifier (`src/clickhouse/classify.rs`) reads both.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ClickHouseError {
    pub class: Class,
    /// ClickHouse's exception code, from the `X-ClickHouse-Exception-Code` header or the
    /// body's leading `Code: NNN`; `None` for transport failures and codeless answers.
    pub code: Option<u32>,
    /// Backs off the one table, not the whole pool (read-only table, missing grant...).
    pub table_scoped: bool,
    /// A multi-row batch may succeed when split (too many parts, memory limit).
    pub splittable: bool,
    /// The table or its database does not exist (yet): the same for every row of the
    /// batch, it names none. Class stays `Rejected` (the query path answers 404), but
    /// ingest waits for the table, table-scoped, before it parks anything.
    pub missing_table: bool,
    /// The HTTP status, when an answer came back at all.
    pub status: Option<u16>,
    /// ClickHouse's message (or the transport error), already capped by the adapter.
    pub message: String,
    /// Why no answer came, for a transport failure (`status` is `None` then): told by
    /// the adapter from its client's error, so nothing decides by the message's words.
    #[serde(skip)]
    pub no_answer: Option<NoAnswer>,
}

/// Why a request to ClickHouse got no answer at all. A ClickHouse that crashes on the
/// rows it is sent loses the connection it took them on; one that is not there refuses
/// it, and a frozen or slow one times out: only the first is weighed against the rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NoAnswer {
    /// No connection was made (refused, unreachable, DNS): the rows were never sent.
    Refused,
    /// No answer within the request's timeout.
    TimedOut,
    /// The connection was made and went away with no answer (reset, closed mid-answer).
    Lost,
}

impl ClickHouseError {
    /// The label used for `reason` in metrics and logs.
    pub fn reason(&self) -> &'static str {
        self.class.as_str()
    }

    /// The connection was made and then went away with no answer (reset, closed
    /// mid-answer): what a ClickHouse that crashes on a request looks like. A connection
    /// never made (refused: the server was not there when the rows were sent) and a
    /// timeout (a frozen or slow server) are not that.
    pub fn lost_connection(&self) -> bool {
        self.no_answer == Some(NoAnswer::Lost)
    }
}

impl fmt::Display for ClickHouseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.code {
            Some(code) => write!(f, "{} (code {code}): {}", self.class, self.message),
            None => write!(f, "{}: {}", self.class, self.message),
        }
    }
}

impl std::error::Error for ClickHouseError {}

// === Inserter ===

/// One insert request: NDJSON rows for one table of the inserter's target.
#[derive(Clone, Debug)]
pub struct InsertRequest {
    pub table: TableKey,
    /// The rows as they came, each followed by `\n` (JSONEachRow).
    pub body: Bytes,
    pub rows: usize,
    /// Skip fields the table does not have instead of rejecting the row (per-table option).
    pub skip_unknown_fields: bool,
    /// Set for a table that deduplicates inserts: every attempt of these exact rows
    /// carries the same token. Sent as `insert_deduplication_token` where the server
    /// knows the setting, with `insert_deduplicate=1`; older servers deduplicate the
    /// identical block by its hash.
    pub dedup_token: Option<String>,
}

/// Whether ClickHouse deduplicates inserts into a table, which is what makes a retry of
/// the same rows harmless and exactly-once possible.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Dedup {
    /// Sluice records the table's batches and counts on ClickHouse to drop a retry:
    /// the table deduplicates, its window covers a redelivery, and nothing else on it
    /// (a materialized view on a server that skips views on a retry) would lose rows.
    pub exactly_once: bool,
    /// Why, in a sentence an operator can act on: the engine, the window against the
    /// blocks a redelivery may come after, what to set.
    pub why: String,
    /// The table's deduplication window, when it deduplicates at all (whether or not
    /// it covers a redelivery): what a retry must come within to be dropped.
    pub window: Option<DedupWindow>,
}

/// How far back ClickHouse remembers the blocks a table took: a retry of a block is
/// dropped only while its hash is among the last `blocks` and younger than `seconds`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct DedupWindow {
    /// `replicated_deduplication_window` (or `non_replicated_deduplication_window`).
    pub blocks: u64,
    /// `replicated_deduplication_window_seconds`, counted back from the table's newest
    /// block; `None`: no limit in time (the non-replicated window has none).
    pub seconds: Option<Duration>,
}

/// What a successful probe learnt about the server.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ServerInfo {
    pub version: String,
}

/// Inserts rows into one ClickHouse target (URL + user + database).
///
/// The real implementation is the HTTP client; every failure comes back classified.
pub trait Inserter: Send + Sync + 'static {
    fn insert(
        &self,
        request: InsertRequest,
    ) -> impl Future<Output = Result<(), ClickHouseError>> + Send;

    /// A cheap request proving the target answers (used for readiness).
    fn probe(&self) -> impl Future<Output = Result<ServerInfo, ClickHouseError>> + Send;

    /// Whether Sluice may count on ClickHouse to drop a retried insert into `table`: it
    /// deduplicates (a `Replicated*MergeTree`, or a `MergeTree` with
    /// `non_replicated_deduplication_window` > 0 where the server has it) over a window
    /// that covers a redelivery, and no materialized view loses rows when a retry is
    /// dropped. Asked before a table's batches are formed; what the server says of the
    /// table may be cached by the implementation for a short while.
    fn deduplicates(
        &self,
        table: &TableKey,
    ) -> impl Future<Output = Result<Dedup, ClickHouseError>> + Send;
}
