"""The embedded default engine: Spark computes, delta-rs commits; data crosses through Arrow."""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from functools import partial
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import CommitProperties, DeltaTable, Field, QueryBuilder, write_deltalake
from deltalake.exceptions import CommitFailedError
from deltalake.transaction import AddAction, Transaction

from include.lakehouse.base import CommitInfo, LakehouseStore, Txn, writes

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


def spark_schema_of(table: DeltaTable) -> StructType:
    from pyspark.sql.pandas.types import from_arrow_schema

    arrow_schema = pa.schema(table.schema().to_arrow())
    return from_arrow_schema(arrow_schema, prefer_timestamp_ntz=False)


class DeltaRsStore(LakehouseStore):
    engine = "delta-rs"

    def _is_conflict(self, exc: Exception) -> bool:
        return isinstance(exc, CommitFailedError)

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
                self._open(path).create_write_transaction(
                    data.actions, "append", data.schema, partition_by=data.partition_by or None,
                    commit_properties=_commit_properties(txn),
                )
            return
        write_deltalake(
            self._open(path) if self._is_table(path) else path, data, mode="append",
            commit_properties=_commit_properties(txn),
        )

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
        write_deltalake(
            path, data, mode="overwrite", predicate=predicate,
            commit_properties=_commit_properties(txn),
        )

    def _do_delete(self, path: str, predicate: str) -> None:
        self._open(path).delete(predicate)

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

    def _do_select(self, path: str, columns: list[str], where: str | None) -> pa.Table:
        table = self._latest(path)
        quoted = ", ".join(f'"{column}"' for column in columns)
        sql = f"SELECT {quoted} FROM t" + (f" WHERE {where}" if where else "")
        result = pa.RecordBatchReader.from_stream(QueryBuilder().register("t", table).execute(sql)).read_all()
        # DataFusion answers with view types (string_view); give callers the table's own types.
        schema = pa.schema(table.schema().to_arrow())
        return result.cast(pa.schema([schema.field(column) for column in columns]))

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

