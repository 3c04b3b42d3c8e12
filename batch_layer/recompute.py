"""Nightly recompute: a day's exact Gold views, rebuilt from the Bronze master dataset.

The same parser, the same dedup rule and the same view definitions as the speed layer (every
view of the registry), applied to the full history without a watermark: late events count,
distinct counts are exact. A dimension is rebuilt from its inputs' whole history up to the day's
end and stored under the day (the snapshot serving merges with the stream's later changes).
Each view's partition for the day is replaced as a whole, so a rerun gives the same table.

Spark parses and deduplicates Bronze. On a local master a day of moderate size is read to the
driver instead (``LAMBDALAKE_BATCH_ENGINE``, as ingest's pass does per micro-batch): the driver's
parser decides the lines it is sure of (:mod:`include.line_parser`), Spark only the odd ones, the
first copies are kept in Arrow, and DuckDB runs the views' SQL: nine small Spark plans, and a
Spark job reading every line, cost more than their data there.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor, wait
from datetime import date
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc
from pyspark import StorageLevel
from pyspark.sql import functions as F

from include import ddl
from include.config import ConfigError, Settings
from include.coverage import bronze_row_counts, input_days
from include.lakehouse import LakehouseStore
from include import tables
from include.line_parser import topic_parser
from include.parsing import parse_topic
from include.registry import ViewContext, column_names
from include.schemas import TOPICS
from include.views import VIEWS, VIEWS_BY_NAME
from include.views.rules import first_copies, first_copy_rows

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

# Views computed side by side (see in_parallel).
BATCH_THREADS = 4
# The most Bronze rows a day's rebuild reads for ``auto`` to run it on the driver: their parsed
# events are held there as Arrow (a few hundred bytes each).
DRIVER_MAX_ROWS = 5_000_000
COPY_COLUMNS = ["value", "source", "arrived_at"]  # a Bronze line's own columns the dedup orders by


def events(store: LakehouseStore, settings: Settings, topic: str, days: list[date]) -> DataFrame:
    """A topic's valid events of the given event days, parsed from Bronze, one row per event id
    (the copy the stream kept): its typed fields, event time and arrival time, as the speed
    layer's feeds hold them."""
    bronze = store.read(tables.bronze(topic)).where(_of_days(days))
    parsed = parse_topic(bronze, topic, settings.max_line_bytes).where("record IS NOT NULL")
    extra = [] if "event_time" in TOPICS[topic].schema.fieldNames() else ["event_time"]
    return first_copies(parsed, ["event_id"]).select("record.*", *extra, "arrived_at")


def batch_views(inputs: dict[str, DataFrame], settings: Settings, day: date) -> dict[str, DataFrame]:
    """The day's exact rows of every view from its input topics' events, by batch table name; a
    dimension as of the day's end."""
    context = ViewContext(settings, exact=True)
    computed: dict[str, DataFrame] = {}
    for view in VIEWS:  # registry order: a dimension before the views that look it up
        given = {topic: inputs[topic] for topic in view.inputs} | {name: computed[name] for name in view.lookups}
        rows = view(given, context)
        if view.kind == "dimension":
            rows = rows.withColumn("date", F.lit(day))
        computed[view.name] = rows.where(F.col("date") == F.lit(day))
    return {VIEWS_BY_NAME[name].batch_table: rows for name, rows in computed.items()}


def ensure_batch_tables(store: LakehouseStore) -> None:
    for view in VIEWS:
        store.ensure_table(view.batch_table, view.schema, ["date"])


def on_driver(store: LakehouseStore, settings: Settings, days: dict[str, list[date]]) -> bool:
    """Whether DuckDB runs the views on the driver (``LAMBDALAKE_BATCH_ENGINE``; ``auto``: on a
    local master when the day's rebuild reads at most :data:`DRIVER_MAX_ROWS` Bronze rows)."""
    if settings.batch_engine == "spark":
        return False
    undeclared = [view.name for view in VIEWS if not view.declared_in_sql]
    if settings.batch_engine == "duckdb" and undeclared:
        raise ConfigError(f"invalid setting LAMBDALAKE_BATCH_ENGINE=duckdb: {', '.join(undeclared)} "
                          "not declared in SQL, which DuckDB runs")
    if settings.batch_engine == "duckdb":
        return True
    if undeclared or not settings.spark_master.startswith("local"):
        return False
    read = sum(bronze_row_counts(store, topic).get(day, 0) for topic, wanted in days.items() for day in wanted)
    return read <= DRIVER_MAX_ROWS


