"""The lakehouse store interface: delta-spark writes the pipeline's tables, delta-rs the ops tables.

Engines implement the ``_do_*`` primitives; this class owns what must behave the same on both:
transaction-id idempotency, bounded retries of conflicting commits, argument validation.
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass
from datetime import date, datetime
from functools import wraps
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from deltalake import DeltaTable, QueryBuilder

from include.disk_space import as_no_space_left

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame
    from pyspark.sql.types import StructField, StructType

    # Rows to write: a Spark DataFrame, or Arrow data already on the driver.
    Rows = DataFrame | pa.Table

log = logging.getLogger(__name__)
T = TypeVar("T")

_TABLE_NAME = re.compile(r"^[a-z][a-z0-9_]*(/[a-z][a-z0-9_]*)*$")

# Properties every table gets so both engines (and older readers) can read it.
PORTABLE_PROPERTIES = {
    "delta.enableDeletionVectors": "false",
}


@dataclass(frozen=True)
class Txn:
    """A Delta transaction id: a write is applied at most once per (app_id, version)."""

    app_id: str
    version: int

    def __post_init__(self) -> None:
        if not self.app_id:
            raise ValueError("txn app_id must be a non-empty string")
        if self.version < 0:
            raise ValueError(f"txn version must be >= 0, got {self.version}")


@dataclass(frozen=True)
class TableFile:
    """One data file of a table as its log describes it: partition values (as the log writes
    them), and the min and max of the column asked for (None without statistics)."""

    path: str
    partition: Mapping[str, str | None]
    low: Any
    high: Any


@dataclass(frozen=True)
class CommitInfo:
    """One entry of a table's history."""

    version: int
    timestamp: datetime
    operation: str
    parameters: dict[str, Any]


class LakehouseError(RuntimeError):
    """A lakehouse operation failed in a way the caller should see."""


class TableNotFound(LakehouseError):
    pass


class CommitConflictError(LakehouseError):
    """A concurrent-commit conflict persisted after all retries."""


def log_entry(path: str, version: int) -> Path:
    """The commit file of ``version`` in the Delta log of the table at ``path``."""
    return Path(path) / "_delta_log" / f"{version:020d}.json"


def has_newer_version(path: str, version: int) -> bool:
    """Whether the table at ``path`` has a version after ``version``: a cheap look at its log (a
    refresh costs delta-rs ~5 ms even when nothing changed). The next version's entry, or a
    checkpoint after it (the log before a checkpoint may be cleaned up)."""
    if log_entry(path, version + 1).exists():
        return True
    try:
        last_checkpoint = json.loads((Path(path) / "_delta_log" / "_last_checkpoint").read_text())
    except (OSError, ValueError):
        return False
    return last_checkpoint.get("version", -1) > version


def sql_literal(value: Any) -> str:
    """A SQL literal for a partition predicate (both engines parse the same syntax)."""
    if value is None:
        raise ValueError("partition value must not be None")
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (date, datetime)):
        return f"'{value.isoformat()}'"
    return "'" + str(value).replace("'", "''") + "'"


