"""The PostgreSQL wire protocol of ``lambdalake serve``: psql, psycopg, SQLAlchemy and JDBC tools
(DBeaver, Metabase) connect with the serve token as the password (any user name).

buenavista (Apache-2.0) runs the protocol: the threaded TCP server, start-up and the refusal of
SSL, the message loop, the extended protocol's statements and portals (with row limits and
suspension), Sync and the transaction status. Where it does what we need differently, this
module overrides it:

- queries go to the serving engine through the same query slots, guard, time limit and row cap
  as HTTP; a capped result ends with a NOTICE;
- the password (MD5, salted per connection) is compared in constant time; a wrong one ends the
  connection with SQLSTATE 28P01;
- errors carry a SQLSTATE and the connection stays usable;
- columns carry PostgreSQL's type OIDs and text forms (``t``/``f``, ``2026-11-20 10:00:00+00:00``)
  and binary forms where clients ask for them; parameters are decoded by their declared types;
- a message (and so a query's SQL) is at most 1 MiB, and at most 64 connections are open;
- what clients send around their queries is answered here: BEGIN/COMMIT/ROLLBACK (every query
  reads a consistent snapshot anyway), SET/RESET (acknowledged; the server's settings are
  fixed), SHOW of the server's parameters, DISCARD and DEALLOCATE.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import logging
import re
import socket
import struct
import threading
import time as time_module
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta, timezone
from decimal import Decimal
from typing import Any

import duckdb
from buenavista import core, postgres

from include.config import Settings
from serving.engine import QueryCancelled, QueryRefused, QueryTimeout, Result, ServingEngine
from serving.limits import QuerySlots, ServerBusy
from serving.metrics import ServingMetrics

log = logging.getLogger("lambdalake.serve.pgwire")
MAX_MESSAGE_BYTES = 1024 * 1024  # the HTTP body limit's twin
MAX_CONNECTIONS = 64
ROWS_PER_WRITE = 500  # data rows sent in one write: one system call per row is what makes big results slow
SERVER_VERSION = "14.0"  # what clients read to choose their catalog queries; DuckDB's pg_catalog follows 14's
SQLSTATES = {  # https://www.postgresql.org/docs/current/errcodes-appendix.html
    "not_read_only": "25006",  # read_only_sql_transaction
    "file_access": "42501",  # insufficient_privilege
    "invalid": "42000",  # syntax_error_or_access_rule_violation
    "unknown_setting": "42704",  # undefined_object
    "timeout": "57014",  # query_canceled
    "busy": "53000",  # insufficient_resources
    "password": "28P01",  # invalid_password
    "protocol": "08P01",  # protocol_violation
    "parameter": "22P02",  # invalid_text_representation
    "internal": "XX000",
}


# ---- types --------------------------------------------------------------------------------
@dataclass(frozen=True)
class PgType:
    oid: int
    text: Callable[[Any], str]
    binary: Callable[[Any], bytes] | None = None


POSTGRES_EPOCH = datetime(2000, 1, 1, tzinfo=timezone.utc)  # binary dates and times count from it
POSTGRES_EPOCH_DAY = POSTGRES_EPOCH.date().toordinal()


def _float_text(value: float) -> str:
    if value != value:
        return "NaN"
    if value in (float("inf"), float("-inf")):
        return "Infinity" if value > 0 else "-Infinity"
    return repr(value)


def _interval_text(value: timedelta) -> str:
    seconds, micros = divmod(value.seconds * 1_000_000 + value.microseconds, 1_000_000)
    return f"{value.days} days {seconds // 3600:02d}:{seconds // 60 % 60:02d}:{seconds % 60:02d}.{micros:06d}"


def _micros_since_2000(value: datetime) -> int:
    moment = value if value.tzinfo else value.replace(tzinfo=timezone.utc)
    return (moment - POSTGRES_EPOCH) // timedelta(microseconds=1)


def _utc_text(value: datetime) -> str:
    return value.astimezone(timezone.utc).isoformat(sep=" ")


def _json_text(value: Any) -> str:
    return json.dumps(value, default=str)


TEXT = PgType(25, str, lambda value: str(value).encode())
NUMERIC = PgType(1700, str)
JSON = PgType(114, _json_text, lambda value: _json_text(value).encode())
BOOLEAN = PgType(16, lambda value: "t" if value else "f", lambda value: b"\x01" if value else b"\x00")


def _integer(oid: int, code: str) -> PgType:
    return PgType(oid, str, lambda value: struct.pack(code, value))


PG_TYPES = {
    "BOOLEAN": BOOLEAN,
    "TINYINT": _integer(21, "!h"), "UTINYINT": _integer(21, "!h"), "SMALLINT": _integer(21, "!h"),
    "USMALLINT": _integer(23, "!i"), "INTEGER": _integer(23, "!i"),
    "UINTEGER": _integer(20, "!q"), "BIGINT": _integer(20, "!q"),
    "UBIGINT": NUMERIC, "HUGEINT": NUMERIC, "UHUGEINT": NUMERIC,
    "FLOAT": PgType(700, _float_text, lambda value: struct.pack("!f", value)),
    "DOUBLE": PgType(701, _float_text, lambda value: struct.pack("!d", value)),
    "VARCHAR": TEXT,
    "DATE": PgType(1082, date.isoformat, lambda value: struct.pack("!i", value.toordinal() - POSTGRES_EPOCH_DAY)),
    "TIME": PgType(1083, time.isoformat),
    "TIMESTAMP": PgType(1114, lambda value: value.isoformat(sep=" "),
                        lambda value: struct.pack("!q", _micros_since_2000(value))),
    "TIMESTAMP WITH TIME ZONE": PgType(1184, _utc_text, lambda value: struct.pack("!q", _micros_since_2000(value))),
    "INTERVAL": PgType(1186, _interval_text),
    "BLOB": PgType(17, lambda value: "\\x" + value.hex(), bytes),
    "UUID": PgType(2950, str),
    "JSON": JSON,
}
for _precision in ("S", "MS", "NS"):
    PG_TYPES[f"TIMESTAMP_{_precision}"] = PG_TYPES["TIMESTAMP"]


def pg_type(duckdb_type: str) -> PgType:
    """The PostgreSQL type a DuckDB column is sent as: lists, structs and maps as JSON, other
    types PostgreSQL lacks (enums, bit strings) as text."""
    if duckdb_type.startswith("DECIMAL"):
        return NUMERIC
    if duckdb_type.endswith("]") or duckdb_type.startswith(("STRUCT", "MAP", "UNION")):
        return JSON
    return PG_TYPES.get(duckdb_type, TEXT)


def _boolean(text: str) -> bool:
    return text.strip().lower() in ("t", "true", "1", "on", "y", "yes")


def _instant(text: str) -> datetime:
    return datetime.fromisoformat(text.strip())


PARAMETER_TEXT: dict[int, Callable[[str], Any]] = {
    16: _boolean, 20: int, 21: int, 23: int, 26: int, 700: float, 701: float, 1700: Decimal,
    1082: date.fromisoformat, 1114: _instant, 1184: _instant,
}
def _numeric_binary(data: bytes) -> Decimal:
    """PostgreSQL's binary numeric: base-10000 digits with a weight, a sign and a scale."""
    count, weight, sign, scale = struct.unpack("!hhHh", data[:8])
    if sign == 0xC000:
        return Decimal("NaN")
    digits = struct.unpack(f"!{count}H", data[8:8 + 2 * count])
    value = sum((Decimal(digit) * Decimal(10000) ** (weight - index) for index, digit in enumerate(digits)), Decimal(0))
    return (-value if sign == 0x4000 else value).quantize(Decimal(1).scaleb(-scale))


