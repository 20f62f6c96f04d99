//! The names the check knows: table functions and system tables, refused and allowed.
//! docs/operations.md ("Limits and bad input") documents these lists; names compare
//! without regard to case, so a spelling ClickHouse would refuse is refused here too.

/// Table functions a query may use: they make rows from their arguments alone and
/// reach nothing outside the query.
pub const ALLOWED_TABLE_FUNCTIONS: &[&str] = &["numbers", "numbers_mt", "zeros", "zeros_mt"];

/// Databases that describe the server rather than hold data: other users' query text
/// (`system.processes`, `system.query_log`), users and grants, settings, clusters, and
/// every database's tables and columns (`information_schema`).
pub const SERVER_DATABASES: &[&str] = &["system", "information_schema"];

/// The tables of [`SERVER_DATABASES`] a query may read: constant or generated rows that
/// say nothing about the server or its users.
pub const ALLOWED_SYSTEM_TABLES: &[&str] = &["one", "numbers", "numbers_mt", "zeros", "zeros_mt"];

/// Every table function ClickHouse documents (its docs' table-functions section, 2025),
/// refused wherever `name(` appears, not only in a table position: a table function
/// reaches files, URLs, other servers and other databases, or reads the server's own
/// tables around the check (`merge`, `cluster`, `view`, `loop`...). A table function
/// missing here is still refused wherever a table goes (`FROM`, `JOIN`, a `,` in the
/// table list). `format` is left out: it is also the ordinary string function, and as a
/// table function it only stands in a table position.
pub const TABLE_FUNCTIONS: &[&str] = &[
    "arrowFlight",
    "azureBlobStorage",
    "azureBlobStorageCluster",
    "bigquery",
    "cluster",
    "clusterAllReplicas",
    "cosn",
    "deltaLake",
    "deltaLakeAzure",
    "deltaLakeCluster",
    "deltaLakeLocal",
    "deltaLakeS3",
    "dictionary",
    "executable",
    "file",
    "fileCluster",
    "filesystem",
    "fuzzJSON",
    "fuzzQuery",
    "gcs",
    "generate_series",
    "generateRandom",
    "generateSeries",
    "hdfs",
    "hdfsCluster",
    "hudi",
    "hudiCluster",
    "iceberg",
    "icebergAzure",
    "icebergAzureCluster",
    "icebergCluster",
    "icebergHDFS",
    "icebergHDFSCluster",
    "icebergLocal",
    "icebergS3",
    "icebergS3Cluster",
    "input",
    "jdbc",
    "lance",
    "loop",
    "merge",
    "mergeTreeCodecBlockCounts",
    "mergeTreeIndex",
    "mergeTreeProjection",
    "mergeTreeTextIndex",
    "mongodb",
    "mysql",
    "null",
    "odbc",
    "oss",
    "paimon",
    "paimonCluster",
    "postgresql",
    "primes",
    "prometheusQuery",
    "prometheusQueryRange",
    "redis",
    "remote",
    "remoteSecure",
    "s3",
    "s3Cluster",
    "sqlite",
    "timeSeriesData",
    "timeSeriesMetrics",
    "timeSeriesSamples",
    "timeSeriesSelector",
    "timeSeriesTags",
    "url",
    "urlCluster",
    "values",
    "vectorSearch",
    "view",
    "viewExplain",
    "viewIfPermitted",
    "ytsaurus",
];

/// Functions whose argument lists use `FROM` as a word of their own
/// (`EXTRACT(DAY FROM d)`, `SUBSTRING(s FROM 2)`, `TRIM(BOTH ' ' FROM s)`): there it
/// does not start a table list.
pub const FROM_IN_ARGUMENTS: &[&str] = &["EXTRACT", "SUBSTRING", "SUBSTR", "TRIM", "OVERLAY"];

/// Words that end a `FROM` list at the depth they appear: after them a `,` separates
/// expressions, not tables. (`ARRAY`: `ARRAY JOIN` takes expressions.)
pub const FROM_LIST_ENDS: &[&str] = &[
    "WHERE",
    "PREWHERE",
    "GROUP",
    "ORDER",
    "LIMIT",
    "OFFSET",
    "FETCH",
    "HAVING",
    "WINDOW",
    "QUALIFY",
    "UNION",
    "INTERSECT",
    "EXCEPT",
    "SELECT",
    "WITH",
    "SAMPLE",
    "INTO",
    "FORMAT",
    "SETTINGS",
    "ARRAY",
];

/// The `SHOW` statements the gateway runs: lists of tables, databases and columns,
/// and a table's `CREATE`. Others read the server's state (`SHOW PROCESSLIST`,
/// `SHOW USERS`, `SHOW GRANTS`, `SHOW SETTINGS`...). Modifiers such as `FULL` come
/// before the word and are passed over.
pub const SHOW_ALLOWED: &[&str] = &["TABLES", "DATABASES", "COLUMNS", "FIELDS", "CREATE"];

/// Words that may stand between `SHOW` and what it shows.
pub const SHOW_MODIFIERS: &[&str] = &["FULL", "EXTENDED", "TEMPORARY", "TERSE"];

/// What `SHOW CREATE` may show (the word must be written: `SHOW CREATE USER` is not a table).
pub const SHOW_CREATE_ALLOWED: &[&str] = &["TABLE", "VIEW", "DICTIONARY", "DATABASE"];

pub fn contains(list: &[&str], name: &str) -> bool {
    list.iter().any(|n| n.eq_ignore_ascii_case(name))
}
