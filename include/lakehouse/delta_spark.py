"""Delta Lake's own Spark integration: every table a Spark job writes, on every master."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from include.lakehouse.base import CommitInfo, LakehouseStore, Txn, writes

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructField, StructType

# Session settings Delta reads to record a txn on MERGE and other non-DataFrameWriter writes.
TXN_APP_ID_CONF = "spark.databricks.delta.write.txnAppId"
TXN_VERSION_CONF = "spark.databricks.delta.write.txnVersion"


def _session_with_txn(base: SparkSession, txn: Txn) -> SparkSession:
    """A session of its own carrying ``txn`` for one MERGE. Set on a shared session, the txn
    would be read by every write other threads make meanwhile (ingest writes tables in
    parallel): one thread's cleanup left another's MERGE half a txn, and a write without a txn
    could record, or be skipped as, someone else's."""
    session = base.newSession()  # same SparkContext and cache, its own settings
    for key, value in base.conf.getAll.items():
        if base.conf.isModifiable(key):
            session.conf.set(key, value)
    session.conf.set(TXN_APP_ID_CONF, txn.app_id)
    session.conf.set(TXN_VERSION_CONF, str(txn.version))
    return session


class DeltaSparkStore(LakehouseStore):
    engine = "delta-spark"

    def __init__(self, spark: SparkSession | Callable[[], SparkSession], root: Path | str, **options: Any) -> None:
        super().__init__(root, **options)
        self._spark = spark  # or a factory: commands that never need Spark never start it

    @property
    def spark(self) -> SparkSession:
        if callable(self._spark):
            self._spark = self._spark()
        return self._spark

    @writes
    def append_split(
        self, df: DataFrame, column: str, tables: Mapping[Any, str], txn: Txn | None = None
    ) -> dict[str, int | None]:
        """Append each value's rows of ``column`` to its table (``tables``: value -> table name,
        all with the same schema), without ``column``. Returns the rows appended per table, None
        where ``txn`` was already committed."""
        from pyspark.sql import functions as F

        appended: dict[str, int | None] = {}
        for value, name in tables.items():
            if self.is_committed(name, txn):
                appended[name] = None
                continue
            rows = df.where(F.col(column) == value).drop(column)
            count = rows.count()  # no rows: nothing to commit
            appended[name] = count if count == 0 or self.append(name, rows, txn) else None
        return appended

    def read(
        self, name: str, version: int | None = None, timestamp: datetime | str | None = None,
        session: SparkSession | None = None,
    ) -> DataFrame:
        """The table as a Spark DataFrame: latest, or as of a version or a timestamp. ``session``:
        another than the store's (a streaming micro-batch's, to join its frames)."""
        if version is not None and timestamp is not None:
            raise ValueError("read takes a version or a timestamp, not both")
        if version is not None and version < 0:
            raise ValueError(f"version must be >= 0, got {version}")
        if isinstance(timestamp, str):
            timestamp = datetime.fromisoformat(timestamp.replace("Z", "+00:00"))
        if timestamp is not None and timestamp.tzinfo is None:
            raise ValueError(f"timestamp must carry a time zone, got '{timestamp.isoformat()}'")
        return self._do_read(self._require(name), version, timestamp, session)

    def read_latest(self, name: str) -> DataFrame:
        """The table as a DataFrame that reads its latest version each time it runs: the static
        side of a stream-static join follows the table while the stream runs (a Delta relation
        resolves the table's snapshot each time a plan runs it)."""
        return self.spark.read.format("delta").load(self._require(name))

    def _table(self, path: str, session: SparkSession | None = None):  # noqa: ANN202 - delta.tables needs the jars
        from delta.tables import DeltaTable as SparkDeltaTable

        return SparkDeltaTable.forPath(session or self.spark, path)

    def _is_conflict(self, exc: Exception) -> bool:
        from delta import exceptions

        # Each of Delta's concurrency errors is its own class (none derives from another).
        return isinstance(exc, tuple(getattr(exceptions, name) for name in exceptions.__all__))

    def _prepare(self, path: str, df: DataFrame | pa.Table) -> DataFrame:
        if isinstance(df, pa.Table):
            return self.spark.createDataFrame(df)
        return df

    def _writer(self, df: DataFrame, txn: Txn | None):  # noqa: ANN202
        writer = df.write.format("delta")
        if txn is not None:
            writer = writer.option("txnAppId", txn.app_id).option("txnVersion", str(txn.version))
        return writer

    def _do_create(
        self, path: str, schema: StructType, partition_by: list[str], properties: dict[str, str]
    ) -> None:
        from delta.tables import DeltaTable as SparkDeltaTable

        builder = SparkDeltaTable.createIfNotExists(self.spark).location(path).addColumns(schema)
        if partition_by:
            builder = builder.partitionedBy(*partition_by)
        for key, value in properties.items():
            builder = builder.property(key, value)
        builder.execute()

    def _do_set_properties(self, path: str, properties: dict[str, str]) -> None:
        listed = ", ".join(f"'{key}' = '{value}'" for key, value in properties.items())
        self.spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ({listed})")

    def _do_add_columns(self, path: str, fields: list[StructField]) -> None:
        listed = ", ".join(f"`{field.name}` {field.dataType.simpleString()}" for field in fields)
        self.spark.sql(f"ALTER TABLE delta.`{path}` ADD COLUMNS ({listed})")

    def _do_append(self, path: str, data: DataFrame, txn: Txn | None) -> None:
        self._writer(data, txn).mode("append").save(path)

    def _do_merge(
        self, path: str, data: DataFrame, keys: list[str], txn: Txn | None, update_when: str | None,
        delete_when: str | None,
    ) -> None:
        condition = " AND ".join(f"t.`{key}` = s.`{key}`" for key in keys)
        session = _session_with_txn(data.sparkSession, txn) if txn is not None else None
        merger = self._table(path, session).alias("t").merge(data.alias("s"), condition)
        if delete_when:  # the first matching clause applies
            merger = merger.whenMatchedDelete(condition=delete_when)
        if update_when != "false":
            merger = merger.whenMatchedUpdateAll(condition=update_when)
        merger.whenNotMatchedInsertAll(condition=f"NOT ({delete_when})" if delete_when else None).execute()

    def _do_replace(self, path: str, data: DataFrame, predicate: str, txn: Txn | None) -> None:
        self._writer(data, txn).mode("overwrite").option("replaceWhere", predicate).save(path)

    def _do_delete(self, path: str, predicate: str) -> None:
        self._table(path).delete(predicate)

    def _do_read(self, path: str, version: int | None, timestamp: datetime | None,
                 session: SparkSession | None = None) -> DataFrame:
        reader = (session or self.spark).read.format("delta")
        if version is not None:
            reader = reader.option("versionAsOf", version)
        elif timestamp is not None:
            utc = timestamp.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")
            reader = reader.option("timestampAsOf", utc)
        return reader.load(path)

    def _do_history(self, path: str, limit: int | None) -> list[CommitInfo]:
        history = self._table(path).history(limit) if limit else self._table(path).history()
        return [
            CommitInfo(
                version=row["version"],
                timestamp=row["timestamp"].replace(tzinfo=timezone.utc),
                operation=row["operation"],
                parameters=dict(row["operationParameters"] or {}),
            )
            for row in history.collect()
        ]

    def _do_optimize(self, path: str, zorder_by: list[str]) -> dict[str, Any]:
        optimizer = self._table(path).optimize()
        result = optimizer.executeZOrderBy(*zorder_by) if zorder_by else optimizer.executeCompaction()
        metrics = result.collect()[0]["metrics"]
        return metrics.asDict(recursive=True)

    def _do_vacuum(self, path: str, retention_hours: float) -> int:
        before = self._file_count(path)
        self.spark.conf.set("spark.databricks.delta.retentionDurationCheck.enabled", "false")
        self._table(path).vacuum(retention_hours)
        return before - self._file_count(path)

    @staticmethod
    def _file_count(path: str) -> int:
        from pathlib import Path

        return sum(1 for _ in Path(path).rglob("*.parquet"))
