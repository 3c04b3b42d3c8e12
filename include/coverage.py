"""Batch coverage: which days the serving layer takes from the batch views, and which are stale.

A day is covered once its views are written (the coverage row is committed last, in one commit).
The row fingerprints the Bronze input the run read (rows per topic and event day, from the Delta
log's statistics); when Bronze later holds more rows for those days, the day is stale and a new
``lambdalake batch --date`` restates it. Shared by the batch layer (writes), serving and
``status`` (reads).
"""

from __future__ import annotations

import json
from datetime import date, datetime, timezone

import pyarrow as pa

from include import tables
from include.config import Settings
from include.lakehouse import LakehouseStore
from include.views import days_read


def input_days(store: LakehouseStore, settings: Settings, day: date) -> dict[str, list[date]]:
    """Per topic, the event days some view reads to rebuild ``day`` (:func:`days_read`, a whole
    history as the days landed in Bronze)."""
    days, whole = days_read(settings, day)
    for topic in whole:
        landed = (d for d in bronze_row_counts(store, topic) if d is not None and d <= day)
        days.setdefault(topic, set()).update(landed)
    return {topic: sorted(read) for topic, read in days.items()}


def bronze_row_counts(store: LakehouseStore, topic: str) -> dict[date | None, int]:
    """Bronze rows of a topic per event day."""
    table = tables.bronze(topic)
    return store.partition_row_counts(table, "event_date") if store.exists(table) else {}


def bronze_fingerprint(store: LakehouseStore, settings: Settings, day: date) -> dict[str, int]:
    """Bronze rows per input topic and event day that the day's views read."""
    fingerprint = {}
    for topic, days in input_days(store, settings, day).items():
        counts = bronze_row_counts(store, topic)
        for needed in days:
            fingerprint[f"{topic}:{needed.isoformat()}"] = counts.get(needed, 0)
    return fingerprint


def mark_covered(store: LakehouseStore, day: date, fingerprint: dict[str, int]) -> None:
    store.ensure_table(tables.BATCH_COVERAGE, tables.BATCH_COVERAGE_SCHEMA)
    row = pa.Table.from_pylist(
        [{"date": day, "covered_at": datetime.now(timezone.utc),
          "bronze_rows": json.dumps(fingerprint, sort_keys=True)}],
        schema=tables.arrow_schema(tables.BATCH_COVERAGE_FIELDS),
    )
    store.merge(tables.BATCH_COVERAGE, row, ["date"])


def covered_days(store: LakehouseStore) -> dict[date, dict[str, int]]:
    """Covered days and the Bronze fingerprint each was built from."""
    if not store.exists(tables.BATCH_COVERAGE):
        return {}
    rows = store.select_arrow(tables.BATCH_COVERAGE, ["date", "bronze_rows"]).to_pylist()
    return {row["date"]: json.loads(row["bronze_rows"]) for row in rows}


def stale_days(store: LakehouseStore, settings: Settings) -> list[date]:
    """Covered days whose Bronze input has changed since they were built."""
    return sorted(
        day for day, built_from in covered_days(store).items()
        if bronze_fingerprint(store, settings, day) != built_from
    )
