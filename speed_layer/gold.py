"""Streaming Gold views: every view of the registry applied to the watermarked feeds.

Ingest hands each topic's on-time, deduplicated events to ``feeds/<topic>/`` (one Parquet file
per micro-batch). One streaming query per view reads its input topics from there with Spark's
stateful operators (window aggregation, stream-stream join, …) and merges its output into the
view's speed table with ``(query, batch_id)`` transaction ids. Late events never reach a fact
view's feed, so those views drop exactly what ``late_events`` lists; a dimension gets its late
changes too. A view that looks up a dimension joins the dimension's speed table as it stands
at each micro-batch. Views whose rows add up (``partials``) need no query of their own: ingest
computes them in its micro-batch (:mod:`speed_layer.view_pass`), except one that looks up a
dimension, whose query runs the definition on each micro-batch alone and appends the partial rows,
which readers merge per key (:class:`CombineBatch`).
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
from speed_layer.view_pass import merge_speed_rows

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import DataStreamWriter

FEED_FILES_PER_TRIGGER = 50


def feed_stream(spark: SparkSession, settings: Settings, topic: str, watermarked: bool = True) -> DataFrame:
    """A topic's fed events as a stream of its typed fields, event time and arrival time,
    watermarked on event time unless a dimension reads it (a dimension keeps state per key,
    and its late changes must count)."""
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


class MergeBatch:
    """``foreachBatch``: upsert a micro-batch of a view's rows into its speed table, exactly once;
    rows with new keys are first announced (alerts to the notifier)."""

    def __init__(self, store: LakehouseStore, view: ViewSpec, settings: Settings) -> None:
        self.store, self.view, self.settings, self.query = store, view, settings, view.speed_query

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        merge_speed_rows(self.store, self.view, self.settings, batch, Txn(self.query, batch_id))


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


def view_writer(spark: SparkSession, settings: Settings, store: LakehouseStore, view: ViewSpec) -> DataStreamWriter:
    store.ensure_table(view.speed_table, view.speed_schema, ["date"], tables.STREAM_TABLE_PROPERTIES)
    dimensions = [VIEWS_BY_NAME[name] for name in view.lookups]
    for dimension in dimensions:
        store.ensure_table(dimension.speed_table, dimension.schema, ["date"], tables.STREAM_TABLE_PROPERTIES)
    if view.speed.partials and view.speed.partials.merged == "read":  # no state, so no watermark: ingest left
        # the late events out already
        (topic,) = view.inputs
        feed = feed_stream(spark, settings, topic, watermarked=False)
        return feed.writeStream.queryName(view.speed_query).foreachBatch(CombineBatch(store, view, settings))
    inputs = {topic: feed_stream(spark, settings, topic, watermarked=view.kind == "fact") for topic in view.inputs}
    inputs |= {dimension.name: store.read_latest(dimension.speed_table) for dimension in dimensions}
    rows = view(inputs, ViewContext(settings, exact=False)).select(*view.speed_schema.fieldNames())
    return (rows.writeStream.queryName(view.speed_query).outputMode(view.speed.mode)
            .foreachBatch(MergeBatch(store, view, settings)))


def runs_no_data_batches(query: str) -> bool:
    """Whether ``query`` should run Spark's no-data micro-batches (run when the watermark moved
    and no new data came). An append-mode view emits rows as the watermark passes them (an
    order whose payment can no longer come): it needs them, or an ``--available-now`` run would
    end before its last rows come out. An update-mode view has emitted every row with the data
    that changed it; there a no-data batch would only drop expired state, at a whole
    micro-batch's cost, which its next data batch does anyway."""
    view = next((view for view in VIEWS_BY_NAME.values() if view.speed_query == query), None)
    return view is None or view.speed.mode == "append"


def trigger_intervals(settings: Settings) -> dict[str, timedelta]:
    """Each Gold query's micro-batch interval when the stream runs continuously."""
    views = [VIEWS_BY_NAME[name] for name in speed_trigger_intervals(settings)]
    return {view.speed_query: speed_trigger_intervals(settings)[view.name] for view in views
            if not view.in_ingest_pass}


def gold_writers(spark: SparkSession, settings: Settings, store: LakehouseStore) -> list[dict[str, DataStreamWriter]]:
    """A streaming query per view the speed layer maintains, by query name, in two phases: the
    dimensions, then the views that may look them up (``--available-now`` runs the phases one
    after the other, so a backlog's orders are enriched with every change landed before them)."""
    views = [view for view in speed_views(settings) if not view.in_ingest_pass]
    return [
        {view.speed_query: view_writer(spark, settings, store, view) for view in views if view.kind == kind}
        for kind in ("dimension", "fact")
    ]


__all__ = ["gold_writers", "runs_no_data_batches", "trigger_intervals"]