def _micros_after_2000(data: bytes) -> datetime:
    return POSTGRES_EPOCH + timedelta(microseconds=struct.unpack("!q", data)[0])


PARAMETER_BINARY: dict[int, Callable[[bytes], Any]] = {
    16: lambda data: data != b"\x00", 20: lambda data: struct.unpack("!q", data)[0],
    21: lambda data: struct.unpack("!h", data)[0], 23: lambda data: struct.unpack("!i", data)[0],
    700: lambda data: struct.unpack("!f", data)[0], 701: lambda data: struct.unpack("!d", data)[0],
    1700: _numeric_binary, 17: bytes,
    1082: lambda data: date.fromordinal(POSTGRES_EPOCH_DAY + struct.unpack("!i", data)[0]),
    1114: lambda data: _micros_after_2000(data).replace(tzinfo=None), 1184: _micros_after_2000,
    1186: lambda data: timedelta(microseconds=struct.unpack("!q", data[:8])[0],
                                 days=struct.unpack("!i", data[8:12])[0] + 30 * struct.unpack("!i", data[12:])[0]),
    2950: lambda data: str(uuid.UUID(bytes=data)), 3802: lambda data: data[1:].decode(),
    **dict.fromkeys((0, 19, 25, 114, 705, 1043), bytes.decode),
}


