"""Nightly recompute: a day's exact Gold views, rebuilt from the Bronze master dataset.

The same parser and the same view definitions as the speed layer, applied to the full history
without a watermark: late events count, distinct buyers are exact. Each view's partition for the
day is replaced as a whole, so a rerun gives the same table.
"""

from __future__ import annotations

import math
from datetime import date, timedelta
from typing import TYPE_CHECKING

from pyspark.sql import functions as F

from include import tables
from include.config import Settings
from include.lakehouse import LakehouseStore
from include.parsing import parse_topic
from include.views import first_payment, order_payments, revenue_by_category_5m

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


def days_needed(day: date, join_window: timedelta) -> list[date]:
    """The day plus the following days a join window opened on it can reach into."""
    return [day + timedelta(days=n) for n in range(math.ceil(join_window / timedelta(days=1)) + 1)]


def events(store: LakehouseStore, settings: Settings, topic: str, days: list[date]) -> DataFrame:
    """A topic's valid events of the given event days, parsed from Bronze, one row per event id."""
    wanted = ", ".join(f"DATE'{day.isoformat()}'" for day in days)
    bronze = store.read(tables.bronze(topic)).where(f"event_date IN ({wanted})")
    parsed = parse_topic(bronze, topic, settings.max_line_bytes).where("reason IS NULL")
    return parsed.dropDuplicates(["event_id"]).select("record.*")


def batch_views(store: LakehouseStore, settings: Settings, day: date) -> dict[str, DataFrame]:
    """The day's exact rows of every batch view, by table name."""
    orders = events(store, settings, "orders", [day])
    payments = events(store, settings, "payments", days_needed(day, settings.join_window))
    return {
        tables.BATCH_REVENUE: revenue_by_category_5m(orders, exact=True),
        tables.BATCH_ORDER_PAYMENTS: first_payment(order_payments(orders, payments, settings.join_window)),
    }


def ensure_batch_tables(store: LakehouseStore) -> None:
    store.ensure_table(tables.BATCH_REVENUE, tables.REVENUE_SCHEMA, ["date"])
    store.ensure_table(tables.BATCH_ORDER_PAYMENTS, tables.ORDER_PAYMENTS_SCHEMA, ["date"])


def recompute_day(store: LakehouseStore, settings: Settings, day: date) -> dict[str, int]:
    """Replace the day's partition of every batch view; returns rows written per table."""
    ensure_batch_tables(store)
    written = {}
    for table, rows in batch_views(store, settings, day).items():
        rows = rows.where(F.col("date") == F.lit(day)).cache()
        store.replace_partition(table, rows, {"date": day})
        written[table] = rows.count()
        rows.unpersist()
    return written
