"""The embedded default engine: Spark computes, delta-rs commits; data crosses through Arrow."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, QueryBuilder, write_deltalake
from deltalake.exceptions import CommitFailedError
from deltalake.transaction import Transaction

from include.lakehouse.base import CommitInfo, LakehouseStore, Txn

if TYPE_CHECKING:
    from pyspark.sql import DataFrame
    from pyspark.sql.types import StructType


def _commit_properties(txn: Txn | None) -> CommitProperties | None:
    if txn is None:
        return None
    return CommitProperties(app_transactions=[Transaction(txn.app_id, txn.version)])


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
        return DeltaTable(path)

    def _prepare(self, path: str, df: DataFrame | pa.Table) -> pa.Table:
        """Rows as Arrow, conformed to the table's column order, types and nullability."""
        data = df if isinstance(df, pa.Table) else df.toArrow()
        if not DeltaTable.is_deltatable(path):
            return data.cast(pa.schema([field.with_nullable(True) for field in data.schema]))
        target = pa.schema(DeltaTable(path).schema().to_arrow())
        missing = [name for name in target.names if name not in data.schema.names]
        if missing:
            raise ValueError(f"columns {missing} of table {path} are missing from the data")
        extra = [name for name in data.schema.names if name not in target.names]
        if extra:
            raise ValueError(f"columns {extra} are not in the schema of table {path}")
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

    def _do_append(self, path: str, data: pa.Table, txn: Txn | None) -> None:
        write_deltalake(
            path, data, mode="append",
            commit_properties=_commit_properties(txn),
        )

    def _do_merge(
        self, path: str, data: pa.Table, keys: list[str], txn: Txn | None, update_when: str | None
    ) -> None:
        predicate = " AND ".join(f"t.`{key}` = s.`{key}`" for key in keys)
        merger = self._open(path).merge(
            data, predicate, source_alias="s", target_alias="t", commit_properties=_commit_properties(txn)
        )
        if update_when != "false":
            merger = merger.when_matched_update_all(predicate=update_when)
        merger.when_not_matched_insert_all().execute()

    def _do_replace(self, path: str, data: pa.Table, predicate: str, txn: Txn | None) -> None:
        write_deltalake(
            path, data, mode="overwrite", predicate=predicate,
            commit_properties=_commit_properties(txn),
        )

    def _do_read(self, path: str, version: int | None, timestamp: datetime | None) -> DataFrame:
        table = DeltaTable(path)
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

    def _do_select(self, path: str, columns: list[str], where: str | None) -> pa.Table:
        table = DeltaTable(path)
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
        removed = DeltaTable(path).vacuum(
            retention_hours=int(retention_hours), dry_run=False,
            enforce_retention_duration=False,
        )
        return len(removed)