# ---- answers ------------------------------------------------------------------------------
class Answer(core.QueryResult):
    """A query's rows for buenavista, with the PostgreSQL type of each column; its rows are one
    iterator, so that an Execute with a row limit resumes where the previous one stopped."""

    def __init__(self, columns: list[str], types: list[str], result: Result | None = None) -> None:
        super().__init__()
        self.names = columns
        self.pg_types = [pg_type(kind) for kind in types]
        self.result = result
        self._rows = iter(result.rows if result is not None else ())

    def has_results(self) -> bool:
        return True

    def column_count(self) -> int:
        return len(self.names)

    def column(self, index: int) -> tuple[str, core.BVType]:
        return self.names[index], core.BVType.UNKNOWN  # the OIDs come from pg_types

    def rows(self) -> Iterator[tuple]:
        return self._rows

    def status(self) -> str:
        return ""


class Status(core.QueryResult):
    """A command without rows (BEGIN, SET, ...): only its tag."""

    def __init__(self, tag: str) -> None:
        super().__init__()
        self.tag = tag

    def has_results(self) -> bool:
        return False

    def status(self) -> str:
        return self.tag


# ---- catalog queries ------------------------------------------------------------------------
# What PostgreSQL's format_type() answers for the types whose pg_type name is an abbreviation:
# clients (SQLAlchemy's reflection, psql's \d) map these names.
PG_TYPE_NAMES = {
    "int2": "smallint", "int4": "integer", "int8": "bigint", "float4": "real", "float8": "double precision",
    "bool": "boolean", "varchar": "character varying", "timestamptz": "timestamp with time zone",
    "timestamp": "timestamp without time zone", "time": "time without time zone",
}
# Catalog relations and functions clients read that DuckDB's pg_catalog lacks or answers its own
# way, in schema _catalog (client queries are spelled to read them):
# - pg_attribute: DuckDB's gives a column's DuckDB type id as its atttypid, not the PostgreSQL OID
#   of pg_type (BIGINT is 14, not 20), and its format_type() takes the DuckDB id, so drivers that
#   join pg_attribute to pg_type (PostgreSQL's JDBC driver, which DBeaver and Metabase use) lost
#   the columns. A type DuckDB's pg_type lacks (a list, sent as JSON) shows as varchar, so that
#   such drivers keep the column.
# - format_type is a CASE, not a lookup per row: SQLAlchemy's column query calls it in correlated
#   subqueries (4-6 s per table with a lookup, 0.1 s so).
# - psql's \l, \du, \df and \dv+: one database and one role (any user name and database name
#   connect, with the token), no functions of our own, views that hold no bytes.
CATALOG = "_catalog"
OWNER = "lambdalake"  # of the one database, its views, and the one role
VARCHAR_OID = 1043
CATALOG_RELATIONS = ("pg_attribute", "pg_database", "pg_roles", "pg_auth_members")
CATALOG_FUNCTIONS = ("format_type", "pg_encoding_to_char", "pg_table_size", "pg_get_function_result",
                     "pg_get_function_arguments")


def install_catalog(connection: duckdb.DuckDBPyConnection) -> None:
    """Create :data:`CATALOG_RELATIONS` and :data:`CATALOG_FUNCTIONS` in schema ``_catalog``."""
    types = connection.execute(
        "SELECT oid, min(typname) FROM pg_catalog.pg_type WHERE oid IS NOT NULL GROUP BY oid ORDER BY oid"
    ).fetchall()
    names = " ".join(f"WHEN {oid} THEN '{PG_TYPE_NAMES.get(name, name)}'" for oid, name in types)
    connection.execute(f"""
        CREATE SCHEMA IF NOT EXISTS {CATALOG};
        CREATE OR REPLACE MACRO {CATALOG}.format_type(type_oid, typmod) AS
            CASE type_oid {names} ELSE 'character varying' END;
        CREATE OR REPLACE VIEW {CATALOG}.pg_attribute AS
            WITH pg_oids AS (SELECT typname, min(oid) AS oid FROM pg_catalog.pg_type GROUP BY typname)
            SELECT a.* REPLACE (coalesce(t.oid, {VARCHAR_OID}) AS atttypid)
            FROM pg_catalog.pg_attribute a LEFT JOIN pg_oids t ON t.typname = pg_catalog.format_type(a.atttypid, NULL);
        CREATE OR REPLACE VIEW {CATALOG}.pg_database AS
            SELECT 1 AS oid, '{OWNER}' AS datname, 10 AS datdba, 6 AS encoding, 'C' AS datcollate,
                   'C' AS datctype, true AS datallowconn, false AS datistemplate, -1 AS datconnlimit,
                   NULL::VARCHAR[] AS datacl;
        CREATE OR REPLACE VIEW {CATALOG}.pg_roles AS
            SELECT 10 AS oid, '{OWNER}' AS rolname, false AS rolsuper, true AS rolinherit,
                   false AS rolcreaterole, false AS rolcreatedb, true AS rolcanlogin, -1 AS rolconnlimit,
                   NULL::TIMESTAMPTZ AS rolvaliduntil, false AS rolreplication, false AS rolbypassrls;
        CREATE OR REPLACE VIEW {CATALOG}.pg_auth_members AS
            SELECT NULL::INTEGER AS roleid, NULL::INTEGER AS member, NULL::INTEGER AS grantor WHERE false;
        CREATE OR REPLACE MACRO {CATALOG}.pg_encoding_to_char(encoding) AS 'UTF8';
        CREATE OR REPLACE MACRO {CATALOG}.pg_table_size(relation) AS 0;
        CREATE OR REPLACE MACRO {CATALOG}.pg_get_function_result(function) AS NULL::VARCHAR;
        CREATE OR REPLACE MACRO {CATALOG}.pg_get_function_arguments(function) AS NULL::VARCHAR;
    """)


