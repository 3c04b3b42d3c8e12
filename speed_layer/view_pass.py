"""The views ingest computes itself, in the micro-batch it already holds (the one-pass speed layer).

A view whose rows add up (:class:`include.registry.Partials`) needs no streaming query: the
definition runs on the micro-batch's on-time events alone, and its partial rows are merged into
the speed table (``merged="write"``: with the stored rows of the keys they touch) or appended
(``merged="read"``). A view whose state is more than that says how to keep it from one
micro-batch (``incremental``: ``user_sessions`` merges the micro-batch's clicks into the stored
sessions they touch); its rows are merged by the view's precedence (a view whose state Spark's
stateful operators keep has a query of its own instead: :mod:`speed_layer.gold`). Every step is Spark
DataFrames of the micro-batch's session; what a view keeps from one micro-batch to the next is
its speed table and Silver, which Spark reads back as the micro-batch found them.

Every write carries ingest's transaction id ``(speed_ingest, batch_id)``. A replayed micro-batch
holds the same events and watermarks, and reads tables whose commits of that id it skips, so it
computes the same rows and merges nothing twice.

A view on an interval of its own (:attr:`include.registry.ViewSpec.runs_on_interval`, when the
stream runs continuously) runs once its interval has passed, on the events of the micro-batches
since it last ran (from Silver) and of the one it runs in, with the transaction id of that one.
The last one its table committed says where its events start.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from functools import partial
from typing import TYPE_CHECKING

from pyspark.sql import functions as F

from include import tables
from include.config import Settings
from include.lakehouse import LakehouseStore, Txn
from include.registry import (
    Lookback, ViewContext, ViewSpec, best_per_key, column_names, input_topics, merged_partials, replaces_sql, sql_time,
    state_topics,
)
from include.views import VIEWS
from include.views.sql import spark_rows

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

# Topics a dimension reads: their late events count too (include.registry.state_topics).
STATE_TOPICS = state_topics(VIEWS)


@dataclass
class MicroBatch:
    """What the pass needs of one ingest micro-batch."""

    spark: SparkSession  # the micro-batch's session
    txn: Txn
    at: datetime  # the micro-batch's time (its events' ingested_at)
    fed: set[str]  # topics with on-time events
    events: Callable[[str], DataFrame]  # a topic's on-time events (typed fields, event_time, arrived_at, ingested_at)
    watermarks: Mapping[str, datetime | None]  # at arrival
    watermarks_after: Mapping[str, datetime | None]  # with this micro-batch's events counted


@dataclass
class Step:
    """:class:`include.registry.PassStep` for one view and micro-batch. ``since``: the view last
    ran on that micro-batch, and its events are those of the micro-batches after it (None: of
    this one only)."""

    settings: Settings
    store: LakehouseStore
    batch: MicroBatch
    since: int | None = None

    def events(self, topic: str) -> DataFrame:
        fresh = self.batch.events(topic)
        if self.since is None or self.since >= self.batch.txn.version - 1:
            return fresh
        return self.earlier(topic, f"batch_id > {self.since}").unionByName(fresh)

    def watermark(self, topic: str, after: bool = False) -> datetime | None:
        return (self.batch.watermarks_after if after else self.batch.watermarks).get(topic)

    def stored(self, table: str) -> DataFrame:
        return self.store.read(table, session=self.batch.spark)

    def earlier(self, topic: str, where: str) -> DataFrame:
        return read_silver(self.store, self.batch.spark, topic, self.batch.events(topic).columns,
                           f"batch_id < {self.batch.txn.version} AND ({where})")

    def lookback(self, lookback: Lookback) -> DataFrame:
        """The window of :attr:`Lookback.window` over the micro-batch's events and the entity's
        earlier ones within the span before the watermark (no on-time event looks back further)."""
        fresh = self.batch.events(lookback.topic)
        watermark = self.watermark(lookback.topic)
        since = f"event_time > {sql_time(watermark - lookback.span)}" if watermark else "true"
        earlier = self.earlier(lookback.topic, since).join(
            fresh.select(lookback.entity).distinct(), lookback.entity, "left_semi")
        both = earlier.withColumn("_fresh", F.lit(False)).unionByName(fresh.withColumn("_fresh", F.lit(True)))
        return self.query(f"""
            SELECT * EXCEPT (_fresh, _value) FROM (
                SELECT *, CAST(count(_value) OVER span AS DECIMAL(38,0)) AS lookback_count,
                       sum(_value) OVER span AS lookback_sum, sum(_value * _value) OVER span AS lookback_squares
                FROM (SELECT *, {lookback.value} AS _value FROM {{events}})
                WINDOW span AS ({lookback.window}))
            WHERE _fresh""", {"events": both})

    def query(self, sql: str, frames: Mapping[str, DataFrame]) -> DataFrame:
        return spark_rows(sql, frames)


@dataclass
class Waiting:
    """A view that may run on several micro-batches at once. ``interval``: how often it runs
    (zero: with every micro-batch, once caught up)."""

    interval: timedelta
    since: int | None = None  # the micro-batch it last ran on
    through: int | None = None  # the last micro-batch seen since (None: none in this process)
    fed: bool = True  # whether a micro-batch since fed the view's topics
    ran_at: datetime | None = None  # the time of the micro-batch it last ran in (None: not in this process)


class ViewPass:
    """The speed rows of ``views`` from one micro-batch: :meth:`writes` gives one function per
    view, for ingest to run beside its own writes. ``intervals``: how often each view runs when
    the stream runs continuously (:func:`include.views.speed_trigger_intervals`); a view that may
    run on several micro-batches runs less often when its interval is longer than the trigger's."""

    def __init__(self, settings: Settings, store: LakehouseStore, views: list[ViewSpec],
                 intervals: Mapping[str, timedelta] | None = None) -> None:
        self.settings, self.store = settings, store
        self.computed = [view for view in views if view.in_ingest_pass]
        # Every view that may run on several micro-batches: one that ran on an interval before
        # (another process, other settings) first catches up on the micro-batches since its last run.
        trigger = settings.trigger_interval
        spaced = {name: interval for name, interval in (intervals or {}).items() if interval > trigger}
        self.waiting = {view.name: Waiting(spaced.get(view.name, timedelta(0))) for view in self.computed
                        if view.runs_on_interval}
        for view in self.computed:
            store.ensure_table(view.speed_table, view.speed_schema, ["date"], tables.STREAM_TABLE_PROPERTIES)
        for topic in input_topics(self.computed):  # read back by the steps, even where ingest reads no such topic
            store.ensure_table(tables.silver(topic), tables.silver_schema(topic), tables.SILVER_PARTITIONS,
                               tables.STREAM_TABLE_PROPERTIES)

    def writes(self, batch: MicroBatch) -> dict[str, Callable[[], None]]:
        """A function per view the micro-batch feeds, by speed table (a view reading none of its
        topics is left out)."""
        writes = {}
        for view in self.computed:
            step = Step(self.settings, self.store, batch)
            if view.name in self.waiting:
                step = self._due(view, batch)
                if step is None:
                    continue
            elif not batch.fed.intersection(view.inputs):
                continue
            if view.speed.incremental:
                writes[view.speed_table] = partial(self._keep, view, step)
            else:
                writes[view.speed_table] = partial(self._add_partials, view,
                                                   {topic: step.events(topic) for topic in view.inputs}, batch.txn)
        return writes

    def _due(self, view: ViewSpec, batch: MicroBatch) -> Step | None:
        """For a view that may run on several micro-batches: a step on the events since it last
        ran (in a new process or a replay, since its table's last run) once its interval has
        passed since it last ran (at once in a new process) and a micro-batch fed it, else None."""
        waiting, batch_id = self.waiting[view.name], batch.txn.version
        if waiting.through != batch_id - 1:  # a new process, or a replay: from the table's last run
            committed = self.store.txn_version(view.speed_table, batch.txn.app_id)
            if committed is not None and committed >= batch_id:
                return None
            waiting.since = batch_id - 1 if committed is None else committed
            waiting.fed, waiting.ran_at = committed is not None and committed < batch_id - 1, None
        waiting.through = batch_id
        waiting.fed = waiting.fed or bool(batch.fed.intersection(view.inputs))
        if not waiting.fed or (waiting.ran_at is not None and batch.at - waiting.ran_at < waiting.interval):
            return None
        step = Step(self.settings, self.store, batch, since=waiting.since)
        waiting.since, waiting.fed, waiting.ran_at = batch_id, False, batch.at
        return step

    def _add_partials(self, view: ViewSpec, inputs: dict[str, DataFrame], txn: Txn) -> None:
        store, columns = self.store, column_names(view.speed_fields)
        if store.is_committed(view.speed_table, txn):
            return
        computed = view(inputs, ViewContext(self.settings, exact=False)).select(*columns)
        if view.speed.partials.merged == "read":
            store.append(view.speed_table, computed, txn)
            return
        rows = computed.persist()  # computed once: its bounds, then the merge's two reads
        try:
            touched = self._touched(view, rows)
            if touched is None:
                return
            stored = store.read(view.speed_table, session=rows.sparkSession).where(touched)
            stored = stored.join(rows.select(*view.keys), list(view.keys), "left_semi").select(*columns)
            store.merge(view.speed_table, merged_partials(view, rows.unionByName(stored)), view.merge_on, txn)
        finally:
            rows.unpersist()

    @staticmethod
    def _touched(view: ViewSpec, rows: DataFrame) -> str | None:
        """SQL selecting the stored rows that may share a key with ``rows`` (None: no rows):
        within their days and range of key time, so that the table's file statistics skip the
        rest (a dimension's key may be of any day: all of them)."""
        if view.kind == "dimension":
            return None if rows.isEmpty() else "true"
        bounds = rows.agg(F.min(view.key_time).alias("low"), F.max(view.key_time).alias("high"),
                          F.collect_set("date").alias("days")).first()
        if bounds["low"] is None:
            return None
        days = ", ".join(f"DATE'{day.isoformat()}'" for day in bounds["days"])
        low, high = (sql_time(bounds[end].replace(tzinfo=timezone.utc)) for end in ("low", "high"))
        return f"date IN ({days}) AND {view.key_time} >= {low} AND {view.key_time} <= {high}"

    def _keep(self, view: ViewSpec, step: Step) -> None:
        if self.store.is_committed(view.speed_table, step.batch.txn):
            return
        rows = view.speed.incremental(step)
        if rows is not None:
            rows = rows.select(*column_names(view.speed_fields))
            merge_speed_rows(self.store, view, self.settings, rows, step.batch.txn)


