"""ClickHouse's HTTP interface in front of chdb: the current engine for Sluice's tests.

chdb (the PyPI wheel `chdb-core`, pinned by scripts/test) is ClickHouse's engine as a
Python module, with no listener of its own. This server answers the part of
ClickHouse's HTTP interface that Sluice and its tests use, on one loopback port, and
runs every statement in one chdb session whose data lives in `--data` (kept across a
restart, as a server's would be):

- `GET /ping` (and `GET /` without a query): `Ok.`
- `GET|POST /?query=SQL&<setting>=<value>...`: the body is the data of an `INSERT ...
  FORMAT` (or the query itself, when the URL has none); `default_format`, `database`,
  `query_id` and `param_<name>` as ClickHouse reads them; any other parameter is a
  setting of this request only.
- users and passwords (basic auth, `X-ClickHouse-User`/`-Key`, or `user`/`password`),
  each with its profile's settings, from `--users` (written by the Rust side, which
  owns them); a `GET` is `readonly=2`, as on a server.
- a failure answers with `X-ClickHouse-Exception-Code`, the body `Code: N. DB::Exception:
  ... (version V)`, and the HTTP status ClickHouse gives that code: the table below is
  ClickHouse's `exceptionCodeToHTTPStatus` (src/Server/HTTP/exceptionCodeToHTTPStatus.cpp),
  by name; the codes are read from the engine's own `system.errors` at start.

Sessions are kept apart: a request's settings travel in its statement's `SETTINGS`
clause (never `SET`, which would stay in chdb's one session for the next request); a
`CREATE` (whose `SETTINGS` would be the table's) and a `SYSTEM` statement (which takes
none) get them by `SET`, each put back to its default after it.

What it cannot stand for (the tests that need these stay on clickhouse-server 18.16;
scripts/test's `clickhouse-current` list names them):
- Replicated tables: chdb reaches ZooKeeper, but the first insert into a
  `ReplicatedMergeTree` hangs; so no shards, replicas or `system.replicas`.
- Concurrency: chdb runs one statement at a time in a process, so requests are
  served one after the other. `KILL QUERY` finds nothing (the query it would kill has
  finished before it runs), `system.processes` shows only the asking query, and a
  slow query holds every other request back.
- `system.query_log` does not exist; grants and quotas are not enforced (only the
  profiles' settings and `readonly`); `session_id` sessions, compression, progress
  headers and `X-ClickHouse-Summary` are not served.
- Faults of a real server (a freeze, a crash mid-insert) are the process's own: it
  can be killed and restarted on its data, but it has no merges, parts limits or
  memory limits worth testing against.
"""

import argparse
import base64
import http.server
import json
import re
import signal
import socketserver
import sys
import threading
import time
import urllib.parse

# Imported before the port is opened: `/ping` answers only once the engine is loaded.
import chdb
from chdb import session as chdb_session