# DuckDB answers PostgreSQL's pg_catalog and information_schema, but for a few spellings that
# psql, SQLAlchemy and JDBC drivers use in their catalog queries; these become DuckDB's.
CATALOG_SPELLINGS = [
    (re.compile(r"(?:pg_catalog\.)?pg_get_userbyid\s*\([^()]*\)", re.IGNORECASE), f"'{OWNER}'"),
    (re.compile(r"\b(?:pg_catalog\.)?version\s*\(\s*\)", re.IGNORECASE),
     f"'PostgreSQL {SERVER_VERSION} (lambdalake serving on DuckDB {duckdb.__version__})'"),
    (re.compile(r"\b(?:pg_catalog\.)?to_regtype\s*\(([^()]*)\)", re.IGNORECASE),
     r"(SELECT min(oid) FROM pg_catalog.pg_type WHERE typname = \1)"),
    (re.compile(rf"(?<![\w.])(?:pg_catalog\.)?({'|'.join(CATALOG_RELATIONS)})\b", re.IGNORECASE), rf"{CATALOG}.\1"),
    (re.compile(rf"(?<![\w.])(?:pg_catalog\.)?({'|'.join(CATALOG_FUNCTIONS)})\s*\(", re.IGNORECASE), rf"{CATALOG}.\1("),
    (re.compile(r"OPERATOR\s*\(\s*pg_catalog\.([~!=<>]+)\s*\)", re.IGNORECASE), r"\1"),
    (re.compile(r"\s+COLLATE\s+pg_catalog\.default\b", re.IGNORECASE), ""),
    (re.compile(r"::\s*(?:pg_catalog\.)?(?:regclass|regtype|regproc|regnamespace)\b", re.IGNORECASE), ""),
    # Visible means on the search path, as in PostgreSQL (DuckDB's says every relation is): psql's
    # \d lists the served views, not the internal schemas they read.
    (re.compile(r"(?:pg_catalog\.)?pg_table_is_visible\s*\(\s*((?:\w+\.)*?\w+)\.oid\s*\)", re.IGNORECASE),
     r"(\1.relnamespace IN (SELECT oid FROM pg_catalog.pg_namespace WHERE nspname = current_schema()))"),
    (re.compile(r"(?:pg_catalog\.)?pg_function_is_visible\s*\(\s*((?:\w+\.)*?\w+)\.oid\s*\)", re.IGNORECASE),
     r"(\1.pronamespace IN (SELECT oid FROM pg_catalog.pg_namespace WHERE nspname = current_schema()))"),
    # psql's \d asks for columns and tables DuckDB's pg_catalog lacks; none applies to a view.
    (re.compile(r"\b\w+\.relforcerowsecurity\b", re.IGNORECASE), "false"),
    (re.compile(r"\b\w+\.attstorage\b", re.IGNORECASE), "'p'"),  # plain: what psql's \d+ shows
    (re.compile(r"::\s*pg_catalog\.", re.IGNORECASE), "::"),
    (re.compile(r"\b((?:pg_get_expr|pg_get_viewdef)\s*\([^()]*?),\s*true\s*\)", re.IGNORECASE), r"\1)"),  # no pretty
    # SQLAlchemy's column reflection: no sequences or collation namespaces here, and DuckDB's name
    # for a JSON object.
    (re.compile(r"CAST\s*\(\s*CAST\s*\(\s*(?:pg_catalog\.)?pg_get_serial_sequence\s*\(.*?\)\s*AS\s+REGCLASS\s*\)"
                r"\s*AS\s+OID\s*\)", re.IGNORECASE | re.DOTALL), "NULL"),
    (re.compile(r"\b(?:\w+\.)*collnamespace\b", re.IGNORECASE), "NULL"),
    (re.compile(r"\bjson_build_object\s*\(", re.IGNORECASE), "json_object("),
    (re.compile(r"(?:pg_catalog\.)?array_to_string\s*\(\s*\w+\.reloptions\s*\|\|\s*array\s*\(select[^()]*\([^()]*\)[^()]*\)"
                r"\s*,\s*'[^']*'\s*\)", re.IGNORECASE), "''"),
    (re.compile(r"\bpg_catalog\.array_to_string\s*\(", re.IGNORECASE), "array_to_string("),  # \l; DuckDB's own
]


