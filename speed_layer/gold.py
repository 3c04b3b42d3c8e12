"""The Gold views with a query of their own: those that look up a dimension, and those whose
state Spark's stateful operators keep.

Every other view is computed by ingest in its own micro-batch (:mod:`speed_layer.view_pass`).
These read their input topics' fed events from ``feeds/<topic>/`` (ingest writes one Parquet file
per micro-batch, on-time events only, so a view leaves out exactly what ``late_events`` lists) and
append their rows with the transaction id ``(query, batch_id)``; readers merge a key's rows
(:func:`include.registry.speed_rows_sql`).

- A view that looks a dimension up joins the dimension's speed table as it stands at each
  micro-batch and runs its definition on the micro-batch alone (:class:`CombineBatch`): no
  streaming state.
- A view with ``Speed.stateful_query`` runs its definition on the watermarked feeds as a
  streaming query (``order_payments``: a left-outer stream-stream join whose open orders and
  waiting payments are in the state store, in the query's checkpoint) and appends what each
  micro-batch emits (:class:`AppendBatch`).
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING

from include import tables
from include.config import Settings, spark_interval
from include.lakehouse import LakehouseStore, Txn
from include.registry import ViewContext, ViewSpec
from include.schemas import TOPICS
from include.views import VIEWS_BY_NAME, speed_trigger_intervals, speed_views
from speed_layer.ingest import feed_schema, record_column

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import DataStreamWriter

FEED_FILES_PER_TRIGGER = 50


def feed_stream(spark: SparkSession, settings: Settings, topic: str, watermarked: bool = False) -> DataFrame:
    """A topic's fed events as a stream of its typed fields, event time and arrival time;
    ``watermarked`` on event time by the stream's delay for a query that keeps state (ingest left
    the late events out already, so nothing else needs one)."""
    folder = settings.feeds_dir / topic
    folder.mkdir(parents=True, exist_ok=True)
    fields = TOPICS[topic].schema.fieldNames()
    extra = [] if "event_time" in fields else ["event_time"]
    stream = (
        spark.readStream.schema(feed_schema())
        .option("maxFilesPerTrigger", FEED_FILES_PER_TRIGGER)
        .option("pathGlobFilter", "*.parquet")
        .parquet(str(folder))
        .select(f"{record_column(topic)}.*", *extra, "arrived_at")
    )
    return stream.withWatermark("event_time", spark_interval(settings.watermark_delay)) if watermarked else stream


class CombineBatch:
    """``foreachBatch`` of a view without streaming state (partials merged when read): the
    definition on this micro-batch alone, appended exactly once. Readers add up a key's rows
    (:func:`include.registry.speed_rows_sql`), so a micro-batch costs its own rows, not the window's."""

    def __init__(self, store: LakehouseStore, view: ViewSpec, settings: Settings) -> None:
        self.store, self.view, self.settings, self.query = store, view, settings, view.speed_query

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        view, txn = self.view, Txn(self.query, batch_id)
        if self.store.is_committed(view.speed_table, txn):
            return
        lookups = {name: self.store.read(VIEWS_BY_NAME[name].speed_table) for name in view.lookups}
        inputs = {view.inputs[0]: batch, **lookups}
        rows = view(inputs, ViewContext(self.settings, exact=False)).select(*view.speed_schema.fieldNames())
        self.store.append(view.speed_table, rows, txn)


class AppendBatch:
    """``foreachBatch`` of a stateful query: the rows its micro-batch emitted, appended exactly once."""

    def __init__(self, store: LakehouseStore, view: ViewSpec) -> None:
        self.store, self.view = store, view

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        self.store.append(self.view.speed_table, batch, Txn(self.view.speed_query, batch_id))  # a replay: skipped


def view_writer(spark: SparkSession, settings: Settings, store: LakehouseStore, view: ViewSpec) -> DataStreamWriter:
    store.ensure_table(view.speed_table, view.speed_schema, ["date"], tables.STREAM_TABLE_PROPERTIES)
    if view.speed.stateful_query:
        inputs = {topic: feed_stream(spark, settings, topic, watermarked=True) for topic in view.inputs}
        rows = view(inputs, ViewContext(settings, exact=False)).select(*view.speed_schema.fieldNames())
        return rows.writeStream.queryName(view.speed_query).outputMode("append").foreachBatch(AppendBatch(store, view))
    for dimension in (VIEWS_BY_NAME[name] for name in view.lookups):
        store.ensure_table(dimension.speed_table, dimension.schema, ["date"], tables.STREAM_TABLE_PROPERTIES)
    (topic,) = view.inputs
    feed = feed_stream(spark, settings, topic)
    return feed.writeStream.queryName(view.speed_query).foreachBatch(CombineBatch(store, view, settings))


def runs_no_data_batches(query: str) -> bool:
    """Whether ``query`` should run Spark's no-data micro-batches (run when the watermark moved
    and no new data came): Bronze and ingest do (the dedup's state store drops expired ids in
    them), and a stateful query (its left-outer join emits an order whose window the watermark
    closed); a query without state would spend a micro-batch for nothing."""
    return not any(view.speed_query == query for view in VIEWS_BY_NAME.values()
                   if not view.in_ingest_pass and not view.speed.stateful_query)


def trigger_intervals(settings: Settings) -> dict[str, timedelta]:
    """Each Gold query's micro-batch interval when the stream runs continuously."""
    views = [VIEWS_BY_NAME[name] for name in speed_trigger_intervals(settings)]
    return {view.speed_query: speed_trigger_intervals(settings)[view.name] for view in views
            if not view.in_ingest_pass}


def gold_writers(spark: SparkSession, settings: Settings, store: LakehouseStore) -> dict[str, DataStreamWriter]:
    """A streaming query per view the speed layer maintains outside ingest's pass, by query name
    (``--available-now`` runs them once ingest is done: the dimensions are in ingest's pass, so a
    backlog's orders are enriched with every change landed before them)."""
    return {view.speed_query: view_writer(spark, settings, store, view)
            for view in speed_views(settings) if not view.in_ingest_pass}


__all__ = ["gold_writers", "runs_no_data_batches", "trigger_intervals"]