def _has_rows_outside(rows: Rows, predicate: str, partition: Mapping[str, Any]) -> bool:
    """Whether some of ``rows`` lie outside the partition (a null partition value included)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if not isinstance(rows, pa.Table):
        return not rows.where(f"NOT ({predicate}) OR " + " OR ".join(f"{c} IS NULL" for c in partition)).isEmpty()
    inside = [pc.equal(rows[column], pa.scalar(value).cast(rows[column].type)).fill_null(False)
              for column, value in partition.items()]
    return rows.num_rows > 0 and not all(pc.all(column).as_py() for column in inside)


def writes(method: Callable[..., T]) -> Callable[..., T]:
    """A store operation that writes: a full disk on the way (Spark's, delta-rs' or Python's
    error) becomes a :class:`~include.disk_space.NoSpaceLeftError` naming the table."""

    @wraps(method)
    def writing(self: LakehouseStore, *args: Any, **kwargs: Any) -> T:
        try:
            return method(self, *args, **kwargs)
        except Exception as error:
            name = args[0] if args and isinstance(args[0], str) else None
            full = as_no_space_left(error, self.root / name if name else self.root)
            if full is None or full is error:
                raise
            raise full from error

    return writing


class LakehouseStore(ABC):
    """Delta tables under one root folder, addressed by name (``bronze/orders``)."""

    engine: str

    def __init__(self, root: Path | str, commit_retries: int = 8, backoff_seconds: float = 0.1) -> None:
        self.root = Path(root)
        self.commit_retries = commit_retries
        self.backoff_seconds = backoff_seconds
        self._tables: dict[str, DeltaTable] = {}  # see _latest
        self._tables_lock = threading.Lock()
        self._txn_versions: dict[tuple[str, str], tuple[int, int | None]] = {}  # see txn_version

    # ---- naming -------------------------------------------------------------------------
    def path(self, name: str) -> str:
        if not _TABLE_NAME.match(name):
            raise ValueError(
                f"table name must be lowercase words separated by '/', got '{name}'"
            )
        return str(self.root / name)

    def exists(self, name: str) -> bool:
        return self._is_table(self.path(name))

    def _is_table(self, path: str) -> bool:
        """Whether a Delta table is at ``path`` (an open one is: tables are never removed while
        the store runs, and the check lists the log's folder)."""
        return path in self._tables or DeltaTable.is_deltatable(path)

    def _latest(self, path: str, refresh: bool = True) -> DeltaTable:
        """The table at its latest version. Opening a table replays its log (10+ ms) and so does
        bringing a handle up to date over a few commits, while a live stream asks dozens of times
        per micro-batch from several threads. So one handle per table stays open, shared by the
        threads: it follows this process's own commits as they are made, and a refresh only reads
        other processes' commits (delta-rs locks a handle per call; each operation builds on the
        snapshot it took, and a commit on a stale one is checked for conflicts). ``refresh=False``:
        for the schema and partition columns only (tables here never change them)."""
        with self._tables_lock:
            table = self._tables.get(path)
        if table is not None and not refresh:
            return table
        if table is not None:
            if not has_newer_version(path, table.version()):
                return table
            try:
                table.update_incremental()
                return table
            except Exception as error:  # noqa: BLE001 - e.g. the log was cleaned up: open afresh
                log.info("reopening table %s: %s", path, error)
        table = DeltaTable(path)
        with self._tables_lock:
            self._tables[path] = table
        return table

    def _require(self, name: str) -> str:
        path = self.path(name)
        if not self._is_table(path):
            raise TableNotFound(f"table '{name}' does not exist at {path}")
        return path

    # ---- public operations ----------------------------------------------------------------
    @writes
    def ensure_table(
        self,
        name: str,
        schema: StructType,
        partition_by: Sequence[str] = (),
        properties: Mapping[str, str] | None = None,
    ) -> bool:
        """Create the table if it does not exist. Returns True when it was created. An existing
        table made by an older version is given the ``properties`` and the columns it lacks (new
        columns read as null in its older rows)."""
        missing = [col for col in partition_by if col not in schema.fieldNames()]
        if missing:
            raise ValueError(f"partition columns {missing} are not in the schema of '{name}'")
        if self.exists(name):
            path = self.path(name)
            table = self._latest(path)
            current = table.metadata().configuration
            changed = {key: value for key, value in (properties or {}).items() if current.get(key) != value}
            if changed:
                self._retrying(f"set properties of '{name}'", lambda: self._do_set_properties(path, changed))
            present = {field.name for field in table.schema().fields}
            added = [field for field in schema.fields if field.name not in present]
            if added:
                self._retrying(f"add columns to '{name}'", lambda: self._do_add_columns(path, added))
            return False
        props = {**PORTABLE_PROPERTIES, **(properties or {})}
        self._retrying(
            f"create table '{name}'",
            lambda: self._do_create(self.path(name), schema, list(partition_by), props),
        )
        return True

    def txn_version(self, name: str, app_id: str) -> int | None:
        """The latest committed version of ``app_id`` on the table, or None."""
        if not self.exists(name):
            return None
        return self._txn_version_of(self.path(name), self._latest(self.path(name)), app_id)

    def _txn_version_of(self, path: str, table: DeltaTable, app_id: str) -> int | None:
        """``app_id``'s latest version as of the handle ``table``: delta-rs looks it up among all
        the table's transactions (~2 ms), so once per table version will do."""
        version = table.version()
        known = self._txn_versions.get((path, app_id))
        if known is None or known[0] != version:
            known = (version, table.transaction_version(app_id))
            self._txn_versions[(path, app_id)] = known
        return known[1]

    def is_committed(self, name: str, txn: Txn | None) -> bool:
        if txn is None:
            return False
        committed = self.txn_version(name, txn.app_id)
        return committed is not None and committed >= txn.version

    @writes
    def append(self, name: str, df: Rows, txn: Txn | None = None) -> bool:
        """Append rows. With a txn, a version already committed is skipped (returns False)."""

        if self.is_committed(name, txn):
            log.info("append to '%s' skipped: txn %s already committed", name, txn)
            return False
        path = self.path(name)
        data = self._prepare(path, df)
        return self._commit_once(f"append to '{name}'", name, txn, lambda: self._do_append(path, data, txn))

    @writes
    def merge(
        self,
        name: str,
        df: Rows,
        keys: Sequence[str],
        txn: Txn | None = None,
        update_when: str | None = None,
        insert_only: bool = False,
        delete_when: str | None = None,
    ) -> bool:
        """Upsert rows on ``keys``: matched rows are updated (only where the SQL condition
        ``update_when`` holds, if given; ``t.`` is the table, ``s.`` the new row), others
        inserted. With ``insert_only``, matched rows are left as they are. A new row for which
        ``delete_when`` holds (a tombstone) deletes its match and is not inserted itself."""
        if insert_only and update_when:
            raise ValueError("merge takes update_when or insert_only, not both")
        if not keys:
            raise ValueError("merge needs at least one key column")
        columns = df.column_names if hasattr(df, "column_names") else df.columns
        missing = [key for key in keys if key not in columns]
        if missing:
            raise ValueError(f"merge keys {missing} are not columns of the source")
        path = self._require(name)
        if self.is_committed(name, txn):
            log.info("merge into '%s' skipped: txn %s already committed", name, txn)
            return False
        data = self._prepare(path, df)
        return self._commit_once(
            f"merge into '{name}'", name, txn,
            lambda: self._do_merge(path, data, list(keys), txn, "false" if insert_only else update_when, delete_when),
        )

    @writes
    def replace_partition(
        self, name: str, df: Rows, partition: Mapping[str, Any], txn: Txn | None = None
    ) -> bool:
        """Atomically replace exactly the rows of one partition (e.g. ``{"date": day}``)."""
        if not partition:
            raise ValueError("replace_partition needs a partition, e.g. {'date': '2026-11-20'}")
        path = self._require(name)
        table_partitions = self._latest(path, refresh=False).metadata().partition_columns
        unknown = [col for col in partition if col not in table_partitions]
        if unknown:
            raise ValueError(
                f"{unknown} are not partition columns of '{name}' (it has {table_partitions})"
            )
        predicate = " AND ".join(f"{col} = {sql_literal(val)}" for col, val in partition.items())
        if _has_rows_outside(df, predicate, partition):
            raise ValueError(f"rows outside partition {dict(partition)} given to replace '{name}'")
        if self.is_committed(name, txn):
            return False
        data = self._prepare(path, df)
        return self._commit_once(
            f"replace {dict(partition)} of '{name}'", name, txn, lambda: self._do_replace(path, data, predicate, txn)
        )

    @writes
    def delete(self, name: str, predicate: str) -> None:
        """Delete the rows matching SQL ``predicate`` (both engines parse it)."""
        path = self._require(name)
        self._retrying(f"delete from '{name}'", lambda: self._do_delete(path, predicate))

    def select_arrow(self, name: str, columns: Sequence[str], where: str | None = None) -> pa.Table:
        """A small filtered projection as Arrow, without a Spark job, whichever engine writes
        (delta-rs' DataFusion reads it): the speed layer reads its own state this way, and the
        nightly run's checks read the ops tables without starting a Spark application. ``where``
        is SQL, e.g. ``event_time >= CAST('2026-11-20T10:00:00Z' AS TIMESTAMP)``."""
        import pyarrow as pa

        if not columns:
            raise ValueError("select_arrow needs at least one column")
        table = self._latest(self._require(name))
        quoted = ", ".join(f'"{column}"' for column in columns)
        sql = f"SELECT {quoted} FROM t" + (f" WHERE {where}" if where else "")
        result = pa.RecordBatchReader.from_stream(QueryBuilder().register("t", table).execute(sql)).read_all()
        # DataFusion answers with view types (string_view); give callers the table's own types.
        schema = pa.schema(table.schema().to_arrow())
        return result.cast(pa.schema([schema.field(column) for column in columns]))

    def partition_row_counts(self, name: str, column: str) -> dict[Any, int]:
        """Rows per value of partition ``column``, from the Delta log's file statistics (no data
        is read)."""
        import pyarrow as pa

        actions = pa.table(self._latest(self._require(name)).get_add_actions(flatten=True))
        key = f"partition.{column}"
        if key not in actions.column_names:
            raise ValueError(f"'{column}' is not a partition column of '{name}'")
        counts = actions.group_by(key).aggregate([("num_records", "sum")]).to_pylist()
        return {row[key]: row["num_records_sum"] for row in counts}

    def version(self, name: str) -> int:
        return self._latest(self._require(name)).version()

    def history(self, name: str, limit: int | None = None) -> list[CommitInfo]:
        """Commits, newest first."""
        return self._do_history(self._require(name), limit)

    @writes
    def optimize(self, name: str, zorder_by: Sequence[str] = ()) -> dict[str, Any]:
        """Compact small files, clustering by ``zorder_by`` when given."""
        path = self._require(name)
        return self._retrying(f"optimize '{name}'", lambda: self._do_optimize(path, list(zorder_by)))

    @writes
    def vacuum(self, name: str, retention_hours: float = 168) -> int:
        """Delete files no longer referenced by versions newer than the retention. Returns count."""
        if retention_hours < 0:
            raise ValueError(f"retention hours must be >= 0, got {retention_hours}")
        path = self._require(name)
        if not _files_older_than(Path(path), time.time() - retention_hours * 3600):
            return 0  # vacuum deletes only files older than the retention: it would list and find none
        return self._retrying(f"vacuum '{name}'", lambda: self._do_vacuum(path, retention_hours))

    # ---- retries ------------------------------------------------------------------------
    def _commit_once(self, what: str, name: str, txn: Txn | None, commit: Callable[[], None]) -> bool:
        """``commit``, which the caller has just found not yet on table ``name``, retried on
        conflicts. Before each retry the txn is checked again (the conflicting writer may have
        committed it): False then."""
        retry = False

        def attempt() -> bool:
            nonlocal retry
            if retry and self.is_committed(name, txn):
                return False
            retry = True
            commit()
            return True

        return self._retrying(what, attempt)

    def _retrying(self, what: str, operation: Callable[[], T]) -> T:
        for attempt in range(self.commit_retries + 1):
            try:
                return operation()
            except Exception as exc:
                if not self._is_conflict(exc):
                    raise
                if attempt == self.commit_retries:
                    raise CommitConflictError(
                        f"{what} still conflicted after {attempt + 1} attempts: {exc}"
                    ) from exc
                delay = self.backoff_seconds * (2**attempt) * (0.5 + random.random())
                log.warning(
                    "%s: concurrent commit conflict (attempt %d/%d), retrying in %.2fs: %s",
                    what, attempt + 1, self.commit_retries + 1, delay, exc,
                )
                time.sleep(delay)
        raise AssertionError("unreachable")

    # ---- engine primitives --------------------------------------------------------------
    @abstractmethod
    def _is_conflict(self, exc: Exception) -> bool: ...

    @abstractmethod
    def _prepare(self, path: str, df: Rows) -> Any:
        """Materialise ``df`` once for writing, so retries do not recompute it."""

    @abstractmethod
    def _do_create(
        self, path: str, schema: StructType, partition_by: list[str], properties: dict[str, str]
    ) -> None: ...

    @abstractmethod
    def _do_set_properties(self, path: str, properties: dict[str, str]) -> None: ...

    @abstractmethod
    def _do_add_columns(self, path: str, fields: list[StructField]) -> None: ...

    @abstractmethod
    def _do_append(self, path: str, data: Any, txn: Txn | None) -> None: ...

    @abstractmethod
    def _do_merge(
        self, path: str, data: Any, keys: list[str], txn: Txn | None, update_when: str | None, delete_when: str | None
    ) -> None: ...

    @abstractmethod
    def _do_replace(self, path: str, data: Any, predicate: str, txn: Txn | None) -> None: ...

    @abstractmethod
    def _do_delete(self, path: str, predicate: str) -> None: ...

    @abstractmethod
    def _do_history(self, path: str, limit: int | None) -> list[CommitInfo]: ...

    @abstractmethod
    def _do_optimize(self, path: str, zorder_by: list[str]) -> dict[str, Any]: ...

    @abstractmethod
    def _do_vacuum(self, path: str, retention_hours: float) -> int: ...


def _files_older_than(table: Path, cutoff: float) -> bool:
    """Whether a data file of ``table`` (its log aside) was last written before ``cutoff``: a file
    removed from the table, or never committed, is as old as its last write at least."""
    for folder, folders, files in os.walk(table):
        if folder == str(table) and "_delta_log" in folders:
            folders.remove("_delta_log")
        for name in files:
            with suppress(FileNotFoundError):  # removed meanwhile (compaction, another vacuum)
                if os.stat(os.path.join(folder, name)).st_mtime < cutoff:
                    return True
    return False