def duckdb_spelling(sql: str) -> str:
    for pattern, replacement in CATALOG_SPELLINGS:
        sql = pattern.sub(replacement, sql)
    return sql


# ---- the session: one per connection ------------------------------------------------------
# Statements answered here, without the engine and without rows, by the tag each answers.
COMMAND_TAGS = {
    "BEGIN": "BEGIN", "START": "BEGIN", "COMMIT": "COMMIT", "END": "COMMIT", "ROLLBACK": "ROLLBACK",
    "ABORT": "ROLLBACK", "SAVEPOINT": "SAVEPOINT", "RELEASE": "RELEASE", "SET": "SET", "RESET": "RESET",
    "DISCARD": "DISCARD ALL", "DEALLOCATE": "DEALLOCATE",
}
_FIRST_WORDS = re.compile(r"^\s*(\w*)\s*(\w*)", re.ASCII)


def first_words(sql: str) -> tuple[str, str]:
    first, second = _FIRST_WORDS.match(sql).groups()
    return first.upper(), second.upper()


class EngineSession(core.Session):
    def __init__(self, service: PgService) -> None:
        super().__init__()
        self.service = service
        self.in_txn = False
        self._cancel_running: Callable[[], None] | None = None

    def in_transaction(self) -> bool:
        return self.in_txn

    def close(self) -> None:
        pass  # nothing held between queries: each one has its own cursor

    def cancel(self) -> None:
        """Cancel the query this session runs, if it runs one (from the cancel request's thread)."""
        cancel = self._cancel_running
        if cancel:
            with contextlib.suppress(duckdb.Error):  # it ended meanwhile and its cursor is closed
                cancel()

    def _running(self, cancel: Callable[[], None]) -> None:
        self._cancel_running = cancel

    def execute_sql(self, sql: str, params: list | None = None) -> core.QueryResult:
        word, second = first_words(sql)
        if word in COMMAND_TAGS:
            if word in ("BEGIN", "START"):
                self.in_txn = True
            elif word in ("COMMIT", "END", "ABORT") or (word == "ROLLBACK" and second != "TO"):  # not to a savepoint
                self.in_txn = False
            return Status(COMMAND_TAGS[word])
        if word == "SHOW":
            return self.service.show(sql, params)
        if not sql.strip(" \t\r\n;"):
            return Status("")
        try:
            return self.service.query(sql, params, self._running)
        finally:
            self._cancel_running = None

    def describe(self, sql: str, parameters: int) -> Answer | None:
        """The columns a prepared statement will answer (None: a command without rows)."""
        word, _ = first_words(sql)
        if word in COMMAND_TAGS:
            return None
        if word == "SHOW":
            return self.service.show(sql, None)
        return Answer(*self.service.engine.describe(duckdb_spelling(sql), parameters))


class PgService(core.Connection):
    """What every connection shares: the engine, the query slots, the metrics, the token."""

    def __init__(self, settings: Settings, engine: ServingEngine, slots: QuerySlots, metrics: ServingMetrics,
                 token: str) -> None:
        super().__init__()
        self.settings = settings
        self.engine = engine
        self.slots = slots
        self.metrics = metrics
        self.token = token
        install_catalog(engine.connection)
        self.server_parameters = {
            "server_version": SERVER_VERSION, "server_encoding": "UTF8", "client_encoding": "UTF8",
            "DateStyle": "ISO, MDY", "IntervalStyle": "postgres", "TimeZone": "UTC", "integer_datetimes": "on",
            "standard_conforming_strings": "on", "is_superuser": "off", "application_name": "",
        }

    def new_session(self) -> core.Session:
        return EngineSession(self)

    def parameters(self) -> dict[str, str]:
        return self.server_parameters

    def query(self, sql: str, params: list | None,
              on_start: Callable[[Callable[[], None]], None] | None = None) -> Answer:
        def limited() -> Result:
            with self.slots.hold():
                return self.engine.execute(duckdb_spelling(sql), params, self.settings.max_result_rows, on_start)

        result = self.metrics.observe("pgwire", limited)
        return Answer(result.columns, result.types, result)

    def show(self, sql: str, params: list | None) -> Answer:
        """``SHOW name``: the server's parameters, and what clients ask of a read-only server;
        other names go to DuckDB (``SHOW TABLES``, ``SHOW <table>``)."""
        name = " ".join(sql.strip(" \t\r\n;").split()[1:])
        known = {key.lower(): value for key, value in self.server_parameters.items()}
        known |= {"transaction isolation level": "read committed", "transaction_isolation": "read committed",
                  "transaction_read_only": "on", "default_transaction_read_only": "on", "search_path": "main",
                  "max_identifier_length": "63"}
        if name.lower() in known:
            column = "transaction_isolation" if name.lower().startswith("transaction isolation") else name.lower()
            return Answer([column], ["VARCHAR"], Result([column], ["VARCHAR"], [(known[name.lower()],)], False))
        try:
            return self.query(sql, params)
        except QueryRefused:
            raise QueryRefused(f'unrecognized configuration parameter "{name}"', "unknown_setting") from None


