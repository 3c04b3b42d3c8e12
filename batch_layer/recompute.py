"""Nightly recompute: a day's exact Gold views, rebuilt from the Bronze master dataset.

The same parser, the same dedup rule and the same view definitions as the speed layer (every
view of the registry), applied to the full history without a watermark: late events count,
distinct counts are exact. A dimension is rebuilt from its inputs' whole history up to the day's
end and stored under the day (the snapshot serving merges with the stream's later changes).
Each view's partition for the day is replaced as a whole, so a rerun gives the same table.
Spark parses and deduplicates Bronze and runs every view, on every master.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor, wait
from datetime import date
from typing import TYPE_CHECKING

from pyspark import StorageLevel
from pyspark.sql import functions as F

from include.config import Settings
from include.coverage import input_days
from include.lakehouse import LakehouseStore
from include import tables
from include.parsing import parse_topic
from include.registry import ViewContext
from include.schemas import TOPICS
from include.views import VIEWS, VIEWS_BY_NAME
from include.views.rules import first_copies

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

# Views computed side by side (see in_parallel).
BATCH_THREADS = 4


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


def recompute_day(store: LakehouseStore, settings: Settings, day: date) -> dict[str, int]:
    """Replace the day's partition of every batch view; returns rows written per table."""
    ensure_batch_tables(store)
    days = input_days(store, settings, day)
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


def _of_days(days: list[date]) -> str:
    """SQL selecting Bronze's lines of the given event days (both engines read it)."""
    wanted = ", ".join(f"DATE'{day.isoformat()}'" for day in days) or "NULL"
    return f"event_date IN ({wanted})"


def in_parallel(calls: dict) -> dict:
    """``{key: (function, *args)}`` run side by side, as ``{key: result}``. Each view is a few
    small Spark jobs and a Delta commit, mostly fixed costs on the driver: side by side, one
    view's planning and commit overlap another's tasks instead of adding up. Every call ends
    before the first error is raised (none may still write after the batch failed)."""
    with ThreadPoolExecutor(max_workers=BATCH_THREADS, thread_name_prefix="batch-view") as pool:
        running = {key: pool.submit(*call) for key, call in calls.items()}
        wait(running.values())
    return {key: future.result() for key, future in running.items()}