# ClickHouse's exceptionCodeToHTTPStatus, by error name (the C++ source's order).
STATUS_BY_NAME = {
    "REQUIRED_PASSWORD": 401,
    **{
        name: 403
        for name in (
            "UNKNOWN_USER",
            "WRONG_PASSWORD",
            "AUTHENTICATION_FAILED",
            "SET_NON_GRANTED_ROLE",
            "ACCESS_DENIED",
        )
    },
    **{
        name: 400
        for name in (
            "BAD_ARGUMENTS",
            "CANNOT_COMPILE_REGEXP",
            "CANNOT_PARSE_TEXT",
            "CANNOT_PARSE_ESCAPE_SEQUENCE",
            "CANNOT_PARSE_QUOTED_STRING",
            "CANNOT_PARSE_DATE",
            "CANNOT_PARSE_DATETIME",
            "CANNOT_PARSE_NUMBER",
            "CANNOT_PARSE_DOMAIN_VALUE_FROM_STRING",
            "CANNOT_PARSE_IPV4",
            "CANNOT_PARSE_IPV6",
            "CANNOT_PARSE_INPUT_ASSERTION_FAILED",
            "CANNOT_PARSE_UUID",
            "DUPLICATE_COLUMN",
            "ILLEGAL_COLUMN",
            "UNKNOWN_ELEMENT_IN_AST",
            "UNKNOWN_TYPE_OF_AST_NODE",
            "THERE_IS_NO_COLUMN",
            "TOO_DEEP_AST",
            "TOO_BIG_AST",
            "UNEXPECTED_AST_STRUCTURE",
            "SYNTAX_ERROR",
            "INCORRECT_DATA",
            "TYPE_MISMATCH",
            "VALUE_IS_OUT_OF_RANGE_OF_DATA_TYPE",
        )
    },
    **{
        name: 404
        for name in (
            "UNKNOWN_TABLE",
            "UNKNOWN_FUNCTION",
            "UNKNOWN_IDENTIFIER",
            "UNKNOWN_TYPE",
            "UNKNOWN_STORAGE",
            "UNKNOWN_DATABASE",
            "UNKNOWN_SETTING",
            "UNKNOWN_DIRECTION_OF_SORTING",
            "UNKNOWN_AGGREGATE_FUNCTION",
            "UNKNOWN_FORMAT",
            "UNKNOWN_DATABASE_ENGINE",
            "UNKNOWN_TYPE_OF_QUERY",
            "UNKNOWN_ROLE",
        )
    },
    "QUERY_IS_TOO_LARGE": 413,
    "NOT_IMPLEMENTED": 501,
    "SOCKET_TIMEOUT": 503,
    "CANNOT_OPEN_FILE": 503,
    "HTTP_LENGTH_REQUIRED": 411,
    "TIMEOUT_EXCEEDED": 408,
    "CANNOT_SCHEDULE_TASK": 503,
    "UNSUPPORTED_MEDIA_TYPE": 415,
}

# URL parameters of the HTTP interface itself, never settings.
HTTP_PARAMS = {
    "query",
    "query_id",
    "database",
    "default_format",
    "user",
    "password",
    "quota_key",
    "session_id",
    "session_timeout",
    "session_check",
    "compress",
    "decompress",
    "buffer_size",
    "wait_end_of_query",
    "stacktrace",
    "role",
}

CONTENT_TYPES = {
    "TabSeparated": "text/tab-separated-values; charset=UTF-8",
    "TSV": "text/tab-separated-values; charset=UTF-8",
    "CSV": "text/csv; charset=UTF-8; header=absent",
    "JSON": "application/json; charset=UTF-8",
    "JSONEachRow": "application/x-ndjson; charset=UTF-8",
    "JSONCompact": "application/json; charset=UTF-8",
}

CODE_RE = re.compile(r"^\s*Code:\s*(\d+)")
# Where an INSERT's data or SELECT starts: a query-level SETTINGS clause goes before it.
INSERT_TAIL_RE = re.compile(r"\s(FORMAT|VALUES|SELECT|WITH)\b", re.IGNORECASE)
NUMBER_RE = re.compile(r"^-?\d+(\.\d+)?$")


class ClickHouseError(Exception):
    """A failure answered as ClickHouse would: its code and message."""

    def __init__(self, code, message):
        super().__init__(message)
        self.code = code
        self.message = message


