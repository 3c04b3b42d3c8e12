"""The views ingest computes itself, in the micro-batch it already holds (the one-pass speed layer).

A view whose rows add up (:class:`include.registry.Partials`) needs no streaming query: the
definition runs on the micro-batch's on-time events alone, and its partial rows are merged into
the speed table (``merged="write"``: with the stored rows of the keys they touch) or appended
(``merged="read"``). A view whose state is more than that says how to keep it from one
micro-batch (``incremental``: ``order_payments`` re-runs its definition on the orders the
micro-batch touches); its rows are merged by the view's precedence.

Every write carries ingest's transaction id ``(speed_ingest, batch_id)``. A replayed micro-batch
holds the same events and watermarks, and reads tables whose commits of that id it skips, so it
computes the same rows and merges nothing twice.

A view on an interval of its own (:attr:`include.registry.ViewSpec.runs_on_interval`, when the
stream runs continuously) keeps the events of the micro-batches since it last ran and runs on
them all once its interval has passed, with the transaction id of the micro-batch it runs in. The
last one its table committed says where its events start, so a new process or a replay reads the
ones after it back from Silver.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import partial
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

from include import ddl, tables
from include.config import Settings
from include.lakehouse import LakehouseStore, Txn
from include.lakehouse.base import sql_literal
from include.registry import (
    Lookback, ViewContext, ViewSpec, best_per_key, column_names, merged_partials, replaces_sql, sql_time, state_topics,
    struct,
)
from include.views import VIEWS
from speed_layer.held_rows import HeldRows

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

    from speed_layer.recent import Query

# Values per IN list in a read of stored rows (see Step.stored).
IN_LIST_SLICE = 1000
# Topics a dimension reads: their late events count too (include.registry.state_topics).
STATE_TOPICS = state_topics(VIEWS)


@dataclass
class MicroBatch:
    """What the pass needs of one ingest micro-batch."""

    spark: SparkSession
    txn: Txn
    at: datetime  # the micro-batch's time (its events' ingested_at)
    fed: set[str]  # topics with on-time events
    events: Callable[[str], DataFrame]  # a topic's on-time events (typed fields, event_time, arrived_at)
    collect: Callable[[list[str]], dict[str, pa.Table]]  # the same for several topics, on the driver
    recent: Callable[[str], pa.Table]  # a topic's on-time events of earlier micro-batches (speed_layer/recent.py)
    # A look-back's moments for the micro-batch's events (RecentEvents.moments): lookback, events, engine.
    lookback: Callable[[Lookback, pa.Table, Query], pa.Table]
    watermarks: Mapping[str, datetime | None]  # at arrival
    watermarks_after: Mapping[str, datetime | None]  # with this micro-batch's events counted


@dataclass
class Step:
    """:class:`include.registry.PassStep` for one view and micro-batch."""

    settings: Settings
    store: LakehouseStore
    batch: MicroBatch
    topics: list[str]
    held_rows: dict[str, HeldRows] = field(default_factory=dict)  # the pass's, from one micro-batch to the next
    _events: dict[str, pa.Table] | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def events(self, topic: str) -> pa.Table:
        with self._lock:
            if self._events is None:
                self._events = self.batch.collect(self.topics)
        return self._events[topic]

    def recent(self, topic: str) -> pa.Table:
        return self.batch.recent(topic)

    def lookback(self, lookback: Lookback) -> pa.Table:
        return self.batch.lookback(lookback, self.events(lookback.topic), self.query)

    def watermark(self, topic: str, after: bool = False) -> datetime | None:
        return (self.batch.watermarks_after if after else self.batch.watermarks).get(topic)

    def stored(self, table: str, fields: str, where: str, column: str | None = None,
               values: Sequence[str] = ()) -> pa.Table:
        return read_stored(self.store, table, fields, where, column, values)

    def frame(self, rows: pa.Table, fields: str) -> DataFrame:
        return self.batch.spark.createDataFrame(rows.select(column_names(fields)), schema=struct(fields))

    def query(self, sql: str, tables: Mapping[str, pa.Table]) -> pa.Table:
        from include.views.sql import spark_rows

        spark = self.batch.spark
        # pyspark cannot take a column of no chunks (an empty read): give it one empty chunk.
        tables = {name: table if table.num_rows else table.schema.empty_table() for name, table in tables.items()}
        return spark_rows(sql, {name: spark.createDataFrame(table) for name, table in tables.items()}).toArrow()

    def earlier(self, topic: str, fields: str, where: str) -> pa.Table:
        before = self.batch.txn.version
        return read_silver(self.store, topic, ddl.arrow_schema(fields), f"batch_id < {before} AND ({where})")

    def held(self, name: str, fields: str, key: str, fill: Callable[[], pa.Table]) -> HeldRows:
        # A view's own names: only its step, on one thread, asks for them. Held rows that a later
        # micro-batch changed (this one run again in the process) are filled again from the lake.
        rows, batch_id = self.held_rows.get(name), self.batch.txn.version
        if rows is None or rows.through is None or rows.through >= batch_id:
            rows = self.held_rows[name] = HeldRows(fields, key)
            rows.put(fill())
        rows.through = batch_id
        return rows


@dataclass
class Waiting:
    """A view that may run on several micro-batches at once: the events of those since it last
    ran. ``interval``: how often it runs (zero: with every micro-batch, once caught up)."""

    interval: timedelta
    events: dict[str, list[pa.Table]] = field(default_factory=dict)  # per topic
    through: int | None = None  # the last micro-batch they include
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
        self.held_rows: dict[str, HeldRows] = {}  # PassStep.held's
        # Every view that may run on several micro-batches: one that ran on an interval before
        # (another process, other settings) first catches up on the micro-batches since its last run.
        trigger = settings.trigger_interval
        spaced = {name: interval for name, interval in (intervals or {}).items() if interval > trigger}
        self.waiting = {view.name: Waiting(spaced.get(view.name, timedelta(0))) for view in self.computed
                        if view.runs_on_interval}
        for view in self.computed:
            store.ensure_table(view.speed_table, view.speed_schema, ["date"], tables.STREAM_TABLE_PROPERTIES)

    @property
    def collected_topics(self) -> list[str]:
        """The topics the incremental views read on the driver."""
        return list(dict.fromkeys(topic for view in self.computed if view.speed.incremental for topic in view.inputs))

    def writes(self, batch: MicroBatch) -> dict[str, Callable[[], None]]:
        """A function per view the micro-batch feeds, by speed table (a view reading none of its
        topics is left out)."""
        writes = {}
        step = Step(self.settings, self.store, batch, self.collected_topics, self.held_rows)  # one collect for all
        for view in self.computed:
            view_step, waiting = step, self.waiting.get(view.name)
            if waiting is not None and (waiting.interval or waiting.through != batch.txn.version - 1):
                view_step = self._due(view, batch)
                if view_step is None:
                    continue
            else:
                if waiting is not None:
                    waiting.through = batch.txn.version
                if not batch.fed.intersection(view.inputs):
                    continue
            if view.speed.incremental:
                writes[view.speed_table] = partial(self._keep, view, view_step)
            else:
                inputs = ({topic: batch.spark.createDataFrame(view_step.events(topic)) for topic in view.inputs}
                          if view_step is not step else {topic: batch.events(topic) for topic in view.inputs})
                writes[view.speed_table] = partial(self._add_partials, view, inputs, batch.txn)
        return writes

    def _due(self, view: ViewSpec, batch: MicroBatch) -> Step | None:
        """For a view that may run on several micro-batches: the micro-batch's events added to
        those waiting (in a new process or a replay, first those since its table's last run,
        from Silver), and a step on all of them once its interval has passed since it last ran (at
        once in a new process), else None."""
        waiting, batch_id, topics = self.waiting[view.name], batch.txn.version, list(view.inputs)
        fresh = batch.collect(topics)
        if waiting.through != batch_id - 1:  # a new process, or a replay: from the table's last run
            committed = self.store.txn_version(view.speed_table, batch.txn.app_id)
            if committed is not None and committed >= batch_id:
                return None
            waiting.events = {topic: [] for topic in topics}
            if committed is not None:
                for topic in topics:
                    waiting.events[topic].append(self._read_back(topic, committed, batch_id, fresh[topic].schema))
        for topic in topics:
            waiting.events[topic].append(fresh[topic])
        waiting.through = batch_id
        if waiting.ran_at is not None and batch.at - waiting.ran_at < waiting.interval:
            return None
        events = {topic: pa.concat_tables(parts) for topic, parts in waiting.events.items()}
        waiting.events, waiting.ran_at = {topic: [] for topic in topics}, batch.at
        if not any(rows.num_rows for rows in events.values()):
            return None
        return Step(self.settings, self.store, batch, topics, self.held_rows, _events=events)

    def _read_back(self, topic: str, after: int, before: int, schema: pa.Schema) -> pa.Table:
        """The topic's events of micro-batches ``after`` < N < ``before`` as the pass gave them."""
        return read_silver(self.store, topic, schema, f"batch_id > {after} AND batch_id < {before}")

    def _add_partials(self, view: ViewSpec, inputs: dict[str, DataFrame], txn: Txn) -> None:
        store, columns = self.store, column_names(view.speed_fields)
        if store.is_committed(view.speed_table, txn):
            return
        computed = view(inputs, ViewContext(self.settings, exact=False)).select(*columns)
        if view.speed.partials.merged == "read":
            store.append(view.speed_table, computed, txn)
            return
        rows = computed.toArrow()
        if rows.num_rows == 0:
            return
        stored = with_keys_of(self._stored_of(view, rows).cast(rows.schema), rows, list(view.keys))
        if stored.num_rows:  # merge with the stored partials of the same keys (a small local job)
            both = pa.concat_tables([rows, stored.select(rows.column_names).cast(rows.schema)])
            both = computed.sparkSession.createDataFrame(both, schema=view.speed_schema)
            rows = merged_partials(view, both).toArrow()
        store.merge(view.speed_table, rows, view.merge_on, txn)

    def _stored_of(self, view: ViewSpec, rows: pa.Table) -> pa.Table:
        """The stored speed rows that may share a key with ``rows``."""
        if view.kind == "dimension":  # a key's stored row may be of any day: read by key
            (key,) = view.keys
            return read_stored(self.store, view.speed_table, view.speed_fields, "true", key,
                               pc.unique(rows[key]).to_pylist())
        return self.store.select_arrow(view.speed_table, column_names(view.speed_fields), self._touched(view, rows))

    @staticmethod
    def _touched(view: ViewSpec, rows: pa.Table) -> str:
        """SQL selecting the stored rows that may share a key with ``rows``: within their days
        and range of key time (the table's file statistics skip the rest; the caller keeps those
        that do)."""
        days = ", ".join(f"'{day}'" for day in pc.unique(rows.column("date")).to_pylist())
        extremes = pc.min_max(rows.column(view.key_time))
        low, high = (sql_time(extremes[end].as_py()) for end in ("min", "max"))
        return f"date IN ({days}) AND {view.key_time} >= {low} AND {view.key_time} <= {high}"

    def _keep(self, view: ViewSpec, step: Step) -> None:
        if self.store.is_committed(view.speed_table, step.batch.txn):
            return
        rows = view.speed.incremental(step)
        columns = column_names(view.speed_fields)
        rows = (rows.select(columns).cast(ddl.arrow_schema(view.speed_fields)) if isinstance(rows, pa.Table)
                else rows.select(*columns))
        merge_speed_rows(self.store, view, self.settings, rows, step.batch.txn)