# ---- the protocol handler -------------------------------------------------------------------
class ProtocolViolation(Exception):
    """A message this server cannot take (SQLSTATE 08P01)."""


class BadParameter(Exception):
    """A parameter that does not read as its declared type (SQLSTATE 22P02)."""


class _BoundedReader:
    """The connection's input, refusing a message longer than MAX_MESSAGE_BYTES before reading it
    (buenavista reads whatever length a message declares)."""

    def __init__(self, raw: Any) -> None:
        self.raw = raw

    def read(self, size: int) -> bytes:
        if not 0 <= size <= MAX_MESSAGE_BYTES:
            raise ProtocolViolation(f"a message of {size} bytes is over the {MAX_MESSAGE_BYTES:,}-byte limit")
        return self.raw.read(size)


class EngineHandler(postgres.BuenaVistaHandler):
    server: PgServer

    def setup(self) -> None:
        super().setup()
        self.rfile = _BoundedReader(self.rfile)

    def handle_startup(self, conn: core.Connection) -> postgres.BVContext | None:
        length = self.r.read_uint32() - 4
        code = self.r.read_uint32()
        if code in (80877103, 80877104):  # SSLRequest, GSSENCRequest: not offered (clients go on without)
            self.wfile.write(b"N")
            return self.handle_startup(conn)
        if code == 80877102:  # CancelRequest (psql's Ctrl-C) on a connection of its own
            process_id, secret_key = self.r.read_uint32(), self.r.read_uint32()
            target = self.server.ctxts.get(process_id)
            if target is not None and hmac.compare_digest(struct.pack("!I", target.secret_key),
                                                         struct.pack("!I", secret_key)):
                target.session.cancel()
            return None
        if code != 196608:
            raise ProtocolViolation(f"unsupported protocol version {code >> 16}.{code & 0xFFFF}")
        fields = [part.decode() for part in self.r.read_bytes(length - 4).split(b"\x00")]
        params = dict(zip(fields[::2], fields[1::2]))
        context = postgres.BVContext(conn.create_session(), None, params)
        self.send_authentication_md5(context)
        return context

    def handle_md5_password(self, ctx: postgres.BVContext, payload: bytes) -> None:
        user = ctx.params.get("user", "")
        inner = hashlib.md5(self.server.service.token.encode() + user.encode()).hexdigest()
        expected = "md5" + hashlib.md5(inner.encode() + ctx.salt).hexdigest()
        if hmac.compare_digest(payload.rstrip(b"\x00"), expected.encode()):
            self.send_authentication_ok()
            self.handle_post_auth(ctx)
            return
        self._send_message(b"E", _fields("FATAL", SQLSTATES["password"],
                                         f'password authentication failed for user "{user}"'))
        self.request.shutdown(socket.SHUT_RDWR)  # the message loop then reads the end and closes

    def handle_query(self, ctx: postgres.BVContext, payload: bytes) -> None:
        sql = payload.decode("utf-8").rstrip("\x00")
        try:
            answer = ctx.execute_sql(sql)
        except Exception as exc:
            self.send_error(exc, ctx)
        else:
            if not sql.strip(" \t\r\n;"):
                self._send_message(b"I", b"")  # EmptyQueryResponse
            elif answer.has_results():
                self.send_row_description(answer)
                self.send_command_complete("SELECT %d\x00" % self.send_data_rows(answer))
            else:
                self.send_command_complete(f"{answer.status()}\x00")
        ctx.sync()  # a simple query's error does not poison the next one
        self.send_ready_for_query(ctx)

    def handle_describe(self, ctx: postgres.BVContext, payload: bytes) -> None:
        """A statement's parameters and columns (without running it), or a portal's columns (it
        runs, and Execute then sends the rows it keeps)."""
        if ctx.has_error:  # after an error, messages up to the next Sync are skipped
            return
        kind, name = payload[:1], payload[1:-1].decode()
        try:
            if kind == b"S":
                sql, oids = ctx.stmts[name]
                answer = ctx.session.describe(sql, len(oids))
                self.send_paramter_description([oid or TEXT.oid for oid in oids])  # (sic) buenavista's name
            else:
                answer = ctx.describe_portal(name)
            if answer is None or not answer.has_results():
                self._send_message(b"n", b"")  # NoData
            else:
                self.send_row_description(answer)
        except Exception as exc:
            self.send_error(exc, ctx)

    def handle_parse(self, ctx: postgres.BVContext, payload: bytes) -> None:
        if not ctx.has_error:
            super().handle_parse(ctx, payload)

    def handle_bind(self, ctx: postgres.BVContext, payload: bytes) -> None:
        if ctx.has_error:
            return
        try:
            portal, statement, params, result_formats = _bind_message(payload, ctx.stmts)
        except Exception as exc:
            self.send_error(exc, ctx)
            return
        ctx.result_cache.pop(portal, None)  # what a Describe of the portal's previous binding ran
        ctx.add_portal(portal, statement, params, result_formats)
        self.send_bind_complete()

    def handle_close(self, ctx: postgres.BVContext, payload: bytes) -> None:
        """Closing a statement or portal that does not exist is not an error (as in PostgreSQL)."""
        name = payload[1:-1].decode()
        if payload[:1] == b"S":
            ctx.stmts.pop(name, None)
        else:
            ctx.portals.pop(name, None)
            ctx.result_cache.pop(name, None)
        self.send_close_complete()

    def send_row_description(self, query_result: Answer) -> None:
        formats = query_result.result_format or [0] * query_result.column_count()
        body = bytearray()
        for name, kind, fmt in zip(query_result.names, query_result.pg_types, formats):
            if fmt == 1 and kind.binary is None:
                raise ProtocolViolation(f"column {name!r} (type oid {kind.oid}) cannot be sent in binary; ask for text")
            body += name.encode() + b"\x00" + struct.pack("!ihihih", 0, 0, kind.oid, -1, -1, fmt)
        self._send_message(b"T", struct.pack("!h", query_result.column_count()) + body)

    def send_data_rows(self, query_result: Answer, limit: int = 0) -> int:
        formats = query_result.result_format or [0] * query_result.column_count()
        encoders = [(kind.binary if fmt == 1 else kind.text, fmt == 0)
                    for kind, fmt in zip(query_result.pg_types, formats)]
        count, pending = 0, bytearray()
        for row in query_result.rows():
            body = bytearray(struct.pack("!h", len(row)))
            for value, (encode, as_text) in zip(row, encoders):
                if value is None:
                    body += b"\xff\xff\xff\xff"
                else:
                    data = encode(value).encode() if as_text else encode(value)
                    body += struct.pack("!i", len(data)) + data
            pending += b"D" + struct.pack("!i", len(body) + 4) + body
            count += 1
            if count % ROWS_PER_WRITE == 0:
                self.wfile.write(pending)
                pending = bytearray()
            if 0 < limit <= count:
                break
        self.wfile.write(pending)
        finished = limit == 0 or count < limit
        result = query_result.result
        if finished and result is not None and result.truncated:
            rows = self.server.service.settings.max_result_rows
            self._send_message(b"N", _fields("NOTICE", "01000", f"result truncated to {rows:,} rows "
                                                              "(LAMBDALAKE_MAX_RESULT_ROWS); the query has more"))
        return count

    def send_error(self, exception: Any, ctx: postgres.BVContext | None = None) -> None:
        code, message = _sqlstate(exception)
        if code == SQLSTATES["internal"]:
            log.error("pgwire: %s", message)
        self._send_message(b"E", _fields("ERROR", code, message))
        if ctx:
            ctx.mark_error()

    def _send_message(self, kind: bytes, body: bytes) -> None:
        self.wfile.write(kind + struct.pack("!i", len(body) + 4) + body)