class Engine:
    """The chdb session and what the handler needs to know about the engine."""

    def __init__(self, data_dir):
        self.session = chdb_session.Session(data_dir)
        # chdb runs one statement at a time; the lock makes the wait explicit and keeps
        # a CREATE's SET and its reset together.
        self.lock = threading.Lock()
        self.version = self.run("SELECT version()", {}, "TabSeparated").decode().strip()
        errors = self.run(
            "SELECT name, code FROM system.errors "
            "SETTINGS system_events_show_zero_values = 1",
            {},
            "TabSeparated",
        ).decode()
        self.codes = {}
        for line in errors.splitlines():
            name, _, code = line.partition("\t")
            self.codes[name] = int(code)
        self.status_by_code = {
            self.codes[name]: status
            for name, status in STATUS_BY_NAME.items()
            if name in self.codes
        }

    def status_of(self, code):
        return self.status_by_code.get(code, 500)

    def run(self, sql, params, fmt):
        with self.lock:
            return self._query(sql, params, fmt)

    def run_create(self, sql, settings, fmt):
        """A CREATE with settings: SET, run, and each setting back to its default."""
        with self.lock:
            for name, value in settings.items():
                self._query(f"SET {name} = {literal(value)}", {}, fmt)
            try:
                return self._query(sql, {}, fmt)
            finally:
                for name in settings:
                    self._query(f"SET {name} = DEFAULT", {}, fmt)

    def _query(self, sql, params, fmt):
        try:
            result = self.session.query(sql, fmt, params=params or None)
        except Exception as error:  # chdb raises ChdbError (a RuntimeError)
            raise self.as_clickhouse_error(str(error)) from None
        return bytes(result.bytes())

    def as_clickhouse_error(self, text):
        """chdb's message as ClickHouse's HTTP body: one `Code: N.` prefix, the version."""
        # chdb nests an engine exception in its own at times: `Code: 115. DB::Exception:
        # Code: 115. DB::Exception: Unknown setting ... (version …). (UNKNOWN_SETTING)`.
        inner = text
        while True:
            stripped = re.sub(r"^\s*Code:\s*\d+\.\s*DB::Exception:\s*", "", inner, count=1)
            if stripped == inner or not CODE_RE.match(stripped):
                break
            inner = stripped
        match = CODE_RE.match(inner)
        code = int(match.group(1)) if match else self.codes.get("UNKNOWN_EXCEPTION", 1002)
        message = inner.strip()
        if not match:
            message = f"Code: {code}. DB::Exception: {message}"
        message = re.sub(r"\s*\(version [^)]*\)", "", message)
        message = re.sub(r"\((\w+)\)\. \(\1\)", r"(\1)", message)
        return ClickHouseError(code, f"{message} (version {self.version})")


