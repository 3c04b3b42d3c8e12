"""The serving layer: merged batch + speed views, answered by DuckDB.

Each Delta table's current snapshot is copied into DuckDB (no Spark) and kept current by
:meth:`ServingEngine.refresh`. The merged views follow the merge rule (docs/architecture.md): a row comes
from the batch view when its day is batch-covered, otherwise from the speed view, and carries
``source`` (a dimension: the batch's rebuild as of the last covered day, overlaid with the keys
the stream changed since). The database is read-only for users: one SELECT/WITH statement per query; file
access, ATTACH, COPY and configuration changes are disabled before any user SQL runs. The CLI,
the HTTP API and the PostgreSQL wire protocol all go through :meth:`ServingEngine.execute`.
"""

from __future__ import annotations

import itertools
import threading
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import date, datetime, timezone
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import duckdb
import pyarrow as pa
from deltalake import DeltaTable

from include import tables
from include.config import Settings
from include.coverage import Publication, published_tables, same_rows_until
from include.lakehouse.base import LakehouseError, TableFile, has_newer_version
from include.lakehouse.delta_rs import read_table_file, table_files
from include.registry import ViewSpec, combined_sql
from include.views import VIEWS


def merged(view: ViewSpec, batch: str, speed: str) -> str:
    """The merge rule: batch rows of covered days, speed rows of the other days. A dimension:
    the batch's rebuild as of the last covered day's end, except the keys whose speed row
    changed after it, which come from the speed side."""
    listed = ", ".join(view.columns)
    shown = f"({view.served_when})" if view.served_when else "true"
    if view.kind == "fact":
        return f"""
        SELECT {listed}, 'batch' AS source FROM {batch} WHERE date IN (SELECT date FROM {COVERAGE}) AND {shown}
        UNION ALL
        SELECT {listed}, 'speed' AS source FROM {speed} WHERE date NOT IN (SELECT date FROM {COVERAGE}) AND {shown}
    """
    same_key = " AND ".join(f"fresh.{key} = kept.{key}" for key in view.keys)
    return f"""
        WITH last_covered AS (SELECT max(date) AS day FROM {COVERAGE}),
        fresh AS (
            SELECT * FROM {speed}
            WHERE (SELECT day FROM last_covered) IS NULL
                OR {view.key_time} >= (SELECT day FROM last_covered) + INTERVAL 1 DAY
        )
        SELECT {listed}, 'batch' AS source FROM {batch} AS kept
        WHERE date = (SELECT day FROM last_covered) AND {shown} AND NOT EXISTS (SELECT 1 FROM fresh WHERE {same_key})
        UNION ALL
        SELECT {listed}, 'speed' AS source FROM fresh WHERE {shown}
    """


def speed_relation(view: ViewSpec) -> str:
    return f"speed_{view.name}"


def batch_relation(view: ViewSpec) -> str:
    return f"batch_{view.name}"


def internal(relation: str) -> str:
    return f"{INTERNAL}.{relation}"


# Arrow from a cursor's result copies the rows once more than from a relation; the rows are at
# most the row cap, while a relation costs a second parse and bind (~2.5 ms a query).
warnings.filterwarnings("ignore", message="Arrow output on a DB-API result", category=UserWarning)

