"""The serving layer: merged batch + speed views, answered by DuckDB.

Each Delta table's current snapshot is handed to DuckDB as an Arrow dataset (lazy scans with
filter pushdown, no copies, no Spark). The merged views follow ARCHITECTURE.md's merge rule: a
row comes from the batch view when its day is batch-covered, otherwise from the speed view, and
carries ``source``. The connection is read-only for users: one SELECT/WITH statement per query;
file access, ATTACH, COPY and configuration changes are disabled before any user SQL runs.
"""

from __future__ import annotations

import threading
from typing import Any

import duckdb
import pyarrow as pa
from deltalake import DeltaTable

from include import tables
from include.config import Settings
from include.registry import ViewSpec
from include.views import VIEWS



def merged(columns: list[str], batch: str, speed: str) -> str:
    """The merge rule: batch rows of covered days, speed rows of the other days."""
    listed = ", ".join(columns)
    return f"""
        SELECT {listed}, 'batch' AS source FROM {batch} WHERE date IN (SELECT date FROM _coverage)
        UNION ALL
        SELECT {listed}, 'speed' AS source FROM {speed} WHERE date NOT IN (SELECT date FROM _coverage)
    """


def speed_relation(view: ViewSpec) -> str:
    return f"_speed_{view.name}"


# Relation name in DuckDB -> (lakehouse table, schema when the table does not exist yet)
SOURCES = {
    "_coverage": (tables.BATCH_COVERAGE, tables.BATCH_COVERAGE_SCHEMA),
    "_late_events": (tables.LATE_EVENTS, tables.LATE_EVENTS_SCHEMA),
    "_dlq": (tables.DLQ, tables.DLQ_SCHEMA),
    "_reconciliation": (tables.RECONCILIATION, tables.RECONCILIATION_SCHEMA),
    "_stream_metrics": (tables.STREAM_METRICS, tables.STREAM_METRICS_SCHEMA),
    "_ingest_batches": (tables.INGEST_BATCHES, tables.INGEST_BATCHES_SCHEMA),
}
VIEWS_SQL = {
    "late_events": "SELECT topic, event_id, event_time, arrived_at, watermark_at_arrival, lateness_seconds FROM _late_events",
    "dlq": "SELECT topic, raw, reason, source, ingested_at FROM _dlq",
    "reconciliation": "SELECT view, date, metric, speed_value, batch_value, diff, computed_at FROM _reconciliation",
    "stream_metrics": "SELECT * FROM _stream_metrics",
    "ingest_batches": "SELECT * FROM _ingest_batches",
}
for _view in VIEWS:
    SOURCES[speed_relation(_view)] = (_view.speed_table, _view.schema)
    SOURCES[f"_batch_{_view.name}"] = (_view.batch_table, _view.schema)
    VIEWS_SQL[_view.name] = merged(_view.columns, f"_batch_{_view.name}", speed_relation(_view))
    if _view.recovered:
        SOURCES[f"_{_view.recovered.table}"] = (_view.recovered.table, _view.recovered_schema)
        VIEWS_SQL[_view.recovered.table] = f"SELECT * EXCLUDE (date) FROM _{_view.recovered.table}"
QUERYABLE = sorted(VIEWS_SQL)


class QueryRefused(ValueError):
    """A query that would write, change state or read files; nothing was run."""


class ServingEngine:
    """One DuckDB connection over the lakehouse's snapshots; :meth:`refresh` moves it to the
    latest ones. Safe to share between threads (one statement at a time)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.connection = duckdb.connect(":memory:")
        self.connection.execute("SET TimeZone = 'UTC'")
        self._lock = threading.RLock()
        self._snapshots: dict[str, DeltaTable | None] = dict.fromkeys(SOURCES)
        for relation in SOURCES:
            self._register(relation)
        for name, sql in VIEWS_SQL.items():
            self.connection.execute(f"CREATE VIEW {name} AS {sql}")
        # From here on the connection cannot touch files or be reconfigured.
        self.connection.execute("SET enable_external_access = false")
        self.connection.execute("SET lock_configuration = true")

    def _path(self, relation: str) -> str:
        return str(self.settings.lakehouse_dir / SOURCES[relation][0])

    def _register(self, relation: str) -> None:
        path = self._path(relation)
        snapshot = DeltaTable(path) if DeltaTable.is_deltatable(path) else None
        self._snapshots[relation] = snapshot
        if snapshot is None:
            data: Any = pa.Table.from_pylist([], schema=tables.arrow_schema(SOURCES[relation][1]))
        else:
            data = snapshot.to_pyarrow_dataset()
        self.connection.register(relation, data)

    def refresh(self) -> list[str]:
        """Serve the latest committed version of every table; only a table whose version changed
        (or that appeared) is registered again. Returns the relations that changed."""
        changed = []
        with self._lock:
            for relation, snapshot in self._snapshots.items():
                if snapshot is None:
                    appeared = DeltaTable.is_deltatable(self._path(relation))
                    if appeared:
                        changed.append(relation)
                    continue
                version = snapshot.version()
                snapshot.update_incremental()  # reads only the log entries after ``version``
                if snapshot.version() != version:
                    changed.append(relation)
            for relation in changed:
                self._register(relation)
        return changed

    def query(self, sql: str) -> tuple[list[str], list[tuple]]:
        """Run one read-only query; returns column names and rows."""
        statements = self.connection.extract_statements(sql)
        if len(statements) != 1:
            raise QueryRefused(f"exactly one statement per query, got {len(statements)}")
        kind = statements[0].type
        if kind != duckdb.StatementType.SELECT:
            raise QueryRefused(f"only SELECT/WITH queries are allowed, got {kind.name}")
        with self._lock:
            try:
                result = self.connection.execute(sql)
            except duckdb.PermissionException:
                raise QueryRefused("reading or writing files is not allowed in serving queries") from None
            columns = [column[0] for column in result.description]
            return columns, result.fetchall()

    def rows(self, sql: str) -> list[dict[str, Any]]:
        columns, rows = self.query(sql)
        return [dict(zip(columns, row)) for row in rows]