def read_stored(store: LakehouseStore, table: str, fields: str, where: str, column: str | None = None,
                values: Sequence[str] = ()) -> pa.Table:
    """:meth:`include.registry.PassStep.stored`."""
    schema = ddl.arrow_schema(fields)
    if not store.exists(table) or (column and not values):
        return schema.empty_table()
    if column is None:
        return store.select_arrow(table, column_names(fields), where).cast(schema)
    # delta-rs turns an IN list into a chain of file-skipping terms that it walks recursively:
    # tens of thousands of values overflow a thread's stack (a segfault), so ask in slices.
    values = list(values)
    slices = [values[start:start + IN_LIST_SLICE] for start in range(0, len(values), IN_LIST_SLICE)]
    def rows_of(part: list) -> pa.Table:
        listed = ", ".join(map(sql_literal, part))
        return store.select_arrow(table, column_names(fields), f"({where}) AND {column} IN ({listed})").cast(schema)

    return pa.concat_tables([rows_of(part) for part in slices])


def read_silver(store: LakehouseStore, topic: str, schema: pa.Schema, where: str) -> pa.Table:
    """The topic's Silver rows matching SQL ``where`` as the pass gave them to the views (on-time
    ones only, unless a dimension reads the topic), as ``schema``."""
    if not store.exists(tables.silver(topic)):
        return schema.empty_table()
    late = "" if topic in STATE_TOPICS else " AND NOT is_late"
    return store.select_arrow(tables.silver(topic), schema.names, f"({where}){late}").cast(schema)