# Clients list and query the served views in `main`; what they are made of stays out of sight in
# two schemas: INTERNAL has a relation per lakehouse table, COPIES DuckDB's copy of its snapshot.
INTERNAL, COPIES = "_lake", "_copies"
COVERAGE = internal("coverage")
# Relation name in INTERNAL -> (lakehouse table, its declared fields: the schema when it does not exist yet)
SOURCES = {
    "coverage": (tables.BATCH_COVERAGE, tables.BATCH_COVERAGE_FIELDS),
    "late_events": (tables.LATE_EVENTS, tables.LATE_EVENTS_FIELDS),
    "dlq": (tables.DLQ, tables.DLQ_FIELDS),
    "reconciliation": (tables.RECONCILIATION, tables.RECONCILIATION_FIELDS),
    "stream_metrics": (tables.STREAM_METRICS, tables.STREAM_METRICS_FIELDS),
    "ingest_batches": (tables.INGEST_BATCHES, tables.INGEST_BATCHES_FIELDS),
    "ops_alerts": (tables.ALERTS, tables.ALERTS_FIELDS),
    "supervisor_events": (tables.SUPERVISOR_EVENTS, tables.SUPERVISOR_EVENTS_FIELDS),
}
VIEWS_SQL = {
    "late_events": "SELECT topic, event_id, event_time, arrived_at, watermark_at_arrival, lateness_seconds "
                   f"FROM {internal('late_events')}",
    "dlq": f"SELECT topic, raw, reason, source, ingested_at FROM {internal('dlq')}",
    "reconciliation": "SELECT view, date, metric, speed_value, batch_value, diff, computed_at "
                      f"FROM {internal('reconciliation')}",
    **{name: f"SELECT * FROM {internal(name)}"
       for name in ("stream_metrics", "ingest_batches", "ops_alerts", "supervisor_events")},
}
# Speed relations of views merged when read (several rows of a key: partials, or a stateful query's rows).
COMBINED = {speed_relation(view): view for view in VIEWS if view.merged_when_read}
for _view in VIEWS:
    SOURCES[speed_relation(_view)] = (_view.speed_table, _view.fields)
    SOURCES[batch_relation(_view)] = (_view.batch_table, _view.fields)
    VIEWS_SQL[_view.name] = merged(_view, internal(batch_relation(_view)), internal(speed_relation(_view)))
    if _view.differences:
        SOURCES[_view.differences.table] = (_view.differences.table, _view.differences_fields)
        VIEWS_SQL[_view.differences.table] = f"SELECT * EXCLUDE (date) FROM {internal(_view.differences.table)}"
QUERYABLE = sorted(VIEWS_SQL)
# Relations of the tables a nightly run publishes: served at the versions coverage records.
PUBLISHED = {relation for relation, (table, _) in SOURCES.items() if table in published_tables()}


@dataclass(frozen=True)
class _Served:
    """What to serve of one table: the version, the files (by path) and the schema; ``state``
    tells two of them apart (a published table: also the days held back at older versions)."""

    version: int
    files: Mapping[str, TableFile]
    schema: pa.Schema
    state: tuple


@dataclass(frozen=True)
class _Copy:
    """What DuckDB holds of one table: its version and state (:class:`_Served`), the files its
    rows came from (each with the number its rows carry in ``_file``), its schema."""

    version: int | None
    state: tuple | None
    files: Mapping[str, int]
    schema: pa.Schema


FILE_ACCESS = "reading or writing files is not allowed in serving queries"


class QueryRefused(ValueError):
    """A query that would write, change state or read files, or that DuckDB rejected; nothing was
    changed. Its message is one line, the same for the CLI, the HTTP API and the PostgreSQL wire
    protocol; ``reason`` (``not_read_only``, ``file_access`` or ``invalid``) is what metrics count."""

    def __init__(self, message: str, reason: str = "invalid") -> None:
        super().__init__(message)
        self.reason = reason


HISTORY_KEPT = (f"a table the stream writes keeps {tables.STREAM_LOG_RETENTION} of history "
                "(`lambdalake history TABLE` lists the versions there are)")


class HistoryGone(ValueError):
    """``--as-of`` a time or version older than a served table's log: its rows then are unknown."""


class QueryTimeout(RuntimeError):
    """A query that ran past the engine's time limit and was cancelled."""


class QueryCancelled(RuntimeError):
    """A query its client cancelled while it ran (a PostgreSQL client's cancel request)."""