def literal(value):
    """A setting's value in SQL: numbers as they are, anything else quoted."""
    if NUMBER_RE.match(value):
        return value
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def with_settings(sql, settings):
    """`sql` with a query-level SETTINGS clause carrying `settings`."""
    if not settings:
        return sql
    clause = "SETTINGS " + ", ".join(f"{k} = {literal(v)}" for k, v in settings.items())
    body = sql.rstrip().rstrip(";").rstrip()
    if body.lstrip()[:6].upper() == "INSERT":
        tail = INSERT_TAIL_RE.search(body)
        if tail:
            return f"{body[: tail.start()]} {clause}{body[tail.start():]}"
    return f"{body} {clause}"


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "sluice-chdb-front"

    def log_message(self, fmt, *args):  # one line per request is too much for a test run
        pass

    def do_GET(self):
        self.serve(readonly=True)

    def do_POST(self):
        self.serve(readonly=False)

    def serve(self, readonly):
        url = urllib.parse.urlsplit(self.path)
        params = dict(urllib.parse.parse_qsl(url.query, keep_blank_values=True))
        body = self.read_body()
        if url.path == "/ping" or (url.path == "/" and "query" not in params and not body):
            return self.answer(200, b"Ok.\n", {"Content-Type": "text/html; charset=UTF-8"})
        if url.path != "/":
            return self.fail(ClickHouseError(0, f"There is no handle {url.path}"), status=404)
        query_id = params.get("query_id") or f"chdb-{time.monotonic_ns()}"
        try:
            settings = self.settings_of(params, readonly)
            if "query" in params:
                sql = params["query"]
                if body:
                    sql = sql + "\n" + body.decode("utf-8", errors="replace")
            else:
                sql = body.decode("utf-8", errors="replace")
            if not sql.strip():
                raise ClickHouseError(self.server.engine.codes["SYNTAX_ERROR"], "Empty query.")
            fmt = params.get("default_format") or "TabSeparated"
            output = self.execute(sql, settings, params, fmt)
        except ClickHouseError as error:
            return self.fail(error, query_id=query_id)
        self.answer(
            200,
            output,
            {
                "Content-Type": CONTENT_TYPES.get(fmt, "text/plain; charset=UTF-8"),
                "X-ClickHouse-Query-Id": query_id,
                "X-ClickHouse-Format": fmt,
            },
        )

    def execute(self, sql, settings, params, fmt):
        engine = self.server.engine
        query_params = {k[len("param_"):]: v for k, v in params.items() if k.startswith("param_")}
        database = params.get("database", "default") or "default"
        if database != "default":
            sql_db = f"USE `{database}`"
        else:
            sql_db = None
        first_word = sql.lstrip().split(None, 1)[0].upper() if sql.strip() else ""
        # Statements whose grammar takes no trailing `SETTINGS` of a query (a CREATE's
        # would be the table's; SYSTEM takes none) get them by `SET` and back.
        if first_word in ("CREATE", "ATTACH", "SYSTEM") and settings:
            if settings.get("readonly", "0") != "0":
                raise ClickHouseError(
                    engine.codes["READONLY"],
                    f"Code: {engine.codes['READONLY']}. DB::Exception: Cannot execute query "
                    f"in readonly mode. (READONLY) (version {engine.version})",
                )
            return engine.run_create(sql, settings, fmt)
        if sql_db:
            with engine.lock:
                engine._query(sql_db, {}, fmt)
                try:
                    return engine._query(with_settings(sql, settings), query_params, fmt)
                finally:
                    engine._query("USE default", {}, fmt)
        return engine.run(with_settings(sql, settings), query_params, fmt)

    def settings_of(self, params, readonly):
        """The user's profile, then the URL's settings; `readonly` never lowered."""
        engine = self.server.engine
        user, password = self.credentials(params)
        known = self.server.users.get(user)
        if known is None or known.get("password", "") != password:
            code = engine.codes["AUTHENTICATION_FAILED"]
            raise ClickHouseError(
                code,
                f"Code: {code}. DB::Exception: {user}: Authentication failed: password is "
                f"incorrect, or there is no user with such name. (AUTHENTICATION_FAILED) "
                f"(version {engine.version})",
            )
        settings = {k: str(v) for k, v in known.get("settings", {}).items()}
        floor = int(settings.get("readonly", "0"))
        if readonly:
            floor = max(floor, 2)
        for name, value in params.items():
            if name in HTTP_PARAMS or name.startswith("param_"):
                continue
            settings[name] = value
        asked = settings.get("readonly")
        if asked is not None and NUMBER_RE.match(asked) and int(asked) < floor:
            code = engine.codes["READONLY"]
            raise ClickHouseError(
                code,
                f"Code: {code}. DB::Exception: Cannot modify 'readonly' setting in readonly "
                f"mode. (READONLY) (version {engine.version})",
            )
        if floor:
            settings["readonly"] = str(max(floor, int(settings.get("readonly", "0"))))
        return settings

    def credentials(self, params):
        auth = self.headers.get("Authorization", "")
        if auth.lower().startswith("basic "):
            try:
                user, _, password = base64.b64decode(auth[6:]).decode().partition(":")
                return user, password
            except ValueError:
                return "", ""
        if self.headers.get("X-ClickHouse-User"):
            return self.headers["X-ClickHouse-User"], self.headers.get("X-ClickHouse-Key", "")
        return params.get("user", "default"), params.get("password", "")

    def read_body(self):
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline().strip():
                        pass
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def fail(self, error, status=None, query_id=None):
        engine = self.server.engine
        headers = {
            "Content-Type": "text/plain; charset=UTF-8",
            "X-ClickHouse-Exception-Code": str(error.code),
        }
        if query_id:
            headers["X-ClickHouse-Query-Id"] = query_id
        text = error.message if error.message.startswith("Code:") else (
            f"Code: {error.code}. DB::Exception: {error.message} (version {engine.version})"
        )
        self.answer(status or engine.status_of(error.code), (text + "\n").encode(), headers)

    def answer(self, status, body, headers):
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--data", required=True, help="chdb's data directory")
    parser.add_argument("--users", required=True, help="JSON: {user: {password, settings}}")
    args = parser.parse_args()
    started = time.monotonic()
    engine = Engine(args.data)
    server = Server(("127.0.0.1", args.port), Handler)
    server.engine = engine
    server.users = json.loads(args.users)
    print(
        f"chdb front: engine {server.engine.version} (chdb {chdb.__version__}) on "
        f"127.0.0.1:{args.port}, data in {args.data}, ready in "
        f"{time.monotonic() - started:.2f}s",
        file=sys.stderr,
        flush=True,
    )
    # A SIGTERM is a graceful stop, as clickhouse-server's: exit 0 with the session closed.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        server.serve_forever()
    finally:
        with engine.lock:
            engine.session.close()


if __name__ == "__main__":
    main()
