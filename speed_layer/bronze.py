"""The Bronze query: every landed line, byte for byte, into ``bronze/<topic>``.

Bronze is the master dataset the batch layer rebuilds from, so it takes every line: valid,
corrupt or duplicate. Its own streaming query (the ingest query removes duplicates before it
writes). Spark's executors write the files; the driver commits each topic's file list with the
transaction id ``(speed_bronze, batch_id)``, so a micro-batch replayed after a crash commits
nothing twice.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING

import pyarrow as pa

from include import tables
from include.lakehouse import LakehouseStore, Txn
from include.parsing import bronze_event_date
from include.spark import with_batch_values

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

QUERY = "speed_bronze"
# Bronze's micro-batch interval in the continuous stream unless configured (or the trigger
# interval, if longer): no speed view waits for Bronze, and its micro-batch costs about the same
# whatever its size, so a longer one leaves the cores to ingest and the views.
DEFAULT_TRIGGER = timedelta(seconds=10)


def with_event_date(raw: dict[str, DataFrame]) -> DataFrame:
    """The raw streams of all topics as one, each line with its event date."""
    streams = [stream.withColumn("event_date", bronze_event_date(topic)) for topic, stream in raw.items()]
    union = streams[0]
    for stream in streams[1:]:
        union = union.unionByName(stream)
    return union


class BronzeBatch:
    """The ``foreachBatch`` function of the Bronze query."""

    def __init__(self, store: LakehouseStore, topics: tuple[str, ...]) -> None:
        self.store, self.topics = store, topics
        for topic in topics:
            store.ensure_table(tables.bronze(topic), tables.BRONZE_SCHEMA, tables.BRONZE_PARTITIONS,
                               tables.STREAM_TABLE_PROPERTIES)
        store.ensure_table(tables.INGEST_BATCHES, tables.INGEST_BATCHES_SCHEMA, (), tables.STREAM_TABLE_PROPERTIES)

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        txn = Txn(QUERY, batch_id)
        if self.store.is_committed(tables.INGEST_BATCHES, txn):  # a replay of a finished batch
            return
        now = datetime.now(timezone.utc)
        values = pa.table({"ingested_at": pa.array([now], pa.timestamp("us", "UTC")),
                           "batch_id": pa.array([batch_id], pa.int64())})
        lines = with_batch_values(batch, values)
        appended = self.store.append_split(lines, "topic", {topic: tables.bronze(topic) for topic in self.topics}, txn)
        if None in appended.values():  # some topics were committed before a crash: count them again
            appended = {tables.bronze(row["topic"]): row["count"] for row in lines.groupBy("topic").count().collect()}
        accounting = [
            {"query": QUERY, "batch_id": batch_id, "topic": topic, "bronze_rows": appended.get(tables.bronze(topic), 0),
             "processed_at": now}
            for topic in self.topics if appended.get(tables.bronze(topic))
        ]
        if accounting:  # last: the row says every Bronze write of the batch is committed
            self.store.append(
                tables.INGEST_BATCHES,
                pa.Table.from_pylist(accounting, schema=tables.arrow_schema(tables.INGEST_BATCHES_FIELDS)),
                txn,
            )