class ServingEngine:
    """DuckDB over the lakehouse's snapshots, safe to share between threads.

    Each Delta table is copied into a DuckDB table (with the Parquet file each row came from)
    once; :meth:`refresh` then deletes the rows of files a new version removed and inserts those
    of files it added, in one transaction, so a long-running server follows the lake at the cost
    of what changed. Queries over DuckDB's own tables run faster than over Arrow datasets of the
    snapshots or DuckDB reading their Parquet files itself (benchmarks/DECISIONS.md); the price is
    memory: the served tables (Gold views and ops tables, never Bronze or Silver) are held in DuckDB.
    Each query runs on its own cursor: concurrent queries read a consistent snapshot while
    :meth:`refresh` commits, and one query can be cancelled without touching the others.
    """

    def __init__(self, settings: Settings, query_timeout: float | None = None,
                 as_of: int | datetime | None = None) -> None:
        """``as_of``: serve the lake as it was: a time (every table at its last version committed
        by then; a table created later is empty) or a version number (every table at that
        version, or its latest when it has fewer). Such an engine never refreshes."""
        self.settings = settings
        self.query_timeout = query_timeout
        self.as_of = as_of
        self.connection = duckdb.connect(":memory:")
        self.connection.execute("SET GLOBAL TimeZone = 'UTC'")  # global: each query's cursor is a new session
        self.connection.execute(f"CREATE SCHEMA {INTERNAL}; CREATE SCHEMA {COPIES}")
        self._lock = threading.Lock()  # one refresh at a time
        self._file_numbers = itertools.count()
        self.current_at = datetime.now(timezone.utc)  # when every copy was last found current
        self._held_back_files: dict[tuple[str, int], list[TableFile]] = {}  # (relation, version): see _served
        self._same_rows: dict[tuple[str, int], tuple[int, bool]] = {}  # (relation, version): see _state
        self._publication_read: tuple[int | None, Publication] = (None, Publication())  # see _publication
        # Coverage first: it says at which versions the published tables are read.
        self._snapshots: dict[str, DeltaTable | None] = {relation: self._open(relation) for relation in SOURCES}
        self.publication = self._publication(self._snapshots["coverage"])
        with self._transaction():
            self._copies = {relation: self._load(relation, self._served(relation, snapshot), None)
                            for relation, snapshot in self._snapshots.items()}
            for relation in SOURCES:
                copy = f"{COPIES}.{relation}"
                rows = (combined_sql(COMBINED[relation], copy) if relation in COMBINED
                        else f"SELECT * EXCLUDE (_file) FROM {copy}")
                self.connection.execute(f"CREATE VIEW {internal(relation)} AS {rows}")
        for name, sql in VIEWS_SQL.items():
            self.connection.execute(f"CREATE VIEW {name} AS {sql}")
        # From here on no connection to this database can touch files or be reconfigured.
        self.connection.execute("SET enable_external_access = false")
        self.connection.execute("SET lock_configuration = true")

    # ---- keeping the copies current ----------------------------------------------------------
    def _path(self, relation: str) -> str:
        return str(self.settings.lakehouse_dir / SOURCES[relation][0])

    def _open(self, relation: str) -> DeltaTable | None:
        path = self._path(relation)
        if not DeltaTable.is_deltatable(path):
            return None
        table = DeltaTable(path)
        if self.as_of is None:
            return table
        # The oldest version still in the log: a table the stream writes keeps little of it
        # (tables.STREAM_LOG_RETENTION), and delta-rs would give that version for an older time.
        oldest = table.history()[-1]
        if isinstance(self.as_of, int):
            wanted = min(self.as_of, table.version())
            if wanted < oldest["version"]:
                raise HistoryGone(f"{SOURCES[relation][0]} keeps versions {oldest['version']} to {table.version()} "
                                  f"only, not {wanted}: {HISTORY_KEPT}")
            table.load_as_version(wanted)
        else:
            if oldest["version"] == 0 and _committed_at(oldest) > self.as_of:
                return None  # created later
            if _committed_at(oldest) > self.as_of:
                raise HistoryGone(f"{SOURCES[relation][0]} keeps versions from {_committed_at(oldest).isoformat()} "
                                  f"only: {HISTORY_KEPT}")
            table.load_as_version(self.as_of)
        return table

    def _publication(self, coverage: DeltaTable | None) -> Publication:
        """The versions coverage publishes (none with ``--as-of VERSION``: every table at it),
        read once per version of coverage."""
        if coverage is None or isinstance(self.as_of, int):
            return Publication()
        if self._publication_read[0] != coverage.version():
            names = pa.schema(coverage.schema().to_arrow()).names
            wanted = [name for name in ("date", "table_versions", "rerun_started_at") if name in names]
            rows = pa.table(coverage.to_pyarrow_table(columns=wanted)).to_pylist()
            self._publication_read = (coverage.version(), Publication.of(rows))
        return self._publication_read[1]

    def _state(self, relation: str, snapshot: DeltaTable) -> tuple:
        """Which rows ``relation`` is to serve, cheaply (no file is listed): its version, and for
        a published table the version coverage publishes and the days held back at older ones."""
        if relation not in PUBLISHED:
            return (snapshot.version(), ())
        table = SOURCES[relation][0]
        wanted = self.publication.version(table)
        if wanted is not None and self.as_of is None:
            wanted = self._same_rows_as(relation, wanted)
        return (snapshot.version() if wanted is None else wanted,
                tuple(sorted(self.publication.days_held_back(table).items())))

    def _same_rows_as(self, relation: str, version: int) -> int:
        """The newest version with the rows of ``version`` (:func:`same_rows_until`; a commit's
        file never changes, so once a commit that changes rows follows, the answer stays)."""
        key = (relation, version)
        known, final = self._same_rows.get(key, (version, False))
        if key not in self._same_rows or (not final and has_newer_version(self._path(relation), known)):
            known, final = self._same_rows[key] = same_rows_until(self._path(relation), known)
        return known

    def _served(self, relation: str, snapshot: DeltaTable | None) -> _Served | None:
        """What to serve of ``relation``: its snapshot's files; a published table's at the version
        the last completed runs recorded, each day a later run has begun to replace (and not
        published) from the version its own last run recorded."""
        if snapshot is None:
            return None
        state = self._state(relation, snapshot)
        if state[0] != snapshot.version():
            snapshot.load_as_version(state[0])
        files = {file.path: file for file in table_files(snapshot)}
        for day, version in state[1]:
            files = {path: file for path, file in files.items() if file.partition.get("date") != day.isoformat()}
            files.update((file.path, file) for file in self._files_of_day(relation, version, day))
        return _Served(snapshot.version(), files, pa.schema(snapshot.schema().to_arrow()), state)

    def _files_of_day(self, relation: str, version: int, day: date) -> list[TableFile]:
        """The files of ``day``'s partition at ``version`` (time travel; a version's files never change)."""
        key = (relation, version)

        def gone(why: str) -> LakehouseError:
            return LakehouseError(
                f"{SOURCES[relation][0]}: day {day} is served from version {version}, the last its runs published, "
                f"and {why}: run `lambdalake batch --date {day}` to publish the day again")

        if key not in self._held_back_files:
            try:
                self._held_back_files[key] = table_files(DeltaTable(self._path(relation), version=version))
            except Exception as error:  # noqa: BLE001 - delta-rs' errors: that part of the log is gone
                raise gone(f"that version is no longer readable ({_first_line(error)})") from None
        files = [file for file in self._held_back_files[key] if file.partition.get("date") == day.isoformat()]
        missing = [file.path for file in files if not (Path(self._path(relation)) / unquote(file.path)).exists()]
        if missing:  # vacuumed: a week after the unpublished rerun replaced them
            raise gone(f"vacuum has deleted its file {missing[0]}")
        return files

    @contextmanager
    def _transaction(self) -> Iterator[None]:
        self.connection.execute("BEGIN TRANSACTION")
        try:
            yield
        except BaseException:
            self.connection.execute("ROLLBACK")
            raise
        self.connection.execute("COMMIT")

    def _load(self, relation: str, served: _Served | None, held: _Copy | None) -> _Copy:
        """Make ``_copies.<relation>`` hold ``served``'s rows; from ``held``, only the rows of
        files removed or added since move. Call inside :meth:`_transaction`."""
        declared = tables.arrow_schema(SOURCES[relation][1])
        if served is None:
            schema, files = declared, {}
        else:  # the files from the log's add actions; only those added since ``held`` are read
            schema, files = served.schema, served.files
            for field in declared:  # a table an older version made lacks the newer columns: nulls
                if field.name not in schema.names:
                    schema = schema.append(field)
            # Only the declared columns are served (not, e.g., the sketches a speed view merges).
            schema = pa.schema([field for field in schema if field.name in declared.names])
        table, root = f"{COPIES}.{relation}", self._path(relation)
        # Files are numbered as they are loaded: deleting a recent file's rows skips the row
        # groups of older ones (DuckDB's min and max per row group), where a path would not.
        if held is None or schema != held.schema:  # first load, or the schema evolved
            numbers = {path: next(self._file_numbers) for path in files}
            self.connection.register("_incoming", _rows(schema, [(numbers[path], read_table_file(root, file, schema))
                                                                 for path, file in files.items()]))
            self.connection.execute(f"CREATE OR REPLACE TABLE {table} AS SELECT * FROM _incoming")
        else:
            numbers = dict(held.files)
            removed = sorted(number for path, number in held.files.items() if path not in files)
            if removed:
                self.connection.execute(f"DELETE FROM {table} WHERE _file IN (SELECT unnest(?))", [removed])
            added = [(numbers.setdefault(path, next(self._file_numbers)), read_table_file(root, file, schema))
                     for path, file in files.items() if path not in held.files]
            self.connection.register("_incoming", _rows(schema, added))
            self.connection.execute(f"INSERT INTO {table} SELECT * FROM _incoming")
        self.connection.unregister("_incoming")
        return _Copy(None if served is None else served.version, None if served is None else served.state,
                     {path: numbers[path] for path in files}, schema)

    def refresh(self) -> list[str]:
        """Serve the latest committed version of every table (a published table: the versions
        the latest coverage publishes); only a table whose version changed (or that appeared) is
        touched, and all of them change in one commit (or, on an error, none, and the next
        refresh tries again). Returns the relations that changed."""
        if self.as_of is not None:
            return []
        with self._lock:
            checked_at = datetime.now(timezone.utc)
            # Coverage first: a published table is read at the versions it records, never past
            # them, so a run is seen only once it has published, and then whole.
            self._snapshots["coverage"] = self._current(self._snapshots["coverage"], "coverage")
            publication = self._publication(self._snapshots["coverage"])
            changed: dict[str, _Served] = {}
            previous, self.publication = self.publication, publication
            try:
                for relation, snapshot in self._snapshots.items():
                    if relation == "coverage":  # as read above: a later commit waits for the next refresh
                        pass
                    elif relation in PUBLISHED and publication.version(SOURCES[relation][0]) is not None:
                        snapshot = snapshot or self._open(relation)
                    else:
                        snapshot = self._current(snapshot, relation)
                    self._snapshots[relation] = snapshot
                    if snapshot is not None and self._state(relation, snapshot) != self._copies[relation].state:
                        changed[relation] = self._served(relation, snapshot)
                if changed:
                    with self._transaction():
                        copies = {relation: self._load(relation, served, self._copies[relation])
                                  for relation, served in changed.items()}
                    self._copies.update(copies)
            except BaseException:
                self.publication = previous
                raise
            self.current_at = checked_at
            return list(changed)

    def _current(self, snapshot: DeltaTable | None, relation: str) -> DeltaTable | None:
        """``snapshot`` brought to its table's latest version (opened, if it did not exist)."""
        if snapshot is None:
            return self._open(relation)
        if has_newer_version(self._path(relation), snapshot.version()):
            # Four times a second per table: look in the log first (a refresh costs).
            snapshot.update_incremental()  # reads only the log entries after its version
        return snapshot

    # ---- answering -----------------------------------------------------------------------------
    def execute(self, sql: str, params: Sequence[Any] | None = None, max_rows: int | None = None,
                on_start: Callable[[Callable[[], None]], None] | None = None, arrow: bool = False) -> Result:
        """Run one read-only query (``$1``-style ``params``) and return at most ``max_rows`` rows,
        as Python tuples or (``arrow``) an Arrow table. Raises :class:`QueryRefused` for anything
        but one valid SELECT/WITH statement over what is served, and :class:`QueryTimeout` past
        ``query_timeout`` seconds. ``on_start`` receives a function that cancels the query from
        another thread (:class:`QueryCancelled`)."""
        cursor = self.connection.cursor()
        timed_out = threading.Event()

        def time_limit() -> None:
            timed_out.set()
            cursor.interrupt()

        timer = threading.Timer(self.query_timeout, time_limit) if self.query_timeout else None
        if on_start:
            on_start(cursor.interrupt)
        try:
            query = _one_select(cursor, sql)
            if max_rows is not None:  # in the query, so DuckDB stops early (a top-N for an ORDER BY);
                query = f"SELECT * FROM (\n{query}\n) LIMIT {max_rows + 1}"  # one more row tells it was cut
            if timer:
                timer.start()
            result = cursor.execute(query, list(params) if params else None)
            columns = [(name, str(kind)) for name, kind, *_ in result.description]
            rows = result.to_arrow_table() if arrow else result.fetchall()
            truncated = max_rows is not None and len(rows) > max_rows
            return Result([name for name, _ in columns], [kind for _, kind in columns],
                          rows[:max_rows] if truncated else rows, truncated)
        except duckdb.InterruptException:
            if not timed_out.is_set():
                raise QueryCancelled("canceling statement due to user request") from None
            raise QueryTimeout(f"query cancelled after the {self.query_timeout:g} s time limit") from None
        except duckdb.PermissionException:
            raise QueryRefused(FILE_ACCESS, "file_access") from None
        except duckdb.Error as exc:  # a mistake in the SQL, or a cast that fails on a row: its first line says which
            raise QueryRefused(_first_line(exc)) from None
        finally:
            if timer:
                timer.cancel()
            cursor.close()

    def describe(self, sql: str, parameters: int = 0) -> tuple[list[str], list[str]]:
        """The column names and DuckDB types ``sql`` would answer, without running it (its
        ``parameters`` bound to NULL): what a PostgreSQL client asks when it prepares a statement."""
        cursor = self.connection.cursor()
        try:
            relation = cursor.sql(_one_select(cursor, sql), params=[None] * parameters if parameters else None)
            return relation.columns, [str(kind) for kind in relation.types]
        except duckdb.PermissionException:
            raise QueryRefused(FILE_ACCESS, "file_access") from None
        except duckdb.Error as exc:
            raise QueryRefused(_first_line(exc)) from None
        finally:
            cursor.close()

    def query(self, sql: str, max_rows: int | None = None) -> tuple[list[str], list[tuple]]:
        """Run one read-only query (as :meth:`execute`); returns column names and rows."""
        result = self.execute(sql, max_rows=max_rows)
        return result.columns, result.rows

    def version(self, relation: str) -> int | None:
        """The Delta version served for ``relation`` (None: the table does not exist yet)."""
        return self._copies[relation].version

    def rows(self, sql: str, max_rows: int | None = None) -> list[dict[str, Any]]:
        columns, rows = self.query(sql, max_rows)
        return [dict(zip(columns, row)) for row in rows]


