-- The demo table of deploy/compose.yaml (run once, on ClickHouse's first start).
CREATE TABLE IF NOT EXISTS default.events
(
    id UInt64,
    name String
)
ENGINE = MergeTree
ORDER BY id;
