"""The store of processes without a JVM: delta-rs reads every table and writes the small ops
tables no Spark job writes (:data:`include.tables.OPS_TABLES`), through its own commits."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import CommitProperties, DeltaTable, Field, write_deltalake
from deltalake.exceptions import CommitFailedError
from deltalake.transaction import Transaction

from include import tables
from include.lakehouse.base import CommitInfo, LakehouseError, LakehouseStore, TableFile, Txn

if TYPE_CHECKING:
    from pyspark.sql.types import StructField, StructType


def _commit_properties(txn: Txn | None) -> CommitProperties | None:
    if txn is None:
        return None
    return CommitProperties(app_transactions=[Transaction(txn.app_id, txn.version)])


def check_columns(table: str, expected: list[str], given: list[str]) -> None:
    """Rows to write must have exactly the table's columns (in any order)."""
    missing = [name for name in expected if name not in given]
    if missing:
        raise ValueError(f"columns {missing} of table {table} are missing from the data")
    extra = [name for name in given if name not in expected]
    if extra:
        raise ValueError(f"columns {extra} are not in the schema of table {table}")


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

    def _is_conflict(self, exc: Exception) -> bool:
        return isinstance(exc, CommitFailedError)

    def _open(self, path: str) -> DeltaTable:
        """The snapshot a commit builds on (a seam tests use to force concurrent commits)."""
        return self._latest(path)

    def _writable(self, path: str) -> None:
        """Each table has one writing engine: delta-rs writes the ops tables only."""
        name = str(Path(path).relative_to(self.root))
        if name not in tables.OPS_TABLES:
            raise LakehouseError(f"table '{name}' is written by Spark (delta-spark); delta-rs writes only "
                                 f"{', '.join(sorted(tables.OPS_TABLES))}")

    def _prepare(self, path: str, df: pa.Table) -> pa.Table:
        """Rows conformed to the table's column order, types and nullability."""
        self._writable(path)
        if not isinstance(df, pa.Table):
            raise TypeError(f"delta-rs writes Arrow rows, got {type(df).__name__}")
        if not self._is_table(path):
            return df.cast(pa.schema([field.with_nullable(True) for field in df.schema]))
        target = pa.schema(self._latest(path, refresh=False).schema().to_arrow())
        check_columns(path, target.names, df.schema.names)
        return df.select(target.names).cast(target)

    def _do_create(
        self, path: str, schema: StructType, partition_by: list[str], properties: dict[str, str]
    ) -> None:
        from pyspark.sql.pandas.types import to_arrow_schema

        self._writable(path)
        DeltaTable.create(path, to_arrow_schema(schema, timezone="UTC"), mode="ignore",
                          partition_by=partition_by or None, configuration=properties)

    def _do_set_properties(self, path: str, properties: dict[str, str]) -> None:
        self._writable(path)
        self._latest(path).alter.set_table_properties(properties)

    def _do_add_columns(self, path: str, fields: list[StructField]) -> None:
        self._writable(path)
        self._latest(path).alter.add_columns([Field.from_json(json.dumps(field.jsonValue())) for field in fields])

    def _do_append(self, path: str, data: pa.Table, txn: Txn | None) -> None:
        write_deltalake(self._open(path) if self._is_table(path) else path, data, mode="append",
                        commit_properties=_commit_properties(txn))

    def _do_merge(
        self, path: str, data: pa.Table, keys: list[str], txn: Txn | None, update_when: str | None,
        delete_when: str | None,
    ) -> None:
        predicate = " AND ".join(f"t.`{key}` = s.`{key}`" for key in keys)
        merger = self._open(path).merge(data, predicate, source_alias="s", target_alias="t",
                                          commit_properties=_commit_properties(txn))
        if delete_when:  # the first matching clause applies
            merger = merger.when_matched_delete(predicate=delete_when)
        if update_when != "false":
            merger = merger.when_matched_update_all(predicate=update_when)
        merger.when_not_matched_insert_all(predicate=f"NOT ({delete_when})" if delete_when else None).execute()

    def _do_replace(self, path: str, data: pa.Table, predicate: str, txn: Txn | None) -> None:
        write_deltalake(path, data, mode="overwrite", predicate=predicate, commit_properties=_commit_properties(txn))

    def _do_delete(self, path: str, predicate: str) -> None:
        self._writable(path)
        self._latest(path).delete(predicate)

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
        self._writable(path)
        optimizer = DeltaTable(path).optimize
        return optimizer.z_order(zorder_by) if zorder_by else optimizer.compact()

    def _do_vacuum(self, path: str, retention_hours: float) -> int:
        self._writable(path)
        # full: also files no commit references (staged by a writer killed before its commit),
        # once older than the retention, like Spark's VACUUM.
        removed = DeltaTable(path).vacuum(retention_hours=int(retention_hours), dry_run=False,
                                          enforce_retention_duration=False, full=True)
        return len(removed)