def read_silver(store: LakehouseStore, spark: SparkSession, topic: str, columns: list[str], where: str) -> DataFrame:
    """The ``columns`` of the topic's Silver rows matching SQL ``where`` as the pass gave them to
    the views (on-time ones only, unless a dimension reads the topic), read by Spark."""
    late = "" if topic in STATE_TOPICS else " AND NOT is_late"
    return store.read(tables.silver(topic), session=spark).where(f"({where}){late}").select(*columns)


def merge_speed_rows(store: LakehouseStore, view: ViewSpec, settings: Settings, rows: DataFrame, txn: Txn) -> None:
    """Upsert rows of a view into its speed table, exactly once: several rows of a key and the
    stored one by the view's precedence; rows with new keys first announced (alerts to the
    notifier)."""
    if view.speed.precedence is not None:
        rows = best_per_key(rows, view.keys, view.speed.precedence)
    update_when = replaces_sql(view.speed.precedence) if view.speed.precedence else None
    # Computed once: a MERGE reads its source twice (the files it touches, then the rows it writes).
    rows = rows.persist()
    try:
        # No rows (alerts, most micro-batches): no MERGE and no new version for the next micro-batch
        # to read; a replay finds none again.
        if rows.isEmpty():
            return
        if view.speed.announce is not None and not store.is_committed(view.speed_table, txn):
            announce_new(store, view, settings, rows, txn)
        store.merge(view.speed_table, rows, view.merge_on, txn, update_when, delete_when=view.speed.tombstone)
    finally:
        rows.unpersist()


def announce_new(store: LakehouseStore, view: ViewSpec, settings: Settings, rows: DataFrame, txn: Txn) -> None:
    """Announce the rows whose key the speed table does not hold yet (a handful of alerts)."""
    touched = ViewPass._touched(view, rows)
    if touched is None:
        return
    stored = store.read(view.speed_table, session=rows.sparkSession).where(touched).select(*view.keys)
    new = rows.join(stored, list(view.keys), "left_anti").toArrow().to_pylist()
    if new:
        # Its own id per view (the id a view's own query has always used).
        app = f"{txn.app_id}_announce" if txn.app_id == view.speed_query else f"{txn.app_id}_{view.name}_announce"
        view.speed.announce(settings, new, Txn(app, txn.version))

__all__ = ["MicroBatch", "ViewPass", "merge_speed_rows"]
