"""A Spark data source that reads a delta-rs table's latest version each time a plan runs it.

Spark's Parquet reader lists a table's files once, when the DataFrame is made, so a static
DataFrame over a table that keeps changing would stay at that version. This source opens the
table in ``read()``, on the executor, at every execution: in a stream-static join each
micro-batch sees the table as last committed (delta-spark's own Delta relation does the same).
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType


class LatestDeltaSource(DataSource):
    """``spark.read.format("lambdalake_latest_delta").schema(…).option("path", …).load()``"""

    @classmethod
    def name(cls) -> str:
        return "lambdalake_latest_delta"

    def schema(self) -> StructType:
        raise ValueError(f"{self.name()} needs the table's schema: .schema(…)")

    def reader(self, schema: StructType) -> DataSourceReader:
        return LatestDeltaReader(self.options["path"], schema)


class LatestDeltaReader(DataSourceReader):
    def __init__(self, path: str, schema: StructType) -> None:
        self.path, self.columns = path, schema.fieldNames()

    def partitions(self) -> list[InputPartition]:
        return [InputPartition(0)]  # a dimension: small enough for one task (it is broadcast)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        from deltalake import DeltaTable

        yield from DeltaTable(self.path).to_pyarrow_dataset().to_batches(columns=self.columns)