@dataclass(frozen=True)
class Result:
    """A query's answer: its columns with their DuckDB types, and at most the row cap of rows,
    as Python tuples (what DuckDB's ``fetchall`` gives) or as an Arrow table when asked for it."""

    columns: list[str]
    types: list[str]  # DuckDB's names: 'BIGINT', 'TIMESTAMP WITH TIME ZONE', 'DECIMAL(18,3)', ...
    rows: list[tuple] | pa.Table
    truncated: bool  # rows past the row cap were left out

    @property
    def row_count(self) -> int:
        return len(self.rows)


def _one_select(cursor: duckdb.DuckDBPyConnection, sql: str) -> str:
    """The guard: ``sql`` if it is exactly one SELECT/WITH statement (without what trails it:
    semicolons and comments, so that it can stand inside a subquery), else :class:`QueryRefused`."""
    try:
        statements = cursor.extract_statements(sql)
    except duckdb.Error as exc:
        raise QueryRefused(_first_line(exc)) from None
    if len(statements) != 1:
        raise QueryRefused(f"exactly one statement per query, got {len(statements)}", "not_read_only")
    kind = statements[0].type
    if kind != duckdb.StatementType.SELECT:
        raise QueryRefused(f"only SELECT/WITH queries are allowed, got {kind.name}", "not_read_only")
    query, end = statements[0].query, len(statements[0].query)
    for position, token in reversed(duckdb.tokenize(query)):
        if token == duckdb.token_type.comment or (token == duckdb.token_type.operator and query[position] == ";"):
            end = position
        else:
            break
    return query[:end]


def _committed_at(commit: dict[str, Any]) -> datetime:
    return datetime.fromtimestamp(commit["timestamp"] / 1000, timezone.utc)


def _first_line(error: Exception) -> str:
    return str(error).splitlines()[0]


def _rows(schema: pa.Schema, files: Iterable[tuple[int, pa.Table]]) -> pa.Table:
    """The files' rows with the number of the file each came from."""
    parts = [rows.append_column("_file", pa.array([number] * rows.num_rows, pa.int64())) for number, rows in files]
    return pa.concat_tables(parts) if parts else schema.append(pa.field("_file", pa.int64())).empty_table()
