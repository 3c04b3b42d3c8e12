"""Streaming Gold views: the shared view definitions applied to the watermarked feeds.

Ingest hands each topic's on-time, deduplicated events to ``feeds/<topic>/`` (one Parquet file
per micro-batch). These queries read them with Spark's stateful operators (window aggregation,
stream-stream join) and merge their output into the speed tables with ``(query, batch_id)``
transaction ids. Late events never reach a feed, so the Gold views drop exactly what
``late_events`` lists.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from include import tables
from include.config import Settings, spark_interval
from include.lakehouse import LakehouseStore, Txn
from include.views import first_payment, order_payments, revenue_by_category_5m
from speed_layer.ingest import feed_struct

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import DataStreamWriter

REVENUE_QUERY = "speed_revenue"
ORDER_PAYMENTS_QUERY = "speed_order_payments"
# A stored row is replaced by a paid row, or by an earlier payment of the same order.
ORDER_PAYMENTS_UPDATE = "t.status <> 'paid' OR (s.status = 'paid' AND s.pay_time < t.pay_time)"
FEED_FILES_PER_TRIGGER = 50


def ensure_gold_tables(store: LakehouseStore) -> None:
    store.ensure_table(tables.SPEED_REVENUE, tables.REVENUE_SCHEMA, ["date"])
    store.ensure_table(tables.SPEED_ORDER_PAYMENTS, tables.ORDER_PAYMENTS_SCHEMA, ["date"])


def feed_stream(spark: SparkSession, settings: Settings, topic: str) -> DataFrame:
    """A topic's feed as a watermarked stream."""
    folder = settings.feeds_dir / topic
    folder.mkdir(parents=True, exist_ok=True)
    return (
        spark.readStream.schema(feed_struct(topic))
        .option("maxFilesPerTrigger", FEED_FILES_PER_TRIGGER)
        .option("pathGlobFilter", "*.parquet")
        .parquet(str(folder))
        .withWatermark("event_time", spark_interval(settings.watermark_delay))
    )


class MergeBatch:
    """``foreachBatch``: upsert a micro-batch of view rows into a speed table, exactly once."""

    def __init__(self, store: LakehouseStore, table: str, query: str, keys: list[str], update_when: str | None = None, prepare=None, on_batch=None) -> None:  # noqa: ANN001
        self.store, self.table, self.query = store, table, query
        self.keys, self.update_when = keys, update_when
        self.prepare = prepare or (lambda batch: batch)
        self.on_batch = on_batch

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        rows = self.prepare(batch).toArrow()
        if rows.num_rows:
            self.store.merge(self.table, rows, self.keys, Txn(self.query, batch_id), self.update_when)
        if self.on_batch:
            self.on_batch(self.query, batch_id, rows)


def revenue_writer(spark: SparkSession, settings: Settings, store: LakehouseStore, on_batch=None) -> DataStreamWriter:  # noqa: ANN001
    view = revenue_by_category_5m(feed_stream(spark, settings, "orders"), exact=False)
    return (
        view.writeStream.queryName(REVENUE_QUERY)
        .outputMode("update")
        .foreachBatch(MergeBatch(store, tables.SPEED_REVENUE, REVENUE_QUERY, ["window_start", "category"], on_batch=on_batch))
    )


def order_payments_writer(spark: SparkSession, settings: Settings, store: LakehouseStore, on_batch=None) -> DataStreamWriter:  # noqa: ANN001
    view = order_payments(
        feed_stream(spark, settings, "orders"), feed_stream(spark, settings, "payments"), settings.join_window
    )
    return (
        view.writeStream.queryName(ORDER_PAYMENTS_QUERY)
        .outputMode("append")
        .foreachBatch(
            MergeBatch(
                store, tables.SPEED_ORDER_PAYMENTS, ORDER_PAYMENTS_QUERY, ["order_id"],
                update_when=ORDER_PAYMENTS_UPDATE, prepare=first_payment, on_batch=on_batch,
            )
        )
    )