def with_keys_of(stored: pa.Table, rows: pa.Table, keys: list[str]) -> pa.Table:
    """The stored rows whose ``keys`` some of ``rows`` have (joined on the keys and a row
    number: Arrow joins carry no struct or binary columns)."""
    numbered = stored.select(keys).append_column("_row", pa.array(range(stored.num_rows), pa.int64()))
    matched = numbered.join(rows.select(keys), keys, join_type="left semi").column("_row").combine_chunks()
    return stored.filter(pc.is_in(pa.array(range(stored.num_rows), pa.int64()), matched))


def merge_speed_rows(store: LakehouseStore, view: ViewSpec, settings: Settings, rows: DataFrame | pa.Table,
                     txn: Txn) -> None:
    """Upsert rows of a view into its speed table, exactly once: several rows of a key and the
    stored one by the view's precedence; rows with new keys first announced (alerts to the
    notifier)."""
    if isinstance(rows, pa.Table):
        rows = arrow_frame(store.spark, rows, view.speed_schema)
    if view.speed.precedence is not None:
        rows = best_per_key(rows, view.keys, view.speed.precedence)
    update_when = replaces_sql(view.speed.precedence) if view.speed.precedence else None
    if view.speed.announce is None or store.is_committed(view.speed_table, txn):
        store.merge(view.speed_table, rows, view.merge_on, txn, update_when, delete_when=view.speed.tombstone)
        return
    arrow = rows.toArrow()  # a handful of rows (alerts)
    known = set()
    if arrow.num_rows:  # the stored keys among them: their days and key times skip the other files
        (key,) = view.keys
        fields = ddl.render(tuple(field for field in ddl.parse(view.fields) if field.name == key))
        stored = read_stored(store, view.speed_table, fields, ViewPass._touched(view, arrow), key,
                             pc.unique(arrow[key]).to_pylist())
        known = {(value,) for value in stored.column(key).to_pylist()}
    new = [row for row in arrow.to_pylist() if tuple(row[key] for key in view.keys) not in known]
    if new:
        # Its own id per view (the id a view's own query has always used).
        app = f"{txn.app_id}_announce" if txn.app_id == view.speed_query else f"{txn.app_id}_{view.name}_announce"
        view.speed.announce(settings, new, Txn(app, txn.version))
    store.merge(view.speed_table, arrow_frame(store.spark, arrow, view.speed_schema), view.merge_on, txn, update_when,
                delete_when=view.speed.tombstone)


def arrow_frame(spark: SparkSession, rows: pa.Table, schema: StructType) -> DataFrame:
    """Arrow rows on the driver as a Spark DataFrame of ``schema`` (pyspark cannot take a column
    of no chunks, as an empty read gives)."""
    rows = rows.select(schema.fieldNames())
    return spark.createDataFrame(rows if rows.num_rows else rows.schema.empty_table(), schema=schema)


__all__ = ["MicroBatch", "ViewPass", "merge_speed_rows"]