def _fields(severity: str, code: str, message: str) -> bytes:
    """An ErrorResponse's or NoticeResponse's fields."""
    return b"".join(key + value.encode() + b"\x00" for key, value in
                    ((b"S", severity), (b"V", severity), (b"C", code), (b"M", message))) + b"\x00"


def _sqlstate(error: Any) -> tuple[str, str]:
    if isinstance(error, QueryRefused):
        return SQLSTATES.get(error.reason, SQLSTATES["invalid"]), str(error)
    if isinstance(error, (QueryTimeout, QueryCancelled)):
        return SQLSTATES["timeout"], str(error)
    if isinstance(error, ServerBusy):
        return SQLSTATES["busy"], str(error)
    if isinstance(error, BadParameter):
        return SQLSTATES["parameter"], str(error)
    if isinstance(error, (ProtocolViolation, ValueError, struct.error, UnicodeDecodeError)):
        return SQLSTATES["protocol"], str(error) or type(error).__name__
    if isinstance(error, duckdb.Error):
        return SQLSTATES["invalid"], str(error).splitlines()[0]
    return SQLSTATES["internal"], str(error) or type(error).__name__


def _bind_message(payload: bytes, statements: dict) -> tuple[str, str, list, list[int]]:
    """A Bind message: portal, statement, parameters decoded by their declared types, result formats."""
    portal_end = payload.index(b"\x00")
    statement_end = payload.index(b"\x00", portal_end + 1)
    portal, statement = payload[:portal_end].decode(), payload[portal_end + 1:statement_end].decode()
    if statement not in statements:
        raise ProtocolViolation(f"prepared statement {statement!r} does not exist")
    oids = statements[statement][1]
    at = statement_end + 1

    def take(size: int) -> bytes:
        nonlocal at
        at += size
        return payload[at - size:at]

    def shorts() -> list[int]:
        count = struct.unpack("!h", take(2))[0]
        return list(struct.unpack(f"!{count}h", take(2 * count)))

    formats = shorts()
    count = struct.unpack("!h", take(2))[0]
    formats = formats * count if len(formats) == 1 else formats or [0] * count
    params = []
    for index in range(count):
        size = struct.unpack("!i", take(4))[0]
        oid = oids[index] if index < len(oids) else 0
        if size < 0:
            params.append(None)
            continue
        data = take(size)
        try:
            if formats[index] == 0:
                params.append(PARAMETER_TEXT.get(oid, str)(data.decode()))
            elif oid in PARAMETER_BINARY:
                params.append(PARAMETER_BINARY[oid](data))
            else:
                raise BadParameter(f"parameter ${index + 1} (type oid {oid}) cannot be read in binary; send it as text")
        except (ValueError, ArithmeticError, struct.error) as exc:
            raise BadParameter(f"parameter ${index + 1} is not a valid value of type oid {oid}: {exc}") from None
    return portal, statement, params, shorts()


