"""The embedded default engine: Spark computes, delta-rs commits; data crosses through Arrow."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import threading
import time
import uuid
from functools import partial
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import date
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import CommitProperties, DeltaTable, Field, write_deltalake
from deltalake.exceptions import CommitFailedError
from deltalake.transaction import AddAction, RemoveAction, Transaction

from include.lakehouse.base import (
    CommitInfo, LakehouseStore, Rewrite, TableFile, Txn, has_newer_version, log_entry, writes,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame
    from pyspark.sql.types import StructField, StructType


def _commit_properties(txn: Txn | None) -> CommitProperties | None:
    if txn is None:
        return None
    return CommitProperties(app_transactions=[Transaction(txn.app_id, txn.version)])


# Spark's name for a null partition value in a folder name; Delta's is the same.
NULL_PARTITION = "__HIVE_DEFAULT_PARTITION__"
STAGING = "_staging"  # inside the table folder: a rename into place never crosses file systems
CHECKPOINT_INTERVAL = 100  # Delta's default: commits between checkpoints
LOCKS = "_locks"  # under the store's root: a lock file per table (DeltaRsStore._locked)


class VersionTaken(Exception):
    """Another writer committed the version an append was about to take (a conflict: retried)."""


@dataclass(frozen=True)
class OwnCommit:
    """A commit of file actions this process wrote itself (:meth:`DeltaRsStore._commit_files`)."""

    version: int
    txn: Txn | None
    added: list[AddAction]
    removed: list[str]


@dataclass(frozen=True)
class StagedFiles:
    """Parquet files Spark's executors wrote into the table folder, not yet committed."""

    actions: list[AddAction]
    schema: pa.Schema
    partition_by: list[str]

    @property
    def rows(self) -> int:
        return sum(json.loads(action.stats)["numRecords"] for action in self.actions)


def check_columns(table: str, expected: list[str], given: list[str]) -> None:
    """Rows to write must have exactly the table's columns (in any order)."""
    missing = [name for name in expected if name not in given]
    if missing:
        raise ValueError(f"columns {missing} of table {table} are missing from the data")
    extra = [name for name in given if name not in expected]
    if extra:
        raise ValueError(f"columns {extra} are not in the schema of table {table}")