def batch_rows_on_driver(inputs: dict[str, pa.Table], settings: Settings, day: date) -> dict[str, pa.Table]:
    """:func:`batch_views` by DuckDB on Arrow events (include/views/sql.py)."""
    from include.views.sql import duckdb_rows

    context = ViewContext(settings, exact=True)
    computed: dict[str, pa.Table] = {}
    for view in VIEWS:
        given = {topic: inputs[topic] for topic in view.inputs} | {name: computed[name] for name in view.lookups}
        rows = duckdb_rows(view.sql(context), given)
        if view.kind == "dimension":
            rows = rows.drop_columns(["date"]).append_column("date", pa.array([day] * rows.num_rows, pa.date32()))
        rows = rows.select(column_names(view.fields)).cast(ddl.arrow_schema(view.fields))
        computed[view.name] = rows.filter(pc.equal(rows["date"], pa.scalar(day, pa.date32())))
    return {VIEWS_BY_NAME[name].batch_table: rows for name, rows in computed.items()}


def recompute_day(store: LakehouseStore, settings: Settings, day: date) -> dict[str, int]:
    """Replace the day's partition of every batch view; returns rows written per table."""
    ensure_batch_tables(store)
    days = input_days(store, settings, day)
    if on_driver(store, settings, days):
        collected = in_parallel({topic: (events_on_driver, store, settings, topic, wanted)
                                 for topic, wanted in days.items()})
        views = batch_rows_on_driver(collected, settings, day)
        return in_parallel({table: (_replace_arrow, store, table, rows, day) for table, rows in views.items()})
    # Parsed once: most topics feed several views (orders four of them).
    inputs = {topic: events(store, settings, topic, wanted).persist(StorageLevel.MEMORY_AND_DISK)
              for topic, wanted in days.items()}

    def replace(table: str, rows: DataFrame) -> int:
        rows = rows.cache()
        try:
            store.replace_partition(table, rows, {"date": day})
            return rows.count()
        finally:
            rows.unpersist()

    try:
        views = batch_views(inputs, settings, day)
        return in_parallel({table: (replace, table, rows) for table, rows in views.items()})
    finally:
        for events_of_topic in inputs.values():
            events_of_topic.unpersist()


def events_on_driver(store: LakehouseStore, settings: Settings, topic: str, days: list[date]) -> pa.Table:
    """:func:`events` as Arrow, parsed on the driver: Bronze's lines read by delta-rs, the lines
    the driver's parser is not sure of parsed by the shared parser on Spark, then the first copy
    of each event id (:func:`include.views.rules.first_copy_rows`)."""
    lines = store.select_arrow(tables.bronze(topic), COPY_COLUMNS, _of_days(days))
    parsed = topic_parser(topic, settings.max_line_bytes).parse(lines["value"])
    accepted = lines.filter(parsed.accepted)
    parts = [pa.table({"event_id": parsed.events["event_id"], "event_time": parsed.events["event_time"],
                       **{name: accepted[name] for name in COPY_COLUMNS}, "record": parsed.events["record"]})]
    odd = lines.filter(pc.invert(pc.or_(parsed.accepted, parsed.rejected)))
    if odd.num_rows:
        decided = parse_topic(store.spark.createDataFrame(odd), topic, settings.max_line_bytes)
        valid = decided.where("record IS NOT NULL").select("event_id", "event_time", *COPY_COLUMNS, "record")
        parts.append(valid.toArrow().cast(parts[0].schema))
    events = pa.concat_tables(parts)
    events = events.take(first_copy_rows(events, "event_id"))
    fields = pa.Table.from_struct_array(events["record"])
    extra = [] if "event_time" in fields.column_names else ["event_time"]
    for name in [*extra, "arrived_at"]:
        fields = fields.append_column(name, events[name])
    return fields


def _of_days(days: list[date]) -> str:
    """SQL selecting Bronze's lines of the given event days (both engines read it)."""
    wanted = ", ".join(f"DATE'{day.isoformat()}'" for day in days) or "NULL"
    return f"event_date IN ({wanted})"


def _replace_arrow(store: LakehouseStore, table: str, rows: pa.Table, day: date) -> int:
    store.replace_partition(table, rows, {"date": day})
    return rows.num_rows


def in_parallel(calls: dict) -> dict:
    """``{key: (function, *args)}`` run side by side, as ``{key: result}``. Each view is a few
    small Spark jobs and a Delta commit, mostly fixed costs on the driver: side by side, one
    view's planning and commit overlap another's tasks instead of adding up. Every call ends
    before the first error is raised (none may still write after the batch failed)."""
    with ThreadPoolExecutor(max_workers=BATCH_THREADS, thread_name_prefix="batch-view") as pool:
        running = {key: pool.submit(*call) for key, call in calls.items()}
        wait(running.values())
    return {key: future.result() for key, future in running.items()}