class PgServer(postgres.BuenaVistaServer):
    daemon_threads = True  # a client's open connection does not keep the process alive

    def __init__(self, address: tuple[str, int], service: PgService) -> None:
        super().__init__(address, service)
        self.RequestHandlerClass = EngineHandler
        self.service = service
        self._connections = 0
        self._counting = threading.Lock()
        self._accepted: dict[int, socket.socket] = {}

    def verify_request(self, request: Any, client_address: Any) -> bool:
        """Any address (the password guards it), up to MAX_CONNECTIONS at once."""
        with self._counting:
            if self._connections >= MAX_CONNECTIONS:
                log.warning("pgwire: refusing a connection from %s: %d open", client_address[0], MAX_CONNECTIONS)
                return False
            self._connections += 1
            self._accepted[id(request)] = request
            return True

    def shutdown_request(self, request: Any) -> None:
        with self._counting:
            if self._accepted.pop(id(request), None) is not None:
                self._connections -= 1
        super().shutdown_request(request)

    def stop(self, wait_seconds: float) -> int:
        """Stop listening, then let every connection finish the query it runs (each ends within
        the query time limit) and send its answer: reading is shut on each, so its next read is
        the end and it closes. Waits at most ``wait_seconds``; returns the connections still open."""
        self.shutdown()
        self.server_close()
        with self._counting:
            for request in self._accepted.values():
                with contextlib.suppress(OSError):  # the client has gone already
                    request.shutdown(socket.SHUT_RD)
        deadline = time_module.monotonic() + wait_seconds
        while self._connections and time_module.monotonic() < deadline:
            time_module.sleep(0.05)
        return self._connections

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.debug("pgwire: connection from %s ended with an error", client_address[0], exc_info=True)


def start_pg_server(settings: Settings, host: str, port: int, token: str, engine: ServingEngine,
                    slots: QuerySlots, metrics: ServingMetrics) -> PgServer:
    """Listen on ``host:port`` and answer in a background thread; ``shutdown()`` stops it."""
    try:
        server = PgServer((host, port), PgService(settings, engine, slots, metrics, token))
    except OSError as exc:
        raise RuntimeError(f"cannot listen for PostgreSQL clients on {host}:{port}: {exc.strerror} "
                           "(choose another port with --pg-port or LAMBDALAKE_PG_PORT, or 0 to turn it off)") from None
    threading.Thread(target=server.serve_forever, name="pgwire", daemon=True).start()
    return server