def _stat(value: Any, end: str) -> Any:
    """A value as Delta's statistics write it; a time to the millisecond, as the protocol has
    it, rounded outwards (``end``: "min" or "max") so no row falls outside."""
    if isinstance(value, datetime):
        millis = value.replace(microsecond=value.microsecond // 1000 * 1000)
        if end == "max" and millis != value:
            millis += timedelta(milliseconds=1)
        return millis.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
    if isinstance(value, date):
        return value.isoformat()
    return value if isinstance(value, (bool, int, float, str)) else None  # e.g. a decimal: left out


def _stat_value(value: Any, kind: pa.DataType) -> Any:
    """A min or max of Delta's statistics as the column's Python value (:func:`_stat` undone)."""
    if value is None:
        return None
    if pa.types.is_timestamp(kind):
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
        return moment if kind.tz else moment.replace(tzinfo=None)
    if pa.types.is_date(kind):
        return date.fromisoformat(value)
    return value


def file_stats(rows: pa.Table) -> str:
    """The statistics of a data file's rows, as Delta's log keeps them: min, max and null count
    of every simple column (whole strings, not cut: delta-rs' reader turns a missing min or max
    into a filter no row passes), a null count for binary ones, nothing for nested ones (Delta
    nests theirs). Like delta-rs, min and max leave NaN out."""
    import pyarrow.compute as pc

    stats: dict[str, Any] = {"numRecords": rows.num_rows, "minValues": {}, "maxValues": {}, "nullCount": {}}
    for name, column in zip(rows.column_names, rows.columns):
        kind = column.type
        if pa.types.is_nested(kind):
            continue
        stats["nullCount"][name] = column.null_count
        if pa.types.is_binary(kind) or pa.types.is_large_binary(kind) or column.null_count == rows.num_rows:
            continue
        extremes = pc.min_max(column)
        for end, key in (("min", "minValues"), ("max", "maxValues")):
            value = _stat(extremes[end].as_py(), end)
            if value is not None:
                stats[key][name] = value
    return json.dumps(stats)


def spark_schema_of(table: DeltaTable) -> StructType:
    from pyspark.sql.pandas.types import from_arrow_schema

    arrow_schema = pa.schema(table.schema().to_arrow())
    return from_arrow_schema(arrow_schema, prefer_timestamp_ntz=False)


def _by_partition(rows: pa.Table, partition_by: list[str]) -> list[pa.Table]:
    """``rows`` split by their partition values (one table each; none for no rows)."""
    import pyarrow.compute as pc

    if not partition_by or rows.num_rows == 0:
        return [rows] if rows.num_rows else []
    parts = []
    for values in rows.select(partition_by).group_by(partition_by).aggregate([]).to_pylist():
        mask = None
        for name, value in values.items():
            column = rows[name]
            matches = pc.is_null(column) if value is None else pc.equal(column, pa.scalar(value, column.type))
            mask = matches if mask is None else pc.and_(mask, matches)
        parts.append(rows.filter(mask))
    return parts


def table_files(table: DeltaTable, column: str | None = None) -> list[TableFile]:
    """The files of the table's loaded version, from its log's add actions (delta-rs lists them
    in Rust), with the min and max of ``column``."""
    actions = pa.table(table.get_add_actions(flatten=True))
    partitions = [name for name in actions.column_names if name.startswith("partition.")]

    def listed(name: str) -> list:
        return actions.column(name).to_pylist() if name in actions.column_names else [None] * actions.num_rows

    values = {name: [None if value is None else str(value) for value in listed(name)] for name in partitions}
    lows, highs = listed(f"min.{column}"), listed(f"max.{column}")
    return [TableFile(path, {name.removeprefix("partition."): values[name][at] for name in partitions},
                      lows[at], highs[at])
            for at, path in enumerate(actions.column("path").to_pylist())]


def read_table_file(table_path: str, file: TableFile, schema: pa.Schema) -> pa.Table:
    """One file's rows as ``schema``: its partition columns from its log's values, a column added
    after it was written as nulls."""
    rows = pq.read_table(Path(table_path) / unquote(file.path))
    for missing in [field for field in schema if field.name not in rows.column_names
                    and field.name not in file.partition]:
        rows = rows.append_column(missing.name, pa.nulls(rows.num_rows, missing.type))
    # Files delta-spark writes hold their partition columns too; delta-rs leaves them to the log.
    for column, value in [(column, value) for column, value in file.partition.items()
                          if column not in rows.column_names]:
        kind = schema.field(column).type
        rows = rows.append_column(column, pa.array([value] * rows.num_rows, pa.string()).cast(kind))
    return rows.select(schema.names).cast(schema)


class DeltaRsStore(LakehouseStore):
    engine = "delta-rs"
    rewrites_files = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._own: dict[str, list[OwnCommit]] = {}  # by table path: see _commit_files
        self._committing: dict[str, threading.Lock] = {}
        self._file_lists: dict[tuple[str, str], tuple[int, list[TableFile]]] = {}  # see _files_of

    def _is_conflict(self, exc: Exception) -> bool:
        return isinstance(exc, (CommitFailedError, VersionTaken))

    def txn_version(self, name: str, app_id: str) -> int | None:
        path = self.path(name)
        own = self._own_since(path)
        if own is None:
            return super().txn_version(name, app_id)
        for commit in reversed(own[1]):
            if commit.txn is not None and commit.txn.app_id == app_id:
                return commit.txn.version
        return self._txn_version_of(path, own[0], app_id)

    def _own_since(self, path: str) -> tuple[DeltaTable, list[OwnCommit]] | None:
        """The table's handle, as it is, and the commits this process wrote after its version,
        if together they are the whole log (no other writer has committed since)."""
        own = self._own.get(path)
        if not own or has_newer_version(path, own[-1].version):
            return None
        table = self._latest(path, refresh=False)
        since = [commit for commit in own if commit.version > table.version()]
        if since and since[0].version != table.version() + 1:  # the handle is older than these
            return None
        return table, since

    def _open(self, path: str) -> DeltaTable:
        """The snapshot a commit builds on (a seam tests use to force concurrent commits)."""
        return self._latest(path)

    def _prepare(self, path: str, df: DataFrame | pa.Table) -> pa.Table:
        """Rows as Arrow, conformed to the table's column order, types and nullability."""
        data = df if isinstance(df, pa.Table) else df.toArrow()
        return self._conform(path, data)

    def _prepare_append(self, path: str, df: DataFrame | pa.Table) -> pa.Table | StagedFiles:
        """Arrow rows as they are; a Spark DataFrame is written by the executors, so a micro-batch
        never passes through the driver (which then commits just the file list)."""
        if isinstance(df, pa.Table) or not self._is_table(path):
            return self._prepare(path, df)
        return self._stage(path, df)

    def _stage(self, path: str, df: DataFrame) -> StagedFiles:
        table = self._latest(path, refresh=False)
        partition_by = table.metadata().partition_columns
        staging = Path(path) / STAGING / uuid.uuid4().hex
        self._conformed(table, df).write.partitionBy(*partition_by).parquet(str(staging))
        return self._move_into(staging, path)

    @writes
    def append_split(
        self, df: DataFrame, column: str, tables: Mapping[Any, str], txn: Txn | None = None
    ) -> dict[str, int | None]:
        """One Spark job writes every table's files; each table then commits its own."""
        from pyspark.sql import functions as F

        appended: dict[str, int | None] = {name: None for name in tables.values()}
        pending = {value: name for value, name in tables.items() if not self.is_committed(name, txn)}
        if not pending:
            return appended
        first = self._latest(self._require(next(iter(pending.values()))), refresh=False)
        partition_by = first.metadata().partition_columns
        staging = self.root / STAGING / uuid.uuid4().hex
        rows = df.where(F.col(column).isin(*pending))
        self._conformed(first, rows, also=column).write.partitionBy(column, *partition_by).parquet(str(staging))
        try:
            for value, name in pending.items():
                path = self.path(name)
                staged = self._move_into(staging / f"{column}={value}", path)
                self._commit_once(f"append to '{name}'", name, txn, partial(self._do_append, path, staged, txn))
                appended[name] = staged.rows
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return appended

    @staticmethod
    def _conformed(table: DeltaTable, df: DataFrame, also: str | None = None) -> DataFrame:
        """``df`` with the table's columns, in its order and types (and column ``also``)."""
        from pyspark.sql import functions as F

        target = spark_schema_of(table)
        check_columns(table.table_uri, target.fieldNames(), [name for name in df.columns if name != also])
        return df.select(*[F.col(f.name).cast(f.dataType).alias(f.name) for f in target.fields],
                         *([also] if also else []))

    def _move_into(self, staging: Path, path: str) -> StagedFiles:
        """Move the Parquet files Spark wrote under ``staging`` (partition folders included) into
        the table's folder, and describe them as add actions."""
        root, table = Path(path), self._latest(path, refresh=False)
        actions = []
        for file in sorted(staging.rglob("*.parquet")):
            relative = file.relative_to(staging)
            values = dict(part.split("=", 1) for part in relative.parts[:-1])
            final = root / relative
            final.parent.mkdir(parents=True, exist_ok=True)
            os.replace(file, final)
            actions.append(
                AddAction(
                    path=str(relative), size=final.stat().st_size,
                    partition_values={k: None if v == NULL_PARTITION else unquote(v) for k, v in values.items()},
                    modification_time=int(time.time() * 1000), data_change=True,
                    stats=json.dumps({"numRecords": pq.read_metadata(final).num_rows}),
                )
            )
        shutil.rmtree(staging, ignore_errors=True)
        return StagedFiles(actions, pa.schema(table.schema().to_arrow()), table.metadata().partition_columns)

    def _conform(self, path: str, data: pa.Table) -> pa.Table:
        if not self._is_table(path):
            return data.cast(pa.schema([field.with_nullable(True) for field in data.schema]))
        target = pa.schema(self._latest(path, refresh=False).schema().to_arrow())
        check_columns(path, target.names, data.schema.names)
        return data.select(target.names).cast(target)

    def _do_create(
        self, path: str, schema: StructType, partition_by: list[str], properties: dict[str, str]
    ) -> None:
        from pyspark.sql.pandas.types import to_arrow_schema

        arrow_schema = to_arrow_schema(schema, timezone="UTC")
        DeltaTable.create(
            path, arrow_schema, mode="ignore", partition_by=partition_by or None,
            configuration=properties,
        )

    def _do_set_properties(self, path: str, properties: dict[str, str]) -> None:
        self._latest(path).alter.set_table_properties(properties)

    def _do_add_columns(self, path: str, fields: list[StructField]) -> None:
        self._latest(path).alter.add_columns([Field.from_json(json.dumps(field.jsonValue())) for field in fields])

    def _do_append(self, path: str, data: pa.Table | StagedFiles, txn: Txn | None) -> None:
        if isinstance(data, StagedFiles):
            if data.actions:
                self._commit_files(path, txn, data.actions)
            return
        if not self._is_table(path) or data.num_rows == 0:
            write_deltalake(self._open(path) if self._is_table(path) else path, data, mode="append",
                            commit_properties=_commit_properties(txn))
            return
        # Files written here and committed as actions: write_deltalake's append costs more with
        # every file the table holds (18 ms at 1 file, 68 ms at 450), a commit of actions hardly.
        partition_by = self._latest(path, refresh=False).metadata().partition_columns
        written = [self._write_file(path, part, partition_by) for part in _by_partition(data, partition_by)]
        self._commit_files(path, txn, [action for action, _ in written])

    def _commit_files(self, path: str, txn: Txn | None, added: list[AddAction],
                      removed: Sequence[TableFile] = ()) -> None:
        """Commit file actions: the log entry written here, as Delta's protocol has it. delta-rs'
        own commit costs ~28 ms of CPU and ~660 thread switches, and bringing a handle up to date
        over it ~20 ms more; this costs ~1 ms, and the handle stays as it was (the commits since
        are in ``_own``; readers bring it up to date when they need to). The version is taken with
        a hard link, which fails when another writer took it first (a conflict: retried)."""
        table = self._latest(path, refresh=False)
        protocol = table.protocol()
        now = int(time.time() * 1000)
        if protocol.min_writer_version > 2 or protocol.writer_features:  # features this does not write
            removes = [RemoveAction(path=file.path, data_change=True, deletion_timestamp=now,
                                    partition_values=dict(file.partition)) for file in removed]
            self._latest(path).create_write_transaction(removes + added, "append", pa.schema(table.schema().to_arrow()),
                                                        partition_by=table.metadata().partition_columns or None,
                                                        commit_properties=_commit_properties(txn))
            return
        removes = [{"path": file.path, "deletionTimestamp": now, "dataChange": True,
                    "partitionValues": dict(file.partition)} for file in removed]
        with self._committing.setdefault(path, threading.Lock()):
            own = self._own_since(path)
            if own is None:
                latest = self._latest(path)
                own = (latest, [])
            version = own[0].version() + len(own[1]) + 1
            entries = [{"commitInfo": {"timestamp": now, "operation": "WRITE" if not removes else "REWRITE",
                                       "operationParameters": {"mode": "Append"}, "isBlindAppend": not removes,
                                       "clientVersion": "lambdalake"}}]
            if txn is not None:
                entries.append({"txn": {"appId": txn.app_id, "version": txn.version, "lastUpdated": now}})
            entries += [{"remove": remove} for remove in removes]
            entries += [{"add": {"path": add.path, "partitionValues": add.partition_values, "size": add.size,
                                 "modificationTime": add.modification_time, "dataChange": add.data_change,
                                 "stats": add.stats}} for add in added]
            staging = log_entry(path, version).with_name(f".{uuid.uuid4().hex}.json.tmp")
            staging.write_text("".join(json.dumps(entry) + "\n" for entry in entries))
            try:
                os.link(staging, log_entry(path, version))
            except FileExistsError:
                raise VersionTaken(f"version {version} of {path} was committed by another writer") from None
            finally:
                staging.unlink()
            self._own[path] = [*own[1], OwnCommit(version, txn, added, [file.path for file in removed])]
        interval = int(table.metadata().configuration.get("delta.checkpointInterval", CHECKPOINT_INTERVAL))
        if version % interval == 0:  # what delta-rs' commit does after it: a checkpoint, old log cleaned up
            latest = self._latest(path)
            latest.create_checkpoint()
            latest.cleanup_metadata()

    def _do_merge(
        self, path: str, data: pa.Table, keys: list[str], txn: Txn | None, update_when: str | None,
        delete_when: str | None,
    ) -> None:
        predicate = " AND ".join(f"t.`{key}` = s.`{key}`" for key in keys)
        # The rows are in memory already; streamed execution would stop delta-rs from reading
        # their min and max per matched column, from which it skips the files they cannot match.
        merger = self._open(path).merge(
            data, predicate, source_alias="s", target_alias="t", streamed_exec=False,
            commit_properties=_commit_properties(txn),
        )
        if delete_when:  # the first matching clause applies
            merger = merger.when_matched_delete(predicate=delete_when)
        if update_when != "false":
            merger = merger.when_matched_update_all(predicate=update_when)
        merger.when_not_matched_insert_all(predicate=f"NOT ({delete_when})" if delete_when else None).execute()

    def _do_replace(self, path: str, data: pa.Table, predicate: str, txn: Txn | None) -> None:
        write_deltalake(path, data, mode="overwrite", predicate=predicate, commit_properties=_commit_properties(txn))

    def _do_delete(self, path: str, predicate: str) -> None:
        with self._locked(path):
            self._open(path).delete(predicate)

    @contextmanager
    def _locked(self, path: str) -> Iterator[None]:
        """The table's lock, held by :meth:`rewrite` from its plan to its commit, and by the
        compactions and deletes that may remove the same files (the tables rewritten take no
        merge). delta-rs checks those for files removed by a concurrent commit, but not a commit
        of file actions: without the lock, a rewrite could remove a file a compaction had just
        rewritten, and its rows would be there twice. One machine's processes share it."""
        locks = self.root / LOCKS
        locks.mkdir(parents=True, exist_ok=True)
        name = str(Path(path).relative_to(self.root)).replace("/", "+")
        with open(locks / f"{name}.lock", "a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    @writes
    def rewrite(self, name: str, column: str, plan: Callable[[list[TableFile]], Rewrite | None],
                txn: Txn) -> list[tuple[str, pa.Table]]:
        """Replace some of a table's files in one commit, without reading the others: ``plan``
        gets the table's files at its latest version (with the min and max of ``column``) and
        says which to remove and what to write instead. Returns the files written, each with its
        rows; none when ``txn`` was committed already or ``plan`` gives None."""
        path = self._require(name)
        if self.is_committed(name, txn):
            return []
        return self._retrying(f"rewrite of '{name}'", lambda: self._do_rewrite(path, column, plan, txn))

    def read_files(self, name: str, files: Sequence[TableFile]) -> pa.Table:
        """The rows of some of a table's files (:meth:`rewrite`), partition columns included."""
        table = self._latest(self._require(name), refresh=False)
        schema = pa.schema(table.schema().to_arrow())
        parts = [read_table_file(self.path(name), file, schema) for file in files]
        return pa.concat_tables(parts) if parts else schema.empty_table()

    def _do_rewrite(self, path: str, column: str, plan: Callable[[list[TableFile]], Rewrite | None],
                    txn: Txn) -> list[tuple[str, pa.Table]]:
        with self._locked(path):
            name = str(Path(path).relative_to(self.root))
            if self.is_committed(name, txn):
                return []
            planned = plan(self._files_of(path, column))
            if planned is None:
                return []
            table = self._latest(path, refresh=False)
            schema = pa.schema(table.schema().to_arrow())
            partition_by = table.metadata().partition_columns
            written = [self._write_file(path, part.cast(schema), partition_by)
                       for rows in planned.rows for part in _by_partition(rows.select(schema.names), partition_by)]
            if planned.removed or written:
                self._commit_files(path, txn, [action for action, _ in written], planned.removed)
            return [(action.path, rows) for action, rows in written]

    def _files_of(self, path: str, column: str) -> list[TableFile]:
        """The table's files at its latest version, with the min and max of ``column``: the
        handle's (read once per version) with this process's commits since applied."""
        own = self._own_since(path)
        table, since = own if own is not None else (self._latest(path), [])
        known = self._file_lists.get((path, column))
        if known is None or known[0] != table.version():
            known = (table.version(), table_files(table, column))
            self._file_lists[(path, column)] = known
        files = {file.path: file for file in known[1]}
        kind = pa.schema(table.schema().to_arrow()).field(column).type
        for commit in since:
            for removed in commit.removed:
                files.pop(removed, None)
            for add in commit.added:
                stats = json.loads(add.stats)
                files[add.path] = TableFile(add.path, dict(add.partition_values),
                                            _stat_value(stats.get("minValues", {}).get(column), kind),
                                            _stat_value(stats.get("maxValues", {}).get(column), kind))
        return list(files.values())

    @staticmethod
    def _write_file(path: str, rows: pa.Table, partition_by: list[str]) -> tuple[AddAction, pa.Table]:
        values = {name: rows.column(name)[0].as_py() for name in partition_by}
        folder = "/".join(f"{name}={NULL_PARTITION if value is None else value}" for name, value in values.items())
        relative = f"{folder}/part-{uuid.uuid4()}.snappy.parquet" if folder else f"part-{uuid.uuid4()}.snappy.parquet"
        final = Path(path) / relative
        final.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(rows.drop_columns(partition_by), final, compression="snappy")
        action = AddAction(
            path=relative, size=final.stat().st_size,
            partition_values={name: None if value is None else str(value) for name, value in values.items()},
            modification_time=int(time.time() * 1000), data_change=True,
            stats=file_stats(rows.drop_columns(partition_by)),
        )
        return action, rows

    def _do_read(self, path: str, version: int | None, timestamp: datetime | None) -> DataFrame:
        table = self._latest(path) if version is None and timestamp is None else DeltaTable(path)
        if version is not None:
            table.load_as_version(version)
        elif timestamp is not None:
            table.load_as_version(timestamp)
        schema = spark_schema_of(table)
        files = table.file_uris()
        if not files:
            return self.spark.createDataFrame([], schema)
        # Partition values live in the file paths; basePath lets Spark recover them.
        return self.spark.read.schema(schema).option("basePath", path).parquet(*files)

    def _do_read_latest(self, path: str, schema: StructType) -> DataFrame:
        from include.lakehouse.latest_source import LatestDeltaSource

        self.spark.dataSource.register(LatestDeltaSource)
        return self.spark.read.format(LatestDeltaSource.name()).schema(schema).option("path", path).load()

    def _do_history(self, path: str, limit: int | None) -> list[CommitInfo]:
        return [
            CommitInfo(
                version=entry["version"],
                timestamp=datetime.fromtimestamp(entry.get("timestamp", 0) / 1000, timezone.utc),
                operation=entry.get("operation", ""),
                parameters=entry.get("operationParameters", {}),
            )
            for entry in DeltaTable(path).history(limit)
        ]

    def _do_optimize(self, path: str, zorder_by: list[str]) -> dict[str, Any]:
        with self._locked(path):
            optimizer = DeltaTable(path).optimize
            if zorder_by:
                return optimizer.z_order(zorder_by)
            return optimizer.compact()

    def _do_vacuum(self, path: str, retention_hours: float) -> int:
        # full: also files no commit references (staged by a writer killed before its commit),
        # once older than the retention, like Spark's VACUUM.
        removed = DeltaTable(path).vacuum(
            retention_hours=int(retention_hours), dry_run=False,
            enforce_retention_duration=False, full=True,
        )
        return len(removed)

